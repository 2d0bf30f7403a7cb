"""Find the cgroup this exporter measures and read it, cgroup v1 or v2, into one shape.

The cgroup is this process's own, widened to its Kubernetes pod when the path shows one (a
sidecar exporter then measures the Ray container beside it too), or the one configured.
Values a hierarchy does not offer stay None, so their series are omitted rather than faked.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from exporter.collectors.files import read_int, read_key_values, read_pressure, read_text

# Limits at or above this are "no limit" (v1 writes PAGE_COUNTER_MAX * page size, ~2^63).
_UNLIMITED = 1 << 60
# Pod directories: cgroupfs driver ".../pod<uid>/" and systemd driver "...-pod<uid_with_underscores>.slice/".
_POD_DIR = re.compile(r"^(.*/(?:[^/]*-)?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
                      r"(?:\.slice)?)(?:/|$)")
_CONTAINER_ID = re.compile(r"([0-9a-f]{64})")
_USER_HZ = os.sysconf("SC_CLK_TCK")
V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "pids", "blkio")


@dataclass(frozen=True)
class CgroupLocation:
    version: int  # 1 or 2 (a hybrid host is 1, with PSI from its unified mount)
    path: str  # what is measured, relative to the hierarchy root, e.g. /kubepods/burstable/pod<uid>
    own_path: str  # this process's own cgroup (names the container)
    dirs: dict[str, Path]  # controller ("cpu", "cpuacct", "memory", "pids", "blkio", "unified") -> directory

    @property
    def pod_uid(self) -> str:
        match = _POD_DIR.match(self.path)
        return match[2].replace("_", "-") if match else ""

    @property
    def container_id(self) -> str:
        match = _CONTAINER_ID.search(self.own_path)
        return match[1] if match else ""


@dataclass
class CgroupStats:
    cpu_usage_seconds: float | None = None
    cpu_user_seconds: float | None = None
    cpu_system_seconds: float | None = None
    cpu_periods: int | None = None
    cpu_throttled_periods: int | None = None
    cpu_throttled_seconds: float | None = None
    cpu_limit_cpus: float | None = None
    memory_usage_bytes: int | None = None
    memory_limit_bytes: int | None = None
    memory_working_set_bytes: int | None = None
    memory_anonymous_bytes: int | None = None
    memory_file_bytes: int | None = None
    memory_peak_bytes: int | None = None
    memory_swap_bytes: int | None = None
    memory_oom_kills: int | None = None
    memory_limit_hits: int | None = None
    pids: int | None = None
    pids_limit: int | None = None
    io_read_bytes: int | None = None
    io_written_bytes: int | None = None
    pressure: dict[str, dict[str, float]] = field(default_factory=dict)  # resource -> {"some"|"full": s}


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup into {controller: path}; the v2 entry is under ""."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller.removeprefix("name=")] = path
    return paths


def widen_to_pod(path: str, hierarchy: Path) -> str:
    """The pod-level cgroup above a container's, when the path shows one and it is visible here."""
    match = _POD_DIR.match(path)
    if match and (hierarchy / match[1].lstrip("/")).is_dir():
        return match[1]
    return path


def locate(cgroupfs: Path, proc_self_cgroup: str, override: str | None = None) -> CgroupLocation:
    """Where to read: `override` if given, else our own cgroup widened to its pod."""
    paths = parse_proc_cgroup(proc_self_cgroup)

    def relative(hierarchy: Path, own: str) -> str:
        return override or widen_to_pod(own, hierarchy)

    if set(paths) == {""} and (cgroupfs / "cgroup.controllers").exists():
        path = relative(cgroupfs, paths[""])
        return CgroupLocation(2, path, paths[""], {"unified": cgroupfs / path.lstrip("/")})
    dirs: dict[str, Path] = {}
    measured = {}
    for controller in (*V1_CONTROLLERS, "unified"):
        own = paths.get("" if controller == "unified" else controller)
        hierarchy = cgroupfs / controller
        if own is not None and hierarchy.is_dir():
            measured[controller] = relative(hierarchy, own)
            dirs[controller] = hierarchy / measured[controller].lstrip("/")
    own_path = paths.get("memory") or paths.get("cpu") or paths.get("", "/")
    return CgroupLocation(1, measured.get("memory", override or own_path), own_path, dirs)


def read_stats(location: CgroupLocation) -> CgroupStats:
    stats = CgroupStats()
    if location.version == 2:
        _read_v2(location.dirs["unified"], stats)
    else:
        _read_v1(location.dirs, stats)
    unified = location.dirs.get("unified")
    if unified is not None:
        for resource in ("cpu", "memory", "io"):
            totals = read_pressure(unified / f"{resource}.pressure")
            if totals is not None:
                stats.pressure[resource] = totals
    return stats


def _limit(value: int | None) -> int | None:
    return None if value is None or value >= _UNLIMITED else value


def _read_v2(directory: Path, stats: CgroupStats) -> None:
    cpu = read_key_values(directory / "cpu.stat") or {}
    if "usage_usec" in cpu:
        stats.cpu_usage_seconds = cpu["usage_usec"] / 1e6
        stats.cpu_user_seconds = cpu.get("user_usec", 0) / 1e6
        stats.cpu_system_seconds = cpu.get("system_usec", 0) / 1e6
    if "nr_periods" in cpu:
        stats.cpu_periods = cpu["nr_periods"]
        stats.cpu_throttled_periods = cpu.get("nr_throttled")
        stats.cpu_throttled_seconds = cpu.get("throttled_usec", 0) / 1e6
    cpu_max = (read_text(directory / "cpu.max") or "").split()
    if len(cpu_max) == 2 and cpu_max[0] != "max":
        stats.cpu_limit_cpus = int(cpu_max[0]) / int(cpu_max[1])
    stats.memory_usage_bytes = read_int(directory / "memory.current")
    memory_max = (read_text(directory / "memory.max") or "").strip()
    stats.memory_limit_bytes = _limit(int(memory_max)) if memory_max.isdigit() else None
    stats.memory_peak_bytes = read_int(directory / "memory.peak")
    stats.memory_swap_bytes = read_int(directory / "memory.swap.current")
    memory = read_key_values(directory / "memory.stat") or {}
    stats.memory_anonymous_bytes = memory.get("anon")
    stats.memory_file_bytes = memory.get("file")
    _working_set(stats, memory.get("inactive_file"))
    events = read_key_values(directory / "memory.events") or {}
    stats.memory_oom_kills = events.get("oom_kill")
    stats.memory_limit_hits = events.get("max")
    stats.pids = read_int(directory / "pids.current")
    stats.pids_limit = _limit(read_int(directory / "pids.max"))  # "max" does not parse: None
    io = read_text(directory / "io.stat")
    if io is not None:
        fields = [f.partition("=") for line in io.splitlines() for f in line.split()[1:]]
        stats.io_read_bytes = sum(int(v) for k, _, v in fields if k == "rbytes")
        stats.io_written_bytes = sum(int(v) for k, _, v in fields if k == "wbytes")


def _read_v1(dirs: dict[str, Path], stats: CgroupStats) -> None:
    if "cpuacct" in dirs:
        usage = read_int(dirs["cpuacct"] / "cpuacct.usage")
        stats.cpu_usage_seconds = None if usage is None else usage / 1e9
        ticks = read_key_values(dirs["cpuacct"] / "cpuacct.stat") or {}
        if "user" in ticks:
            stats.cpu_user_seconds = ticks["user"] / _USER_HZ
            stats.cpu_system_seconds = ticks.get("system", 0) / _USER_HZ
    if "cpu" in dirs:
        cpu = read_key_values(dirs["cpu"] / "cpu.stat") or {}
        if "nr_periods" in cpu:
            stats.cpu_periods = cpu["nr_periods"]
            stats.cpu_throttled_periods = cpu.get("nr_throttled")
            stats.cpu_throttled_seconds = cpu.get("throttled_time", 0) / 1e9
        quota, period = read_int(dirs["cpu"] / "cpu.cfs_quota_us"), read_int(dirs["cpu"] / "cpu.cfs_period_us")
        if quota is not None and quota > 0 and period:
            stats.cpu_limit_cpus = quota / period
    if "memory" in dirs:
        directory = dirs["memory"]
        stats.memory_usage_bytes = read_int(directory / "memory.usage_in_bytes")
        stats.memory_limit_bytes = _limit(read_int(directory / "memory.limit_in_bytes"))
        stats.memory_peak_bytes = read_int(directory / "memory.max_usage_in_bytes")
        stats.memory_limit_hits = read_int(directory / "memory.failcnt")
        memsw = read_int(directory / "memory.memsw.usage_in_bytes")
        if memsw is not None and stats.memory_usage_bytes is not None:
            stats.memory_swap_bytes = max(0, memsw - stats.memory_usage_bytes)
        memory = read_key_values(directory / "memory.stat") or {}
        stats.memory_anonymous_bytes = memory.get("total_rss")
        stats.memory_file_bytes = memory.get("total_cache")
        _working_set(stats, memory.get("total_inactive_file"))
        stats.memory_oom_kills = (read_key_values(directory / "memory.oom_control") or {}).get("oom_kill")
    if "pids" in dirs:
        stats.pids = read_int(dirs["pids"] / "pids.current")
        stats.pids_limit = _limit(read_int(dirs["pids"] / "pids.max"))
    if "blkio" in dirs:
        text = (read_text(dirs["blkio"] / "blkio.throttle.io_service_bytes_recursive")
                or read_text(dirs["blkio"] / "blkio.throttle.io_service_bytes"))
        if text is not None:
            rows = [line.split() for line in text.splitlines()]
            stats.io_read_bytes = sum(int(r[2]) for r in rows if len(r) == 3 and r[1] == "Read")
            stats.io_written_bytes = sum(int(r[2]) for r in rows if len(r) == 3 and r[1] == "Write")


def _working_set(stats: CgroupStats, inactive_file: int | None) -> None:
    """What the kubelet evicts on: usage minus the easily reclaimed inactive page cache."""
    if stats.memory_usage_bytes is not None:
        stats.memory_working_set_bytes = max(0, stats.memory_usage_bytes - (inactive_file or 0))
