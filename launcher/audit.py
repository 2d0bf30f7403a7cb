"""The audit log: one JSON line per action (when, who, what, result) in $RAYPULSE_HOME/audit.log.

Actions are what changes something or was refused: a cluster started or torn down, an attempt
submitted, a stop, a run's final state, a manifest rendered or applied, a command refused as bad
input. A traced run's lines carry its `trace_id`. Each line is appended with a single write, so
concurrent launchers do not interleave lines.

Secrets stay out: every detail goes through launcher/redact.py (the entrypoint's environment prefixes
and credential-looking arguments, environment variable values, passwords in URLs), and the file is
this user's only (0600 in a 0700 $RAYPULSE_HOME, tightened if an older launcher left it looser).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import stat
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from launcher import redact
from launcher.state import FILE_MODE, home, private_dir
from launcher.tracing import current_trace_id


def path() -> Path:
    return home() / "audit.log"


_OWN = frozenset({"time", "unix_time", "user", "host", "pid", "action", "result"})


def record(action: str, result: str, /, **details: Any) -> None:
    """Append one line. A failure to write is reported on stderr but never raised into the action it
    records (a full disk must not prevent a stop or a teardown). Inside a traced run, the line
    carries the run's trace id."""
    details.setdefault("trace_id", current_trace_id())
    line = {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "unix_time": round(time.time(), 3),
        "user": getpass.getuser(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "action": action,
        "result": redact.text(result),
        # The line's own fields win: a detail of the same name (a policy's action) is said by them.
        **{key: redact.details(value, key) for key, value in details.items()
           if value is not None and key not in _OWN},
    }
    try:
        target = path()
        private_dir(target.parent)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
                os.fchmod(fd, FILE_MODE)  # a log an older launcher made world-readable
            os.write(fd, (json.dumps(line, default=str, sort_keys=False) + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        sys.stderr.write(f"launcher: cannot write the audit log {path()}: {exc}\n")


def read() -> list[dict[str, Any]]:
    """Every line so far (for `launcher` users and tests)."""
    try:
        return [json.loads(line) for line in path().read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []
