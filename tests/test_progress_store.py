"""The progress wire format and its bounded store: what is accepted, what is refused and why,
and what a NaN loss turns into."""

from __future__ import annotations

import math
import time

import pytest

from exporter.config import ProgressSettings
from exporter.progress.store import SERIES_PER_JOB, SERIES_PER_RANK, ProgressStore, Rejected, parse_batch


def report(**fields):
    return {"kind": "progress", "job_id": "02000000", "rank": 0, "time": time.time(), **fields}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store(clock=None, **settings) -> ProgressStore:
    return ProgressStore(ProgressSettings(**settings), clock=clock or Clock())


@pytest.mark.parametrize(("body", "message"), [
    ({"reports": [report(rank=1.5)]}, "reports[0].rank: Input should be a valid integer"),
    ({"reports": [report(rank=True)]}, "reports[0].rank"),
    ({"reports": [report(step=-1)]}, "reports[0].step: Input should be greater than or equal to 0"),
    ({"reports": [report(samples_total="12")]}, "reports[0].samples_total"),
    ({"reports": [report(loss="lots")]}, 'reports[0].loss: a number, or "NaN", "Infinity", "-Infinity"'),
    ({"reports": [report(loss=False)]}, "reports[0].loss: a number is required, not a boolean"),
    ({"reports": [report(kind="epoch")]}, "reports[0].kind"),
    ({"reports": [report(job_id="../../etc")]}, "reports[0].job_id: String should match pattern"),
    ({"reports": [report(submission_id="x" * 200)]}, "reports[0].submission_id"),
    ({"reports": [report(), report(colour="red")]}, "reports[1].colour: unknown field"),
    ({"reports": [report(job_id=None)]}, "reports[0]: job_id or submission_id is required"),
    ({"reports": [report(time=time.time() - 7200)]}, "reports[0].time: "),
    ({"reports": []}, "reports: List should have at least 1 item"),
    ({"reports": [report()] * 257}, "reports: List should have at most 256 items"),
    ({"report": [report()]}, "report"),
    ([report()], "body: Input should be a valid dictionary"),
])
def test_invalid_reports_are_refused_naming_the_field(body, message):
    with pytest.raises(Rejected) as refused:
        parse_batch(body)
    assert refused.value.status == 400
    assert refused.value.reason == "invalid"
    assert message in str(refused.value)


def test_non_finite_values_are_counted_and_the_last_finite_value_is_kept():
    progress = store()
    progress.apply(parse_batch({"reports": [report(step=1, loss=2.5, grad_norm=1.0), report(step=2, loss="NaN"),
                                            report(step=3, loss="Infinity", grad_norm="-Infinity")]}))
    state = progress.jobs[("02000000", "")][0]
    assert state.step == 3
    assert state.values == {"loss": 2.5, "grad_norm": 1.0}
    assert state.nonfinite == {"loss": 2, "grad_norm": 1}
    assert math.isnan(parse_batch({"reports": [report(loss=float("nan"))]})[0].loss)  # the bare JSON literal too


def test_checkpoints_and_totals_are_tracked_per_rank():
    progress = store()
    progress.apply(parse_batch({"reports": [
        report(step=10, samples_total=640, tokens_total=81920, rank=1),
        {"kind": "checkpoint", "job_id": "02000000", "rank": 1, "time": time.time(), "step": 10},
        report(step=11, samples_total=704, rank=1, dropped_total=3)]}))
    state = progress.jobs[("02000000", "")][1]
    assert (state.samples_total, state.tokens_total, state.checkpoints, state.checkpoint_step) == (704, 81920, 1, 10)
    assert state.last_checkpoint_time is not None
    assert state.client_dropped == 3
    assert state.reports == 3


def test_a_checkpoint_report_lost_on_the_way_is_made_up_by_the_next():
    """The soak's client dropped one save's report (the exporter did not take it): counted one by one, the
    saves fell behind the newest save's time and the launcher's measured interval came out 34 s for 30 s."""
    progress = store()
    now = time.time()
    progress.apply(parse_batch({"reports": [
        {"kind": "checkpoint", "job_id": "02000000", "rank": 0, "time": now, "step": 30, "checkpoints_total": 1},
        {"kind": "checkpoint", "job_id": "02000000", "rank": 0, "time": now + 60, "step": 90, "checkpoints_total": 3},
        {"kind": "checkpoint", "job_id": "02000000", "rank": 0, "time": now + 90, "step": 120}]}))  # an older client
    assert progress.jobs[("02000000", "")][0].checkpoints == 4


def test_a_batch_that_would_exceed_the_rank_limit_is_refused_whole():
    progress = store(max_ranks_per_job=2)
    progress.apply(parse_batch({"reports": [report(rank=0)]}))
    with pytest.raises(Rejected) as refused:
        progress.apply(parse_batch({"reports": [report(rank=0, step=5), report(rank=1), report(rank=2)]}))
    assert (refused.value.status, refused.value.reason) == (429, "too_many_ranks")
    assert "progress.max_ranks_per_job" in str(refused.value)
    assert set(progress.jobs[("02000000", "")]) == {0}
    assert progress.jobs[("02000000", "")][0].step is None  # nothing of the refused batch was applied
    assert progress.rejected["too_many_ranks"] == 1


def test_jobs_are_capped_until_one_expires():
    clock = Clock()
    progress = store(clock, max_jobs=2, expire_after_seconds=60)
    progress.apply(parse_batch({"reports": [report(job_id="01000000"), report(job_id="02000000")]}))
    with pytest.raises(Rejected) as refused:
        progress.apply(parse_batch({"reports": [report(job_id="03000000")]}))
    assert (refused.value.status, refused.value.reason) == (429, "too_many_jobs")
    clock.now += 30
    progress.apply(parse_batch({"reports": [report(job_id="02000000")]}))  # keeps job 2 alive
    clock.now += 45  # job 1 silent for 75 s > 60 s
    progress.apply(parse_batch({"reports": [report(job_id="03000000")]}))
    assert set(progress.jobs) == {("02000000", ""), ("03000000", "")}


def test_the_same_job_under_its_submission_id_is_a_separate_key_until_the_collector_merges_it():
    progress = store()
    progress.apply(parse_batch({"reports": [report(job_id=None, submission_id="raysubmit_abc"), report()]}))
    assert set(progress.jobs) == {("", "raysubmit_abc"), ("02000000", "")}


def test_one_global_series_budget_bounds_the_store_whatever_the_jobs_and_ranks():
    # Generous per-job limits (a job may hold the whole store); only the global budget stops the batch
    # (the product bound of old let 64 jobs x 1,024 ranks through).
    progress = store(max_series=SERIES_PER_JOB + 7 * SERIES_PER_RANK, max_jobs=10, max_ranks_per_job=1000,
                     max_job_share=1)
    progress.apply(parse_batch({"reports": [report(rank=rank) for rank in range(7)]}))
    assert progress.series == SERIES_PER_JOB + 7 * SERIES_PER_RANK
    with pytest.raises(Rejected) as refused:
        progress.apply(parse_batch({"reports": [report(rank=7)]}))
    assert (refused.value.status, refused.value.reason) == (429, "too_many_series")
    assert "progress.max_series" in str(refused.value)
    assert progress.refused_series == SERIES_PER_RANK
    progress.apply(parse_batch({"reports": [report(rank=4, step=9)]}))  # known series are still updated
    assert progress.jobs[("02000000", "")][4].step == 9


def test_doubtful_jobs_make_room_for_new_ones_least_recently_reported_first():
    clock = Clock()
    progress = store(clock, max_jobs=2)
    progress.apply(parse_batch({"reports": [report(job_id="01000000")]}))
    clock.now += 1
    progress.apply(parse_batch({"reports": [report(job_id="02000000")]}))
    progress.doubtful = frozenset({("01000000", ""), ("02000000", "")})  # Ray: both ended
    progress.apply(parse_batch({"reports": [report(job_id="03000000")]}))
    assert set(progress.jobs) == {("02000000", ""), ("03000000", "")}
    progress.doubtful = frozenset()
    with pytest.raises(Rejected):  # live jobs are never pushed out
        progress.apply(parse_batch({"reports": [report(job_id="04000000")]}))


def test_a_view_is_not_changed_by_later_reports():
    progress = store()
    progress.apply(parse_batch({"reports": [report(step=1, loss=2.0)]}))
    view = progress.view()
    progress.apply(parse_batch({"reports": [report(step=2, loss="NaN"), report(rank=1)]}))
    state = view.jobs[("02000000", "")][0]
    assert (state.step, state.values, dict(state.nonfinite)) == (1, {"loss": 2.0}, {})
    assert set(view.jobs[("02000000", "")]) == {0}
    assert progress.jobs[("02000000", "")][0].nonfinite["loss"] == 1


def test_a_job_past_its_share_is_refused_whole_and_another_job_still_fits():
    progress = store(max_series=1000, max_job_share=0.5)  # 500 series a job: 27 ranks
    fits = (500 - SERIES_PER_JOB) // SERIES_PER_RANK
    progress.apply(parse_batch({"reports": [report(rank=rank) for rank in range(fits)]}))
    with pytest.raises(Rejected) as refused:
        progress.apply(parse_batch({"reports": [report(rank=0, step=5), report(rank=fits)]}))
    assert (refused.value.status, refused.value.reason) == (429, "too_many_job_series")
    assert "job 02000000: one job holds at most 500 series (progress.max_job_share 0.5" in str(refused.value)
    assert progress.jobs[("02000000", "")][0].step is None  # nothing of the refused batch was applied
    assert (progress.rejected["too_many_job_series"], progress.refused_series) == (1, SERIES_PER_RANK)
    progress.apply(parse_batch({"reports": [report(job_id="03000000", rank=rank) for rank in range(fits)]}))
    assert progress.series == 2 * (SERIES_PER_JOB + fits * SERIES_PER_RANK) <= 1000
