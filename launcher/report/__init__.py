"""`launcher report RUN_ID [--out report.html]`: one self-contained HTML file about a run, good,
failed or still going: its summary (spec, attempts on a timeline, heal events and stacks, where it
ran), training progress per rank, every GPU's utilization, memory, power and temperature with the
jobs that used it, node CPU and memory, the faults seen, and (with a Prometheus that has the
rules) the alerts that fired.

    from launcher import report
    report.render("mnist-1a2b", Path("report.html"))            # from the run's recording
    report.render("mnist-1a2b", prometheus="http://prom:9090")   # + fired alerts; series too if not recorded

Whatever is missing (no recording, one cut short by a crash, a corrupt run record) is said in the
report, never raised; an unknown run is BadInput (exit 2).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher import checkpoint_advice, record_fleet
from launcher.errors import BadInput
from launcher.health import stacks
from launcher.promql import shown
from launcher.recording import Recording, path_of
from launcher.recording import read as read_recording
from launcher.report import charts, data
from launcher.report import prometheus as prom
from launcher.report.charts import Chart
from launcher.report.page import chart_div, document, esc, note, section, table, when
from launcher.state import RunRecord, home, replacing, run_dir, write_private

FILE_NAME = "report.html"
EVENTS_SHOWN = 400
HEAL_KINDS = ("health.", "node.", "run.resume")


def locate(run: str | Path) -> tuple[Path, RunRecord | None, str | None]:
    """(the run's directory, its record or None, why the record is missing or unreadable). A Path is
    a run directory the caller chose; a string is a run id under $RAYPULSE_HOME, never a path
    (run_dir refuses `../x` and `a/b` with BadInput)."""
    directory = run if isinstance(run, Path) else run_dir(run)
    record_file = directory / "run.json"
    if not record_file.exists():
        if not path_of(directory).exists():
            raise BadInput(f"run_id: no run {str(run)!r} is recorded here (`launcher list` shows the runs)")
        return directory, None, "the run's record (run.json) is missing; only its recording is shown"
    try:
        return directory, RunRecord.model_validate_json(record_file.read_text()), None
    except ValueError as exc:
        return directory, None, f"the run's record (run.json) cannot be read ({type(exc).__name__}); only its " \
                                "recording is shown"


def render(run: str | Path, output: Path | None = None, *, prometheus: str | None = None) -> Path:
    """Write the report of `run` (an id or a run directory) to `output` (default: report.html in
    the run's directory: under $RAYPULSE_HOME private like the rest, 0600; a file the caller names
    keeps the umask); returns its path. Neither is written through a link planted in its place.
    `prometheus` (default: the one the run's spec named) is asked for the alerts that fired, and for
    the series when the run has no recording."""
    directory, record, problem = locate(run)
    notes = [note(problem, "warn")] if problem else []
    prometheus = prometheus or (record.spec.get("prometheus") if record else None)  # the run's own, if it named one
    rec, source_note = _series_source(directory, record, prometheus)
    notes += source_note
    if rec is not None:
        data.tell_nodes_apart(rec)
    alerts, alert_note = _alerts(prometheus, record, rec)
    built = Builder(directory, record, rec)
    body = notes + [built.guarded(part) for part in (built.summary, built.attempts, built.healing, built.checkpoints,
                                                     built.placement,
                                                     built.training, built.rl, built.gpus, built.nodes,
                                                     built.faults)]
    body.append(section("Alerts that fired", alert_note or _alerts_table(alerts)))
    body.append(built.guarded(built.events))
    title = f"Run {record.run_id if record else directory.name}" + (f" ({record.name})" if record else "")
    subtitle = (f"{record.state}" + (f", exit {record.exit_code}" if record.exit_code is not None else "")
                + f" · times in UTC · report written {when(time.time())}") if record else \
        f"times in UTC · report written {when(time.time())}"
    target = output or directory / FILE_NAME
    page = document(title, subtitle, body, built.charts)
    try:
        if output is None and _under_home(directory):
            write_private(target, page)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            with replacing(target) as out:
                out.write(page)
    except OSError as exc:
        raise BadInput(f"output: cannot write the report to {target}: {exc.strerror or exc}") from None
    return target


def _under_home(directory: Path) -> bool:
    return directory.resolve().is_relative_to(home().resolve())


def _run_range(record: RunRecord | None, rec: Recording | None) -> tuple[float, float]:
    start = record.created_at if record else (rec.start if rec and rec.start else time.time() - 3600)
    end = (record.finished_at if record and record.finished_at else None) or time.time()
    return start, end


def _series_source(directory: Path, record: RunRecord | None, prometheus: str | None) -> tuple[Recording | None,
                                                                                               list[str]]:
    """The run's recording; without one, the given Prometheus for the run's time range (a run
    submitted with --prometheus is not recorded twice)."""
    try:
        rec = read_recording(path_of(directory))
    except FileNotFoundError:
        if prometheus:
            return _from_prometheus(record, prometheus)
        return None, [note("This run has no recording (it ran with --record off, with --prometheus, or before "
                           "runs were recorded): the charts are missing; its record is shown. With "
                           "--prometheus URL the report reads the run's series from that Prometheus.", "warn")]
    except OSError as exc:
        return None, [note(f"the recording cannot be read: {exc}", "bad")]
    notes = []
    if rec.cut_short:
        still = record is not None and record.exit_code is None
        notes.append(note(f"The recording ends at {when(rec.end)}: its last part was "
                          + ("still being written (the run is still going)." if still else
                             "cut short (the launcher stopped abruptly?); everything before it is shown."), "warn"))
    if rec.capped:
        notes.append(note(f"The recording stopped early: {rec.capped}.", "warn"))
    if record is not None and record.exit_code is None:
        notes.append(note(f"The run is still going ({record.state}): this report shows it up to "
                          f"{when(rec.end or time.time())}; render it again for more.", "info"))
    return rec, notes


def _from_prometheus(record: RunRecord | None, prometheus: str) -> tuple[Recording | None, list[str]]:
    start, end = _run_range(record, None)
    cluster = record.cluster if record and record.cluster else None
    try:
        rec = prom.read(prometheus, start, end + 60, {"cluster": cluster} if cluster else None)
    except (OSError, ValueError) as exc:
        return None, [note(f"could not read the run's series: {exc}", "bad")]
    return rec, [note(f"The run's series were read from Prometheus {shown(prometheus)} for its time range.", "info")]


def _alerts(prometheus: str | None, record: RunRecord | None, rec: Recording | None) -> tuple[list[dict], str]:
    if not prometheus:
        return [], note("No Prometheus was given (`launcher report RUN --prometheus URL`, one that evaluates "
                        "raypulse's alert rules): alerts are not known here.", "info")
    start, end = _run_range(record, rec)
    clusters = {s.labels["cluster"] for s in rec.series.values() if s.labels.get("cluster")} if rec else set()
    try:
        return prom.fired(prometheus, start, end + 60, clusters), ""
    except (OSError, ValueError) as exc:
        return [], note(f"could not ask for the alerts: {exc}", "bad")


def _alerts_table(alerts: list[dict[str, Any]]) -> str:
    return table(("alert", "severity", "labels", "first firing", "last firing"),
                 ((a["alertname"], a["severity"], ", ".join(f"{k}={v}" for k, v in sorted(a["labels"].items())),
                   when(a["first"]), when(a["last"])) for a in alerts), "No alert fired during the run.")


class Builder:
    """The report's sections, each from the record and the recording; charts collect as they are made."""

    def __init__(self, directory: Path, record: RunRecord | None, rec: Recording | None) -> None:
        self.directory = directory
        self.record = record
        self.rec = rec
        self.charts: list[Chart] = []
        self.fleet = rec is not None and data.is_fleet(rec)  # a large cluster's record: distributions
        self.events = self._events_section
        self._events = [e.model_dump(mode="json") for e in record.events] if record else []

    def guarded(self, part: Callable[[], str]) -> str:
        """A section that cannot be built says why instead of losing the whole report."""
        try:
            return part()
        except Exception as exc:  # noqa: BLE001 - one odd record or series never costs the report
            return section(part.__name__.strip("_").replace("_", " ").capitalize(),
                           note(f"this part could not be shown: {type(exc).__name__}: {exc}", "bad"))

    def _chart(self, chart: Chart | None, empty: str) -> str:
        if chart is not None:
            self.charts.append(chart)
        return chart_div(chart, empty)

    def _metric(self, chart_id: str, title: str, unit: str, name: str, legend: Callable[[dict[str, str]], str],
                *, percent: bool = False, bytes_axis: bool = False, **labels: str) -> Chart | None:
        """One line per series; a large cluster's as bands with its nodes kept whole named over them."""
        assert self.rec is not None
        curves = data.curves(self.rec, name, legend, **labels)
        if self.fleet:
            return charts.bands(chart_id, title, unit, data.bands(self.rec, name, **labels), curves, percent=percent,
                                bytes_axis=bytes_axis)
        return charts.lines(chart_id, title, unit, curves, percent=percent, bytes_axis=bytes_axis)

    def summary(self) -> str:
        r, rec = self.record, self.rec
        rows: list[tuple[str, Any]] = []
        if r is not None:
            duration = ((r.finished_at or time.time()) - r.created_at)
            rows += [("run", r.run_id), ("name", r.name), ("state", r.state), ("reason", r.reason or "—"),
                     ("exit code", r.exit_code if r.exit_code is not None else "— (not finished)"),
                     ("backend", r.backend), ("address", r.address or "—"), ("cluster", r.cluster or "—"),
                     ("started", when(r.created_at)), ("finished", when(r.finished_at)),
                     ("duration", f"{duration:.0f} s"), ("attempts", f"{len(r.attempts)} of at most {r.max_attempts}"),
                     ("checkpoints", r.checkpoint_dir or "—")]
        if rec is not None:
            size = rec.path.stat().st_size if rec.path.is_file() else None
            interval = next((m.get("interval") for m in rec.meta), None)
            rows += [("recording", f"{rec.path}" + (f" ({size / 1024:.0f} KiB" if size is not None else "")
                      + (f", every {interval:g} s" if interval else "") + (")" if size is not None else "")),
                     ("recorded", f"{when(rec.start)} → {when(rec.end)}, {len(rec.series)} series, "
                                  f"{rec.rounds} scrapes")]
        spec = (f"<details><summary>spec (as submitted; secrets redacted)</summary><pre>"
                f"{esc(json.dumps(r.spec, indent=2))}</pre></details>") if r and r.spec else ""
        return section("Summary", table(("", ""), rows, "nothing is known of this run"), spec)

    def attempts(self) -> str:
        if self.record is None:
            return section("Attempts", note("no run record: the attempts are not known", "warn"))
        rows = [(a.attempt, a.submission_id, a.status, a.driver_exit_code if a.driver_exit_code is not None else "—",
                 when(a.submitted_at), when(a.running_at), when(a.ended_at),
                 f"{a.first_step}→{a.last_step}" if a.last_step is not None else "—", a.message or "")
                for a in self.record.attempts]
        return section("Attempts",
                       self._chart(charts.attempts(self.record, self._events), "no attempt was submitted"),
                       table(("#", "submission id", "status", "exit code", "submitted", "running", "ended", "steps",
                              "message"), rows, "no attempt was submitted"))

    def healing(self) -> str:
        heal = [e for e in self._events if e["kind"].startswith(HEAL_KINDS)]
        rows = [(when(e["time"]), e["kind"], e.get("attempt") or "", e.get("message") or "") for e in heal]
        parts = [table(("time", "event", "attempt", "what"), rows, "No health fault, remedy or resume: nothing "
                                                                   "had to be healed.")]
        for summary in sorted((self.directory / "stacks").glob("*/summary.json")):
            evidence = stacks.load(summary.parent)
            groups = "".join(f"<li>{len(members)} in <code>{esc(frame)}</code>: {esc(', '.join(members))}</li>"
                             for frame, members in evidence.groups)
            parts.append(f"<h3>Stacks {esc(summary.parent.name)}</h3><p>{esc(evidence.summary)}</p><ul>{groups}</ul>")
        return section("Heal events", *parts)

    def checkpoints(self) -> str:
        advice = checkpoint_advice.for_run(self.record) if self.record else None
        if advice is None:
            return section("Checkpoints", "<p>No checkpoint save was timed and no fault seen: nothing to advise.</p>")
        return section("Checkpoints", table(("what", "value"), checkpoint_advice.facts(advice), ""))

    def placement(self) -> str:
        rec = self.rec
        if rec is None:
            return section("Where it ran", note("no recording: the nodes and GPUs are not known", "warn"))
        return section(
            "Where it ran",
            table(("node", "role", "exporter", "cluster", "Ray node id"),
                  ((n["node"], n["role"], n["instance"], n["cluster"], n["ray_node_id"]) for n in data.nodes(rec)),
                  "no exporter was recorded"),
            "<h3>GPUs</h3>",
            table(("GPU", "uuid", "model", "simulated"),
                  ((g["gpu"], g["uuid"], g["model"], g["simulated"]) for g in data.gpus(rec)), "no GPU was recorded"),
            "<h3>Which job used which GPU</h3>",
            table(("GPU", "uuid", "job (submission)", "peak memory", "peak SM share"),
                  ((a.gpu, a.uuid, a.submission_id, f"{a.peak_memory_bytes / 2**30:.2f} GiB",
                    f"{a.peak_sm_ratio:.0%}" if a.peak_sm_ratio is not None else "—") for a in data.gpu_jobs(self.rec)),
                  "No GPU process was attributed to a job (no job process held GPU memory while recorded)."))

    def training(self) -> str:
        if self.rec is None:
            return section("Training", note("no recording: no training curves", "warn"))
        unit, speed = data.training_throughput(self.rec)
        none = "no rank reported progress (exporter.progress) while recorded"
        return section("Training progress per rank",
                       self._chart(self._metric("step", "Step", "step", "raypulse_train_step", data.rank_name), none),
                       self._chart(self._metric("loss", "Loss", "loss", "raypulse_train_loss", data.rank_name),
                                   "no rank reported a loss"),
                       self._chart(charts.lines("throughput", f"Throughput ({unit})", unit, speed), none), grid=True)

    def rl(self) -> str:
        """RL iterations (progress.report_iteration, RLlib's callback): only for a run that reported any."""
        if self.rec is None or not self.rec.select("raypulse_rl_iteration"):
            return ""
        rec = self.rec

        def by_phase(labels: dict[str, str]) -> str:
            return f"{data.rank_name(labels)} {labels.get('phase', '?')}"

        return section(
            "RL post-training",
            self._chart(charts.lines("rl-reward", "Reward (mean)", "reward", data.curves(
                rec, "raypulse_rl_reward_mean", data.rank_name)), "no iteration reported a reward"),
            self._chart(charts.lines("rl-phases", "Seconds per phase (last iteration)", "s", data.curves(
                rec, "raypulse_rl_phase_iteration_seconds", by_phase)), "no phase was timed"),
            self._chart(charts.lines("rl-kl", "KL divergence", "KL", data.curves(
                rec, "raypulse_rl_kl", data.rank_name)), "no iteration reported a KL"),
            self._chart(charts.lines("rl-truncated", "Responses truncated at the limit", "", data.curves(
                rec, "raypulse_rl_truncated_ratio", data.rank_name), percent=True),
                        "no iteration reported truncation"), grid=True)

    def gpus(self) -> str:
        if self.rec is None:
            return section("GPUs", note("no recording: no GPU curves", "warn"))
        none = "no GPU series were recorded (a node without GPUs, or without NVML)"
        kept = sorted({s.labels.get("node", "?") for s in self.rec.select("raypulse_gpu_utilization_ratio") if s.times})
        shape = note(f"A large cluster: each chart is the fleet's distribution across GPUs (p5-p95 filled, median, "
                     f"min and max dotted); drawn by name, the nodes kept whole (outliers, faults, --record-nodes): "
                     f"{', '.join(kept[:40]) or 'none'}" + (f" and {len(kept) - 40} more" if len(kept) > 40 else "")
                     + ".", "info") if self.fleet else ""
        return section(
            "GPUs", shape,
            self._chart(self._metric("gpu-util", "GPU utilization", "", "raypulse_gpu_utilization_ratio",
                                     data.gpu_name, percent=True), none),
            self._chart(self._metric("gpu-memory", "GPU memory used", "bytes", "raypulse_gpu_memory_used_bytes",
                                     data.gpu_name, bytes_axis=True), none),
            self._chart(self._metric("gpu-power", "GPU power", "W", "raypulse_gpu_power_usage_watts", data.gpu_name),
                        none),
            self._chart(self._metric("gpu-temperature", "GPU temperature", "°C", "raypulse_gpu_temperature_celsius",
                                     data.gpu_name, sensor="gpu"), none), grid=True)

    def nodes(self) -> str:
        if self.rec is None:
            return section("Nodes", note("no recording: no node curves", "warn"))
        if self.fleet:
            return section("Nodes",
                           self._chart(charts.lines("node-cpu", "CPU busy, all nodes", "", data.node_cpu(
                               self.rec, record_fleet.series_name("raypulse_node_cpu_seconds_total", "sum")),
                                                    percent=True), "no node CPU series were recorded"),
                           self._chart(self._metric("node-memory", "Node memory available", "bytes",
                                                    "raypulse_node_memory_available_bytes", data.node_name,
                                                    bytes_axis=True), "no node memory series were recorded"),
                           grid=True)
        return section("Nodes",
                       self._chart(charts.lines("node-cpu", "Node CPU busy", "", data.node_cpu(self.rec),
                                                percent=True), "no node CPU series were recorded"),
                       self._chart(charts.lines("node-memory", "Node memory used", "bytes",
                                                data.node_memory_used(self.rec), bytes_axis=True),
                                   "no node memory series were recorded"), grid=True)

    def faults(self) -> str:
        if self.rec is None:
            return section("Faults seen", note("no recording: faults are not known", "warn"))
        return section("Faults seen", table(("time", "fault", "where", "detail"),
                                            ((when(f.at), f.what, f.where, f.detail) for f in data.faults(self.rec)),
                                            "No XID, ECC error, lost GPU, dead node or silent exporter was seen."))

    def _events_section(self) -> str:
        shown = self._events[-EVENTS_SHOWN:]
        rows = [(when(e["time"]), e["kind"], e.get("attempt") or "", e.get("message") or "") for e in shown]
        more = f" (the latest {EVENTS_SHOWN} of {len(self._events)})" if len(self._events) > EVENTS_SHOWN else ""
        return section(f"Journal{more}", table(("time", "event", "attempt", "line shown"), rows, "no events recorded"))
