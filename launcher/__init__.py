"""raypulse launcher: submit a Ray training job in one command (see `launcher --help`).

The Python API under the command line: `launcher.submit(spec)` returns a RunHandle with
status(), logs(), stop() and wait(); `up`/`down` manage a local cluster without a job; `status`,
`logs`, `stop` find a run later by its id. Specs are JobSpec models or plain dicts of its fields.
"""

from launcher.api import RunHandle, down, logs, status, stop, submit, up
from launcher.errors import BadInput, InfraError
from launcher.exitcodes import ExitCode
from launcher.spec import JobSpec, SpecError

__all__ = ["BadInput", "ExitCode", "InfraError", "JobSpec", "RunHandle", "SpecError", "down", "logs", "status",
           "stop", "submit", "up"]
