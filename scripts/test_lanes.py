"""`make test`: the suite as two pytest sessions side by side. The heavy lane (tests marked `ray`, which
start a Ray cluster, one at a time on this machine, and `online`, which need the package registries) runs
one test after another and prints as it goes; the light lane (everything else) runs beside it, niced, on
two workers, its output saved and printed once it ends. The exit status is the heavy lane's, or the light
lane's when only that failed.

The light lane runs in namespaces of its own (PID, mount, network) where this machine allows them (root):
an exporter started by a light test finds Ray clusters through /proc, /tmp/ray and 127.0.0.1:8265, and
without them it found the heavy lane's cluster and read it (four tests failed that way; one lost its
port to the heavy lane). Elsewhere the light lane shares the machine, says so, and leaves the `slow` tests
to the heavy lane.

At the end, after both lanes' results, the slowest tests of both (from each lane's JUnit report: a test's
setup, call and teardown together, so a module fixture's start counts in its first test), so that a test
that became slow shows.

pytest-xdist's `--dist loadgroup` would do this in one session, but its groups do not reach the test
ids under pytest 9.2 (it sets a private attribute pytest no longer reads), so the groups mix and two
Ray clusters run at once.

    python -m scripts.test_lanes [pytest arguments for both lanes]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from xml.etree import ElementTree

HEAVY = "ray or online"
# Without namespaces the slow tests stay heavy too: several start an exporter that would find the heavy
# lane's Ray cluster on this machine and read it (four failed that way beside it).
HEAVY_SHARED = "ray or slow or online"
LIGHT_NICENESS = 10
# The light lane's tests wait on their servers and subprocesses about half their time (its files' CPU is
# about 0.6 of a core over its length): two workers, a file's tests on one (their module fixtures).
LIGHT_WORKERS = ["-n", "2", "--dist", "loadfile"]
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
    run(["mount", "-t", "tmpfs", "raypulse-light-lane", str(RAY_TEMP)])


def run(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=30)


def first_process(command: list[str]) -> int:
    """PID 1 of the light lane: run `command` and reap every process orphaned to it until it ends (a
    test's leftovers would otherwise stay zombies); its exit status is the command's."""
    prepare_namespaces()
    child = subprocess.Popen(command)
    while True:
        pid, status = os.wait()
        if pid == child.pid:
            return os.waitstatus_to_exitcode(status)


def namespaces() -> tuple[list[str], str]:
    """The prefix that puts the light lane in namespaces of its own, or none and why not."""
    try:
        probe = subprocess.run([*NAMESPACES, sys.executable, "-c", "from scripts.test_lanes import prepare_namespaces;"
                                " prepare_namespaces()"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return [], str(error)
    if probe.returncode != 0:
        return [], (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
    return [*NAMESPACES, sys.executable, "-m", "scripts.test_lanes", IN_NAMESPACES], ""


def main(args: list[str]) -> int:
    prefix, why_not = namespaces()
    heavy_marks = HEAVY_SHARED if why_not else HEAVY
    if why_not:
        print(f"test lanes: the light lane shares this machine's processes and network ({why_not}); the slow "
              "tests run in the heavy lane, and an exporter a light test starts may find its Ray cluster", flush=True)
    with tempfile.TemporaryDirectory(prefix="raypulse-lanes-") as temp:
        log = Path(temp) / "light.log"
        reports = {lane: Path(temp) / f"{lane}.xml" for lane in ("heavy", "light")}
        with log.open("wb") as out:
            # Niced: a Ray test waits on its cluster's processes, which come first; the light lane takes the rest.
            light = subprocess.Popen([*prefix, *pytest_command(f"not ({heavy_marks})", [*LIGHT_WORKERS, *args],
                                                               ".pytest_cache/light", reports["light"])],
                                     stdout=out, stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(LIGHT_NICENESS))
            try:
                heavy = subprocess.Popen(pytest_command(heavy_marks, args, ".pytest_cache/heavy",
                                                        reports["heavy"])).wait()
                light_status = light.wait()
            finally:
                if light.poll() is None:
                    light.kill()
                    light.wait()
        print("\n=========================== the light lane ===========================", flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
        print(f"\n===================== the {SLOWEST} slowest tests of both lanes =====================")
        for seconds, lane, test in slowest(reports):
            print(f"{seconds:8.2f}s  {lane:5}  {test}")
        sys.stdout.flush()
    statuses = [status for status in (heavy, light_status) if status != NO_TESTS] or [NO_TESTS]
    return next((status for status in statuses if status != 0), 0)


if __name__ == "__main__":
    if sys.argv[1:2] == [IN_NAMESPACES]:
        sys.exit(first_process(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
