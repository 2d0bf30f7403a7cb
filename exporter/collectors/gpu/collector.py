"""The `gpu` collector: every NVIDIA GPU of the node through NVML, one run every interval.

A run initializes NVML if it is not (with backoff while that fails), enumerates GPUs by UUID when
needed (first run, a count change, a lost GPU, every static refresh), then reads each GPU: its
static samples are replayed, one nvmlDeviceGetFieldValues call serves every field-backed value,
and each area (reader.Area) reads the rest. A GPU that answers GPU_IS_LOST gets
raypulse_gpu_up 0 and the others carry on; it is looked for again by UUID on every run.

NVML runs only in the scheduler's worker thread (and the XID watcher's own thread), never on the
event loop. A hung NVML call is the framework's business: the run is abandoned at its deadline,
the collector is marked stuck, and no new run starts until the call returns.

The NVML module is a parameter: `pynvml` itself, or `exporter.gpusim`'s simulated GPUs, which the
framework chooses (exporter/plugins.py) when `gpu.simulate` asks for them (`exporter serve
--simulate-gpus N`); this code is the same for both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pynvml
from pynvml import NVMLError

from exporter.collectors.gpu import (
    clocks,
    ecc,
    gpm,
    health,
    inventory,
    memory,
    mig,
    nvlink,
    pcie,
    podresources,
    power,
    processes,
    thermal,
    utilization,
)
from exporter.collectors.gpu.device import GpuDevice
from exporter.collectors.gpu.families import COLLECTOR
from exporter.collectors.gpu.reader import (
    DOWN,
    LOST,
    DeviceReader,
    GpuLost,
    NvmlDown,
    NvmlErrors,
    Recorder,
    read_fields,
)
from exporter.collectors.gpu.session import NvmlSession
from exporter.collectors.gpu.xid_watcher import WatchedGpu, XidWatcher
from exporter.config import ExporterConfig
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import NO_PROCESSES, GpuOwners, GpuProcessUsage, Shared
from exporter.framework.snapshot import SampleSink

# Static reads go in this order: gpm and processes use what nvlink's static read found.
AREAS = (inventory.AREA, utilization.AREA, memory.AREA, clocks.AREA, thermal.AREA, power.AREA, pcie.AREA,
         nvlink.AREA, gpm.AREA, ecc.AREA, mig.AREA, processes.AREA)


@register
class GpuCollector(BlockingCollector):
    name = COLLECTOR
    description = ("NVIDIA GPUs through NVML: identity, utilization, GPM activity, memory, clocks and clock "
                   "events, temperatures, power and energy, PCIe, NVLink, ECC and row remapping, MIG, "
                   "per-process use (simulated GPUs with --simulate-gpus N).")
    default_interval = 5.0

    def __init__(self, config: ExporterConfig, shared: Shared | None = None, *, nvml: Any = None,
                 clock: Callable[[], float] = time.monotonic, event_wait_ms: int = 1000) -> None:
        super().__init__(config, shared)
        self.settings = config.gpu
        self.nvml = nvml if nvml is not None else pynvml  # simulated GPUs: exporter/plugins.py passes them
        self.simulated = bool(getattr(self.nvml, "SIMULATED", False))
        self._clock = clock
        self._session = NvmlSession(self.nvml, self.settings.init_retry_max_seconds, clock)
        self._errors = NvmlErrors()
        self._devices: dict[str, GpuDevice] = {}
        self._count: int | None = None
        self._static_due = -float("inf")
        # The XID watcher uses this collector's NVML; its counts are published through the gpu_events
        # collector, which reads them even while a run of this one hangs.
        self._watcher = XidWatcher(self.nvml, wait_ms=event_wait_ms)
        self.shared.gpu_events.publish(self._watcher.state)
        # pid -> its use of each GPU, replaced whole at the end of each run (empty while NVML is down).
        self.shared.gpu_processes.publish(NO_PROCESSES)
        self._owners = podresources.PodResourcesReader(
            self.settings.pod_resources_socket, refresh_seconds=self.settings.pod_resources_refresh_seconds,
            timeout_seconds=self.settings.pod_resources_timeout_seconds, own=podresources.own_pod())

    # -- a run ------------------------------------------------------------------------------------

    def collect(self, out: SampleSink) -> None:
        owners = self._owners.read()
        self.shared.gpu_owners.publish(owners)
        out.add(inventory.POD_RESOURCES_UP, self._owners.up)
        if not self._session.ensure():
            self.shared.gpu_processes.publish(NO_PROCESSES)
        else:
            try:
                self._collect(out, owners)
            except NvmlDown as exc:
                self._nvml_down(str(exc))
                raise
        health.emit(out, self._session, self._errors, self._devices.values(), self.simulated)

    def _collect(self, out: SampleSink, owners: GpuOwners) -> None:
        now = self._clock()
        count = self._device_count()
        out.add(inventory.DEVICES, count)
        static_due = now >= self._static_due
        if static_due:
            self._static_due = now + self.settings.static_refresh_seconds
            for device in self._devices.values():
                device.unsupported.clear()  # support can change (MIG mode, a driver update): ask again
                device.static_read_at = None
        if static_due or count != self._count or any(d.lost for d in self._devices.values()):
            self._enumerate(count)
            self._count = count
            self._owners.check_ids(self._devices)
        # Every run, not only after enumerations: restarts a watcher whose thread has ended.
        self._watcher.watch([WatchedGpu(d.index, d.uuid, d.handle) for d in self._devices.values() if not d.lost])
        table: dict[int, list[GpuProcessUsage]] = {}
        for device in sorted(self._devices.values(), key=lambda d: (d.lost, d.index)):
            if not owners.reports(device.uuid):
                continue  # a sidecar reports its own pod's GPUs; the node's others are their pods' business
            if device.owner != (owner := owners.labels(device.uuid)):
                device.owner = owner
                device.static_read_at = None  # its static samples carry the old owner
            if not device.lost:
                for usage in self._collect_device(device, now, out):
                    table.setdefault(usage.pid, []).append(usage)
            self._emit_identity(device, out)  # after the first read of a new GPU, which learns it
            out.add(inventory.UP, not device.lost, **device.labels)
        processes.emit(out, (usage for uses in table.values() for usage in uses), self.settings.max_process_series,
                       owners)
        self.shared.gpu_processes.publish(MappingProxyType({pid: tuple(uses) for pid, uses in table.items()}))

    def _device_count(self) -> int:
        try:
            return self.nvml.nvmlDeviceGetCount()
        except NVMLError as exc:
            if exc.value in DOWN:
                raise NvmlDown("nvmlDeviceGetCount", exc.value) from None
            self._errors.count("nvmlDeviceGetCount", exc.value)
            raise

    def _enumerate(self, count: int) -> None:
        """Match the GPUs NVML lists now to the ones known, by UUID; the missing ones are lost."""
        seen = set()
        for index in range(count):
            try:
                handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = self.nvml.nvmlDeviceGetUUID(handle)
            except NVMLError as exc:
                if exc.value in DOWN:
                    raise NvmlDown("nvmlDeviceGetHandleByIndex", exc.value) from None
                if exc.value not in LOST:
                    self._errors.count("nvmlDeviceGetHandleByIndex", exc.value)
                continue
            device = self._devices.get(uuid)
            if device is None:
                device = self._devices[uuid] = GpuDevice(uuid, index, handle)
            else:
                device.mark_found(index, handle)
            seen.add(uuid)
        for uuid, device in self._devices.items():
            if uuid not in seen:
                self._lose(device)

    def _collect_device(self, device: GpuDevice, now: float, out: SampleSink) -> list[GpuProcessUsage]:
        """Read one GPU. One that is lost half-way keeps the readings it gave before (they were
        real) and gets up 0; its next runs give nothing but its identity until it is back."""
        started = time.perf_counter()
        try:
            if device.static_read_at is None:
                self._read_static(device, now)
            requests = [request for area in AREAS for request in area.fields(device)]
            reader = DeviceReader(self.nvml, device, self._errors, out,
                                  read_fields(self.nvml, device, requests, self._errors))
            for sample in device.static:
                out.add(sample.spec, sample.value, **sample.labels)
            for area in AREAS:
                area.read(reader)
        except GpuLost:
            self._lose(device)
            out.partial_error()
            return []
        if reader.failed:
            out.partial_error()
        device.collection_seconds = time.perf_counter() - started
        out.add(inventory.COLLECTION_DURATION, device.collection_seconds, **device.labels)
        return reader.processes

    def _read_static(self, device: GpuDevice, now: float) -> None:
        samples = Recorder()
        reader = DeviceReader(self.nvml, device, self._errors, samples)
        for area in AREAS:
            if area.static is not None:
                area.static(reader)
        device.static = samples.samples
        device.static_read_at = now

    def _emit_identity(self, device: GpuDevice, out: SampleSink) -> None:
        versions = self._session.versions
        out.add_info(inventory.INFO, **device.labels, **(device.identity or _NO_IDENTITY),
                     driver_version=versions.get("driver_version", ""),
                     cuda_driver_version=versions.get("cuda_driver_version", ""),
                     simulated=str(self.simulated).lower())
        out.add(inventory.LOST_EVENTS, device.lost_events, **device.labels)

    def _lose(self, device: GpuDevice) -> None:
        device.mark_lost()
        gpm.release(self.nvml, device)
        device.process_names.clear()

    def _nvml_down(self, reason: str) -> None:
        stopped = self._watcher.stop()
        self._session.down(reason, shutdown=stopped)
        self.shared.gpu_processes.publish(NO_PROCESSES)
        for device in self._devices.values():
            device.counters.resync()  # a driver reload restarts every counter
            device.gpm_samples.clear()  # samples of the old NVML session are gone with it
        self._static_due = -float("inf")

    def close(self) -> None:
        # Called on the event loop at shutdown: wait briefly for the watcher's bounded wait, and
        # leave NVML initialized (process exit cleans up) rather than shut it down under the watcher.
        self._owners.close()
        if self._watcher.stop(timeout=0.2):
            self._session.close()


_NO_IDENTITY = dict.fromkeys(("name", "pci_bus_id", "serial", "vbios_version", "compute_capability", "architecture",
                              "brand"), "")
