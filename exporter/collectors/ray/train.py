"""What training code reports through `exporter.progress`, as `raypulse_train_*` by job and rank.

The exporter's progress endpoint (exporter/progress/endpoint.py) fills the store in `Shared.progress`;
each run of this collector turns the store into series. A report names its job by Ray job id, submission id or both
(whatever the reporting process knows); the other is looked up in the Jobs API so every series
carries both, and reports of one rank under either name become one series set.

It also turns the RL runs' rollout servers the store holds into the target groups of /sd/rollout
(rollout_sd.py), labelled with both ids.

Jobs Ray says have ended, or does not know, are marked doubtful in the store (let go first when room
is needed) and released once they have been quiet for progress.finished_grace_seconds. The series
are made from a snapshot of the store in a worker thread: a full store is tens of thousands of
series, never rendered on the event loop that serves /metrics and the progress endpoint.
"""

from __future__ import annotations

import asyncio
import json

from exporter.collectors.ray.dashboard import DashboardError, connect
from exporter.collectors.ray.job_ids import JobDirectory
from exporter.collectors.ray.localray import LocalRay
from exporter.collectors.ray.rollout_sd import rollout_groups
from exporter.config import ExporterConfig
from exporter.framework.catalog import counter, gauge
from exporter.framework.collector import AsyncCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink
from exporter.progress import store as progress_store
from exporter.progress.store import FLOAT_FIELDS, REJECT_REASONS, JobKey, RankState, RLState, StoreView

NAME = "train"
_REPORTED = "while a rank of a job reports progress"
STATUS_EVERY_SECONDS = 30.0  # how often Ray's job list is read while jobs report (ended jobs are let go)
LABELS = ("job_id", "submission_id", "rank")


def _gauge(name: str, help: str, unit: str = "", only_when: str = _REPORTED, labels: tuple[str, ...] = LABELS):
    return gauge(f"raypulse_train_{name}", help, collector=NAME, labels=labels, unit=unit, only_when=only_when)


def _counter(name: str, help: str, only_when: str = _REPORTED, labels: tuple[str, ...] = LABELS):
    return counter(f"raypulse_train_{name}", help, collector=NAME, labels=labels, only_when=only_when)


STEP = _gauge("step", "Last training step the rank reported.")
SAMPLES = _counter("samples_total", "Samples the rank has processed (the sum of what it reported).",
                   only_when="while a rank reports samples")
TOKENS = _counter("tokens_total", "Tokens the rank has processed (the sum of what it reported).",
                  only_when="while a rank reports tokens")
LOSS = _gauge("loss", "Last finite loss the rank reported.", only_when="once a rank reported a finite loss")
GRAD_NORM = _gauge("grad_norm", "Last finite gradient norm the rank reported.",
                   only_when="once a rank reported a finite gradient norm")
LEARNING_RATE = _gauge("learning_rate", "Last learning rate the rank reported.",
                       only_when="once a rank reported a learning rate")
NONFINITE = _counter("nonfinite_values_total", "Reported values that were NaN or infinite, by field (loss, "
                     "grad_norm, learning_rate; reward_mean, kl, entropy for a rank that reports RL); the gauges "
                     "keep the last finite value.",
                     labels=(*LABELS, "field"))
LAST_PROGRESS = _gauge("last_progress_time_seconds", "Unix time of the rank's last progress report; a job whose "
                       "ranks stop advancing it may be hung.", "seconds", only_when="once a rank reported progress")
FIRST_STEP = _gauge("first_step", "First training step the rank reported in this job (an attempt of a launcher run "
                   "is a job of its own: the step it resumed at).", only_when="once a rank reported a step")
FIRST_PROGRESS = _gauge("first_progress_time_seconds", "Unix time of the rank's first progress report with a step "
                        "in this job (when an attempt made its first step).", "seconds",
                        only_when="once a rank reported a step")
LAST_CHECKPOINT = _gauge("last_checkpoint_time_seconds", "Unix time the rank last reported a saved checkpoint.",
                         "seconds", only_when="once a rank reported a checkpoint")
CHECKPOINT_STEP = _gauge("checkpoint_step", "Step of the rank's last saved checkpoint.",
                         only_when="once a rank reported a checkpoint with its step")
CHECKPOINT_SECONDS = _gauge("checkpoint_duration_seconds", "How long the rank's last checkpoint save took (as "
                            "timed by progress.checkpoint() or given to checkpoint_saved(seconds=...)).", "seconds",
                            only_when="once a rank reported a timed checkpoint")
CHECKPOINTS = _counter("checkpoints_total", "Checkpoints the rank reported saved.")
REPORTS = _counter("reports_total", "Reports received from the rank.")
CLIENT_DROPPED = _counter("client_dropped_reports_total", "Reports the rank's client dropped (its queue was full "
                          "or the exporter unreachable), as it last said.")
RANKS = _gauge("ranks", "Ranks of the job that report progress to this exporter.",
               labels=("job_id", "submission_id"))

# RL post-training (progress.phase / progress.report_iteration): by job and rank like the rest.
_RL = "while a rank reports RL iterations"


def _rl_gauge(name: str, help: str, unit: str = "", only_when: str = _RL, labels: tuple[str, ...] = LABELS):
    return gauge(f"raypulse_rl_{name}", help, collector=NAME, labels=labels, unit=unit, only_when=only_when)


def _rl_counter(name: str, help: str, unit: str = "", only_when: str = _RL, labels: tuple[str, ...] = LABELS):
    return counter(f"raypulse_rl_{name}", help, collector=NAME, labels=labels, unit=unit, only_when=only_when)


RL_ITERATION = _rl_gauge("iteration", "Last RL iteration the rank reported.",
                         only_when="once a rank reported an RL iteration")
RL_ITERATIONS = _rl_counter("iterations_total", "RL iterations the rank has reported done (its client counts "
                            "them).", only_when="once a rank reported an RL iteration")
RL_LAST_ITERATION = _rl_gauge("last_iteration_time_seconds", "Unix time of the rank's last RL iteration report.",
                              "seconds", only_when="once a rank reported an RL iteration")
RL_ROLLOUTS = _rl_counter("rollouts_total", "Rollouts (generated responses) the rank has reported.",
                          only_when="once a rank reported rollouts")
RL_GENERATED_TOKENS = _rl_counter("generated_tokens_total", "Tokens generated in the rank's rollouts.",
                                  only_when="once a rank reported generated tokens")
RL_REWARD_MEAN = _rl_gauge("reward_mean", "Mean reward of the rank's last RL iteration (last finite value).",
                           only_when="once a rank reported a finite reward mean")
RL_REWARD_STD = _rl_gauge("reward_std", "Standard deviation of the rewards of the rank's last RL iteration.",
                          only_when="once a rank reported a reward standard deviation")
RL_SOURCE_REWARD = _rl_gauge("source_reward_mean", "Mean reward of the rank's last RL iteration by reward source "
                             "(a reward model, a rule, a verifier; at most 16 sources per rank).",
                             only_when="once a rank reported rewards by source", labels=(*LABELS, "source"))
RL_KL = _rl_gauge("kl", "KL divergence of the policy from its reference in the rank's last RL iteration (last "
                  "finite value).", only_when="once a rank reported a finite KL")
RL_ENTROPY = _rl_gauge("entropy", "Policy entropy in the rank's last RL iteration (last finite value).",
                       only_when="once a rank reported a finite entropy")
RL_RESPONSE_MEAN = _rl_gauge("response_tokens_mean", "Mean response length of the rank's last RL iteration, in "
                             "tokens.", only_when="once a rank reported a response length")
RL_RESPONSE_MAX = _rl_gauge("response_tokens_max", "Longest response of the rank's last RL iteration, in tokens.",
                            only_when="once a rank reported a longest response")
RL_RESPONSE_LIMIT = _rl_gauge("response_tokens_limit", "The most tokens a response may have (generation stops "
                              "there), as the rank reported it.", only_when="once a rank reported its limit")
RL_TRUNCATED = _rl_gauge("truncated_ratio", "Share of the last RL iteration's responses cut off at the length "
                         "limit.", "ratio", only_when="once a rank reported a truncated share")
RL_SYNC_SECONDS = _rl_gauge("weight_sync_seconds", "How long the rank's last weight sync to the generators took.",
                            "seconds", only_when="once a rank reported a weight sync")
RL_SYNC_BYTES = _rl_gauge("weight_sync_bytes", "Bytes the rank's last weight sync moved to the generators.",
                          "bytes", only_when="once a rank reported weight-sync bytes")
_PHASE = (*LABELS, "phase")
RL_PHASE_SECONDS = _rl_counter("phase_seconds_total", "Wall seconds the rank spent in each named phase of its RL "
                               "iterations (generate, reward, train, weight_sync...; at most 16 per rank).",
                               "seconds", only_when="once a rank reported a phase", labels=_PHASE)
RL_PHASE_ITERATION = _rl_gauge("phase_iteration_seconds", "Seconds the rank spent in each phase during its last "
                               "completed RL iteration (0 for a phase that did not run in it).", "seconds",
                               only_when="once a rank completed an RL iteration with phases", labels=_PHASE)
RL_PHASE_START = _rl_gauge("phase_start_time_seconds", "Unix time the phase now running started; present only "
                           "while it runs (a phase that never ends is an RL hang).", "seconds",
                           only_when="while a phase of a rank's RL iteration runs", labels=_PHASE)
ENDPOINT_UP = gauge("raypulse_train_endpoint_up", "1 if the progress endpoint is listening.", collector=NAME)
JOBS = gauge("raypulse_train_jobs", "Jobs whose progress this exporter tracks (bounded by progress.max_jobs).",
             collector=NAME)
_HEALED = "for a launcher run whose health watcher healed it"
RUN_RECOVERIES = counter("raypulse_run_recoveries_total", "Faults the launcher's health watcher healed in the run, "
                         "by fault class (hang, gpu_fault, node_lost, nonfinite_loss).", collector=NAME,
                         labels=("run_id", "fault"), only_when=_HEALED)
RUN_DETECT = gauge("raypulse_run_detect_seconds", "Seconds from the run's latest healed fault to its detection.",
                   collector=NAME, labels=("run_id",), unit="seconds", only_when=_HEALED)
RUN_RECOVER = gauge("raypulse_run_recover_seconds", "Seconds from the run's latest healed fault to the first "
                    "training step of the attempt that replaced it.", collector=NAME, labels=("run_id",),
                    unit="seconds", only_when=_HEALED)
RUN_STEPS_LOST = counter("raypulse_run_steps_lost_total", "Training steps the run redid after its faults (the "
                         "steps since the checkpoint it resumed from).", collector=NAME, labels=("run_id",),
                         only_when=_HEALED)
RUN_EFFECTIVE = gauge("raypulse_run_effective_training_ratio", "Share of the run's wall time spent making progress "
                      "it kept (its launcher's estimate).", collector=NAME, labels=("run_id",), unit="ratio",
                      only_when="for a launcher run whose health watcher reports it")
RUN_HANG_THRESHOLD = gauge("raypulse_run_hang_threshold_seconds", "Seconds without progress after which the run's "
                           "health watcher judges a hang now (learned from the run's pace, or its configured "
                           "health.hang_after_seconds).", collector=NAME, labels=("run_id",), unit="seconds",
                           only_when="for a launcher run whose health watcher reports it")
RUN_CHECKPOINT_INTERVAL = gauge("raypulse_run_checkpoint_interval_seconds", "Mean time between the run's checkpoint "
                                "saves, as its health watcher saw them.", collector=NAME, labels=("run_id",),
                                unit="seconds", only_when="for a launcher run once two saves were seen")
RUN_CHECKPOINT_ADVISED = gauge("raypulse_run_checkpoint_advised_interval_seconds", "The Young-Daly checkpoint "
                               "interval for the run's save cost and fault rate: sqrt(2 x save seconds x mean time "
                               "between faults), at least one step's time.", collector=NAME, labels=("run_id",),
                               unit="seconds",
                               only_when="for a launcher run with a timed save and enough faults seen")
RUN_TIME = gauge("raypulse_run_time_seconds", "Seconds of the run's wall time so far, by cause (productive, startup, "
                 "detecting, redone, ...: its launcher's ledger; a second's cause may change once a fault is judged, "
                 "so it is a gauge).", collector=NAME, labels=("run_id", "cause"), unit="seconds",
                 only_when="for a launcher run whose health watcher reports it")
REJECTED = counter("raypulse_train_rejected_reports_total", "Progress requests refused, by reason: invalid (400), "
                   "unauthorized (401: no or a wrong token), too_large (413), unsupported_media_type (415), "
                   "too_many_jobs, too_many_ranks, too_many_job_series (one job past progress.max_job_share), "
                   "too_many_series and too_many_rollout_servers (429).", collector=NAME, labels=("reason",))
SERIES = gauge("raypulse_train_series", "Series the progress store holds (bounded by progress.max_series).",
               collector=NAME)
SERIES_LIMIT = gauge("raypulse_train_series_limit", "The most series the progress store holds (progress.max_series).",
                     collector=NAME)
REFUSED_SERIES = counter("raypulse_train_refused_series_total", "Series that refused progress reports would have "
                         "added (over progress.max_series, max_jobs, max_ranks_per_job or max_job_share): "
                         "progress not shown.",
                         collector=NAME)


@register
class TrainCollector(AsyncCollector):
    name = NAME
    description = ("Training progress reported by the job itself through exporter.progress: step, samples, "
                   "tokens, loss, grad norm, learning rate, checkpoints, RL iterations (phases, rewards, KL, "
                   "response lengths, weight sync), by job and rank (the progress endpoint).")

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self.store = self.shared.progress
        self.local = LocalRay(config)
        self.directory = JobDirectory()

    async def collect(self, out: SampleSink) -> None:
        self.store.expire()
        jobs = self.store.job_keys()
        if jobs and (self.directory.due(jobs) or self.directory.older_than(STATUS_EVERY_SECONDS)):
            try:
                async with connect(self.local) as api:
                    await self.directory.refresh(api)
            except DashboardError:
                pass  # labels stay as reported until Ray answers
        self._let_go_of_ended(jobs)
        view = self.store.view()
        await asyncio.to_thread(self._emit, out, view, bool(self.shared.progress_endpoint_up.get()))
        await asyncio.to_thread(self._serve_rollouts, view)

    def _serve_rollouts(self, view: StoreView) -> None:
        """/sd/rollout's answer, rendered once per run (4,096 servers are ~0.5 MB of JSON and ~25 ms of CPU)."""
        if not view.rollouts and self.shared.rollout_servers.get() == b"[]":
            return  # nothing told and nothing served: no work each collection
        found = self.shared.service_discovery.get()
        groups = rollout_groups(view.rollouts, self.directory.resolve, found.groups if found is not None else (),
                                self.config.cluster or "")
        self.shared.rollout_servers.publish(json.dumps(groups).encode())

    def _let_go_of_ended(self, jobs: list[JobKey]) -> None:
        doubtful = frozenset(key for key in jobs if self.directory.standing(*key) != "running")
        self.store.doubtful = doubtful
        grace = self.config.progress.finished_grace_seconds
        self.store.release(key for key in doubtful if self.store.quiet_since(key) >= grace)

    def _emit(self, out: SampleSink, view: StoreView, endpoint_up: bool) -> None:
        out.add(ENDPOINT_UP, endpoint_up)
        out.add(JOBS, len(view.jobs))
        out.add(SERIES, view.series)
        out.add(SERIES_LIMIT, self.config.progress.max_series)
        out.add(REFUSED_SERIES, view.refused_series)
        for reason in REJECT_REASONS:
            out.add(REJECTED, view.rejected.get(reason, 0), reason=reason)
        merged: dict[tuple[str, str], dict[int, RankState]] = {}
        for (job_id, submission_id), ranks in view.jobs.items():
            target = merged.setdefault(self.directory.resolve(job_id, submission_id), {})
            for rank, state in ranks.items():
                if rank not in target or state.touched > target[rank].touched:
                    target[rank] = state  # the same rank reported under both names: the newest wins
        for (job_id, submission_id), ranks in merged.items():
            out.add(RANKS, len(ranks), job_id=job_id, submission_id=submission_id)
            for rank, state in ranks.items():
                emit_rank(out, state, job_id=job_id, submission_id=submission_id, rank=rank)
        for run_id, health in view.runs.items():
            for fault, count in health.recoveries.items():
                out.add(RUN_RECOVERIES, count, run_id=run_id, fault=fault)
            if health.recoveries:
                out.add(RUN_DETECT, health.detect_seconds, run_id=run_id)
                out.add(RUN_RECOVER, health.recover_seconds, run_id=run_id)
                out.add(RUN_STEPS_LOST, health.steps_lost, run_id=run_id)
            out.add(RUN_EFFECTIVE, health.effective_training_ratio, run_id=run_id)
            out.add(RUN_HANG_THRESHOLD, health.hang_threshold_seconds, run_id=run_id)
            out.add(RUN_CHECKPOINT_INTERVAL, health.checkpoint_interval_seconds, run_id=run_id)
            out.add(RUN_CHECKPOINT_ADVISED, health.checkpoint_advised_interval_seconds, run_id=run_id)
            for cause, seconds in health.time_seconds.items():
                out.add(RUN_TIME, seconds, run_id=run_id, cause=cause)


def emit_rank(out: SampleSink, state: RankState, **labels: object) -> None:
    out.add(STEP, state.step, **labels)
    out.add(SAMPLES, state.samples_total, **labels)
    out.add(TOKENS, state.tokens_total, **labels)
    out.add(LOSS, state.values.get("loss"), **labels)
    out.add(GRAD_NORM, state.values.get("grad_norm"), **labels)
    out.add(LEARNING_RATE, state.values.get("learning_rate"), **labels)
    for field in FLOAT_FIELDS:
        out.add(NONFINITE, state.nonfinite[field], **labels, field=field)
    out.add(LAST_PROGRESS, state.last_progress_time, **labels)
    out.add(FIRST_STEP, state.first_step, **labels)
    out.add(FIRST_PROGRESS, state.first_progress_time, **labels)
    out.add(LAST_CHECKPOINT, state.last_checkpoint_time, **labels)
    out.add(CHECKPOINT_STEP, state.checkpoint_step, **labels)
    out.add(CHECKPOINT_SECONDS, state.checkpoint_seconds, **labels)
    out.add(CHECKPOINTS, state.checkpoints, **labels)
    out.add(REPORTS, state.reports, **labels)
    out.add(CLIENT_DROPPED, state.client_dropped, **labels)
    if state.rl is not None:
        for field in progress_store.RL_NONFINITE_FIELDS:
            out.add(NONFINITE, state.nonfinite[field], **labels, field=field)
        emit_rl(out, state.rl, **labels)


def emit_rl(out: SampleSink, rl: RLState, **labels: object) -> None:
    out.add(RL_ITERATION, rl.iteration, **labels)
    out.add(RL_ITERATIONS, rl.iterations_total, **labels)
    out.add(RL_LAST_ITERATION, rl.last_iteration_time, **labels)
    out.add(RL_ROLLOUTS, rl.rollouts_total, **labels)
    out.add(RL_GENERATED_TOKENS, rl.generated_tokens_total, **labels)
    for spec, name in ((RL_REWARD_MEAN, "reward_mean"), (RL_REWARD_STD, "reward_std"), (RL_KL, "kl"),
                       (RL_ENTROPY, "entropy"), (RL_RESPONSE_MEAN, "response_length_mean"),
                       (RL_RESPONSE_MAX, "response_length_max"), (RL_RESPONSE_LIMIT, "response_length_limit"),
                       (RL_TRUNCATED, "truncated_ratio"), (RL_SYNC_SECONDS, "weight_sync_seconds"),
                       (RL_SYNC_BYTES, "weight_sync_bytes")):
        out.add(spec, rl.values.get(name), **labels)
    for source, value in rl.rewards.items():
        out.add(RL_SOURCE_REWARD, value, **labels, source=source)
    for phase, state in rl.phases.items():
        out.add(RL_PHASE_SECONDS, state.seconds_total, **labels, phase=phase)
        out.add(RL_PHASE_ITERATION, state.iteration_seconds, **labels, phase=phase)
        out.add(RL_PHASE_START, state.running_since, **labels, phase=phase)

