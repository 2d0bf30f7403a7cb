"""`make test`'s two lanes (scripts/test_lanes.py): a failure in either lane fails the run, the light
lane's output is shown after the heavy one's, and the slowest tests of both after that."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import test_lanes

TESTS = """
import pytest

@pytest.mark.ray
def test_heavy():
    assert {heavy}

def test_light():
    assert {light}
"""


@pytest.mark.parametrize(("heavy", "light", "status"), [(True, True, 0), (True, False, 1), (False, True, 1)])
def test_either_lane_failing_fails_the_run(tmp_path: Path, capfd: pytest.CaptureFixture[str], heavy: bool,
                                           light: bool, status: int):
    tests = tmp_path / "test_lanes_sample.py"
    tests.write_text(TESTS.format(heavy=heavy, light=light))
    assert test_lanes.main(["-q", "--rootdir", str(tmp_path), str(tests)]) == status
    out = capfd.readouterr().out
    light_lane, slowest = out[out.index("=== the light lane ==="):].split("slowest tests of both lanes")
    assert ("1 passed" if light else "1 failed") in light_lane
    assert {tuple(line.split()[1:]) for line in slowest.splitlines()[1:] if line} == {
        ("heavy", "test_lanes_sample::test_heavy"), ("light", "test_lanes_sample::test_light")}


# The heavy test listens on a port and waits for the light test, which must not see it: neither its
# process in /proc nor its port on loopback (and may take the same port itself).
ISOLATED = """
import os, socket, time
from pathlib import Path
import psutil, pytest

SHARED = Path({shared!r})

def wait_for(path):
    deadline = time.monotonic() + 120
    while not path.exists():
        assert time.monotonic() < deadline, path
        time.sleep(0.05)

@pytest.mark.ray
def test_heavy():
    server = socket.create_server(("127.0.0.1", 0))
    (SHARED / "heavy").write_text(f"{{os.getpid()}} {{server.getsockname()[1]}}")
    wait_for(SHARED / "light-done")

def test_light():
    wait_for(SHARED / "heavy")
    pid, port = (SHARED / "heavy").read_text().split()
    try:
        heavy_lane = [p for p in psutil.process_iter(["cmdline"]) if {heavy!r} in (p.info["cmdline"] or [])]
        assert heavy_lane == []
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(port)), timeout=5)
        socket.create_server(("127.0.0.1", int(port))).close()
        assert list(Path("/tmp/ray").iterdir()) == []
        # and yet a node's interfaces: one beside loopback, the same in procfs and sysfs
        in_procfs = {{line.split(":")[0].strip() for line in Path("/proc/net/dev").read_text().splitlines()[2:]}}
        assert in_procfs == set(os.listdir("/sys/class/net")) and len(in_procfs) > 1
    finally:
        (SHARED / "light-done").write_text("")
"""


@pytest.mark.skipif(bool(test_lanes.namespaces()[1]), reason="no namespaces for the light lane here (not root)")
def test_the_light_lane_sees_neither_the_heavy_lanes_processes_nor_its_ports(tmp_path: Path,
                                                                            capfd: pytest.CaptureFixture[str]):
    tests = tmp_path / "test_lanes_isolated.py"
    tests.write_text(ISOLATED.format(shared=str(tmp_path), heavy=test_lanes.HEAVY))
    status = test_lanes.main(["-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tests)])
    out = capfd.readouterr().out
    assert status == 0, out
    assert "shares this machine" not in out


def test_without_namespaces_the_slow_tests_stay_in_the_heavy_lane_and_it_is_said(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(test_lanes, "namespaces", lambda: ([], "unshare failed: Operation not permitted"))
    tests = tmp_path / "test_lanes_slow.py"
    tests.write_text("import pytest\n\n@pytest.mark.slow\ndef test_slow():\n    pass\n\ndef test_light():\n    pass\n")
    assert test_lanes.main(["-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tests)]) == 0
    out = capfd.readouterr().out
    heavy_lane, light_lane = out.split("=== the light lane ===")
    assert "shares this machine's processes and network (unshare failed: Operation not permitted)" in heavy_lane
    assert "1 passed, 1 deselected" in heavy_lane  # test_slow (with namespaces: no test, 2 deselected)
    assert "1 passed" in light_lane  # on its workers, which do not count what they leave out
    assert "light  test_lanes_slow::test_light" in light_lane  # the end's list of both lanes' tests
    assert "light  test_lanes_slow::test_slow" not in light_lane
