"""A simulated GPU's PCIe link (exporter/collectors/gpu/pcie.py reads it): generation and width (the
link downtrains when idle) and replays; its byte and error counters are field values (fields.py).
"""

from __future__ import annotations

from exporter.gpusim.nvml.base import _UINT_MAX, NvmlBase, simulated


class Pcie(NvmlBase):
    """PCIe link state and replays."""

    @simulated(device=True)
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: object) -> int:
        gpu = self._gpu(handle)
        return 1 if gpu.utilization < 0.05 else gpu.model.pcie_generation  # links downtrain when idle

    @simulated(device=True)
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: object) -> int:
        return self._gpu(handle).model.pcie_generation

    @simulated(device=True)
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: object) -> int:
        return 16

    @simulated(device=True)
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: object) -> int:
        return 16

    @simulated(device=True)
    def nvmlDeviceGetPcieReplayCounter(self, handle: object) -> int:
        return int(self._gpu(handle).pcie_replays) & _UINT_MAX
