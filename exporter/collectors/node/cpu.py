"""CPU time by mode, load average and scheduler counters from /proc/stat and /proc/loadavg."""

from __future__ import annotations

import os

from exporter.collectors.files import read_text
from exporter.config import ExporterConfig
from exporter.framework.catalog import counter, gauge
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "cpu"
# /proc/stat's cpu line, in order; guest time is already inside user/nice, so it gets its own family.
_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_GUEST_MODES = ("user", "nice")

CPU_SECONDS = counter("raypulse_node_cpu_seconds_total",
                      "CPU time spent in each mode, summed over all CPUs (guest time is inside user/nice).",
                      collector=NAME, labels=("mode",), unit="seconds")
GUEST_SECONDS = counter("raypulse_node_cpu_guest_seconds_total",
                        "CPU time spent running virtual machine guests, summed over all CPUs.",
                        collector=NAME, labels=("mode",), unit="seconds")
CPUS = gauge("raypulse_node_cpus", "Logical CPUs online.", collector=NAME)
LOAD1 = gauge("raypulse_node_load1", "1-minute load average.", collector=NAME)
LOAD5 = gauge("raypulse_node_load5", "5-minute load average.", collector=NAME)
LOAD15 = gauge("raypulse_node_load15", "15-minute load average.", collector=NAME)
CONTEXT_SWITCHES = counter("raypulse_node_context_switches_total", "Context switches.", collector=NAME)
INTERRUPTS = counter("raypulse_node_interrupts_total", "Interrupts serviced.", collector=NAME)
FORKS = counter("raypulse_node_forks_total", "Processes and threads created.", collector=NAME)
PROCS_RUNNING = gauge("raypulse_node_procs_running", "Tasks in the runnable state.", collector=NAME)
PROCS_BLOCKED = gauge("raypulse_node_procs_blocked", "Tasks blocked waiting for I/O.", collector=NAME)

_SINGLE_VALUES = {"ctxt": CONTEXT_SWITCHES, "intr": INTERRUPTS, "processes": FORKS,
                  "procs_running": PROCS_RUNNING, "procs_blocked": PROCS_BLOCKED}


@register
class CpuCollector(BlockingCollector):
    name = NAME
    description = "CPU time by mode, load average, context switches, forks (/proc/stat, /proc/loadavg)."

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._procfs = config.node.procfs
        self._ticks = os.sysconf("SC_CLK_TCK")

    def collect(self, out: SampleSink) -> None:
        stat = read_text(self._procfs / "stat")
        if stat is None:
            raise FileNotFoundError(self._procfs / "stat")
        cpus = 0
        for line in stat.splitlines():
            key, *fields = line.split()
            if key == "cpu":
                self._cpu_line([int(v) for v in fields], out)
            elif key.startswith("cpu"):
                cpus += 1
            elif key in _SINGLE_VALUES and fields:
                out.add(_SINGLE_VALUES[key], int(fields[0]))
        out.add(CPUS, cpus)
        loadavg = read_text(self._procfs / "loadavg")
        if loadavg is not None:
            for spec, value in zip((LOAD1, LOAD5, LOAD15), loadavg.split(), strict=False):
                out.add(spec, float(value))

    def _cpu_line(self, ticks: list[int], out: SampleSink) -> None:
        for mode, value in zip(_MODES, ticks, strict=False):
            out.add(CPU_SECONDS, value / self._ticks, mode=mode)
        for mode, value in zip(_GUEST_MODES, ticks[len(_MODES):], strict=False):
            out.add(GUEST_SECONDS, value / self._ticks, mode=mode)
