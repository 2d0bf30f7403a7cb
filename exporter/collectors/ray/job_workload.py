"""What each job runs: its actors (by state, restarts, deaths by cause) and tasks (by state, failures
by error type), from the State API filtered by job, never by listing every task of the cluster.

Per job and run: the actor list of the job (actors are few), the task summary of the job (counts
per function and state, computed by the dashboard) and the job's FAILED task attempts (the only
tasks listed, for their error type). A running job is read every run; a finished one until its
counts have settled (Ray rewrites unfinished tasks of a finished job ~15 s after it ends), then
kept as read. At most `FETCHES_PER_RUN` jobs are read per run, so a cluster with a long history
costs a bounded number of requests.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.catalog import gauge
from exporter.collectors.ray.dashboard import DashboardError, DashboardSession
from exporter.collectors.ray.jobs import JOB_LABELS, NAME, Job, enum_value
from exporter.snapshot import SampleSink

FETCHES_PER_RUN = 8  # jobs read per run; a cold start with a long history spreads over runs
SETTLE_SECONDS = 30.0
ACTOR_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD")
TASK_STATES = ("RUNNING", "FINISHED", "FAILED")  # always present (0 if none), so rates and alerts see a 0 first
_WITH_ID = "on the head node for jobs whose driver has connected (job_id known)"

ACTORS = gauge("raypulse_job_actors", "Actors of the job by state (DEPENDENCIES_UNREADY, PENDING_CREATION, ALIVE, "
               "RESTARTING, DEAD).", collector=NAME, labels=(*JOB_LABELS, "state"), only_when=_WITH_ID)
ACTOR_RESTARTS = gauge("raypulse_job_actor_restarts", "Restarts of the job's actors, summed (Ray's num_restarts).",
                       collector=NAME, labels=JOB_LABELS, only_when=_WITH_ID)
ACTOR_DEATHS = gauge("raypulse_job_actor_deaths", "Dead actors of the job by cause (WORKER_DIED, NODE_DIED, "
                     "OUT_OF_MEMORY, RAY_KILL, CREATION_TASK_ERROR, ...).", collector=NAME,
                     labels=(*JOB_LABELS, "reason"), only_when="for jobs with dead actors")
TASKS = gauge("raypulse_job_tasks", "Task attempts of the job by state, as the State API's task summary counts "
              "them (Ray keeps a bounded history).", collector=NAME, labels=(*JOB_LABELS, "state"),
              only_when=_WITH_ID)
TASK_FAILURES = gauge("raypulse_job_task_failures", "Failed task attempts of the job by error type "
                      "(TASK_EXECUTION_EXCEPTION is the user's code; WORKER_DIED, NODE_DIED, OUT_OF_MEMORY are "
                      "infrastructure).", collector=NAME, labels=(*JOB_LABELS, "error_type"),
                      only_when="for jobs with failed tasks")
PLACEMENT_GROUPS = gauge("raypulse_job_placement_groups", "Placement groups the job created, by state.",
                         collector=NAME, labels=(*JOB_LABELS, "state"), only_when="for jobs with placement groups")

# The context set in an actor's death_cause, when it is not ActorDiedErrorContext (which has a reason).
_DEATH_CONTEXTS = {"creation_task_failure_context": "CREATION_TASK_ERROR",
                   "runtime_env_failed_context": "RUNTIME_ENV_SETUP_FAILED",
                   "actor_unschedulable_context": "UNSCHEDULABLE", "oom_context": "OUT_OF_MEMORY"}


@dataclass(frozen=True)
class Workload:
    actors: Mapping[str, int]
    actor_restarts: int
    actor_deaths: Mapping[str, int]
    tasks: Mapping[str, int]
    task_failures: Mapping[str, int]
    complete: bool  # every list came back whole (not truncated at the State API's limit)


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


async def fetch(api: DashboardSession, job_id: str) -> Workload:
    by_job = [("job_id", "=", job_id)]
    actors, summary, failed = await asyncio.gather(
        api.state_list("actors", by_job, detail=True), api.summary("tasks", by_job),
        api.state_list("tasks", [*by_job, ("state", "=", "FAILED")]))
    states: Counter[str] = Counter()
    deaths: Counter[str] = Counter()
    restarts = 0
    for actor in actors.items:
        state = enum_value(actor.get("state"))
        states[state] += 1
        restarts += _int(actor.get("num_restarts"))
        if state == "DEAD":
            deaths[death_reason(actor.get("death_cause"))] += 1
    tasks: Counter[str] = Counter()
    for entry in summary.values():
        for state, count in (entry.get("state_counts") or {}).items():
            tasks[enum_value(state)] += _int(count)
    failures = Counter(enum_value(task.get("error_type"), "UNKNOWN") for task in failed.items)
    return Workload(dict(states), restarts, dict(deaths), dict(tasks), dict(failures),
                    complete=not (actors.truncated or failed.truncated))


class WorkloadCache:
    """The last workload read per Ray job id, and which jobs to (re)read this run."""

    def __init__(self) -> None:
        self._workloads: dict[str, tuple[float, Workload]] = {}  # job_id -> (read at, workload)

    def due(self, jobs: Iterable[Job], now: float) -> list[Job]:
        running, settling = [], []
        for job in jobs:
            if not job.job_id:
                continue
            if not job.terminal:
                running.append(job)
                continue
            read = self._workloads.get(job.job_id)
            if read is None or (job.end_time is not None and read[0] < job.end_time + SETTLE_SECONDS):
                settling.append(job)
        settling.sort(key=lambda j: j.end_time or 0, reverse=True)
        return (running + settling)[:FETCHES_PER_RUN]

    async def refresh(self, api: DashboardSession, jobs: list[Job], now: float) -> int:
        """Read the workloads of `jobs`; returns how many reads failed (kept from before)."""
        results = await asyncio.gather(*(fetch(api, job.job_id) for job in jobs), return_exceptions=True)
        failed = 0
        for job, result in zip(jobs, results, strict=True):
            if isinstance(result, Workload):
                self._workloads[job.job_id] = (now, result)
            elif isinstance(result, DashboardError):
                failed += 1
            else:
                raise result
        return failed

    def forget_except(self, job_ids: set[str]) -> None:
        for job_id in set(self._workloads) - job_ids:
            del self._workloads[job_id]

    def get(self, job_id: str) -> Workload | None:
        read = self._workloads.get(job_id)
        return read[1] if read else None


def emit(out: SampleSink, jobs: Iterable[Job], cache: WorkloadCache,
         placement_groups: Mapping[str, Mapping[str, int]]) -> None:
    for job in jobs:
        labels = job.labels
        for state, count in placement_groups.get(job.job_id, {}).items():
            out.add(PLACEMENT_GROUPS, count, **labels, state=state)
        workload = cache.get(job.job_id) if job.job_id else None
        if workload is None:
            continue
        for state in ACTOR_STATES:
            out.add(ACTORS, workload.actors.get(state, 0), **labels, state=state)
        out.add(ACTOR_RESTARTS, workload.actor_restarts, **labels)
        for reason, count in workload.actor_deaths.items():
            out.add(ACTOR_DEATHS, count, **labels, reason=reason)
        for state in {*TASK_STATES, *workload.tasks}:
            out.add(TASKS, workload.tasks.get(state, 0), **labels, state=state)
        for error_type, count in workload.task_failures.items():
            out.add(TASK_FAILURES, count, **labels, error_type=error_type)
