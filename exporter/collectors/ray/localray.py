"""The Ray processes on this host, read from procfs: which raylets run here, which of them this
exporter watches, whether one is the head, where their dashboard and session live, and whether
this exporter may trust them with the Ray token.

Several raylets can share a host (the launcher's local backend, tests). Each node the launcher
starts carries the Ray node label wire.NODE_LABEL_EXPORTER_PORT=<port>; an exporter watches the
raylets labelled with its own port, else every unlabelled raylet (a cluster started by hand), unless
it is told its node (`--ray-node-id`, which `launcher exporters deploy` passes). Raylets whose node
address is not one of this host's are another host's when some raylet's is (hosts in network
namespaces sharing one process table): once an exporter has seen a raylet of its own address, it
watches only those.

Trust. Anyone on the host can start a process named `raylet`. A raylet is trusted (may make this
exporter the head, may name the dashboard that gets the Ray token) only when it runs as this
exporter's user or root (who could read the token anyway) and its executable is the raylet binary
of an installed `ray` package. The token goes to a discovered dashboard only when a trusted raylet
names it, its address is this host's (loopback or one of its own), and what listens there belongs
to this user or root; to any other dashboard it is never sent, unless `--ray-dashboard` names it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.config import ExporterConfig, parse_listen
from exporter.contract import wire

log = logging.getLogger(__name__)

DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
_WEBUI_RE = re.compile(r"--webui=(\S+)")
_SCAN_TTL_SECONDS = 1.0  # the three Ray collectors run together; one procfs scan serves them all
RAYLET_BINARY = "/core/src/ray/raylet/raylet"  # under the `ray` package directory
NOT_CHECKED = "not checked"
NOBODY_LISTENS = "nothing listens there"
# This process's own network namespace: where it connects, whatever procfs the collectors read.
SELF_NET = Path("/proc/self/net")


@dataclass(frozen=True)
class Raylet:
    pid: int
    node_id: str
    is_head: bool
    node_ip: str
    labels: Mapping[str, str] = field(default_factory=dict)
    dashboard: str | None = None  # host:port the raylet tells its workers (--webui)
    session_dir: Path | None = None
    distrust: str = NOT_CHECKED  # why it is not trusted (module docstring); "" when it is
    metrics_export_port: int | None = None  # Ray's metrics agent of this node (--metrics_export_port)

    @property
    def exporter_port(self) -> int | None:
        value = self.labels.get(wire.NODE_LABEL_EXPORTER_PORT, "")
        return int(value) if value.isdigit() else None

    @property
    def trusted(self) -> bool:
        return not self.distrust


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
    dashboard = webui.group(1) if webui and webui.group(1) != "None" else None  # a worker's raylet: "None"
    session = options.get("session_dir")
    metrics_port = options.get("metrics_export_port", "")
    return Raylet(pid=pid, node_id=node_id, is_head="head" in flags, node_ip=options.get("node_ip_address", ""),
                  labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
                  dashboard=dashboard, session_dir=Path(session) if session else None,
                  metrics_export_port=int(metrics_port) if metrics_port.isdigit() else None)


def trusted_uids() -> set[int]:
    return {os.geteuid(), 0}


def _uids(status: str) -> list[int] | None:
    for line in status.splitlines():
        if line.startswith("Uid:"):
            try:
                return [int(value) for value in line.split()[1:3]]  # real, effective
            except ValueError:
                return None
    return None


def check_raylet(procfs: Path, pid: int) -> str:
    """Why the process `pid` is not a raylet this exporter trusts, or "" when it is (module docstring)."""
    base = procfs / str(pid)
    try:
        uids = _uids((base / "status").read_text())
    except OSError:
        uids = None
    if not uids:
        return "its owner cannot be read"
    stranger = next((uid for uid in uids if uid not in trusted_uids()), None)
    if stranger is not None:
        return f"it runs as uid {stranger}, neither this exporter's uid {os.geteuid()} nor root"
    try:
        exe = os.readlink(base / "exe")
    except OSError as exc:
        return f"its executable cannot be read ({exc.strerror or exc})"
    package = exe.removesuffix(RAYLET_BINARY)
    # The package directory as the raylet sees it (its own root: a container's files, too).
    if (package == exe or not package.endswith("/ray")
            or not (base / "root" / package.lstrip("/") / "__init__.py").is_file()):
        return f"its executable {exe} is not the raylet of an installed ray package"
    return ""


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
            raylets.append(dataclasses.replace(raylet, distrust=check_raylet(procfs, raylet.pid)))
    return sorted(raylets, key=lambda r: r.pid)


_cache: dict[Path, tuple[float, list[Raylet]]] = {}


def raylets_on_host(procfs: Path) -> list[Raylet]:
    """`scan_raylets`, shared for a second between the collectors that ask."""
    now = time.monotonic()
    cached = _cache.get(procfs)
    if cached is None or now - cached[0] > _SCAN_TTL_SECONDS:
        cached = _cache[procfs] = (now, scan_raylets(procfs))
    return cached[1]


# -- this host's addresses and listening sockets (this process's network namespace) -------------

def read_local_addresses(net: Path = SELF_NET) -> set[str]:
    """The IPv4 and IPv6 addresses of this network namespace's interfaces (fib_trie, if_inet6)."""
    found: set[str] = set()
    try:
        last = ""
        for line in (net / "fib_trie").read_text().splitlines():
            text = line.strip()
            if text.startswith("|--"):
                last = text[3:].strip()
            elif text.startswith("/32 host LOCAL") and last:
                found.add(last)
    except OSError:
        pass
    try:
        for line in (net / "if_inet6").read_text().splitlines():
            parts = line.split()
            if parts and len(parts[0]) == 32:
                found.add(str(ipaddress.IPv6Address(int(parts[0], 16))))
    except (OSError, ValueError):
        pass
    return found


_addresses: tuple[float, set[str]] = (-1e9, set())


def local_addresses() -> set[str]:
    global _addresses
    now = time.monotonic()
    if now - _addresses[0] > _SCAN_TTL_SECONDS:
        _addresses = (now, read_local_addresses())
    return _addresses[1]


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def is_local_address(host: str, addresses: set[str] | None = None) -> bool:
    """Loopback, or an address of this host's interfaces; a name other than localhost is not."""
    if host == "localhost":
        return True
    ip = _address(host)
    if ip is None or ip.is_unspecified:
        return False
    return ip.is_loopback or str(ip) in (local_addresses() if addresses is None else addresses)


def _hex_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(text)  # the kernel prints each 32-bit word in host (little-endian) order
    swapped = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(swapped)


def listener_uids(host: str, port: int, net: Path = SELF_NET) -> set[int]:
    """Owners of the TCP sockets listening where a connection to host:port would land."""
    targets = {"127.0.0.1", "::1"} if host == "localhost" else {str(_address(host))}
    uids: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 8 or parts[3] != "0A":  # LISTEN
                continue
            address, _, hex_port = parts[1].partition(":")
            try:
                ip, listening_port, uid = _hex_address(address), int(hex_port, 16), int(parts[7])
            except ValueError:
                continue
            mapped = getattr(ip, "ipv4_mapped", None)
            if listening_port == port and (ip.is_unspecified or str(ip) in targets or str(mapped) in targets):
                uids.add(uid)
    return uids


_listening: dict[tuple[str, int], tuple[float, set[int]]] = {}


def _listeners(host: str, port: int) -> set[int]:
    """`listener_uids`, kept for a second (every Ray collector asks on every run)."""
    now = time.monotonic()
    cached = _listening.get((host, port))
    if cached is None or now - cached[0] > _SCAN_TTL_SECONDS:
        if len(_listening) > 64:
            _listening.clear()
        cached = _listening[(host, port)] = (now, listener_uids(host, port))
    return cached[1]


def dashboard_distrust(raylet: Raylet, addresses: set[str] | None = None) -> str:
    """Why the dashboard `raylet` names must not get the Ray token, or "" when it may. NOBODY_LISTENS
    when nothing listens there yet (no token goes, nothing to warn about: the connection fails)."""
    if raylet.distrust:
        return f"raylet {raylet.pid} names it, and that raylet is not trusted: {raylet.distrust}"
    host, _, port = (raylet.dashboard or "").rpartition(":")
    if not is_local_address(host, addresses):
        return "it is not on this host (loopback or one of its addresses)"
    owners = _listeners(host, int(port)) if port.isdigit() else set()
    if not owners:
        return NOBODY_LISTENS
    if not owners <= trusted_uids():
        return f"what listens there runs as uid {', '.join(map(str, sorted(owners)))}, not as this exporter's user"
    return ""


# -- the view of one exporter ---------------------------------------------------------------------

def watched(raylets: list[Raylet], exporter_port: int, node_id: str | None = None) -> list[Raylet]:
    """The raylets this exporter reports on (see the module docstring); with `node_id`, that one only."""
    if node_id:
        return [r for r in raylets if r.node_id == node_id]
    mine = [r for r in raylets if r.exporter_port == exporter_port]
    return mine or [r for r in raylets if r.exporter_port is None]


@dataclass(frozen=True)
class Dashboard:
    url: str
    token: bool  # whether the Ray token may be sent there
    why_not: str = ""  # why not, for a warning ("" when nothing to warn about)


_warned: set[tuple[object, ...]] = set()


def warn_once(key: tuple[object, ...], message: str, *args: object) -> None:
    if key not in _warned:
        if len(_warned) >= 256:  # bounded, whatever comes and goes on the host
            _warned.clear()
        _warned.add(key)
        log.warning(message, *args)


class LocalRay:
    """This exporter's view of the Ray processes on its host, per the configuration."""

    def __init__(self, config: ExporterConfig) -> None:
        self.procfs = config.node.procfs
        self.settings = config.ray
        port = parse_listen(config.listen)[1]
        self.exporter_port = port or wire.EXPORTER_PORT
        self._seen_own_address = False

    def host_raylets(self) -> list[Raylet]:
        """The raylets of this host: of its address once one was seen (module docstring), else all."""
        raylets = raylets_on_host(self.procfs)
        addresses = local_addresses()
        here = [r for r in raylets if is_local_address(r.node_ip, addresses)]
        self._seen_own_address = self._seen_own_address or bool(here)
        return here if self._seen_own_address else raylets

    def raylets(self) -> list[Raylet]:
        if self.settings.node_id:  # named: that one, wherever it is
            return watched(raylets_on_host(self.procfs), self.exporter_port, self.settings.node_id)
        return watched(self.host_raylets(), self.exporter_port)

    def role(self, raylets: list[Raylet] | None = None) -> str:
        if self.settings.role != "auto":
            return self.settings.role
        raylets = self.raylets() if raylets is None else raylets
        heads = [r for r in raylets if r.is_head]
        for raylet in heads:
            if raylet.distrust:
                warn_once(("head", raylet.pid, raylet.distrust),
                          "not taking the Ray head role from raylet %d (%s): %s; if it is the head, pass "
                          "--ray-role head and --ray-dashboard", raylet.pid, raylet.node_id[:12], raylet.distrust)
        return "head" if any(r.trusted for r in heads) else "worker"

    def dashboard(self, raylets: list[Raylet] | None = None) -> Dashboard:
        """Where the dashboard is and whether the Ray token may go there (module docstring)."""
        if self.settings.dashboard_url:
            return Dashboard(self.settings.dashboard_url.rstrip("/"), True)
        raylets = self.raylets() if raylets is None else raylets
        naming = [r for r in raylets if r.dashboard] or [r for r in self.host_raylets() if r.dashboard]
        if not naming:
            return Dashboard(DEFAULT_DASHBOARD, False, "no raylet of this host names it")
        addresses = local_addresses()
        verdicts = [(r, dashboard_distrust(r, addresses)) for r in naming]
        raylet, why_not = next(((r, why) for r, why in verdicts if not why), verdicts[0])
        return Dashboard("http://" + (raylet.dashboard or ""), not why_not,
                         "" if why_not == NOBODY_LISTENS else why_not)

    def dashboard_url(self, raylets: list[Raylet] | None = None) -> str:
        return self.dashboard(raylets).url

    def head_metrics_url(self, raylets: list[Raylet] | None = None) -> str | None:
        """Ray's metrics agent on the head node (the GCS's gauges are there): configured, else the port a
        trusted head raylet of this host was started with; None when neither is known."""
        if self.settings.metrics_url:
            return self.settings.metrics_url
        raylets = self.raylets() if raylets is None else raylets
        for raylet in raylets:
            if raylet.is_head and raylet.trusted and raylet.metrics_export_port and raylet.node_ip:
                host = f"[{raylet.node_ip}]" if ":" in raylet.node_ip else raylet.node_ip
                return f"http://{host}:{raylet.metrics_export_port}/metrics"
        return None
