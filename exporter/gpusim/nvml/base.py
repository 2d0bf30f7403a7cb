"""The simulated NVML's plumbing, shared by every area: the GPUs and their handles, the control file
(re-read when it changes) and what it injects into every call (`simulated`: not initialized, hangs,
lost GPUs, NOT_SUPPORTED, injected errors), and the event sets its new events are handed to.

Every other attribute of pynvml (constants, error classes, structs, pure helpers) is pynvml's own; an
NVML function no area simulates raises AttributeError rather than reaching a real driver.
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
from typing import Any, TypeVar

import pynvml
from pynvml import NVMLError

from exporter.gpusim import models
from exporter.gpusim.control import Control, ControlReader, Event, GpuControl
from exporter.gpusim.device import MigInstance, SimulatedGpu, handle_key

_UINT_MAX = 0xFFFFFFFF
_HANG_POLL_SECONDS = 0.02
# pynvml helpers that are plain Python, not NVML calls: safe to hand out.
_PURE_HELPERS = frozenset({"nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct", "nvmlExceptionClass"})
_EVENT_MASKS = {"xid": pynvml.nvmlEventTypeXidCriticalError, "single_bit_ecc": pynvml.nvmlEventTypeSingleBitEccError,
                "double_bit_ecc": pynvml.nvmlEventTypeDoubleBitEccError,
                "gpu_unavailable": pynvml.nvmlEventTypeGpuUnavailableError,
                "recovery_action": pynvml.nvmlEventTypeGpuRecoveryAction}

F = TypeVar("F", bound=Callable[..., Any])


def _raise(code: int) -> None:
    raise NVMLError(code)


def simulated(*, device: bool = False) -> Callable[[F], F]:
    """Mark an NVML function: check initialization, apply hangs and (for device calls, whose first
    argument is a handle) lost GPUs and NOT_SUPPORTED, then advance the GPU's state."""

    def wrap(method: F) -> F:
        name = method.__name__

        @functools.wraps(method)
        def call(self: NvmlBase, *args: Any, **kwargs: Any) -> Any:
            self._enter(name, args[0] if device else None)
            return method(self, *args, **kwargs)

        call.simulated = True  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return wrap


@dataclass
class _EventSet:
    registered: dict[int, int]  # GPU index -> event mask
    queue: deque[tuple[int, Event]]


@dataclass
class _GpmSample:
    """A GPM sample's snapshot of one GPU (gpm.py takes and compares them; the base holds them)."""

    gpu: int
    gpu_instance_id: int | None
    at: float
    busy_seconds: float
    pcie_bytes: dict[str, int]
    nvlink_kib: dict[str, list[float]]


class NvmlBase:
    """The simulated GPUs, their handles, the control file's faults and the state the NVML areas
    share (event sets, GPM samples); every area of exporter/gpusim/nvml/ derives from it."""

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
