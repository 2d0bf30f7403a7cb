"""MIG on a simulated GPU (exporter/collectors/gpu/mig.py reads it): the mode, the instances the
control file creates, their handles and IDs.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from exporter.gpusim.device import MigInstance
from exporter.gpusim.nvml.base import NvmlBase, _raise, simulated


class Mig(NvmlBase):
    """MIG mode and instances."""

    @simulated(device=True)
    def nvmlDeviceGetMigMode(self, device: object) -> list[int]:
        enabled = int(bool(self._gpu(device).mig))
        return [enabled, enabled]

    @simulated(device=True)
    def nvmlDeviceGetMaxMigDeviceCount(self, device: object) -> int:
        return self._gpu(device).model.mig_slices

    @simulated(device=True)
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: object, index: int) -> object:
        gpu = self._gpu(device)
        if not 0 <= index < len(gpu.mig):
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu.mig[index].handle

    def _instance(self, handle: object) -> MigInstance:
        instance = self._target(handle)[1]
        if instance is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not a MIG device handle
        return instance  # type: ignore[return-value]

    @simulated(device=True)
    def nvmlDeviceGetGpuInstanceId(self, device: object) -> int:
        return self._instance(device).gpu_instance_id

    @simulated(device=True)
    def nvmlDeviceGetComputeInstanceId(self, device: object) -> int:
        self._instance(device)
        return 0

    @simulated(device=True)
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: object) -> object:
        self._instance(migDevice)
        return self._gpu(migDevice).handle

    @simulated(device=True)
    def nvmlDeviceIsMigDeviceHandle(self, device: object) -> Any:
        return ctypes.c_uint(int(self._target(device)[1] is not None))
