"""The RL drill's faults: how each is injected into the RLlib job and which `rl` alert must arrive.

Through the job's control file (scripts/rl_drill/job.py): the environment hangs, episodes get cut off
at a small limit, weight syncs get slow, the observations flip sign (the trained policy then does the
opposite of what it learned: its reward collapses), the reported KL goes high. The `rl` rules are the
drill's only rules (the alert drill, scripts/drill, covers the others), so anything else they raise is
a false alarm.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.drill.faults import Expect, Fault

COLLECT = 2.0  # the train collector's interval, and an iteration's reports


@dataclass
class Context:
    cluster: str
    submission_id: str
    job_control: Path
    stall_age: float  # RaypulseRLPhaseStalled's `age` at the drill's scale
    sync_delay: float  # seconds added to each weight sync: over RaypulseRLWeightSyncSlow's `duration`
    collapse_window: float  # RaypulseRLRewardCollapsed's `window`: the recent mean must fall over it


def control(ctx: Context, **changes: Any) -> Callable[[], None]:
    """Set (a value) or clear (None) keys of the job's control file, atomically."""
    def write() -> None:
        current = json.loads(ctx.job_control.read_text()) if ctx.job_control.exists() else {}
        current.update(changes)
        temp = ctx.job_control.with_suffix(".tmp")
        temp.write_text(json.dumps({key: value for key, value in current.items() if value is not None}))
        os.replace(temp, ctx.job_control)
    return write


def catalog(ctx: Context) -> list[Fault]:
    job = {"cluster": ctx.cluster, "submission_id": ctx.submission_id}
    rank = {**job, "rank": "0"}
    return [
        Fault("reward-collapse", "the observations' signs flip (a broken preprocessor): the policy does the "
              "opposite of what it learned", control(ctx, flip=True), [Expect("RaypulseRLRewardCollapsed", rank)],
              allow=[Expect("RaypulseRLKLHigh", rank)], source_delay=COLLECT + ctx.collapse_window,
              after=control(ctx, flip=None)),
        Fault("kl-high", "the callback reports a KL of 2.0 (the drill's stand-in for a policy drifting away)",
              control(ctx, kl=2.0), [Expect("RaypulseRLKLHigh", rank)], after=control(ctx, kl=None)),
        Fault("weight-sync-slow", f"every weight sync to the EnvRunners takes {ctx.sync_delay:g}s more",
              control(ctx, sync_delay=ctx.sync_delay), [Expect("RaypulseRLWeightSyncSlow", rank)],
              source_delay=COLLECT + ctx.sync_delay, after=control(ctx, sync_delay=None)),
        Fault("responses-truncated", "episodes are cut off after 8 steps", control(ctx, limit=8),
              [Expect("RaypulseRLResponsesTruncated", rank)], allow=[Expect("RaypulseRLRewardCollapsed", rank)],
              source_delay=COLLECT + 2, after=control(ctx, limit=None)),
        Fault("generation-hang", "every env step blocks: sampling never returns", control(ctx, hang=True),
              [Expect("RaypulseRLPhaseStalled", {**rank, "phase": "sample"})], source_delay=ctx.stall_age + COLLECT,
              after=control(ctx, hang=None)),
    ]


QUICK = ("kl-high", "weight-sync-slow", "responses-truncated", "generation-hang")
