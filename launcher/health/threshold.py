"""The hang threshold in force for a run (health.adaptive_hang): learned from what the watcher sees of
the job, so that a job whose steps take 0.2 s is judged hung in about a minute, not the alert rule's
15, and an RL generation that always takes 20 minutes is not judged hung at 15.

Steps: at each check, the seconds since the previous check's newest report divided by the reports made
in between (the digest's `reports`) is one interval. A check every 10 s averages the intervals of a
fast job, which does not matter: an interval moves the threshold above the floor only past FLOOR_S / K
(6 s), and intervals that long the checks see one by one. The threshold is K times the p99 of the
newest KEEP intervals, at least FLOOR_S and at most health.hang_after_seconds, and only once
MIN_INTERVALS were seen (before, hang_after_seconds: a job that reports nothing learned stays as safe
as before).

Why these numbers: K = 10 leaves room for a step ten times the usual p99 (a slow batch, a garbage
collection, a checkpoint save between two reports); FLOOR_S = 60 s stays above a minute of anything a
job does without saying (a save, an evaluation) while keeping the issue's bound (a hang judged within 2
minutes of the last step, with 10 s checks); MIN_INTERVALS = 20 checks that advanced is over three
minutes of a running job, long enough for its first steps (compilation, warm-up) to be in the sample
and not alone.

RL phases (`progress.phase(name)`): while a phase runs, its start counts as progress, and the job is
hung when the phase has run for K times the longest of its durations seen (the phase's seconds in an
iteration), at least FLOOR_S, at most hang_after_seconds unless the phase usually takes more than half
of that: then twice its longest. A phase seen fewer than PHASE_MIN_SEEN times is judged by
hang_after_seconds. A weight sync that takes 5 s is stuck after a minute; a 20-minute generation is
normal for up to 40 minutes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.contract.digest import MAX_PHASES, JobDigest
from launcher.health.policy import HealthPolicy

K = 10.0
FLOOR_S = 60.0
MIN_INTERVALS = 20
KEEP = 256  # the newest intervals: bounded memory, and a job whose steps slow down is followed
PHASE_MIN_SEEN = 3
PHASE_SLACK = 2.0  # a phase longer than half the ceiling may run for twice its longest


@dataclass(frozen=True)
class Threshold:
    """The hang threshold in force and why, for the journal, `launcher status` and the run's gauge."""

    seconds: float
    rule: str  # "fixed", "steps" or "phase"
    basis: str  # what a person reads: "10 x p99 report interval 0.21 s (312 seen), floor 60 s"
    phase: str | None = None

    def evidence(self) -> dict[str, object]:
        return {"threshold": round(self.seconds, 1), "threshold_rule": self.rule, "threshold_basis": self.basis,
                **({"phase": self.phase} if self.phase else {})}


@dataclass
class _Phase:
    seen: int = 0
    longest: float = 0.0


class HangLearner:
    """What a run taught the watcher about its pace: the intervals between its reports (over every
    attempt, each attempt's restart left out) and the durations of its RL phases."""

    def __init__(self) -> None:
        self._intervals: deque[float] = deque(maxlen=KEEP)
        self._phases: dict[str, _Phase] = {}
        self._last: tuple[float, float] | None = None  # the attempt's (reports, newest report) at the last check
        self._iteration: int | None = None  # the newest step (RL iteration) when phase durations were taken

    def new_attempt(self) -> None:
        self._last, self._iteration = None, None

    def observe(self, jobs: Iterable[JobDigest], newest_report: float | None, newest_step: int | None) -> None:
        """One check's view of the attempt (its digests over the nodes read)."""
        jobs = list(jobs)
        reports = max((job.reports for job in jobs if job.reports is not None), default=None)
        if reports is not None and newest_report is not None:
            if self._last is not None:
                made, elapsed = reports - self._last[0], newest_report - self._last[1]
                if made > 0 and elapsed > 0:
                    self._intervals.append(elapsed / made)
            self._last = (reports, newest_report)  # a count that went back (an exporter restarted) starts afresh
        if newest_step is not None and newest_step != self._iteration:
            if self._iteration is not None:  # an iteration ended since: its phases' seconds are news
                for name, seconds in _phase_seconds(jobs).items():
                    phase = self._phases.get(name)
                    if phase is None and len(self._phases) < MAX_PHASES:
                        phase = self._phases[name] = _Phase()
                    if phase is not None:
                        phase.seen += 1
                        phase.longest = max(phase.longest, seconds)
            self._iteration = newest_step

    def steps(self, policy: HealthPolicy) -> Threshold:
        """The threshold between reports, when no phase runs."""
        ceiling = policy.hang_after_seconds
        if not policy.adaptive_hang:
            return Threshold(ceiling, "fixed", "health.hang_after_seconds, adaptive_hang is off")
        if len(self._intervals) < MIN_INTERVALS:
            return Threshold(ceiling, "fixed", f"health.hang_after_seconds until {MIN_INTERVALS} report intervals "
                             f"are seen, {len(self._intervals)} so far")
        p99 = _quantile(self._intervals, 0.99)
        seconds = min(max(K * p99, FLOOR_S), ceiling)
        return Threshold(seconds, "steps", f"{K:g} x p99 report interval {p99:.2f} s ({len(self._intervals)} "
                         f"seen), floor {FLOOR_S:g} s, ceiling {ceiling:g} s")

    def phase(self, policy: HealthPolicy, name: str) -> Threshold:
        """The threshold while the phase runs."""
        ceiling = policy.hang_after_seconds
        phase = self._phases.get(name)
        if not policy.adaptive_hang or phase is None or phase.seen < PHASE_MIN_SEEN:
            seen = phase.seen if phase is not None else 0
            why = ", adaptive_hang is off" if not policy.adaptive_hang else \
                f" until the phase is seen {PHASE_MIN_SEEN} times, {seen} so far"
            return Threshold(ceiling, "fixed", f"health.hang_after_seconds{why}", name)
        top = max(ceiling, PHASE_SLACK * phase.longest)
        seconds = min(max(K * phase.longest, FLOOR_S), top)
        return Threshold(seconds, "phase", f"phase {name}: {K:g} x its longest {phase.longest:.1f} s ({phase.seen} "
                         f"seen), floor {FLOOR_S:g} s, ceiling {top:g} s", name)

    def learned(self, policy: HealthPolicy) -> list[Threshold]:
        """The threshold between reports and each phase's learned, as they stand."""
        phases = (self.phase(policy, name) for name in sorted(self._phases))
        return [self.steps(policy), *(threshold for threshold in phases if threshold.rule == "phase")]

    def in_force(self, policy: HealthPolicy, running: Mapping[str, float]) -> Threshold:
        """The threshold now: the most generous of the phases running, else the one between reports."""
        if not running:
            return self.steps(policy)
        return max((self.phase(policy, name) for name in running), key=lambda threshold: threshold.seconds)


def running_phases(jobs: Iterable[JobDigest], since: float) -> dict[str, float]:
    """Phase -> its oldest start over the nodes, for the phases running that began at or after `since`."""
    running: dict[str, float] = {}
    for job in jobs:
        for name, (started, _) in job.phases.items():
            if started is not None and started >= since:
                running[name] = min(running.get(name, started), started)
    return running


def _phase_seconds(jobs: Iterable[JobDigest]) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for job in jobs:
        for name, (_, last) in job.phases.items():
            if last is not None:
                seconds[name] = max(seconds.get(name, last), last)
    return seconds


def _quantile(values: Iterable[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
