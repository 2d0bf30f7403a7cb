"""A simulated GPU's NVLinks (exporter/collectors/gpu/nvlink.py reads them): the state of each link
(down when the control file says so), and the per-link field values (state, CRC, replay and recovery
errors, NVLink 5 packet counters) that fields.py serves.
"""

from __future__ import annotations

import pynvml

from exporter.gpusim import models
from exporter.gpusim.device import SimulatedGpu
from exporter.gpusim.nvml.base import NvmlBase, _raise, simulated


class NvLink(NvmlBase):
    """NVLink state."""

    @simulated(device=True)
    def nvmlDeviceGetNvLinkState(self, device: object, link: int) -> int:
        gpu = self._gpu(device)
        if not 0 <= link < gpu.model.nvlink_links:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if gpu.link_up(link) else pynvml.NVML_FEATURE_DISABLED


def _per_link_value(gpu: SimulatedGpu, fid: int, link: int) -> tuple[int, float]:
    ull = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    if fid == pynvml.NVML_FI_DEV_NVLINK_GET_STATE:
        state = pynvml.NVML_NVLINK_STATE_ACTIVE if gpu.link_up(link) else pynvml.NVML_NVLINK_STATE_INACTIVE
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, state
    if fid == pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC:
        return ull, int(gpu.nvlink_crc[link])
    if fid == pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY:
        return ull, int(gpu.nvlink_crc[link] * 0.3)
    if fid == pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY:
        return ull, gpu.nvlink_recoveries[link]
    return ull, _nvlink5_value(gpu, fid, link)


def _nvlink5_value(gpu: SimulatedGpu, fid: int, link: int) -> float:
    if fid == pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS:
        return int(gpu.nvlink_kib["tx"][link] / 0.25)
    if fid == pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_PACKETS:
        return int(gpu.nvlink_kib["rx"][link] / 0.25)
    if fid == pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS:
        return 0
    if fid == pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS:
        return gpu.nvlink_recoveries[link]
    if models.NVLINK5_ERRORS[fid] == "symbol":
        return int(gpu.nvlink_crc[link] * 40)  # FEC corrects most symbol errors
    if models.NVLINK5_ERRORS[fid] == "effective":
        return int(gpu.nvlink_crc[link])
    return 0
