"""Write the generated files from the boards: `python -m dashboards.build` (`make dashboards`).

    python -m dashboards.build           # dashboards/json/*.json, dashboards/provisioning/, docs/dashboards.md
    python -m dashboards.build --check   # exit 1, naming them, if the committed files differ
    python -m dashboards.build --label-profile kuberay --out DIR   # only the JSON, with another label
    python -m dashboards.build --cluster-label ray_io_cluster --out DIR   # contract (exporter/contract/labels.py)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dashboards import builder, docs, provisioner
from dashboards.boards import BOARDS
from exporter.contract import labels

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "dashboards.md"


def generated() -> dict[Path, str]:
    """Every generated file and the text it must have."""
    files = {provisioner.JSON_DIR / f"{board.uid}.json": builder.render(board) for board in BOARDS}
    files.update(provisioner.committed_files())
    files[DOC] = docs.render(BOARDS)
    return files


def stale() -> list[Path]:
    """Generated files whose committed text differs (or that are missing), and stray JSON."""
    files = generated()
    differing = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
    strays = [path for path in provisioner.JSON_DIR.glob("*.json") if path not in files]
    return differing + strays


def write_json(directory: Path, contract: labels.LabelContract) -> list[Path]:
    """The dashboards' JSON with `contract`'s label names, into `directory` (not the committed files)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for board in BOARDS:
        path = directory / f"{board.uid}.json"
        path.write_text(builder.render(board, contract))
        written.append(path)
    return written


def write() -> list[Path]:
    files = generated()
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for stray in provisioner.JSON_DIR.glob("*.json"):  # a board that was removed or renamed
        if stray not in files:
            stray.unlink()
    return list(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if anything is stale")
    parser.add_argument("--out", type=Path, help="write only the dashboards' JSON, here (needed by the label options)")
    labels.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        contract = labels.from_arguments(args)
    except ValueError as error:
        parser.error(str(error))
    if args.check and (args.out is not None or not contract.is_default):
        parser.error("--check compares the committed files: no --out, the default label contract")
    if args.out is not None or not contract.is_default:
        if args.out is None:
            parser.error("the label options need --out (the committed files use the default label contract)")
        for path in write_json(args.out, contract):
            print(f"wrote {path}")
        return 0
    if args.check:
        paths = stale()
        for path in paths:
            print(f"stale: {path.relative_to(REPO)}")
        if paths:
            print("run `make dashboards` and commit the result", file=sys.stderr)
        return 1 if paths else 0
    for path in write():
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
