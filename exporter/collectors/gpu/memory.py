"""Device memory (framebuffer) and the BAR1 aperture."""

from __future__ import annotations

from exporter.collectors.gpu.families import gpu_gauge, unsupported_on
from exporter.collectors.gpu.reader import Area, DeviceReader

TOTAL = gpu_gauge("memory_total_bytes", "Device memory.", unit="bytes")
USED = gpu_gauge("memory_used_bytes", "Device memory allocated, the driver's reserved part included.",
                 unit="bytes")
FREE = gpu_gauge("memory_free_bytes", "Device memory not allocated.", unit="bytes")
RESERVED = gpu_gauge("memory_reserved_bytes", "Device memory the driver and firmware set aside.", unit="bytes",
                     only_when=unsupported_on("drivers with nvmlMemory_v2, R510 and newer"))
BAR1_TOTAL = gpu_gauge("bar1_memory_total_bytes", "Size of the BAR1 aperture (device memory the host and peers "
                       "can map).", unit="bytes")
BAR1_USED = gpu_gauge("bar1_memory_used_bytes", "BAR1 aperture in use.", unit="bytes")


def _read(r: DeviceReader) -> None:
    memory = r.call("nvmlDeviceGetMemoryInfo", r.nvml.nvmlMemory_v2)
    if memory is None and ("nvmlDeviceGetMemoryInfo", (r.nvml.nvmlMemory_v2,)) in r.device.unsupported:
        memory = r.call("nvmlDeviceGetMemoryInfo")  # a driver without the v2 struct
    if memory is not None:
        r.add(TOTAL, memory.total)
        r.add(USED, memory.used)
        r.add(FREE, memory.free)
        r.add(RESERVED, getattr(memory, "reserved", None))
    bar1 = r.call("nvmlDeviceGetBAR1MemoryInfo")
    if bar1 is not None:
        r.add(BAR1_TOTAL, bar1.bar1Total)
        r.add(BAR1_USED, bar1.bar1Used)


AREA = Area("memory", read=_read)
