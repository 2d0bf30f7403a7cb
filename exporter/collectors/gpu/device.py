"""What the collector keeps about one GPU between runs, keyed by its UUID.

The NVML index and handle can change (a GPU that falls off the bus and comes back, a re-enumeration)
while the UUID does not, so counters, the NOT_SUPPORTED cache and the XID counts follow the UUID.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.collectors.gpu.counters import CounterSet
from exporter.framework.shared import NO_OWNER


@dataclass
class Recorded:
    spec: Any  # MetricSpec
    value: float | None
    labels: dict[str, object]


@dataclass
class GpuDevice:
    uuid: str
    index: int
    handle: Any
    lost: bool = False
    lost_events: int = 0
    # Calls and fields that answered NOT_SUPPORTED (or FUNCTION_NOT_FOUND, NO_PERMISSION): key -> label.
    unsupported: dict[object, str] = field(default_factory=dict)
    counters: CounterSet = field(default_factory=CounterSet)
    # Identity labels for raypulse_gpu_info, and the static samples (limits, thresholds, maxima)
    # read at enumeration and every static refresh, replayed on every run.
    identity: dict[str, str] = field(default_factory=dict)
    static: list[Recorded] = field(default_factory=list)
    static_read_at: float | None = None
    nvlink_links: int = 0
    fans: int = 0
    gpm_supported: bool = False
    # The previous GPM sample per scope (None: the whole GPU; an int: a MIG GPU instance id).
    gpm_samples: dict[int | None, Any] = field(default_factory=dict)
    process_timestamp_us: int = 0
    process_names: dict[int, str] = field(default_factory=dict)
    collection_seconds: float | None = None
    # pod, namespace, container holding it (kubelet pod-resources), set every run; empty when unknown
    owner: Mapping[str, str] = field(default_factory=lambda: NO_OWNER)

    @property
    def labels(self) -> dict[str, object]:
        return {"gpu": self.index, "uuid": self.uuid, **self.owner}

    def mark_lost(self) -> None:
        if not self.lost:
            self.lost = True
            self.lost_events += 1

    def mark_found(self, index: int, handle: Any) -> None:
        """Seen at enumeration; a GPU that was lost comes back with fresh counters and support."""
        if index != self.index:
            self.static_read_at = None  # its static samples carry the old index
        self.index, self.handle = index, handle
        if self.lost:
            self.lost = False
            self.counters.resync()
            self.unsupported.clear()
            self.static_read_at = None
