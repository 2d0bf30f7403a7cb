"""Pressure stall information (PSI) of the whole node from /proc/pressure."""

from __future__ import annotations

from exporter.collectors.files import read_pressure
from exporter.collectors.psi import RESOURCES, PressureFamilies
from exporter.config import ExporterConfig
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "pressure"
_PSI = "on kernels with pressure stall information (4.20+, not booted with psi=0)"



NODE_PRESSURE = PressureFamilies.declare("node", "the node's", NAME, _PSI)


@register
class PressureCollector(BlockingCollector):
    name = NAME
    description = "Pressure stall information for CPU, memory and I/O (/proc/pressure)."

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._dir = config.node.procfs / "pressure"

    def collect(self, out: SampleSink) -> None:
        for resource in RESOURCES:
            NODE_PRESSURE.add(out, resource, read_pressure(self._dir / resource))
