"""Ray's processes on this node by job, role and actor class (see process_owners.py for how a process
is mapped), with their CPU, memory and GPU use; and this node's object store.

CPU is a counter per (job, role, actor class) that only grows: each run adds what every live
process used since the last run, so a process that exits does not take its CPU time with it.
A group's series end when its last process is gone (or its job ids get resolved: a driver is
known by its submission id before its Ray job id).
GPU use is joined from the gpu collector's per-process table (Shared.gpu_processes) when it runs here.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Mapping

from exporter.collectors.ray import job_output, process_owners
from exporter.collectors.ray.actor_roles import NO_ROLE, ActorRoles
from exporter.collectors.ray.dashboard import DashboardError, connect
from exporter.collectors.ray.job_ids import JobDirectory
from exporter.collectors.ray.localray import LocalRay, Raylet
from exporter.collectors.ray.process_info import Proc, all_processes
from exporter.collectors.ray.process_owners import Identity
from exporter.config import ExporterConfig
from exporter.framework.catalog import counter, gauge
from exporter.framework.collector import AsyncCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "ray_processes"

_RAY = "while a watched raylet runs on this host"
_STORE = "while a watched raylet runs here and the Ray dashboard answers"
_GPU = "when the gpu collector runs and a Ray process uses a GPU"
PROCESS_LABELS = ("job_id", "submission_id", "process_role", "actor_class", "actor_role")
GPU_LABELS = ("job_id", "submission_id", "gpu", "uuid")
ROLE_GPU_LABELS = ("job_id", "submission_id", "actor_role")
_ROLE_GPU = "when the gpu collector runs and an actor with a role (ray.actor_roles) uses a GPU"

PROCESSES = gauge("raypulse_job_processes", "Ray processes on this node by job, role (driver, actor, worker, idle), "
                  "actor class and the actor's role in the job (ray.actor_roles: generator, trainer).", collector=NAME,
                  labels=PROCESS_LABELS, only_when=_RAY)
CPU = counter("raypulse_job_process_cpu_seconds_total", "CPU time those processes used since they started; "
              "what an exited process used stays counted while its group has processes.", collector=NAME,
              labels=PROCESS_LABELS, unit="seconds", only_when=_RAY)
RESIDENT = gauge("raypulse_job_process_resident_memory_bytes", "Resident memory of those processes, summed (shared "
                 "pages, e.g. the object store, count in every process that maps them).", collector=NAME,
                 labels=PROCESS_LABELS, unit="bytes", only_when=_RAY)
SHARED = gauge("raypulse_job_process_shared_memory_bytes", "The shared part of that resident memory; resident "
               "minus shared is what the processes hold privately.", collector=NAME, labels=PROCESS_LABELS,
               unit="bytes", only_when=_RAY)
GPU_MEMORY = gauge("raypulse_job_gpu_memory_used_bytes", "GPU memory held by the job's processes on this node, "
                   "per GPU.", collector=NAME, labels=GPU_LABELS, unit="bytes", only_when=_GPU)
GPU_SM = gauge("raypulse_job_gpu_sm_utilization_ratio", "Share of the GPU's SM time the job's processes used "
               "over NVML's last sample period.", collector=NAME, labels=GPU_LABELS, unit="ratio",
               only_when=_GPU)
GPU_PROCESSES = gauge("raypulse_job_gpu_processes", "The job's processes using the GPU.", collector=NAME,
                      labels=GPU_LABELS, only_when=_GPU)
ROLE_GPUS = gauge("raypulse_job_role_gpus", "GPUs of this node that the job's actors of a role (generator, "
                  "trainer: ray.actor_roles) use.", collector=NAME, labels=ROLE_GPU_LABELS, only_when=_ROLE_GPU)
ROLE_GPU_SM = gauge("raypulse_job_role_gpu_sm_utilization_ratio", "Share of SM time the job's actors of a role "
                    "used on the GPUs they use on this node, averaged over those GPUs (NVML's last sample "
                    "period); generators idle while the trainer works show here.", collector=NAME,
                    labels=ROLE_GPU_LABELS, unit="ratio", only_when=_ROLE_GPU)
OUTPUT = gauge("raypulse_job_output_last_write_time_seconds", "Unix time the job's Ray worker processes on this "
               "node last wrote to their stdout or stderr (Ray's worker logs); with the driver's log on the head, "
               "whether a job that reports no progress still does anything.", collector=NAME,
               labels=("job_id", "submission_id"), unit="seconds",
               only_when="once a process of the job on this node wrote output")


def _store_gauge(name: str, help: str, unit: str = "", kind=gauge):
    return kind(f"raypulse_ray_object_store_{name}", help, collector=NAME, labels=("node_id",), unit=unit,
                only_when=_STORE)


# ObjectStoreStats field (camel case, as the dashboard serves it) -> family
STORE_FAMILIES = {
    "objectStoreBytesUsed": _store_gauge("used_bytes", "Object store memory in use on the node.", "bytes"),
    "objectStoreBytesAvail": _store_gauge("capacity_bytes", "Object store capacity of the node.", "bytes"),
    "objectStoreBytesPrimaryCopy": _store_gauge("primary_copy_bytes", "Object store memory held by primary "
                                                "copies (objects that cannot be evicted, only spilled).", "bytes"),
    "objectStoreBytesFallback": _store_gauge("fallback_bytes", "Objects allocated on disk because the shared "
                                             "memory store was full.", "bytes"),
    "numLocalObjects": _store_gauge("objects", "Objects in the node's object store."),
    "spilledBytesTotal": _store_gauge("spilled_bytes_total", "Bytes spilled to external storage.", "bytes",
                                      counter),
    "spilledObjectsTotal": _store_gauge("spilled_objects_total", "Objects spilled to external storage.",
                                        kind=counter),
    "spillTimeTotalS": _store_gauge("spill_seconds_total", "Time spent spilling.", "seconds", counter),
    "restoredBytesTotal": _store_gauge("restored_bytes_total", "Bytes restored from external storage.", "bytes",
                                       counter),
    "restoredObjectsTotal": _store_gauge("restored_objects_total", "Objects restored from external storage.",
                                         kind=counter),
    "restoreTimeTotalS": _store_gauge("restore_seconds_total", "Time spent restoring spilled objects.", "seconds",
                                      counter),
    "cumulativeCreatedBytes": _store_gauge("created_bytes_total", "Bytes of objects created in the store.",
                                           "bytes", counter),
}


def _number(value: object) -> float | None:
    try:  # int64 fields arrive as strings
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


class _Group:
    """CPU seconds of a (job, role, actor class), kept while it has processes: exited ones' time stays."""

    __slots__ = ("cpu_seconds",)

    def __init__(self) -> None:
        self.cpu_seconds = 0.0


@register
class RayProcessesCollector(AsyncCollector):
    name = NAME
    description = ("Ray processes on this node by job, role and actor class with their CPU, memory and GPU use, "
                   "and this node's object store (procfs, dashboard REST API, the gpu collector).")

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self.local = LocalRay(config)
        self.directory = JobDirectory()
        self.roles = ActorRoles(config.ray.actor_roles)
        self._identities: dict[tuple[int, int], Identity] = {}  # (pid, start) -> last known identity
        self._cpu_seen: dict[tuple[int, int], float] = {}  # (pid, start) -> CPU seconds at the last run
        self._groups: dict[Identity, _Group] = {}
        self._children: dict[int, list[int]] = {}  # ppid -> pids, as of this run

    async def collect(self, out: SampleSink) -> None:
        raylets = await asyncio.to_thread(self.local.raylets)  # a procfs scan: off the event loop
        if not raylets:
            return
        processes = all_processes(self.local.procfs)
        self._children = defaultdict(list)
        for proc in processes.values():
            self._children[proc.ppid].append(proc.pid)
        found = process_owners.members(raylets, processes, self.local.procfs)
        views = await self._views(raylets, found)
        identities: dict[tuple[int, int], Identity] = {}
        for member in sorted(found, key=lambda m: m.driver_root != m.proc.pid):  # driver roots first
            identities[member.key] = self._identify(member, views, identities)
        self._identities = identities
        await self._resolve_jobs(raylets, identities.values())
        members = {member.key: (member.proc, self._resolved(identities[member.key])) for member in found}
        self._emit_processes(out, members)
        self._emit_output(out, raylets, members)
        for raylet in raylets:
            view = views.get(raylet.node_id)
            if view is None:
                continue
            for field, spec in STORE_FAMILIES.items():
                out.add(spec, _number(view.store.get(field, 0)), node_id=raylet.node_id)  # zeros are left out

    def _identify(self, member: process_owners.Member, views: Mapping[str, process_owners.NodeView],
                  known: Mapping[tuple[int, int], Identity]) -> Identity:
        proc = member.proc
        view = views.get(member.node_id)
        if member.driver_root is not None:
            if member.driver_root != proc.pid:  # the driver's children are the driver's
                root = next((i for (pid, _), i in known.items() if pid == member.driver_root), None)
                if root is not None:
                    return root
            cached = self._identities.get(member.key)
            submission = (cached.submission_id if cached
                          else process_owners.submission_of_driver(self.local.procfs, proc.pid))
            job_id = cached.job_id if cached else ""
            if not job_id:  # the Python driver under the entrypoint's shell is a core worker of type DRIVER
                job_id = next((v.workers[p].job_id for v in views.values() for p in self._descendants(proc.pid)
                               if p in v.workers and v.workers[p].role == process_owners.DRIVER), "")
            return Identity(job_id, submission or "", process_owners.DRIVER)
        if view is not None and proc.pid in view.workers:
            return view.workers[proc.pid]
        return self._identities.get(member.key) or process_owners.title_identity(proc)

    def _descendants(self, pid: int) -> list[int]:
        found, stack = [], [pid]
        while stack:
            current = stack.pop()
            found.append(current)
            stack.extend(self._children.get(current, ()))
        return found

    async def _views(self, raylets: list[Raylet],
                     found: list[process_owners.Member]) -> dict[str, process_owners.NodeView]:
        views: dict[str, process_owners.NodeView] = {}
        try:
            async with connect(self.local, raylets) as api:
                for raylet in raylets:
                    view = await process_owners.fetch_node_view(api, raylet.node_id)
                    if view is None:
                        continue
                    unknown = [m.proc.pid for m in found if m.node_id == raylet.node_id and m.driver_root is None
                               and m.proc.pid not in view.workers and not m.proc.title.startswith(process_owners.IDLE)
                               and m.key not in self._identities]
                    if unknown:  # the raylet's stats lag; ask which job the running tasks belong to
                        running = await process_owners.running_tasks(api, raylet.node_id)
                        extra = {pid: running[pid] for pid in unknown if pid in running}
                        view = process_owners.NodeView({**view.workers, **extra}, view.store)
                    views[raylet.node_id] = view
        except DashboardError:
            pass  # Ray may be down: processes are still reported, from procfs and what was known
        return views

    def _resolved(self, identity: Identity) -> Identity:
        job_id, submission_id = self.directory.resolve(identity.job_id, identity.submission_id)
        return Identity(job_id, submission_id, identity.role, identity.actor_class)

    async def _resolve_jobs(self, raylets: list[Raylet], identities: Iterable[Identity]) -> None:
        pairs = [(i.job_id, i.submission_id) for i in identities]
        if not self.directory.due(pairs):
            return
        try:
            async with connect(self.local, raylets) as api:
                await self.directory.refresh(api)
        except DashboardError:
            pass

    def _emit_processes(self, out: SampleSink, members: Mapping[tuple[int, int], tuple[Proc, Identity]]) -> None:
        count: dict[Identity, int] = defaultdict(int)
        resident: dict[Identity, float] = defaultdict(float)
        shared: dict[Identity, float] = defaultdict(float)
        seen: dict[tuple[int, int], float] = {}
        for key, (proc, identity) in members.items():
            group = self._groups.setdefault(identity, _Group())
            previous = self._cpu_seen.get(key)
            # What the process used since the last run counts for what it is now; a process seen for the
            # first time brings all it used since it started (a new group's counter starts there).
            used = proc.cpu_seconds - previous if previous is not None else proc.cpu_seconds
            group.cpu_seconds += max(0.0, used)
            seen[key] = proc.cpu_seconds
            count[identity] += 1
            resident[identity] += proc.resident_bytes
            shared[identity] += proc.shared_bytes
        self._cpu_seen = seen
        for identity in list(self._groups):
            if identity not in count:  # no process left (the job ended, or its ids were just resolved)
                del self._groups[identity]
        for identity, group in self._groups.items():
            labels = {"job_id": identity.job_id, "submission_id": identity.submission_id, "process_role": identity.role,
                      "actor_class": identity.actor_class, "actor_role": self.roles.of(identity.actor_class)}
            out.add(PROCESSES, count[identity], **labels)
            out.add(CPU, group.cpu_seconds, **labels)
            out.add(RESIDENT, resident[identity], **labels)
            out.add(SHARED, shared[identity], **labels)
        self._emit_gpu(out, members)

    @staticmethod
    def _emit_output(out: SampleSink, raylets: list[Raylet],
                     members: Mapping[tuple[int, int], tuple[Proc, Identity]]) -> None:
        jobs = {proc.pid: (identity.job_id, identity.submission_id) for proc, identity in members.values()
                if identity.job_id or identity.submission_id}
        sessions = [raylet.session_dir for raylet in raylets if raylet.session_dir is not None]
        for (job_id, submission_id), written in job_output.last_writes(sessions, jobs).items():
            out.add(OUTPUT, written, job_id=job_id, submission_id=submission_id)

    def _emit_gpu(self, out: SampleSink, members: Mapping[tuple[int, int], tuple[Proc, Identity]]) -> None:
        usage = self.shared.gpu_processes.get()  # the gpu collector's table, when it runs here
        if usage is None:
            return
        memory: dict[tuple[str, str, str, str], float] = defaultdict(float)
        sm: dict[tuple[str, str, str, str], float] = defaultdict(float)
        users: dict[tuple[str, str, str, str], int] = defaultdict(int)
        # (job, submission, role) -> GPU uuid -> the role's SM share of it (None: NVML gave no sample)
        by_role: dict[tuple[str, str, str], dict[str, float | None]] = defaultdict(dict)
        for proc, identity in members.values():
            role = self.roles.of(identity.actor_class)
            for record in usage.get(proc.pid, ()):
                key = (identity.job_id, identity.submission_id, str(record.gpu), record.uuid)
                users[key] += 1
                if record.used_memory_bytes is not None:
                    memory[key] += record.used_memory_bytes
                if record.sm_utilization is not None:
                    sm[key] += record.sm_utilization
                if role != NO_ROLE:
                    gpus = by_role[(identity.job_id, identity.submission_id, role)]
                    share = gpus.get(record.uuid)
                    if record.sm_utilization is not None:
                        share = (share or 0.0) + record.sm_utilization
                    gpus[record.uuid] = share
        for key in users:
            labels = dict(zip(GPU_LABELS, key, strict=True))
            out.add(GPU_PROCESSES, users[key], **labels)
            out.add(GPU_MEMORY, memory.get(key), **labels)
            out.add(GPU_SM, min(1.0, sm[key]) if key in sm else None, **labels)
        for key, gpus in by_role.items():
            labels = dict(zip(ROLE_GPU_LABELS, key, strict=True))
            sampled = [min(1.0, share) for share in gpus.values() if share is not None]
            out.add(ROLE_GPUS, len(gpus), **labels)
            out.add(ROLE_GPU_SM, sum(sampled) / len(sampled) if sampled else None, **labels)

