"""Training stability: what Ray cannot see. A job whose processes are alive may have stopped
stepping, slowed down, produced NaNs, or be held back by one slow rank; this board reads what
the job reports through exporter.progress (raypulse_train_*) and the alerts about it."""

from __future__ import annotations

from dashboards.boards.common import RATE, TRAINING_ALERTS, UID_TRAINING, rate, to_gpu, to_job
from dashboards.model import Board, Panel, Row, Target
from dashboards.selectors import Scope

S = Scope("cluster", "submission")
RUNS = Scope("cluster")  # run-level series (run_id) are not per submission
JOB = "{{submission_id}}"
RANK = JOB + " rank {{rank}}"
PER_JOB = "cluster, submission_id"
BASELINE = "1h"  # throughput is compared with its average over this window


def _throughput(family: str, window: str = RATE) -> str:
    return f"sum by ({PER_JOB}) ({rate(S(family), window)})"


STALLS = Row("Stalls", collapsed=False, panels=(
    Panel("Time since last progress", "s", (
        Target(f"time() - {S('raypulse_train_last_progress_time_seconds')}", RANK),),
        "Per rank: how long ago it last reported a step. A rank that stops reporting while the job runs is "
        "hung (a stuck collective, a dead data loader).", width=6, min=0,
        thresholds=((None, "green"), (300, "orange"), (600, "red")), links=(to_job(),)),
    Panel("Steps per second", "short", (
        Target(f"deriv({S('raypulse_train_step')}[{RATE}])", RANK),),
        "How fast each rank's step advances.", width=6, min=0),
    Panel("Ranks reporting", "short", (
        Target(S("raypulse_train_ranks"), JOB + " ranks"),
        Target(f"sum by ({PER_JOB}) ({rate(S('raypulse_train_reports_total'))})", JOB + " reports/s")),
        "Ranks that report progress, and reports per second over all of them.", width=6, min=0),
    Panel("Time since the job's last output", "s", (
        Target(f"time() - max by ({PER_JOB}) ({S('raypulse_job_output_last_write_time_seconds')})",
               JOB + " workers"),
        Target(f"time() - max by ({PER_JOB}) ({S('raypulse_job_driver_log_last_write_time_seconds')})",
               JOB + " driver")),
        "How long ago the job's worker processes (over every node) and its driver last wrote output: for a "
        "job that reports no progress, the launcher's hang signal.", width=6, min=0),
))

THROUGHPUT = Row("Throughput against baseline", collapsed=False, panels=(
    Panel("Samples per second", "short", (
        Target(_throughput("raypulse_train_samples_total"), JOB + " now"),
        Target(_throughput("raypulse_train_samples_total", BASELINE), JOB + f" {BASELINE} average")),
        f"Samples per second over all ranks, now and averaged over the last {BASELINE}.", width=8, min=0),
    Panel("Tokens per second", "short", (
        Target(_throughput("raypulse_train_tokens_total"), JOB + " now"),
        Target(_throughput("raypulse_train_tokens_total", BASELINE), JOB + f" {BASELINE} average")),
        f"Tokens per second over all ranks, now and averaged over the last {BASELINE}.", width=8, min=0),
    Panel("Throughput relative to baseline", "percentunit", (
        Target(f"{_throughput('raypulse_train_samples_total')} / "
               f"{_throughput('raypulse_train_samples_total', BASELINE)}", JOB),),
        f"Samples per second now divided by the {BASELINE} average; a drop below 100% without a change in "
        "the job is a slow GPU, node or network.", width=8, min=0,
        thresholds=((None, "red"), (0.7, "orange"), (0.9, "green"))),
))

NUMERICS = Row("Loss, gradients and NaN", collapsed=False, panels=(
    Panel("Non-finite values reported", "short", (
        Target(f"sum by ({PER_JOB}, field) ({S('raypulse_train_nonfinite_values_total')})", JOB + " {{field}}"),),
        "NaN or infinite loss, gradient norm or learning rate reported so far (counted, never drawn as a "
        "value).", width=6, min=0, thresholds=((None, "green"), (1, "red"))),
    Panel("Loss", "short", (Target(S("raypulse_train_loss"), RANK),),
          "Last finite loss each rank reported.", width=6),
    Panel("Loss against its 1h average", "percentunit", (
        Target(f"{S('raypulse_train_loss')} / avg_over_time({S('raypulse_train_loss')}[1h])", RANK),),
        "Loss divided by its average over the last hour: spikes stand out whatever the loss's scale.", width=6),
    Panel("Gradient norm", "short", (Target(S("raypulse_train_grad_norm"), RANK),),
          "Last finite gradient norm each rank reported; growth before a NaN is the usual warning.", width=6),
    Panel("Learning rate", "short", (Target(S("raypulse_train_learning_rate"), RANK),),
          "Learning rate each rank reported (a schedule gone wrong shows here).", width=6),
    Panel("Job GPU SM time", "percentunit", (
        Target(f"avg by ({PER_JOB}, node, gpu) ({S('raypulse_job_gpu_sm_utilization_ratio')})",
               JOB + " {{node}} GPU {{gpu}}"),),
        "SM time the job's processes use on each GPU; a collapse with steps still advancing is an input or "
        "communication bottleneck (click: the GPU).", width=6, min=0, max=1, links=(to_gpu(),)),
))

STRAGGLERS = Row("Stragglers", collapsed=False, panels=(
    Panel("Steps behind the leading rank", "short", (
        Target(f"max by ({PER_JOB}) ({S('raypulse_train_step')}) - on ({PER_JOB}) group_right () "
               f"{S('raypulse_train_step')}", RANK),),
        "How far each rank trails the fastest one; in synchronous training a growing gap is a stuck rank.",
        width=8, min=0),
    Panel("Rank throughput against the job's mean", "percentunit", (
        Target(f"{rate(S('raypulse_train_samples_total'))} / on ({PER_JOB}) group_left () "
               f"avg by ({PER_JOB}) ({rate(S('raypulse_train_samples_total'))})", RANK),),
        "Each rank's samples per second divided by the mean over ranks: a straggler sits below 100%.",
        width=8, min=0, thresholds=((None, "red"), (0.8, "orange"), (0.95, "green"))),
    Panel("Last report spread", "s", (
        Target(f"max by ({PER_JOB}) ({S('raypulse_train_last_progress_time_seconds')}) - "
               f"min by ({PER_JOB}) ({S('raypulse_train_last_progress_time_seconds')})", JOB),),
        "Seconds between the most and least recent rank reports.", width=8, min=0),
))

CHECKPOINTS = Row("Checkpoints", collapsed=False, panels=(
    Panel("Checkpoint age", "s", (
        Target(f"time() - {S('raypulse_train_last_checkpoint_time_seconds')}", RANK),),
        "Time since each rank last reported a saved checkpoint.", width=6, min=0,
        thresholds=((None, "green"), (3600, "orange"), (7200, "red"))),
    Panel("Steps since the last checkpoint", "short", (
        Target(f"max by ({PER_JOB}) ({S('raypulse_train_step')}) - on ({PER_JOB}) "
               f"max by ({PER_JOB}) ({S('raypulse_train_checkpoint_step')})", JOB),),
        "Work a crash now would lose, in steps.", width=6, min=0),
    Panel("Checkpoints saved", "short", (
        Target(f"sum by ({PER_JOB}) ({S('raypulse_train_checkpoints_total')})", JOB),),
        "Checkpoints reported saved, all ranks.", width=6, min=0),
    Panel("Checkpoint save time", "s", (
        Target(S("raypulse_train_checkpoint_duration_seconds"), RANK),),
        "How long each rank's last checkpoint save took (progress.checkpoint() times it).", width=6, min=0),
    Panel("First step of the attempt", "short", (
        Target(f"min by ({PER_JOB}) ({S('raypulse_train_first_step')})", JOB),),
        "The step each job (each attempt of a launcher run is one) started at: 1, or the step after the "
        "checkpoint it resumed from.", width=12, min=0),
    Panel("Time since the attempt's first step", "s", (
        Target(f"time() - min by ({PER_JOB}) ({S('raypulse_train_first_progress_time_seconds')})", JOB),),
        "How long each job has been training, from the first step it reported (its start-up left out).",
        width=12, min=0),
))

HEALING = Row("Healing", collapsed=False, panels=(
    Panel("Faults healed", "short", (
        Target(f"sum by (cluster, run_id, fault) ({RUNS('raypulse_run_recoveries_total')})",
               "{{run_id}} {{fault}}"),),
        "Faults the launcher's health watcher healed in each run (a new attempt from the last checkpoint, on "
        "a healthy node), by class: hang, gpu_fault, node_lost, nonfinite_loss.", width=6, min=0),
    Panel("Time to detect and to recover", "s", (
        Target(RUNS("raypulse_run_detect_seconds"), "{{run_id}} detect"),
        Target(RUNS("raypulse_run_recover_seconds"), "{{run_id}} recover"),
        Target(RUNS("raypulse_run_hang_threshold_seconds"), "{{run_id}} hang threshold")),
        "For each run's latest healed fault: from the fault to its detection, and to the first step of the "
        "attempt that replaced the faulty one; and the seconds without progress after which a hang is judged "
        "now (learned from the run's pace).", width=6, min=0),
    Panel("Steps lost", "short", (
        Target(RUNS("raypulse_run_steps_lost_total"), "{{run_id}}"),),
        "Steps each run redid after its faults (since the checkpoint it resumed from).", width=6, min=0),
    Panel("Effective training time", "percentunit", (
        Target(RUNS("raypulse_run_effective_training_ratio"), "{{run_id}}"),),
        "Share of each run's wall time spent making progress it kept (the platforms we follow promise 90%+).",
        width=6, min=0, max=1, thresholds=((None, "red"), (0.8, "orange"), (0.9, "green"))),
    Panel("Where the time went", "s", (
        Target(RUNS("raypulse_run_time_seconds"), "{{run_id}} {{cause}}"),),
        "Each run's wall time so far by cause (its launcher's ledger; they add up to the wall time): productive, "
        "queued, provisioning, startup, detecting, stopping, backoff, redone, checkpoint_stall, lost_to_end.",
        width=24, min=0, stack=True),
))

REPORTING = Row("Progress reporting", (
    Panel("Reports dropped by clients", "short", (
        Target(S("raypulse_train_client_dropped_reports_total"), RANK),),
        "Reports a rank's client dropped (queue full, exporter unreachable), as it last said.", min=0),
    Panel("Reports refused", "ops", (
        Target(f"sum by (cluster, node, reason) ({rate(S('raypulse_train_rejected_reports_total'))})",
               "{{node}} {{reason}}"),
        Target(f"sum by (cluster, node) ({rate(S('raypulse_train_refused_series_total'))})",
               "{{node}} series refused")),
        "Progress requests the exporters refused per second, by reason, and the series they would have added.",
        min=0),
    Panel("Progress endpoints", "short", (
        Target(S("raypulse_train_endpoint_up"), "{{node}} listening"),
        Target(S("raypulse_train_jobs"), "{{node}} jobs tracked")),
        "Whether each node's progress endpoint listens, and how many jobs it tracks.", min=0),
    Panel("Progress store", "percentunit", (
        Target(f"{S('raypulse_train_series')} / {S('raypulse_train_series_limit')}", "{{node}}"),),
        "Share of progress.max_series each node's progress store holds; when full, new jobs and ranks are "
        "refused.", min=0, max=1),
))

ALERTS = Row("Alerts", collapsed=False, panels=(
    Panel("Training and job alerts", "short", (
        Target(f"sum by (alertname, alertstate, severity, submission_id) "
               f"({S('ALERTS', TRAINING_ALERTS)})", "{{alertname}} {{submission_id}} {{alertstate}}"),),
        "Pending and firing alerts of the training and job groups (alerts/rules/).", width=24, height=6, min=0,
        kind="statetimeline", mappings=(("1", "active", "red"),)),
))

BOARD = Board(
    uid=UID_TRAINING, title="raypulse / Training stability",
    description="Stalls, throughput against baseline, NaN, loss and gradients, stragglers, checkpoints and "
                "the training alerts, from what jobs report through exporter.progress.",
    variables=("cluster", "submission"), tags=("training",),
    rows=(STALLS, THROUGHPUT, NUMERICS, STRAGGLERS, CHECKPOINTS, HEALING, REPORTING, ALERTS),
)
