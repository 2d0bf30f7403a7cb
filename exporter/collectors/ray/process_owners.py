"""Which Ray processes run on this node and whom they work for: job, role and actor class.

Processes come from procfs: the watched raylets' `ray::...` worker children, and the driver of
each submitted job, which a `ray::JobSupervisor` worker starts with the job's config (and so
its submission id) in RAY_JOB_CONFIG_JSON_ENV_VAR; everything the driver starts is the driver's.
What a worker does comes from the dashboard's view of the node (`/nodes/<node id>`): its actors
(pid, class, job; kept current by the GCS) and the raylet's core-worker stats (pid, job; these
lag up to 15 s). A worker neither names is looked up among the node's running tasks. A worker's
own RAY_JOB_ID is not used: Ray prestarts workers before it knows their job.

Roles: driver, actor, worker (runs tasks), idle (not leased to any job yet).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.collectors.ray.dashboard import DashboardSession
from exporter.collectors.ray.localray import Raylet
from exporter.collectors.ray.process_info import Proc, environ_value

SYSTEM_TITLES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::JobSupervisor")
SUPERVISOR = "ray::JobSupervisor"
IDLE = "ray::IDLE"
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
NIL_JOB = "ffffffff"
MAX_CLASS_LENGTH = 64
DRIVER = "driver"


@dataclass(frozen=True)
class Identity:
    job_id: str
    submission_id: str
    role: str
    actor_class: str = ""


@dataclass(frozen=True)
class NodeView:
    """What the dashboard says about one raylet's processes and object store."""

    workers: Mapping[int, Identity]
    store: Mapping[str, Any]


def _job(value: object) -> str:
    job = str(value or "")
    return "" if job == NIL_JOB else job


def parse_node_view(detail: Mapping[str, Any]) -> NodeView:
    """`/nodes/<node id>` data.detail -> pid -> Identity, and the raylet's store stats."""
    raylet = detail.get("raylet") if isinstance(detail.get("raylet"), dict) else {}
    actors = detail.get("actors") if isinstance(detail.get("actors"), dict) else {}
    classes = {str(actor_id): str(actor.get("className") or "")[:MAX_CLASS_LENGTH]
               for actor_id, actor in actors.items() if isinstance(actor, dict)}  # type: ignore[union-attr]
    workers: dict[int, Identity] = {}
    for stats in raylet.get("coreWorkersStats") or []:  # type: ignore[union-attr]
        pid = stats.get("pid") if isinstance(stats, dict) else None
        if not str(pid).isdigit():
            continue
        actor_id = str(stats.get("actorId") or "")
        job_id = _job(stats.get("jobId"))
        if actor_id.strip("f"):
            workers[int(pid)] = Identity(job_id, "", "actor", classes.get(actor_id, ""))
        elif stats.get("workerType") == "DRIVER":
            workers[int(pid)] = Identity(job_id, "", DRIVER)
        else:
            workers[int(pid)] = Identity(job_id, "", "worker" if job_id else "idle")
    for actor_id, actor in actors.items():  # type: ignore[union-attr]
        pid = actor.get("pid") if isinstance(actor, dict) else None
        if str(pid).isdigit() and int(pid) and actor.get("state") in ("ALIVE", "RESTARTING", "PENDING_CREATION"):
            workers[int(pid)] = Identity(_job(actor.get("jobId")), "", "actor", classes.get(str(actor_id), ""))
    store = raylet.get("storeStats") if isinstance(raylet.get("storeStats"), dict) else {}  # type: ignore[union-attr]
    return NodeView(workers, store)  # type: ignore[arg-type]


async def fetch_node_view(api: DashboardSession, node_id: str) -> NodeView | None:
    reply = await api.json(f"/nodes/{node_id}")
    detail = (reply.get("data") or {}).get("detail") if isinstance(reply, dict) else None
    return parse_node_view(detail) if isinstance(detail, dict) and detail else None


async def running_tasks(api: DashboardSession, node_id: str) -> dict[int, Identity]:
    """pid -> identity of the workers running a task on the node right now."""
    tasks = await api.state_list("tasks", [("node_id", "=", node_id), ("state", "=", "RUNNING")], limit=1000)
    found = {}
    for task in tasks.items:
        pid = task.get("worker_pid")
        if not str(pid).isdigit():
            continue
        job_id = _job(task.get("job_id"))
        if task.get("type") in ("ACTOR_TASK", "ACTOR_CREATION_TASK"):
            actor_class = str(task.get("func_or_class_name") or "").split(".", 1)[0][:MAX_CLASS_LENGTH]
            found[int(pid)] = Identity(job_id, "", "actor", actor_class)
        else:
            found[int(pid)] = Identity(job_id, "", "worker" if job_id else "idle")
    return found


def submission_of_driver(procfs: Path, pid: int) -> str | None:
    """The submission id the JobSupervisor gave this process, or None if it is not a job's driver."""
    raw = environ_value(procfs, pid, JOB_CONFIG_ENV)
    if raw is None:
        return None
    try:
        return str((json.loads(raw).get("metadata") or {}).get("job_submission_id") or "")[:128]
    except (ValueError, AttributeError):
        return ""


@dataclass(frozen=True)
class Member:
    """A Ray process of this node: a worker of a raylet, or part of a submitted job's driver."""

    proc: Proc
    node_id: str  # the raylet it belongs to
    driver_root: int | None = None  # pid of the driver process it descends from (drivers only)

    @property
    def key(self) -> tuple[int, int]:
        """(pid, start time): a process, even after its pid is reused."""
        return self.proc.pid, self.proc.start_ticks


def members(raylets: list[Raylet], processes: Mapping[int, Proc], procfs: Path) -> list[Member]:
    children: dict[int, list[Proc]] = defaultdict(list)
    for proc in processes.values():
        children[proc.ppid].append(proc)
    found: list[Member] = []
    for raylet in raylets:
        for proc in children.get(raylet.pid, []):
            if proc.title.startswith(SUPERVISOR):
                for child in children.get(proc.pid, []):
                    # The entrypoint's shell has the job config; the supervisor's own watchdog does not.
                    if submission_of_driver(procfs, child.pid) is None:
                        continue
                    stack = [child]
                    while stack:
                        driver = stack.pop()
                        found.append(Member(driver, raylet.node_id, child.pid))
                        stack.extend(children.get(driver.pid, []))
            elif proc.title.startswith("ray::") and not proc.title.startswith(SYSTEM_TITLES):
                found.append(Member(proc, raylet.node_id))
    return found


def title_identity(proc: Proc) -> Identity:
    return Identity("", "", "idle" if proc.title.startswith(IDLE) else "worker")
