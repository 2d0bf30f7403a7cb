"""Pressure stall information (PSI) families, shared by the node and pod collectors: node
(/proc/pressure) and cgroup (cpu.pressure, ...) PSI files have one format (files.read_pressure)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.framework.catalog import MetricSpec, counter
from exporter.framework.snapshot import SampleSink

RESOURCES = ("cpu", "memory", "io")


@dataclass(frozen=True)
class PressureFamilies:
    """The two PSI families of a domain (node, pod)."""

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
