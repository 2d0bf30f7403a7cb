"""`python -m scripts.drill`: run the fault drill and write its table (`make drill`).

    flock /tmp/raypulse-ray.lock python -m scripts.drill --output docs/alerts-drill.md
    flock /tmp/raypulse-ray.lock python -m scripts.drill --quick --healthy 45 --json /tmp/drill.json

Exit status 0 when every expected alert arrived within its budget and nothing else fired.
"""

from __future__ import annotations

import sys

from scripts.drill import cli
from scripts.drill.report import render
from scripts.drill.run import run, to_json

if __name__ == "__main__":
    sys.exit(cli.main(None, prog="python -m scripts.drill", doc=__doc__, name="drill", run=run, render=render,
                      to_json=to_json, healthy=240.0, quick_healthy=45.0,
                      quick_help="a representative subset of the faults (the e2e test)"))
