"""How busy a simulated GPU is (exporter/collectors/gpu/utilization.py reads it): GPU and memory
utilization (not supported with MIG, as on real GPUs), encoder and decoder.
"""

from __future__ import annotations

from typing import Any

import pynvml

from exporter.gpusim.nvml.base import NvmlBase, _raise, simulated


class Utilization(NvmlBase):
    """Utilization rates, encoder and decoder."""

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
