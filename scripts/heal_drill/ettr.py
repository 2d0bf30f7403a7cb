"""The effective training time ratio (ETTR) of a run, from what the run itself recorded: the progress
its ranks reported (each step with the time they reported it), its checkpoints and the steps each
attempt resumed from. Used by the healing soak (`make heal-soak`, docs/healing-drill.md).

    ETTR = time making progress that was kept / wall time after the first step

Wall time runs from the run's first step (the first step attempt 1 reported) to the end of the window
(the soak's stop request, else the run's end). Progress that was kept: the steps no rollback threw
away. Walking back from the last attempt, attempt n keeps every step it made; the steps up to its
resume point (the checkpoint step it was told to resume from, else the step before its first) are
the ones it kept from earlier attempts, so attempt n-1 keeps its steps up to that point, and so on;
steps an attempt made past the resume point of the attempt after it were redone, so lost. An
attempt's kept time is the time from its first step to its last kept step (on the time line its
ranks reported), plus one step's time for its first step (its own work; for attempt 1 that step is
before the window). Everything else is lost: each recovery's lost seconds are the gap between the last
kept progress before it and the first kept progress after it (the redone steps' time, then the time
with no progress at all: detection, stopping, replacing a node, the backoff, the new attempt's start),
and the tail after the last step. Kept + lost = wall time exactly. A checkpoint's save counts as
training time (a cost of checkpointing, not of healing).

Where the step times come from: the run's recording (`metrics.jsonl.gz`, a round every
`record_interval` seconds, one when an attempt starts and one when it ends) holds, per attempt
(submission id) and rank, the step with the time of its report, the attempt's first step with its
time and the newest checkpoint step with its time; the run record (`run.json`) has each attempt's
first and newest step with their times and the step it resumed from. Between two known (step, time)
points an attempt's steps are placed linearly: its ranks step at a steady pace.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from launcher import recording
from launcher.state import AttemptRecord, EventRecord, RunRecord

Point = tuple[int, float]  # (step, unix time its report was made)

# (the step family, the family with that step's time) in the recording, per attempt and rank
STEP_TIME_FAMILIES = (
    ("raypulse_train_step", "raypulse_train_last_progress_time_seconds"),
    ("raypulse_train_first_step", "raypulse_train_first_progress_time_seconds"),
    ("raypulse_train_checkpoint_step", "raypulse_train_last_checkpoint_time_seconds"),
)


@dataclass
class Timeline:
    """One attempt's steps on the time line its ranks reported."""

    points: list[Point]  # by step, times non-decreasing

    @classmethod
    def of(cls, points: Iterable[Point]) -> Timeline:
        earliest: dict[int, float] = {}
        for step, at in points:
            if math.isfinite(at) and at > 0:
                earliest[int(step)] = min(at, earliest.get(int(step), at))
        kept: list[Point] = []
        for step, at in sorted(earliest.items(), key=lambda point: (point[1], point[0])):
            if not kept or step > kept[-1][0]:  # a step reported after a later one (a late report) is left out
                kept.append((step, at))
        return cls(kept)

    @property
    def first(self) -> Point:
        return self.points[0]

    @property
    def last(self) -> Point:
        return self.points[-1]

    def time_of(self, step: float) -> float:
        """When the attempt made `step` (linear between known points, clamped to its first and last)."""
        steps = [point[0] for point in self.points]
        if step <= steps[0]:
            return self.points[0][1]
        if step >= steps[-1]:
            return self.points[-1][1]
        index = bisect.bisect_left(steps, step)
        (s0, t0), (s1, t1) = self.points[index - 1], self.points[index]
        return t0 + (t1 - t0) * (step - s0) / (s1 - s0)

    def step_at(self, at: float) -> float:
        """The step the attempt had reached at `at` (the inverse of time_of, for cutting at the window's end)."""
        times = [point[1] for point in self.points]
        if at <= times[0]:
            return self.points[0][0]
        if at >= times[-1]:
            return self.points[-1][0]
        index = bisect.bisect_left(times, at)
        (s0, t0), (s1, t1) = self.points[index - 1], self.points[index]
        return s0 + (s1 - s0) * (at - t0) / (t1 - t0) if t1 > t0 else s1

    def step_seconds(self) -> float | None:
        (s0, t0), (s1, t1) = self.first, self.last
        return (t1 - t0) / (s1 - s0) if s1 > s0 else None


@dataclass
class Kept:
    """The progress one attempt made that was kept."""

    attempt: int
    first_step: int
    last_step: int  # the last kept step (may be past a checkpoint: the last attempt keeps all)
    start: float  # when its first kept step's work began (attempt 1: the first step's report)
    end: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class Recovery:
    """What ending attempt `attempt` cost, until `next_attempt` made its first step."""

    attempt: int
    next_attempt: int | None
    fault: str | None  # the watcher's fault class (health.fault), None when it failed on its own
    summary: str | None
    detected_at: float | None  # the health.fault event
    ended_at: float | None  # Ray's end of the attempt
    next_first_step_at: float | None
    last_step: int | None  # the attempt's last step
    last_step_at: float | None
    resumed_from: int | None  # the step the next attempt resumed from
    steps_lost: int | None
    redone_seconds: float  # the lost steps' time: from the resume point to the last step
    down_seconds: float  # no progress at all: from the last step to the next attempt's first step's work
    backoff_seconds: float | None  # retry.scheduled's delay, part of down_seconds
    node_action: str | None  # node.replaced / node.retired and how long it took
    next_submitted_at: float | None = None  # the next attempt's submission (after the node action and the backoff)
    said: dict[str, float] | None = None  # what the launcher's health.recovered said: steps_lost, recover_seconds, ...

    @property
    def seconds_lost(self) -> float:
        return self.redone_seconds + self.down_seconds


@dataclass
class Accounting:
    start: float  # the run's first step
    end: float  # the end of the window
    kept: list[Kept] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    step_seconds: float | None = None  # the run's pace (median over its attempts)

    @property
    def wall_seconds(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def kept_seconds(self) -> float:
        return sum(item.seconds for item in self.kept)

    @property
    def tail_seconds(self) -> float:
        return max(0.0, self.end - self.kept[-1].end) if self.kept else self.wall_seconds

    @property
    def ettr(self) -> float | None:
        return self.kept_seconds / self.wall_seconds if self.wall_seconds > 0 else None


def resume_point(record: RunRecord, item: AttemptRecord, timeline: Timeline | None) -> int | None:
    """The last step attempt `item` kept from earlier attempts: the checkpoint step it was told to resume
    from (the attempt record, else its run.resume event), else the step before its first."""
    if item.resumed_from_step is not None:
        return item.resumed_from_step
    told = next((event.details.get("step") for event in record.events
                 if event.kind == "run.resume" and event.attempt == item.attempt), None)
    if told is not None:
        return int(told)
    return timeline.first[0] - 1 if timeline is not None else None


def account(record: RunRecord, timelines: dict[int, Timeline], end: float) -> Accounting:
    """The run's kept progress and what each recovery cost, attempt by attempt (see the module's doc)."""
    attempts = sorted((item for item in record.attempts if timelines.get(item.attempt)),
                      key=lambda item: item.attempt)
    if not attempts:
        raise ValueError(f"run {record.run_id}: no attempt reported a step; there is no progress to account for")
    paces = sorted(pace for item in attempts if (pace := timelines[item.attempt].step_seconds()))
    pace = paces[len(paces) // 2] if paces else 0.0
    start = timelines[attempts[0].attempt].first[1]
    result = Accounting(start, end, step_seconds=pace or None)

    bound: float = math.inf  # steps up to this one are still to be kept from earlier attempts
    kept: list[Kept] = []
    for item in reversed(attempts):
        line = timelines[item.attempt]
        first = line.first[0]
        last = min(line.last[0], bound)
        if line.first[1] < end and last >= first:
            if line.last[1] > end:  # cut at the window's end
                last = min(last, int(line.step_at(end)))
            own = line.step_seconds() or pace
            begin = line.first[1] if item is attempts[0] else line.first[1] - own
            kept.append(Kept(item.attempt, first, int(last), begin, min(line.time_of(last), end)))
        resumed = resume_point(record, item, line)
        bound = min(bound, resumed) if resumed is not None else bound
    result.kept = sorted(kept, key=lambda item: item.attempt)

    by_attempt = {item.attempt: item for item in result.kept}
    for index, item in enumerate(attempts[:-1]):
        following = attempts[index + 1]
        line = timelines[item.attempt]
        resumed = resume_point(record, following, timelines[following.attempt])
        kept_before = [span for span in result.kept if span.attempt <= item.attempt]
        gap_from = max((span.end for span in kept_before), default=start)
        gap_to = by_attempt[following.attempt].start if following.attempt in by_attempt else end
        last_step, last_at = line.last
        cut = line.time_of(resumed) if resumed is not None else last_at
        redone = max(0.0, last_at - max(cut, gap_from)) if resumed is not None and resumed < last_step else 0.0
        fault = _fault_of(record.events, item.attempt)
        result.recoveries.append(Recovery(
            attempt=item.attempt, next_attempt=following.attempt,
            fault=fault.details.get("fault") if fault else None,
            summary=fault.details.get("summary") if fault else None,
            detected_at=fault.time if fault else None, ended_at=item.ended_at,
            next_first_step_at=timelines[following.attempt].first[1], last_step=last_step, last_step_at=last_at,
            resumed_from=resumed, steps_lost=max(0, last_step - resumed) if resumed is not None else None,
            redone_seconds=redone, down_seconds=max(0.0, gap_to - gap_from - redone),
            backoff_seconds=_backoff(record.events, item.attempt),
            node_action=_node_action(record.events, item.attempt), next_submitted_at=following.submitted_at,
            said=_recovered(record.events, following.attempt)))
    return result


def _fault_of(events: list[EventRecord], attempt: int) -> EventRecord | None:
    return next((event for event in events if event.kind == "health.fault" and event.attempt == attempt
                 and event.details.get("action") != "report"), None)


def _recovered(events: list[EventRecord], attempt: int) -> dict[str, float] | None:
    """What the launcher said the recovery took (its health.recovered event at `attempt`'s first step)."""
    event = next((event for event in events if event.kind == "health.recovered" and event.attempt == attempt), None)
    if event is None:
        return None
    return {key: event.details[key] for key in ("detect_seconds", "recover_seconds", "steps_lost")
            if isinstance(event.details.get(key), int | float)}


def _backoff(events: list[EventRecord], attempt: int) -> float | None:
    return next((float(event.details["delay"]) for event in events
                 if event.kind == "retry.scheduled" and event.attempt == attempt and "delay" in event.details), None)


def _node_action(events: list[EventRecord], attempt: int) -> str | None:
    """The node event between attempt `attempt`'s end and the next attempt's submission."""
    finished = next((event.time for event in events if event.kind == "attempt.finished" and event.attempt == attempt),
                    None)
    if finished is None:
        return None
    for event in events:
        if event.time < finished:
            continue
        if event.kind == "attempt.submitting":
            return None
        if event.kind.startswith("node."):
            node, seconds = event.details.get("node"), event.details.get("seconds")
            what = event.kind.removeprefix("node.")
            return f"{node} {what}" + (f" in {seconds:g} s" if isinstance(seconds, int | float) else "")
    return None


def window_end(record: RunRecord) -> float:
    """The end of the run's window: when it was asked to stop (the soak's end), else when it ended."""
    stopped = next((event.time for event in record.events
                    if event.kind == "attempt.stopping" and event.details.get("reason") == "STOPPED"), None)
    if stopped is not None:
        return stopped
    if record.finished_at is not None:
        return record.finished_at
    raise ValueError(f"run {record.run_id} has not ended; its window has no end yet")


def timelines(record: RunRecord, recorded: recording.Recording | None) -> dict[int, Timeline]:
    """Each attempt's (step, time) points: the recording's, and the run record's first and newest step."""
    attempt_of = {item.submission_id: item.attempt for item in record.attempts}
    points: dict[int, list[Point]] = defaultdict(list)
    for item in record.attempts:
        for step, at in ((item.first_step, item.first_step_at), (item.last_step, item.last_progress_at)):
            if step is not None and at is not None:
                points[item.attempt].append((step, at))
    if recorded is not None:
        for step_name, time_name in STEP_TIME_FAMILIES:
            times = {_identity(series.labels): series for series in recorded.select(time_name)}
            for series in recorded.select(step_name):
                attempt = attempt_of.get(series.labels.get("submission_id", ""))
                paired = times.get(_identity(series.labels))
                if attempt is None or paired is None:
                    continue
                at_round = dict(zip(paired.times, paired.values, strict=True))
                for round_at, step in zip(series.times, series.values, strict=True):
                    at = at_round.get(round_at)
                    if at is not None and math.isfinite(step):
                        points[attempt].append((int(step), at))
    return {attempt: Timeline.of(found) for attempt, found in points.items() if found}


def _identity(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def of_run(run_dir: Path) -> tuple[RunRecord, Accounting]:
    """A finished run's accounting, from its directory ($RAYPULSE_HOME/runs/<run>)."""
    record = RunRecord.model_validate_json((run_dir / "run.json").read_text())
    try:
        recorded = recording.read(run_dir)
    except FileNotFoundError:
        recorded = None
    return record, account(record, timelines(record, recorded), window_end(record))
