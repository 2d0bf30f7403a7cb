"""How a command ends when it cannot do what was asked: one line on stderr, one event (so one audit
line: refused as bad input, or failed), and the exit code scripts trust (launcher/exitcodes.py)."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

from launcher.display import own_line
from launcher.exitcodes import ExitCode
from launcher.journal import Journal


def fail(command: str, message: object, code: ExitCode, **details: Any) -> NoReturn:
    click.echo(f"launcher: {own_line(str(message))}", err=True)  # a URL may carry a password, an answer escapes
    kind = "command.refused" if code == ExitCode.BAD_INPUT else "command.failed"
    Journal().emit(kind, command=command, error=str(message), **details)
    sys.exit(int(code))
