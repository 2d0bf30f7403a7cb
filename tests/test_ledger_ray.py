"""The goodput ledger on the Ray backends, end to end: a run on a local cluster of its own (the local
backend: a cluster started, the run, the cluster torn down; one worker) and on the suite's shared kept
cluster reached through its dashboard (`--address`, the existing-cluster backend). The job reports steps,
fails once, and its second attempt succeeds; the run's end keeps its seconds per cause, they add up to its
wall time, and the backoff the launcher waited is in them.

Run under `flock /tmp/raypulse-ray.lock`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.contract import wire
from launcher.ledger import ledger
from launcher.state import RunRecord
from tests.launcher_support import SharedCluster, cluster_processes, describe, free_base, launcher, status_json

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

# Steps of 0.2 s for 6 s; attempt 1 then fails, attempt 2 succeeds.
FAILS_ONCE = ("python -c 'import os, sys, time\nfrom exporter import progress\nfor step in range(30):\n"
              "    progress.report(step, loss=1.0)\n    time.sleep(0.2)\nprogress.flush()\n"
              f"sys.exit(1 if os.environ[\"{wire.ENV_ATTEMPT}\"] == \"1\" else 0)'")


@pytest.mark.parametrize("backend", ["local", "existing"])
def test_a_ray_runs_causes_add_up_to_its_wall_time(shared_launcher_home: Path, shared_cluster: SharedCluster,
                                                    backend: str):
    home = shared_launcher_home
    run_id = f"ledger-{backend}-1"
    if backend == "local":
        exporter_port, progress_port = free_base(3)
        where: tuple[str, ...] = ("--workers", "1", "--exporter-port", str(exporter_port), "--progress-port",
                                  str(progress_port))
    else:
        cluster = shared_cluster.record()
        where = ("--address", cluster["address"], "--token-path", cluster["token_path"])
    result = launcher("submit", *where, "--run-id", run_id, "--max-retries", "1", "--retry-backoff", "2", "--",
                      FAILS_ONCE, home=home, timeout=500)
    assert result.returncode == 0, result.stderr
    assert "where the time went: " in result.stderr  # the end-of-run summary
    record = RunRecord.model_validate(status_json(run_id, home))
    assert record.backend == backend
    [end] = [event.details for event in record.events if event.kind == "run.finished"]
    split = {cause: end["seconds_by_cause"].get(cause, 0.0) for cause in wire.RUN_TIME_CAUSES}  # zeros left out
    wall = record.finished_at - record.created_at
    assert set(end["seconds_by_cause"]) <= set(wire.RUN_TIME_CAUSES)
    assert sum(split.values()) == pytest.approx(wall, rel=0.01)
    assert ledger(record).seconds == pytest.approx(split, abs=0.01)
    [retry] = [event.details for event in record.events if event.kind == "retry.scheduled"]
    assert split["backoff"] >= retry["delay"] - 0.001 > 0  # the launcher waited it before the next submit
    assert split["lost_to_end"] == 0
    if backend == "local":
        assert split["provisioning"] > 0  # its cluster was started (cluster.starting to cluster.up)
        assert not cluster_processes(run_id), describe(cluster_processes(run_id))
