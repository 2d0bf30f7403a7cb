"""RL post-training, from what an RL loop reports through `progress.phase` and
`progress.report_iteration` (raypulse_rl_*): reward collapse against the run's own baseline, KL
blowing up, responses pinned at the length limit, a phase that never ends (an RL hang: generation
that never returns, a weight sync stuck in a collective) and slow weight syncs.

A job that reports no RL iterations has no raypulse_rl_* series and none of these can fire for it.
"""

from __future__ import annotations

from alerts.config import Config
from alerts.model import AT_RANK, RAY_JOB, Alert, Group, cap

RUNNING = f'on ({RAY_JOB}) raypulse_job_state{{state="RUNNING"}} == 1'


def group(c: Config) -> Group:
    t = c.tune
    collapse, stall = t("RaypulseRLRewardCollapsed"), t("RaypulseRLPhaseStalled")
    past = f"[{collapse.baseline}] offset {collapse.skip}"
    running_for = "time() - raypulse_rl_phase_start_time_seconds"
    reward, recent = "raypulse_rl_reward_mean", f"[{collapse.window}]"
    drop = (f"(avg_over_time({reward}{past}) - avg_over_time({reward}{recent}))"
            f" / (stddev_over_time({reward}{past}) > 0)")
    return Group("rl", "RL post-training (reward collapse, KL, truncated responses, stalled phases, weight sync)", [
        # A drop of `zscore` standard deviations of the baseline; or, for a reward as noisy as a small
        # environment's episode return, a whole window below the lowest reward of the baseline.
        Alert("RaypulseRLRewardCollapsed", "warning", "training", f"""
            ({drop} > {collapse.zscore:g})
            or
            ({drop} > 0 and max_over_time({reward}{recent}) < min_over_time({reward}{past}))
            """,
              "An RL run's reward collapsed below its own recent level.",
              f"The mean reward of {AT_RANK} over the last {collapse.window} is {{{{ $value | printf \"%.1f\" }}}} "
              f"standard deviations below its mean over the {collapse.baseline} before the last {collapse.skip}, "
              "or lower than any reward then: the policy may have collapsed or be hacking one reward at the "
              "others' cost."),
        Alert("RaypulseRLKLHigh", "warning", "training", f"""
            raypulse_rl_kl > {t("RaypulseRLKLHigh").kl:g}
            """,
              "An RL policy's KL divergence from its reference is too high.",
              f"The KL divergence of {AT_RANK} from its reference policy is {{{{ $value | printf \"%.3g\" }}}}, "
              f"over {t('RaypulseRLKLHigh').kl:g}: the policy is drifting away fast (too high a learning rate or too "
              "small a KL penalty)."),
        Alert("RaypulseRLResponsesTruncated", "warning", "training", f"""
            raypulse_rl_truncated_ratio > {t("RaypulseRLResponsesTruncated").ratio:g}
            """,
              "An RL run's responses are pinned at the length limit.",
              f"{{{{ $value | humanizePercentage }}}} of the responses of {AT_RANK} are cut off at the length "
              "limit: responses grow until they hit it, and truncated ones get little or wrong reward."),
        Alert("RaypulseRLPhaseStalled", "critical", "training", f"""
            {running_for}
              > (
                  (raypulse_rl_phase_iteration_seconds * {stall.factor:g} > {stall.age.seconds})
                  or
                  (raypulse_rl_phase_start_time_seconds * 0 + {stall.age.seconds})
                )
            and {RUNNING}
            """,
              "A phase of an RL iteration has been running far too long.",
              f"Phase {{{{ $labels.phase }}}} of {AT_RANK} has been running for {{{{ $value | humanizeDuration }}}}, "
              f"over {stall.factor:g} times its time in the last iteration and over {stall.age}: it is hung "
              "(generation that never returns, a weight sync stuck in a collective, a dead actor)."),
        Alert("RaypulseRLWeightSyncSlow", "warning", "training", f"""
            raypulse_rl_weight_sync_seconds > {t("RaypulseRLWeightSyncSlow").duration.seconds}
            """,
              "An RL run's weight sync to its generators is slow.",
              f"{cap(AT_RANK)} took {{{{ $value | humanizeDuration }}}} for its last weight sync to the "
              f"generators, over {t('RaypulseRLWeightSyncSlow').duration}: the generators wait for it."),
    ])
