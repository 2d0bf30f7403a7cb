"""The progress store's one global bound, at a real exporter: however many jobs and ranks report, the
series it holds stay under progress.max_series and what was refused is counted (the reproduction:
512 loopback requests once drove an exporter to 852,039 series and 1.24 GB)."""

from __future__ import annotations

import json
import time

import pytest

from exporter.config import ProgressSettings
from exporter.progress.store import (
    SERIES_PER_JOB,
    SERIES_PER_PHASE,
    SERIES_PER_RANK,
    SERIES_PER_RL_RANK,
    SERIES_PER_SOURCE,
)
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


def rejected(series: dict[str, list]) -> dict[str, float]:
    """Refused reports by reason."""
    return {s.labels["reason"]: s.value for s in series["raypulse_train_rejected_reports"]
            if s.name.endswith("_total")}


def test_many_jobs_and_ranks_stay_within_the_series_budget(exporter):
    statuses = []
    for job in range(64):  # 64 jobs x 50 ranks: the old per-job limits allowed all of it
        reports = [{"kind": "progress", "submission_id": f"flood-{job}", "rank": rank, "time": time.time(),
                    "step": 1} for rank in range(50)]
        statuses.append(post(exporter.progress_port, json.dumps({"reports": reports}).encode())[0])
    assert statuses.count(204) == 2  # two jobs of 50 ranks fit in 2,000 series
    assert statuses.count(429) == 62
    refused = statuses.count(429)
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


def rl_rank(job: str, rank: int) -> bytes:
    """One RL rank's report as the probe sent them: 16 phases and 16 reward sources."""
    return json.dumps({"reports": [{
        "kind": "rl", "submission_id": job, "rank": rank, "time": time.time(), "iteration": 1,
        "phases": {f"phase{index}": {"seconds_total": 1.0} for index in range(16)},
        "rewards": {f"source{index}": 0.5 for index in range(16)}}]}).encode()


def test_one_job_holds_at_most_its_share_so_another_job_still_reports(tmp_path):
    """Issue 41, finding 7: RL ranks of one job (16 phases, 16 reward sources: 100 series each) filled
    the whole store at 110 ranks, and a new job got 429. A job holds at most progress.max_job_share of
    progress.max_series (the defaults: half of 10,000); the next job is accepted, and the store's own
    bound still holds when a third fills what is left."""
    running = start_progress_exporter(tmp_path, RAYPULSE_EXPORTER_PROGRESS__TOKEN="off")
    try:
        settings = ProgressSettings()
        per_rank = SERIES_PER_RANK + SERIES_PER_RL_RANK + 16 * SERIES_PER_PHASE + 16 * SERIES_PER_SOURCE
        fits = (settings.max_series_per_job - SERIES_PER_JOB) // per_rank
        answers = [post(running.progress_port, rl_rank("job-a", rank)) for rank in range(110)]
        assert [status for status, _ in answers] == [204] * fits + [429] * (110 - fits)
        refusal = json.loads(answers[-1][1])["error"]
        assert "job job-a: one job holds at most 5000 series (progress.max_job_share 0.5" in refusal
        assert [post(running.progress_port, rl_rank("job-b", rank))[0] for rank in range(10)] == [204] * 10
        held = 2 * SERIES_PER_JOB + (fits + 10) * per_rank
        room = (settings.max_series - held - SERIES_PER_JOB) // per_rank  # a third job fills what is left
        answers = [post(running.progress_port, rl_rank("job-c", rank)) for rank in range(fits)]
        assert [status for status, _ in answers] == [204] * room + [429] * (fits - room)
        assert "progress.max_series" in json.loads(answers[-1][1])["error"]
        counted = {"too_many_job_series": 110 - fits, "too_many_series": fits - room}
        wait_until(lambda: {reason: rejected(train_series(running))[reason] for reason in counted} == counted, 15,
                   "the refusals to be counted by reason")
        assert value(train_series(running), "raypulse_train_series") <= settings.max_series
    finally:
        stop_process(running.process)


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
