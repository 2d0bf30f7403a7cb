"""When each job's processes on this node last wrote any output: the health watcher's signal that a
job which reports no progress is still alive.

Ray writes a worker's stdout and stderr to <session>/logs/worker-<worker id>-<job id>-<pid>.out and
.err. The job id in the name is ffffffff for a worker Ray started before it knew its job, so the
files are matched to jobs by pid (the process collector knows whom each pid works for). A driver's
output goes to the head's job-driver-<submission id>.log, which the head collector watches.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeVar

_WORKER_LOG = re.compile(r"^worker-[0-9a-f]+-[0-9a-f]+-(\d+)\.(?:out|err)$")
Job = TypeVar("Job")


def logs_by_pid(session_dirs: Iterable[Path]) -> dict[int, list[str]]:
    """pid -> its worker log files, from one listing of each session's logs directory."""
    found: dict[int, list[str]] = {}
    for session in session_dirs:
        try:
            entries = list(os.scandir(session / "logs"))
        except OSError:
            continue
        for entry in entries:
            match = _WORKER_LOG.match(entry.name)
            if match:
                found.setdefault(int(match[1]), []).append(entry.path)
    return found


def last_writes(session_dirs: Iterable[Path], jobs_by_pid: Mapping[int, Job]) -> dict[Job, float]:
    """Each job's newest write to the logs of its processes on this node (unix time)."""
    files = logs_by_pid(session_dirs)
    newest: dict[Job, float] = {}
    for pid, job in jobs_by_pid.items():
        for path in files.get(pid, ()):
            try:
                written = os.stat(path).st_mtime
            except OSError:  # rotated or gone since the listing
                continue
            if written > newest.get(job, 0.0):
                newest[job] = written
    return newest
