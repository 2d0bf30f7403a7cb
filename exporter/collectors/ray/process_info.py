"""Per-process facts from procfs (CPU time, memory, parent, start time, title, environment) for
the Ray collectors. psutil would do the same with more calls; these are the few fields we need."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from exporter.collectors.files import read_text

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start_ticks: int  # clock ticks after boot; with the pid, identifies the process across pid reuse
    cpu_seconds: float
    resident_bytes: int
    shared_bytes: int
    title: str  # argv[0], which Ray workers set to ray::<Class>.<method>, ray::<function> or ray::IDLE


def read_proc(procfs: Path, pid: int) -> Proc | None:
    base = procfs / str(pid)
    stat, statm = read_text(base / "stat"), read_text(base / "statm")
    try:
        argv0 = (base / "cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return None
    if stat is None or statm is None:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name in parentheses may hold spaces
    pages = statm.split()
    try:
        return Proc(pid=pid, ppid=int(fields[1]), start_ticks=int(fields[19]),
                    cpu_seconds=(int(fields[11]) + int(fields[12])) / CLK_TCK,
                    resident_bytes=int(pages[1]) * PAGE_SIZE, shared_bytes=int(pages[2]) * PAGE_SIZE,
                    title=argv0.decode(errors="replace").strip())
    except (IndexError, ValueError):
        return None


def all_processes(procfs: Path) -> dict[int, Proc]:
    processes = {}
    for entry in os.scandir(procfs):
        if entry.name.isdigit():
            proc = read_proc(procfs, int(entry.name))
            if proc is not None:
                processes[proc.pid] = proc
    return processes


def boot_time(procfs: Path) -> float | None:
    for line in (read_text(procfs / "stat") or "").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


def start_time(procfs: Path, pid: int) -> float | None:
    """Unix time the process started."""
    proc, booted = read_proc(procfs, pid), boot_time(procfs)
    return None if proc is None or booted is None else booted + proc.start_ticks / CLK_TCK


def environ_value(procfs: Path, pid: int, name: str) -> str | None:
    """One variable of the process's environment as it started, if we may read it."""
    try:
        data = (procfs / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None
