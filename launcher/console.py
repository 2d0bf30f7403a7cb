"""The `launcher` console script: the CLI, or one line naming the extra to install when this is an
exporter-only install (`pip install 'raypulse[exporter]'` installs the script too)."""

from __future__ import annotations

import sys

from launcher import INSTALL_HINT, missing_extra


def main() -> None:
    try:
        from launcher.cli import main as cli
    except ModuleNotFoundError as exc:
        if (module := missing_extra(exc)) is None:
            raise
        print(f"launcher: {module!r} is not installed: the launcher comes with the launcher extra, "
              f"{INSTALL_HINT}", file=sys.stderr)
        sys.exit(2)
    cli(prog_name="launcher")
