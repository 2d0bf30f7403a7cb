"""The run's health policy (`health:` in the job spec): what counts as a fault and what to do.

Thresholds default to the alert rules' (alerts/config.py), so a restart never waits longer than an
alert: no progress from any rank for RaypulseTrainingStalled's age (15 min) at most (a threshold learned
from the run's pace may be shorter: launcher/health/threshold.py), no output from any of the job's
processes for RaypulseJobDriverLogSilent's age (30 min).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import ConfigDict, Field

from alerts.config import DEFAULT as ALERTS
from exporter.contract import wire
from exporter.contract.strict import Strict

Action = Literal["restart", "stop", "report"]
Source = Literal["auto", "direct", "prometheus"]


class FaultClass(StrEnum):
    HANG = wire.FAULT_HANG  # no progress from any rank, or no output at all, for too long
    GPU_FAULT = wire.FAULT_GPU  # an XID that asks for a reset or reboot, double-bit ECC, a lost GPU, ...
    NODE_LOST = wire.FAULT_NODE_LOST  # a node of the job died
    NONFINITE_LOSS = wire.FAULT_NONFINITE_LOSS  # a rank reported a NaN or infinite loss


HANG_AFTER_SECONDS = float(ALERTS.tune("RaypulseTrainingStalled").age.seconds)
SILENCE_AFTER_SECONDS = float(ALERTS.tune("RaypulseJobDriverLogSilent").age.seconds)
MIN_CHECKS_PER_THRESHOLD = 3  # a threshold spans at least this many checks: one slow read is no hang


class HealthPolicy(Strict):
    """Watch the run and heal it; every field has a default that keeps a week-long run going."""

    model_config = ConfigDict(allow_inf_nan=False)  # a threshold of inf or NaN seconds is a typo, not "never"

    enabled: bool = Field(True, description="watch the run's health (local, existing and KubeRay clusters)")
    check_interval_seconds: float = Field(10.0, ge=0.5, le=600,
                                          description="how often the watcher reads the exporters")
    source: Source = Field("auto", description=(
        "where the watcher reads every node's signals: auto (the head exporter's fleet document where the cluster "
        "has one, else each exporter), direct (each exporter), prometheus (your Prometheus, `prometheus:`, one "
        "query per rule: for fleets past one head's reach; the head's document, else each exporter, while it "
        "cannot answer)"))
    hang_after_seconds: float = Field(HANG_AFTER_SECONDS, gt=0, description=(
        "a job that reports progress is hung when no rank advanced for this long (the alert rule's threshold); with "
        "adaptive_hang, the most the learned threshold may be"))
    adaptive_hang: bool = Field(True, description=(
        "learn the hang threshold from the run: 10 times the p99 interval between its progress reports once 20 "
        "were seen (at least 60 s, at most hang_after_seconds), and per RL phase from that phase's own durations "
        "(docs/healing.md); off: hang_after_seconds always"))
    silence_after_seconds: float = Field(SILENCE_AFTER_SECONDS, gt=0, description=(
        "a job that reports no progress is hung when none of its processes (driver and workers) wrote "
        "any output for this long"))
    on_hang: Action = Field("restart", description="restart (a new attempt), stop, or report (an event only)")
    on_gpu_fault: Action = Field("restart", description="an XID that asks for a reset or reboot, double-bit ECC, "
                                 "a row-remap failure, a lost GPU, a recovery action: what to do")
    on_node_lost: Action = Field("restart", description="a node running the job died: what to do")
    on_nonfinite_loss: Action = Field("restart", description="a rank reported a NaN or infinite loss: what to do")
    stacks: bool = Field(True, description="take every process's Python stack before acting on a hang")
    mtbf_seconds: float | None = Field(None, gt=0, description=(
        "the mean time between faults the checkpoint advice uses (launcher/checkpoint_advice.py); unset: the one seen "
        "in this run's attempts and the finished runs under $RAYPULSE_HOME"))
    cordon_nodes: bool = Field(False, description=(
        "KubeRay: cordon the Kubernetes node of a GPU fault (or a lost node) before the next attempt, so its pods "
        "land elsewhere (needs `patch nodes`); off: the node is left alone and the event says so"))

    def action(self, fault: FaultClass) -> Action:
        return getattr(self, f"on_{fault.value}")

    def explicit_restarts(self) -> list[str]:
        """The `on_*` fields set to restart by the user (not by default)."""
        return sorted(name for name in self.model_fields_set if name.startswith("on_") and getattr(self, name)
                      == "restart")

    def threshold_problem(self) -> str | None:
        """Why the thresholds cannot work with the check interval, if they cannot."""
        floor = MIN_CHECKS_PER_THRESHOLD * self.check_interval_seconds
        for name in ("hang_after_seconds", "silence_after_seconds"):
            if getattr(self, name) < floor:
                return (f"health.{name}: {getattr(self, name):g}s is below {MIN_CHECKS_PER_THRESHOLD} checks of "
                        f"health.check_interval_seconds ({self.check_interval_seconds:g}s); raise it or check more "
                        "often")
        return None
