"""NVML initialization, retried with exponential backoff while it fails.

A node without NVIDIA driver (or a container without the devices) is normal for a CPU node and a
failure state for a GPU node; either way the exporter keeps serving everything else and reports
`raypulse_gpu_nvml_up 0` with the failures by error, and tries again after 1, 2, 4, ... seconds,
up to `gpu.init_retry_max_seconds`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pynvml import NVMLError

from exporter.collectors.gpu.reader import error_name

log = logging.getLogger(__name__)


def _nvidia_ml_py_version() -> str:
    try:
        return version("nvidia-ml-py")
    except PackageNotFoundError:
        return ""


class NvmlSession:
    def __init__(self, nvml: Any, retry_max_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.nvml = nvml
        self.retry_max_seconds = retry_max_seconds
        self.up = False
        self.failures: Counter[str] = Counter()
        self.versions: dict[str, str] = {}
        self.initializations = 0
        self._clock = clock
        self._delay = 0.0
        self._next_attempt = -float("inf")
        self._last_error: str | None = None

    def ensure(self) -> bool:
        """True when NVML is initialized, initializing it if a retry is due."""
        if self.up:
            return True
        now = self._clock()
        if now < self._next_attempt:
            return False
        try:
            self.nvml.nvmlInit()
        except NVMLError as exc:
            error = error_name(exc.value)
            self.failures[error] += 1
            self._delay = min(self.retry_max_seconds, max(1.0, self._delay * 2))
            self._next_attempt = now + self._delay
            if error != self._last_error:
                log.warning("NVML is not available (%s: %s); GPU metrics are off, retrying with backoff up to %gs",
                            error, exc, self.retry_max_seconds)
                self._last_error = error
            return False
        self.up = True
        self.initializations += 1
        self._delay = 0.0
        if self._last_error is not None:
            log.info("NVML initialized after earlier failures")
            self._last_error = None
        self.versions = {"nvml_version": self._system("nvmlSystemGetNVMLVersion"),
                         "driver_version": self._system("nvmlSystemGetDriverVersion"),
                         "cuda_driver_version": self._cuda_version(),
                         "nvidia_ml_py_version": _nvidia_ml_py_version()}
        return True

    def down(self, reason: str, shutdown: bool) -> None:
        """NVML stopped working (driver reload, version mismatch): initialize again on the next run.
        `shutdown` is False while another thread may still be inside an NVML call."""
        log.warning("NVML stopped working (%s); initializing it again", reason)
        if shutdown:
            with contextlib.suppress(NVMLError):
                self.nvml.nvmlShutdown()
        self.up = False
        self._next_attempt = -float("inf")

    def close(self) -> None:
        if self.up:
            with contextlib.suppress(NVMLError):
                self.nvml.nvmlShutdown()
            self.up = False

    def _system(self, call: str) -> str:
        try:
            return str(getattr(self.nvml, call)())
        except NVMLError:
            return ""

    def _cuda_version(self) -> str:
        try:
            number = self.nvml.nvmlSystemGetCudaDriverVersion_v2()
        except NVMLError:
            return ""
        return f"{number // 1000}.{number % 1000 // 10}"  # 12080 -> "12.8"
