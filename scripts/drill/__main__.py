"""`python -m scripts.drill`: run the fault drill and write its table (`make drill`).

    flock /tmp/raypulse-ray.lock python -m scripts.drill --output docs/alerts-drill.md
    flock /tmp/raypulse-ray.lock python -m scripts.drill --quick --healthy 45 --json /tmp/drill.json

Exit status 0 when every expected alert arrived within its budget and nothing else fired.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.drill.report import render
from scripts.drill.run import run, to_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.drill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a representative subset of the faults (the e2e test)")
    parser.add_argument("--healthy", type=float,
                        help="seconds of healthy run first [240, about as long as all the faults; 45 with --quick]")
    parser.add_argument("--output", type=Path, help="write the Markdown table here (e.g. docs/alerts-drill.md)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--workdir", type=Path, help="keep configs and logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    healthy = args.healthy if args.healthy is not None else (45.0 if args.quick else 240.0)
    report = run(quick=args.quick, healthy_seconds=healthy, workdir=args.workdir,
                 log=lambda text: print(text, flush=True))
    text = render(report)
    if args.output:
        args.output.write_text(text)
    else:
        print(text)
    if args.json:
        args.json.write_text(to_json(report))
    print(f"drill: {'OK' if report.ok else 'FAILED'} in {report.wall_seconds:g}s", flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
