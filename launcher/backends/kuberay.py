"""The KubeRay backend: the run is rendered as a RayJob (launcher/kuberay.py) and applied to the cluster
of the current kubeconfig context. KubeRay supervises it (backoffLimit retries, activeDeadlineSeconds,
a new RayCluster per retry), so the launcher hands it off rather than following it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from launcher import kuberay
from launcher.backends.base import Placement
from launcher.backends.kinds import KubeRayKind
from launcher.errors import BadInput
from launcher.jobs import JobsClient
from launcher.journal import Journal
from launcher.state import RunRecord

if TYPE_CHECKING:
    from launcher.spec import JobSpec


class KubeRayBackend(KubeRayKind):

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec

    @staticmethod
    def reach(record: RunRecord, token_path: Path | None = None) -> JobsClient | None:
        return None  # its runs are not recorded here

    def describe(self) -> str:
        return self.name

    def no_wait_refusal(self) -> str | None:
        return None

    def hand_off(self) -> str:
        applied = kuberay.apply(self.spec)
        name = applied.rayjob["metadata"]["name"]
        return (f"applied RayJob {name} in namespace {applied.namespace}; follow it with "
                f"`kubectl get rayjob {name} -n {applied.namespace} -w`")

    def checkpoint_dir(self) -> str | None:
        return self.spec.checkpoint_dir

    def run_record(self) -> RunRecord:
        raise self._not_followed()

    def place(self, journal: Journal, cancel: threading.Event, detach: bool) -> Placement:
        raise self._not_followed()

    def _not_followed(self) -> BadInput:
        return BadInput(f"backend: {self.name} runs are handed to KubeRay, not followed by the launcher: "
                        f"`launcher submit --backend {self.name}` applies them (the backend's hand_off())")
