"""What a collector is, and the registry every collector module adds itself to.

A collector knows one source and nothing else: the scheduler owns intervals, deadlines,
threads, health and errors (node_exporter's `registerCollector` + `execute` split).
Blocking collectors (procfs, sysfs, NVML) implement `collect` and run in a thread of their
own; collectors that talk HTTP implement `AsyncCollector.collect` as a coroutine.

What a collector gets from the framework: the configuration, and `Shared` (exporter/framework/shared.py),
the typed slots through which the exporter's parts hand each other data (the GPU process table,
the XID counts, the training progress store, the /sd targets). A collector never reaches into
another collector.
"""

from __future__ import annotations

import abc
import importlib
import pkgutil
from typing import TYPE_CHECKING, ClassVar, TypeVar

from exporter.config import ExporterConfig
from exporter.framework.shared import Shared

if TYPE_CHECKING:
    from exporter.framework.snapshot import SampleSink


class Collector(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    default_enabled: ClassVar[bool] = True
    default_interval: ClassVar[float] = 5.0

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        self.config = config
        # The exporter's shared slots; a collector made alone (a test, a benchmark) gets its own.
        self.shared = shared if shared is not None else Shared.for_config(config)

    def close(self) -> None:  # noqa: B027  (optional hook, most collectors hold nothing)
        """Release what the collector holds; called once at shutdown."""


class BlockingCollector(Collector):
    """Runs in a dedicated thread; may block (file reads, NVML calls)."""

    @abc.abstractmethod
    def collect(self, out: SampleSink) -> None: ...


class AsyncCollector(Collector):
    """Runs on the event loop; must only await (HTTP), never block."""

    @abc.abstractmethod
    async def collect(self, out: SampleSink) -> None: ...


REGISTRY: dict[str, type[Collector]] = {}
C = TypeVar("C", bound=type[Collector])


def register(cls: C) -> C:
    """Class decorator: make a collector known by its `name` (and configurable under it)."""
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"collector {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def load_collectors() -> dict[str, type[Collector]]:
    """Import every module under exporter.collectors so each registers itself and its families."""
    import exporter.collectors as package
    import exporter.framework.selfmetrics  # noqa: F401  (the framework's own families)

    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
    return REGISTRY
