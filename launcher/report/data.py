"""What a report shows, taken out of a recording: curves (time in ms, value) per legend entry, and
the faults and attributions that go in tables. Pure functions over launcher.recording's Recording.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from launcher import record_fleet
from launcher.recording import Recording, Series

MAX_POINTS = 1500  # per curve: more adds weight to the file and nothing a person can see
IDLE_MODES = ("idle", "iowait", "steal")


@dataclass
class Curve:
    name: str  # the legend entry
    x: list[float] = field(default_factory=list)  # ms since the epoch (plotly date axes)
    y: list[float] = field(default_factory=list)


def _picks(count: int, limit: int) -> list[int]:
    """At most `limit` of `count` indices, evenly picked, the last one kept."""
    if count <= limit:
        return list(range(count))
    stride = count / limit
    return sorted({min(int(i * stride), count - 1) for i in range(limit)} | {count - 1})


def thin(curve: Curve, limit: int = MAX_POINTS) -> Curve:
    """At most `limit` points, evenly picked, the last one kept."""
    if len(curve.x) <= limit:
        return curve
    picks = _picks(len(curve.x), limit)
    return Curve(curve.name, [curve.x[i] for i in picks], [curve.y[i] for i in picks])


BAND_OPERATIONS = ("min", "p5", "p50", "p95", "max")


@dataclass
class Band:
    """A large cluster's distribution of one metric over time (record_fleet's series): per time, the
    fleet's min, p5, median, p95 and max."""

    name: str  # the legend entry (the label set, e.g. `worker`)
    x: list[float]  # ms since the epoch
    y: dict[str, list[float]]  # by operation (BAND_OPERATIONS)


def is_fleet(rec: Recording) -> bool:
    """Whether the recording keeps a large cluster's distributions (launcher/record_fleet.py)."""
    return any(record_fleet.parse_name(s.name) for s in rec.series.values())


def bands(rec: Recording, name: str, **labels: str) -> list[Band]:
    """The fleet's distribution of the sample name `name` (with these label values), one band per label set."""
    groups: dict[tuple[tuple[str, str], ...], dict[str, Series]] = defaultdict(dict)
    for series in rec.series.values():
        parsed = record_fleet.parse_name(series.name)
        if parsed and parsed[0] == name and parsed[1] in BAND_OPERATIONS and series.times and \
                all(series.labels.get(k) == v for k, v in labels.items()):
            groups[tuple(sorted(series.labels.items()))][parsed[1]] = series
    found = []
    for key, by_operation in sorted(groups.items()):
        if set(by_operation) != set(BAND_OPERATIONS):
            continue
        times = by_operation["p50"].times
        values = {op: dict(zip(s.times, s.values, strict=True)) for op, s in by_operation.items()}
        picks = _picks(len(times), MAX_POINTS)
        legend = ", ".join(v for k, v in key if k not in ("cluster", "job") and k not in labels) or "fleet"
        found.append(Band(legend, [times[i] * 1000 for i in picks],
                          {op: [values[op].get(times[i], float("nan")) for i in picks] for op in BAND_OPERATIONS}))
    return found


def raw(series: Series, name: str, scale: float = 1.0) -> Curve:
    return Curve(name, [t * 1000 for t in series.times], [v * scale for v in series.values])


def rate(series: Series, name: str, window: float) -> Curve:
    """Per-second increase over the last `window` seconds at each sample, as PromQL's rate() over a
    range would give it (a counter reset counts from zero); exporters publish every few seconds,
    so neighbouring samples alone would show spikes and zeros."""
    curve = Curve(name)
    increase = [0.0]  # cumulative increase up to each sample, resets counted from zero
    for previous, value in itertools.pairwise(series.values):
        increase.append(increase[-1] + (value - previous if value >= previous else value))
    first = 0
    for i, at in enumerate(series.times):
        while series.times[first] < at - window:
            first += 1
        if at > series.times[first]:
            curve.x.append(at * 1000)
            curve.y.append((increase[i] - increase[first]) / (at - series.times[first]))
    return curve


def tell_nodes_apart(rec: Recording) -> None:
    """Where several exporters carry one `node` label (Ray names nodes by IP: a local cluster's
    nodes share the host's), the report names each by its exporter (`instance`) instead."""
    instances: dict[str, set[str]] = defaultdict(set)
    for series in rec.series.values():
        if "node" in series.labels and "instance" in series.labels:
            instances[series.labels["node"]].add(series.labels["instance"])
    for series in rec.series.values():
        if len(instances.get(series.labels.get("node", ""), ())) > 1:
            series.labels = {**series.labels, "node": series.labels["instance"]}


def gpu_name(labels: dict[str, str]) -> str:
    return f"{labels.get('node', labels.get('instance', '?'))} GPU {labels.get('gpu', '?')}"


def rank_name(labels: dict[str, str]) -> str:
    return f"{labels.get('submission_id') or labels.get('job_id', '?')} rank {labels.get('rank', '?')}"


def curves(rec: Recording, name: str, legend: Callable[[dict[str, str]], str], **labels: str) -> list[Curve]:
    """One curve per series of `name` (with these label values), named by `legend`."""
    return sorted((thin(raw(s, legend(s.labels))) for s in rec.select(name, **labels) if s.times),
                  key=lambda c: c.name)


def rate_window(rec: Recording) -> float:
    """What a rate is taken over: four scrape intervals, as Grafana's $__rate_interval, and at least
    30 s (exporters publish progress every few seconds)."""
    interval = next((m.get("interval") for m in rec.meta if m.get("interval")), None) or 15.0
    return max(4 * float(interval), 30.0)


def training_throughput(rec: Recording) -> tuple[str, list[Curve]]:
    """Samples per second per rank where ranks report samples, else tokens, else steps per second."""
    window = rate_window(rec)
    fleet = is_fleet(rec)
    for family, unit in (("raypulse_train_samples_total", "samples/s"), ("raypulse_train_tokens_total", "tokens/s"),
                         ("raypulse_train_step", "steps/s")):
        if fleet:  # every rank's together (a large cluster's record keeps the sum), steps/s as the median rank's
            operation = "p50" if family == "raypulse_train_step" else "sum"
            found = [thin(rate(s, f"all ranks ({operation})", window))
                     for s in rec.select(record_fleet.series_name(family, operation)) if len(s.times) > 1]
        else:
            found = [thin(rate(s, rank_name(s.labels), window)) for s in rec.select(family) if len(s.times) > 1]
        if found:
            return unit, sorted(found, key=lambda c: c.name)
    return "steps/s", []


def _by_node(rec: Recording, name: str) -> dict[str, list[Series]]:
    grouped: dict[str, list[Series]] = defaultdict(list)
    for series in rec.select(name):
        grouped[series.labels.get("node", series.labels.get("instance", "all nodes"))].append(series)
    return grouped


def _aligned(series: Iterable[Series]) -> dict[float, dict[str, float]]:
    """Values by sample time, then by the series' identity (label values joined)."""
    table: dict[float, dict[str, float]] = defaultdict(dict)
    for s in series:
        key = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        for t, v in zip(s.times, s.values, strict=True):
            table[t][key] = v
    return table


def node_name(labels: dict[str, str]) -> str:
    return labels.get("node", labels.get("instance", "?"))


def node_cpu(rec: Recording, name: str = "raypulse_node_cpu_seconds_total") -> list[Curve]:
    """Busy share of each node's CPUs: everything but idle, iowait and steal, over all modes (`name`: a
    large cluster's sum over its nodes, drawn as one curve)."""
    found = []
    for node, series in sorted(_by_node(rec, name).items()):
        busy = Curve(f"{node}")
        table = sorted(_aligned(series).items())
        for (t0, a), (t1, b) in itertools.pairwise(table):
            total = sum(b[k] - a[k] for k in b if k in a)
            idle = sum(b[k] - a[k] for k in b if k in a and any(f"mode={m}" in k for m in IDLE_MODES))
            if t1 > t0 and total > 0:
                busy.x.append(t1 * 1000)
                busy.y.append(max(0.0, min(1.0, (total - idle) / total)))
        found.append(thin(busy))
    return found


def node_memory_used(rec: Recording) -> list[Curve]:
    """Bytes in use on each node: total minus available."""
    found = []
    totals = _by_node(rec, "raypulse_node_memory_total_bytes")
    for node, available in sorted(_by_node(rec, "raypulse_node_memory_available_bytes").items()):
        total = dict(zip(totals[node][0].times, totals[node][0].values, strict=True)) if totals.get(node) else {}
        curve = Curve(node)
        for t, v in zip(available[0].times, available[0].values, strict=True):
            if t in total:
                curve.x.append(t * 1000)
                curve.y.append(total[t] - v)
        found.append(thin(curve))
    return found


@dataclass
class Fault:
    at: float  # seconds since the epoch
    what: str
    where: str
    detail: str = ""


def _increases(series: Series) -> Iterable[tuple[float, float]]:
    """(time, by how much) wherever a counter grew, counting a first sample above 0 as growth."""
    last = 0.0
    for t, v in zip(series.times, series.values, strict=True):
        if v > last:
            yield t, v - last
        last = v


def _transitions(series: Series, bad: Callable[[float], bool]) -> Iterable[tuple[float, bool]]:
    """(time, now bad) at each change between good and bad."""
    state = False
    for t, v in zip(series.times, series.values, strict=True):
        if bad(v) != state:
            state = bad(v)
            yield t, state


def faults(rec: Recording) -> list[Fault]:
    """What went wrong, in time order: XIDs, ECC errors, lost or failing GPUs, dead Ray nodes and
    exporters that stopped answering."""
    found: list[Fault] = []
    for s in rec.select("raypulse_gpu_xid_errors_total"):
        found += [Fault(t, f"XID {s.labels.get('xid', '?')}", gpu_name(s.labels), f"{n:g} event(s)")
                  for t, n in _increases(s)]
    for s in rec.select("raypulse_gpu_ecc_errors_total"):
        found += [Fault(t, f"ECC {s.labels.get('type', '')}".strip(), gpu_name(s.labels), f"{n:g} error(s)")
                  for t, n in _increases(s)]
    for s in rec.select("raypulse_gpu_lost_events_total"):
        found += [Fault(t, "GPU lost", gpu_name(s.labels), "fell off the bus") for t, _ in _increases(s)]
    for name, what in (("raypulse_gpu_row_remap_pending", "row remap pending"),
                       ("raypulse_gpu_row_remap_failed", "row remap failed")):
        for s in rec.select(name):
            found += [Fault(t, what, gpu_name(s.labels)) for t, bad in _transitions(s, lambda v: v > 0) if bad]
    for s in rec.select("raypulse_ray_node_alive"):
        where = f"Ray node {s.labels.get('node_ip', '')} {s.labels.get('node_id', '')[:12]}".strip()
        found += [Fault(t, "Ray node dead" if bad else "Ray node alive again", where)
                  for t, bad in _transitions(s, lambda v: v < 1)]
    for s in rec.select("up"):
        where = f"{s.labels.get('node', '?')} ({s.labels.get('instance', '')})"
        found += [Fault(t, "exporter not answering" if bad else "exporter answering again", where)
                  for t, bad in _transitions(s, lambda v: v < 1)]
    return sorted(found, key=lambda f: f.at)


@dataclass
class Attribution:
    gpu: str  # node GPU n
    uuid: str
    submission_id: str
    peak_memory_bytes: float
    peak_sm_ratio: float | None


def _job(labels: dict[str, str]) -> str:
    return labels.get("submission_id") or labels.get("job_id") or "(no Ray job)"


def gpu_jobs(rec: Recording) -> list[Attribution]:
    """Which job's processes used which GPU, and how much at most."""
    sm = {(s.labels.get("uuid"), _job(s.labels)): max(s.values)
          for s in rec.select("raypulse_job_gpu_sm_utilization_ratio") if s.values}
    rows = []
    for s in rec.select("raypulse_job_gpu_memory_used_bytes"):
        rows.append(Attribution(gpu_name(s.labels), s.labels.get("uuid", ""), _job(s.labels), max(s.values or [0.0]),
                                sm.get((s.labels.get("uuid"), _job(s.labels)))))
    return sorted(rows, key=lambda r: (r.gpu, r.submission_id))


def nodes(rec: Recording) -> list[dict[str, str]]:
    """Where the run ran: each exporter target's labels (node, role, instance, cluster)."""
    seen: dict[str, dict[str, str]] = {}
    for s in rec.select("up"):
        seen.setdefault(s.labels.get("instance", ""), {k: s.labels.get(k, "") for k in
                                                       ("node", "role", "instance", "cluster", "ray_node_id")})
    return sorted(seen.values(), key=lambda row: (row["role"] != "head", row["node"]))


def gpus(rec: Recording) -> list[dict[str, str]]:
    """Each GPU seen: node, index, uuid, name."""
    rows = {s.labels.get("uuid", ""): {"gpu": gpu_name(s.labels), "uuid": s.labels.get("uuid", ""),
                                       "model": s.labels.get("name", ""), "simulated": s.labels.get("simulated", "")}
            for s in rec.select("raypulse_gpu_info")}
    return sorted(rows.values(), key=lambda row: row["gpu"])
