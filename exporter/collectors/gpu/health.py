"""The GPU collector's view of NVML itself: up or not, why not, which calls fail or are unsupported."""

from __future__ import annotations

from collections.abc import Iterable

from exporter.collectors.gpu.device import GpuDevice
from exporter.collectors.gpu.families import COLLECTOR, gpu_gauge
from exporter.collectors.gpu.reader import NvmlErrors
from exporter.collectors.gpu.session import NvmlSession
from exporter.framework.catalog import counter, gauge, info
from exporter.framework.snapshot import SampleSink

NVML_UP = gauge("raypulse_gpu_nvml_up", "1 if NVML is initialized; 0 on a node without an NVIDIA driver, or "
                "while initialization fails (see raypulse_gpu_nvml_init_failures_total).", collector=COLLECTOR)
NVML_INFO = info("raypulse_gpu_nvml_info", "Versions of NVML, the driver, CUDA and nvidia-ml-py; simulated is "
                 "true for the GPU simulator.",
                 collector=COLLECTOR, labels=("nvml_version", "driver_version", "cuda_driver_version",
                                              "nvidia_ml_py_version", "simulated"), only_when="while NVML is up")
INIT_FAILURES = counter("raypulse_gpu_nvml_init_failures_total", "Failed NVML initializations by error "
                        "(library_not_found: no NVIDIA driver on this node).", collector=COLLECTOR,
                        labels=("error",), only_when="after NVML failed to initialize")
ERRORS = counter("raypulse_gpu_nvml_errors_total", "Failed NVML calls by call and error (NOT_SUPPORTED excepted: "
                 "see raypulse_gpu_nvml_call_unsupported).", collector=COLLECTOR, labels=("call", "error"),
                 only_when="after an NVML call failed")
CALL_UNSUPPORTED = gpu_gauge("nvml_call_unsupported", "1 for each NVML call or field the GPU answered "
                             "NOT_SUPPORTED (or that the driver lacks); the series it would give are omitted.",
                             ("call",), only_when="for the calls a GPU does not support")


def emit(out: SampleSink, session: NvmlSession, errors: NvmlErrors, devices: Iterable[GpuDevice],
         simulated: bool) -> None:
    out.add(NVML_UP, session.up)
    if session.up:
        out.add_info(NVML_INFO, **session.versions, simulated=str(simulated).lower())
    for error, count in session.failures.items():
        out.add(INIT_FAILURES, count, error=error)
    for (call, error), count in errors.counts.items():
        out.add(ERRORS, count, call=call, error=error)
    for device in devices:
        if device.lost:
            continue
        for call in set(device.unsupported.values()):
            out.add(CALL_UNSUPPORTED, 1, **device.labels, call=call)
