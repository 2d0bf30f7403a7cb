"""`python -m scripts.heal_drill`: run the healing drill and write its table (`make heal-drill`).

    flock /tmp/raypulse-ray.lock python -m scripts.heal_drill --output docs/healing-drill.md
    flock /tmp/raypulse-ray.lock python -m scripts.heal_drill --quick --json /tmp/heal.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.heal_drill.report import render, section_of
from scripts.heal_drill.run import SCENARIOS, run, to_json

SOAK_SECTION = "## Soak"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.heal_drill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the subset CI runs")
    parser.add_argument("--only", action="append", choices=[s.name for s in SCENARIOS], help="these scenarios")
    parser.add_argument("--output", type=Path, help="write the Markdown report here")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args(argv)
    report = run(quick=args.quick, only=args.only, log=lambda line: print(f"heal-drill: {line}", flush=True))
    if args.output:  # the soak's section (`make heal-soak`) stays
        soak = section_of(args.output.read_text(), SOAK_SECTION) if args.output.exists() else None
        args.output.write_text(render(report) + (f"\n{soak}" if soak else ""))
    if args.json:
        args.json.write_text(to_json(report))
    print(render(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
