"""Training progress, end to end: the client training code calls (`from exporter import progress`),
the RLlib callback, the exporter's endpoint and the store the `train` collector reads.

Importing this package loads the client only (the standard library and `exporter.contract`): it
runs in training processes. The other rooms are imported by name where they are used:

- `client`: `progress.report(...)`, `progress.phase(...)`, ... re-exported here (see its docstring);
- `rllib`: `RaypulseCallback`, RLlib training seen as RL (needs Ray RLlib);
- `endpoint`: `POST /v1/progress` on the exporter's own listener (aiohttp);
- `store`: the wire format, its validation and the bounded state the `train` collector exports.
"""

from __future__ import annotations

from exporter.progress.client import (
    checkpoint,
    checkpoint_dir,
    checkpoint_saved,
    flush,
    phase,
    ray_train_report,
    report,
    report_iteration,
    resume_from,
    stats,
)

__all__ = ["checkpoint", "checkpoint_dir", "checkpoint_saved", "flush", "phase", "ray_train_report", "report",
           "report_iteration", "resume_from", "stats"]
