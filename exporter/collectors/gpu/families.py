"""Shorthands for declaring GPU families: the `raypulse_gpu_` prefix, the collector, and the
`gpu` (NVML index) + `uuid` labels every per-GPU series carries, with the `pod`, `namespace` and
`container` holding the GPU (empty when no kubelet pod-resources API says, or no pod holds it)."""

from __future__ import annotations

from exporter.framework.catalog import MetricSpec, counter, gauge, info
from exporter.framework.shared import OWNER_LABELS

COLLECTOR = "gpu"
GPU_LABELS = ("gpu", "uuid", *OWNER_LABELS)
# Why a per-GPU family can be absent even on a healthy GPU node.
WHEN_UP = "while NVML is up and the GPU answers (omitted for a lost GPU)"


def _name(name: str) -> str:
    return f"raypulse_gpu_{name}"


def gpu_gauge(name: str, help: str, labels: tuple[str, ...] = (), unit: str = "",
              only_when: str | None = WHEN_UP) -> MetricSpec:
    return gauge(_name(name), help, collector=COLLECTOR, labels=(*GPU_LABELS, *labels), unit=unit,
                 only_when=only_when)


def gpu_counter(name: str, help: str, labels: tuple[str, ...] = (), unit: str = "",
                only_when: str | None = WHEN_UP) -> MetricSpec:
    return counter(_name(name), help, collector=COLLECTOR, labels=(*GPU_LABELS, *labels), unit=unit,
                   only_when=only_when)


def gpu_info(name: str, help: str, labels: tuple[str, ...], only_when: str | None = WHEN_UP) -> MetricSpec:
    return info(_name(name), help, collector=COLLECTOR, labels=(*GPU_LABELS, *labels), only_when=only_when)


def unsupported_on(what: str) -> str:
    """only_when text for a family NVML supports only on some GPUs."""
    return f"on GPUs whose NVML supports it ({what}); omitted where NVML answers NOT_SUPPORTED"
