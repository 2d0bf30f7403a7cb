"""raypulse launcher: submit a Ray training job in one command (see `launcher --help`).

The Python API under the command line: `launcher.submit(spec)` returns a RunHandle with
status(), logs(), stop() and wait(); `up`/`down` manage a local cluster without a job; `status`,
`logs`, `stop` find a run later by its id. Specs are JobSpec models or plain dicts of its fields.

The names load on first use (PEP 562), so that an install without the `[launcher]` extra (the
exporter alone) gets a message naming the extra instead of a traceback from deep inside.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.api import RunHandle, down, logs, status, stop, submit, up
    from launcher.errors import BadInput, InfraError
    from launcher.exitcodes import ExitCode
    from launcher.spec import JobSpec, SpecError

# What the `[launcher]` extra brings on top of the exporter's dependencies.
EXTRA_MODULES = frozenset({"ray", "rich", "packaging", "plotly", "numpy", "requests"})
INSTALL_HINT = "pip install 'raypulse[launcher]'"
_HOMES = {"RunHandle": "api", "down": "api", "logs": "api", "status": "api", "stop": "api", "submit": "api",
          "up": "api", "BadInput": "errors", "InfraError": "errors", "ExitCode": "exitcodes", "JobSpec": "spec",
          "SpecError": "spec"}
__all__ = ["BadInput", "ExitCode", "InfraError", "JobSpec", "RunHandle", "SpecError", "down", "logs", "status",
           "stop", "submit", "up"]


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The launcher-extra module an import failed on, if that is why it failed."""
    root = (exc.name or "").partition(".")[0]
    return root if root in EXTRA_MODULES else None


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'launcher' has no attribute {name!r}")
    try:
        module = import_module(f"launcher.{home}")
    except ModuleNotFoundError as exc:
        if (module_name := missing_extra(exc)) is None:
            raise
        raise ImportError(f"the launcher needs {module_name!r}, which comes with the launcher extra: "
                          f"{INSTALL_HINT}") from exc
    return getattr(module, name)
