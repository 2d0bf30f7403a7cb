"""GPM on a simulated GPU (exporter/collectors/gpu/gpm.py reads it): samples of the GPU's busy time
and PCIe and NVLink bytes, and the metrics between two samples (activity of a mixed-precision
training step, per GPU or MIG instance).
"""

from __future__ import annotations

from typing import Any

import pynvml

from exporter.gpusim.device import handle_key
from exporter.gpusim.nvml.base import NvmlBase, _GpmSample, _raise, simulated

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


class Gpm(NvmlBase):
    """GPM support, samples and metrics."""

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
