"""The Ray processes on this host, read from procfs: which raylets run here, which of them this
exporter watches, whether one is the head, and where their dashboard and session live.

Several raylets can share a host (the launcher's local backend, tests). Each node the launcher
starts carries the Ray node label wire.NODE_LABEL_EXPORTER_PORT=<port>; an exporter watches the
raylets labelled with its own port, else every unlabelled raylet (a cluster started by hand), unless
it is told its node (`--ray-node-id`, which `launcher exporters deploy` passes).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter import wire
from exporter.config import ExporterConfig, parse_listen

DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
_WEBUI_RE = re.compile(r"--webui=(\S+)")
_SCAN_TTL_SECONDS = 1.0  # the three Ray collectors run together; one procfs scan serves them all


@dataclass(frozen=True)
class Raylet:
    pid: int
    node_id: str
    is_head: bool
    node_ip: str
    labels: Mapping[str, str] = field(default_factory=dict)
    dashboard: str | None = None  # host:port the raylet tells its workers (--webui)
    session_dir: Path | None = None

    @property
    def exporter_port(self) -> int | None:
        value = self.labels.get(wire.NODE_LABEL_EXPORTER_PORT, "")
        return int(value) if value.isdigit() else None


def parse_raylet(pid: int, argv: list[str]) -> Raylet | None:
    """A raylet from its command line (as `ray start` launches it), or None if it is not one."""
    options: dict[str, str] = {}
    flags: set[str] = set()
    for arg in argv[1:]:
        name, eq, value = arg.partition("=")
        if name.startswith("--"):
            if eq:
                options.setdefault(name[2:], value)
            else:
                flags.add(name[2:])
    node_id = options.get("node_id")
    if not node_id:
        return None
    try:
        labels = json.loads(options.get("labels") or "{}")
    except json.JSONDecodeError:
        labels = {}
    webui = _WEBUI_RE.search(options.get("python_worker_command", ""))
    session = options.get("session_dir")
    return Raylet(pid=pid, node_id=node_id, is_head="head" in flags, node_ip=options.get("node_ip_address", ""),
                  labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
                  dashboard=webui.group(1) if webui else None, session_dir=Path(session) if session else None)


def scan_raylets(procfs: Path) -> list[Raylet]:
    raylets = []
    for entry in os.scandir(procfs):
        if not entry.name.isdigit():
            continue
        try:
            if (procfs / entry.name / "comm").read_text().strip() != "raylet":
                continue
            argv = (procfs / entry.name / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        raylet = parse_raylet(int(entry.name), [a.decode(errors="replace") for a in argv if a])
        if raylet is not None:
            raylets.append(raylet)
    return sorted(raylets, key=lambda r: r.pid)


_cache: dict[Path, tuple[float, list[Raylet]]] = {}


def raylets_on_host(procfs: Path) -> list[Raylet]:
    """`scan_raylets`, shared for a second between the collectors that ask."""
    now = time.monotonic()
    cached = _cache.get(procfs)
    if cached is None or now - cached[0] > _SCAN_TTL_SECONDS:
        cached = _cache[procfs] = (now, scan_raylets(procfs))
    return cached[1]


def watched(raylets: list[Raylet], exporter_port: int, node_id: str | None = None) -> list[Raylet]:
    """The raylets this exporter reports on (see the module docstring); with `node_id`, that one only."""
    if node_id:
        return [r for r in raylets if r.node_id == node_id]
    mine = [r for r in raylets if r.exporter_port == exporter_port]
    return mine or [r for r in raylets if r.exporter_port is None]


class LocalRay:
    """This exporter's view of the Ray processes on its host, per the configuration."""

    def __init__(self, config: ExporterConfig) -> None:
        self.procfs = config.node.procfs
        self.settings = config.ray
        port = parse_listen(config.listen)[1]
        self.exporter_port = port or wire.EXPORTER_PORT

    def raylets(self) -> list[Raylet]:
        return watched(raylets_on_host(self.procfs), self.exporter_port, self.settings.node_id)

    def role(self, raylets: list[Raylet] | None = None) -> str:
        if self.settings.role != "auto":
            return self.settings.role
        raylets = self.raylets() if raylets is None else raylets
        return "head" if any(r.is_head for r in raylets) else "worker"

    def dashboard_url(self, raylets: list[Raylet] | None = None) -> str:
        if self.settings.dashboard_url:
            return self.settings.dashboard_url.rstrip("/")
        raylets = self.raylets() if raylets is None else raylets
        for raylet in [*raylets, *raylets_on_host(self.procfs)]:
            if raylet.dashboard:
                return "http://" + raylet.dashboard
        return DEFAULT_DASHBOARD
