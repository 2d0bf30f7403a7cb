"""Which GPUs there are and what state they are in: identity (raypulse_gpu_info), up/lost,
persistence, compute, ECC and performance modes, the driver's recovery action, fabric state."""

from __future__ import annotations

import ctypes

import pynvml

from exporter.collectors.gpu.families import COLLECTOR, gpu_counter, gpu_gauge, gpu_info, unsupported_on
from exporter.collectors.gpu.reader import Area, DeviceReader
from exporter.framework.catalog import gauge

_ENUMERATED = "for every GPU enumerated since the exporter started, lost ones included"

INFO = gpu_info("info", "Identity of a GPU; join on uuid for its name, PCI bus id, driver and CUDA versions. "
                "simulated is true for the GPU simulator.",
                ("name", "pci_bus_id", "serial", "vbios_version", "driver_version", "cuda_driver_version",
                 "compute_capability", "architecture", "brand", "simulated"), only_when=_ENUMERATED)
POD_RESOURCES_UP = gauge("raypulse_gpu_pod_resources_up", "1 when the kubelet's pod-resources API last "
                         "answered (GPU series carry pod, namespace, container), 0 when it failed (they go "
                         "without).", collector=COLLECTOR,
                         only_when="when the pod-resources socket exists or was configured (Kubernetes nodes)")
DEVICES = gauge("raypulse_gpu_devices", "GPUs NVML enumerates now.", collector=COLLECTOR,
                only_when="while NVML is up")
UP = gpu_gauge("up", "1 if the GPU answered this run, 0 if it is lost (GPU_IS_LOST: fallen off the bus, or "
               "waiting for a reset) or no longer enumerated.", only_when=_ENUMERATED)
LOST_EVENTS = gpu_counter("lost_events_total", "Times the GPU was found lost since the exporter started.",
                          only_when=_ENUMERATED)
COLLECTION_DURATION = gpu_gauge("collection_duration_seconds", "Time the last run spent reading this GPU.",
                                unit="seconds")
PERSISTENCE_MODE = gpu_gauge("persistence_mode_enabled", "1 if persistence mode is on.",
                             only_when=unsupported_on("Linux"))
COMPUTE_MODE = gpu_gauge("compute_mode", "Compute mode: 0 default, 1 exclusive thread, 2 prohibited, "
                         "3 exclusive process.", only_when=unsupported_on("most GPUs"))
ECC_MODE = gpu_gauge("ecc_mode_enabled", "1 if ECC is on, for the current mode and the one pending a reboot.",
                     ("state",), only_when=unsupported_on("GPUs with ECC memory"))
PERFORMANCE_STATE = gpu_gauge("performance_state", "Performance state: 0 (P0, maximum) to 15 (P15, minimum).")
RECOVERY_ACTION = gpu_gauge("recovery_action", "Recovery the driver asks for: 0 none, 1 GPU reset, 2 node "
                            "reboot, 3 drain peer-to-peer, 4 drain and reset, 5 recover IMEX domain, 6 bus reset, "
                            "7 system reboot.", only_when=unsupported_on("Hopper and newer, recent drivers"))
FABRIC_STATE = gpu_gauge("fabric_state", "NVSwitch fabric registration: 1 not started, 2 in progress, "
                         "3 completed.", only_when=unsupported_on("Hopper and newer in NVSwitch systems"))
FABRIC_STATUS_OK = gpu_gauge("fabric_status_ok", "1 if the completed fabric registration succeeded.",
                             only_when=unsupported_on("Hopper and newer in NVSwitch systems"))

_BRANDS = {getattr(pynvml, n): n.removeprefix("NVML_BRAND_").lower() for n in sorted(dir(pynvml), reverse=True)
           if n.startswith("NVML_BRAND_") and n != "NVML_BRAND_COUNT"}
_ARCHITECTURES = {getattr(pynvml, n): n.removeprefix("NVML_DEVICE_ARCH_").lower() for n in dir(pynvml)
                  if n.startswith("NVML_DEVICE_ARCH_")}


def _static(r: DeviceReader) -> None:
    pci = r.call("nvmlDeviceGetPciInfo_v3")
    capability = r.call("nvmlDeviceGetCudaComputeCapability")
    brand = r.call("nvmlDeviceGetBrand")
    architecture = r.call("nvmlDeviceGetArchitecture")
    r.device.identity = {
        "name": r.call("nvmlDeviceGetName") or "",
        "pci_bus_id": pci.busId if pci is not None else "",
        "serial": r.call("nvmlDeviceGetSerial") or "",
        "vbios_version": r.call("nvmlDeviceGetVbiosVersion") or "",
        "compute_capability": f"{capability[0]}.{capability[1]}" if capability else "",
        "architecture": _ARCHITECTURES.get(architecture, "") if architecture is not None else "",
        "brand": _BRANDS.get(brand, "") if brand is not None else "",
    }


def _read(r: DeviceReader) -> None:
    r.add(PERSISTENCE_MODE, r.call("nvmlDeviceGetPersistenceMode"))
    r.add(COMPUTE_MODE, r.call("nvmlDeviceGetComputeMode"))
    ecc = r.call("nvmlDeviceGetEccMode")
    if ecc is not None:
        r.add(ECC_MODE, ecc[0], state="current")
        r.add(ECC_MODE, ecc[1], state="pending")
    state = r.call("nvmlDeviceGetPerformanceState")
    r.add(PERFORMANCE_STATE, state if state != pynvml.NVML_PSTATE_UNKNOWN else None)
    r.add(RECOVERY_ACTION, r.field(pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION))
    fabric = r.nvml.c_nvmlGpuFabricInfoV_t()
    if r.call("nvmlDeviceGetGpuFabricInfoV", ctypes.byref(fabric), key="nvmlDeviceGetGpuFabricInfoV") is not None \
            and fabric.state != pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        r.add(FABRIC_STATE, fabric.state)
        if fabric.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
            r.add(FABRIC_STATUS_OK, fabric.status == pynvml.NVML_SUCCESS)


AREA = Area("inventory", read=_read, static=_static,
            fields=lambda device: [(pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0)])
