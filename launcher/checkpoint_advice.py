"""Checkpoint advice: is a run's checkpoint interval right for its fault rate?

Pure functions over run records ($RAYPULSE_HOME/runs, launcher/state.py) and numbers; nothing here
reads the cluster. The Young-Daly interval (Young 1974, Daly 2006) minimises the expected time lost
to checkpoint saves plus the steps redone after a fault:

    interval = sqrt(2 x checkpoint cost x mean time between faults)

and at an interval T, over W seconds of training with n faults, the expected loss is
W / T x cost (saves) + n x T / 2 (on average half an interval is redone per fault).

The fault rate comes from the run's own attempts and the finished runs under $RAYPULSE_HOME, or is
given (`mtbf_s`); with fewer than MIN_FAULTS faults observed there is too little data to say, and the
advice says so instead of a number.

A job saves between steps, so the advised interval is at least one step's time (the run's newest attempt's
pace): a save that costs next to nothing would otherwise be advised every fraction of a second, and every
real interval called too rare.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from alerts.config import DEFAULT as ALERTS
from launcher.exitcodes import ExitCode
from launcher.state import RunRecord, list_runs

MIN_FAULTS = 2  # one fault is an anecdote, not a rate
# Over this many times the advised interval is "too rare": the alert rule's ratio, so the two agree.
TOO_RARE = ALERTS.tune("RaypulseRunCheckpointsTooRare").ratio
# Final run states whose last attempt ended in a fault (a stop or a deadline is not one).
FAULTY_ENDS = frozenset(code.name for code in (ExitCode.FAILED, ExitCode.UNHEALTHY, ExitCode.INFRA_ERROR,
                                               ExitCode.REPEATED_FAILURE))


@dataclass(frozen=True)
class FaultRate:
    """Faults seen over the seconds the attempts ran (the exposure)."""

    faults: int
    seconds: float

    @property
    def mtbf_s(self) -> float | None:
        return self.seconds / self.faults if self.faults >= MIN_FAULTS and self.seconds > 0 else None


@dataclass(frozen=True)
class Advice:
    """What the summary, report and gauges say. Fields are None where the data does not allow a number;
    `why` then says what is missing."""

    cost_s: float | None  # one checkpoint save
    interval_s: float | None  # the interval the run used
    mtbf_s: float | None
    faults: int  # behind mtbf_s (0 when given)
    redone_steps: int  # steps re-run after the run's restarts
    advised_s: float | None  # Young-Daly
    loss_used_s: float | None  # expected loss at the interval used, over this run
    loss_advised_s: float | None  # ... and at the advised one
    why: str | None = None
    step_s: float | None = None  # one step's time, the least advised_s can be (None: not seen)

    @property
    def too_rare(self) -> bool:
        """The interval used is over TOO_RARE times the advised one: checkpoints too rare for this fault rate."""
        return self.interval_s is not None and self.advised_s is not None and \
            self.interval_s > TOO_RARE * self.advised_s


def young_daly_s(cost_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that minimises expected loss (seconds)."""
    if cost_s < 0 or mtbf_s <= 0:
        raise ValueError(f"checkpoint cost {cost_s} s must be >= 0 and mean time between faults {mtbf_s} s > 0")
    return math.sqrt(2 * cost_s * mtbf_s)


def expected_loss_s(interval_s: float, cost_s: float, wall_s: float, faults: int) -> float:
    """Seconds lost over `wall_s` of training with `faults` faults when saving every `interval_s`."""
    if interval_s <= 0:
        raise ValueError(f"checkpoint interval {interval_s} s must be > 0")
    return wall_s / interval_s * cost_s + faults * interval_s / 2


def run_faults(record: RunRecord, now: float | None = None) -> FaultRate:
    """A run's faults and exposure: every attempt that was followed by another was ended by a fault, and
    so was the last one of a run that ended FAILED or UNHEALTHY; exposure is the time attempts ran."""
    now = time.time() if now is None else now
    seconds = 0.0
    for attempt in record.attempts:
        began = attempt.running_at if attempt.running_at is not None else attempt.submitted_at
        if began is not None:
            seconds += max(0.0, (attempt.ended_at if attempt.ended_at is not None else now) - began)
    faults = max(0, len(record.attempts) - 1)
    if record.attempts and record.state in FAULTY_ENDS:
        faults += 1
    return FaultRate(faults, seconds)


def past_faults(history: Iterable[RunRecord], run_id: str) -> FaultRate:
    """The faults and exposure of the finished runs in `history` other than `run_id` (runs still going are
    left out, their exposure is not final): what a run's advice pools with its own, read once."""
    rates = [run_faults(run) for run in history if run.run_id != run_id and run.finished_at is not None]
    return FaultRate(sum(rate.faults for rate in rates), sum(rate.seconds for rate in rates))


def fault_rate(record: RunRecord, history: Iterable[RunRecord] = (), now: float | None = None,
               past: FaultRate | None = None) -> FaultRate:
    """This run's faults pooled with those of the finished runs in `history` (the others under
    $RAYPULSE_HOME), or with `past` when it was summed already (past_faults)."""
    own = run_faults(record, now)
    past = past_faults(history, record.run_id) if past is None else past
    return FaultRate(own.faults + past.faults, own.seconds + past.seconds)


def redone_steps(record: RunRecord) -> int:
    """Steps re-run after restarts: for each attempt that resumed, the previous attempt's last step minus
    the step it resumed at."""
    redone = 0
    for before, after in zip(record.attempts, record.attempts[1:], strict=False):
        if before.last_step is not None:
            resumed = after.resumed_from_step if after.resumed_from_step is not None else 0
            redone += max(0, before.last_step - resumed)
    return redone


def step_seconds(record: RunRecord) -> float | None:
    """One step's time at the run's pace: its newest attempt that made two steps or more, from its first step
    to its newest. None before one did."""
    for item in reversed(record.attempts):
        if None in (item.first_step, item.last_step, item.first_step_at, item.last_progress_at):
            continue
        steps = item.last_step - item.first_step
        if steps > 0 and item.last_progress_at > item.first_step_at:
            return (item.last_progress_at - item.first_step_at) / steps
    return None


def measured(record: RunRecord) -> tuple[float | None, float | None]:
    """The run's checkpoint cost and interval as its attempts' checks saw them (the newest attempt that
    saw each); None where no save was timed, or fewer than two were seen."""
    cost = next((item.checkpoint_seconds for item in reversed(record.attempts)
                 if item.checkpoint_seconds is not None), None)
    interval = next((item.checkpoint_interval_s for item in reversed(record.attempts)
                     if item.checkpoint_interval_s is not None), None)
    return cost, interval


def for_run(record: RunRecord, past: FaultRate | None = None, mtbf_s: float | None = None) -> Advice | None:
    """The advice the summary, report and gauges show, pooling the runs under $RAYPULSE_HOME (`past`, their
    past_faults, read when not given); None for a run with nothing to advise on (no save timed and no
    fault: a job that does not checkpoint)."""
    if measured(record)[0] is None and not run_faults(record).faults:
        return None  # nothing to advise on: the other runs are not read
    if mtbf_s is None:  # the run's health.mtbf_seconds, when its spec gave one
        mtbf_s = (record.spec.get("health") or {}).get("mtbf_seconds")
    if past is None:
        past = past_faults(list_runs(), record.run_id)
    return advise(record, past=past, mtbf_s=mtbf_s)


def advise(record: RunRecord, *, cost_s: float | None = None, interval_s: float | None = None,
           history: Iterable[RunRecord] = (), mtbf_s: float | None = None, now: float | None = None,
           past: FaultRate | None = None) -> Advice:
    """The advice for a run. Its checkpoint cost and interval are those measured (`measured`) unless
    given; a given mean time between faults overrides the one seen."""
    seen_cost, seen_interval = measured(record)
    cost_s = seen_cost if cost_s is None else cost_s
    interval_s = seen_interval if interval_s is None else interval_s
    own = run_faults(record, now)
    rate = FaultRate(0, 0.0) if mtbf_s is not None else fault_rate(record, history, now, past)
    mtbf = mtbf_s if mtbf_s is not None else rate.mtbf_s
    redone = redone_steps(record)
    if cost_s is None:
        return Advice(None, interval_s, mtbf, rate.faults, redone, None, None, None,
                      why="no checkpoint cost measured: time saves with progress.checkpoint(...)")
    if mtbf is None:
        return Advice(cost_s, interval_s, None, rate.faults, redone, None, None, None,
                      why=f"too little data: {rate.faults} fault(s) over {rate.seconds:.0f} s seen, {MIN_FAULTS} "
                          "needed (or give --mtbf)")
    step_s = step_seconds(record)
    advised = max(young_daly_s(cost_s, mtbf), step_s or 0.0)  # no job saves more often than once a step
    loss_advised = expected_loss_s(advised, cost_s, own.seconds, own.faults) if advised > 0 else None
    loss_used = expected_loss_s(interval_s, cost_s, own.seconds, own.faults) if interval_s else None
    return Advice(cost_s, interval_s, mtbf, rate.faults, redone, advised, loss_used, loss_advised, step_s=step_s)


def seconds_text(value: float, whole_from: float = 10.0) -> str:
    """Whole seconds from `whole_from` up, else two significant digits: a save of 0.0002 s and an advised
    interval of 0.44 s (a toy job's) are not "0 s"."""
    if value >= whole_from:
        return f"{value:.0f} s" if whole_from >= 1 else f"{value:.1f} s"
    return f"{value:.2g} s"


def _one_step(advice: Advice) -> bool:
    """The advised interval is the one-step floor, not Young-Daly's (a save that costs next to nothing)."""
    return advice.step_s is not None and advice.advised_s == advice.step_s and advice.cost_s is not None and \
        advice.mtbf_s is not None and young_daly_s(advice.cost_s, advice.mtbf_s) < advice.step_s


def facts(advice: Advice) -> list[tuple[str, str]]:
    """The advice as (what, value) rows: the report's table, the summary's line."""
    if advice.why:
        return [("checkpoint advice", advice.why)]
    used = seconds_text(advice.interval_s) if advice.interval_s else "unknown (fewer than 2 saves seen)"
    rows = [("checkpoint cost", seconds_text(advice.cost_s or 0.0, whole_from=0.1)), ("interval used", used),
            ("steps redone", f"{advice.redone_steps}"),
            ("mean time between faults", f"{advice.mtbf_s:.0f} s" + (f" ({advice.faults} faults)" if advice.faults else
                                                                      " (given)")),
            ("Young-Daly interval", seconds_text(advice.advised_s or 0.0)
             + (" (one step: no job saves more often)" if _one_step(advice) else ""))]
    if advice.loss_used_s is not None and advice.loss_advised_s is not None:
        rows.append(("expected loss", f"{seconds_text(advice.loss_used_s)} at the interval used, "
                                      f"{seconds_text(advice.loss_advised_s)} at the advised one"))
    if advice.too_rare:
        rows.append(("verdict", "checkpoints too rare for this fault rate"))
    return rows


def summary(advice: Advice) -> str:
    """The advice in one line: `launcher status`'s `checkpts` line, and describe()'s."""
    return ", ".join(value if what in ("checkpoint advice", "verdict") else f"{what} {value}"
                     for what, value in facts(advice))


def describe(advice: Advice) -> str:
    """The end-of-run summary's line."""
    return f"checkpoint advice: {summary(advice)}"


def as_json(advice: Advice) -> dict[str, Any]:
    """The advice's numbers (None where the data does not allow one; `why` says what is missing) and its
    verdict: `launcher status -o json`'s `checkpoint_advice`."""
    return {**dataclasses.asdict(advice), "too_rare": advice.too_rare}
