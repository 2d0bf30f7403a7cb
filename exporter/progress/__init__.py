"""Training progress, end to end: the client training code calls (`from exporter import progress`),
the RLlib callback, the exporter's endpoint and the store the `train` collector reads.

Importing this package loads the client only (the standard library and `exporter.contract`): it
runs in training processes. The other rooms are imported by name where they are used:

- `client`: `progress.report(...)`, `progress.phase(...)`, ... re-exported here (see its docstring);
- `rllib`: `RaypulseCallback`, RLlib training seen as RL (needs Ray RLlib);
- `endpoint`: `POST /v1/progress` on the exporter's own listener (aiohttp);
- `store`: the wire format, its validation and the bounded state the `train` collector exports;
  `rollout_targets`: the RL runs' rollout servers it holds for the head's /sd/rollout;
- `hooks`: what `launcher submit --framework-metrics` patches into frameworks (verl, TRL, OpenRLHF), with
  `verl`, `trl`, `openrlhf` and `rollout` (verl's rollout servers, told to the head's exporter).
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
    rollout_servers,
    stats,
)

__all__ = ["checkpoint", "checkpoint_dir", "checkpoint_saved", "flush", "phase", "ray_train_report", "report",
           "report_iteration", "resume_from", "rollout_servers", "stats"]
