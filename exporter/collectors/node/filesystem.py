"""Mounted filesystems: size, free space and inodes, plus the volumes of watched paths.

Watched paths are the ones training depends on: checkpoint directories (configured), Ray's temp
and spill directory, and its object store (/dev/shm). `raypulse_node_filesystem_path_info` maps
each to the mount point holding it, so an alert can join on `mountpoint`.

statvfs on a dead NFS server blocks forever, so each mount is stat'ed in a daemon thread with a
timeout; a mount whose stat is still stuck is skipped (`device_error` 1) until it returns, and
the other mounts keep reporting.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exporter.collectors.files import read_text
from exporter.config import ExporterConfig
from exporter.framework.catalog import gauge, info
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "filesystem"
_LABELS = ("mountpoint",)


def _gauge(name: str, help: str, unit: str = ""):
    return gauge(f"raypulse_node_filesystem_{name}", help, collector=NAME, labels=_LABELS, unit=unit,
                 only_when=None if name == "device_error" else "when the mount's statvfs answers")


SIZE = _gauge("size_bytes", "Filesystem size.", "bytes")
AVAIL = _gauge("avail_bytes", "Space available to unprivileged users.", "bytes")
FREE = _gauge("free_bytes", "Free space, including space reserved for root.", "bytes")
FILES = _gauge("files", "Inodes.")
FILES_FREE = _gauge("files_free", "Free inodes.")
READONLY = _gauge("readonly", "1 if the filesystem is mounted read-only.")
DEVICE_ERROR = _gauge("device_error", "1 if statvfs failed or is stuck (a hung network mount).")
INFO = info("raypulse_node_filesystem_info", "Device and type of a reported mount point.", collector=NAME,
            labels=("mountpoint", "device", "fstype"))
PATH_INFO = info("raypulse_node_filesystem_path_info",
                 "A watched path (role checkpoint, ray_temp or object_store) and the mount point holding it.",
                 collector=NAME, labels=("path", "role", "mountpoint"))


@dataclass(frozen=True)
class Mount:
    device: str
    mountpoint: str
    fstype: str
    readonly: bool


def parse_mounts(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        device, mountpoint, fstype, options = (_unescape(f) for f in fields[:4])
        mounts.append(Mount(device, mountpoint, fstype, "ro" in options.split(",")))
    return mounts


def _unescape(field: str) -> str:
    """Mount tables escape space, tab, newline and backslash as octal (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def mount_holding(path: Path, mountpoints: list[str]) -> str | None:
    """The longest mount point that is `path` or one of its parents."""
    text = os.path.normpath(str(path))
    best = None
    for mountpoint in mountpoints:
        inside = text == mountpoint or text.startswith(mountpoint.rstrip("/") + "/")
        if inside and (best is None or len(mountpoint) > len(best)):
            best = mountpoint
    return best


class StatvfsWithTimeout:
    """statvfs in a daemon thread per call; a call that has not returned blocks only its mount."""

    def __init__(self, timeout: float, stat: Callable[[str], os.statvfs_result] = os.statvfs) -> None:
        self._timeout = timeout
        self._stat = stat
        self._stuck: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, path: str) -> os.statvfs_result | None:
        with self._lock:
            if path in self._stuck:
                return None
        result: list[os.statvfs_result | BaseException] = []
        done = threading.Event()

        def stat() -> None:
            try:
                result.append(self._stat(path))
            except OSError as exc:
                result.append(exc)
            finally:
                done.set()
                with self._lock:
                    self._stuck.discard(path)

        with self._lock:
            self._stuck.add(path)
        threading.Thread(target=stat, name=f"statvfs {path}", daemon=True).start()
        if not done.wait(self._timeout):
            return None
        value = result[0]
        return None if isinstance(value, BaseException) else value


@register
class FilesystemCollector(BlockingCollector):
    name = NAME
    description = ("Filesystem size, free space and inodes per mount point, and which mounts hold the "
                   "checkpoint, Ray temp and object store paths (/proc/1/mounts, statvfs).")
    default_interval = 15.0

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        node = config.node
        self._procfs = node.procfs
        self._rootfs = node.rootfs
        self._exclude_fstypes = re.compile(node.filesystem_exclude_fstypes)
        self._exclude_mountpoints = re.compile(node.filesystem_exclude_mountpoints)
        self._watched = ([(path, "checkpoint") for path in node.checkpoint_paths]
                         + [(node.ray_temp_dir, "ray_temp"), (node.object_store_dir, "object_store")])
        self._statvfs = StatvfsWithTimeout(node.filesystem_stat_timeout_seconds)

    def _mounts(self) -> list[Mount]:
        # PID 1's table is the host's when the host's /proc is mounted in; ours otherwise.
        text = read_text(self._procfs / "1" / "mounts") or read_text(self._procfs / "self" / "mounts")
        if text is None:
            raise FileNotFoundError(self._procfs / "self" / "mounts")
        by_mountpoint = {m.mountpoint: m for m in parse_mounts(text)}  # later mounts shadow earlier ones
        return list(by_mountpoint.values())

    def collect(self, out: SampleSink) -> None:
        mounts = self._mounts()
        mountpoints = [m.mountpoint for m in mounts]
        holding: set[str] = set()
        for path, role in self._watched:
            mountpoint = mount_holding(path, mountpoints)
            if mountpoint is not None:
                holding.add(mountpoint)
                out.add_info(PATH_INFO, path=os.path.normpath(str(path)), role=role, mountpoint=mountpoint)
        for mount in mounts:
            if mount.mountpoint in holding or not (self._exclude_fstypes.match(mount.fstype)
                                                   or self._exclude_mountpoints.match(mount.mountpoint)):
                self._report(mount, out)

    def _report(self, mount: Mount, out: SampleSink) -> None:
        labels = {"mountpoint": mount.mountpoint}
        out.add_info(INFO, device=mount.device, fstype=mount.fstype, **labels)
        stat = self._statvfs(str(self._rootfs / mount.mountpoint.lstrip("/")))
        out.add(DEVICE_ERROR, stat is None, **labels)
        if stat is None:
            out.partial_error()
            return
        out.add(SIZE, stat.f_blocks * stat.f_frsize, **labels)
        out.add(FREE, stat.f_bfree * stat.f_frsize, **labels)
        out.add(AVAIL, stat.f_bavail * stat.f_frsize, **labels)
        out.add(FILES, stat.f_files, **labels)
        out.add(FILES_FREE, stat.f_ffree, **labels)
        out.add(READONLY, mount.readonly or bool(stat.f_flag & os.ST_RDONLY), **labels)
