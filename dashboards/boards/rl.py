"""RL post-training: an iteration of phases (generate, reward, train, weight sync...), seen as RL.
Which phase eats the iteration, whether the reward climbs or collapses, KL and entropy, responses
growing into the length limit, weight-sync time; from what the loop reports through
`progress.phase` and `progress.report_iteration` (raypulse_rl_*). The `rl` alerts have scope
training: the training board's alert timeline shows them."""

from __future__ import annotations

from collections.abc import Callable

from dashboards.boards.common import RATE, UID_RL, rate, to_training
from dashboards.model import Board, Panel, Row, Target
from dashboards.selectors import Scope
from exporter.contract import vllm

S = Scope("cluster", "submission")
JOB = "{{submission_id}}"
RANK = JOB + " rank {{rank}}"
PER_JOB = "cluster, submission_id"
PER_PHASE = "cluster, submission_id, phase"


def _per_iteration(family: str) -> str:
    """Seconds of `family` per RL iteration over the rate interval, by phase."""
    return (f"sum by ({PER_PHASE}) (increase({S(family)}[{RATE}])) / on ({PER_JOB}) group_left () "
            f"sum by ({PER_JOB}) (increase({S('raypulse_rl_iterations_total')}[{RATE}]))")


ITERATIONS = Row("Iterations", collapsed=False, panels=(
    Panel("Iterations per minute", "suffix: /min", (
        Target(f"60 * sum by ({PER_JOB}) ({rate(S('raypulse_rl_iterations_total'))})", JOB),),
        "RL iterations finished per minute (progress.report_iteration calls).", width=6, min=0,
        links=(to_training(),)),
    Panel("Time since the last iteration", "s", (
        Target(f"time() - {S('raypulse_rl_last_iteration_time_seconds')}", RANK),
        Target(S("raypulse_rl_iteration"), RANK + " iteration")),
        "How long ago each reporting rank finished its last iteration, and which iteration that was.",
        width=6, min=0),
    Panel("Rollouts per second", "short", (
        Target(f"sum by ({PER_JOB}) ({rate(S('raypulse_rl_rollouts_total'))})", JOB),),
        "Rollouts (generated responses) per second.", width=6, min=0),
    Panel("Generated tokens per second", "short", (
        Target(f"sum by ({PER_JOB}) ({rate(S('raypulse_rl_generated_tokens_total'))})", JOB),),
        "Tokens the generators produce per second: their throughput.", width=6, min=0),
))

PHASES = Row("Phases", collapsed=False, panels=(
    Panel("Seconds per iteration by phase", "s", (
        Target(_per_iteration("raypulse_rl_phase_seconds_total"), JOB + " {{phase}}"),),
        "Wall seconds each phase takes per iteration, stacked: the iteration's time and which phase eats it. "
        "Phases that overlap (asynchronous generation) add up to more than the iteration.", width=12,
        min=0, stack=True),
    Panel("Last iteration by phase", "s", (
        Target(S("raypulse_rl_phase_iteration_seconds"), RANK + " {{phase}}"),),
        "Seconds each phase took in the last completed iteration of each rank, stacked.", width=12, min=0,
        stack=True),
    Panel("Share of time by phase", "percentunit", (
        Target(f"sum by ({PER_PHASE}) ({rate(S('raypulse_rl_phase_seconds_total'))}) / on ({PER_JOB}) "
               f"group_left () sum by ({PER_JOB}) ({rate(S('raypulse_rl_phase_seconds_total'))})",
               JOB + " {{phase}}"),),
        "Each phase's share of the time spent in phases: generation near 100% means the trainer waits, "
        "training near 100% means the generators wait.", width=12, min=0, max=1, stack=True),
    Panel("Running phases", "s", (
        Target(f"time() - {S('raypulse_rl_phase_start_time_seconds')}", RANK + " {{phase}}"),),
        "How long each phase now running has been running; one that keeps growing is an RL hang "
        "(RaypulseRLPhaseStalled).", width=12, min=0, thresholds=((None, "green"), (900, "orange"),
                                                                  (1800, "red"))),
))

POLICY = Row("Reward and policy", collapsed=False, panels=(
    Panel("Reward", "short", (
        Target(S("raypulse_rl_reward_mean"), RANK + " mean"),
        Target(S("raypulse_rl_reward_std"), RANK + " std")),
        "Mean reward of each iteration's batch and its standard deviation: climbing is learning, a sudden fall "
        "is a collapse or a broken reward source.", width=6),
    Panel("Reward by source", "short", (
        Target(S("raypulse_rl_source_reward_mean"), RANK + " {{source}}"),),
        "Mean reward by reward source (reward models, rules, verifiers): one source rising while the others "
        "fall is reward hacking.", width=6),
    Panel("KL divergence", "short", (
        Target(S("raypulse_rl_kl"), RANK),),
        "KL divergence of the policy from its reference; a steady climb or a jump comes before a collapse.",
        width=6, min=0, thresholds=((None, "green"), (0.5, "red"))),
    Panel("Entropy", "short", (
        Target(S("raypulse_rl_entropy"), RANK),),
        "Policy entropy; a collapse toward 0 is the policy settling on a few answers.", width=6, min=0),
))

RESPONSES = Row("Responses", collapsed=False, panels=(
    Panel("Response length", "suffix: tokens", (
        Target(S("raypulse_rl_response_tokens_mean"), RANK + " mean"),
        Target(S("raypulse_rl_response_tokens_max"), RANK + " longest"),
        Target(S("raypulse_rl_response_tokens_limit"), RANK + " limit")),
        "Mean and longest response of each iteration, against the generation limit; lengths that keep "
        "growing end at the limit.", width=12, min=0),
    Panel("Truncated at the limit", "percentunit", (
        Target(S("raypulse_rl_truncated_ratio"), RANK),),
        "Share of each iteration's responses cut off at the length limit (RaypulseRLResponsesTruncated over "
        "20%).", width=12, min=0, max=1, thresholds=((None, "green"), (0.1, "orange"), (0.2, "red"))),
))

PER_ROLE = "cluster, submission_id, actor_role"
NODE_ROLE = "cluster, node, job_id, submission_id, actor_role"  # one series of each family per node and role
HAS_ROLE = 'actor_role!=""'

ROLES = Row("Generators and trainers", collapsed=False, panels=(
    Panel("Actors by role", "short", (
        Target(f"sum by ({PER_ROLE}) ({S('raypulse_job_processes', HAS_ROLE)})", JOB + " {{actor_role}}"),),
        "The job's actor processes by role, from their class names (the exporter's ray.actor_roles: "
        "rollout and inference engines, RLlib's EnvRunners generate; learners and Ray Train workers train; "
        "verl's and OpenRLHF's reference, reward and critic models have roles of their own).",
        width=8, min=0),
    Panel("CPU by role", "short", (
        Target(f"sum by ({PER_ROLE}) ({rate(S('raypulse_job_process_cpu_seconds_total', HAS_ROLE))})",
               JOB + " {{actor_role}}"),),
        "Cores the generators and the trainers keep busy: one role busy while the other idles is the "
        "synchronous RL loop waiting on its slowest phase.", width=8, min=0),
    Panel("GPU utilization by role", "percentunit", (
        Target(f"sum by ({PER_ROLE}) ({S('raypulse_job_role_gpu_sm_utilization_ratio')} * on ({NODE_ROLE}) "
               f"{S('raypulse_job_role_gpus')}) / sum by ({PER_ROLE}) ({S('raypulse_job_role_gpus')})",
               JOB + " {{actor_role}}"),),
        "SM utilization of the GPUs each role's actors use, averaged over them (over every node, weighted by "
        "its GPUs): generators idle while the "
        "trainer trains (or the reverse) is GPU time an asynchronous or colocated layout would win back.",
        width=8, min=0, max=1),
))

WEIGHT_SYNC = Row("Weight sync", collapsed=False, panels=(
    Panel("Weight sync time", "s", (
        Target(S("raypulse_rl_weight_sync_seconds"), RANK),),
        "How long the last weight sync from the trainer to the generators took; the generators wait for it.",
        width=8, min=0, thresholds=((None, "green"), (120, "red"))),
    Panel("Weight sync size", "bytes", (
        Target(S("raypulse_rl_weight_sync_bytes"), RANK),),
        "Bytes the last weight sync moved.", width=8, min=0),
    Panel("Weight sync bandwidth", "Bps", (
        Target(f"{S('raypulse_rl_weight_sync_bytes')} / ({S('raypulse_rl_weight_sync_seconds')} > 0)", RANK),),
        "Bytes per second of the last weight sync: far under the network's bandwidth is a slow path (the "
        "object store, a file system) rather than a big model.", width=8, min=0),
))

# vLLM's engines, per model, in both forms they reach Prometheus (exporter/contract/vllm.py): their own /metrics
# (verl's rollout servers, at /sd/rollout: the run's labels) or through Ray's metrics agents (/sd/ray: no run
# label). One query per panel: each form summed by the labels both have, joined with `or`.
ENGINE = "{{model_name}}"
PER_MODEL = "cluster, model_name"


def _either(name: str, suffix: str, aggregate: Callable[[str], str]) -> str:
    """`aggregate` of Ray's form `or` of vLLM's own; its own is narrowed to the run ($submission)."""
    return f"{aggregate(S(vllm.through_ray(name, suffix)))} or {aggregate(S(vllm.native(name, suffix)))}"


def _summed(name: str, suffix: str = "", how: str = "sum") -> str:
    return _either(name, suffix, lambda series: f"{how} by ({PER_MODEL}) ({series})")


def _rate(name: str) -> str:
    return _either(name, "_total", lambda series: f"sum by ({PER_MODEL}) ({rate(series)})")


def _quantile(q: float, name: str) -> str:
    return (f"histogram_quantile({q}, "
            f"{_either(name, '_bucket', lambda series: f'sum by ({PER_MODEL}, le) ({rate(series)})')})")


ENGINES = Row("Rollout engines (vLLM)", collapsed=False, panels=(
    Panel("Requests running and waiting", "short", (
        Target(_summed(vllm.REQUESTS_RUNNING), ENGINE + " running"),
        Target(_summed(vllm.REQUESTS_WAITING), ENGINE + " waiting")),
        "Requests in the vLLM engines' running batches and waiting for one, summed over the engines of each "
        "model: waiting requests with the batch full are generation short of engines or KV cache. Read from the "
        "rollout servers' own /metrics (verl's, which the head exporter lists at /sd/rollout with the run's "
        "labels under --framework-metrics), or from vLLM inside Ray through Ray's metrics agents (/sd/ray).",
        width=8, min=0),
    Panel("KV-cache usage", "percentunit", (
        Target(_summed(vllm.KV_CACHE_USAGE, how="max"), ENGINE + " fullest engine"),
        Target(_summed(vllm.KV_CACHE_USAGE, how="avg"), ENGINE + " mean")),
        "Share of the KV cache in use, the fullest engine and the mean: near 100% the engines preempt requests "
        "and recompute them.", width=8, min=0, max=1, thresholds=((None, "green"), (0.9, "orange"))),
    Panel("Preemptions per second", "short", (
        Target(_rate(vllm.PREEMPTIONS), ENGINE),),
        "Requests the engines preempted for KV-cache room: their work is redone, the rollouts slow down.",
        width=8, min=0),
    Panel("Engine generation tokens per second", "short", (
        Target(_rate(vllm.GENERATION_TOKENS), ENGINE),),
        "Tokens the vLLM engines generate per second, as they count them (the loop's own count is "
        "\"Generated tokens per second\" above).", width=12, min=0),
    Panel("Time to first token", "s", (
        Target(_quantile(0.9, vllm.TIME_TO_FIRST_TOKEN), ENGINE + " p90"),
        Target(_quantile(0.5, vllm.TIME_TO_FIRST_TOKEN), ENGINE + " p50")),
        "Seconds from a request's arrival to its first generated token: queueing and prefill.",
        width=12, min=0),
))

BOARD = Board(
    uid=UID_RL, title="raypulse / RL post-training",
    description="RL iterations as phases (generate, reward, train, weight sync), generators vs trainers, the "
                "vLLM rollout engines, rewards, KL, entropy, response lengths and truncation and weight-sync time, "
                "from what the loop reports through progress.phase and progress.report_iteration and what vLLM "
                "serves (its rollout servers' own /metrics, or through Ray).",
    variables=("cluster", "submission"), tags=("training", "rl"),
    rows=(ITERATIONS, PHASES, ROLES, ENGINES, POLICY, RESPONSES, WEIGHT_SYNC),
)
