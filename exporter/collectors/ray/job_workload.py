"""What each job runs: its actors (by state, restarts, deaths by cause) and tasks (by state, failures
by error type), from the State API filtered by job on the server, never by listing every task or
actor of the cluster, and reading rows only where a count cannot do.

Per job and run:
- actors by state: one read of one row per state, filtered by job and state in the GCS, whose count
  is in Ray's reply (exact unless the GCS stopped at its 10,000-row limit: that state is left out);
  a job that had at most SMALL_JOB_ACTORS actors at its last read has them listed (without detail)
  in one read instead;
- tasks by state: the job's task summary when it covers every task attempt Ray holds (fewer than
  10,000); past that, one read of one row per state, whose `total` counts every match (the GCS counts
  matches past its limit as dropped events), less the job's lost attempts (a read that matches
  nothing says how many);
- restarts and deaths by cause need rows with detail (num_restarts and death_cause are detail-only
  columns): the job's DEAD actors and its live ones are read, state by state, only when that part's
  counts moved or the last read is older than DETAIL_MAX_AGE (an actor that restarts within one run's
  interval leaves the counts as they were); failed task attempts (for their error type, no detail)
  only when the job's FAILED count moved.
A family built from a read Ray cut short is left out for that job (and the cut counted), never
taken for the whole.

A running job is read every run; a finished one until its counts have settled (Ray rewrites
unfinished tasks of a finished job ~15 s after it ends), then kept as read. At most
`FETCHES_PER_RUN` jobs are read per run, those read longest ago first, so a cluster with a long
history or many running jobs costs a bounded number of requests.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from exporter.collectors.ray.dashboard import SOURCE_LIMIT, Cuts, DashboardError, DashboardSession, Filter, StateList
from exporter.collectors.ray.jobs import JOB_LABELS, NAME, Job, enum_value
from exporter.framework.catalog import gauge
from exporter.framework.snapshot import SampleSink

FETCHES_PER_RUN = 8  # jobs read per run; a cold start with a long history spreads over runs
SETTLE_SECONDS = 30.0
SMALL_JOB_ACTORS = 100  # a job with more has its actors counted state by state, not listed
DETAIL_MAX_AGE = 60.0  # seconds a job's actor detail (restarts, death causes) is kept while its counts hold
ACTOR_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD")
LIVE_ACTOR_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING")
# The TaskStatus values the State API shows (PENDING_OBJ_STORE_MEM_AVAIL, PENDING_ARGS_FETCH,
# RUNNING_IN_RAY_GET/WAIT and GETTING_AND_PINNING_ARGS are "metrics only": never in task events).
TASK_STATUSES = ("NIL", "PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "SUBMITTED_TO_WORKER",
                 "PENDING_ACTOR_TASK_ARGS_FETCH", "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY", "RUNNING",
                 "FINISHED", "FAILED")
TASK_STATES = ("RUNNING", "FINISHED", "FAILED")  # always present (0 if none), so rates and alerts see a 0 first
NO_SUCH_TASK = "raypulse.no-such-task"  # a task name nothing has: the read that counts only lost attempts
_WITH_ID = "on the head node for jobs whose driver has connected (job_id known)"
_WHOLE = "unless Ray's State API cut the job's list at its 10,000-row limit"

ACTORS = gauge("raypulse_job_actors", "Actors of the job by state (DEPENDENCIES_UNREADY, PENDING_CREATION, ALIVE, "
               "RESTARTING, DEAD).", collector=NAME, labels=(*JOB_LABELS, "state"),
               only_when=f"{_WITH_ID}, for each state of fewer than 10,000 actors")
ACTOR_RESTARTS = gauge("raypulse_job_actor_restarts", "Restarts of the job's actors, summed (Ray's num_restarts; "
                       f"read again when the job's actors change state, at least every {DETAIL_MAX_AGE:.0f} s).",
                       collector=NAME, labels=JOB_LABELS, only_when=f"{_WITH_ID}, {_WHOLE}")
ACTOR_DEATHS = gauge("raypulse_job_actor_deaths", "Dead actors of the job by cause (WORKER_DIED, NODE_DIED, "
                     "OUT_OF_MEMORY, RAY_KILL, CREATION_TASK_ERROR, ...).", collector=NAME,
                     labels=(*JOB_LABELS, "reason"), only_when=f"for jobs with dead actors, {_WHOLE}")
TASKS = gauge("raypulse_job_tasks", "Task attempts of the job by state, as Ray's State API counts them (Ray keeps "
              "a bounded history).", collector=NAME, labels=(*JOB_LABELS, "state"), only_when=_WITH_ID)
TASK_FAILURES = gauge("raypulse_job_task_failures", "Failed task attempts of the job by error type "
                      "(TASK_EXECUTION_EXCEPTION is the user's code; WORKER_DIED, NODE_DIED, OUT_OF_MEMORY are "
                      "infrastructure).", collector=NAME, labels=(*JOB_LABELS, "error_type"),
                      only_when=f"for jobs with failed tasks, {_WHOLE}")
PLACEMENT_GROUPS = gauge("raypulse_job_placement_groups", "Placement groups the job created, by state.",
                         collector=NAME, labels=(*JOB_LABELS, "state"), only_when="for jobs with placement groups")

# The context set in an actor's death_cause, when it is not ActorDiedErrorContext (which has a reason).
_DEATH_CONTEXTS = {"creation_task_failure_context": "CREATION_TASK_ERROR",
                   "runtime_env_failed_context": "RUNTIME_ENV_SETUP_FAILED",
                   "actor_unschedulable_context": "UNSCHEDULABLE", "oom_context": "OUT_OF_MEMORY"}


@dataclass(frozen=True)
class Workload:
    """What is known whole about a job; a part Ray cut is absent (empty) or None."""

    actors: Mapping[str, int]  # states whose count is exact
    actor_restarts: int | None
    actor_deaths: Mapping[str, int] | None
    tasks: Mapping[str, int]
    task_failures: Mapping[str, int] | None


def death_reason(cause: object) -> str:
    if not isinstance(cause, dict):
        return "UNKNOWN"
    died = cause.get("actor_died_error_context")
    if isinstance(died, dict):
        return enum_value(died.get("reason"), "UNKNOWN")
    for context, reason in _DEATH_CONTEXTS.items():
        if context in cause:
            return reason
    return "UNKNOWN"


def _int(value: object) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


@dataclass
class _Detail:
    """One part of a job's actors read with detail: what it gave, and the counts it was read at."""

    counts: tuple[int, ...]
    read_at: float
    restarts: int | None
    deaths: Mapping[str, int] | None = None


@dataclass
class _Reads:
    """What is kept of a job between runs, so that unchanged parts are not read again."""

    dead: _Detail | None = None
    live: _Detail | None = None
    failures: tuple[int, Mapping[str, int] | None] | None = None  # (FAILED count read at, by error type)
    many_tasks: bool = False  # its summary was cut last time: count by state directly
    actors_total: int | None = None  # its actors at the last read (None: not known whole)
    workload: Workload | None = None
    workload_at: float = -1.0


def _counts(replies: Sequence[StateList], states: Sequence[str], cuts: Cuts, what: str) -> dict[str, int]:
    """Actor counts from one-row reads: the exact ones (a state the GCS stopped counting is noted)."""
    exact = {}
    for state, reply in zip(states, replies, strict=True):
        if reply.source_cut:
            cuts.add("actors", f"{what} actors in state {state}: the GCS stopped after {reply.num_filtered:,}")
        else:
            exact[state] = reply.num_filtered
    return exact


async def _actor_counts(api: DashboardSession, reads: _Reads, by_job: list[Filter], cuts: Cuts,
                        what: str) -> dict[str, int]:
    """The job's actors by state, every state whose count is exact (module docstring)."""
    if reads.actors_total is not None and reads.actors_total <= SMALL_JOB_ACTORS:
        listed = await api.state_list("actors", by_job, limit=SMALL_JOB_ACTORS)
        if listed.complete:
            reads.actors_total = len(listed.items)
            states = Counter(enum_value(row.get("state")) for row in listed.items)
            return {state: states.get(state, 0) for state in {*ACTOR_STATES, *states}}
    replies = await asyncio.gather(*(api.count("actors", [*by_job, ("state", "=", state)]) for state in ACTOR_STATES))
    counts = _counts(replies, ACTOR_STATES, cuts, what)
    reads.actors_total = sum(counts.values()) if len(counts) == len(ACTOR_STATES) else None
    return counts


async def _task_counts(api: DashboardSession, reads: _Reads, by_job: list[Filter]) -> dict[str, int]:
    """The job's task attempts by state, exact (module docstring)."""
    if not reads.many_tasks:
        summary, listed = await api.summary("tasks", by_job)
        if not listed.source_cut:
            tasks: Counter[str] = Counter()
            for entry in summary.values():
                for state, count in ((entry.get("state_counts") or {}) if isinstance(entry, dict) else {}).items():
                    tasks[enum_value(state)] += _int(count)
            return dict(tasks)
    replies = await asyncio.gather(api.count("tasks", [*by_job, ("name", "=", NO_SUCH_TASK)]),
                                   *(api.count("tasks", [*by_job, ("state", "=", state)]) for state in TASK_STATUSES))
    lost = replies[0].total  # matches nothing: its total is the job's lost attempts alone
    tasks = {}
    for state, reply in zip(TASK_STATUSES, replies[1:], strict=True):
        count = reply.num_filtered if not reply.source_cut else max(0, reply.total - lost)
        if count:
            tasks[state] = count
    reads.many_tasks = sum(tasks.values()) >= SOURCE_LIMIT
    return tasks


def _restarts(rows: Iterable[Mapping[str, object]]) -> int:
    return sum(_int(row.get("num_restarts")) for row in rows)


async def _read_dead(api: DashboardSession, by_job: list[Filter], count: int, now: float, cuts: Cuts,
                     job_id: str) -> _Detail:
    if not count:
        return _Detail((0,), now, 0, {})
    reply = cuts.check(await api.state_list("actors", [*by_job, ("state", "=", "DEAD")], detail=True),
                       f"dead actors of job {job_id}")
    if not reply.complete:
        return _Detail((count,), now, None, None)
    deaths = Counter(death_reason(row.get("death_cause")) for row in reply.items)
    return _Detail((count,), now, _restarts(reply.items), dict(deaths))


async def _read_live(api: DashboardSession, by_job: list[Filter], counts: tuple[int, ...], now: float,
                     cuts: Cuts, job_id: str) -> _Detail:
    states = [state for state, count in zip(LIVE_ACTOR_STATES, counts, strict=True) if count]
    replies = await asyncio.gather(*(api.state_list("actors", [*by_job, ("state", "=", state)], detail=True)
                                     for state in states))
    whole = all([cuts.check(reply, f"{state} actors of job {job_id}").complete
                 for state, reply in zip(states, replies, strict=True)])
    return _Detail(counts, now, sum(_restarts(reply.items) for reply in replies) if whole else None)


async def _read_failures(api: DashboardSession, by_job: list[Filter], count: int, cuts: Cuts,
                         job_id: str) -> Mapping[str, int] | None:
    if not count:
        return {}
    reply = cuts.check(await api.state_list("tasks", [*by_job, ("state", "=", "FAILED")]),
                       f"failed tasks of job {job_id}")
    if not reply.complete:
        return None
    return dict(Counter(enum_value(task.get("error_type"), "UNKNOWN") for task in reply.items))


def _stale(detail: _Detail | None, counts: tuple[int, ...], now: float) -> bool:
    return detail is None or detail.counts != counts or now - detail.read_at > DETAIL_MAX_AGE


async def fetch(api: DashboardSession, job_id: str, reads: _Reads, now: float, cuts: Cuts) -> Workload:
    by_job: list[Filter] = [("job_id", "=", job_id)]
    what = f"job {job_id}'s"
    actors, tasks = await asyncio.gather(_actor_counts(api, reads, by_job, cuts, what),
                                         _task_counts(api, reads, by_job))
    dead_whole = "DEAD" in actors
    live_whole = all(state in actors for state in LIVE_ACTOR_STATES)
    dead = (actors.get("DEAD", 0),)
    live = tuple(actors.get(state, 0) for state in LIVE_ACTOR_STATES)
    failed = tasks.get("FAILED", 0)
    reading = {}
    if dead_whole and _stale(reads.dead, dead, now):
        reading["dead"] = _read_dead(api, by_job, dead[0], now, cuts, job_id)
    if live_whole and _stale(reads.live, live, now):
        reading["live"] = _read_live(api, by_job, live, now, cuts, job_id)
    if reads.failures is None or reads.failures[0] != failed:
        reading["failures"] = _read_failures(api, by_job, failed, cuts, job_id)
    read = dict(zip(reading, await asyncio.gather(*reading.values()), strict=True))
    reads.dead = read.get("dead", reads.dead)
    reads.live = read.get("live", reads.live)
    if "failures" in read:
        reads.failures = (failed, read["failures"])
    deaths = reads.dead.deaths if dead_whole and reads.dead is not None else None
    restarts = None
    if dead_whole and live_whole and reads.dead is not None and reads.live is not None \
            and reads.dead.restarts is not None and reads.live.restarts is not None:
        restarts = reads.dead.restarts + reads.live.restarts
    return Workload(actors, restarts, deaths, tasks, reads.failures[1] if reads.failures else None)


class WorkloadCache:
    """The last workload read per Ray job id, what to keep between reads, and which jobs to (re)read."""

    def __init__(self) -> None:
        self._reads: dict[str, _Reads] = {}

    def due(self, jobs: Iterable[Job], now: float) -> list[Job]:
        running, settling = [], []
        for job in jobs:
            if not job.job_id:
                continue
            reads = self._reads.get(job.job_id)
            read_at = reads.workload_at if reads and reads.workload else -1.0
            if not job.terminal:
                running.append((read_at, job))
            elif read_at < 0 or (job.end_time is not None and read_at < job.end_time + SETTLE_SECONDS):
                settling.append((read_at, job))
        running.sort(key=lambda pair: pair[0])  # read longest ago first: every running job takes its turn
        settling.sort(key=lambda pair: (pair[0], -(pair[1].end_time or 0)))
        return [job for _, job in running + settling][:FETCHES_PER_RUN]

    async def refresh(self, api: DashboardSession, jobs: list[Job], now: float, cuts: Cuts) -> int:
        """Read the workloads of `jobs`; returns how many reads failed (kept from before)."""
        reads = [self._reads.setdefault(job.job_id, _Reads()) for job in jobs]
        results = await asyncio.gather(*(fetch(api, job.job_id, r, now, cuts) for job, r in zip(jobs, reads,
                                                                                                  strict=True)),
                                       return_exceptions=True)
        failed = 0
        for job_reads, result in zip(reads, results, strict=True):
            if isinstance(result, Workload):
                job_reads.workload, job_reads.workload_at = result, now
            elif isinstance(result, DashboardError):
                failed += 1
            else:
                raise result
        return failed

    def forget_except(self, job_ids: set[str]) -> None:
        for job_id in set(self._reads) - job_ids:
            del self._reads[job_id]

    def get(self, job_id: str) -> Workload | None:
        reads = self._reads.get(job_id)
        return reads.workload if reads else None


def emit(out: SampleSink, jobs: Iterable[Job], cache: WorkloadCache,
         placement_groups: Mapping[str, Mapping[str, int]]) -> None:
    for job in jobs:
        labels = job.labels
        for state, count in placement_groups.get(job.job_id, {}).items():
            out.add(PLACEMENT_GROUPS, count, **labels, state=state)
        workload = cache.get(job.job_id) if job.job_id else None
        if workload is None:
            continue
        for state, count in workload.actors.items():
            out.add(ACTORS, count, **labels, state=state)
        out.add(ACTOR_RESTARTS, workload.actor_restarts, **labels)
        for reason, count in (workload.actor_deaths or {}).items():
            out.add(ACTOR_DEATHS, count, **labels, reason=reason)
        for state in {*TASK_STATES, *workload.tasks}:
            out.add(TASKS, workload.tasks.get(state, 0), **labels, state=state)
        for error_type, count in (workload.task_failures or {}).items():
            out.add(TASK_FAILURES, count, **labels, error_type=error_type)

