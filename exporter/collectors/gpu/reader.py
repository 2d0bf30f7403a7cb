"""NVML calls for one GPU with the collector's error policy, and the samples they become.

- NOT_SUPPORTED (and FUNCTION_NOT_FOUND from an older driver, NO_PERMISSION) is remembered per GPU
  and call, and the call is not made again until the next static refresh: its series are omitted.
- GPU_IS_LOST (or RESET_REQUIRED) raises `GpuLost`: the collector marks the GPU down.
- Errors that mean NVML itself is gone (driver unloaded or upgraded) raise `NvmlDown`.
- Anything else is counted by call and error, and that value is omitted this time.

Field values (`nvmlDeviceGetFieldValues`) follow the same policy per value.
"""

from __future__ import annotations

import ctypes
import functools
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pynvml
from pynvml import NVMLError

from exporter.collectors.gpu.device import GpuDevice, Recorded
from exporter.framework.catalog import MetricSpec

FieldId = tuple[int, int]  # (NVML_FI_* id, scope: a link index, or ALL_LINKS)
ALL_LINKS = 0xFFFFFFFF
UNSUPPORTED = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                         pynvml.NVML_ERROR_NO_PERMISSION})
LOST = frozenset({pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED})
DOWN = frozenset({pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                  pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, pynvml.NVML_ERROR_LIBRARY_NOT_FOUND})
_ERROR_NAMES = {getattr(pynvml, n): n.removeprefix("NVML_ERROR_").lower() for n in dir(pynvml)
                if n.startswith("NVML_ERROR_")}
# valueType -> (union member, width in bits for unwrapping; 0 for values that are not counters)
_VALUES = {pynvml.NVML_VALUE_TYPE_DOUBLE: ("dVal", 0), pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: ("uiVal", 32),
           pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: ("ulVal", 64),
           pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: ("ullVal", 64),
           pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: ("sllVal", 0), pynvml.NVML_VALUE_TYPE_SIGNED_INT: ("siVal", 0),
           pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: ("usVal", 16)}


def error_name(code: int) -> str:
    """NVML_ERROR_GPU_IS_LOST -> 'gpu_is_lost' (the `error` label)."""
    return _ERROR_NAMES.get(code, f"code_{code}")


def field_name(field_id: int) -> str:
    """The pynvml constant for a field ID, without its prefix (labels and logs)."""
    return _FIELD_NAMES.get(field_id, f"field_{field_id}")


_FIELD_NAMES: dict[int, str] = {}
for _name in sorted(n for n in dir(pynvml) if n.startswith("NVML_FI_DEV_")):
    _FIELD_NAMES.setdefault(getattr(pynvml, _name), _name.removeprefix("NVML_FI_DEV_").lower())


class GpuLost(Exception):
    """The GPU answered GPU_IS_LOST: fallen off the bus, or waiting for a reset."""


class NvmlDown(Exception):
    """NVML itself stopped working (driver unloaded or replaced); it must be initialized again."""

    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call}: {error_name(code)}")
        self.error = error_name(code)


class Sink(Protocol):
    def add(self, spec: MetricSpec, value: float | int | bool | None, **labels: object) -> None: ...


class Recorder:
    """A sink that keeps samples to replay later (the static samples of a GPU)."""

    def __init__(self) -> None:
        self.samples: list[Recorded] = []

    def add(self, spec: MetricSpec, value: float | int | bool | None, **labels: object) -> None:
        if value is not None:
            self.samples.append(Recorded(spec, float(value), labels))


@dataclass
class NvmlErrors:
    """Failed NVML calls by (call, error), NOT_SUPPORTED excepted; for raypulse_gpu_nvml_errors_total."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)

    def count(self, call: str, code: int) -> None:
        self.counts[(call, error_name(code))] += 1


@dataclass(frozen=True)
class Reading:
    value: float
    bits: int  # counter width, 0 when the value is not a counter


_RAISE = object()
# pynvml's structs convert bytes to str on every attribute read; the field values are numbers, and
# a node with 8 GPUs reads about a thousand of them per run, so read them the plain ctypes way.
_get = ctypes.Structure.__getattribute__


def classify(call: str, error: NVMLError) -> int:
    """Raise GpuLost / NvmlDown for the errors that end the GPU's or NVML's run; return the code."""
    code = error.value
    if code in LOST:
        raise GpuLost(call) from None
    if code in DOWN:
        raise NvmlDown(call, code) from None
    return code


class DeviceReader:
    """One run's view of one GPU: NVML calls with the error policy, and `add` with its labels."""

    def __init__(self, nvml: Any, device: GpuDevice, errors: NvmlErrors, out: Sink,
                 fields: Mapping[FieldId, Reading] | None = None) -> None:
        self.nvml = nvml
        self.device = device
        self.errors = errors
        self.out = out
        self.fields = fields or {}
        self.failed = False
        self.processes: list[Any] = []  # the processes area's GpuProcessUsage entries
        self._labels = device.labels

    def add(self, spec: MetricSpec, value: float | int | bool | None, **labels: object) -> None:
        self.out.add(spec, value, **self._labels, **labels)

    def call(self, name: str, *args: Any, key: Hashable | None = None, handle: Any = None,
             not_found: Any = _RAISE) -> Any:
        """`nvml.<name>(handle, *args)`, or None when unsupported or failed. `not_found` is returned
        when NVML answers NOT_FOUND and that means "nothing" (no samples, no such instance)."""
        device_handle = self.device.handle if handle is None else handle
        return self._call(name, (device_handle, *args), (name, args) if key is None else key, not_found)

    def system_call(self, name: str, *args: Any, key: Hashable | None = None) -> Any:
        """An NVML call that takes no device handle (GPM sample plumbing), same policy."""
        return self._call(name, args, (name, args) if key is None else key, _RAISE)

    def _call(self, name: str, args: tuple[Any, ...], cache_key: Hashable, not_found: Any) -> Any:
        unsupported = self.device.unsupported
        if cache_key in unsupported:
            return None
        try:
            return getattr(self.nvml, name)(*args)
        except NVMLError as error:
            code = classify(name, error)
            # NOT_FOUND means "none" for some calls; pynvml raises NVMLError(SUCCESS) for the
            # process-utilization calls when the driver has no samples at all.
            if code in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS) and not_found is not _RAISE:
                return not_found
            if code in UNSUPPORTED:
                unsupported[cache_key] = name
            else:
                self.errors.count(name, code)
                self.failed = True
            return None
        except pynvml.NVMLLibraryMismatchError:  # pynvml's way of saying the driver lacks this call
            unsupported[cache_key] = name
            return None

    def field(self, field_id: int, scope: int = 0) -> float | None:
        reading = self.fields.get((field_id, scope))
        return None if reading is None else reading.value

    def counter(self, key: Hashable, raw: float | None, bits: int = 64) -> float | None:
        """An NVML counter reading made monotonic (see counters.py); None passes through."""
        if raw is None:
            return None
        return float(self.device.counters.update(key, int(raw), bits))

    def field_counter(self, field_id: int, scope: int = 0) -> float | None:
        reading = self.fields.get((field_id, scope))
        if reading is None:
            return None
        return self.counter(("field", field_id, scope), reading.value, reading.bits or 64)

    def field_or_call_counter(self, field_id: int, call: str, bits: int) -> float | None:
        """A counter from its field when the driver has it, else from the older dedicated call."""
        if ("field", field_id, 0) not in self.device.unsupported:
            return self.field_counter(field_id)
        return self.counter(("call", call), self.call(call), bits)


@functools.cache
def _field_key_and_label(request: FieldId) -> tuple[tuple[str, int, int], str]:
    """A field's key in `GpuDevice.unsupported` and its label: one of each per field, shared by the GPUs
    that keep them (8 simulated H100s keep 235 unsupported fields each: ~0.3 MB when each had its own)."""
    return ("field", *request), "field:" + field_name(request[0])


def read_fields(nvml: Any, device: GpuDevice, requests: Iterable[FieldId], errors: NvmlErrors) -> dict[
        FieldId, Reading]:
    """One nvmlDeviceGetFieldValues call for every field the areas want, with the per-value policy."""
    unsupported = device.unsupported
    wanted = [request for request in dict.fromkeys(requests) if ("field", *request) not in unsupported]
    if not wanted:
        return {}
    reader = DeviceReader(nvml, device, errors, Recorder())
    values = reader.call("nvmlDeviceGetFieldValues", wanted, key="nvmlDeviceGetFieldValues")
    if values is None:
        return {}
    readings: dict[FieldId, Reading] = {}
    for request, value in zip(wanted, values, strict=True):
        code = _get(value, "nvmlReturn")
        if code == pynvml.NVML_SUCCESS:
            attribute, bits = _VALUES.get(_get(value, "valueType"), ("ullVal", 64))
            readings[request] = Reading(float(getattr(_get(value, "value"), attribute)), bits)
            continue
        key, label = _field_key_and_label(request)
        if code in LOST:
            raise GpuLost(label)
        if code in DOWN:
            raise NvmlDown(label, code)
        if code in UNSUPPORTED:
            unsupported[key] = label
        else:
            errors.count(label, code)
    return readings


@dataclass(frozen=True)
class Area:
    """A group of families and how to read them for one GPU: `static` at enumeration and on each
    static refresh (limits, maxima), `fields` the field IDs wanted this run, `read` every run."""

    name: str
    read: Callable[[DeviceReader], None]
    static: Callable[[DeviceReader], None] | None = None
    fields: Callable[[GpuDevice], Iterable[FieldId]] = lambda device: ()
