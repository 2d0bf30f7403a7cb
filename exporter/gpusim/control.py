"""The simulated GPUs' control file: what load and which faults each GPU has right now.

One JSON document, read by the simulator while it runs and written by `exporter gpu-fault`, the
launcher and tests (see docs/gpu-simulation.md). State fields (`lost`, `thermal_throttle`, ...) say
what is true now; `events` is an append-only log of one-shot events (XIDs, ECC events), each
delivered once to whoever listens, in `seq` order. Writers lock a sibling `.lock` file and replace
the document atomically, so a reader never sees half a write.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Literal

import pynvml
from pydantic import AfterValidator, Field, ValidationError, field_validator

from exporter import userinput
from exporter.contract import strict
from exporter.contract.strict import Strict

log = logging.getLogger(__name__)

VERSION = 1
EVENT_TYPES = ("xid", "single_bit_ecc", "double_bit_ecc", "gpu_unavailable", "recovery_action")
# NVML error names an init failure may be given as (the suffix of NVML_ERROR_*).
INIT_ERRORS = tuple(name.removeprefix("NVML_ERROR_") for name in dir(pynvml) if name.startswith("NVML_ERROR_"))
NVML_ERRORS = INIT_ERRORS  # the names a failing call may be given (NVML_ERROR_<name>)


def _check_errors(errors: dict[str, str]) -> dict[str, str]:
    """call -> NVML error name, e.g. {"nvmlDeviceGetPowerUsage": "UNKNOWN"}."""
    _check_calls(list(errors))
    for call, error in errors.items():
        if error.upper() not in NVML_ERRORS:
            raise ValueError(f"{call}: unknown NVML error {error!r}; one of {', '.join(sorted(NVML_ERRORS))}")
    return {call: error.upper() for call, error in errors.items()}


def _check_calls(names: list[str]) -> list[str]:
    """Each name must be a pynvml function (nvmlDeviceGetPowerUsage) or a field (NVML_FI_DEV_MEMORY_TEMP)."""
    for name in names:
        known = (name.startswith("nvml") and callable(getattr(pynvml, name, None))) or (
            name.startswith("NVML_FI_") and isinstance(getattr(pynvml, name, None), int))
        if not known:
            raise ValueError(f"unknown NVML call or field {name!r}: use a pynvml function name such as "
                             f"'nvmlDeviceGetPowerUsage' or a field constant such as 'NVML_FI_DEV_MEMORY_TEMP'")
    return names


class Process(Strict):
    """A process the simulated GPU reports as running on it (a Ray worker's real pid, say)."""

    pid: int = Field(gt=0)
    memory_bytes: int = Field(ge=0)
    sm_utilization: float | None = Field(None, ge=0, le=1, description="Share of the SMs; default: an even "
                                         "share of the GPU's utilization.")
    name: str = Field("python", min_length=1, max_length=64)


class Event(Strict):
    seq: int = Field(ge=1)
    type: Literal["xid", "single_bit_ecc", "double_bit_ecc", "gpu_unavailable", "recovery_action"]
    data: int = Field(0, ge=0, description="The XID code for type xid, the recovery action for recovery_action.")


Ratio = Annotated[float, Field(ge=0, le=1)]
CallNames = Annotated[list[str], AfterValidator(_check_calls)]  # NVML calls (or fields) the simulator knows
CallErrors = Annotated[dict[str, str], AfterValidator(_check_errors)]  # {call: NVML error name}


class GpuControl(Strict):
    """One GPU: its load and its faults."""

    load: Ratio | None = Field(None, description="Target utilization; default: the top-level load or the built-in "
                               "training pattern.")
    lost: bool = Field(False, description="Fallen off the bus: every call on it raises GPU_IS_LOST.")
    thermal_throttle: bool = Field(False, description="Hot: temperature above slowdown, thermal clock events.")
    power_brake: bool = Field(False, description="External power brake asserted: clocks and power drop.")
    row_remap_pending: bool = False
    row_remap_failed: bool = False
    recovery_action: int = Field(0, ge=0, le=7, description="NVML_GPU_RECOVERY_ACTION_* the driver asks for.")
    nvlink_down: list[int] = Field(default_factory=list, description="NVLink link indices that are down.")
    ecc_sbe: int = Field(0, ge=0, description="Single-bit (corrected) ECC errors injected so far.")
    ecc_dbe: int = Field(0, ge=0, description="Double-bit (uncorrected) ECC errors injected so far.")
    hang: CallNames = Field(default_factory=list, description="Calls on this GPU that block until removed.")
    not_supported: CallNames = Field(default_factory=list, description="Calls or fields answering NOT_SUPPORTED.")
    errors: CallErrors = Field(default_factory=dict, description="Calls failing with an NVML error, e.g. "
                                   "{'nvmlDeviceGetPowerUsage': 'UNKNOWN'}.")
    mig: list[str] = Field(default_factory=list, description="MIG instance profiles, e.g. ['3g.40gb', '3g.40gb'].")
    processes: list[Process] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)

    @field_validator("mig")
    @classmethod
    def _profiles(cls, profiles: list[str]) -> list[str]:
        for profile in profiles:
            if not re.fullmatch(r"[1-7]g\.\d+gb", profile):
                raise ValueError(f"MIG profile {profile!r} is not of the form <slices>g.<memory>gb, e.g. 3g.40gb")
        return profiles

    @field_validator("events")
    @classmethod
    def _ordered(cls, events: list[Event]) -> list[Event]:
        seqs = [e.seq for e in events]
        if seqs != sorted(set(seqs)):
            raise ValueError("event seq numbers must be unique and increasing")
        return events


class Control(Strict):
    """The whole control file."""

    version: Literal[1] = VERSION
    load: Ratio | None = Field(None, description="Target utilization of every GPU without its own.")
    init_error: str | None = Field(None, description="nvmlInit fails with NVML_ERROR_<this> while set.")
    hang: CallNames = Field(default_factory=list, description="Calls (any GPU, and system calls) that block.")
    not_supported: CallNames = Field(default_factory=list, description="Calls or fields answering NOT_SUPPORTED "
                                     "on every GPU.")
    errors: CallErrors = Field(default_factory=dict, description="Calls (any GPU, and system calls) failing "
                                   "with an NVML error.")
    gpus: dict[int, GpuControl] = Field(default_factory=dict, description="Per GPU, by NVML index.")

    @field_validator("init_error")
    @classmethod
    def _known_error(cls, value: str | None) -> str | None:
        if value is not None and value.upper() not in INIT_ERRORS:
            raise ValueError(f"unknown NVML error {value!r}; one of {', '.join(sorted(INIT_ERRORS))}")
        return None if value is None else value.upper()

    @field_validator("gpus")
    @classmethod
    def _indices(cls, gpus: dict[int, GpuControl]) -> dict[int, GpuControl]:
        if any(index < 0 for index in gpus):
            raise ValueError("GPU indices are >= 0")
        return gpus

    def gpu(self, index: int) -> GpuControl:
        return self.gpus.get(index) or _NO_FAULTS


_NO_FAULTS = GpuControl()


class ControlError(Exception):
    """An unreadable or invalid control file; the message names the file and the field."""


MAX_BYTES = 4 * 1024 * 1024  # far more than any fault scenario writes


def parse(text: str, source: str) -> Control:
    try:
        data = userinput.load_json(text) if text.strip() else {}
    except userinput.InputError as exc:
        raise ControlError(f"{source}: {exc.problem}") from None
    return _validate(data, source)


def _validate(data: object, source: str) -> Control:
    try:
        return Control.model_validate(data)
    except ValidationError as exc:
        raise ControlError(f"{source}: {_problems(exc)}") from None
    except RecursionError:
        raise ControlError(f"{source}: nested too deeply to be a control file") from None


def _problems(exc: ValidationError) -> str:
    """`field.path: message` for each problem, as the config file's errors read."""
    return "; ".join(str(problem) for problem in strict.problems(exc))


def read(path: Path) -> Control:
    """The control file's content; a missing file means no faults. Only a regular file owned by
    this user or root is one: a FIFO would block the open (and the exporter's start) until someone
    writes, a link or another user's file would let that user steer the simulator."""
    try:
        raw, status = userinput.read_file(path, MAX_BYTES, follow_links=False)
    except userinput.InputError as exc:
        if exc.missing:
            return Control()
        raise ControlError(f"{path}: {exc.problem}; the control file is JSON written by `exporter gpu-fault`") from None
    if status.st_uid not in (os.geteuid(), 0):
        raise ControlError(f"{path}: owned by uid {status.st_uid}, not by this user ({os.geteuid()}) or root")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ControlError(f"{path}: not UTF-8 text (byte {exc.start}); it is JSON written by `exporter "
                           "gpu-fault`") from None
    return parse(text, str(path))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update(path: Path, change: Callable[[Control], None]) -> Control:
    """Read, change in place, validate and atomically write the control file (serialised by a lock)."""
    try:
        return _update(path, change)
    except OSError as exc:
        raise ControlError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _update(path: Path, change: Callable[[Control], None]) -> Control:
    with _locked(path):
        control = read(path)
        try:
            change(control)
        except ValidationError as exc:  # a value `change` built was refused
            raise ControlError(f"{path}: {_problems(exc)}") from None
        control = _validate(control.model_dump(), str(path))  # re-check what `change` did
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        temporary.write_text(json.dumps(control.model_dump(mode="json", exclude_defaults=True), indent=2) + "\n")
        os.replace(temporary, path)
        return control


def gpu_entry(control: Control, index: int) -> GpuControl:
    """The GPU's entry, created when absent (for writers)."""
    return control.gpus.setdefault(index, GpuControl())


def append_event(entry: GpuControl, type: str, data: int = 0) -> None:
    seq = entry.events[-1].seq + 1 if entry.events else 1
    entry.events.append(Event(seq=seq, type=type, data=data))  # type: ignore[arg-type]


def inject_xid(entry: GpuControl, xid: int) -> None:
    """An XID event plus the state it implies: 79 the GPU is lost; 48 a double-bit ECC error; 94 a
    contained ECC error whose row remap needs a GPU reset."""
    append_event(entry, "xid", xid)
    if xid == 79:
        entry.lost = True
    elif xid in (48, 94):
        entry.ecc_dbe += 1
        append_event(entry, "double_bit_ecc")
        if xid == 94:
            entry.row_remap_pending = True
            entry.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET


class ControlReader:
    """Keeps the parsed control file current, re-reading it only when it changed (checked at most
    every `check_seconds`). An invalid file keeps the last good content and is logged once."""

    def __init__(self, path: Path | None, check_seconds: float = 0.05) -> None:
        self.path = path
        self.check_seconds = check_seconds
        self.control = Control()
        self.error: str | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._checked_at = -float("inf")
        self._lock = threading.Lock()

    def current(self) -> Control:
        if self.path is None:
            return self.control
        now = time.monotonic()
        if now - self._checked_at < self.check_seconds:
            return self.control
        with self._lock:
            self._checked_at = now
            try:
                stat = self.path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            except OSError:  # missing (no faults) or unreadable (read says which)
                stamp = (0, 0, 0)
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self.control, self.error = read(self.path), None
                except ControlError as exc:
                    if str(exc) != self.error:
                        log.warning("simulated GPUs: ignoring the control file until it is fixed: %s", exc)
                    self.error = str(exc)
        return self.control
