"""`make test`: the suite as two pytest sessions side by side. The heavy lane (tests marked `ray` or
`slow`: a Ray cluster or a whole Prometheus stack, one at a time on this machine) runs one test after
another and prints as it goes; the light lane (everything else) runs beside it, niced, its output saved
and printed once it ends. The exit status is the heavy lane's, or the light lane's when only that failed.
The `slow` tests stay in the heavy lane: several start an exporter that finds the heavy lane's Ray
cluster on this machine and reads it (tried: four of them failed beside it).

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

HEAVY = "ray or slow"
LIGHT_NICENESS = 10
NO_TESTS = 5  # pytest's exit status when a lane's selection is empty (a path with only light tests)


def pytest(marks: str, args: list[str], cache: str, **popen: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", "-m", marks, "-o", f"cache_dir={cache}", *args],
                            **popen)  # type: ignore[call-overload]


def main(args: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="raypulse-lanes-") as temp:
        log = Path(temp) / "light.log"
        with log.open("wb") as out:
            # Niced: a Ray test waits on its cluster's processes, which come first; the light lane takes the rest.
            light = pytest(f"not ({HEAVY})", args, ".pytest_cache/light", stdout=out, stderr=subprocess.STDOUT,
                           preexec_fn=lambda: os.nice(LIGHT_NICENESS))
            try:
                heavy = pytest(HEAVY, args, ".pytest_cache/heavy").wait()
                light_status = light.wait()
            finally:
                if light.poll() is None:
                    light.kill()
                    light.wait()
        print("\n=========================== the light lane ===========================", flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
    statuses = [status for status in (heavy, light_status) if status != NO_TESTS] or [NO_TESTS]
    return next((status for status in statuses if status != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
