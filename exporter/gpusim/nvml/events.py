"""Event sets over simulated GPUs (exporter/collectors/gpu/xid_watcher.py waits on them): the XIDs and
ECC, unavailable and recovery-action events the control file injects, delivered to every set
registered for their GPU and type.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from typing import Any

import pynvml

from exporter.gpusim.device import handle_key
from exporter.gpusim.nvml.base import _EVENT_MASKS, _UINT_MAX, NvmlBase, _EventSet, _raise, simulated

_EVENT_POLL_SECONDS = 0.2  # events come with a new control file, read at most every 50 ms anyway
SUPPORTED_EVENTS = (pynvml.nvmlEventTypePState | pynvml.nvmlEventTypeClock
                    | functools.reduce(lambda a, b: a | b, _EVENT_MASKS.values()))


class Events(NvmlBase):
    """Event sets: create, register, wait, free."""

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
