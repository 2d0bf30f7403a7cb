"""The command line both drills share (`python -m scripts.drill`, `python -m scripts.rl_drill`): run,
write the Markdown table and the JSON, exit 0 only when the drill passed."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any


def main(argv: list[str] | None, *, prog: str, doc: str, name: str, run: Callable[..., Any],
         render: Callable[[Any], str], to_json: Callable[[Any], str], healthy: float, quick_healthy: float,
         quick_help: str) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--healthy", type=float,
                        help=f"seconds of healthy run first [{healthy:g}; {quick_healthy:g} with --quick]")
    parser.add_argument("--output", type=Path, help="write the Markdown table here")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--workdir", type=Path, help="keep configs and logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    seconds = args.healthy if args.healthy is not None else (quick_healthy if args.quick else healthy)
    report = run(quick=args.quick, healthy_seconds=seconds, workdir=args.workdir,
                 log=lambda text: print(text, flush=True))
    text = render(report)
    if args.output:
        args.output.write_text(text)
    else:
        print(text)
    if args.json:
        args.json.write_text(to_json(report))
    print(f"{name}: {'OK' if report.ok else 'FAILED'} in {report.wall_seconds:g}s", flush=True)
    return 0 if report.ok else 1
