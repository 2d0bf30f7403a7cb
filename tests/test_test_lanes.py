"""`make test`'s two lanes (scripts/test_lanes.py): a failure in either lane fails the run, and the
light lane's output is shown after the heavy one's."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.test_lanes import main

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
    assert main(["-q", "--rootdir", str(tmp_path), str(tests)]) == status
    out = capfd.readouterr().out
    light_lane = out[out.index("=== the light lane ==="):]
    assert ("1 passed" if light else "1 failed") in light_lane
