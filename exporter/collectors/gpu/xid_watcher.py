"""The XID watcher: a thread of its own that waits for NVML events and counts them.

XIDs are the driver's error reports (79: fallen off the bus, 48: double-bit ECC, 94/95: contained /
uncontained ECC error, 119: GSP timeout ...). They arrive as NVML events, so the watcher blocks in
`nvmlEventSetWait_v2` with a bounded wait (it notices shutdown and new GPUs within a second), and
its counts live here, outside the collection run: they stay visible through the `gpu_events`
collector while the GPU collector itself fails or hangs. Counts are since the exporter started.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pynvml
from pynvml import NVMLError

from exporter.collectors.gpu.reader import error_name
from exporter.framework.shared import GpuEvents

log = logging.getLogger(__name__)

EVENT_TYPES = {
    pynvml.nvmlEventTypeXidCriticalError: "xid",
    pynvml.nvmlEventTypeSingleBitEccError: "single_bit_ecc",
    pynvml.nvmlEventTypeDoubleBitEccError: "double_bit_ecc",
    pynvml.nvmlEventTypeGpuUnavailableError: "gpu_unavailable",
    pynvml.nvmlEventTypeGpuRecoveryAction: "recovery_action",
}
WANTED = sum(EVENT_TYPES)
_BACKOFF_MAX_SECONDS = 30.0


@dataclass(frozen=True)
class WatchedGpu:
    index: int
    uuid: str
    handle: Any = field(compare=False)  # ctypes pointers compare by identity; the address below does not

    @property
    def address(self) -> int | None:
        return _handle_key(self.handle)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WatchedGpu) and (self.index, self.uuid, self.address) == (
            other.index, other.uuid, other.address)

    def __hash__(self) -> int:
        return hash((self.index, self.uuid, self.address))


def _handle_key(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


@dataclass
class _Counts:
    xids: dict[tuple[int, str, int], tuple[int, float]] = field(default_factory=dict)
    events: Counter[tuple[int, str, str]] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


class XidWatcher:
    def __init__(self, nvml: Any, wait_ms: int = 1000, clock: Callable[[], float] = time.time) -> None:
        self.nvml = nvml
        self.wait_ms = wait_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._counts = _Counts()
        self._wanted: tuple[WatchedGpu, ...] = ()
        self._registered: tuple[WatchedGpu, ...] | None = None
        self._by_handle: dict[int | None, WatchedGpu] = {}
        self._event_set: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._alive_at = -float("inf")  # monotonic time the last wait returned

    # -- control, from the collector's thread -------------------------------------------------------

    def watch(self, gpus: Sequence[WatchedGpu]) -> None:
        """The GPUs to listen to; the watcher re-registers when they change, and starts if needed."""
        self._wanted = tuple(gpus)
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpu-xid-watcher", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread; True if it ended (False: stuck inside an NVML call)."""
        self._stop.set()
        thread = self._thread
        if thread is None:
            return True
        thread.join(self.wait_ms / 1000 * 2 + 1 if timeout is None else timeout)
        return not thread.is_alive()

    def state(self) -> GpuEvents:
        """An immutable copy of what the watcher has seen (any thread may call it)."""
        with self._lock:
            fresh = time.monotonic() - self._alive_at < self.wait_ms / 1000 * 3 + 1
            running = self._thread is not None and self._thread.is_alive() and not self._stop.is_set()
            return GpuEvents(up=running and fresh and self._event_set is not None,
                                xids=MappingProxyType(dict(self._counts.xids)),
                                events=MappingProxyType(dict(self._counts.events)),
                                errors=MappingProxyType(dict(self._counts.errors)))

    # -- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        delay = 1.0
        while not self._stop.is_set():
            try:
                if self._registered != self._wanted:
                    self._register(self._wanted)
                self._wait_once()
                delay = 1.0
            except NVMLError as exc:
                self._count_error(error_name(exc.value))
                self._registered = None  # a lost GPU or a driver reload: register again after a pause
                if self._stop.wait(delay):
                    break
                delay = min(_BACKOFF_MAX_SECONDS, delay * 2)
        self._free()

    def _register(self, gpus: tuple[WatchedGpu, ...]) -> None:
        self._free()
        self._event_set = self.nvml.nvmlEventSetCreate()
        by_handle = {}
        for gpu in gpus:
            try:
                supported = self.nvml.nvmlDeviceGetSupportedEventTypes(gpu.handle) & WANTED
                if supported:
                    self.nvml.nvmlDeviceRegisterEvents(gpu.handle, supported, self._event_set)
                    by_handle[_handle_key(gpu.handle)] = gpu
            except NVMLError as exc:  # this GPU is lost or cannot deliver events: listen to the others
                self._count_error(error_name(exc.value))
        self._by_handle = by_handle
        self._registered = gpus
        with self._lock:
            self._alive_at = time.monotonic()

    def _wait_once(self) -> None:
        try:
            data = self.nvml.nvmlEventSetWait_v2(self._event_set, self.wait_ms)
        except NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_TIMEOUT:
                raise
            data = None
        with self._lock:
            self._alive_at = time.monotonic()
        if data is not None:
            self._record(data)

    def _record(self, data: Any) -> None:
        gpu = self._by_handle.get(_handle_key(data.device))
        kind = EVENT_TYPES.get(data.eventType)
        if gpu is None or kind is None:
            return
        now = self._clock()
        with self._lock:
            self._counts.events[(gpu.index, gpu.uuid, kind)] += 1
            if kind == "xid":
                key = (gpu.index, gpu.uuid, int(data.eventData))
                count, _ = self._counts.xids.get(key, (0, 0.0))
                self._counts.xids[key] = (count + 1, now)
        if kind == "xid":
            log.warning("GPU %s (%s): XID %d", gpu.index, gpu.uuid, data.eventData)

    def _count_error(self, error: str) -> None:
        with self._lock:
            self._counts.errors[error] += 1

    def _free(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(NVMLError):
                self.nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
            self._registered = None
