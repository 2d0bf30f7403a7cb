"""`python -m scripts.rl_drill`: run the RL fault drill and write its table (`make rl-drill`).

    flock /tmp/raypulse-ray.lock python -m scripts.rl_drill --output docs/rl-drill.md
    flock /tmp/raypulse-ray.lock python -m scripts.rl_drill --quick --healthy 30 --json /tmp/rl-drill.json

Exit status 0 when every expected alert arrived within its budget, nothing else fired and every query
of the RL board returned data.
"""

from __future__ import annotations

import sys

from scripts.drill import cli
from scripts.rl_drill.report import render
from scripts.rl_drill.run import run, to_json

if __name__ == "__main__":
    sys.exit(cli.main(None, prog="python -m scripts.rl_drill", doc=__doc__, name="rl drill", run=run,
                      render=render, to_json=to_json, healthy=90.0, quick_healthy=30.0,
                      quick_help="the faults but the reward collapse (the e2e test)"))
