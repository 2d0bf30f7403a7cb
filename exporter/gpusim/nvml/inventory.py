"""What identifies a simulated GPU and the system around it (exporter/collectors/gpu/inventory.py
and session.py read it): initialization, versions, the handles by index and UUID, name, serial, PCI,
architecture, persistence and compute mode, performance state, fabric state.
"""

from __future__ import annotations

from typing import Any

import pynvml
from pynvml import NVMLError

from exporter.gpusim.nvml.base import NvmlBase, _raise, simulated

DRIVER_VERSION = "570.133.20"
NVML_VERSION = "12.570.133.20"
CUDA_DRIVER_VERSION = 12080


class Inventory(NvmlBase):
    """System, handles, identity, modes and states."""

    @simulated()
    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    @simulated()
    def nvmlInitWithFlags(self, flags: int) -> None:
        error = self._control.init_error
        if error is not None:
            _raise(getattr(pynvml, "NVML_ERROR_" + error))
        with self._lock:
            self._init_count += 1

    @simulated()
    def nvmlShutdown(self) -> None:
        with self._lock:
            self._init_count = max(0, self._init_count - 1)

    @simulated()
    def nvmlSystemGetDriverVersion(self) -> str:
        return DRIVER_VERSION

    @simulated()
    def nvmlSystemGetNVMLVersion(self) -> str:
        return NVML_VERSION

    @simulated()
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return CUDA_DRIVER_VERSION

    @simulated()
    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return CUDA_DRIVER_VERSION

    @simulated()
    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for gpu in self.gpus:
            for process in self._faults(gpu).processes:
                if process.pid == pid:
                    return process.name
        raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    @simulated()
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    @simulated()
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        if not 0 <= index < len(self.gpus):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if self._faults(gpu).lost:
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu.handle

    @simulated()
    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> object:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                if self._faults(gpu).lost:
                    _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
                return gpu.handle
        raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    @simulated(device=True)
    def nvmlDeviceGetUUID(self, handle: object) -> str:
        gpu, instance = self._target(handle)
        return instance.uuid if instance else gpu.uuid

    @simulated(device=True)
    def nvmlDeviceGetName(self, handle: object) -> str:
        gpu, instance = self._target(handle)
        return f"{gpu.model.name} MIG {instance.profile}" if instance else gpu.model.name

    @simulated(device=True)
    def nvmlDeviceGetSerial(self, handle: object) -> str:
        return self._gpu(handle).serial

    @simulated(device=True)
    def nvmlDeviceGetVbiosVersion(self, handle: object) -> str:
        return self._gpu(handle).model.vbios

    @simulated(device=True)
    def nvmlDeviceGetPciInfo_v3(self, handle: object) -> Any:
        gpu = self._gpu(handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = gpu.pci_bus_id[4:].encode()
        info.domain, info.bus, info.device = 0, int(gpu.pci_bus_id[9:11], 16), 0
        info.pciDeviceId = gpu.model.pcie_device_id
        info.pciSubSystemId = 0x16C110DE
        return info

    def nvmlDeviceGetPciInfo(self, handle: object) -> Any:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    @simulated(device=True)
    def nvmlDeviceGetCudaComputeCapability(self, handle: object) -> tuple[int, int]:
        return self._gpu(handle).model.compute_capability

    @simulated(device=True)
    def nvmlDeviceGetBrand(self, handle: object) -> int:
        return self._gpu(handle).model.brand

    @simulated(device=True)
    def nvmlDeviceGetArchitecture(self, device: object) -> int:
        return self._gpu(device).model.architecture

    @simulated(device=True)
    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        return self._gpu(handle).index

    @simulated(device=True)
    def nvmlDeviceGetIndex(self, handle: object) -> int:
        return self._gpu(handle).index

    @simulated(device=True)
    def nvmlDeviceGetPersistenceMode(self, handle: object) -> int:
        return pynvml.NVML_FEATURE_ENABLED

    @simulated(device=True)
    def nvmlDeviceGetComputeMode(self, handle: object) -> int:
        return pynvml.NVML_COMPUTEMODE_DEFAULT

    @simulated(device=True)
    def nvmlDeviceGetPerformanceState(self, handle: object) -> int:
        gpu = self._gpu(handle)
        idle = gpu.utilization < 0.05
        return pynvml.NVML_PSTATE_8 if idle and gpu.model.fans else pynvml.NVML_PSTATE_0

    @simulated(device=True)
    def nvmlDeviceGetGpuFabricInfoV(self, device: object, gpuFabricInfo: Any) -> int:
        info = gpuFabricInfo._obj if hasattr(gpuFabricInfo, "_obj") else gpuFabricInfo  # byref() or the struct
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        info.status = pynvml.NVML_SUCCESS
        info.cliqueId = 1
        return pynvml.NVML_SUCCESS
