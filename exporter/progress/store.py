"""Training progress reported by `exporter.progress`: the wire format, its validation, and the
bounded state the `train` collector exports.

A request is `{"reports": [report, ...]}`; a report is

    {"kind": "progress" | "checkpoint", "job_id": "02000000" | null, "submission_id": "..." | null,
     "rank": 0, "time": 1767225600.5, "step": 1200, "loss": 2.31 | "NaN" | "Infinity" | null,
     "grad_norm": ..., "learning_rate": ..., "samples_total": 76800, "tokens_total": null,
     "dropped_total": 0, "duration_seconds": 4.2 | null, "checkpoints_total": 7 | null}

(`duration_seconds`: for a checkpoint, how long its save took; `checkpoints_total`: the rank's saves so far,
so that a checkpoint report lost on the way is made up by the next; without it each report counts one.)
An RL post-training loop
(`progress.phase`, `progress.report_iteration`) sends kind "rl", whose fields are all optional:

    {"kind": "rl", "job_id": ..., "submission_id": ..., "rank": 0, "time": ..., "dropped_total": 0,
     "iteration": 12, "iterations_total": 13,
     "phases": {"generate": {"seconds_total": 812.4, "iteration_seconds": 81.2, "running_since": null},
                "train": {"seconds_total": 300.1, "iteration_seconds": 30.0, "running_since": 1767225600.5}},
     "rollouts_total": 4096, "generated_tokens_total": 2097152,
     "reward_mean": 0.41 | "NaN", "reward_std": 0.2, "rewards": {"format": 0.9, "correctness": 0.3},
     "kl": 0.012 | "NaN", "entropy": 1.7 | "NaN", "response_length_mean": 512.0, "response_length_max": 2048,
     "response_length_limit": 2048, "truncated_ratio": 0.04, "weight_sync_seconds": 3.1,
     "weight_sync_bytes": 15032385536}

`phases` is the rank's whole set of phases (at most wire.RL_MAX_PHASES) with running totals,
the seconds of the last completed iteration and, while one runs, its start; `rewards` the last
iteration's reward mean by source (at most wire.RL_MAX_SOURCES). Each replaces what the rank had.
The launcher's health watcher also
reports how its run heals, with kind "run": {"kind": "run", "run_id": "...", "time": ..., "fault":
"hang", "detect_seconds": 31.5, "recover_seconds": 52.0, "steps_lost": 3} for a recovery, and
{"kind": "run", "run_id": "...", "time": ..., "effective_training_ratio": 0.93, "hang_threshold_seconds": 60.0}
as the run goes. An RL run tells the head exporter where its rollout servers serve their engine's own
/metrics (exporter/progress/rollout.py), for its wire.ROLLOUT_SD_PATH (held in rollout_targets.py):

    {"kind": "rollout", "job_id": ..., "submission_id": ..., "time": ..., "rollout": "vllm",
     "servers": ["10.0.0.5:40123", "[fd00::7]:40125"]}

A report names its job by its submission id or, without one, by its Ray job id: a job id beside a
submission id is dropped (the token proves the submission only; Ray says which job it is). Every
field is checked (unknown fields are refused by name); a batch is applied whole or not at all. One
global bound, the series the store holds (progress.max_series), caps its memory and the size of
/metrics; the jobs tracked at once, the ranks per job and one job's share of the series
(progress.max_job_share: one job cannot fill the store and keep the others out) are fairness limits
under it (429 beyond any of them). Jobs Ray says have ended, or does not know, are let go soon after their last
report (`doubtful`), first when room is needed; other ranks that stop reporting expire. A rank's RL
phases and reward sources count against progress.max_series like every other series. A NaN or
infinite loss (or grad norm, learning rate, RL reward mean, KL, entropy) is counted per rank and
leaves the last finite value in place: it shows up as a count, never as a hidden gap.

States are copied on write: the train collector turns a snapshot of the store into series off the
event loop while the endpoint keeps applying reports on it.
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, StringConstraints, ValidationError

from exporter.config import ProgressSettings
from exporter.contract import strict, wire
from exporter.contract.strict import Strict
from exporter.progress.rollout_targets import JobKey, RolloutTargets, TooManyTargets

FLOAT_FIELDS = ("loss", "grad_norm", "learning_rate")
RL_NONFINITE_FIELDS = ("reward_mean", "kl", "entropy")  # NaN/Infinity accepted and counted, like the loss
RL_VALUE_FIELDS = (*RL_NONFINITE_FIELDS, "reward_std", "response_length_mean", "response_length_max",
                   "response_length_limit", "truncated_ratio", "weight_sync_seconds", "weight_sync_bytes")
RL_FIELDS = ("iteration", "iterations_total", "phases", "rollouts_total", "generated_tokens_total", "rewards",
             *RL_VALUE_FIELDS)
ROLLOUT_FIELDS = ("rollout", "servers")
REJECT_REASONS = ("invalid", "unauthorized", "too_large", "unsupported_media_type", "too_many_jobs",
                  "too_many_ranks", "too_many_job_series", "too_many_series", "too_many_rollout_servers")
# Series each holds in /metrics (exporter/collectors/ray/train.py): a rank's 15 gauges and counters and
# its 3 non-finite counts; a job's rank count; a run's 5 gauges and a recovery count per fault class.
SERIES_PER_RANK = 18
SERIES_PER_JOB = 1
SERIES_PER_RUN = 5 + len(wire.FAULT_CLASSES)
# A rank that reports RL adds 15 raypulse_rl_* series and 3 non-finite counts, 3 per phase, 1 per reward source.
SERIES_PER_RL_RANK = 15 + len(RL_NONFINITE_FIELDS)
SERIES_PER_PHASE = 3
SERIES_PER_SOURCE = 1
MAX_REPORTS_PER_REQUEST = 256
_MAX_COUNT = 2**53  # exactly representable in a float sample
_CLOCK_SKEW_SECONDS = 600.0
_NONFINITE = {"nan": math.nan, "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf,
              "inf": math.inf, "-inf": -math.inf}


def _metric_value(value: Any) -> Any:
    """Numbers as they are; non-finite values also as the strings JSON needs for them."""
    if isinstance(value, bool):
        raise ValueError("a number is required, not a boolean")
    if isinstance(value, str):
        try:
            return _NONFINITE[value.strip().lower()]
        except KeyError:
            raise ValueError('a number, or "NaN", "Infinity", "-Infinity"') from None
    return value


MetricValue = Annotated[float | None, BeforeValidator(_metric_value)]
Count = Annotated[int, Field(ge=0, lt=_MAX_COUNT, strict=True)]
Name = Annotated[str, StringConstraints(pattern=wire.RL_NAME_PATTERN)]
Seconds = Annotated[float, Field(ge=0, lt=_MAX_COUNT, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


_TARGET = re.compile(wire.TARGET_PATTERN)


def _target(value: str) -> str:
    if not _TARGET.fullmatch(value):
        raise ValueError("a server is host:port (10.0.0.5:8000, [fd00::7]:8000), where it serves /metrics")
    if int(value.rpartition(":")[2]) > 65535:
        raise ValueError("the port is over 65535")
    return value


Target = Annotated[str, StringConstraints(max_length=262), AfterValidator(_target)]


# The models are built when the first report is parsed (defer_build): a node that is never sent a report
# does not hold their validators and compiled patterns (0.77 MB of Python objects; measured 0.2 MB of RSS).
class Phase(Strict):
    """One named phase of a rank's RL iterations."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    seconds_total: Seconds
    iteration_seconds: Seconds | None = None  # in the last completed iteration
    running_since: float | None = Field(None, gt=0, allow_inf_nan=False)  # unix time, while it runs


class Report(Strict):
    model_config = ConfigDict(frozen=True, defer_build=True)

    kind: Literal["progress", "checkpoint", "run", "rl", "rollout"]
    job_id: str | None = Field(None, pattern=r"^[0-9a-f]{2,64}$", description="Ray job id (hex)")
    submission_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}$")
    rank: int = Field(0, ge=0, le=1_000_000, strict=True)
    time: float = Field(..., gt=0, allow_inf_nan=False, strict=True)
    step: Count | None = None
    loss: MetricValue = None
    grad_norm: MetricValue = None
    learning_rate: MetricValue = None
    samples_total: Count | None = None
    tokens_total: Count | None = None
    dropped_total: Count = 0
    duration_seconds: float | None = Field(None, ge=0, le=7 * 86400, allow_inf_nan=False)
    checkpoints_total: Count | None = None  # kind "checkpoint": the rank's saves so far
    run_id: str | None = Field(None, pattern=r"^[a-z]([-a-z0-9]{0,46}[a-z0-9])?$", description="a launcher run")
    fault: Literal[wire.FAULT_CLASSES] | None = None  # type: ignore[valid-type]
    detect_seconds: float | None = Field(None, ge=0, le=30 * 86400, allow_inf_nan=False)
    recover_seconds: float | None = Field(None, ge=0, le=30 * 86400, allow_inf_nan=False)
    steps_lost: Count | None = None
    effective_training_ratio: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    hang_threshold_seconds: float | None = Field(None, gt=0, le=30 * 86400, allow_inf_nan=False)
    checkpoint_interval_seconds: float | None = Field(None, gt=0, le=30 * 86400, allow_inf_nan=False)
    checkpoint_advised_interval_seconds: float | None = Field(None, gt=0, le=30 * 86400, allow_inf_nan=False)
    # where the run's wall time went so far, by cause (launcher/ledger.py)
    time_seconds: dict[Literal[wire.RUN_TIME_CAUSES], Seconds] | None = None  # type: ignore[valid-type]
    # kind "rl" only
    iteration: Count | None = None
    iterations_total: Count | None = None
    phases: dict[Name, Phase] | None = Field(None, max_length=wire.RL_MAX_PHASES)
    rollouts_total: Count | None = None
    generated_tokens_total: Count | None = None
    reward_mean: MetricValue = None
    reward_std: Finite | None = Field(None, ge=0)
    rewards: dict[Name, Finite] | None = Field(None, max_length=wire.RL_MAX_SOURCES)
    kl: MetricValue = None
    entropy: MetricValue = None
    response_length_mean: Finite | None = Field(None, ge=0)
    response_length_max: Finite | None = Field(None, ge=0)
    response_length_limit: Finite | None = Field(None, ge=0)
    truncated_ratio: Finite | None = Field(None, ge=0, le=1)
    weight_sync_seconds: Seconds | None = None
    weight_sync_bytes: Finite | None = Field(None, ge=0)
    # kind "rollout" only: an RL run's rollout servers (host:port, serving their engine's /metrics) and the engine
    rollout: str | None = Field(None, pattern=wire.ROLLOUT_NAME_PATTERN)
    servers: list[Target] | None = Field(None, min_length=1, max_length=wire.ROLLOUT_MAX_SERVERS_PER_REPORT)


class Batch(Strict):
    model_config = ConfigDict(defer_build=True)

    reports: list[Report] = Field(..., min_length=1, max_length=MAX_REPORTS_PER_REQUEST)


class Rejected(Exception):
    """A request the endpoint refuses; `status` is the HTTP status, `reason` a bounded label value."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def parse_batch(data: Any) -> list[Report]:
    try:
        batch = Batch.model_validate(data)
    except ValidationError as exc:
        raise Rejected(400, "invalid", strict.summary(exc, "unknown field", whole="body")) from None
    now = time.time()
    for index, report in enumerate(batch.reports):
        if report.kind == "run" and report.run_id is None:
            raise Rejected(400, "invalid", f"reports[{index}]: run_id is required for kind run")
        if report.kind != "run" and report.job_id is None and report.submission_id is None:
            raise Rejected(400, "invalid", f"reports[{index}]: job_id or submission_id is required (who is "
                           "training?)")
        for kind, fields in (("rl", RL_FIELDS), ("rollout", ROLLOUT_FIELDS)):
            stray = next((name for name in fields if getattr(report, name) is not None), None)
            if report.kind != kind and stray is not None:
                raise Rejected(400, "invalid", f"reports[{index}].{stray}: only in reports of kind {kind}")
        missing = next((name for name in ROLLOUT_FIELDS if getattr(report, name) is None), None)
        if report.kind == "rollout" and missing is not None:
            raise Rejected(400, "invalid", f"reports[{index}].{missing}: required for kind rollout (the engine, "
                           "e.g. vllm, and its servers as host:port)")
        if abs(report.time - now) > _CLOCK_SKEW_SECONDS:
            raise Rejected(400, "invalid", f"reports[{index}].time: {report.time} is more than "
                           f"{_CLOCK_SKEW_SECONDS:g}s away from the exporter's clock ({now:.0f})")
    # A report with a submission id is that submission's (its token proves that much and no more): a
    # Ray job id beside it is only a claim, so it is dropped and the train collector takes the job id
    # from Ray's Jobs API, as it does for a report that names its submission alone.
    return [report.model_copy(update={"job_id": None}) if report.submission_id and report.job_id else report
            for report in batch.reports]


def take_values(report: Any, names: Iterable[str], values: dict[str, float], nonfinite: Counter[str]) -> None:
    """The report's finite values replace the held ones; a NaN or an infinity is counted, not kept."""
    for name in names:
        value = getattr(report, name)
        if value is None:
            continue
        if math.isfinite(value):
            values[name] = value
        else:
            nonfinite[name] += 1


@dataclass
class RLState:
    """What a rank's RL loop reported last: iteration, running totals, phases, rewards and the rest."""

    iteration: float | None = None
    iterations_total: float | None = None
    last_iteration_time: float | None = None
    rollouts_total: float | None = None
    generated_tokens_total: float | None = None
    values: dict[str, float] = field(default_factory=dict)  # RL_VALUE_FIELDS, last finite
    phases: Mapping[str, Phase] = field(default_factory=dict)
    rewards: Mapping[str, float] = field(default_factory=dict)

    @property
    def series(self) -> int:
        return (SERIES_PER_RL_RANK + SERIES_PER_PHASE * len(self.phases)
                + SERIES_PER_SOURCE * len(self.rewards))

    def apply(self, report: Report, nonfinite: Counter[str]) -> None:
        if report.iteration is not None:
            self.iteration = report.iteration
            self.last_iteration_time = max(self.last_iteration_time or 0.0, report.time)
        for name in ("iterations_total", "rollouts_total", "generated_tokens_total"):
            if getattr(report, name) is not None:
                setattr(self, name, getattr(report, name))
        if report.phases is not None:
            self.phases = dict(report.phases)
        if report.rewards is not None:
            self.rewards = dict(report.rewards)
        take_values(report, RL_VALUE_FIELDS, self.values, nonfinite)


@dataclass
class RankState:
    step: float | None = None
    samples_total: float | None = None
    tokens_total: float | None = None
    values: dict[str, float] = field(default_factory=dict)  # last finite loss, grad_norm, learning_rate
    nonfinite: Counter[str] = field(default_factory=Counter)
    reports: int = 0
    last_progress_time: float | None = None
    # The rank's first step in this job and when it was made: for an attempt of a launcher run (a job of
    # its own) the step it resumed at, which the launcher's recovery time and steps lost are measured by.
    first_step: float | None = None
    first_progress_time: float | None = None
    last_checkpoint_time: float | None = None
    checkpoint_step: float | None = None
    checkpoint_seconds: float | None = None  # how long the last checkpoint save took
    checkpoints: int = 0
    client_dropped: int = 0
    touched: float = 0.0  # the exporter's monotonic clock, for expiry
    rl: RLState | None = None  # once the rank reported kind "rl"

    @property
    def series(self) -> int:
        return SERIES_PER_RANK + (self.rl.series if self.rl is not None else 0)

    def applied(self, report: Report) -> RankState:
        """A new state with the report applied; this one is left as it was (readers may hold it)."""
        new = copy.copy(self)
        new.values, new.nonfinite = dict(self.values), Counter(self.nonfinite)
        if report.kind == "rl":
            new.rl = copy.copy(self.rl) if self.rl is not None else RLState()
            new.rl.values = dict(new.rl.values)
        new.apply(report)
        return new

    def apply(self, report: Report) -> None:
        self.reports += 1
        self.client_dropped = max(self.client_dropped, report.dropped_total)
        if report.kind == "rl":
            if self.rl is None:
                self.rl = RLState()
            self.rl.apply(report, self.nonfinite)
            return
        if report.kind == "checkpoint":
            # the client's own count when it sends one (a smaller one: the trainer restarted, as for the totals)
            self.checkpoints = report.checkpoints_total if report.checkpoints_total is not None else \
                self.checkpoints + 1
            self.last_checkpoint_time = max(self.last_checkpoint_time or 0.0, report.time)
            if report.step is not None:
                self.checkpoint_step = report.step
            if report.duration_seconds is not None:
                self.checkpoint_seconds = report.duration_seconds
            return
        self.last_progress_time = max(self.last_progress_time or 0.0, report.time)
        if report.step is not None:
            self.step = report.step
            if self.first_progress_time is None or report.time < self.first_progress_time:
                self.first_step, self.first_progress_time = report.step, report.time
        # Totals only grow within one process; a smaller one means the trainer restarted (a counter reset).
        if report.samples_total is not None:
            self.samples_total = report.samples_total
        if report.tokens_total is not None:
            self.tokens_total = report.tokens_total
        take_values(report, FLOAT_FIELDS, self.values, self.nonfinite)


@dataclass
class RunHealth:
    """How a launcher run heals, as its watcher reports it."""

    recoveries: Counter[str] = field(default_factory=Counter)  # by fault class
    detect_seconds: float | None = None  # of the latest recovery
    recover_seconds: float | None = None
    steps_lost: int = 0
    effective_training_ratio: float | None = None
    hang_threshold_seconds: float | None = None
    checkpoint_interval_seconds: float | None = None
    checkpoint_advised_interval_seconds: float | None = None
    time_seconds: dict[str, float] = field(default_factory=dict)  # by cause
    touched: float = 0.0

    def applied(self, report: Report) -> RunHealth:
        new = copy.copy(self)
        new.recoveries = Counter(self.recoveries)
        new.apply(report)
        return new

    def apply(self, report: Report) -> None:
        if report.fault is not None:
            self.recoveries[report.fault] += 1
            self.detect_seconds = report.detect_seconds
            self.recover_seconds = report.recover_seconds
            self.steps_lost += report.steps_lost or 0
        if report.effective_training_ratio is not None:
            self.effective_training_ratio = report.effective_training_ratio
        if report.hang_threshold_seconds is not None:
            self.hang_threshold_seconds = report.hang_threshold_seconds
        for name in ("checkpoint_interval_seconds", "checkpoint_advised_interval_seconds"):
            if getattr(report, name) is not None:
                setattr(self, name, getattr(report, name))
        if report.time_seconds is not None:
            self.time_seconds = dict(report.time_seconds)


def job_series(ranks: Mapping[int, RankState]) -> int:
    """Series one job holds: its own and its ranks'."""
    return SERIES_PER_JOB + sum(state.series for state in ranks.values())


def owner(report: Report) -> tuple[str, str]:
    """Whose progress a report is, as (kind, id) for wire.progress_token."""
    return wire.progress_owner(report.kind, report.run_id, report.submission_id, report.job_id)


@dataclass(frozen=True)
class StoreView:
    """What the store held at one moment; its states are never changed after (copy on write)."""

    jobs: Mapping[JobKey, Mapping[int, RankState]]
    runs: Mapping[str, RunHealth]
    series: int
    rejected: Mapping[str, int]
    refused_series: int
    rollouts: Mapping[JobKey, Mapping[str, str]] = field(default_factory=dict)  # server -> engine, by job


class ProgressStore:
    """Progress per job and rank, bounded; changed from the event loop only."""

    def __init__(self, settings: ProgressSettings, clock=time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self.jobs: dict[JobKey, dict[int, RankState]] = {}
        self.runs: dict[str, RunHealth] = {}  # by launcher run id, bounded by progress.max_jobs too
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.refused_series = 0  # series that refused reports would have added
        self.doubtful: frozenset[JobKey] = frozenset()  # jobs Ray says ended or does not know (train sets it)
        self.rollouts = RolloutTargets()  # RL runs' rollout servers, for the head's /sd/rollout

    @property
    def series(self) -> int:
        return sum(map(job_series, self.jobs.values())) + SERIES_PER_RUN * len(self.runs)

    def job_keys(self) -> list[JobKey]:
        """Every job the store holds something of: progress, or rollout servers."""
        return list(dict.fromkeys([*self.jobs, *self.rollouts.jobs]))

    def view(self) -> StoreView:
        return StoreView(jobs={key: dict(ranks) for key, ranks in self.jobs.items()}, runs=dict(self.runs),
                         series=self.series, rejected=dict(self.rejected), refused_series=self.refused_series,
                         rollouts=dict(self.rollouts.jobs))

    def reject(self, rejected: Rejected) -> Rejected:
        self.rejected[rejected.reason] += 1
        return rejected

    def apply(self, reports: list[Report]) -> None:
        """Apply a validated batch, or raise Rejected (429) if it would exceed a bound."""
        self.expire()
        runs = [report for report in reports if report.kind == "run"]
        rollouts = [report for report in reports if report.kind == "rollout"]
        try:
            servers = self.rollouts.plan(rollouts)
        except TooManyTargets as exc:
            raise self.reject(Rejected(429, "too_many_rollout_servers", str(exc))) from None
        reports = [report for report in reports if report.kind not in ("run", "rollout")]
        new_runs = {report.run_id for report in runs} - set(self.runs)
        new_jobs: set[JobKey] = set()
        new_ranks: Counter[JobKey] = Counter()
        seen: set[tuple[JobKey, int]] = set()
        for report in reports:
            key = (report.job_id or "", report.submission_id or "")
            ranks = self.jobs.get(key)
            if ranks is None and key not in new_jobs:
                new_jobs.add(key)
            if (ranks is None or report.rank not in ranks) and (key, report.rank) not in seen:
                seen.add((key, report.rank))
                new_ranks[key] += 1
        by_job = self._rl_growth(reports)  # series the batch adds per job
        by_job.update({key: SERIES_PER_JOB for key in new_jobs})
        by_job.update({key: SERIES_PER_RANK * count for key, count in new_ranks.items()})
        added = SERIES_PER_RUN * len(new_runs) + sum(by_job.values())
        if added:
            self._make_room(added, new_jobs=len(new_jobs))
        if len(self.runs) + len(new_runs) > self.settings.max_jobs:
            raise self._refuse(added, Rejected(429, "too_many_jobs", f"health is tracked for at most "
                               f"{self.settings.max_jobs} runs at once (progress.max_jobs)"))
        if len(self.jobs) + len(new_jobs) > self.settings.max_jobs:
            raise self._refuse(added, Rejected(429, "too_many_jobs", f"progress is tracked for at most "
                               f"{self.settings.max_jobs} jobs at once (progress.max_jobs); one frees up when Ray "
                               f"says a job ended, or when a job has not reported for "
                               f"{self.settings.expire_after_seconds:g}s"))
        for key, count in new_ranks.items():
            if len(self.jobs.get(key, {})) + count > self.settings.max_ranks_per_job:
                raise self._refuse(added, Rejected(429, "too_many_ranks", f"job {key[1] or key[0]}: at most "
                                   f"{self.settings.max_ranks_per_job} ranks per job (progress.max_ranks_per_job)"))
        share = self.settings.max_series_per_job
        for key, more in by_job.items() if share < self.settings.max_series else ():  # else: the bound below
            held = job_series(self.jobs[key]) if key in self.jobs else 0
            if more and held + more > share:
                raise self._refuse(added, Rejected(429, "too_many_job_series", f"job {key[1] or key[0]}: one job "
                                   f"holds at most {share} series (progress.max_job_share "
                                   f"{self.settings.max_job_share:g} of progress.max_series), so that other jobs "
                                   f"keep room; it has {held} and this batch needs {more} more"))
        if self.series + added > self.settings.max_series:
            raise self._refuse(added, Rejected(429, "too_many_series", f"the progress store holds at most "
                               f"{self.settings.max_series} series (progress.max_series) and has "
                               f"{self.series}; this batch needs {added} more"))
        now = self._clock()
        self.rollouts.commit(servers, self.doubtful, now)
        for report in runs:
            run_id = report.run_id or ""
            self.runs[run_id] = self.runs.get(run_id, RunHealth()).applied(report)
            self.runs[run_id].touched = now
        for report in reports:
            ranks = self.jobs.setdefault((report.job_id or "", report.submission_id or ""), {})
            state = ranks.get(report.rank, RankState()).applied(report)
            state.touched = now
            ranks[report.rank] = state
        self.accepted += len(reports) + len(runs) + len(rollouts)

    def _rl_growth(self, reports: list[Report]) -> Counter[JobKey]:
        """RL series the batch adds per job: per rank, what it holds after the batch (each report's phases
        and reward sources replace the ones before) less what it holds now; never below 0 per rank."""
        before: dict[tuple[JobKey, int], int] = {}
        sets: dict[tuple[JobKey, int], tuple[int, int]] = {}  # (phases, sources) as the batch goes
        for report in reports:
            if report.kind != "rl":
                continue
            key = ((report.job_id or "", report.submission_id or ""), report.rank)
            if key not in sets:
                state = self.jobs.get(key[0], {}).get(report.rank)
                rl = state.rl if state is not None else None
                before[key] = rl.series if rl is not None else 0
                sets[key] = (len(rl.phases), len(rl.rewards)) if rl is not None else (0, 0)
            phases, sources = sets[key]
            sets[key] = (len(report.phases) if report.phases is not None else phases,
                         len(report.rewards) if report.rewards is not None else sources)
        growth: Counter[JobKey] = Counter()
        for key, (phases, sources) in sets.items():
            growth[key[0]] += max(0, SERIES_PER_RL_RANK + SERIES_PER_PHASE * phases + SERIES_PER_SOURCE * sources
                                  - before[key])
        return growth

    def _refuse(self, added: int, rejected: Rejected) -> Rejected:
        self.refused_series += added
        return self.reject(rejected)

    def _make_room(self, needed: int, new_jobs: int) -> None:
        """Let doubtful jobs go, least recently reported first, until the batch fits (or none is left)."""
        doubtful = sorted((key for key in self.doubtful if key in self.jobs), key=self._last_report)
        for key in doubtful:
            if (self.series + needed <= self.settings.max_series
                    and len(self.jobs) + new_jobs <= self.settings.max_jobs):
                return
            del self.jobs[key]

    def _last_report(self, key: JobKey) -> float:
        return max((*(state.touched for state in self.jobs.get(key, {}).values()),
                    self.rollouts.last_report(key) or 0.0), default=0.0)

    def release(self, keys: Iterable[JobKey]) -> None:
        """Let these jobs go now (Ray says they ended, or does not know them, and they went quiet)."""
        keys = list(keys)
        self.rollouts.release(keys)
        for key in keys:
            self.jobs.pop(key, None)

    def quiet_since(self, key: JobKey) -> float:
        """Seconds since the job's last report, on the store's clock."""
        return self._clock() - self._last_report(key)

    def expire(self) -> None:
        cutoff = self._clock() - self.settings.expire_after_seconds
        for key in list(self.jobs):
            ranks = self.jobs[key]
            for rank in [r for r, state in ranks.items() if state.touched < cutoff]:
                del ranks[rank]
            if not ranks:
                del self.jobs[key]
        for run_id in [run_id for run_id, health in self.runs.items() if health.touched < cutoff]:
            del self.runs[run_id]
