"""How the launcher tells a person what it is doing: a rich display of each step on a terminal,
plain `launcher: ...` lines otherwise (logs, CI). Step messages go to stderr; the job's own output
goes to stdout, so `launcher submit ... > out.txt` captures exactly what the job printed.

The launcher's own lines pass through launcher/redact.py (a message quoting a command or a URL never
shows a password) and `printable` (a message quoting a cluster's answer never sends the terminal a control
sequence); the job's output is the job's and is shown as it is.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

from launcher import redact

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL, C1


def printable(text: str, keep: str = "") -> str:
    """Text that came from a cluster (a job's message, a run id from its metadata, an error quoting an
    answer) as the launcher prints it: every control character but those in `keep` written as its escape
    (`\\x1b`, `\\n`), so none reaches the terminal (ESC starts OSC and CSI sequences, BEL ends one, a
    newline forges a row)."""
    return _CONTROL.sub(lambda found: found[0] if found[0] in keep else found[0].encode("unicode_escape").decode(),
                        text)


def own_line(text: str) -> str:
    """One of the launcher's own lines (a message may quote a command, a URL, a cluster's answer)."""
    return printable(redact.text(text), keep="\n")


def _markup(text: str) -> str:
    """One of the launcher's own lines as rich markup that shows it as it is."""
    from rich.markup import escape

    return escape(own_line(text))


class Reporter:
    """Receives the launcher's events. This base class shows nothing (the Python API's default)."""

    def step(self, key: str, text: str) -> None:
        """A step started (e.g. key "head", text "starting the head node")."""

    def done(self, key: str, text: str) -> None:
        """The step finished; text says how."""

    def info(self, text: str) -> None:
        """A one-off event."""

    def warn(self, text: str) -> None:
        """Something the user must know about that does not stop the job."""

    def log(self, text: str) -> None:
        """Output of the job itself."""

    def close(self) -> None:
        """No more events."""


class PlainReporter(Reporter):
    """One line per event, for pipes and CI logs."""

    def __init__(self, err: TextIO | None = None, out: TextIO | None = None) -> None:
        self._err = err or sys.stderr
        self._out = out or sys.stdout
        self._started: dict[str, float] = {}
        self._lock = threading.Lock()

    def _line(self, text: str) -> None:
        text = own_line(text)
        with self._lock:
            self._err.write(f"launcher: {text}\n")
            self._err.flush()

    def step(self, key: str, text: str) -> None:
        self._started[key] = time.monotonic()
        self._line(text)

    def done(self, key: str, text: str) -> None:
        started = self._started.pop(key, None)
        self._line(text if started is None else f"{text} ({time.monotonic() - started:.1f}s)")

    def info(self, text: str) -> None:
        self._line(text)

    def warn(self, text: str) -> None:
        self._line(f"warning: {text}")

    def log(self, text: str) -> None:
        with self._lock:
            self._out.write(text)
            self._out.flush()


class RichReporter(PlainReporter):
    """Spinners for the steps in progress while the cluster starts; once the job's output begins
    the live display ends and events become coloured lines between the job's lines."""

    def __init__(self) -> None:
        # rich loads with the first live display (a submit on a terminal), not at every command's start.
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        super().__init__()
        self._console = Console(stderr=True, highlight=False)
        self._progress: Progress | None = Progress(
            SpinnerColumn(finished_text="[green]✓"), TextColumn("{task.description}"), TimeElapsedColumn(),
            console=self._console, transient=False)
        self._tasks: dict[str, TaskID] = {}
        self._progress.start()

    def _end_live(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def step(self, key: str, text: str) -> None:
        if self._progress is None:
            super().step(key, text)
            return
        self._tasks[key] = self._progress.add_task(_markup(text), total=1)

    def done(self, key: str, text: str) -> None:
        task = self._tasks.pop(key, None)
        if self._progress is None or task is None:
            super().done(key, text)
            return
        self._progress.update(task, description=_markup(text), completed=1)

    def _print(self, markup: str) -> None:
        (self._progress.console if self._progress else self._console).print(markup, soft_wrap=True)

    def _line(self, text: str) -> None:  # the plain reporter's lines, once the live display is over
        self._print(f"[bold]launcher:[/] {_markup(text)}")

    def info(self, text: str) -> None:
        self._print(f"[bold]launcher:[/] {_markup(text)}")

    def warn(self, text: str) -> None:
        self._print(f"[bold yellow]launcher: warning:[/] {_markup(text)}")

    def log(self, text: str) -> None:
        self._end_live()
        super().log(text)

    def close(self) -> None:
        self._end_live()


def reporter_for_terminal() -> Reporter:
    """Rich on a terminal, plain lines when stderr is not one."""
    return RichReporter() if sys.stderr.isatty() else PlainReporter()
