"""GPU Performance Monitoring (Hopper and newer): what the SMs, tensor cores, memory and links did.

GPM metrics are rates between two samples, so each run takes one sample per GPU (and per MIG
instance) and computes the metrics against the previous run's; the first run has none. Unlike
DCGM's profiling metrics, GPM needs no privileges and does not conflict with Nsight.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import pynvml

from exporter.collectors.gpu.families import gpu_gauge, unsupported_on
from exporter.collectors.gpu.reader import Area, DeviceReader

_ONLY = unsupported_on("Hopper and newer; from the second run on")
_MIB = 1 << 20
# NVLink per-link GPM metrics come in pairs from link 0: RX, TX, RX, TX, ...
_NVLINK_FIRST = pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC
_NVLINK_GPM_LINKS = 18

SUPPORTED = gpu_gauge("gpm_supported", "1 if the GPU supports GPU Performance Monitoring (GPM).")
GRAPHICS_ACTIVE = gpu_gauge("graphics_engine_active_ratio", "Share of time the graphics/compute engine was "
                            "active (DCGM's GR_ENGINE_ACTIVE).", unit="ratio", only_when=_ONLY)
SM_ACTIVE = gpu_gauge("sm_active_ratio", "Share of SMs busy, averaged over time (DCGM's SM_ACTIVE).",
                      unit="ratio", only_when=_ONLY)
SM_OCCUPANCY = gpu_gauge("sm_occupancy_ratio", "Resident warps as a share of the SMs' maximum.", unit="ratio",
                         only_when=_ONLY)
TENSOR_ACTIVE = gpu_gauge("tensor_active_ratio", "Share of time the tensor cores did any work (DCGM's "
                          "PIPE_TENSOR_ACTIVE).", unit="ratio", only_when=_ONLY)
TENSOR_PIPE_ACTIVE = gpu_gauge("tensor_pipe_active_ratio", "Share of time each tensor pipe was active (hmma: "
                               "FP16/BF16/TF32, imma: integer, dmma and dfma: FP64).", ("pipe",), unit="ratio",
                               only_when=_ONLY)
FP_PIPE_ACTIVE = gpu_gauge("fp_pipe_active_ratio", "Share of time the SMs did non-tensor floating point math.",
                           ("precision",), unit="ratio", only_when=_ONLY)
INTEGER_PIPE_ACTIVE = gpu_gauge("integer_pipe_active_ratio", "Share of time the SMs did integer math.",
                                unit="ratio", only_when=_ONLY)
DRAM_ACTIVE = gpu_gauge("dram_active_ratio", "Device memory bandwidth used, as a share of the maximum (DCGM's "
                        "DRAM_ACTIVE).", unit="ratio", only_when=_ONLY)
PCIE_THROUGHPUT = gpu_gauge("pcie_throughput_bytes_per_second", "PCIe traffic between the last two runs "
                            "(tx: from the GPU).", ("direction",), only_when=_ONLY)
NVLINK_LINK_THROUGHPUT = gpu_gauge("nvlink_link_throughput_bytes_per_second", "NVLink traffic of one link between "
                                   "the last two runs.", ("link", "direction"),
                                   only_when=unsupported_on("Hopper and newer with NVLink; from the second run on"))

# metric -> (family, extra labels), as ratios
_RATIOS = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: (GRAPHICS_ACTIVE, {}),
    pynvml.NVML_GPM_METRIC_SM_UTIL: (SM_ACTIVE, {}),
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: (SM_OCCUPANCY, {}),
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: (TENSOR_ACTIVE, {}),
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: (TENSOR_PIPE_ACTIVE, {"pipe": "hmma"}),
    pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: (TENSOR_PIPE_ACTIVE, {"pipe": "imma"}),
    pynvml.NVML_GPM_METRIC_DMMA_TENSOR_UTIL: (TENSOR_PIPE_ACTIVE, {"pipe": "dmma"}),
    pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: (TENSOR_PIPE_ACTIVE, {"pipe": "dfma"}),
    pynvml.NVML_GPM_METRIC_FP64_UTIL: (FP_PIPE_ACTIVE, {"precision": "fp64"}),
    pynvml.NVML_GPM_METRIC_FP32_UTIL: (FP_PIPE_ACTIVE, {"precision": "fp32"}),
    pynvml.NVML_GPM_METRIC_FP16_UTIL: (FP_PIPE_ACTIVE, {"precision": "fp16"}),
    pynvml.NVML_GPM_METRIC_INTEGER_UTIL: (INTEGER_PIPE_ACTIVE, {}),
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: (DRAM_ACTIVE, {}),
}
_PCIE = {pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "tx", pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "rx"}


def sample_metrics(r: DeviceReader, gpu_instance_id: int | None, metrics: Sequence[int]) -> Mapping[int, float]:
    """Take this run's GPM sample (of the GPU, or of one MIG GPU instance) and return the metrics
    since the previous one; empty on the first run or when GPM fails."""
    sample = r.system_call("nvmlGpmSampleAlloc")
    if sample is None:
        return {}
    if gpu_instance_id is None:
        taken = r.call("nvmlGpmSampleGet", sample, key="nvmlGpmSampleGet")
    else:
        taken = r.call("nvmlGpmMigSampleGet", gpu_instance_id, sample, key="nvmlGpmMigSampleGet")
    if taken is None:
        r.system_call("nvmlGpmSampleFree", sample, key="nvmlGpmSampleFree")
        return {}
    previous = r.device.gpm_samples.get(gpu_instance_id)
    r.device.gpm_samples[gpu_instance_id] = sample
    if previous is None:
        return {}
    request = r.nvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metrics)
    request.sample1, request.sample2 = previous, sample
    for i, metric in enumerate(metrics):
        request.metrics[i].metricId = metric
    result = r.system_call("nvmlGpmMetricsGet", request, key="nvmlGpmMetricsGet")
    r.system_call("nvmlGpmSampleFree", previous, key="nvmlGpmSampleFree")
    if result is None:
        return {}
    return {m.metricId: m.value for m in result.metrics[:len(metrics)] if m.nvmlReturn == pynvml.NVML_SUCCESS}


def release(nvml: object, device: object, keep: set[int | None] | None = None) -> None:
    """Free the device's GPM samples (all, or those of scopes not in `keep`)."""
    samples = device.gpm_samples  # type: ignore[attr-defined]
    for scope in [s for s in samples if keep is None or s not in keep]:
        with contextlib.suppress(pynvml.NVMLError):  # a lost GPU's sample: nothing else to do with it
            nvml.nvmlGpmSampleFree(samples.pop(scope))  # type: ignore[attr-defined]


def _static(r: DeviceReader) -> None:
    support = r.call("nvmlGpmQueryDeviceSupport")
    r.device.gpm_supported = bool(support is not None and support.isSupportedDevice)
    r.add(SUPPORTED, r.device.gpm_supported if support is not None else None)


def _read(r: DeviceReader) -> None:
    if not r.device.gpm_supported:
        return
    links = min(r.device.nvlink_links, _NVLINK_GPM_LINKS)
    nvlink = [_NVLINK_FIRST + i for i in range(2 * links)]
    values = sample_metrics(r, None, [*_RATIOS, *_PCIE, *nvlink])
    for metric, (spec, labels) in _RATIOS.items():
        r.add(spec, _ratio(values.get(metric)), **labels)
    for metric, direction in _PCIE.items():
        r.add(PCIE_THROUGHPUT, _per_mib(values.get(metric)), direction=direction)
    for metric in nvlink:
        link, tx = divmod(metric - _NVLINK_FIRST, 2)
        r.add(NVLINK_LINK_THROUGHPUT, _per_mib(values.get(metric)), link=link, direction="tx" if tx else "rx")


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else min(1.0, max(0.0, percent / 100))


def _per_mib(mib_per_second: float | None) -> float | None:
    return None if mib_per_second is None else mib_per_second * _MIB


AREA = Area("gpm", read=_read, static=_static)
