"""Training progress, from what the job reports through `exporter.progress` (raypulse_train_*):
stalls, throughput against the job's own recent baseline, NaN/Inf and spiking loss, stale
checkpoints, straggler ranks. They keep the job's `namespace` where there is one (BY_JOB); the per-rank
ones keep every label of their series.

A job that reports nothing has no raypulse_train_* series and none of these can fire for it;
RaypulseJobDriverLogSilent is the hang signal that needs no instrumentation.
"""

from __future__ import annotations

from alerts.config import Config
from alerts.model import AT_JOB, AT_RANK, BY_JOB, RAY_JOB, Alert, Group, Record, cap, increased

# Recording rules are named level:metric:operation with the window in the operation (kubernetes-mixin's
# habit), so a rule's name says what it averages over.
THROUGHPUT = "ray_job:raypulse_train_throughput:rate{window}"
STEP_RATE = "rank:raypulse_train_step:deriv{window}"
ON_JOB = f"on ({RAY_JOB})"
RUNNING = f'{ON_JOB} raypulse_job_state{{state="RUNNING"}} == 1'


def group(c: Config) -> Group:
    t = c.tune
    drop, spike, straggler = (t("RaypulseTrainingThroughputDropped"), t("RaypulseTrainingLossSpike"),
                              t("RaypulseTrainingStragglerRank"))
    rare = t("RaypulseRunCheckpointsTooRare")
    past = f"[{spike.baseline}] offset {spike.skip}"
    nonfinite = t("RaypulseTrainingLossNonFinite").window
    throughput, step_rate = THROUGHPUT.format(window=drop.rate_window), STEP_RATE.format(window=straggler.window)
    return Group("training", "Training progress (stalls, throughput, loss, checkpoints, stragglers)", [
        Alert("RaypulseTrainingStalled", "critical", "training", f"""
            time() - max by ({BY_JOB}) (raypulse_train_last_progress_time_seconds)
              > {t("RaypulseTrainingStalled").age.seconds}
            and {RUNNING}
            """,
              "A running training job has stopped reporting progress.",
              f"No rank of {AT_JOB} has reported a training step for {{{{ $value | humanizeDuration }}}} "
              "while the job is running: it is hung or stuck."),
        # Tokens per second where the job reports tokens, else samples per second.
        Record(throughput, f"""
            sum by ({BY_JOB}) (rate(raypulse_train_tokens_total[{drop.rate_window}]))
            or
            sum by ({BY_JOB}) (rate(raypulse_train_samples_total[{drop.rate_window}]))
            """),
        Alert("RaypulseTrainingThroughputDropped", "warning", "training", f"""
            {throughput}
              < {drop.ratio:g} * quantile_over_time(0.5, {throughput}[{drop.baseline}] offset {drop.skip})
            and {RUNNING}
            and {ON_JOB} (time() - raypulse_job_start_time_seconds > {drop.min_age.seconds})
            """,
              "A training job's throughput dropped below its own recent baseline.",
              f"{AT_JOB} processes {{{{ $value | humanize }}}} tokens (or samples) per second, below "
              f"{drop.ratio:.0%} of its median over the {drop.baseline} before the last {drop.skip}."),
        Alert("RaypulseTrainingLossNonFinite", "critical", "training",
              increased('raypulse_train_nonfinite_values_total{field="loss"}', nonfinite, c.up),
              "A training job reported a NaN or infinite loss.",
              f"{cap(AT_RANK)} reported a NaN or infinite loss in the last {nonfinite}; "
              "training has diverged."),
        Alert("RaypulseTrainingLossSpike", "warning", "training", f"""
            (raypulse_train_loss - avg_over_time(raypulse_train_loss{past}))
              / (stddev_over_time(raypulse_train_loss{past}) > 0)
              > {spike.zscore:g}
            """,
              "A training job's loss jumped far above its recent values.",
              f"The loss of {AT_RANK} is {{{{ $value | printf \"%.1f\" }}}} standard deviations above its mean "
              f"over the {spike.baseline} before the last {spike.skip}."),
        Alert("RaypulseTrainingCheckpointTooOld", "warning", "training", f"""
            time() - max by ({BY_JOB}) (raypulse_train_last_checkpoint_time_seconds)
              > {t("RaypulseTrainingCheckpointTooOld").age.seconds}
            and {RUNNING}
            """,
              "A running training job has not saved a checkpoint for too long.",
              f"{AT_JOB} last reported a saved checkpoint {{{{ $value | humanizeDuration }}}} ago; a failure "
              "now loses all the work since."),
        Alert("RaypulseRunCheckpointsTooRare", "warning", "training", f"""
            raypulse_run_checkpoint_interval_seconds
              > {rare.ratio:g} * raypulse_run_checkpoint_advised_interval_seconds
            """,
              "Checkpoints too rare for this fault rate.",
              "Launcher run {{ $labels.run_id }} saves a checkpoint every {{ $value | humanizeDuration }}, over "
              f"{rare.ratio:g} times the Young-Daly interval for its save cost and fault rate: it loses more to "
              "redone steps than more frequent saves would cost."),
        Record(step_rate, f"deriv(raypulse_train_step[{straggler.window}])"),
        Alert("RaypulseTrainingStragglerRank", "warning", "training", f"""
            {step_rate}
              < {ON_JOB} group_left ()
                {straggler.ratio:g} * quantile by ({BY_JOB}) (0.5, {step_rate})
            and {ON_JOB} count by ({BY_JOB}) ({step_rate}) > 1
            """,
              "A rank of a training job advances much slower than the others.",
              f"{cap(AT_RANK)} advances {{{{ $value | printf \"%.3g\" }}}} steps per second, under "
              f"{straggler.ratio:.0%} of the median rank of its job."),
    ])
