"""A stand-in for the `pynvml` module (nvidia-ml-py) backed by simulated GPUs.

`SimulatedNvml(count, ...)` has the pynvml functions the GPU collector uses, with the same names,
parameters and return shapes (the same ctypes structs, filled in), and raises pynvml's own
`NVMLError` subclasses with NVML's codes. Every other attribute (constants, error classes, structs)
is pynvml's own, so code written against pynvml runs unchanged; an NVML function that is not
simulated raises AttributeError rather than reaching a real driver.

Faults come from the control file (`exporter.gpusim.control`), re-read when it changes: a lost GPU
raises GPU_IS_LOST on every call on its handle, a hung call blocks until the fault is removed, a
call or field marked not supported answers NOT_SUPPORTED, XIDs and ECC events are delivered to
event sets, and the state faults show in the values.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
import types
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pynvml
from pynvml import NVMLError

from exporter.gpusim import models
from exporter.gpusim.control import Control, ControlReader, Event, GpuControl
from exporter.gpusim.device import MigInstance, SimulatedGpu, handle_key

DRIVER_VERSION = "570.133.20"
NVML_VERSION = "12.570.133.20"
CUDA_DRIVER_VERSION = 12080
_UINT_MAX = 0xFFFFFFFF
_HANG_POLL_SECONDS = 0.02
_EVENT_POLL_SECONDS = 0.2  # events come with a new control file, read at most every 50 ms anyway
# pynvml helpers that are plain Python, not NVML calls: safe to hand out.
_PURE_HELPERS = frozenset({"nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct", "nvmlExceptionClass"})
_EVENT_MASKS = {"xid": pynvml.nvmlEventTypeXidCriticalError, "single_bit_ecc": pynvml.nvmlEventTypeSingleBitEccError,
                "double_bit_ecc": pynvml.nvmlEventTypeDoubleBitEccError,
                "gpu_unavailable": pynvml.nvmlEventTypeGpuUnavailableError,
                "recovery_action": pynvml.nvmlEventTypeGpuRecoveryAction}
SUPPORTED_EVENTS = (pynvml.nvmlEventTypePState | pynvml.nvmlEventTypeClock
                    | functools.reduce(lambda a, b: a | b, _EVENT_MASKS.values()))
# GPM metric -> share of the GPU's utilization it shows during a mixed-precision training step.
_GPM_ACTIVITY = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 1.0, pynvml.NVML_GPM_METRIC_SM_UTIL: 0.9,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 0.42, pynvml.NVML_GPM_METRIC_INTEGER_UTIL: 0.08,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.6, pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: 0.58,
    pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: 0.0, pynvml.NVML_GPM_METRIC_DMMA_TENSOR_UTIL: 0.0,
    pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: 0.02, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 0.5,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: 0.01, pynvml.NVML_GPM_METRIC_FP32_UTIL: 0.18,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 0.07,
}
_GPM_NVLINK_FIRST = pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC  # then L0 TX, L1 RX, L1 TX, ...
_VALUE_MEMBERS = {pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal", pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal"}

F = TypeVar("F", bound=Callable[..., Any])


def _raise(code: int) -> None:
    raise NVMLError(code)


def simulated(*, device: bool = False) -> Callable[[F], F]:
    """Mark an NVML function: check initialization, apply hangs and (for device calls, whose first
    argument is a handle) lost GPUs and NOT_SUPPORTED, then advance the GPU's state."""

    def wrap(method: F) -> F:
        name = method.__name__

        @functools.wraps(method)
        def call(self: SimulatedNvml, *args: Any, **kwargs: Any) -> Any:
            self._enter(name, args[0] if device else None)
            return method(self, *args, **kwargs)

        call.simulated = True  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return wrap


@dataclass
class _GpmSample:
    gpu: int
    gpu_instance_id: int | None
    at: float
    busy_seconds: float
    pcie_bytes: dict[str, int]
    nvlink_kib: dict[str, list[float]]


@dataclass
class _EventSet:
    registered: dict[int, int]  # GPU index -> event mask
    queue: deque[tuple[int, Event]]


class SimulatedNvml:
    """pynvml over `count` simulated GPUs of one model; see the module docstring."""

    SIMULATED = True  # how the collector knows to label its series simulated="true"

    def __init__(self, count: int, model: str = models.DEFAULT_MODEL, control_file: Path | None = None,
                 seed: str = "raypulse", clock: Callable[[], float] = time.monotonic) -> None:
        self.model = models.model(model)
        self._clock = clock
        self._reader = ControlReader(control_file)
        self._control = Control()
        self._lock = threading.RLock()
        now = clock()
        self.gpus = [SimulatedGpu(index, self.model, seed, now) for index in range(count)]
        self._handles: dict[int | None, tuple[SimulatedGpu, MigInstance | None]] = {
            handle_key(gpu.handle): (gpu, None) for gpu in self.gpus}
        self._init_count = 0
        self._event_sets: dict[int, _EventSet] = {}
        self._delivered_seq = dict.fromkeys(range(count), 0)
        self._samples: dict[int | None, _GpmSample | None] = {}
        self._buffers: dict[int | None, ctypes.Array] = {}
        self._apply(self._reader.current())

    def __getattr__(self, name: str) -> Any:
        value = getattr(pynvml, name)
        if name.startswith("nvml") and isinstance(value, types.FunctionType) and name not in _PURE_HELPERS:
            raise AttributeError(f"{name} is not simulated by exporter.gpusim")
        return value

    # -- plumbing ---------------------------------------------------------------------------------

    def _enter(self, name: str, handle: object | None) -> None:
        if name not in ("nvmlInit", "nvmlInitWithFlags") and self._init_count == 0:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)
        control = self._refresh()
        target = None
        if handle is not None:
            target = self._handles.get(handle_key(handle))
            if target is None:
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = target[0] if target else None
        while name in control.hang or (gpu is not None and name in control.gpu(gpu.index).hang):
            time.sleep(_HANG_POLL_SECONDS)  # a wedged driver call: blocks until the fault is removed
            control = self._refresh()
        faults = control.gpu(gpu.index) if gpu is not None else None
        if faults is not None:
            if faults.lost:
                _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
            if not gpu.model.supports(name) or name in control.not_supported or name in faults.not_supported:
                _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        error = (faults.errors.get(name) if faults is not None else None) or control.errors.get(name)
        if error is not None:
            _raise(getattr(pynvml, "NVML_ERROR_" + error))
        if gpu is None or faults is None:
            return
        with self._lock:
            gpu.advance(self._clock(), faults, control.load)

    def _refresh(self) -> Control:
        control = self._reader.current()
        if control is not self._control:  # events only arrive with a new control file
            with self._lock:
                self._apply(control)
        return control

    def _apply(self, control: Control) -> None:
        self._control = control
        for gpu in self.gpus:
            gpu.set_mig(control.gpu(gpu.index).mig)
            for instance in gpu.mig:
                self._handles[handle_key(instance.handle)] = (gpu, instance)
        self._dispatch_events()

    def _dispatch_events(self) -> None:
        """Hand new events to the event sets listening on their GPU; keep them until one listens."""
        if not self._event_sets:
            return
        with self._lock:
            for gpu in self.gpus:
                pending = [e for e in self._control.gpu(gpu.index).events if e.seq > self._delivered_seq[gpu.index]]
                listeners = [s for s in self._event_sets.values() if gpu.index in s.registered]
                if not pending or not listeners:
                    continue
                for event_set in listeners:
                    mask = event_set.registered[gpu.index]
                    event_set.queue.extend((gpu.index, e) for e in pending if _EVENT_MASKS[e.type] & mask)
                self._delivered_seq[gpu.index] = pending[-1].seq

    def _target(self, handle: object) -> tuple[SimulatedGpu, MigInstance | None]:
        return self._handles[handle_key(handle)]

    def _gpu(self, handle: object) -> SimulatedGpu:
        return self._handles[handle_key(handle)][0]

    def _faults(self, gpu: SimulatedGpu) -> GpuControl:
        return self._control.gpu(gpu.index)

    def _now_us(self) -> int:
        return int(time.time() * 1e6)

    def _alloc(self, pointer_type: Any) -> Any:
        buffer = ctypes.create_string_buffer(8)
        pointer = ctypes.cast(buffer, pointer_type)
        self._buffers[handle_key(pointer)] = buffer
        return pointer

    # -- system -----------------------------------------------------------------------------------

    @simulated()
    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    @simulated()
    def nvmlInitWithFlags(self, flags: int) -> None:
        error = self._control.init_error
        if error is not None:
            _raise(getattr(pynvml, "NVML_ERROR_" + error))
        with self._lock:
            self._init_count += 1

    @simulated()
    def nvmlShutdown(self) -> None:
        with self._lock:
            self._init_count = max(0, self._init_count - 1)

    @simulated()
    def nvmlSystemGetDriverVersion(self) -> str:
        return DRIVER_VERSION

    @simulated()
    def nvmlSystemGetNVMLVersion(self) -> str:
        return NVML_VERSION

    @simulated()
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return CUDA_DRIVER_VERSION

    @simulated()
    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return CUDA_DRIVER_VERSION

    @simulated()
    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for gpu in self.gpus:
            for process in self._faults(gpu).processes:
                if process.pid == pid:
                    return process.name
        raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    @simulated()
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    @simulated()
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        if not 0 <= index < len(self.gpus):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if self._faults(gpu).lost:
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu.handle

    @simulated()
    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> object:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                if self._faults(gpu).lost:
                    _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
                return gpu.handle
        raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    # -- identity ---------------------------------------------------------------------------------

    @simulated(device=True)
    def nvmlDeviceGetUUID(self, handle: object) -> str:
        gpu, instance = self._target(handle)
        return instance.uuid if instance else gpu.uuid

    @simulated(device=True)
    def nvmlDeviceGetName(self, handle: object) -> str:
        gpu, instance = self._target(handle)
        return f"{gpu.model.name} MIG {instance.profile}" if instance else gpu.model.name

    @simulated(device=True)
    def nvmlDeviceGetSerial(self, handle: object) -> str:
        return self._gpu(handle).serial

    @simulated(device=True)
    def nvmlDeviceGetVbiosVersion(self, handle: object) -> str:
        return self._gpu(handle).model.vbios

    @simulated(device=True)
    def nvmlDeviceGetPciInfo_v3(self, handle: object) -> Any:
        gpu = self._gpu(handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = gpu.pci_bus_id[4:].encode()
        info.domain, info.bus, info.device = 0, int(gpu.pci_bus_id[9:11], 16), 0
        info.pciDeviceId = gpu.model.pcie_device_id
        info.pciSubSystemId = 0x16C110DE
        return info

    def nvmlDeviceGetPciInfo(self, handle: object) -> Any:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    @simulated(device=True)
    def nvmlDeviceGetCudaComputeCapability(self, handle: object) -> tuple[int, int]:
        return self._gpu(handle).model.compute_capability

    @simulated(device=True)
    def nvmlDeviceGetBrand(self, handle: object) -> int:
        return self._gpu(handle).model.brand

    @simulated(device=True)
    def nvmlDeviceGetArchitecture(self, device: object) -> int:
        return self._gpu(device).model.architecture

    @simulated(device=True)
    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        return self._gpu(handle).index

    @simulated(device=True)
    def nvmlDeviceGetIndex(self, handle: object) -> int:
        return self._gpu(handle).index

    # -- modes and states -------------------------------------------------------------------------

    @simulated(device=True)
    def nvmlDeviceGetPersistenceMode(self, handle: object) -> int:
        return pynvml.NVML_FEATURE_ENABLED

    @simulated(device=True)
    def nvmlDeviceGetComputeMode(self, handle: object) -> int:
        return pynvml.NVML_COMPUTEMODE_DEFAULT

    @simulated(device=True)
    def nvmlDeviceGetMigMode(self, device: object) -> list[int]:
        enabled = int(bool(self._gpu(device).mig))
        return [enabled, enabled]

    @simulated(device=True)
    def nvmlDeviceGetEccMode(self, handle: object) -> list[int]:
        return [pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_ENABLED]

    @simulated(device=True)
    def nvmlDeviceGetPerformanceState(self, handle: object) -> int:
        gpu = self._gpu(handle)
        idle = gpu.utilization < 0.05
        return pynvml.NVML_PSTATE_8 if idle and gpu.model.fans else pynvml.NVML_PSTATE_0

    @simulated(device=True)
    def nvmlDeviceGetGpuFabricInfoV(self, device: object, gpuFabricInfo: Any) -> int:
        info = gpuFabricInfo._obj if hasattr(gpuFabricInfo, "_obj") else gpuFabricInfo  # byref() or the struct
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        info.status = pynvml.NVML_SUCCESS
        info.cliqueId = 1
        return pynvml.NVML_SUCCESS

    # -- utilization and memory -------------------------------------------------------------------

    @simulated(device=True)
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Any:
        gpu = self._gpu(handle)
        if gpu.mig:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)  # as on real MIG-enabled GPUs
        utilization = pynvml.c_nvmlUtilization_t()
        utilization.gpu = round(gpu.utilization * 100)
        utilization.memory = round(gpu.utilization * 45)
        return utilization

    @simulated(device=True)
    def nvmlDeviceGetEncoderUtilization(self, handle: object) -> list[int]:
        return [0, 167000]

    @simulated(device=True)
    def nvmlDeviceGetDecoderUtilization(self, handle: object) -> list[int]:
        return [0, 167000]

    @simulated(device=True)
    def nvmlDeviceGetMemoryInfo(self, handle: object, version: int | None = None) -> Any:
        gpu, instance = self._target(handle)
        faults = self._faults(gpu)
        if instance is not None:
            total = instance.memory_bytes
            used = int(total * 0.6 * gpu.utilization) + 64 * models.MIB
            reserved = 0
        else:
            processes = sum(p.memory_bytes for p in faults.processes) if faults.processes else None
            total, reserved = gpu.model.memory_bytes, gpu.model.reserved_bytes
            used = gpu.memory_used(processes, self._control.load, faults)
        if not version:
            memory = pynvml.c_nvmlMemory_t()
        else:
            memory = pynvml.c_nvmlMemory_v2_t()
            memory.version = version
            memory.reserved = reserved
        memory.total, memory.used, memory.free = total, used, total - used
        return memory

    @simulated(device=True)
    def nvmlDeviceGetBAR1MemoryInfo(self, handle: object) -> Any:
        gpu = self._gpu(handle)
        memory = pynvml.c_nvmlBAR1Memory_t()
        memory.bar1Total = gpu.model.bar1_bytes
        memory.bar1Used = 34 * models.MIB + int(gpu.utilization * 512 * models.MIB)
        memory.bar1Free = memory.bar1Total - memory.bar1Used
        return memory

    # -- clocks, thermal, power -------------------------------------------------------------------

    @simulated(device=True)
    def nvmlDeviceGetClockInfo(self, handle: object, type: int) -> int:
        return self._gpu(handle).clock_mhz(type)

    @simulated(device=True)
    def nvmlDeviceGetMaxClockInfo(self, handle: object, type: int) -> int:
        return self._gpu(handle).model.max_clocks_mhz[type]

    @simulated(device=True)
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> int:
        return self._gpu(handle).reasons

    @simulated(device=True)
    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        return round(self._gpu(handle).temperature_c)

    @simulated(device=True)
    def nvmlDeviceGetTemperatureV(self, handle: object, sensor: int, version: int = pynvml.nvmlTemperature_v1) -> int:
        if version != pynvml.nvmlTemperature_v1:
            _raise(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return round(self._gpu(handle).temperature_c)

    @simulated(device=True)
    def nvmlDeviceGetTemperatureThreshold(self, handle: object, threshold: int) -> int:
        thresholds = self._gpu(handle).model.thresholds_c
        if threshold not in thresholds:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return thresholds[threshold]

    @simulated(device=True)
    def nvmlDeviceGetMarginTemperature(self, handle: object) -> int:
        gpu = self._gpu(handle)
        return round(gpu.model.thresholds_c[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] - gpu.temperature_c)

    @simulated(device=True)
    def nvmlDeviceGetNumFans(self, device: object) -> int:
        return self._gpu(device).model.fans

    @simulated(device=True)
    def nvmlDeviceGetFanSpeed_v2(self, handle: object, fan: int) -> int:
        gpu = self._gpu(handle)
        if fan >= gpu.model.fans:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED if not gpu.model.fans else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(30 + 0.7 * max(0.0, gpu.temperature_c - 30))

    @simulated(device=True)
    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
        return round(self._gpu(handle).power_w * 1000)

    @simulated(device=True)
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:
        return int(self._gpu(handle).energy_mj)

    @simulated(device=True)
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object) -> int:
        return round(self._gpu(handle).model.power_limit_w * 1000)

    @simulated(device=True)
    def nvmlDeviceGetPowerManagementLimit(self, handle: object) -> int:
        return round(self._gpu(handle).model.power_limit_w * 1000)

    @simulated(device=True)
    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: object) -> int:
        return round(self._gpu(handle).model.power_limit_w * 1000)

    @simulated(device=True)
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: object) -> list[int]:
        model = self._gpu(handle).model
        return [round(model.power_min_w * 1000), round(model.power_limit_w * 1000)]

    # -- PCIe and NVLink --------------------------------------------------------------------------

    @simulated(device=True)
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: object) -> int:
        gpu = self._gpu(handle)
        return 1 if gpu.utilization < 0.05 else gpu.model.pcie_generation  # links downtrain when idle

    @simulated(device=True)
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: object) -> int:
        return self._gpu(handle).model.pcie_generation

    @simulated(device=True)
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: object) -> int:
        return 16

    @simulated(device=True)
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: object) -> int:
        return 16

    @simulated(device=True)
    def nvmlDeviceGetPcieReplayCounter(self, handle: object) -> int:
        return int(self._gpu(handle).pcie_replays) & _UINT_MAX

    @simulated(device=True)
    def nvmlDeviceGetNvLinkState(self, device: object, link: int) -> int:
        gpu = self._gpu(device)
        if not 0 <= link < gpu.model.nvlink_links:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if gpu.link_up(link) else pynvml.NVML_FEATURE_DISABLED

    # -- ECC and memory health --------------------------------------------------------------------

    @simulated(device=True)
    def nvmlDeviceGetTotalEccErrors(self, handle: object, errorType: int, counterType: int) -> int:
        gpu = self._gpu(handle)
        faults = self._faults(gpu)
        corrected = errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        count = faults.ecc_sbe if corrected else faults.ecc_dbe
        if counterType == pynvml.NVML_AGGREGATE_ECC and corrected:
            count += gpu.lifetime_sbe
        return count

    @simulated(device=True)
    def nvmlDeviceGetMemoryErrorCounter(self, handle: object, errorType: int, counterType: int,
                                        locationType: int) -> int:
        gpu = self._gpu(handle)
        if locationType not in gpu.model.ecc_locations:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if locationType != pynvml.NVML_MEMORY_LOCATION_DEVICE_MEMORY:
            return 0  # injected errors are DRAM errors
        return self.nvmlDeviceGetTotalEccErrors(handle, errorType, counterType)

    @simulated(device=True)
    def nvmlDeviceGetRetiredPages(self, device: object, sourceFilter: int) -> list[int]:
        faults = self._faults(self._gpu(device))
        count = faults.ecc_dbe if sourceFilter == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else (
            faults.ecc_sbe // 2)
        return [0x1F000 + 0x1000 * n for n in range(count)]

    @simulated(device=True)
    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: object) -> int:
        return int(self._faults(self._gpu(device)).row_remap_pending)

    @simulated(device=True)
    def nvmlDeviceGetRemappedRows(self, device: object) -> tuple[int, int, int, int]:
        faults = self._faults(self._gpu(device))
        return (faults.ecc_sbe // 2, faults.ecc_dbe, int(faults.row_remap_pending), int(faults.row_remap_failed))

    @simulated(device=True)
    def nvmlDeviceGetRowRemapperHistogram(self, device: object) -> Any:
        faults = self._faults(self._gpu(device))
        values = pynvml.c_nvmlRowRemapperHistogramValues()
        used = faults.ecc_dbe + faults.ecc_sbe // 2
        values.max, values.high, values.partial, values.low, values.none = (
            max(0, 640 - used), min(used, 640), 0, 0, 640 if faults.row_remap_failed else 0)
        return values

    # -- field values -----------------------------------------------------------------------------

    @simulated(device=True)
    def nvmlDeviceGetFieldValues(self, handle: object, fieldIds: list[int | tuple[int, int]]) -> Any:
        gpu = self._gpu(handle)
        faults = self._faults(gpu)
        unsupported = set(self._control.not_supported) | set(faults.not_supported)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        table = _FieldTable(gpu, faults)
        now_us = self._now_us()
        set_ = ctypes.Structure.__setattr__  # numbers only: skip pynvml's str-conversion hook
        for i, field_id in enumerate(fieldIds):
            fid, scope = field_id if isinstance(field_id, tuple) else (field_id, 0)
            value = values[i]
            set_(value, "fieldId", fid)
            set_(value, "scopeId", scope)
            set_(value, "timestamp", now_us)
            if fid not in gpu.model.fields or _field_names(fid) & unsupported:
                set_(value, "nvmlReturn", pynvml.NVML_ERROR_NOT_SUPPORTED)
                continue
            reading = table.value(fid, scope)
            if reading is None:
                set_(value, "nvmlReturn", pynvml.NVML_ERROR_INVALID_ARGUMENT)
                continue
            value_type, number = reading
            set_(value, "valueType", value_type)
            setattr(ctypes.Structure.__getattribute__(value, "value"), _VALUE_MEMBERS.get(value_type, "ullVal"),
                    number)
            set_(value, "nvmlReturn", pynvml.NVML_SUCCESS)
        return values

    # -- processes --------------------------------------------------------------------------------

    def _processes(self, handle: object) -> list[Any]:
        gpu = self._gpu(handle)
        processes = []
        for n, process in enumerate(self._faults(gpu).processes):
            info = pynvml.c_nvmlProcessInfo_v3_t()
            info.pid, info.usedGpuMemory = process.pid, process.memory_bytes
            instance = gpu.mig[n % len(gpu.mig)] if gpu.mig else None
            info.gpuInstanceId = instance.gpu_instance_id if instance else _UINT_MAX
            info.computeInstanceId = 0 if instance else _UINT_MAX
            processes.append(pynvml.nvmlStructToFriendlyObject(info))
        return processes

    @simulated(device=True)
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Any]:
        return self._processes(handle)

    @simulated(device=True)
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: object) -> list[Any]:
        return []

    def _utilization_samples(self, handle: object, timeStamp: int) -> list[tuple[int, int, int]]:
        gpu = self._gpu(handle)
        processes = self._faults(gpu).processes
        if gpu.mig:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now_us = self._now_us()
        if not processes or now_us <= timeStamp:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)  # no samples since timeStamp
        even_share = gpu.utilization / len(processes)
        return [(p.pid, round(100 * (p.sm_utilization if p.sm_utilization is not None else even_share)),
                 round(45 * even_share)) for p in processes]

    @simulated(device=True)
    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: object, timeStamp: int) -> list[Any]:
        samples = self._utilization_samples(handle, timeStamp)
        array = (pynvml.c_nvmlProcessUtilizationInfo_v1_t * len(samples))()
        for entry, (pid, sm, memory) in zip(array, samples, strict=True):
            entry.timeStamp, entry.pid, entry.smUtil, entry.memUtil = self._now_us(), pid, sm, memory
        return array[0:len(samples)]

    @simulated(device=True)
    def nvmlDeviceGetProcessUtilization(self, handle: object, timeStamp: int) -> list[Any]:
        samples = self._utilization_samples(handle, timeStamp)
        array = (pynvml.c_nvmlProcessUtilizationSample_t * len(samples))()
        for entry, (pid, sm, memory) in zip(array, samples, strict=True):
            entry.timeStamp, entry.pid, entry.smUtil, entry.memUtil = self._now_us(), pid, sm, memory
        return array[0:len(samples)]

    # -- MIG --------------------------------------------------------------------------------------

    @simulated(device=True)
    def nvmlDeviceGetMaxMigDeviceCount(self, device: object) -> int:
        return self._gpu(device).model.mig_slices

    @simulated(device=True)
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: object, index: int) -> object:
        gpu = self._gpu(device)
        if not 0 <= index < len(gpu.mig):
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu.mig[index].handle

    def _instance(self, handle: object) -> MigInstance:
        instance = self._target(handle)[1]
        if instance is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not a MIG device handle
        return instance  # type: ignore[return-value]

    @simulated(device=True)
    def nvmlDeviceGetGpuInstanceId(self, device: object) -> int:
        return self._instance(device).gpu_instance_id

    @simulated(device=True)
    def nvmlDeviceGetComputeInstanceId(self, device: object) -> int:
        self._instance(device)
        return 0

    @simulated(device=True)
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: object) -> object:
        self._instance(migDevice)
        return self._gpu(migDevice).handle

    @simulated(device=True)
    def nvmlDeviceIsMigDeviceHandle(self, device: object) -> Any:
        return ctypes.c_uint(int(self._target(device)[1] is not None))

    # -- GPM --------------------------------------------------------------------------------------

    @simulated(device=True)
    def nvmlGpmQueryDeviceSupport(self, device: object) -> Any:
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(self._gpu(device).model.gpm)
        return support

    @simulated()
    def nvmlGpmSampleAlloc(self) -> Any:
        sample = self._alloc(pynvml.c_nvmlGpmSample_t)
        self._samples[handle_key(sample)] = None
        return sample

    @simulated()
    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        key = handle_key(gpmSample)
        if key not in self._samples:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        del self._samples[key]
        self._buffers.pop(key, None)

    def _take_sample(self, device: object, gpu_instance_id: int | None, gpmSample: Any) -> Any:
        gpu = self._gpu(device)
        if not gpu.model.gpm:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        key = handle_key(gpmSample)
        if key not in self._samples:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._samples[key] = _GpmSample(gpu.index, gpu_instance_id, self._clock(), gpu.busy_seconds,
                                        dict(gpu.pcie_bytes), {d: list(v) for d, v in gpu.nvlink_kib.items()})
        return gpmSample

    @simulated(device=True)
    def nvmlGpmSampleGet(self, device: object, gpmSample: Any) -> Any:
        return self._take_sample(device, None, gpmSample)

    @simulated(device=True)
    def nvmlGpmMigSampleGet(self, device: object, gpuInstanceId: int, gpmSample: Any) -> Any:
        gpu = self._gpu(device)
        if gpuInstanceId not in {i.gpu_instance_id for i in gpu.mig}:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        return self._take_sample(device, gpuInstanceId, gpmSample)

    @simulated()
    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        first, second = (self._samples.get(handle_key(s)) for s in (metricsGet.sample1, metricsGet.sample2))
        if first is None or second is None or (first.gpu, first.gpu_instance_id) != (
                second.gpu, second.gpu_instance_id) or second.at <= first.at:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        seconds = second.at - first.at
        busy = (second.busy_seconds - first.busy_seconds) / seconds
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            value = _gpm_value(metric.metricId, busy, first, second, seconds, first.gpu_instance_id is not None)
            metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if value is None else pynvml.NVML_SUCCESS
            metric.value = value or 0.0
        return metricsGet

    # -- events -----------------------------------------------------------------------------------

    @simulated()
    def nvmlEventSetCreate(self) -> Any:
        event_set = self._alloc(pynvml.c_nvmlEventSet_t)
        with self._lock:
            self._event_sets[handle_key(event_set)] = _EventSet({}, deque())
        return event_set

    @simulated(device=True)
    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:
        return SUPPORTED_EVENTS

    @simulated(device=True)
    def nvmlDeviceRegisterEvents(self, handle: object, eventTypes: int, eventSet: Any) -> None:
        event_set = self._event_sets.get(handle_key(eventSet))
        if event_set is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if eventTypes & ~SUPPORTED_EVENTS:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            gpu = self._gpu(handle)
            event_set.registered[gpu.index] = event_set.registered.get(gpu.index, 0) | eventTypes
        self._dispatch_events()

    @simulated()
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        event_set = self._event_sets.get(handle_key(eventSet))
        if event_set is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + timeoutms / 1000
        while True:
            with self._lock:
                if event_set.queue:
                    index, event = event_set.queue.popleft()
                    data = pynvml.c_nvmlEventData_t()
                    data.device = self.gpus[index].handle
                    data.eventType, data.eventData = _EVENT_MASKS[event.type], event.data
                    data.gpuInstanceId = data.computeInstanceId = _UINT_MAX
                    return data
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _raise(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(_EVENT_POLL_SECONDS, remaining))
            self._enter("nvmlEventSetWait_v2", None)  # picks up new events, and hangs if told to

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    @simulated()
    def nvmlEventSetFree(self, eventSet: Any) -> None:
        with self._lock:
            if self._event_sets.pop(handle_key(eventSet), None) is None:
                _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._buffers.pop(handle_key(eventSet), None)


@functools.cache
def _field_names(field_id: int) -> frozenset[str]:
    """Every pynvml name of a field ID (some have two, e.g. PERF_POLICY_POWER and ..._SW_POWER_CAP)."""
    return frozenset(name for name in dir(pynvml)
                     if name.startswith("NVML_FI_") and name != "NVML_FI_MAX" and getattr(pynvml, name) == field_id)


class _FieldTable:
    """The values of every field for one GPU at one instant, built once per nvmlDeviceGetFieldValues."""

    _PER_LINK = frozenset({pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                           pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
                           *models.NVLINK5_ERRORS, pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS,
                           pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_PACKETS,
                           pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS,
                           pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS})
    _THROUGHPUT: ClassVar[dict[int, tuple[str, float]]] = {pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: ("tx", 1.0),
                   pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: ("rx", 1.0),
                   pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: ("tx", 1.08),
                   pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: ("rx", 1.08)}

    def __init__(self, gpu: SimulatedGpu, faults: GpuControl) -> None:
        self.gpu = gpu
        ull, ui = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        reasons, crc = gpu.reason_ns, sum(gpu.nvlink_crc)
        self.simple: dict[int, tuple[int, float]] = {
            pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: (ull, int(crc)),
            pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: (ull, int(crc * 0.1)),
            pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: (ull, int(crc * 0.3)),
            pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: (ull, sum(gpu.nvlink_recoveries)),
            pynvml.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL: (ull, 0),
            pynvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: (ui, gpu.model.nvlink_speed_mbps),
            pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: (ui, gpu.model.nvlink_links),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (ui, int(gpu.pcie_replays)),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER: (ui, 0),
            pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER: (ui, int(gpu.pcie_correctable / 2)),
            pynvml.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS: (ui, int(gpu.pcie_correctable)),
            pynvml.NVML_FI_DEV_POWER_AVERAGE: (ui, round(gpu.power_w * 1000)),
            pynvml.NVML_FI_DEV_POWER_INSTANT: (ui, round(gpu.power_w * 1000 * (1 + 0.04 * (gpu.utilization - 0.5)))),
            pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT: (ui, round(gpu.model.power_limit_w * 1000)),
            pynvml.NVML_FI_DEV_ENERGY: (ull, int(gpu.energy_mj)),
            # The simulator reports the PCIe byte counters as 32-bit values, so they wrap within
            # minutes under load and the collector's unwrapping is exercised.
            pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (ui, gpu.pcie_bytes["tx"] & _UINT_MAX),
            pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (ui, gpu.pcie_bytes["rx"] & _UINT_MAX),
            pynvml.NVML_FI_DEV_MEMORY_TEMP: (ui, round(gpu.temperature_c + 6)),
            pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (ui, faults.recovery_action),
            pynvml.NVML_FI_DEV_PERF_POLICY_POWER: (ull, int(reasons["sw_power_cap"])),
            pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: (ull, int(reasons["sw_thermal_slowdown"]
                                                              + reasons["hw_thermal_slowdown"])),
            pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: (ull, 0),
            pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: (ull, 0),
            pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: (ull, int(reasons["gpu_idle"])),
            pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY: (ull, 0),
            pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS: (ull, int(sum(reasons.values()) - reasons["gpu_idle"])),
            pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS: (ull, int(reasons["hw_slowdown"])),
            pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: (ull, int(reasons["sw_thermal_slowdown"])),
            pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: (ull, int(reasons["hw_thermal_slowdown"])),
            pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: (
                ull, int(reasons["hw_power_brake_slowdown"])),
        }
        for fid in range(pynvml.NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED, pynvml.NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR + 1):
            self.simple[fid] = (ui, 0)  # uncorrectable PCIe errors: none on a healthy link

    def value(self, fid: int, scope: int) -> tuple[int, float] | None:
        """(value type, value) of one field, or None for a scope the field does not have."""
        gpu, links = self.gpu, self.gpu.model.nvlink_links
        if fid in self._PER_LINK:
            if not 0 <= scope < links:
                return None
            return _per_link_value(gpu, fid, scope)
        if fid in self._THROUGHPUT:
            direction, factor = self._THROUGHPUT[fid]
            per_link_kib = gpu.nvlink_kib[direction]
            if scope == _UINT_MAX:
                return pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, int(sum(per_link_kib) * factor)
            if not 0 <= scope < links:
                return None
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, int(per_link_kib[scope] * factor)
        return self.simple.get(fid)


def _per_link_value(gpu: SimulatedGpu, fid: int, link: int) -> tuple[int, float]:
    ull = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    if fid == pynvml.NVML_FI_DEV_NVLINK_GET_STATE:
        state = pynvml.NVML_NVLINK_STATE_ACTIVE if gpu.link_up(link) else pynvml.NVML_NVLINK_STATE_INACTIVE
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, state
    if fid == pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC:
        return ull, int(gpu.nvlink_crc[link])
    if fid == pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY:
        return ull, int(gpu.nvlink_crc[link] * 0.3)
    if fid == pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY:
        return ull, gpu.nvlink_recoveries[link]
    return ull, _nvlink5_value(gpu, fid, link)


def _nvlink5_value(gpu: SimulatedGpu, fid: int, link: int) -> float:
    if fid == pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS:
        return int(gpu.nvlink_kib["tx"][link] / 0.25)
    if fid == pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_PACKETS:
        return int(gpu.nvlink_kib["rx"][link] / 0.25)
    if fid == pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS:
        return 0
    if fid == pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS:
        return gpu.nvlink_recoveries[link]
    if models.NVLINK5_ERRORS[fid] == "symbol":
        return int(gpu.nvlink_crc[link] * 40)  # FEC corrects most symbol errors
    if models.NVLINK5_ERRORS[fid] == "effective":
        return int(gpu.nvlink_crc[link])
    return 0


def _gpm_value(metric: int, busy: float, first: _GpmSample, second: _GpmSample, seconds: float,
               mig: bool) -> float | None:
    if metric in _GPM_ACTIVITY:
        return 100.0 * _GPM_ACTIVITY[metric] * busy
    if mig:
        return None  # interconnect metrics are per GPU, not per instance
    if metric in (pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC):
        direction = "tx" if metric == pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC else "rx"
        return (second.pcie_bytes[direction] - first.pcie_bytes[direction]) / seconds / (1 << 20)
    offset = metric - _GPM_NVLINK_FIRST
    link, direction = divmod(offset, 2)
    if 0 <= link < len(first.nvlink_kib["tx"]):
        side = "tx" if direction else "rx"
        return (second.nvlink_kib[side][link] - first.nvlink_kib[side][link]) / seconds / 1024
    return None
