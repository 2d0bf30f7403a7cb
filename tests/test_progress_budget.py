"""The progress store's one global bound, at a real exporter: however many jobs and ranks report, the
series it holds stay under progress.max_series and what was refused is counted (the reproduction:
512 loopback requests once drove an exporter to 852,039 series and 1.24 GB)."""

from __future__ import annotations

import json
import time

import pytest

from exporter.progress.store import SERIES_PER_JOB, SERIES_PER_RANK
from tests.conftest import wait_until
from tests.ray_testcluster import stop_process
from tests.test_progress_endpoint import post, start_progress_exporter, train_series

MAX_SERIES = 2000


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    running = start_progress_exporter(tmp_path_factory.mktemp("budget"),
                                      RAYPULSE_EXPORTER_PROGRESS__MAX_SERIES=str(MAX_SERIES))
    yield running
    stop_process(running.process)


def value(series: dict[str, list], name: str, suffix: str = "") -> float:
    return next(s.value for s in series[name] if s.name == name + suffix)


def test_many_jobs_and_ranks_stay_within_the_series_budget(exporter):
    statuses = []
    for job in range(64):  # 64 jobs x 50 ranks: the old per-job limits allowed all of it
        reports = [{"kind": "progress", "submission_id": f"flood-{job}", "rank": rank, "time": time.time(),
                    "step": 1} for rank in range(50)]
        statuses.append(post(exporter.progress_port, json.dumps({"reports": reports}).encode())[0])
    assert statuses.count(204) == 2  # two jobs of 50 ranks fit in 2,000 series
    assert statuses.count(429) == 62
    refused = statuses.count(429)

    def rejected(series: dict[str, list]) -> dict[str, float]:
        return {s.labels["reason"]: s.value for s in series["raypulse_train_rejected_reports"]
                if s.name.endswith("_total")}

    wait_until(lambda: rejected(train_series(exporter))["too_many_series"] == refused, 15,
               "every refusal to be counted")
    series = train_series(exporter)
    assert value(series, "raypulse_train_refused_series", "_total") == refused * (SERIES_PER_JOB + 50 * SERIES_PER_RANK)
    held = value(series, "raypulse_train_series")
    assert held <= MAX_SERIES
    assert value(series, "raypulse_train_series_limit") == MAX_SERIES
    rank_series = sum(len(samples) for name, samples in series.items()
                      if name not in ("raypulse_train_refused_series", "raypulse_train_rejected_reports"))
    assert rank_series <= MAX_SERIES * 2  # counters render _total and _created: still bounded by the budget
    assert exporter.get("/healthz")[0] == 200


class JobsApi:
    """Ray's /api/jobs/ as the dashboard session returns it."""

    def __init__(self, jobs: list[dict]) -> None:
        self.jobs = jobs

    async def json(self, path: str):
        assert path == "/api/jobs/"
        return self.jobs


async def test_jobs_ray_says_ended_or_does_not_know_are_doubtful_and_let_go_after_the_grace():
    from exporter.collectors.ray.job_ids import JobDirectory
    from exporter.collectors.ray.train import TrainCollector
    from exporter.config import load_config
    from exporter.progress.store import parse_batch

    config = load_config({"progress": {"finished_grace_seconds": 60}}, environ={})
    collector = TrainCollector(config)
    now = [1000.0]
    collector.store._clock = lambda: now[0]
    collector.directory = JobDirectory(clock=lambda: now[0])
    assert collector.directory.standing("", "sub-1") == "running"  # nothing read yet: nothing is let go
    reports = [{"kind": "progress", "submission_id": sid, "rank": 0, "time": time.time(), "step": 1}
               for sid in ("sub-1", "sub-2", "sub-3")]
    collector.store.apply(parse_batch({"reports": reports}))
    await collector.directory.refresh(JobsApi([{"submission_id": "sub-1", "job_id": "01000000", "status": "RUNNING"},
                                               {"submission_id": "sub-2", "job_id": "02000000",
                                                "status": "SUCCEEDED"}]))
    assert [collector.directory.standing("", sid) for sid in ("sub-1", "sub-2", "sub-3")] == \
        ["running", "ended", "unknown"]
    jobs = list(collector.store.jobs)
    collector._let_go_of_ended(jobs)
    assert collector.store.doubtful == {("", "sub-2"), ("", "sub-3")}
    assert len(collector.store.jobs) == 3  # still within the grace: their last values stay visible
    now[0] += 61
    collector._let_go_of_ended(jobs)
    assert set(collector.store.jobs) == {("", "sub-1")}  # the running job stays, however quiet
