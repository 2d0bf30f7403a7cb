"""Coarse utilization NVML samples itself: kernels running, memory interface busy, video engines."""

from __future__ import annotations

from exporter.collectors.gpu.families import gpu_gauge, unsupported_on
from exporter.collectors.gpu.reader import Area, DeviceReader

UTILIZATION = gpu_gauge("utilization_ratio", "Share of the last sample period in which a kernel was running "
                        "(nvidia-smi's GPU-Util).", unit="ratio", only_when=unsupported_on("not with MIG enabled"))
MEMORY_BANDWIDTH = gpu_gauge("memory_bandwidth_utilization_ratio", "Share of the last sample period in which "
                             "device memory was read or written.", unit="ratio",
                             only_when=unsupported_on("not with MIG enabled"))
ENCODER = gpu_gauge("encoder_utilization_ratio", "Video encoder (NVENC) utilization.", unit="ratio",
                    only_when=unsupported_on("GPUs with NVENC"))
DECODER = gpu_gauge("decoder_utilization_ratio", "Video decoder (NVDEC) utilization.", unit="ratio",
                    only_when=unsupported_on("GPUs with NVDEC"))


def _percent(value: float | None) -> float | None:
    return None if value is None else value / 100


def _read(r: DeviceReader) -> None:
    rates = r.call("nvmlDeviceGetUtilizationRates")
    if rates is not None:
        r.add(UTILIZATION, rates.gpu / 100)
        r.add(MEMORY_BANDWIDTH, rates.memory / 100)
    encoder = r.call("nvmlDeviceGetEncoderUtilization")
    r.add(ENCODER, _percent(encoder[0]) if encoder else None)
    decoder = r.call("nvmlDeviceGetDecoderUtilization")
    r.add(DECODER, _percent(decoder[0]) if decoder else None)


AREA = Area("utilization", read=_read)
