"""Hosts in network namespaces, for topology tests: each "host" is a network namespace with one
veth link to a bridge in the root namespace, which has an address on the same subnet (so processes
in the root namespace, e.g. Prometheus, reach every host). Needs root (`ip netns`, veth, bridge).

    with hosts.Topology(["a", "b"]) as net:
        net["a"].popen(["ray", "start", ...])    # runs in host a's namespace, at net["a"].address
        net["b"].cut()                           # its link down: nobody reaches it, it reaches nobody

Everything made is named with PREFIX, and leftovers of an earlier run (a killed test) are removed
by that name at the start. Leaving a topology kills every process still in its namespaces (the
namespace is the marker: whatever runs there was started there), then deletes namespaces, links and
the bridge; each step is tried even when an earlier one fails.
One topology at a time on a machine (the names are fixed; the Ray tests' lock serializes them).
`python -m scripts.hosts --cleanup` removes leftovers by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "rph-"  # namespaces rph-<host>, root-side veths rph-<host>, the bridge rph-br
BRIDGE = PREFIX + "br"
SUBNET = "10.213.7.0/24"
NETNS_ETC = Path("/etc/netns")  # per-namespace files `ip netns exec` mounts over /etc
_MAX_NAME = 15 - len(PREFIX)  # Linux interface names are at most 15 bytes


def unavailable() -> str | None:
    """Why this process cannot make a topology (root with CAP_NET_ADMIN and CAP_SYS_ADMIN, and
    iproute2, are needed), or None."""
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    try:
        status = Path("/proc/self/status").read_text()
        effective = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)
    except (OSError, StopIteration, ValueError):
        return "cannot read this process's capabilities"
    if os.geteuid() != 0 or not effective & (1 << 12) or not effective & (1 << 21):
        return "needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN (network namespaces)"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def namespace_pids(namespace: str) -> list[int]:
    result = ip("netns", "pids", namespace, check=False)
    return [int(pid) for pid in result.stdout.split() if pid.isdigit()]


def kill_namespace(namespace: str, timeout: float = 20.0) -> list[int]:
    """SIGKILL every process in the namespace until none is left (or `timeout`); what is left."""
    deadline = time.monotonic() + timeout
    while (pids := namespace_pids(namespace)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    return namespace_pids(namespace)


def cleanup(prefix: str = PREFIX) -> list[str]:
    """Remove every namespace and link named with `prefix` (and what runs in those namespaces);
    the names it could not remove."""
    left = []
    namespaces = [line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    for namespace in (n for n in namespaces if n.startswith(prefix)):
        kill_namespace(namespace)
        if ip("netns", "del", namespace, check=False).returncode != 0:
            left.append(namespace)
    for directory in NETNS_ETC.glob(prefix + "*"):
        shutil.rmtree(directory, ignore_errors=True)
    # A namespace's veth goes with it, a moment later (the kernel removes it asynchronously).
    deadline = time.monotonic() + 10
    while (links := _links(prefix)) and time.monotonic() < deadline:
        for name in links:
            ip("link", "del", name, check=False)
        time.sleep(0.1)
    return left + _links(prefix)


def _links(prefix: str) -> list[str]:
    names = []
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0] if line.count(":") >= 2 else ""
        if name.startswith(prefix):
            names.append(name)
    return names


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    link: str  # the root-side end of its veth, on the bridge

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run in this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        kwargs.setdefault("timeout", 120)
        return subprocess.run(self.command(argv), **kwargs)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def cut(self) -> None:
        """Take its link down: the host is cut off from the bridge, the root namespace and the others."""
        ip("link", "set", self.link, "down")

    def reconnect(self) -> None:
        ip("link", "set", self.link, "up")


class Topology:
    """Hosts named `names` on one bridge; `with` makes them and always removes them."""

    def __init__(self, names: Sequence[str], subnet: str = SUBNET) -> None:
        network = ipaddress.ip_network(subnet)
        addresses = list(network.hosts())
        if len(names) + 1 > len(addresses):
            raise ValueError(f"{subnet} has room for {len(addresses) - 1} hosts")
        for name in names:
            if not name.isalnum() or len(name) > _MAX_NAME - 3 or PREFIX + name == BRIDGE:
                raise ValueError(f"host name {name!r}: letters and digits, at most {_MAX_NAME - 3}")
        self.prefixlen = network.prefixlen
        self.gateway = str(addresses[0])  # the bridge's address, in the root namespace
        self.hosts = {name: Host(name, PREFIX + name, str(addresses[i + 1]), PREFIX + name)
                      for i, name in enumerate(names)}

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def up(self) -> Topology:
        cleanup()
        try:
            overlap = [line for line in ip("route", "show").stdout.splitlines()
                       if ipaddress.ip_network(self.gateway + f"/{self.prefixlen}", strict=False)
                       .overlaps(_route_network(line))]
            if overlap:
                raise RuntimeError(f"the subnet of the topology is already routed here: {overlap}")
            ip("link", "add", BRIDGE, "type", "bridge")
            ip("addr", "add", f"{self.gateway}/{self.prefixlen}", "dev", BRIDGE)
            ip("link", "set", BRIDGE, "up")
            for host in self.hosts.values():
                inside = host.link + "-ns"
                ip("netns", "add", host.namespace)
                # `ip netns exec` mounts this over /etc/resolv.conf: the host's DNS server is out of reach
                # from the namespace, and a lookup (a reverse one on bind, say) would wait for its timeout.
                (NETNS_ETC / host.namespace).mkdir(parents=True, exist_ok=True)
                (NETNS_ETC / host.namespace / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1\n")
                ip("link", "add", host.link, "type", "veth", "peer", "name", inside)
                ip("link", "set", inside, "netns", host.namespace)
                ip("-n", host.namespace, "link", "set", inside, "name", "eth0")
                ip("-n", host.namespace, "addr", "add", f"{host.address}/{self.prefixlen}", "dev", "eth0")
                ip("-n", host.namespace, "link", "set", "eth0", "up")
                ip("-n", host.namespace, "link", "set", "lo", "up")
                ip("-n", host.namespace, "route", "add", "default", "via", self.gateway)
                ip("link", "set", host.link, "master", BRIDGE)
                ip("link", "set", host.link, "up")
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        left = cleanup()
        if left:
            raise RuntimeError(f"could not remove {left}")

    def __enter__(self) -> Topology:
        return self.up()

    def __exit__(self, *exc_info: object) -> None:
        self.down()


def _route_network(line: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    first = line.split()[0] if line.split() else ""
    try:
        return ipaddress.ip_network(first, strict=False)
    except ValueError:  # "default" and the like
        return ipaddress.ip_network("255.255.255.255/32")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.hosts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cleanup", action="store_true", help=f"remove namespaces and links named {PREFIX}*")
    args = parser.parse_args(argv)
    if args.cleanup:
        left = cleanup()
        print("left: " + ", ".join(left) if left else "nothing left")
        return 1 if left else 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())

