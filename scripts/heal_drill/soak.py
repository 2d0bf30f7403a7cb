"""The healing soak (`make heal-soak`): a long run of examples/train.py on a local cluster with simulated
GPUs, a fault every --fault-every seconds (hang, XID 79, a killed node, a NaN loss), what the run's
effective training time ratio came to (scripts/heal_drill/ettr.py), and issue 38's checks of the
launcher's own accounts (scripts/heal_drill/goodput.py: the ledger, redone steps, the launcher's part
of each fault, the hang's threshold, the checkpoint advice). `make heal-soak` makes two runs, the
second at the checkpoint interval the first one's advice gave, and renders them side by side:

    flock /tmp/raypulse-ray.lock python -m scripts.heal_drill.soak --checkpoint-seconds 30 \
        --workdir /tmp/soak-30 --json /tmp/soak-30.json
    flock /tmp/raypulse-ray.lock python -m scripts.heal_drill.soak --advised-from /tmp/soak-30.json \
        --workdir /tmp/soak-advised --json /tmp/soak-advised.json
    python -m scripts.heal_drill.soak --from-json /tmp/soak-30.json /tmp/soak-advised.json \
        --output docs/healing-drill.md
    flock /tmp/raypulse-ray.lock python -m scripts.heal_drill.soak --minutes 5 --fault-every 60 --seed 3

The run is the product as it ships (launcher.submit, the default health policy with its adaptive hang
threshold, the default retry settings), with enough max_retries for its faults. The drill's fault
injection is reused (scripts/heal_drill/run.py). The soak keeps the run's directory (its record and
recording) under --workdir (a fresh one: the advice pools the faults of every run under it), writes
its --json before anything else, and its "Soak" section into --output, leaving the rest of that file
as it is. Running a soak must be under `flock /tmp/raypulse-ray.lock` (it starts Ray); --from-json
starts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import shlex
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

import launcher
from exporter.contract import wire
from launcher import checkpoint_advice
from launcher.health.exporters import fetch_metrics
from launcher.health.policy import HealthPolicy
from launcher.health.threshold import FLOOR_S, MIN_INTERVALS
from launcher.health.threshold import K as THRESHOLD_K
from launcher.spec import JobSpec
from launcher.state import AttemptRecord, RunRecord
from scripts.heal_drill import ettr, goodput
from scripts.heal_drill.report import replace_section
from scripts.heal_drill.run import inject_xid, kill_node
from scripts.ports import free_port_range

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"
KINDS = ("hang", "xid-79", "node-killed", "nan-loss")
FAULT_CLASS = {"hang": "hang", "xid-79": "gpu_fault", "node-killed": "node_lost", "nan-loss": "nonfinite_loss"}
WORKERS = ("workers-1", "workers-2")
HANG_MARGIN_S = FLOOR_S + 60.0  # a hang is injected only this long before the end: judged at the floor, then healed
MINUTES = 40.0  # issue 38: at least 40 minutes, so that every fault kind comes
STEP_S = 1.0  # train.py's --step-seconds: the forward and backward pass it stands in for
CHECKPOINT_S = 30.0  # a checkpoint every this many seconds of steps (--checkpoint-every in steps)
GOAL_RATIO = 0.97  # GPU fault, lost node, NaN: at most 3% of a fault's slot lost (18 s of 10 minutes)
HANG_SLACK_S = 30.0  # a hang: at most the hang threshold plus this lost
FIRST_STEP_TIMEOUT_S = 600.0
SECTION = "## Soak"


@dataclass
class Planned:
    index: int
    kind: str
    node: str | None  # the worker a node fault hits
    offset: float  # seconds after the run's first step


def plan(minutes: float, fault_every: float, seed: int) -> list[Planned]:
    """One fault per `fault_every`-second slot of the window, at a seeded point in its first half
    (20-50% in, leaving the rest of the slot to heal). Kinds are dealt in blocks of four, each block a
    seeded shuffle of all four, so every kind comes once in every four faults; node faults take the
    two workers in turn."""
    rng = random.Random(seed)
    slots = int(minutes * 60 // fault_every)
    kinds: list[str] = []
    while len(kinds) < slots:
        block = list(KINDS)
        rng.shuffle(block)
        kinds += block
    planned, node_faults = [], 0
    for index, kind in enumerate(kinds[:slots]):
        node = None
        if kind in ("xid-79", "node-killed"):
            node, node_faults = WORKERS[node_faults % len(WORKERS)], node_faults + 1
        planned.append(Planned(index + 1, kind, node, round((index + rng.uniform(0.2, 0.5)) * fault_every, 1)))
    return planned


@dataclass
class Injected:
    index: int
    kind: str
    node: str | None
    planned_at: float  # unix time
    at: float | None = None  # when it was injected; None: skipped
    attempt: int | None = None  # the attempt it hit
    note: str | None = None  # why it came late, or not at all


@dataclass
class Options:
    minutes: float = MINUTES
    fault_every: float = 600.0
    seed: int = 0
    step_seconds: float = STEP_S
    checkpoint_seconds: float = CHECKPOINT_S
    retry_backoff: float | None = None  # None: the product's default
    advised_from: str | None = None  # the earlier soak (its --json) whose advised interval this one uses
    workdir: Path = field(default_factory=lambda: Path(f"/tmp/heal-soak-{time.strftime('%Y%m%d-%H%M%S')}"))

    @property
    def checkpoint_every(self) -> int:
        return max(1, round(self.checkpoint_seconds / self.step_seconds))

    def every_steps(self) -> str:
        return "every step" if self.checkpoint_every == 1 else f"every {self.checkpoint_every} steps"

    def label(self) -> str:
        """How the run checkpointed, for a heading: `checkpoints every 30 s`, or the advised interval's."""
        if self.advised_from:
            return f"checkpoints at the advised interval ({self.checkpoint_seconds:.2g} s: {self.every_steps()})"
        return f"checkpoints every {self.checkpoint_seconds:g} s"

    def max_retries(self) -> int:
        return min(100, int(self.minutes * 60 // self.fault_every) + 2)


@dataclass
class Soak:
    options: Options
    command: str
    started: str
    run_dir: Path
    injected: list[Injected]
    record: RunRecord
    accounting: ettr.Accounting | None
    load: list[float]  # 1-minute load averages, sampled through the run
    error: str | None = None


def spec(options: Options) -> dict[str, Any]:
    base = free_port_range(6)
    command = (f"python {TRAIN.name} --workers 2 --steps 1000000 --step-seconds {options.step_seconds:g} "
               f"--checkpoint-every {options.checkpoint_every}")
    return {"name": "heal-soak", "entrypoint": command, "working_dir": str(TRAIN.parent),
            "worker_groups": [{"count": 2, "cpus": 1, "gpus": 1}], "simulate_gpus": True,
            "max_retries": options.max_retries(), "exporter_port": base, "progress_port": base + 1,
            **({} if options.retry_backoff is None else {"retry_backoff_seconds": options.retry_backoff})}


# --- faults ----------------------------------------------------------------------------------------


def _ranks(submission: str) -> list[psutil.Process]:
    """The attempt's ranks: its Ray actor processes (train.py's Worker), found by the submission id in
    their environment."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if (process.info["cmdline"] or [""])[0].startswith("ray::Worker") and \
                    process.environ().get(wire.ENV_SUBMISSION_ID) == submission:
                found.append(process)
    return found


def _nan_loss(cluster: Any, submission: str) -> str:
    """A NaN loss reported for rank 0 of the attempt, to the progress endpoint of the node rank 0 reports
    to, with the attempt's token: what a diverging rank sends (train.py's own losses stay finite)."""
    for ref in cluster.exporters:
        try:
            text = fetch_metrics(ref.url, cluster.exporter_access)
        except OSError:
            continue
        step = next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("raypulse_train_step{") and f'submission_id="{submission}"' in line
                     and 'rank="0"' in line), None)
        if step is None or not ref.progress_url:
            continue
        token = wire.progress_token(Path(cluster.token_path).read_text().strip(), "submission", submission)
        report = {"kind": "progress", "submission_id": submission, "rank": 0, "time": time.time(),
                  "step": int(step), "loss": "NaN"}
        request = urllib.request.Request(ref.progress_url.rstrip("/") + wire.PROGRESS_PATH, method="POST",
                                         data=json.dumps({"reports": [report]}).encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=5):
            return ref.node
    raise RuntimeError(f"no exporter serves rank 0's step of {submission}; nowhere to report its NaN loss")


class Injector:
    """The soak's faults, through the drill's injection where it has one."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.stopped: list[tuple[int, psutil.Process]] = []  # SIGSTOPped ranks, by attempt

    def inject(self, kind: str, node: str | None, attempt: AttemptRecord) -> str | None:
        cluster = self.handle.cluster
        if kind == "hang":
            ranks = _ranks(attempt.submission_id)
            if not ranks:
                raise RuntimeError(f"no rank process of {attempt.submission_id} to stop")
            for process in ranks:
                process.suspend()
                self.stopped.append((attempt.attempt, process))
            return f"SIGSTOP to every rank ({len(ranks)})"
        if kind == "xid-79":
            inject_xid(cluster, node or WORKERS[0], 79)
            return f"XID 79 on {node}'s GPU"
        if kind == "node-killed":
            kill_node(cluster, node or WORKERS[1])
            return f"SIGKILL to {node} (its whole Ray node)"
        where = _nan_loss(cluster, attempt.submission_id)
        return f"rank 0 reports a NaN loss (to {where}'s exporter)"

    def release(self, record: RunRecord, everything: bool = False) -> None:
        """SIGCONT the ranks of attempts that ended (Ray has let go of them, or should have)."""
        keep = []
        for number, process in self.stopped:
            item = record.attempt(number)
            if everything or (item is not None and item.ended_at is not None):
                with contextlib.suppress(psutil.Error):
                    process.resume()
            else:
                keep.append((number, process))
        self.stopped = keep


# --- the run ---------------------------------------------------------------------------------------


def _current(record: RunRecord) -> AttemptRecord | None:
    return max(record.attempts, key=lambda item: item.attempt, default=None)


def _ready(record: RunRecord, settle: float, hit: int = 0) -> AttemptRecord | None:
    """The current attempt, when it is not one a fault hit already (`hit`: the last such), has made
    progress for `settle` seconds (a checkpoint of its own), is still making it, and no fault of it is
    being handled."""
    item = _current(record)
    if record.exit_code is not None or record.state != "RUNNING" or item is None or item.ended_at is not None \
            or item.attempt <= hit:
        return None
    if item.first_step_at is None or item.last_progress_at is None or time.time() - item.first_step_at < settle:
        return None
    if time.time() - item.last_progress_at > 30:
        return None
    faulted = any(event.kind == "health.fault" and event.attempt == item.attempt for event in record.events)
    return None if faulted else item


def soak(options: Options, command: str, log: Callable[[str], None] = print) -> Soak:
    options.workdir.mkdir(parents=True, exist_ok=True)
    home = options.workdir / "home"
    saved = os.environ.get(wire.ENV_HOME)
    os.environ[wire.ENV_HOME] = str(home)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    injected: list[Injected] = []
    load: list[float] = []
    error = None
    try:
        handle = launcher.submit(spec(options))
        run_dir = home / "runs" / handle.run_id
        log(f"run {handle.run_id}: {run_dir}")
        finished: list[RunRecord] = []
        waiter = threading.Thread(target=lambda: finished.append(handle.wait()), daemon=True)
        waiter.start()
        injector = Injector(handle)

        def wait_until(at: float, ready: Callable[[], object] = lambda: False) -> bool:
            while time.time() < at and not finished:
                injector.release(handle.record)
                if not load or time.time() - load[-1] > 30:
                    load.append(time.time())
                    load.append(os.getloadavg()[0])
                if ready():
                    return True
                time.sleep(0.5)
            return bool(ready())

        try:
            first = _first_step(handle, finished)
            end = first + options.minutes * 60
            log(f"first step at {time.strftime('%H:%M:%S', time.gmtime(first))} UTC; the window ends "
                f"{options.minutes:g} minutes later")
            for planned in plan(options.minutes, options.fault_every, options.seed):
                entry = Injected(planned.index, planned.kind, planned.node, first + planned.offset)
                injected.append(entry)
                wait_until(entry.planned_at)
                margin = HANG_MARGIN_S if planned.kind == "hang" else 60.0
                hit = max((entry.attempt or 0 for entry in injected), default=0)  # one fault per attempt
                ready = functools.partial(_ready, handle.record, options.checkpoint_seconds, hit)
                item = ready() if wait_until(end - margin, ready) else None
                if item is None or finished:
                    entry.note = "skipped: the run was not making progress again in time to heal before the end"
                    log(f"fault {planned.index} ({planned.kind}) {entry.note}")
                    continue
                entry.at, entry.attempt = time.time(), item.attempt
                if entry.at - entry.planned_at > 5:
                    entry.note = (f"{entry.at - entry.planned_at:.0f} s late: a fault waits for "
                                  f"{options.checkpoint_seconds:g} s of progress in an attempt no fault hit yet")
                what = injector.inject(planned.kind, planned.node, item)
                log(f"fault {planned.index}: {what}, in attempt {item.attempt}")
            wait_until(end)
        except Exception as exc:  # noqa: BLE001 - the soak reports what it got
            error = f"{type(exc).__name__}: {exc}"
            log(f"error: {error}")
        finally:
            handle.stop()
            waiter.join(300)
            injector.release(handle.record, everything=True)
        record = finished[0] if finished else handle.record
        accounting = None
        try:
            record, accounting = ettr.of_run(run_dir)
        except (OSError, ValueError) as exc:
            error = error or f"no accounting: {exc}"
    finally:
        if saved is None:
            os.environ.pop(wire.ENV_HOME, None)
        else:
            os.environ[wire.ENV_HOME] = saved
    return Soak(options, command, started, run_dir, injected, record, accounting, load[1::2], error)


def _first_step(handle: Any, finished: list[RunRecord]) -> float:
    deadline = time.monotonic() + FIRST_STEP_TIMEOUT_S
    while time.monotonic() < deadline and not finished:
        first = handle.record.attempts[0].first_step_at if handle.record.attempts else None
        if first is not None:
            return first
        time.sleep(0.5)
    raise TimeoutError(f"the run made no first step within {FIRST_STEP_TIMEOUT_S:g} s")


# --- the report ------------------------------------------------------------------------------------


@dataclass
class Row:
    """One recovery: the fault injected, and what it cost (ettr.Recovery)."""

    injected: Injected
    recovery: ettr.Recovery | None
    limit: float  # the most seconds it may cost
    met: bool | None


def rows(result: Soak) -> list[Row]:
    recoveries = {item.attempt: item for item in (result.accounting.recoveries if result.accounting else [])}
    found = []
    for entry in result.injected:
        if entry.at is None:
            continue
        recovery = recoveries.get(entry.attempt) if entry.attempt is not None else None
        threshold = goodput.hang_threshold(result.record, entry.attempt) if entry.attempt is not None else None
        limit = ((threshold or FLOOR_S) + HANG_SLACK_S) if entry.kind == "hang" else \
            (1 - GOAL_RATIO) * result.options.fault_every
        met = None if recovery is None else recovery.seconds_lost <= limit
        found.append(Row(entry, recovery, limit, met))
    return found


def _clock(at: float | None, origin: float) -> str:
    if at is None:
        return "—"
    seconds = at - origin
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def _after(at: float | None, since: float | None) -> str:
    return "" if at is None or since is None else f" (+{at - since:.1f} s)"


def render(results: list[Soak]) -> str:
    """The Soak section: how the runs were made (the first one's settings), the runs side by side, then each
    run's faults and checks."""
    first = results[0]
    options = first.options
    policy = HealthPolicy()
    run_spec = JobSpec.model_fields
    commands = "; then ".join(f"`{result.command}` ({result.started})" for result in results)
    lines = [
        SECTION, "",
        "<!-- Written by `make heal-soak` (python -m scripts.heal_drill.soak --from-json ... --output "
        "docs/healing-drill.md); do not edit. -->", "",
        f"Runs: {commands}. The machine: {os.cpu_count()} cores shared with other work.", "",
        f"Each run is one run of `examples/train.py` (`python train.py --workers 2 --steps 1000000 --step-seconds "
        f"{options.step_seconds:g} --checkpoint-every N`: two data-parallel ranks, one per worker node, each on a "
        "simulated GPU, resuming from RAYPULSE_RESUME_FROM; a save is timed by `progress.checkpoint(...)`) "
        "on a local cluster started by `launcher submit` (a head and two workers with one simulated GPU each, "
        f"one exporter per node), for {options.minutes:g} minutes after its first step; then the soak stopped it. "
        f"The health policy is the product's defaults (a check every {policy.check_interval_seconds:g} s, every "
        f"action restart, the adaptive hang threshold: {THRESHOLD_K:g} x the p99 step interval once "
        f"{MIN_INTERVALS} checks advanced, at least {FLOOR_S:g} s, at most `hang_after_seconds` "
        f"{policy.hang_after_seconds:g} s); {_retries(options, run_spec)}", "",
        f"Faults: one per {options.fault_every:g} s slot after the first step, at a point drawn between 20% and 50% "
        f"into the slot; the kinds are dealt in blocks of four, each a shuffle of hang / XID 79 / node killed / "
        f"NaN drawn with `random.Random(seed)` (seed {options.seed}), so every kind comes once in every four faults "
        f"(a run of {4 * options.fault_every / 60:g} minutes or more has them all); node faults take workers-1 and "
        "workers-2 in turn. A fault waits until the run has made progress for one checkpoint interval since its "
        "last recovery. Hang: SIGSTOP to every rank; XID 79: an XID event on the worker's simulated GPU "
        "(the drill's injection); node killed: SIGKILL to the worker's whole Ray node (the drill's); NaN: a NaN "
        "loss reported in rank 0's name to its node's progress endpoint, with the attempt's token (what a "
        "diverging rank sends; train.py's own loss stays finite).", "",
        "ETTR = time making progress that was kept / wall time after the first step (scripts/heal_drill/ettr.py, "
        "the soak's own count from the ranks' reports: a save counts as training time). The ledger: the "
        "launcher's split of the run's whole wall time, from its creation (cluster start included) to its end, "
        "as `run.finished` kept it (`seconds_by_cause`, launcher/ledger.py); its productive share has the saves "
        "(checkpoint stall) taken out. Steps kept: the steps no rollback threw away, per hour of the window. "
        "The advice: launcher/checkpoint_advice.py at the run's end (what `launcher submit` prints), from the "
        "measured save cost and the run's own fault rate.", "",
        _comparison(results), "",
        *([_versus(results[0], results[-1]), ""] if len(results) > 1 else []),
    ]
    for result in results:
        lines += _run(result)
    return "\n".join(lines)


def _comparison(results: list[Soak]) -> str:
    """The runs side by side."""
    header = "| | " + " | ".join(result.options.label() for result in results) + " |"
    table = [header, "|---|" + "---|" * len(results)]
    found = [(result, _checks(result)) for result in results]

    def row(label: str, cell: Callable[[Soak, goodput.Checks | None], str]) -> None:
        table.append(f"| {label} | " + " | ".join(cell(result, check) for result, check in found) + " |")

    row("checkpoint interval as it ran", lambda result, _: _checkpoint_pace(result.accounting, result.options))
    row("**ETTR** (the soak's)", lambda result, _: f"**{result.accounting.ettr:.1%}**"
        if result.accounting and result.accounting.ettr is not None else "—")
    row("steps kept per hour", lambda result, _: _steps_per_hour(result))
    row("faults injected / healed", lambda result, check: f"{sum(1 for e in result.injected if e.at is not None)} / "
        f"{len(check.faults) if check else 0}")
    row("lost to recoveries: redone + down", lambda result, _: _lost(result))
    row("ledger: productive share of the wall time", lambda _, check: _share(check))
    row("ledger: causes' sum vs wall time", lambda _, check: _ledger_sum(check))
    row("redone seconds: ledger / soak", lambda _, check: "—" if check is None or check.redone_ledger_s is None else
        f"{check.redone_ledger_s:.1f} / {check.redone_soak_s:.1f} (≤ {check.redone_tolerance_s:.1f} apart: "
        f"{_yes(check.redone_ok)})")
    row("checkpoint cost (measured)", lambda _, check: "—" if check is None or check.advice is None or
        check.advice.cost_s is None else checkpoint_advice.seconds_text(check.advice.cost_s, whole_from=0.1))
    row("advised interval (Young-Daly)", lambda _, check: _advised(check))
    row("expected loss: at the interval used / advised", lambda _, check: "—" if check is None or check.advice is None
        or check.advice.loss_used_s is None or check.advice.loss_advised_s is None else
        f"{check.advice.loss_used_s:.0f} s / {check.advice.loss_advised_s:.0f} s")
    row("issue 38's checks", lambda _, check: "—" if check is None else
        ("all met" if not check.failed() else f"**{len(check.failed())} missed**"))
    return "\n".join(table)


def _versus(first: Soak, last: Soak) -> str:
    """Whether the later run (the advised interval) lost less than the first, in the runs' own numbers."""
    if first.accounting is None or last.accounting is None or first.accounting.ettr is None or \
            last.accounting.ettr is None:
        return "The runs cannot be compared: one of them has no accounting."

    def lost(result: Soak) -> float:
        assert result.accounting is not None
        return sum(item.seconds_lost for item in result.accounting.recoveries)

    def per_fault(result: Soak) -> float:
        assert result.accounting is not None
        return lost(result) / max(1, len(result.accounting.recoveries))

    check = _checks(first)
    advice = check.advice if check is not None else None
    said = ""
    if advice is not None and advice.cost_s is not None and advice.advised_s is not None and advice.mtbf_s:
        advised = checkpoint_advice.seconds_text(advice.advised_s)
        said = (f"The first run's saves (examples/train.py writes a small JSON file) cost "
                f"{checkpoint_advice.seconds_text(advice.cost_s, whole_from=0.1)}: at its mean time between faults "
                f"of {advice.mtbf_s:.0f} s, Young-Daly advises {advised} "
                "(a real model's save, seconds to minutes, is advised a longer interval). ")
    less = per_fault(last) < per_fault(first)
    return (f"{said}{last.options.label().capitalize()} against {first.options.label()}: "
            f"{per_fault(last):.1f} s lost per recovery against {per_fault(first):.1f} s "
            f"({lost(last):.1f} s over {len(last.accounting.recoveries)} against {lost(first):.1f} s over "
            f"{len(first.accounting.recoveries)}), ETTR {last.accounting.ettr:.1%} against "
            f"{first.accounting.ettr:.1%}: " + ("**it lost less**." if less else "**it did not lose less**."))


def _run(result: Soak) -> list[str]:
    """One run's subsection: its command, ETTR, the faults and what each cost, the checks."""
    options, accounting = result.options, result.accounting
    origin = accounting.start if accounting else 0.0
    lines = [f"### {options.label()[0].upper()}{options.label()[1:]}", "",
             f"`{result.command}`, {result.started}: `{result.record.spec.get('entrypoint', '')}` (a checkpoint "
             f"{options.every_steps()}, "
             f"{_checkpoint_pace(accounting, options)}); the 1-minute load "
             f"average through the run: {_load(result.load)}.", ""]
    if accounting is not None:
        launcher_ratio = next((event.details.get("effective_training_ratio") for event in reversed(result.record.events)
                               if event.kind == "run.finished"), None)
        lines += [
            f"**Effective training time ratio: {accounting.ettr:.1%}** ({accounting.kept_seconds:.0f} s of kept "
            f"progress in {accounting.wall_seconds:.0f} s of wall time after the first step; "
            f"{len(accounting.recoveries)} recoveries, {accounting.tail_seconds:.1f} s after the last step). "
            f"The launcher's own `effective_training_ratio` at the end: {_ratio(launcher_ratio)} (its wall time "
            "starts when the run is created, before the cluster is up).", "",
            "A recovery's seconds lost = redone (the time of the steps past the checkpoint it resumed from) + down "
            "(from the last step to the new attempt's first step, less one step's time: detection, stopping, a node "
            "replaced, the backoff, the new attempt's start). Kept + lost = wall time. Times are minutes:seconds "
            "after the first step.", "",
            "| # | fault | injected at | detected at | attempt ended at | next attempt's first step at | steps lost "
            "| seconds lost (redone + down) | goal | met |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in rows(result):
            entry, recovery = row.injected, row.recovery
            where = f" on {entry.node}" if entry.node else ""
            if recovery is None:
                lines.append(f"| {entry.index} | {entry.kind}{where} | {_clock(entry.at, origin)} | — | — | — | — | "
                             f"no recovery in the run's record | ≤ {row.limit:g} s | **no** |")
                continue
            times = " | ".join(_clock(at, origin) + _after(at, entry.at) for at in (
                recovery.detected_at, recovery.ended_at, recovery.next_first_step_at))
            steps = f"{_dash(recovery.steps_lost)} (step {_dash(recovery.last_step)} → {_dash(recovery.resumed_from)})"
            lines.append(
                f"| {entry.index} | {entry.kind}{where} (attempt {entry.attempt}) | {_clock(entry.at, origin)} | "
                f"{times} | {steps} | {recovery.seconds_lost:.1f} ({recovery.redone_seconds:.1f} + "
                f"{recovery.down_seconds:.1f}) | ≤ {row.limit:g} s | {'yes' if row.met else '**no**'} |")
        lines += [""] + [f"- {_why(row)}" for row in rows(result) if row.recovery is not None]
        lines += [f"- Fault {entry.index} ({entry.kind}): {entry.note}." for entry in result.injected if entry.note]
        lines += ["", _verdict(result), ""]
        lines += _checks_text(result)
    if result.error:
        lines += [f"The soak did not go as planned: {result.error}.", ""]
    return lines


def _checks_text(result: Soak) -> list[str]:
    """Issue 38's checks of the launcher's own accounts (scripts/heal_drill/goodput.py)."""
    check = _checks(result)
    if check is None:
        return []
    lines = [f"The launcher's accounts (issue 38): the launcher's part of a fault = detect + stop + provision + "
             f"startup (from the fault, or the last step when steps were made after it, to the work of the new "
             f"attempt's first step, less the retry backoff), at most "
             f"{goodput.LAUNCHER_PART_S:g} s for a lost node or an XID and the threshold in force + "
             f"{goodput.LAUNCHER_PART_S:g} s for a hang; steps lost as the launcher said them (`health.recovered`) "
             "against the soak's count, within one step.", "",
             "| # | fault | launcher's part | bound | met | steps lost: launcher / soak | agree | hang: threshold in "
             "force, quiet when judged, judged after the last step |",
             "|---|---|---|---|---|---|---|---|"]
    for fault in check.faults:
        hang = "—"
        if fault.kind == "hang":
            hang = (f"{_dash(fault.threshold_s)} s ({fault.threshold_rule}: {fault.threshold_basis}), quiet "
                    f"{_dash(fault.quiet_s)} s, judged {_num(fault.judged_after_last_step_s)} s after the last step "
                    f"(≤ {goodput.HANG_JUDGED_S:g} s: {_yes(fault.hang_ok)})")
        bound = "—" if fault.bound_s is None else f"≤ {fault.bound_s:.1f} s"
        lines.append(f"| {fault.index} | {fault.kind} (attempt {fault.attempt}) | {fault.launcher_s:.1f} s | {bound} | "
                     f"{_yes(fault.part_ok)} | {_num(fault.steps_launcher)} / {_dash(fault.steps_soak)} | "
                     f"{_yes(fault.steps_agree)} | {hang} |")
    lines.append("")
    if check.ledger is not None:
        ledger = check.ledger
        split = ", ".join(f"{cause.replace('_', ' ')} {seconds:.1f} s" for cause, seconds in ledger.seconds.items())
        lines.append(f"The ledger (`run.finished`): {split}; sum {ledger.total:.1f} s against {ledger.wall:.1f} s "
                     f"from the run's creation to its end ({check.ledger.error:+.3%}, within "
                     f"{goodput.LEDGER_TOLERANCE:.0%}: {_yes(check.ledger.ok)}).")
    if check.advice is not None:
        lines.append("The advice at the end: " + checkpoint_advice.describe(check.advice) + ".")
    missed = check.failed()
    lines += ["", "Checks: " + ("**all met**." if not missed else "**missed**: " + "; ".join(missed) + "."), ""]
    return lines


def _checks(result: Soak) -> goodput.Checks | None:
    if result.accounting is None:
        return None
    faults = [(entry.index, entry.kind, entry.attempt, entry.at) for entry in result.injected
              if entry.at is not None and entry.attempt is not None]
    return goodput.checks(result.record, result.accounting, faults, _past(result))


def _past(result: Soak) -> checkpoint_advice.FaultRate:
    """The faults of the other finished runs under the soak's $RAYPULSE_HOME, which the launcher's own advice
    pools with the run's (none, for a soak in a fresh --workdir)."""
    others = sorted(path for path in result.run_dir.parent.glob("*/run.json") if path.parent != result.run_dir)
    records = [RunRecord.model_validate_json(path.read_text()) for path in others]
    return checkpoint_advice.past_faults(records, result.record.run_id)


def _yes(value: bool | None) -> str:
    return "—" if value is None else ("yes" if value else "**no**")


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}".removesuffix(".0")


def _steps_per_hour(result: Soak) -> str:
    accounting = result.accounting
    if accounting is None or not accounting.wall_seconds:
        return "—"
    steps = sum(item.last_step - item.first_step + 1 for item in accounting.kept)
    return f"{steps * 3600 / accounting.wall_seconds:,.0f} ({steps} in {accounting.wall_seconds:.0f} s)"


def _lost(result: Soak) -> str:
    accounting = result.accounting
    if accounting is None:
        return "—"
    redone = sum(item.redone_seconds for item in accounting.recoveries)
    down = sum(item.down_seconds for item in accounting.recoveries)
    return f"{redone + down:.1f} s = {redone:.1f} + {down:.1f}"


def _share(check: goodput.Checks | None) -> str:
    if check is None or check.ledger is None or not check.ledger.wall:
        return "—"
    return f"{check.ledger.seconds.get('productive', 0.0) / check.ledger.wall:.1%} (stall " \
           f"{check.ledger.seconds.get('checkpoint_stall', 0.0):.1f} s)"


def _ledger_sum(check: goodput.Checks | None) -> str:
    if check is None or check.ledger is None:
        return "—"
    ledger = check.ledger
    return f"{ledger.total:.1f} s / {ledger.wall:.1f} s ({ledger.error:+.3%}: {_yes(ledger.ok)})"


def _advised(check: goodput.Checks | None) -> str:
    if check is None or check.advice is None:
        return "—"
    if check.advice.advised_s is None:
        return check.advice.why or "—"
    return f"{checkpoint_advice.seconds_text(check.advice.advised_s)} (mean time between faults " \
           f"{check.advice.mtbf_s:.0f} s, {check.advice.faults} faults)"


def _why(row: Row) -> str:
    """Where a recovery's seconds went: from the injection to the new attempt's first step, by phase."""
    entry, recovery = row.injected, row.recovery
    assert recovery is not None
    assert entry.at is not None
    phases = []
    detected, ended = recovery.detected_at, recovery.ended_at
    if detected is not None:
        phases.append(f"detection {detected - entry.at:.1f} s")
    if ended is not None and detected is not None:
        phases.append(f"stopping {ended - detected:.1f} s" if ended >= detected else
                      f"the attempt failed on its own {ended - entry.at:.1f} s after the fault")
    after = max(value for value in (detected, ended, entry.at) if value is not None)
    if recovery.next_submitted_at is not None:
        between = [part for part in (recovery.node_action, f"{recovery.backoff_seconds:g} s backoff"
                                     if recovery.backoff_seconds is not None else None) if part]
        phases.append(f"{recovery.next_submitted_at - after:.1f} s to the next submission ({', '.join(between)})")
        if recovery.next_first_step_at is not None:
            phases.append(f"{recovery.next_first_step_at - recovery.next_submitted_at:.1f} s from the submission "
                          "to its first step")
    said = recovery.said or {}
    launcher = ", ".join(f"{label} {said[key]:g}{unit}" for key, label, unit in (
        ("steps_lost", "steps lost", ""), ("detect_seconds", "detected in", " s"),
        ("recover_seconds", "recovered in", " s")) if key in said)
    verdict = "within" if row.met else "over"
    return (f"Fault {entry.index} ({entry.kind}): {recovery.seconds_lost:.1f} s lost ({verdict} {row.limit:g} s) = "
            f"{recovery.redone_seconds:.1f} s of steps redone + {recovery.down_seconds:.1f} s without progress. "
            f"From the fault to the new attempt's first step: {'; '.join(phases)}."
            + (f" The launcher said: {launcher}." if launcher else ""))


def _retries(options: Options, run_spec: dict[str, Any]) -> str:
    backoff = run_spec["retry_backoff_seconds"].default if options.retry_backoff is None else options.retry_backoff
    which = "the default" if options.retry_backoff is None else "set by --retry-backoff"
    return (f"the run's retry settings are the product's too (a backoff of {backoff:g} s before a retry after a hang "
            f"or a NaN, {which}, doubling with each failure in a row up to "
            f"{run_spec['retry_backoff_max_seconds'].default:g} s; none after a faulty node was taken out), "
            f"but `max_retries: {options.max_retries()}` so that the run outlives its faults.")


def _verdict(result: Soak) -> str:
    found = rows(result)
    if not found:
        return "Goal: nothing to judge (no fault was injected)."
    missed = [row for row in found if not row.met]
    parts = [f"Goal (≥ {GOAL_RATIO:.0%} per slot for a GPU fault, a lost node or a NaN, i.e. at most "
             f"{(1 - GOAL_RATIO) * result.options.fault_every:g} s lost per fault; a hang at most its threshold + "
             f"{HANG_SLACK_S:g} s): "
             + ("**met** for every fault." if not missed else
                f"**not met** for {len(missed)} of {len(found)} faults "
                f"({', '.join(str(row.injected.index) for row in missed)}).")]
    if missed:
        parts.append(_why_not(result, found))
    return " ".join(parts)


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{value:.1f} s" for value in values)


def _why_not(result: Soak, found: list[Row]) -> str:
    """Why the goal was missed, from the run's own numbers: the backoff, then what a recovery costs besides."""
    healed = [row for row in found if row.recovery is not None]
    if not healed:
        return "No fault was healed within the window."
    recoveries = [row.recovery for row in healed if row.recovery is not None]
    backoffs = [recovery.backoff_seconds or 0.0 for recovery in recoveries]
    without = [row.recovery.seconds_lost - backoff for row, backoff in zip(healed, backoffs, strict=True)
               if row.recovery is not None]
    met_without = [str(row.injected.index) for row, lost in zip(healed, without, strict=True) if lost <= row.limit]
    why = [f"Why: the backoff before each retry ({_seconds(backoffs)} here); without it the faults would have cost "
           f"{_seconds(without)}, "
           + (f"within the goal for fault(s) {', '.join(met_without)}." if met_without else "still over the goal.")]
    others = [row for row in healed if row.injected.kind != "hang" and row.recovery is not None]
    if others and result.accounting is not None and result.accounting.step_seconds:
        interval = result.accounting.step_seconds * result.options.checkpoint_every
        down = [row.recovery.down_seconds - (row.recovery.backoff_seconds or 0.0) for row in others
                if row.recovery is not None]
        redone = [row.recovery.redone_seconds for row in others if row.recovery is not None]
        budget = (1 - GOAL_RATIO) * result.options.fault_every
        why.append(f"Beyond the backoff, a GPU fault, a lost node or a NaN has {budget:g} s: a "
                   f"checkpoint every {interval:.1f} s costs half of that interval in redone steps on average "
                   f"({interval / 2:.1f} s; {_seconds(redone)} here, by where the fault fell after a checkpoint), "
                   f"and detecting, stopping, replacing the node and starting the new attempt to its first step "
                   f"took {_seconds(down)} besides the backoff (the phases above).")
    return " ".join(why)


def _dash(value: object) -> str:
    return "—" if value is None else str(value)


def _ratio(value: object) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) else "—"


def _load(samples: list[float]) -> str:
    if not samples:
        return "not sampled"
    return f"{sum(samples) / len(samples):.1f} on average, {max(samples):.1f} at most"


def _checkpoint_pace(accounting: ettr.Accounting | None, options: Options) -> str:
    if accounting is None or accounting.step_seconds is None:
        return f"about {options.checkpoint_seconds:g} s"
    return f"every {accounting.step_seconds * options.checkpoint_every:.1f} s as it ran " \
           f"({accounting.step_seconds:.3f} s a step)"


def to_json(result: Soak) -> str:
    accounting = result.accounting
    return json.dumps({
        "command": result.command, "started": result.started, "run_dir": str(result.run_dir),
        "options": {key: str(value) if isinstance(value, Path) else value
                    for key, value in asdict(result.options).items()},
        "injected": [asdict(entry) for entry in result.injected], "load": result.load, "error": result.error,
        "ettr": accounting.ettr if accounting else None,
        "wall_seconds": accounting.wall_seconds if accounting else None,
        "kept_seconds": accounting.kept_seconds if accounting else None,
        "kept": [asdict(item) for item in accounting.kept] if accounting else [],
        "recoveries": [asdict(item) | {"seconds_lost": item.seconds_lost} for item in accounting.recoveries]
        if accounting else [],
        "rows": [{"index": row.injected.index, "kind": row.injected.kind, "limit": row.limit, "met": row.met}
                 for row in rows(result)],
        **_checks_json(result),
    }, indent=2)


def _checks_json(result: Soak) -> dict[str, Any]:
    """Issue 38's checks and the advice, for a reader of the JSON (`--advised-from` reads the advice)."""
    try:
        check = _checks(result)
    except (OSError, ValueError) as exc:
        return {"checks_error": f"{type(exc).__name__}: {exc}"}
    if check is None:
        return {}
    return {"advice": asdict(check.advice) if check.advice else None,
            "ledger": asdict(check.ledger) | {"total": check.ledger.total, "error": check.ledger.error}
            if check.ledger else None,
            "faults": [asdict(fault) for fault in check.faults],
            "redone": {"ledger_s": check.redone_ledger_s, "soak_s": check.redone_soak_s,
                       "tolerance_s": check.redone_tolerance_s},
            "missed": check.failed()}


def from_json(path: Path) -> Soak:
    """A finished soak again, from its --json and the run directory it names (its record and recording)."""
    raw = json.loads(path.read_text())
    fields = {key: Path(value) if key == "workdir" else value for key, value in raw["options"].items()}
    run_dir = Path(raw["run_dir"])
    record, accounting = ettr.of_run(run_dir)
    return Soak(Options(**fields), raw["command"], raw["started"], run_dir,
                [Injected(**entry) for entry in raw["injected"]], record, accounting, raw["load"], raw["error"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.heal_drill.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=MINUTES, help=f"the window after the first step [{MINUTES:g}]")
    parser.add_argument("--fault-every", type=float, default=600.0, help="seconds per fault slot [600]")
    parser.add_argument("--seed", type=int, default=0, help="draws the faults' kinds and times [0]")
    parser.add_argument("--step-seconds", type=float, default=STEP_S, help=f"one training step's seconds [{STEP_S:g}]")
    parser.add_argument("--checkpoint-seconds", type=float, default=CHECKPOINT_S,
                        help=f"a checkpoint every this many seconds of steps [{CHECKPOINT_S:g}]")
    parser.add_argument("--advised-from", type=Path, metavar="JSON",
                        help="checkpoint at the interval advised at the end of an earlier soak (its --json)")
    parser.add_argument("--retry-backoff", type=float, help="the run's retry_backoff_seconds [the default, 10]")
    parser.add_argument("--workdir", type=Path, help="where the run's record is kept [/tmp/heal-soak-<time>]")
    parser.add_argument("--output", type=Path, help="write the Soak section into this Markdown file")
    parser.add_argument("--json", type=Path,
                        help="write the raw results here (with one --from-json: that soak's, again)")
    parser.add_argument("--from-json", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: render finished soaks again from their --json, side by side")
    args = parser.parse_args(argv)
    if args.advised_from:
        args.checkpoint_seconds = _advised_interval(parser, args.advised_from)
    if min(args.fault_every, args.minutes, args.step_seconds, args.checkpoint_seconds) <= 0:
        parser.error("--minutes, --fault-every, --step-seconds and --checkpoint-seconds must be positive")
    options = Options(args.minutes, args.fault_every, args.seed, args.step_seconds, args.checkpoint_seconds,
                      args.retry_backoff, str(args.advised_from) if args.advised_from else None)
    if args.workdir:
        options.workdir = args.workdir
    command = "python -m scripts.heal_drill.soak " + shlex.join(argv if argv is not None else sys.argv[1:])
    if args.from_json:
        results = [_loaded(parser, path) for path in args.from_json]
        if args.json and len(results) == 1:
            args.json.write_text(to_json(results[0]))  # the JSON again, with what this version adds
    else:
        results = [soak(options, command.strip(), log=lambda line: print(f"heal-soak: {line}", flush=True))]
        if args.json:
            args.json.write_text(to_json(results[0]))  # first: what the soak measured outlives a rendering error
    section = render(results)
    if args.output:
        existing = args.output.read_text() if args.output.exists() else ""
        args.output.write_text(replace_section(existing, SECTION, section))
    print(section)
    return 0 if all(result.accounting is not None and not result.error for result in results) else 1


def _loaded(parser: argparse.ArgumentParser, path: Path) -> Soak:
    try:
        return from_json(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parser.error(f"--from-json {path}: {exc} (give the --json a finished soak wrote, its run directory in place)")
        raise  # parser.error exits


def _advised_interval(parser: argparse.ArgumentParser, path: Path) -> float:
    """The advised checkpoint interval (seconds) an earlier soak's run ended with."""
    try:
        advised = (json.loads(path.read_text()).get("advice") or {}).get("advised_s")
    except (OSError, ValueError, AttributeError) as exc:
        parser.error(f"--advised-from {path}: {exc} (give the --json an earlier soak wrote)")
    if not isinstance(advised, int | float) or advised <= 0:
        parser.error(f"--advised-from {path}: that soak's run ended with no advised interval (its advice said why); "
                     "give --checkpoint-seconds instead")
    return float(advised)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM stops the run like Ctrl-C
    sys.exit(main())
