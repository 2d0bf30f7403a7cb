"""Pressure stall information (PSI) of the whole node from /proc/pressure."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.catalog import MetricSpec, counter
from exporter.collector import BlockingCollector, register
from exporter.collectors.files import read_pressure
from exporter.config import ExporterConfig
from exporter.snapshot import SampleSink

NAME = "pressure"
RESOURCES = ("cpu", "memory", "io")
_PSI = "on kernels with pressure stall information (4.20+, not booted with psi=0)"



@dataclass(frozen=True)
class PressureFamilies:
    """The two PSI families of a domain; node and pod PSI files share one format."""

    waiting: MetricSpec
    stalled: MetricSpec

    @classmethod
    def declare(cls, domain: str, whose: str, collector: str, only_when: str) -> PressureFamilies:
        return cls(
            counter(f"raypulse_{domain}_pressure_waiting_seconds_total",
                    f"Time at least one of {whose} tasks stalled waiting for the resource (PSI 'some').",
                    collector=collector, labels=("resource",), unit="seconds", only_when=only_when),
            counter(f"raypulse_{domain}_pressure_stalled_seconds_total",
                    f"Time all of {whose} non-idle tasks stalled on the resource at once (PSI 'full').",
                    collector=collector, labels=("resource",), unit="seconds", only_when=only_when))

    def add(self, out: SampleSink, resource: str, totals: dict[str, float] | None) -> None:
        if totals is not None:
            out.add(self.waiting, totals.get("some"), resource=resource)
            out.add(self.stalled, totals.get("full"), resource=resource)


NODE_PRESSURE = PressureFamilies.declare("node", "the node's", NAME, _PSI)


@register
class PressureCollector(BlockingCollector):
    name = NAME
    description = "Pressure stall information for CPU, memory and I/O (/proc/pressure)."

    def __init__(self, config: ExporterConfig) -> None:
        super().__init__(config)
        self._dir = config.node.procfs / "pressure"

    def collect(self, out: SampleSink) -> None:
        for resource in RESOURCES:
            NODE_PRESSURE.add(out, resource, read_pressure(self._dir / resource))
