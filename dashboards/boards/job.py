"""Job: one Ray job (or several attempts of a run) from submission to end: state and attempts,
progress and throughput, loss, the GPUs and nodes it runs on, its processes, actors, tasks,
failures by type, and how old its last checkpoint is. A job is chosen by submission id; every
series of it (raypulse_job_*, raypulse_train_*) carries one. Its GPUs as one number per job (count,
utilization, memory, power) come from the recorded pre-aggregations (alerts/rules/scale.yaml), so
a job on thousands of GPUs, or every job at once, costs a series per job; the per-GPU panels below
them read the GPU families."""

from __future__ import annotations

from dashboards.boards.common import (
    JOB_GPUS,
    JOB_MEMORY,
    JOB_POWER,
    JOB_SM,
    JOB_UTILIZATION,
    NOT_IDLE,
    STATES,
    UID_JOB,
    rate,
    recorded,
    recorded_average,
    to_gpu,
    to_node,
    to_training,
)
from dashboards.model import Board, Panel, Row, Target
from dashboards.selectors import Scope
from exporter.contract import node_exporter as ne

S = Scope("cluster", "submission")
C = Scope("cluster")  # node and GPU families: no job label; joined with the job's processes
JOB = "{{submission_id}}"
PER_JOB = "cluster, submission_id"
STATE_COLORS = {"PENDING": "blue", "RUNNING": "green", "SUCCEEDED": "super-light-green", "FAILED": "red",
                "STOPPED": "orange"}


def on_job_nodes(expr: str) -> str:
    """`expr` (one series per exporter) for each node where the job has processes. The job's side
    is the "many" side, so several jobs on one node are fine."""
    return (f"group by (cluster, instance, submission_id) ({S('raypulse_job_processes')} > 0) "
            f"* on (instance) group_left (node) ({expr})")


def on_job_hosts(expr: str) -> str:
    """`expr` (per cluster and node) for each node where the job has processes: node_exporter's
    series (exporter/contract/node_exporter.py) share only those labels with the job's, not `instance`.
    The max keeps one series per node where several exporters carry its name."""
    return (f"group by (cluster, node, submission_id) ({S('raypulse_job_processes')} > 0) "
            f"* on (cluster, node) group_left () max by (cluster, node) ({expr})")


def _either(ours: str, theirs: str) -> str:
    return ne.either(ours, theirs, C("raypulse_exporter_build_info"))


def on_job_gpus(expr: str) -> str:
    """`expr` (one series per GPU) for each GPU the job's processes use."""
    return (f"group by (cluster, instance, node, gpu, uuid, submission_id) ({S('raypulse_job_gpu_processes')}) "
            f"* on (instance, uuid) group_left () ({expr})")


def _state_number() -> str:
    """One series per submission whose value numbers its state (1 PENDING ... 5 STOPPED), so a
    state timeline draws one band per job coloured by the value mappings."""
    states = " or ".join(f"({S('raypulse_job_state', state=state)} == 1) * {i}"
                         for i, state in enumerate(STATE_COLORS, 1))
    return f"max by (cluster, submission_id) ({states})"


STATE = Row("State and attempts", collapsed=False, panels=(
    Panel("State", "none", (Target(_state_number(), JOB),),
          "Each submission's state over time.", kind="statetimeline", width=12, height=6,
          mappings=tuple((str(i), state, color) for i, (state, color) in enumerate(STATE_COLORS.items(), 1))),
    Panel("Attempt", "short", (
        Target(S("raypulse_job_attempt"), JOB + " attempt"),
        Target(S("raypulse_job_max_attempts"), JOB + " of")),
        "Launcher attempt of each submission and how many the run may make.", kind="stat", width=4, height=6),
    Panel("Duration", "s", (
        Target(S("raypulse_job_duration_seconds"), JOB + " running"),
        Target(S("raypulse_job_pending_seconds"), JOB + " pending")),
        "Time since it started (or its total run time once finished) and time it waited to start.",
        kind="stat", width=4, height=6),
    Panel("Driver log silent for", "s", (
        Target(f"time() - {S('raypulse_job_driver_log_last_write_time_seconds')}", JOB),),
        "Time since the driver last wrote to its log: a hung job goes quiet here first.", kind="stat", width=4,
        height=6, thresholds=((None, "green"), (600, "orange"), (1800, "red"))),
    Panel("Job", "short", (
        Target(f"{S('raypulse_job_info')} * on (cluster, job_id, submission_id) group_left (state) "
               f"({S('raypulse_job_state')} == 1)", instant=True),),
        "Name, run, user, workspace and current state of each submission (click: its training view).",
        kind="table", width=12, height=6, links=(to_training(),)),
    Panel("Timeline", "dateTimeAsIso", (
        Target(f"1000 * {S('raypulse_job_submit_time_seconds')}", JOB + " submitted"),
        Target(f"1000 * {S('raypulse_job_start_time_seconds')}", JOB + " started"),
        Target(f"1000 * {S('raypulse_job_end_time_seconds')}", JOB + " ended")),
        "When each submission was submitted, started and ended.", kind="stat", width=12, height=6),
    Panel("Why it ended", "short", (
        Target(S("raypulse_job_error_info"), instant=True),
        Target(S("raypulse_job_driver_exit_code"), instant=True)),
        "Ray's error type of failed submissions and the entrypoint's exit code.", kind="table", width=12),
    Panel("Labels", "short", (Target(S("raypulse_job_label_info"), instant=True),),
          "Labels the job was submitted with (launcher --label).", kind="table", width=12),
))

PROGRESS = Row("Progress", collapsed=False, panels=(
    Panel("Step", "short", (Target(S("raypulse_train_step"), JOB + " rank {{rank}}"),),
          "Last step each rank reported.", min=0, links=(to_training(),)),
    Panel("Throughput", "short", (
        Target(f"sum by (cluster, submission_id) ({rate(S('raypulse_train_samples_total'))})", JOB + " samples/s"),
        Target(f"sum by (cluster, submission_id) ({rate(S('raypulse_train_tokens_total'))})", JOB + " tokens/s")),
        "Samples and tokens per second over all ranks.", min=0),
    Panel("Loss", "short", (Target(S("raypulse_train_loss"), JOB + " rank {{rank}}"),),
          "Last finite loss each rank reported (NaN/Inf are counted on the training view, not drawn here).",
          links=(to_training(),)),
    Panel("Checkpoint age", "s", (
        Target(f"time() - max by (cluster, submission_id) ({S('raypulse_train_last_checkpoint_time_seconds')})",
               JOB),),
        "Time since the job last reported a saved checkpoint: what a crash now would cost.", min=0,
        thresholds=((None, "green"), (3600, "orange"), (7200, "red"))),
))

GPUS = Row("GPUs of the job", collapsed=False, panels=(
    Panel("Whole job: GPUs", "short", (Target(recorded(S, JOB_GPUS, PER_JOB), JOB),),
          "GPUs the job's processes use, over all its nodes (counted where NVML samples each process's SM "
          "time: not on GPUs in MIG mode).", width=6, height=7, min=0),
    Panel("Whole job: GPU utilization", "percentunit", (
        Target(recorded_average(S, JOB_UTILIZATION, JOB_GPUS, PER_JOB), JOB + " GPUs busy"),
        Target(recorded_average(S, JOB_SM, JOB_GPUS, PER_JOB), JOB + " its share of SM time")),
        "Average over the job's GPUs: how busy they are (all processes), and the share of SM time the job's own "
        "processes used.", width=6, height=7, min=0, max=1),
    Panel("Whole job: GPU memory", "bytes", (Target(recorded(S, JOB_MEMORY, PER_JOB), JOB),),
          "GPU memory the job's processes hold, over all its GPUs.", width=6, height=7, min=0),
    Panel("Whole job: GPU power", "watt", (Target(recorded(S, JOB_POWER, PER_JOB), JOB),),
          "Power drawn by the GPUs the job uses (a GPU shared with another job counts for both).", width=6,
          height=7, min=0),
    Panel("GPU utilization", "percentunit", (
        Target(on_job_gpus(C("raypulse_gpu_utilization_ratio")), JOB + " {{node}} GPU {{gpu}}"),),
        "Utilization of the GPUs the job's processes use (click: the GPU).", min=0, max=1, links=(to_gpu(),)),
    Panel("GPU memory", "bytes", (
        Target(S("raypulse_job_gpu_memory_used_bytes"), JOB + " {{node}} GPU {{gpu}} job"),
        Target(on_job_gpus(C("raypulse_gpu_memory_used_bytes")), JOB + " {{node}} GPU {{gpu}} all processes")),
        "GPU memory the job holds, and everything in use on those GPUs.", min=0, links=(to_gpu(),)),
    Panel("GPU power", "watt", (
        Target(on_job_gpus(C("raypulse_gpu_power_usage_watts")), JOB + " {{node}} GPU {{gpu}}"),),
        "Power draw of the job's GPUs.", min=0, links=(to_gpu(),)),
    Panel("Job's share of SM time", "percentunit", (
        Target(S("raypulse_job_gpu_sm_utilization_ratio"), JOB + " {{node}} GPU {{gpu}}"),),
        "SM time the job's own processes used on each GPU.", min=0, max=1, links=(to_gpu(),)),
    Panel("GPU processes", "short", (
        Target(S("raypulse_job_gpu_processes"), JOB + " {{node}} GPU {{gpu}}"),),
        "The job's processes using each GPU.", min=0, links=(to_gpu(),)),
    Panel("GPU temperature", "celsius", (
        Target(on_job_gpus(C("raypulse_gpu_temperature_celsius", sensor="gpu")), JOB + " {{node}} GPU {{gpu}}"),),
        "Core temperature of the job's GPUs.", links=(to_gpu(),)),
))

PROCESSES = Row("Processes and nodes", collapsed=False, panels=(
    Panel("Processes by node", "short", (
        Target(f"sum by (cluster, submission_id, node, process_role) ({S('raypulse_job_processes')})",
               JOB + " {{node}} {{process_role}}"),),
        "The job's Ray processes on each node by role (click: the node).", min=0, links=(to_node(),)),
    Panel("CPU", "suffix: cores", (
        Target(f"sum by (cluster, submission_id, node, process_role, actor_class) "
               f"({rate(S('raypulse_job_process_cpu_seconds_total'))})",
               JOB + " {{node}} {{process_role}} {{actor_class}}"),),
        "CPUs used by the job's processes.", min=0, links=(to_node(),)),
    Panel("Memory", "bytes", (
        Target(f"sum by (cluster, submission_id, node, process_role) "
               f"({S('raypulse_job_process_resident_memory_bytes')})", JOB + " {{node}} {{process_role}} resident"),
        Target(f"sum by (cluster, submission_id, node, process_role) "
               f"({S('raypulse_job_process_shared_memory_bytes')})", JOB + " {{node}} {{process_role}} shared")),
        "Resident and shared memory of the job's processes.", min=0, links=(to_node(),)),
    Panel("Its nodes: CPU busy", "percentunit", (
        Target(on_job_hosts(_either(
            f"sum by (cluster, node) ({rate(C('raypulse_node_cpu_seconds_total', NOT_IDLE))}) "
            f"/ sum by (cluster, node) ({C('raypulse_node_cpus')})",
            f"sum by (cluster, node) ({rate(C('node_cpu_seconds_total', NOT_IDLE))}) "
            f"/ count by (cluster, node) ({C('node_cpu_seconds_total', mode='idle')})")),
            JOB + " {{node}}"),),
        "Whole-node CPU of every node the job runs on (other work included).", min=0, max=1, links=(to_node(),)),
    Panel("Its nodes: memory available", "bytes", (
        Target(on_job_hosts(_either(C("raypulse_node_memory_available_bytes"), C("node_memory_MemAvailable_bytes"))),
               JOB + " {{node}}"),),
        "Memory still available on the job's nodes.", min=0, links=(to_node(),)),
    Panel("Its nodes: pod memory", "bytes", (
        Target(on_job_nodes(C("raypulse_pod_memory_working_set_bytes")), JOB + " {{node}} working set"),),
        "Working set of the pods (containers) the job's nodes run in.", min=0, links=(to_node(),)),
))

WORKLOAD = Row("Actors, tasks and failures", collapsed=False, panels=(
    Panel("Actors by state", "short", (
        Target(f"sum by (cluster, submission_id, state) ({S('raypulse_job_actors')})", JOB + " {{state}}"),),
        "The job's actors by state.", min=0, stack=True),
    Panel("Actor restarts", "short", (Target(S("raypulse_job_actor_restarts"), JOB),),
          "Restarts of the job's actors so far; a storm means a crash loop.", min=0),
    Panel("Actor deaths by reason", "short", (
        Target(S("raypulse_job_actor_deaths"), JOB + " {{reason}}"),),
        "Dead actors by cause (worker died, node died, out of memory, ...).", min=0),
    Panel("Tasks by state", "short", (
        Target(f"sum by (cluster, submission_id, state) ({S('raypulse_job_tasks')})", JOB + " {{state}}"),),
        "The job's tasks by state.", min=0, stack=True),
    Panel("Task failures by type", "short", (
        Target(S("raypulse_job_task_failures"), JOB + " {{error_type}}"),),
        "Failed tasks by error type: application errors against system failures (worker or node died, OOM).",
        min=0),
    Panel("Placement groups", "short", (
        Target(S("raypulse_job_placement_groups"), JOB + " {{state}}"),),
        "The job's placement groups by state; a group PENDING for long waits for resources.", min=0),
))

BOARD = Board(
    uid=UID_JOB, title="raypulse / Job",
    description="One Ray job: state and attempts, progress and throughput, loss, its GPUs, processes and "
                "nodes, actors, tasks, failures by type, checkpoint age.",
    variables=("cluster", "submission"), tags=("job",), rows=(STATE, PROGRESS, GPUS, PROCESSES, WORKLOAD),
)

assert set(STATE_COLORS) == set(STATES)
