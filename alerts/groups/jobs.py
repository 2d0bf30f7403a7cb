"""Ray jobs, as the head exporter sees them through the Jobs and State APIs: failed, restarted,
stuck pending, actors restarting, a silent driver log, idle GPUs.

These alerts carry only the job's labels (cluster, namespace, job_id, submission_id), not the head's
scrape target: they are about the job, so a node that goes down does not inhibit them. `namespace`
(the job's pods', where prometheus-operator adds it) is what kube-prometheus-stack groups and inhibits by.

A job is `submission_id` (stable from submission on) plus `job_id` (set once the driver
connects); both are on every raypulse_job_* and raypulse_train_* series, so joins use both.
"""

from __future__ import annotations

from alerts.config import Config
from alerts.model import AT_JOB, BY_JOB, NAMESPACE, RAY_JOB, Alert, Group

ON_JOB = f"on ({RAY_JOB})"
RUNNING_SERIES = 'raypulse_job_state{state="RUNNING"}'
RUNNING = f"{ON_JOB} {RUNNING_SERIES} == 1"


def group(c: Config) -> Group:
    t = c.tune
    return Group("jobs", "Ray jobs (state, attempts, actors, driver log, GPU use)", [
        Alert("RaypulseJobFailed", "critical", "job", f"""
            max by ({BY_JOB}) (raypulse_job_state{{state="FAILED"}}) == 1
            and {ON_JOB} (time() - raypulse_job_end_time_seconds < {t("RaypulseJobFailed").recent.seconds})
            unless {ON_JOB} (raypulse_job_attempt < raypulse_job_max_attempts)
            """,
              "A Ray job failed with no retry left.",
              f"{AT_JOB} failed (its last allowed attempt, or a job submitted without retries)."),
        Alert("RaypulseJobRestarted", "warning", "job", f"""
            max by ({BY_JOB}) (raypulse_job_attempt) > 1
            and {ON_JOB} (time() - raypulse_job_submit_time_seconds < {t("RaypulseJobRestarted").recent.seconds})
            """,
              "A Ray job was restarted after a failed attempt.",
              f"{AT_JOB} is attempt {{{{ $value }}}} of its run: an earlier attempt failed."),
        Alert("RaypulseJobPendingTooLong", "warning", "job", f"""
            max by ({BY_JOB}) (raypulse_job_pending_seconds) > {t("RaypulseJobPendingTooLong").age.seconds}
            and {ON_JOB} raypulse_job_state{{state="PENDING"}} == 1
            """,
              "A Ray job has been pending too long.",
              f"{AT_JOB} has been pending for {{{{ $value | humanizeDuration }}}} (runtime environment setup, "
              "or resources for its entrypoint)."),
        Alert("RaypulseJobActorRestartStorm", "warning", "job", f"""
            max by ({BY_JOB}) (delta(raypulse_job_actor_restarts[{t("RaypulseJobActorRestartStorm").window}]))
              > {t("RaypulseJobActorRestartStorm").restarts:g}
            """,
              "A Ray job's actors keep restarting.",
              f"The actors of {AT_JOB} restarted {{{{ $value | printf \"%.0f\" }}}} times in the last "
              f"{t('RaypulseJobActorRestartStorm').window}."),
        Alert("RaypulseJobDriverLogSilent", "warning", "job", f"""
            time() - max by ({BY_JOB}) (raypulse_job_driver_log_last_write_time_seconds)
              > {t("RaypulseJobDriverLogSilent").age.seconds}
            and {RUNNING}
            """,
              "A running Ray job's driver has written nothing to its log for a long time.",
              f"{AT_JOB} is running but its driver log has been silent for {{{{ $value | humanizeDuration }}}}; "
              "the driver may be hung."),
        # The job's GPU series may come from node exporters in another namespace (a DaemonSet's): the
        # alert takes the namespace of the job's own series, and matches them on the job alone.
        Alert("RaypulseJobGpuUtilizationCollapsed", "warning", "job", f"""
            (
              avg by ({RAY_JOB}) (raypulse_job_gpu_sm_utilization_ratio)
                < {t("RaypulseJobGpuUtilizationCollapsed").ratio:g}
            )
            * {ON_JOB} group_left ({NAMESPACE}) max by ({BY_JOB}) ({RUNNING_SERIES} == 1)
            """,
              "A running Ray job barely uses its GPUs.",
              f"{AT_JOB} is running but its processes use {{{{ $value | humanizePercentage }}}} of the SM time "
              "of the GPUs they hold."),
    ])
