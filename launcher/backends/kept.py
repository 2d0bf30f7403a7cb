"""Clusters on this machine, as the local backend (which starts them) and the existing one (`--cluster
NAME`, a kept one) both reach them: a kept cluster's Jobs API client, the client of the one a recorded
run used, and a checkpoint directory on this machine's disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import BadInput
from launcher.jobs import JobsClient
from launcher.state import ClusterRecord, RunRecord, load_cluster, private_dir, run_dir

if TYPE_CHECKING:
    from launcher.spec import JobSpec


def cluster_client(name: str) -> tuple[ClusterRecord, JobsClient]:
    """A kept (or running) local cluster and a Jobs API client for it."""
    record = load_cluster(name)
    if record is None:
        raise BadInput(f"cluster: no running local cluster named {name!r}; start one with `launcher up --name {name}`")
    return record, JobsClient(record.address, Path(record.token_path).read_text().strip(), field="cluster")


def local_checkpoint_dir(spec: JobSpec) -> str:
    """A cluster on this machine shares its disk: the checkpoint directory is made now (under the run's
    record unless the spec names one), and one that cannot be made or written is bad input."""
    path = Path(spec.checkpoint_dir) if spec.checkpoint_dir else run_dir(spec.run_id or "") / "checkpoints"
    try:
        private_dir(path)
        probe = path / f".raypulse-write-check-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise BadInput(f"checkpoint_dir: cannot write checkpoints to {path}: {exc.strerror or exc}; give "
                       "--checkpoint-dir a directory the nodes can write") from None
    return str(path.resolve())


def reach_cluster(record: RunRecord) -> JobsClient | None:
    """A client for the local cluster a run used, while it is still up."""
    try:
        if record.cluster and load_cluster(record.cluster) is not None:
            return cluster_client(record.cluster)[1]
    except BadInput:  # gone since it was looked up
        pass
    return None
