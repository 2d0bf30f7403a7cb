"""`make test`: the suite as three pytest sessions side by side. The heavy lane (tests marked `ray`, which
start a Ray cluster, and `online`, which need the package registries) runs one test after another and
prints as it goes; the Ray lane apart (tests marked `apart`: Ray tests that need nothing of this machine's
network) runs its Ray tests one after another beside it, in namespaces of its own; the light lane
(everything else) runs beside both, niced. The two other lanes' output is saved and printed once they
end. The exit status is the first failing lane's (heavy, apart, light).

Ray tests wait on their clusters far more than they compute, so two of them at once fit 2 cores: one
Ray lane took 25 minutes, the heavy lane alone (the critical path) now about half of that. Two clusters
on one network would take each other's ports and read each other's exporters, so the second Ray lane
gets its own network, PID and mount namespaces, as the light lane does (a light test's exporter finds Ray
clusters through /proc, /tmp/ray and 127.0.0.1:8265: without them four light tests read the heavy lane's
cluster). The heavy lane stays on the machine's network: its `online` tests reach the registries and
test_two_hosts makes network namespaces of its own. Where this machine allows no namespaces (not root),
the light lane shares the machine and says so, and the heavy lane takes the `apart` and `slow` tests too.

At the end, after every lane's results, the slowest tests of all (from each lane's JUnit report: a test's
setup, call and teardown together, so a module fixture's start counts in its first test), so that a test
that became slow shows, and which lane to move a file to when one lane runs longer than the other.

pytest-xdist's `--dist loadgroup` would do this in one session, but its groups do not reach the test
ids under pytest 9.2 (it sets a private attribute pytest no longer reads), so the groups mix and two
Ray clusters run at once on one network.

    python -m scripts.test_lanes [pytest arguments for every lane]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

HEAVY = "(ray or online) and not apart"
APART = "apart"
LIGHT = "not (ray or online or apart)"
# Without namespaces one lane takes every Ray test and the slow ones: several slow tests start an
# exporter that would find a Ray cluster on this machine and read it (four failed that way beside it).
HEAVY_SHARED = "ray or slow or online or apart"
LIGHT_NICENESS = 10
NO_TESTS = 5  # pytest's exit status when a lane's selection is empty (a path with only light tests)
# --kill-child: the namespace's first process, and so all of it, goes when this process does.
NAMESPACES = ["unshare", "--pid", "--fork", "--mount-proc", "--net", "--kill-child"]
RAY_TEMP = Path("/tmp/ray")  # Ray's default temp dir: a session a light test must not find
IN_NAMESPACES = "--in-namespaces"  # the first argument of this module as the namespaces' first process
SLOWEST = 20  # how many of the slowest tests the run ends with


def pytest_command(marks: str, args: list[str], cache: str, report: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", marks, "-o", f"cache_dir={cache}", *args, f"--junitxml={report}"]


def slowest(reports: dict[str, Path], count: int = SLOWEST) -> list[tuple[float, str, str]]:
    """The `count` longest tests of the lanes' JUnit reports, as (seconds, lane, test), longest first; a
    lane that wrote no report (stopped early) adds none."""
    tests = []
    for lane, report in reports.items():
        try:
            cases = ElementTree.parse(report).getroot().iter("testcase")
        except (OSError, ElementTree.ParseError):
            continue
        tests += [(float(case.get("time") or 0), lane, f"{case.get('classname')}::{case.get('name')}")
                  for case in cases]
    return sorted(tests, reverse=True)[:count]


def prepare_namespaces() -> None:
    """Inside the fresh namespaces, a node as the tests expect one: loopback up (a new network namespace
    has it down), an interface beside it (a veth pair: no dummy module here), /sys/class/net naming this
    namespace's interfaces (sysfs shows the ones of the namespace that mounted it), and an empty, private
    Ray temp dir."""
    for command in (["ip", "link", "set", "lo", "up"], ["ip", "link", "add", "eth0", "type", "veth", "peer", "eth1"],
                    ["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "eth1", "up"]):
        run(command)
    sysfs = Path(tempfile.mkdtemp(prefix="raypulse-lane-sysfs-"))
    run(["mount", "-t", "sysfs", "sysfs", str(sysfs)])
    for net in ("class/net", "devices/virtual/net"):  # only these: /sys/fs/cgroup stays the machine's
        run(["mount", "--bind", str(sysfs / net), f"/sys/{net}"])
    run(["umount", "--lazy", str(sysfs)])
    sysfs.rmdir()
    RAY_TEMP.mkdir(parents=True, exist_ok=True)
    run(["mount", "-t", "tmpfs", "raypulse-lane", str(RAY_TEMP)])


def run(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=30)


def first_process(command: list[str]) -> int:
    """PID 1 of a lane in namespaces: run `command` and reap every process orphaned to it until it ends (a
    test's leftovers would otherwise stay zombies); its exit status is the command's."""
    prepare_namespaces()
    child = subprocess.Popen(command)
    while True:
        pid, status = os.wait()
        if pid == child.pid:
            return os.waitstatus_to_exitcode(status)


def namespaces() -> tuple[list[str], str]:
    """The prefix that puts a lane in namespaces of its own (a fresh set each time it is used), or none and
    why not."""
    try:
        probe = subprocess.run([*NAMESPACES, sys.executable, "-c", "from scripts.test_lanes import prepare_namespaces;"
                                " prepare_namespaces()"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return [], str(error)
    if probe.returncode != 0:
        return [], (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
    return [*NAMESPACES, sys.executable, "-m", "scripts.test_lanes", IN_NAMESPACES], ""


@dataclass
class Lane:
    """One pytest session of `make test`: its name, its marks, whether it runs in namespaces of its own,
    and whether it is niced (behind the Ray lanes, whose tests wait on their clusters' processes)."""

    name: str
    marks: str
    isolated: bool
    niced: bool = False


def lanes(isolated: bool) -> list[Lane]:
    """The lanes, printing first the one whose output is shown as it goes."""
    if not isolated:
        return [Lane("heavy", HEAVY_SHARED, False), Lane("light", f"not ({HEAVY_SHARED})", False, niced=True)]
    return [Lane("heavy", HEAVY, False), Lane("apart", APART, True), Lane("light", LIGHT, True, niced=True)]


def main(args: list[str]) -> int:
    prefix, why_not = namespaces()
    if why_not:
        print(f"test lanes: the light lane shares this machine's processes and network ({why_not}); the slow "
              "and apart tests run in the heavy lane, and an exporter a light test starts may find its Ray "
              "cluster", flush=True)
    first, *others = lanes(not why_not)
    with tempfile.TemporaryDirectory(prefix="raypulse-lanes-") as temp:
        reports = {lane.name: Path(temp) / f"{lane.name}.xml" for lane in (first, *others)}
        logs = {lane.name: Path(temp) / f"{lane.name}.log" for lane in others}
        started: dict[str, subprocess.Popen] = {}
        statuses: dict[str, int] = {}
        try:
            for lane in others:
                with logs[lane.name].open("wb") as out:
                    started[lane.name] = subprocess.Popen(
                        [*(prefix if lane.isolated else []),
                         *pytest_command(lane.marks, args, f".pytest_cache/{lane.name}", reports[lane.name])],
                        stdout=out, stderr=subprocess.STDOUT,
                        preexec_fn=(lambda: os.nice(LIGHT_NICENESS)) if lane.niced else None)
            statuses[first.name] = subprocess.Popen(pytest_command(first.marks, args, f".pytest_cache/{first.name}",
                                                                   reports[first.name])).wait()
            for name, process in started.items():
                statuses[name] = process.wait()
        finally:
            for process in started.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()
        for lane in others:
            print(f"\n=========================== the {lane.name} lane ===========================", flush=True)
            sys.stdout.write(logs[lane.name].read_text(errors="replace"))
        print(f"\n===================== the {SLOWEST} slowest tests of all lanes =====================")
        for seconds, lane_name, test in slowest(reports):
            print(f"{seconds:8.2f}s  {lane_name:5}  {test}")
        sys.stdout.flush()
    ran = [status for status in statuses.values() if status != NO_TESTS] or [NO_TESTS]
    return next((status for status in ran if status != 0), 0)


if __name__ == "__main__":
    if sys.argv[1:2] == [IN_NAMESPACES]:
        sys.exit(first_process(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
