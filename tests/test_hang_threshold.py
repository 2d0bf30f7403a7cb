"""The hang threshold learned from the run (launcher/health/threshold.py), as the watcher applies it each
check (launcher/health/watcher.py): reads made from expositions written the way the exporter writes them
(the train collector's families), the run's pace learned from them, the hang judged by the threshold.
"""

from __future__ import annotations

import time

from exporter.config import ProgressSettings
from exporter.contract import digest
from exporter.progress.store import ProgressStore, parse_batch
from launcher.cli import _status_text
from launcher.display import PlainReporter
from launcher.health import faults as found
from launcher.health.exporters import NodeRead, Target, parse
from launcher.health.faults import Attempt, Baseline, Fault
from launcher.health.policy import HANG_AFTER_SECONDS, FaultClass, HealthPolicy
from launcher.health.threshold import FLOOR_S, MIN_INTERVALS, PHASE_MIN_SEEN, HangLearner, Threshold
from launcher.journal import Journal
from launcher.state import RunRecord

SID = "run-1-a1"
START = 1_000_000.0
LABELS = f'job_id="02000000",submission_id="{SID}",rank="0"'


class Run:
    """One rank's job as its node's exporter serves it, checked every 10 s by a watcher's learner."""

    def __init__(self, policy: HealthPolicy | None = None) -> None:
        self.policy = policy or HealthPolicy()  # the defaults: no threshold given
        self.learner = HangLearner()
        self.attempt = Attempt(1, SID, started_at=START, running_at=START)
        self.now = START
        self.step = self.reports = 0
        self.last_report = START
        self.phases: dict[str, tuple[float | None, float | None]] = {}  # name -> (running since, last seconds)

    def steps(self, seconds: float, each: float) -> None:
        """Steps of `each` seconds, one report a step, for `seconds`."""
        for _ in range(round(seconds / each)):
            self.now += each
            self.step, self.reports, self.last_report = self.step + 1, self.reports + 1, self.now

    def text(self) -> str:
        lines = [f"raypulse_train_last_progress_time_seconds{{{LABELS}}} {self.last_report}",
                 f"raypulse_train_step{{{LABELS}}} {self.step}",
                 f"raypulse_train_reports_total{{{LABELS}}} {self.reports}"]
        for name, (since, last) in self.phases.items():
            if since is not None:
                lines.append(f'raypulse_rl_phase_start_time_seconds{{{LABELS},phase="{name}"}} {since}')
            if last is not None:
                lines.append(f'raypulse_rl_phase_iteration_seconds{{{LABELS},phase="{name}"}} {last}')
        return "\n".join(lines) + "\n"

    def check(self) -> tuple[Threshold, list[Fault]]:
        """What the watcher does at a check: learn, then judge by the threshold in force."""
        reads = [NodeRead(Target("workers-1", "http://10.0.0.1:9477"), parse(self.text()))]
        seen = found.progress(reads, SID)
        self.learner.observe(found.jobs(reads, SID), max(seen.last_report.values(), default=None), seen.newest_step)
        threshold = found.hang_threshold(self.policy, self.learner, reads, self.attempt)
        hangs = [fault for fault in found.find(self.policy, reads, self.attempt, Baseline(), self.now, (), seen,
                                               threshold) if fault.kind is FaultClass.HANG]
        return threshold, hangs

    def checked_steps(self, checks: int, each: float) -> None:
        for _ in range(checks):
            self.steps(10.0, each)
            self.check()

    def quiet_until_hang(self, limit: float = 7200.0) -> tuple[float, Threshold]:
        """Checks every 10 s of silence until a hang is judged: how long after the last report, by what."""
        while self.now - self.last_report < limit:
            self.now += 10.0
            threshold, hangs = self.check()
            if hangs:
                return self.now - self.last_report, threshold
        raise AssertionError(f"no hang judged within {limit:g} s")


def test_a_run_of_fast_steps_is_judged_hung_after_the_floor_not_the_alert_rules_threshold():
    run = Run()
    run.checked_steps(MIN_INTERVALS + 5, each=0.2)
    threshold, hangs = run.check()
    assert (threshold.rule, threshold.seconds, hangs) == ("steps", FLOOR_S, [])
    quiet, threshold = run.quiet_until_hang()
    assert FLOOR_S < quiet <= FLOOR_S + 10  # the first check past the floor
    assert threshold.evidence()["threshold"] == FLOOR_S < HANG_AFTER_SECONDS


def test_too_few_intervals_seen_keep_the_configured_threshold():
    run = Run()
    run.checked_steps(MIN_INTERVALS - 5, each=0.2)
    quiet, threshold = run.quiet_until_hang()
    assert (threshold.rule, threshold.seconds) == ("fixed", HANG_AFTER_SECONDS)
    assert quiet > HANG_AFTER_SECONDS


def test_slow_steps_raise_the_threshold_and_the_configured_one_caps_it():
    run = Run(HealthPolicy(hang_after_seconds=600))
    run.checked_steps(MIN_INTERVALS + 5, each=10.0)  # one step a check
    assert run.check()[0].seconds == 100.0  # 10 x 10 s
    slow = Run(HealthPolicy(hang_after_seconds=600))
    for _ in range(MIN_INTERVALS + 5):
        slow.steps(120.0, each=120.0)
        slow.check()
    threshold, hangs = slow.check()
    assert (threshold.rule, threshold.seconds, hangs) == ("steps", 600.0, [])  # 10 x 120 s, capped


def test_reports_every_hundredth_step_are_measured_between_reports_not_steps():
    run = Run()
    for _ in range(MIN_INTERVALS + 5):
        run.now += 30.0  # 100 steps of 0.3 s, one report
        run.step, run.reports, run.last_report = run.step + 100, run.reports + 1, run.now
        run.check()
    assert run.check()[0].seconds == 300.0  # 10 x 30 s between reports, not 10 x 0.3 s


def test_adaptive_hang_off_keeps_the_configured_threshold():
    run = Run(HealthPolicy(adaptive_hang=False))
    run.checked_steps(MIN_INTERVALS + 5, each=0.2)
    assert (run.check()[0].rule, run.check()[0].seconds) == ("fixed", HANG_AFTER_SECONDS)
    assert run.quiet_until_hang()[0] > HANG_AFTER_SECONDS


def iterations(run: Run, count: int, phases: dict[str, float]) -> None:
    """RL iterations: each phase in turn for its seconds, then the iteration reported."""
    for _ in range(count):
        for name, seconds in phases.items():
            run.phases[name] = (run.now, run.phases.get(name, (None, None))[1])
            while seconds > 0:
                step = min(10.0, seconds)
                run.now += step
                seconds -= step
                run.check()
            run.phases[name] = (None, phases[name])
        run.step, run.reports, run.last_report = run.step + 1, run.reports + 2 * len(phases) + 1, run.now
        run.check()


def test_a_long_generation_is_not_a_hang_when_generations_always_take_that_long():
    run = Run()
    usual = {"generate": 1200.0, "train": 60.0, "weight_sync": 5.0}
    iterations(run, PHASE_MIN_SEEN + 1, usual)
    run.phases["generate"] = (run.now, 1200.0)  # the next generation, as long as the others
    for _ in range(125):  # 1250 s: longer than the alert rule's 15 minutes
        run.now += 10.0
        threshold, hangs = run.check()
        assert hangs == []
    assert (threshold.rule, threshold.phase, threshold.seconds) == ("phase", "generate", 2400.0)  # twice its longest
    quiet, threshold = run.quiet_until_hang()
    assert threshold.phase == "generate"
    assert quiet > 2400.0


def test_a_weight_sync_that_usually_takes_seconds_is_stuck_after_a_minute():
    run = Run()
    iterations(run, PHASE_MIN_SEEN + 1, {"generate": 1200.0, "train": 60.0, "weight_sync": 5.0})
    run.phases["weight_sync"] = (run.now, 5.0)
    quiet, threshold = run.quiet_until_hang()
    assert (threshold.rule, threshold.phase, threshold.seconds) == ("phase", "weight_sync", FLOOR_S)
    assert FLOOR_S < quiet <= FLOOR_S + 10


def test_a_phase_seen_too_few_times_is_judged_by_the_configured_threshold():
    run = Run()
    iterations(run, PHASE_MIN_SEEN - 1, {"generate": 30.0, "weight_sync": 5.0})
    run.phases["weight_sync"] = (run.now, 5.0)
    quiet, threshold = run.quiet_until_hang()
    assert (threshold.rule, threshold.seconds) == ("fixed", HANG_AFTER_SECONDS)
    assert quiet > HANG_AFTER_SECONDS


def test_launcher_status_shows_the_thresholds_in_force(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    record = RunRecord(run_id="r-1", name="r", backend="local", max_attempts=3)
    journal = Journal(PlainReporter(), record)
    run = Run()
    for check in range(MIN_INTERVALS + 2):
        run.steps(10.0, each=0.2)
        run.check()
        for threshold in run.learner.learned(run.policy):
            if check in (0, MIN_INTERVALS + 1):  # as the healing loop says them: when they change
                journal.emit("health.threshold", attempt=1, seconds=threshold.seconds, rule=threshold.rule,
                             basis=threshold.basis, phase=threshold.phase)
    [line] = [line for line in _status_text(record).splitlines() if line.startswith("hang")]
    assert line.startswith(f"hang      after {FLOOR_S:g}s without progress (10 x p99 report interval 0.20 s")


def test_the_digest_carries_reports_and_phases_and_one_without_them_parses_as_before():
    run = Run()
    run.steps(10.0, each=0.2)
    run.phases = {"generate": (START + 5, 1200.0), "train": (None, 60.0)}
    made = digest.build((sample.name, sample.labels, sample.value) for sample in parse(run.text()))
    job = digest.NodeDigest.model_validate_json(digest.encode(made)).jobs[SID]
    assert (job.reports, job.phases) == (50.0, {"generate": (START + 5, 1200.0), "train": (None, 60.0)})
    old = digest.NodeDigest.model_validate_json(f'{{"v":1,"jobs":{{"{SID}":{{"checkpoint_step":40}}}}}}')
    assert (old.jobs[SID].reports, old.jobs[SID].phases) == (None, {})


def test_the_run_reports_its_threshold_in_force_to_the_exporter():
    store = ProgressStore(ProgressSettings())
    store.apply(parse_batch({"reports": [{"kind": "run", "run_id": "run-1", "time": time.time(),
                                          "hang_threshold_seconds": FLOOR_S}]}))
    assert store.view().runs["run-1"].hang_threshold_seconds == FLOOR_S
