"""What the exporter's parts hand each other, typed. The framework makes one `Shared` per exporter
and gives it to every collector; a part publishes into a slot, others read it. A collector never
reaches into another collector (and never imports one): what crosses between them is declared here.

Slots, who writes them and who reads them:
- gpu_processes: the gpu collector's per-process GPU use by pid -> ray_processes (GPU use per job)
- gpu_events: how to read the XID watcher's counts; the gpu collector owns the watcher (it needs the
  NVML session), gpu_events publishes the counts, so they stay visible while gpu collection hangs
- gpu_owners: the pod holding each GPU (kubelet pod-resources), read by the gpu collector -> gpu_events
- progress: what training code reported; the exporter's progress endpoint writes it -> train
- progress_endpoint_up: whether that endpoint listens -> train
- service_discovery: the ray_head collector's view of every node's exporter -> the exporter's /sd
- rollout_servers: the train collector's target groups of the RL runs' rollout servers, as the JSON /sd/rollout
  serves -> the exporter's /sd/rollout

Values are immutable and replaced whole, so any thread may read a slot without a lock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from exporter.config import ExporterConfig
from exporter.progress.store import ProgressStore

T = TypeVar("T")


class Slot(Generic[T]):
    """The latest value one part published (None until it does)."""

    def __init__(self, value: T | None = None) -> None:
        self._value = value

    def publish(self, value: T) -> None:
        self._value = value  # one reference swap: readers see the old value or the new, never half

    def get(self) -> T | None:
        return self._value


OWNER_LABELS = ("pod", "namespace", "container")  # spelled once: the labels naming a GPU's pod
NO_OWNER: Mapping[str, str] = MappingProxyType(dict.fromkeys(OWNER_LABELS, ""))


@dataclass(frozen=True)
class GpuOwners:
    """GPU UUID -> the pod labels of the container holding it, and the GPUs this exporter reports."""

    owners: Mapping[str, Mapping[str, str]]
    # None: every GPU (a DaemonSet, or no pod-resources); else only these (a sidecar's own pod's GPUs)
    mine: frozenset[str] | None = None

    def labels(self, uuid: str) -> Mapping[str, str]:
        return self.owners.get(uuid, NO_OWNER)

    def reports(self, uuid: str) -> bool:
        return self.mine is None or uuid in self.mine


UNKNOWN_OWNERS = GpuOwners(MappingProxyType({}))


@dataclass(frozen=True)
class GpuProcessUsage:
    """One process's use of one GPU, as of the gpu collector's last successful run.

    Ratios are 0..1 over NVML's last sample period; None where NVML cannot tell (per-process
    utilization is not supported with MIG; memory is not available under WDDM)."""

    pid: int
    gpu: int  # NVML index
    uuid: str  # the GPU's UUID (the parent GPU's for a MIG instance)
    used_memory_bytes: int | None
    sm_utilization: float | None
    memory_bandwidth_utilization: float | None
    process_name: str  # the executable's base name as NVML reports it, at most 64 characters
    gpu_instance_id: int | None = None  # the MIG GPU instance, if any


ProcessTable = Mapping[int, tuple[GpuProcessUsage, ...]]  # pid -> its use of each GPU it runs on
NO_PROCESSES: ProcessTable = MappingProxyType({})


@dataclass(frozen=True)
class GpuEvents:
    """An immutable copy of what the XID watcher has counted since the exporter started."""

    up: bool  # the watcher listens for events now
    xids: Mapping[tuple[int, str, int], tuple[int, float]]  # (gpu, uuid, xid) -> (count, last unix time)
    events: Mapping[tuple[int, str, str], int]  # (gpu, uuid, type) -> count
    errors: Mapping[str, int]  # NVML error -> count


@dataclass(frozen=True)
class ServiceDiscovery:
    """Prometheus HTTP service discovery as the head collector last saw the cluster."""

    role: str  # this exporter's Ray role: /sd is served on the head only
    groups: tuple[Mapping[str, Any], ...] = ()  # [{"targets": ["ip:port"], "labels": {...}}, ...]
    metrics_agents: tuple[Mapping[str, Any], ...] = ()  # Ray's metrics agents, alike (wire.RAY_SD_PATH)


@dataclass
class Shared:
    progress: ProgressStore
    gpu_processes: Slot[ProcessTable] = field(default_factory=Slot)
    gpu_events: Slot[Callable[[], GpuEvents]] = field(default_factory=Slot)
    gpu_owners: Slot[GpuOwners] = field(default_factory=Slot)
    progress_endpoint_up: Slot[bool] = field(default_factory=Slot)
    service_discovery: Slot[ServiceDiscovery] = field(default_factory=Slot)
    rollout_servers: Slot[bytes] = field(default_factory=Slot)  # wire.ROLLOUT_SD_PATH's body

    @classmethod
    def for_config(cls, config: ExporterConfig) -> Shared:
        return cls(progress=ProgressStore(config.progress))
