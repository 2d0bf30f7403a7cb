"""Checkpoint advice (launcher/checkpoint_advice.py): the Young-Daly math, the what-if loss and the
fault rate gathered from a run's attempts and the finished runs under $RAYPULSE_HOME."""

from __future__ import annotations

import json
import math

import pytest

from exporter.contract import digest
from launcher import checkpoint_advice as advice
from launcher.state import AttemptRecord, RunRecord


def _run(run_id: str, spans: list[tuple[float, float]], state: str = "SUCCEEDED", finished: bool = True,
         steps: list[tuple[int | None, int | None]] | None = None) -> RunRecord:
    """A run whose attempts ran over `spans` (running_at, ended_at); `steps`: per attempt (resumed from, last step)."""
    steps = steps or [(None, None)] * len(spans)
    attempts = [AttemptRecord(attempt=i + 1, submission_id=f"{run_id}-{i + 1}", running_at=start, ended_at=end,
                              resumed_from_step=resumed, last_step=last)
                for i, ((start, end), (resumed, last)) in enumerate(zip(spans, steps, strict=True))]
    return RunRecord(run_id=run_id, name=run_id, backend="local", state=state, attempts=attempts,
                     finished_at=spans[-1][1] if finished else None)


def test_young_daly_is_the_square_root_of_twice_cost_times_mtbf():
    assert advice.young_daly_s(10.0, 500.0) == pytest.approx(100.0)


def test_the_advised_interval_minimises_the_expected_loss():
    cost, mtbf, wall = 10.0, 600.0, 6000.0
    faults = int(wall / mtbf)
    best = advice.young_daly_s(cost, mtbf)
    at_best = advice.expected_loss_s(best, cost, wall, faults)
    for other in (best / 2, best * 0.8, best * 1.25, best * 2):
        assert advice.expected_loss_s(other, cost, wall, faults) > at_best


def test_expected_loss_counts_saves_and_half_an_interval_per_fault():
    assert advice.expected_loss_s(100.0, 5.0, 1000.0, 4) == pytest.approx(10 * 5.0 + 4 * 50.0)


@pytest.mark.parametrize(("cost", "mtbf"), [(-1.0, 10.0), (1.0, 0.0)])
def test_bad_numbers_are_refused_by_name(cost: float, mtbf: float):
    with pytest.raises(ValueError, match="mean time between faults"):
        advice.young_daly_s(cost, mtbf)


def test_each_restart_and_a_failed_end_are_faults_over_the_time_attempts_ran():
    run = _run("r", [(0, 100), (110, 300), (310, 400)], state="UNHEALTHY")
    rate = advice.run_faults(run)
    assert (rate.faults, rate.seconds) == (3, 380.0)
    assert advice.run_faults(_run("s", [(0, 100), (110, 300)])).faults == 1


def test_finished_runs_under_home_pool_their_faults_and_running_ones_do_not():
    this = _run("this", [(0, 100), (110, 200)])
    old = _run("old", [(0, 300), (300, 600), (600, 900)])
    history = [this, old, _run("going", [(0, 50), (60, 70)], finished=False)]
    rate = advice.fault_rate(this, history)
    assert (rate.faults, rate.seconds) == (1 + 2, 190.0 + 900.0)
    assert rate.mtbf_s == pytest.approx(1090.0 / 3)


def test_too_little_data_says_so_instead_of_a_number():
    got = advice.advise(_run("r", [(0, 1000), (1000, 2000)]), cost_s=5.0, interval_s=600.0)
    assert got.advised_s is None
    assert got.mtbf_s is None
    assert "too little data" in advice.describe(got)
    assert "--mtbf" in advice.describe(got)


def test_no_measured_cost_says_how_to_measure_it():
    got = advice.advise(_run("r", [(0, 10)]), cost_s=None, interval_s=None, mtbf_s=600.0)
    assert "progress.checkpoint" in advice.describe(got)


def test_redone_steps_are_last_step_made_minus_step_resumed_at():
    run = _run("r", [(0, 100), (110, 200), (210, 300)], steps=[(None, 34), (30, 70), (60, 90)])
    assert advice.redone_steps(run) == 4 + 10


def test_a_given_mtbf_advises_and_flags_checkpoints_too_rare():
    run = _run("r", [(0, 3000), (3000, 6000)], steps=[(None, 500), (450, 900)])
    got = advice.advise(run, cost_s=8.0, interval_s=1800.0, mtbf_s=600.0)
    assert got.advised_s == pytest.approx(math.sqrt(2 * 8.0 * 600.0))
    assert got.loss_advised_s < got.loss_used_s
    assert got.too_rare
    assert got.redone_steps == 50
    text = advice.describe(got)
    assert "Young-Daly interval 98 s" in text
    assert "checkpoints too rare" in text


def test_a_toy_jobs_sub_second_save_and_interval_are_not_said_as_0_s():
    run = _run("r", [(0, 1200), (1200, 2400), (2400, 3600)], steps=[(None, 1200), (1170, 2370), (2340, 3540)])
    got = advice.advise(run, cost_s=0.00016, interval_s=30.0, mtbf_s=600.0)
    text = advice.describe(got)
    assert "checkpoint cost 0.00016 s" in text
    assert "Young-Daly interval 0.44 s" in text
    assert "interval used 30 s" in text
    assert "checkpoint cost 8.0 s" in advice.describe(advice.advise(run, cost_s=8.0, interval_s=30.0, mtbf_s=600.0))


def test_the_digest_carries_the_slowest_save_the_newest_and_the_count_and_an_old_one_parses():
    labels = [{"submission_id": "sub", "rank": str(rank)} for rank in (0, 1)]
    made = digest.build([(digest.CHECKPOINT_SECONDS, labels[0], 4.0), (digest.CHECKPOINT_SECONDS, labels[1], 6.5),
                         (digest.CHECKPOINT_TIME, labels[0], 1000.0), (digest.CHECKPOINT_TIME, labels[1], 1001.0),
                         (digest.CHECKPOINTS, labels[0], 3.0), (digest.CHECKPOINTS, labels[1], 3.0)])
    job = digest.NodeDigest.model_validate_json(digest.encode(made)).jobs["sub"]
    assert (job.checkpoint_seconds, job.checkpoint_at, job.checkpoints) == (6.5, 1001.0, 3.0)
    old = digest.NodeDigest.model_validate_json('{"v":1,"jobs":{"sub":{"checkpoint_step":40}}}').jobs["sub"]
    assert (old.checkpoint_seconds, old.checkpoint_at, old.checkpoints) == (None, None, None)


def test_the_cost_and_interval_are_those_the_newest_attempt_saw():
    run = _run("r", [(0, 100), (100, 400)])
    run.attempts[0].checkpoint_seconds = 9.0
    run.attempts[0].first_checkpoint, run.attempts[0].last_checkpoint = (1.0, 20.0), (3.0, 80.0)
    run.attempts[1].first_checkpoint, run.attempts[1].last_checkpoint = (1.0, 130.0), (4.0, 220.0)
    assert advice.measured(run) == (9.0, 30.0)
    assert advice.advise(run, mtbf_s=900.0).interval_s == 30.0


def test_the_runs_own_spec_can_give_the_mean_time_between_faults(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    run = _run("r", [(0, 3000)])
    run.attempts[0].checkpoint_seconds = 8.0
    run.spec = {"health": {"mtbf_seconds": 600.0}}
    got = advice.for_run(run)
    assert got is not None
    assert got.advised_s == pytest.approx(math.sqrt(2 * 8.0 * 600.0))


def test_launcher_status_shows_the_advice_in_text_and_json(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """The same line as the end of `launcher submit` (its summary) and the numbers under `checkpoint_advice`;
    a run with nothing to advise on shows neither."""
    from click.testing import CliRunner

    from launcher.cli import main

    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    advised = _run("ckpt-1", [(0, 3000), (3000, 6000)], steps=[(None, 500), (450, 900)])
    advised.attempts[0].checkpoint_seconds = 8.0
    advised.attempts[0].first_checkpoint, advised.attempts[0].last_checkpoint = (1.0, 100.0), (2.0, 1900.0)
    advised.spec = {"health": {"mtbf_seconds": 600.0}}
    advised.save()
    _run("ckpt-none", [(0, 100)]).save()
    expected = advice.for_run(advised)
    assert expected is not None
    assert expected.too_rare  # saves every 1800 s where Young-Daly says 98 s

    text = CliRunner().invoke(main, ["status", "ckpt-1"])
    assert text.exit_code == 0, text.output
    [line] = [line for line in text.stdout.splitlines() if line.startswith("checkpts")]
    assert line == f"checkpts  {advice.summary(expected)}"
    assert advice.describe(expected) == f"checkpoint advice: {advice.summary(expected)}"  # submit's end says the same
    assert "checkpoints too rare for this fault rate" in line
    shown = CliRunner().invoke(main, ["status", "ckpt-1", "-o", "json"])
    assert shown.exit_code == 0, shown.output
    got = json.loads(shown.stdout)["checkpoint_advice"]
    assert (got["advised_s"], got["interval_s"], got["redone_steps"], got["too_rare"]) == (
        pytest.approx(math.sqrt(2 * 8.0 * 600.0)), 1800.0, 50, True)

    nothing = CliRunner().invoke(main, ["status", "ckpt-none"])
    assert nothing.exit_code == 0, nothing.output
    assert "checkpts" not in nothing.stdout
    assert json.loads(CliRunner().invoke(main, ["status", "ckpt-none", "-o", "json"]).stdout)["checkpoint_advice"] \
        is None


def test_the_advised_interval_is_at_least_one_step_so_a_save_every_step_is_not_too_rare():
    """A save that costs 0.2 ms at a fault every 10 minutes: Young-Daly says every 0.49 s, but the job's steps
    take 1 s, and saving every step is as often as a job can; the soak's toy checkpoint met this."""
    run = _run("r", [(0, 1200), (1200, 2400)], state="FAILED", steps=[(None, 1200), (1190, 2390)])
    newest = run.attempts[-1]
    newest.first_step, newest.first_step_at, newest.last_progress_at = 1191, 1210.0, 2409.0
    assert advice.step_seconds(run) == pytest.approx(1.0)
    got = advice.advise(run, cost_s=0.0002, interval_s=1.0, mtbf_s=600.0)
    assert advice.young_daly_s(0.0002, 600.0) < 0.5
    assert got.advised_s == pytest.approx(1.0)
    assert not got.too_rare
    assert "Young-Daly interval 1 s (one step: no job saves more often)" in advice.describe(got)
    slow = advice.advise(run, cost_s=8.0, interval_s=1800.0, mtbf_s=600.0)  # Young-Daly above a step: unchanged
    assert slow.advised_s == pytest.approx(math.sqrt(2 * 8.0 * 600.0))
    assert "one step" not in advice.describe(slow)
