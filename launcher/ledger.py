"""The goodput ledger: where a run's wall time went. Every instant from the run's creation to its end
(or now) is given exactly one cause, so the causes add up to the wall time by construction.

It folds what the run record already holds: the journal's events (launcher/journal.py) and each
attempt's progress facts (first step and its time, newest step and its time, the step it resumed
from; launcher/healing.py keeps them). Pure: no clock unless `now` is left out, no I/O.

The timeline is painted in this order, a later rule winning over an earlier one:

1. provisioning: the default, what the launcher does outside an attempt (starting a local cluster,
   replacing or draining a node, preparing the next attempt).
2. startup: from an attempt's submission to its end; what rule 3 paints over leaves submit to first
   step (Ray's PENDING, runtime env, the job's own start and checkpoint load).
3. productive: from an attempt's first step to its newest (to now, while it runs and nothing is
   decided against it).
4. redone: from a resumed attempt's first step, the steps up to the last step made before the
   fault (the newest step of the attempts before it) less the step it resumed from
   (`steps_lost`), at that attempt's own pace.
5. stopping (teardown): from the last attempt's end to the run's end, once it ended.
6. detecting: from the attempt's newest step or the fault (whichever is earlier) to the decision (the
   `health.fault` event); for an attempt that failed by itself, from its newest step to its end.
7. stopping: from the fault's decision, or from the stop sent (`attempt.stopping`; from the attempt's
   newest step if earlier), to the attempt's end; from the newest step of an attempt that succeeded to
   its end (the job winding down).
8. backoff: from `retry.scheduled` for its `delay`, cut at the next submission.
9. queued: from `run.queued` to the next `run.admitted` (or the run's end, or now): the run waited in its
   platform's queue. On KubeRay under Kueue the follower (launcher/backends/kuberay/follow.py) says both, for the
   RayJob created suspended and for the wait after a preemption until it is admitted again; KubeRay's cluster
   start after the admission stays provisioning. The local and existing backends have no queue event (a job
   that Ray holds PENDING for resources waits in startup).
10. lost to the end: for a run that failed (any end but KEPT_ENDS), everything after its newest step.

11. checkpoint stall: not painted on the line but taken out of the productive time, where the saves
   fall (between steps): each attempt's saves (the most one rank made, as the watcher last saw them)
   times their newest cost (the slowest rank's), from the run record's checkpoint facts. An estimate:
   every save is taken to cost what the newest did.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from exporter.contract import wire
from launcher.state import AttemptRecord, EventRecord, RunRecord

CAUSES = wire.RUN_TIME_CAUSES
KEPT_ENDS = ("SUCCEEDED", "STOPPED")  # a run's ends that keep its last steps: nothing is lost to the end


def steps_lost(last_step: int | None, resumed_from: int | None, first_step: int | None) -> int | None:
    """The steps a fault cost: the last step made before it less the step the next attempt resumed
    from, which is the checkpoint step it was given (`resumed_from`), or, when it reported an earlier
    first step (it started over) or was given none (it resumed by itself), the step before its first.
    None when neither is known, or no step came before the fault."""
    if last_step is None:
        return None
    resumed = [step for step in (resumed_from, None if first_step is None else first_step - 1) if step is not None]
    return max(0, last_step - min(resumed)) if resumed else None


@dataclass(frozen=True)
class Ledger:
    """Seconds per cause (every name of CAUSES) over `wall` seconds."""

    seconds: dict[str, float]
    wall: float

    @property
    def ettr(self) -> float | None:
        """The effective training time ratio: productive seconds over the wall time."""
        return round(self.seconds["productive"] / self.wall, 4) if self.wall > 0 else None

    def line(self) -> str:
        """`181s: productive 79s (43.6%), redone 4.0s, ...`: the causes with time, in CAUSES' order."""
        shares = [f"{cause.replace('_', ' ')} {_seconds(seconds)}" + (f" ({100 * seconds / self.wall:.1f}%)"
                                                                     if cause == "productive" else "")
                  for cause, seconds in self.seconds.items() if seconds >= 0.05]
        return f"{_seconds(self.wall)}: " + (", ".join(shares) or "nothing yet")


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value < 10 else f"{value:,.0f}s"


class _Timeline:
    """Intervals painted with causes; a later paint wins. Breakpoints are few (tens per run)."""

    def __init__(self, start: float, end: float, cause: str) -> None:
        self.start, self.end = start, end
        self.pieces: list[tuple[float, float, str]] = [(start, end, cause)]

    def paint(self, start: float | None, end: float | None, cause: str) -> None:
        if start is None or end is None:
            return
        start, end = max(start, self.start), min(end, self.end)
        if end <= start:
            return
        kept: list[tuple[float, float, str]] = []
        for a, b, old in self.pieces:
            if a < start:
                kept.append((a, min(b, start), old))
            if b > end:
                kept.append((max(a, end), b, old))
        kept.append((start, end, cause))
        self.pieces = sorted(piece for piece in kept if piece[1] > piece[0])

    def totals(self) -> dict[str, float]:
        seconds = dict.fromkeys(CAUSES, 0.0)
        for a, b, cause in self.pieces:
            seconds[cause] += b - a
        return seconds


def _of(events: Iterable[EventRecord], kind: str, attempt: int) -> list[EventRecord]:
    return [event for event in events if event.kind == kind and event.attempt == attempt]


def _ended(record: RunRecord, item: AttemptRecord) -> float | None:
    """When the attempt ended; None while it runs."""
    finished = _of(record.events, "attempt.finished", item.attempt)
    return finished[-1].time if finished else item.ended_at


def _earliest(*moments: float | None) -> float | None:
    return min((moment for moment in moments if moment is not None), default=None)


def queue_waits(events: Iterable[EventRecord]) -> list[tuple[float, float | None]]:
    """The run's waits in its platform's queue, from `run.queued` to the next `run.admitted` (None: it waits
    still), in order."""
    waits: list[tuple[float, float | None]] = []
    for event in events:
        if event.kind == "run.queued" and (not waits or waits[-1][1] is not None):
            waits.append((event.time, None))
        elif event.kind == "run.admitted" and waits and waits[-1][1] is None:
            waits[-1] = (waits[-1][0], event.time)
    return waits


def _redone_until(record: RunRecord, item: AttemptRecord) -> float | None:
    """When a resumed attempt had made again the steps its predecessors had made (None: nothing redone)."""
    made = max((other.last_step for other in record.attempts
                if other.attempt < item.attempt and other.last_step is not None), default=None)
    lost = steps_lost(made, item.resumed_from_step, item.first_step)
    if not lost or item.first_step_at is None or item.last_progress_at is None or item.first_step is None:
        return None
    steps = (item.last_step or item.first_step) - item.first_step
    pace = (item.last_progress_at - item.first_step_at) / steps if steps > 0 else 0.0
    # The first step is made at first_step_at: the redone steps after it take `lost - 1` steps' time.
    return min(item.last_progress_at, item.first_step_at + (lost - 1) * pace)


def ledger(record: RunRecord, now: float | None = None, ending: str | None = None) -> Ledger:
    """Where the run's wall time went, from its creation to its end (or `now`, or the clock). `ending`:
    the final state of a run that ends at `now`, its `run.finished` not yet written."""
    end = record.finished_at or (now if now is not None else time.time())
    finished = record.finished_at is not None or ending is not None
    state = record.state if record.finished_at is not None else ending
    start = min(record.created_at, end)
    line = _Timeline(start, end, "provisioning")
    ended_at = {item.attempt: _ended(record, item) for item in record.attempts}
    ends = {number: end if at is None else at for number, at in ended_at.items()}
    for item in record.attempts:
        line.paint(item.submitted_at, ends[item.attempt], "startup")
        line.paint(item.first_step_at, item.last_progress_at, "productive")
        line.paint(item.first_step_at, _redone_until(record, item), "redone")
    if finished and record.attempts:
        line.paint(max(ends.values()), end, "stopping")  # teardown, unless a rule below says more
    for item in record.attempts:
        ended, newest = ends[item.attempt], item.last_progress_at
        faults = [event for event in _of(record.events, "health.fault", item.attempt)
                  if event.details.get("action") != "report"]
        stops = _of(record.events, "attempt.stopping", item.attempt)
        if faults:
            decided = faults[0].time
            line.paint(_earliest(faults[0].details.get("at"), newest, decided), decided, "detecting")
            line.paint(decided, ended, "stopping")
        elif stops:
            line.paint(_earliest(newest, stops[0].time), ended, "stopping")
        elif ended_at[item.attempt] is None and not finished:
            line.paint(newest, ended, "productive")  # it runs: the step in the making
        elif item.status == "SUCCEEDED":
            line.paint(newest, ended, "stopping")
        elif newest is not None:
            line.paint(newest, ended, "detecting")
    for event in record.events:
        if event.kind == "retry.scheduled" and event.attempt is not None:
            following = record.attempt(event.attempt + 1)
            until = event.time + float(event.details.get("delay") or 0)
            if following is not None and following.submitted_at is not None:
                until = min(until, following.submitted_at)
            line.paint(event.time, until, "backoff")
    for queued, admitted in queue_waits(record.events):
        line.paint(queued, end if admitted is None else admitted, "queued")
    progress = [item.last_progress_at for item in record.attempts if item.last_progress_at is not None]
    if finished and state not in KEPT_ENDS and progress:
        line.paint(max(progress), end, "lost_to_end")
    seconds = line.totals()
    # The ranks' saves, taken out of the productive time they fall in (between steps): the saves an attempt
    # made by the newest the watcher saw, each at its newest cost (its slowest rank's; launcher/checkpoint_advice.py).
    stall = sum(item.last_checkpoint[0] * item.checkpoint_seconds for item in record.attempts
                if item.last_checkpoint is not None and item.checkpoint_seconds is not None)
    moved = min(stall, seconds["productive"])
    seconds["productive"] -= moved
    seconds["checkpoint_stall"] += moved
    return Ledger(seconds, end - start)
