"""A fake Ray dashboard for a cluster of any size: the State API, the Jobs API, the autoscaler's
load report and the head node's metrics agent, answering with Ray 2.60's shapes, limits and filter
semantics, for a generated cluster whose true counts the harness knows. No Ray runs.

    python -m bench.fakeray --nodes 2000 --actors 100000 --tasks 1000000 --jobs 1000 --port 8265 \
        [--metrics-port 8080] [--seed 0]

or in-process: `cluster = FakeCluster(Spec(...))`, `runner = await serve(cluster, port=0)`.

What is Ray's here (read from the installed ray: dashboard/state_aggregator.py, state_api_utils.py,
modules/state/state_head.py, util/state/common.py and state_manager.py, and the GCS handlers
gcs_actor_manager.cc HandleGetAllActorInfo and gcs_task_manager.cc HandleGetTaskEvents):

- the envelope `{"result": bool, "msg": str, "data": {"result": {total, num_after_truncation,
  num_filtered, result: [...], partial_failure_warning, warnings}}}`; a bad request (limit over
  RAY_MAX_LIMIT_FROM_API_SERVER, a predicate other than = and !=, a column that cannot be filtered,
  an invalid actor state) is HTTP 400 with `result: false`; more than 100 requests in flight is 429;
- `limit` defaults to 100 and may be at most 10,000; `detail` picks the columns
  (`list_columns(detail)`, a missing one is null); `exclude_driver` (tasks) defaults to true;
- two stages of filtering, as Ray does them. The data source (the GCS) filters on a few keys and
  returns at most RAY_MAX_LIMIT_FROM_DATA_SOURCE (10,000) rows: actors on actor_id, job_id and state
  (`=` only), iterating the registered actors, then the dead ones, and stopping at the limit;
  tasks on job_id, task_id, actor_id, name and state (`=` and `!=`), newest first, counting the
  matches past the limit as dropped events; nodes on node_id, state, node_name; placement groups on
  nothing. Then the dashboard applies every filter again (strings compared case-insensitively),
  sorts by id and cuts at `limit`;
- how truncation shows: actors `total` = every actor the GCS holds and `num_after_truncation` = the
  rows it returned plus those it filtered out (less than `total` when it stopped at its limit); tasks
  `total` = rows returned + dropped events (a job's lost attempts plus the matches past the limit),
  `num_after_truncation` = rows returned; `num_filtered` = rows after the dashboard's filters;
- the summaries (`/api/v0/{actors,tasks}/summarize`) summarise one list of at most 10,000 rows;
- `ray_actors{Source="gcs"}` on the metrics agent: every actor by State and class Name (DEAD is every
  actor that died: the GCS never decrements it).

The cluster is made once from a seed, in numpy arrays (2,000 nodes, 100,000 actors and 1,000,000
tasks take ~20 MB); rows are built only for what a request returns. Its "truth" methods give the
counts a correct client must arrive at.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

from exporter.contract import wire

# -- Ray's constants and schemas (ray 2.60: util/state/common.py, the protobuf enums) --------------
DEFAULT_LIMIT = 100
MAX_LIMIT_FROM_API_SERVER = 10_000  # RAY_MAX_LIMIT_FROM_API_SERVER
MAX_LIMIT_FROM_DATA_SOURCE = 10_000  # RAY_MAX_LIMIT_FROM_DATA_SOURCE: what the GCS returns at most
MAX_HTTP_REQUESTS = 100  # RAY_STATE_SERVER_MAX_HTTP_REQUEST
RAY_VERSION = "2.60.0"

ACTOR_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD")
# TaskStatus values the State API shows (the others are "metrics only", never in task events).
TASK_STATES = ("NIL", "PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "SUBMITTED_TO_WORKER",
               "PENDING_ACTOR_TASK_ARGS_FETCH", "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY", "RUNNING",
               "FINISHED", "FAILED")
TASK_TYPES = ("NORMAL_TASK", "ACTOR_CREATION_TASK", "ACTOR_TASK", "DRIVER_TASK")
PG_STATES = ("PENDING", "PREPARED", "CREATED", "REMOVED", "RESCHEDULING")

ACTOR_COLUMNS = ("actor_id", "class_name", "state", "job_id", "name", "node_id", "pid", "ray_namespace")
ACTOR_DETAIL_COLUMNS = (*ACTOR_COLUMNS, "serialized_runtime_env", "required_resources", "death_cause",
                        "is_detached", "placement_group_id", "repr_name", "num_restarts",
                        "num_restarts_due_to_lineage_reconstruction", "num_restarts_due_to_node_preemption",
                        "call_site", "label_selector", "fallback_strategy")
ACTOR_FILTERABLE = frozenset({"actor_id", "class_name", "job_id", "name", "node_id", "pid", "placement_group_id",
                              "ray_namespace", "repr_name", "state"})
TASK_COLUMNS = ("task_id", "attempt_number", "name", "state", "job_id", "actor_id", "type", "func_or_class_name",
                "parent_task_id", "node_id", "worker_id", "worker_pid", "error_type")
TASK_DETAIL_COLUMNS = (*TASK_COLUMNS, "language", "required_resources", "runtime_env_info", "placement_group_id",
                       "events", "profiling_data", "creation_time_ms", "start_time_ms", "end_time_ms",
                       "task_log_info", "error_message", "is_debugger_paused", "call_site", "label_selector",
                       "fallback_strategy")
TASK_FILTERABLE = frozenset({"actor_id", "attempt_number", "error_type", "func_or_class_name", "is_debugger_paused",
                             "job_id", "language", "name", "node_id", "parent_task_id", "placement_group_id",
                             "state", "task_id", "type", "worker_id", "worker_pid"})
NODE_COLUMNS = ("node_id", "node_ip", "is_head_node", "state", "state_message", "node_name", "resources_total",
                "labels")
NODE_DETAIL_COLUMNS = (*NODE_COLUMNS, "start_time_ms", "end_time_ms")
NODE_FILTERABLE = frozenset({"is_head_node", "node_id", "node_ip", "node_name", "state"})
PG_COLUMNS = ("placement_group_id", "name", "creator_job_id", "state")
PG_DETAIL_COLUMNS = (*PG_COLUMNS, "bundles", "is_detached", "stats", "topology_strategy", "topology_assignments")
PG_FILTERABLE = frozenset({"creator_job_id", "is_detached", "name", "placement_group_id", "state"})
INT_COLUMNS = frozenset({"pid", "attempt_number", "worker_pid"})
BOOL_COLUMNS = frozenset({"is_head_node", "is_detached", "is_debugger_paused"})

# -- what the generated cluster looks like ----------------------------------------------------------
CLASSES = ("RolloutWorker", "Learner", "EnvRunner", "ReplayBuffer", "Evaluator", "RewardModel", "Generator",
           "Trainer", "DataWorker", "ParameterServer", "Coordinator", "Inference")
FUNCTIONS = ("rollout", "compute_advantages", "train_step", "load_batch", "preprocess", "evaluate", "score",
             "sample", "save_checkpoint", "reduce", "tokenize", "generate")
DEATH_REASONS = ("WORKER_DIED", "OUT_OF_SCOPE", "NODE_DIED", "RAY_KILL", "OWNER_DIED", "OUT_OF_MEMORY")
ERROR_TYPES = ("TASK_EXECUTION_EXCEPTION", "WORKER_DIED", "OUT_OF_MEMORY", "NODE_DIED", "ACTOR_DIED")
RUNNING_ACTOR_STATES = (0.01, 0.02, 0.74, 0.01, 0.22)  # by ACTOR_STATES
RUNNING_TASK_STATES = {"PENDING_ARGS_AVAIL": 0.02, "PENDING_NODE_ASSIGNMENT": 0.03, "SUBMITTED_TO_WORKER": 0.01,
                       "RUNNING": 0.05, "FINISHED": 0.84, "FAILED": 0.05}
ENDED_TASK_STATES = {"FINISHED": 0.95, "FAILED": 0.05}
NIL_JOB = -1
SUPERVISOR_CLASS, NODE_ACTOR_CLASS = "Supervisor", "NodeExporter"


@dataclass(frozen=True)
class Spec:
    nodes: int = 10
    actors: int = 1_000
    tasks: int = 10_000
    jobs: int = 100
    seed: int = 0
    running_jobs: int | None = None  # default: a twentieth of the jobs, at least one
    big_job_share: float = 0.125  # of the actors and tasks, in the first running job (an RL job's fleet)
    dead_node_ratio: float = 0.02
    raylets_per_host: int = 1  # > 1: nodes share an address and the deploy agent gives them port + 2k
    deploy: bool = True  # `launcher exporters deploy` ran: a supervisor and one actor per alive node
    deploy_port: int = 9500
    label_ports: bool = False  # the nodes carry wire.NODE_LABEL_EXPORTER_PORT (a launcher-started cluster)
    lost_task_attempts: int = 0  # per running job: task attempts Ray lost (reported as dropped)
    failed_job_log_bytes: int = 4_000  # the log tail a FAILED submission's message carries


def _hex(seed: int, kind: str, index: int, nbytes: int) -> str:
    return hashlib.blake2b(f"{seed}:{kind}:{index}".encode(), digest_size=nbytes).hexdigest()


def job_hex(number: int) -> str:
    """A Ray JobID: 4 bytes, little endian (JobID.from_int(1).hex() == "01000000")."""
    return number.to_bytes(4, "little").hex()


def _pick(rng: np.random.Generator, weights: Mapping[str, float], names: Sequence[str], size: int) -> np.ndarray:
    probabilities = np.array([weights.get(name, 0.0) for name in names])
    return rng.choice(len(names), size=size, p=probabilities / probabilities.sum()).astype(np.uint8)


class FakeCluster:
    """A generated Ray cluster in arrays, and the State/Jobs API answers Ray would give about it."""

    def __init__(self, spec: Spec, now: float | None = None) -> None:
        self.spec = spec
        self.now = time.time() if now is None else now
        self.session_name = f"session_fake_{spec.seed}"
        rng = np.random.default_rng(spec.seed)
        self._make_nodes(rng)
        self._make_jobs(rng)
        self._make_actors(rng)
        self._make_tasks(rng)
        self._make_placement_groups(rng)
        self._jobs_body = json.dumps(self._job_rows()).encode()
        self._status_body = json.dumps(self._cluster_status()).encode()
        self._metrics_body = self._metrics_text().encode()

    # -- generation ------------------------------------------------------------------------------
    def _make_nodes(self, rng: np.random.Generator) -> None:
        spec = self.spec
        n = spec.nodes
        self.node_ids = [_hex(spec.seed, "node", i, 28) for i in range(n)]
        hosts = [i // spec.raylets_per_host for i in range(n)]
        self.node_ips = [f"10.{(h >> 16) & 255}.{(h >> 8) & 255}.{(h & 255) + 1}" if h else "10.0.0.250"
                         for h in hosts]
        self.node_ports = [spec.deploy_port + 2 * (i % spec.raylets_per_host) for i in range(n)]
        dead = rng.choice(np.arange(1, n), size=min(n - 1, round((n - 1) * spec.dead_node_ratio)),
                          replace=False) if n > 1 else np.array([], dtype=int)
        self.node_alive = np.ones(n, dtype=bool)
        self.node_alive[dead] = False
        self.node_start_ms = [int((self.now - 86_400 + i) * 1000) for i in range(n)]
        self.node_end_ms = [0 if self.node_alive[i] else int((self.now - 600 + i % 300) * 1000) for i in range(n)]

    def _make_jobs(self, rng: np.random.Generator) -> None:
        spec = self.spec
        count = max(2, spec.jobs)
        running = spec.running_jobs if spec.running_jobs is not None else max(1, count // 20)
        self.job_hexes = [job_hex(k + 1) for k in range(count)]
        status = ["SUCCEEDED"] * count
        status[0] = "SUCCEEDED"  # job 1 is the deploy agent's run (when spec.deploy)
        first_running = count - running
        for k in range(1, count):
            if k >= first_running:
                status[k] = "RUNNING"
            else:
                status[k] = ("SUCCEEDED", "FAILED", "STOPPED")[int(rng.choice(3, p=(0.8, 0.15, 0.05)))]
        self.job_status = status
        self.job_running = np.array([s == "RUNNING" for s in status], dtype=bool)
        self.big_job = first_running if first_running < count else count - 1
        self.job_type = ["SUBMISSION" if k == 0 or rng.random() < 0.8 else "DRIVER" for k in range(count)]
        self.job_end_ms = [None if status[k] == "RUNNING" else int((self.now - 60 * (count - k)) * 1000)
                           for k in range(count)]
        self.job_start_ms = [int((self.now - 60 * (count - k) - 300) * 1000) for k in range(count)]

    def _make_actors(self, rng: np.random.Generator) -> None:
        spec = self.spec
        alive_nodes = np.flatnonzero(self.node_alive)
        deploy = (1 + len(alive_nodes)) if spec.deploy else 0
        user = max(0, spec.actors - deploy)
        jobs = len(self.job_hexes)
        weights = np.where(self.job_running, 20.0, 1.0)
        weights[0] = 0.0  # the deploy job holds only the deploy actors
        weights[self.big_job] = 0.0
        big = int(user * spec.big_job_share)
        job = np.concatenate([np.full(big, self.big_job, dtype=np.int32),
                              rng.choice(jobs, size=user - big, p=weights / weights.sum()).astype(np.int32)])
        running = self.job_running[job]
        state = np.full(user, ACTOR_STATES.index("DEAD"), dtype=np.uint8)
        state[running] = rng.choice(len(ACTOR_STATES), size=int(running.sum()), p=RUNNING_ACTOR_STATES)
        klass = rng.integers(0, len(CLASSES), size=user).astype(np.uint8)
        restarts = np.where(rng.random(user) < 0.05, rng.integers(1, 4, size=user), 0).astype(np.uint8)
        reason = rng.integers(0, len(DEATH_REASONS), size=user).astype(np.uint8)
        node = rng.choice(alive_nodes, size=user).astype(np.int32) if len(alive_nodes) else np.zeros(user, np.int32)
        names = {}
        if spec.deploy:  # the supervisor (on the head) and one NodeExporter per alive node, all in job 1
            extra_job = np.zeros(deploy, dtype=np.int32)
            extra_state = np.full(deploy, ACTOR_STATES.index("ALIVE"), dtype=np.uint8)
            extra_class = np.full(deploy, len(CLASSES) + 1, dtype=np.uint8)
            extra_class[0] = len(CLASSES)
            extra_node = np.concatenate([[0], alive_nodes]).astype(np.int32)
            names[user] = wire.DEPLOY_SUPERVISOR
            for offset, n in enumerate(alive_nodes, start=1):
                names[user + offset] = wire.node_actor_name(self.node_ids[n], self.node_ports[n])
            job = np.concatenate([job, extra_job])
            state = np.concatenate([state, extra_state])
            klass = np.concatenate([klass, extra_class])
            restarts = np.concatenate([restarts, np.zeros(deploy, np.uint8)])
            reason = np.concatenate([reason, np.zeros(deploy, np.uint8)])
            node = np.concatenate([node, extra_node])
        self.actor_job, self.actor_state, self.actor_class = job, state, klass
        self.actor_restarts, self.actor_reason, self.actor_node = restarts, reason, node
        self.actor_names = names
        self.class_names = (*CLASSES, SUPERVISOR_CLASS, NODE_ACTOR_CLASS)
        total = len(job)
        # Ids sort as a random permutation does: the leading 4 bytes are its value.
        self.actor_rank = rng.permutation(total).astype(np.uint32)
        # The GCS's iteration order: registered actors (hash-map order), then the destroyed ones.
        dead = state == ACTOR_STATES.index("DEAD")
        self.actor_gcs_order = np.concatenate([rng.permutation(np.flatnonzero(~dead)),
                                               rng.permutation(np.flatnonzero(dead))]).astype(np.int32)
        self._actor_index: dict[str, int] | None = None

    def _make_tasks(self, rng: np.random.Generator) -> None:
        spec = self.spec
        n = spec.tasks
        jobs = len(self.job_hexes)
        weights = np.where(self.job_running, 20.0, 1.0)
        weights[0] = 0.0
        weights[self.big_job] = 0.0
        big = int(n * spec.big_job_share)
        job = np.concatenate([np.full(big, self.big_job, dtype=np.int32),
                              rng.choice(jobs, size=n - big, p=weights / weights.sum()).astype(np.int32)])
        job = job[rng.permutation(n)]  # submitted interleaved over time
        running = self.job_running[job]
        state = np.empty(n, dtype=np.uint8)
        state[running] = _pick(rng, RUNNING_TASK_STATES, TASK_STATES, int(running.sum()))
        state[~running] = _pick(rng, ENDED_TASK_STATES, TASK_STATES, int((~running).sum()))
        kind = rng.choice(3, size=n, p=(0.7, 0.05, 0.25)).astype(np.uint8)
        # Every job with tasks has one driver task, its first (excluded from lists by default, as in Ray).
        _, first = np.unique(job, return_index=True)
        kind[first] = TASK_TYPES.index("DRIVER_TASK")
        state[first] = TASK_STATES.index("RUNNING")
        state[first[~self.job_running[job[first]]]] = TASK_STATES.index("FINISHED")
        self.task_job, self.task_state, self.task_type = job, state, kind
        self.task_func = rng.integers(0, len(FUNCTIONS), size=n).astype(np.uint8)
        self.task_error = rng.choice(len(ERROR_TYPES), size=n, p=(0.6, 0.2, 0.1, 0.05, 0.05)).astype(np.uint8)
        self.task_attempt = np.where(rng.random(n) < 0.03, 1, 0).astype(np.uint8)
        self.task_rank = rng.permutation(n).astype(np.uint32)
        order = np.argsort(job, kind="stable")  # a job's task events, oldest first (the GCS's index by job)
        bounds = np.searchsorted(job[order], np.arange(jobs + 1))
        self._tasks_by_job = [order[bounds[k]:bounds[k + 1]] for k in range(jobs)]
        self.task_lost = np.where(self.job_running, spec.lost_task_attempts, 0).astype(np.int64)

    def _make_placement_groups(self, rng: np.random.Generator) -> None:
        groups = []
        for k in range(1, len(self.job_hexes)):
            if self.job_running[k]:
                states = ["CREATED"] * 3 + (["PENDING"] if rng.random() < 0.3 else [])
            else:
                states = ["REMOVED"]
            groups += [(k, s) for s in states]
        self.pg_job = [k for k, _ in groups]
        self.pg_state = [s for _, s in groups]
        self.pg_ids = [_hex(self.spec.seed, "pg", i, 14) + self.job_hexes[k] for i, (k, _) in enumerate(groups)]
        self._pg_rows = [self._pg_row(i) for i in range(len(groups))]
        self._node_rows = [self._node_row(i) for i in range(self.spec.nodes)]

    # -- the truth -------------------------------------------------------------------------------
    def job_index(self, job_id: str) -> int | None:
        try:
            number = int.from_bytes(bytes.fromhex(job_id), "little")
        except ValueError:
            return None
        return number - 1 if len(job_id) == 8 and 0 < number <= len(self.job_hexes) else None

    def actor_counts(self, job_id: str | None = None) -> dict[str, int]:
        """Actors by state, of the cluster or of one job."""
        states = self.actor_state if job_id is None else self.actor_state[self.actor_job == self.job_index(job_id)]
        counts = np.bincount(states, minlength=len(ACTOR_STATES))
        return {name: int(counts[i]) for i, name in enumerate(ACTOR_STATES) if counts[i]}

    def task_counts(self, job_id: str) -> dict[str, int]:
        """A job's task attempts by state, as the State API counts them (its driver task left out)."""
        rows = self._tasks_by_job[self.job_index(job_id)]
        rows = rows[self.task_type[rows] != TASK_TYPES.index("DRIVER_TASK")]
        counts = np.bincount(self.task_state[rows], minlength=len(TASK_STATES))
        return {name: int(counts[i]) for i, name in enumerate(TASK_STATES) if counts[i]}

    def task_failures(self, job_id: str) -> dict[str, int]:
        rows = self._tasks_by_job[self.job_index(job_id)]
        rows = rows[(self.task_state[rows] == TASK_STATES.index("FAILED"))
                    & (self.task_type[rows] != TASK_TYPES.index("DRIVER_TASK"))]
        counts = np.bincount(self.task_error[rows], minlength=len(ERROR_TYPES))
        return {name: int(counts[i]) for i, name in enumerate(ERROR_TYPES) if counts[i]}

    def job_actor_restarts(self, job_id: str) -> int:
        return int(self.actor_restarts[self.actor_job == self.job_index(job_id)].sum())

    def job_actor_deaths(self, job_id: str) -> dict[str, int]:
        dead = (self.actor_job == self.job_index(job_id)) & (self.actor_state == ACTOR_STATES.index("DEAD"))
        counts = np.bincount(self.actor_reason[dead], minlength=len(DEATH_REASONS))
        return {name: int(counts[i]) for i, name in enumerate(DEATH_REASONS) if counts[i]}

    def exporter_targets(self) -> dict[str, str]:
        """node id -> host:port of its exporter, for every alive node (what /sd must say)."""
        return {self.node_ids[i]: f"{self.node_ips[i]}:{self.node_ports[i]}" for i in np.flatnonzero(self.node_alive)}

    def running_job_ids(self) -> list[str]:
        return [self.job_hexes[k] for k in np.flatnonzero(self.job_running)]

    # -- rows ------------------------------------------------------------------------------------
    def actor_id(self, i: int) -> str:
        return f"{int(self.actor_rank[i]):08x}{_hex(self.spec.seed, 'actor', i, 8)}{self.job_hexes[self.actor_job[i]]}"

    def _namespace(self, i: int) -> str:
        if i in self.actor_names:
            return wire.DEPLOY_NAMESPACE
        return _hex(self.spec.seed, "ns", int(self.actor_job[i]), 16)

    def _actor_row(self, i: int) -> dict[str, Any]:
        state = ACTOR_STATES[self.actor_state[i]]
        node = int(self.actor_node[i])
        job = self.job_hexes[self.actor_job[i]]
        klass = self.class_names[self.actor_class[i]]
        dead = state == "DEAD"
        row = {"actor_id": self.actor_id(i), "class_name": klass, "state": state, "job_id": job,
               "name": self.actor_names.get(i, ""),
               "node_id": self.node_ids[node] if state != "PENDING_CREATION" else None,
               "pid": 10_000 + i % 50_000 if state in ("ALIVE", "DEAD") else 0, "ray_namespace": self._namespace(i),
               "serialized_runtime_env": json.dumps({"env_vars": {"RAYPULSE_RUN_ID": f"run-{job}",
                                                                   "NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8"},
                                                     "working_dir": f"gcs://_ray_pkg_{_hex(0, 'wd', 0, 8)}.zip"}),
               "required_resources": {"CPU": 1.0, "GPU": 1.0} if i % 4 == 0 else {"CPU": 1.0},
               "death_cause": None, "is_detached": i in self.actor_names, "placement_group_id": None,
               "repr_name": "", "num_restarts": str(int(self.actor_restarts[i])),
               "num_restarts_due_to_lineage_reconstruction": "0", "num_restarts_due_to_node_preemption": "0",
               "call_site": None, "label_selector": {}, "fallback_strategy": None}
        if dead:
            reason = DEATH_REASONS[self.actor_reason[i]]
            if reason == "OUT_OF_MEMORY":
                row["death_cause"] = {"oom_context": {"error_message": "Task was killed due to the node running "
                                                      "low on memory. Memory on the node was 94% used.",
                                                      "fail_immediately": False}}
            else:
                row["death_cause"] = {"actor_died_error_context": {
                    "error_message": f"The actor is dead because its worker process has died. Worker exit type: "
                                     f"SYSTEM_ERROR Worker exit detail: {reason.lower()} on {self.node_ips[node]}",
                    "reason": reason, "owner_id": _hex(0, "owner", i % 97, 28), "owner_ip_address": self.node_ips[0],
                    "node_ip_address": self.node_ips[node], "pid": 10_000 + i % 50_000,
                    "name": row["name"], "ray_namespace": row["ray_namespace"], "class_name": klass,
                    "actor_id": row["actor_id"], "never_started": False}}
        return row

    def task_id(self, i: int) -> str:
        kind = TASK_TYPES[self.task_type[i]]
        job = self.job_hexes[self.task_job[i]]
        owner = (_hex(self.spec.seed, "tactor", i % 101, 12) if kind in ("ACTOR_TASK", "ACTOR_CREATION_TASK")
                 else "f" * 24)
        return f"{int(self.task_rank[i]):08x}{_hex(self.spec.seed, 'task', i, 4)}{owner}{job}"

    def _task_name(self, i: int) -> str:
        return self._name_of(int(self.task_type[i]), int(self.task_func[i]))

    @staticmethod
    def _name_of(kind: int, func: int) -> str:
        if TASK_TYPES[kind] == "ACTOR_TASK":
            return f"{CLASSES[func % len(CLASSES)]}.{FUNCTIONS[func]}"
        if TASK_TYPES[kind] == "ACTOR_CREATION_TASK":
            return f"{CLASSES[func % len(CLASSES)]}.__init__"
        if TASK_TYPES[kind] == "DRIVER_TASK":
            return ""
        return FUNCTIONS[func]

    def _task_row(self, i: int) -> dict[str, Any]:
        kind = TASK_TYPES[self.task_type[i]]
        state = TASK_STATES[self.task_state[i]]
        job = self.job_hexes[self.task_job[i]]
        task_id = self.task_id(i)
        name = self._task_name(i)
        node = self.node_ids[int(self.task_rank[i]) % len(self.node_ids)]
        started = int(self.now * 1000) - int(self.task_rank[i]) % 3_600_000
        events = [{"state": "PENDING_ARGS_AVAIL", "created_ms": float(started - 20)},
                  {"state": "SUBMITTED_TO_WORKER", "created_ms": float(started - 5)},
                  {"state": "RUNNING", "created_ms": float(started)}]
        if state in ("FINISHED", "FAILED"):
            events.append({"state": state, "created_ms": float(started + 1200)})
        row = {"task_id": task_id, "attempt_number": int(self.task_attempt[i]), "name": name, "state": state,
               "job_id": job, "actor_id": task_id[16:] if kind in ("ACTOR_TASK", "ACTOR_CREATION_TASK") else None,
               "type": kind, "func_or_class_name": name, "parent_task_id": "f" * 40 + job, "node_id": node,
               "worker_id": _hex(0, "worker", i % 977, 28), "worker_pid": 20_000 + i % 30_000,
               "error_type": ERROR_TYPES[self.task_error[i]] if state == "FAILED" else None,
               "language": "PYTHON", "required_resources": {"CPU": 1.0}, "runtime_env_info": {
                   "serialized_runtime_env": "{}", "runtime_env_config": {"setup_timeout_seconds": 600,
                                                                          "eager_install": True}},
               "placement_group_id": None, "events": events, "profiling_data": {},
               "creation_time_ms": float(started - 20), "start_time_ms": float(started),
               "end_time_ms": float(started + 1200) if state in ("FINISHED", "FAILED") else None,
               "task_log_info": None, "error_message": None, "is_debugger_paused": None, "call_site": None,
               "label_selector": {}, "fallback_strategy": None}
        if state == "FAILED":
            row["error_message"] = f"ray::{name}() (pid={row['worker_pid']}, ip=10.0.0.1)\n  File \"train.py\", " \
                                   f"line 42, in {name}\nRuntimeError: simulated {row['error_type'].lower()}"
        return row

    def _node_row(self, i: int) -> dict[str, Any]:
        alive = bool(self.node_alive[i])
        ip = self.node_ips[i]
        resources = {"memory": 1.6e12, f"node:{ip}": 1.0, "object_store_memory": 2e11, "CPU": 96.0, "GPU": 8.0,
                     "accelerator_type:H100": 1.0}
        if i == 0:
            resources = {"memory": 2e11, f"node:{ip}": 1.0, "object_store_memory": 5e10,
                         "node:__internal_head__": 1.0}
        labels = {"ray.io/node-id": self.node_ids[i]}
        if self.spec.label_ports:
            labels[wire.NODE_LABEL_EXPORTER_PORT] = str(self.node_ports[i])
        return {"node_id": self.node_ids[i], "node_ip": ip, "is_head_node": i == 0,
                "state": "ALIVE" if alive else "DEAD",
                "state_message": None if alive else "Unexpected termination: health check failed due to missing "
                                                    "too many heartbeats",
                "node_name": ip, "resources_total": resources, "labels": labels,
                "start_time_ms": self.node_start_ms[i], "end_time_ms": self.node_end_ms[i]}

    def _pg_row(self, i: int) -> dict[str, Any]:
        pg = self.pg_ids[i]
        received = int((self.now - 120 - i) * 1e9)
        return {"placement_group_id": pg, "name": "", "creator_job_id": self.job_hexes[self.pg_job[i]],
                "state": self.pg_state[i],
                "bundles": [{"bundle_id": {"placement_group_id": pg, "bundle_index": b},
                             "unit_resources": {"CPU": 12.0, "GPU": 1.0}, "node_id": "", "label_selector": {}}
                            for b in range(8)],
                "is_detached": False,
                "stats": {"creation_request_received_ns": str(received),
                          "scheduling_started_time_ns": str(received + 100_000), "scheduling_attempt": 1,
                          "scheduling_state": "QUEUED" if self.pg_state[i] == "PENDING" else "FINISHED",
                          "scheduling_latency_us": "1200", "end_to_end_creation_latency_us": "1500",
                          "highest_retry_delay_ms": 0.0},
                "topology_strategy": {}, "topology_assignments": {}}

    def _job_rows(self) -> list[dict[str, Any]]:
        rows = []
        spec = self.spec
        for k, job in enumerate(self.job_hexes):
            status = self.job_status[k]
            submission = self.job_type[k] == "SUBMISSION"
            metadata: dict[str, str] = {}
            if k == 0 and spec.deploy:
                metadata = {wire.META_TOOL: "exporters", wire.META_TOOL_ACTION: "deploy"}
            elif submission and k % 2:
                metadata = {wire.META_JOB_NAME: f"rl-{k % 17}", wire.META_RUN_ID: f"run-{k}",
                            wire.META_ATTEMPT: "1", wire.META_MAX_ATTEMPTS: "3", wire.META_USER: "alice",
                            wire.META_WORKSPACE: "ml", wire.META_LABEL_PREFIX + "team": "rl"}
            failed = status == "FAILED"
            message = ("Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 "
                       "chars):\n" + ("Traceback (most recent call last):\n  File \"train.py\", line 42\n"
                                      * (spec.failed_job_log_bytes // 60)) if failed else
                       "Job finished successfully." if status == "SUCCEEDED" else
                       "Job was intentionally stopped." if status == "STOPPED" else "Job is currently running.")
            driver = {"id": job, "node_ip_address": self.node_ips[0], "pid": str(30_000 + k)}
            rows.append({
                "type": self.job_type[k], "job_id": job,
                "submission_id": (f"raysubmit_{_hex(spec.seed, 'sub', k, 8)}" if k else
                                  "raypulse-exporters-deploy-20250101-000000-abcdef") if submission else None,
                "driver_info": driver, "status": status,
                "entrypoint": "python -m raypulse_agent deploy '{...}'" if k == 0 and spec.deploy else
                              f"python train.py --config rl-{k}.yaml --seed {k}",
                "message": message if submission else None,
                "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR" if failed and submission else None,
                "start_time": self.job_start_ms[k], "end_time": self.job_end_ms[k], "metadata": metadata,
                "runtime_env": {"working_dir": "gcs://_ray_pkg_0123456789abcdef.zip",
                                "env_vars": {"RAYPULSE_RUN_ID": f"run-{k}"}},
                "driver_agent_http_address": f"http://{self.node_ips[0]}:52365" if submission else None,
                "driver_node_id": self.node_ids[0] if submission else None,
                "driver_exit_code": (1 if failed else 0 if status == "SUCCEEDED" else None) if submission else None})
        return rows

    def _cluster_status(self) -> dict[str, Any]:
        def usage(row: Mapping[str, Any]) -> dict[str, list[float]]:
            used = {}
            for name, total in row["resources_total"].items():
                key = name.split("_")[0] + "".join(p.title() for p in name.split("_")[1:])
                used[key] = [round(total * 0.7, 1) if name in ("CPU", "GPU") else 0.0, total]
            return used
        alive = [row for row in self._node_rows if row["state"] == "ALIVE"]
        by_node = {row["node_id"]: usage(row) for row in alive}
        cluster: dict[str, list[float]] = {}
        for node in by_node.values():
            for key, (used, total) in node.items():
                pair = cluster.setdefault(key, [0.0, 0.0])
                pair[0] += used
                pair[1] += total
        pending = [[{"bundles": [[{"CPU": 12.0, "GPU": 1.0}, 8]], "strategy": "PACK"}, 1]
                   for s in self.pg_state if s == "PENDING"]
        return {"result": True, "msg": "Got cluster status.", "data": {
            "autoscalingStatus": f"Cluster status: {len(alive)} nodes", "autoscalingError": None,
            "clusterStatus": {"gcsRequestTime": 0.002, "time": self.now, "loadMetricsReport": {
                "usage": cluster, "resourceDemand": [[{"CPU": 1.0}, 12]], "pgDemand": pending, "requestDemand": [],
                "nodeTypes": [], "headIp": None, "usageByNode": by_node, "nodeTypeMapping": None,
                "idleTimeMap": None}}}}

    def _metrics_text(self) -> str:
        """The head node's metrics agent: `ray_actors` as the GCS records it, and some of its neighbours."""
        pairs = self.actor_state.astype(np.int64) * 256 + self.actor_class
        keys, counts = np.unique(pairs, return_counts=True)
        tags = f'Component="gcs_server",JobId="",NodeAddress="{self.node_ips[0]}",SessionName="{self.session_name}"'
        lines = ["# HELP ray_actors An actor can be in one of DEPENDENCIES_UNREADY, PENDING_CREATION, ALIVE, "
                 "ALIVE_IDLE, ALIVE_RUNNING_TASKS, RESTARTING, or DEAD states. An actor is considered ALIVE if it "
                 "is either ALIVE_IDLE or ALIVE_RUNNING_TASKS.", "# TYPE ray_actors gauge"]
        for key, count in zip(keys, counts, strict=True):
            state, klass = ACTOR_STATES[int(key) // 256], self.class_names[int(key) % 256]
            lines.append(f'ray_actors{{{tags},Name="{klass}",Source="gcs",State="{state}",'
                         f'Version="{RAY_VERSION}"}} {float(count)}')
        lines.append(f'ray_actors{{{tags},Name="Supervisor",Source="executor",State="ALIVE_IDLE",'
                     f'Version="{RAY_VERSION}"}} 1.0')
        lines += ["# HELP ray_node_cpu_utilization Total CPU usage on a ray node",
                  "# TYPE ray_node_cpu_utilization gauge",
                  f'ray_node_cpu_utilization{{IsHeadNode="true",RayNodeType="head",SessionName="{self.session_name}",'
                  f'Version="{RAY_VERSION}",ip="{self.node_ips[0]}"}} 12.5']
        for method in ("ActorInfoGcsService.grpc_server.GetAllActorInfo",
                       "NodeInfoGcsService.grpc_server.GetAllNodeInfo",
                       "TaskInfoGcsService.grpc_server.GetTaskEvents",
                       "JobInfoGcsService.grpc_server.GetAllJobInfo"):
            lines += [f'ray_operation_count_total{{Component="gcs_server",Method="{method}",'
                      f'SessionName="{self.session_name}"}} 1234.0']
        return "\n".join(lines) + "\n"

    # -- the State API ---------------------------------------------------------------------------
    def _actor_column(self, key: str) -> Callable[[np.ndarray], np.ndarray] | None:
        """Vectorised values of an actor column over row indices (lower-cased strings), if it has one."""
        if key == "state":
            names = np.array([s.lower() for s in ACTOR_STATES])
            return lambda rows: names[self.actor_state[rows]]
        if key == "job_id":
            names = np.array(self.job_hexes)
            return lambda rows: names[self.actor_job[rows]]
        if key == "class_name":
            names = np.array([c.lower() for c in self.class_names])
            return lambda rows: names[self.actor_class[rows]]
        if key == "ray_namespace":
            return lambda rows: np.array([self._namespace(int(i)) for i in rows], dtype=object)
        if key == "name":
            return lambda rows: np.array([self.actor_names.get(int(i), "").lower() for i in rows], dtype=object)
        return None

    def list_actors(self, options: Options) -> dict[str, Any]:
        gcs = {}
        for key, predicate, value in options.filters:
            if predicate != "=":
                continue  # the GCS filters on equality only
            if key == "state":
                if value.upper() not in ACTOR_STATES:
                    raise ValueError(f"Invalid actor state for filtering: {value.upper()}")
                gcs["state"] = ACTOR_STATES.index(value.upper())
            elif key == "job_id":
                gcs["job_id"] = self.job_index(value)
            elif key == "actor_id":
                gcs["actor_id"] = self._actor_lookup().get(value.lower(), -1)
        order = self.actor_gcs_order
        match = np.ones(len(order), dtype=bool)
        if "state" in gcs:
            match &= self.actor_state[order] == gcs["state"]
        if "job_id" in gcs:
            match &= self.actor_job[order] == (-1 if gcs["job_id"] is None else gcs["job_id"])
        if "actor_id" in gcs:
            match &= order == gcs["actor_id"]
        positions = np.flatnonzero(match)
        if len(positions) > MAX_LIMIT_FROM_DATA_SOURCE:  # the GCS stops at its limit
            scanned = int(positions[MAX_LIMIT_FROM_DATA_SOURCE - 1]) + 1
            positions = positions[:MAX_LIMIT_FROM_DATA_SOURCE]
        else:
            scanned = len(order)
        rows = order[positions]
        num_after_truncation = scanned  # rows returned + rows the GCS filtered out on the way
        return self._dashboard_side(rows, options, ACTOR_FILTERABLE, self._actor_column, self._actor_row,
                                    ACTOR_COLUMNS, ACTOR_DETAIL_COLUMNS, self.actor_rank,
                                    total=len(order), num_after_truncation=num_after_truncation)

    def _actor_lookup(self) -> dict[str, int]:
        if self._actor_index is None:
            self._actor_index = {self.actor_id(i): i for i in range(len(self.actor_job))}
        return self._actor_index

    def _task_column(self, key: str) -> Callable[[np.ndarray], np.ndarray] | None:
        if key == "state":
            names = np.array([s.lower() for s in TASK_STATES])
            return lambda rows: names[self.task_state[rows]]
        if key == "job_id":
            names = np.array(self.job_hexes)
            return lambda rows: names[self.task_job[rows]]
        if key == "type":
            names = np.array([t.lower() for t in TASK_TYPES])
            return lambda rows: names[self.task_type[rows]]
        if key == "error_type":
            names = np.array([e.lower() for e in ERROR_TYPES])
            failed = TASK_STATES.index("FAILED")
            return lambda rows: np.where(self.task_state[rows] == failed, names[self.task_error[rows]], None)
        if key in ("name", "func_or_class_name"):
            return lambda rows: np.array([self._task_name(int(i)).lower() for i in rows], dtype=object)
        return None

    def list_tasks(self, options: Options, limit_from_source: int = MAX_LIMIT_FROM_DATA_SOURCE) -> dict[str, Any]:
        jobs = {self.job_index(v) for k, p, v in options.filters if k == "job_id" and p == "="}
        lost = 0
        if len(jobs) == 1:  # the GCS's index by job, and that job's data loss
            (job,) = jobs
            events = self._tasks_by_job[job] if job is not None else np.array([], dtype=np.int64)
            lost = int(self.task_lost[job]) if job is not None else 0
        elif len(jobs) > 1:
            events = np.array([], dtype=np.int64)
        else:
            events = np.arange(len(self.task_job))
            lost = int(self.task_lost.sum())
        events = events[::-1]  # newest first
        match = np.ones(len(events), dtype=bool)
        if options.exclude_driver:
            match &= self.task_type[events] != TASK_TYPES.index("DRIVER_TASK")
        for key, predicate, value in options.filters:
            if key in ("job_id", "state", "name", "task_id", "actor_id"):  # the GCS's filters, = and !=
                hit = self._task_gcs_hit(events, key, value)
                match &= hit if predicate == "=" else ~hit
        positions = np.flatnonzero(match)
        past_limit = max(0, len(positions) - limit_from_source)
        rows = events[positions[:limit_from_source]]
        dropped = lost + past_limit  # the GCS counts matches past its limit as dropped events
        return self._dashboard_side(rows, options, TASK_FILTERABLE, self._task_column, self._task_row, TASK_COLUMNS,
                                    TASK_DETAIL_COLUMNS, self.task_rank, total=len(rows) + dropped,
                                    num_after_truncation=len(rows))

    def _task_gcs_hit(self, events: np.ndarray, key: str, value: str) -> np.ndarray:
        """The GCS's comparison (names ignoring case), on codes where the column has them."""
        if key == "state":
            code = TASK_STATES.index(value.upper()) if value.upper() in TASK_STATES else -1
            return self.task_state[events] == code
        if key == "job_id":
            job = self.job_index(value)
            return self.task_job[events] == (-1 if job is None else job)
        if key == "name":
            codes = [t * 256 + f for t in range(len(TASK_TYPES)) for f in range(len(FUNCTIONS))
                     if self._name_of(t, f).lower() == value.lower()]
            return np.isin(self.task_type[events].astype(np.int64) * 256 + self.task_func[events], codes)
        return np.array([str(self._task_row(int(i))[key] or "").lower() == value.lower() for i in events], dtype=bool)

    def list_nodes(self, options: Options) -> dict[str, Any]:
        rows = list(self._node_rows)
        for key, predicate, value in options.filters:
            if predicate == "=" and key in ("node_id", "state", "node_name"):
                if key == "state" and value.upper() not in ("ALIVE", "DEAD"):
                    raise ValueError(f"Invalid node state for filtering: {value.upper()}")
                rows = [r for r in rows if str(r[key]).lower() == value.lower()]
        returned = rows[:MAX_LIMIT_FROM_DATA_SOURCE]
        return self._rows_side(returned, options, NODE_FILTERABLE, NODE_COLUMNS, NODE_DETAIL_COLUMNS, "node_id",
                               total=len(self._node_rows), num_after_truncation=len(returned))

    def list_placement_groups(self, options: Options) -> dict[str, Any]:
        returned = self._pg_rows[:MAX_LIMIT_FROM_DATA_SOURCE]
        return self._rows_side(returned, options, PG_FILTERABLE, PG_COLUMNS, PG_DETAIL_COLUMNS,
                               "placement_group_id", total=len(self._pg_rows), num_after_truncation=len(returned))

    def summarize_tasks(self, options: Options) -> dict[str, Any]:
        listed = self.list_tasks(Options(limit=MAX_LIMIT_FROM_API_SERVER, filters=options.filters))
        summary: dict[str, dict[str, Any]] = {}
        totals = {"NORMAL_TASK": 0, "ACTOR_TASK": 0, "ACTOR_CREATION_TASK": 0}
        for task in listed["result"]:
            key = task["name"] or task["func_or_class_name"]
            entry = summary.setdefault(key, {"func_or_class_name": key, "type": task["type"], "state_counts": {}})
            entry["state_counts"][task["state"]] = entry["state_counts"].get(task["state"], 0) + 1
            if task["type"] in totals:
                totals[task["type"]] += 1
        result = {"node_id_to_summary": {"cluster": {
            "summary": summary, "total_tasks": totals["NORMAL_TASK"], "total_actor_tasks": totals["ACTOR_TASK"],
            "total_actor_scheduled": totals["ACTOR_CREATION_TASK"], "summary_by": "func_name"}}}
        return {"total": listed["total"], "result": result, "partial_failure_warning": "",
                "warnings": listed["warnings"], "num_after_truncation": listed["num_after_truncation"],
                "num_filtered": listed["num_filtered"]}

    def summarize_actors(self, options: Options) -> dict[str, Any]:
        listed = self.list_actors(Options(limit=MAX_LIMIT_FROM_API_SERVER, filters=options.filters))
        summary: dict[str, dict[str, Any]] = {}
        for actor in listed["result"]:
            entry = summary.setdefault(actor["class_name"], {"class_name": actor["class_name"], "state_counts": {}})
            entry["state_counts"][actor["state"]] = entry["state_counts"].get(actor["state"], 0) + 1
        result = {"node_id_to_summary": {"cluster": {"summary": summary, "total_actors": len(listed["result"]),
                                                     "summary_by": "class"}}}
        return {"total": listed["total"], "result": result, "partial_failure_warning": "",
                "warnings": listed["warnings"], "num_after_truncation": listed["num_after_truncation"],
                "num_filtered": listed["num_filtered"]}

    @staticmethod
    def _check_columns(options: Options, filterable: frozenset[str]) -> None:
        for key, _, _ in options.filters:
            if key.lower() not in filterable:
                raise ValueError(f"The given filter column {key.lower()} is not supported. Enter filters with "
                                 f"–-filter key=value or –-filter key!=value Supported filter columns: "
                                 f"{set(filterable)}")

    def _dashboard_side(self, rows: np.ndarray, options: Options, filterable: frozenset[str],
                        column: Callable[[str], Callable[[np.ndarray], np.ndarray] | None],
                        make_row: Callable[[int], dict[str, Any]], columns: tuple[str, ...],
                        detail_columns: tuple[str, ...], rank: np.ndarray, *, total: int,
                        num_after_truncation: int) -> dict[str, Any]:
        """state_api_utils.do_filter, the sort by id and the cut at `limit`, over arrays where it can."""
        self._check_columns(options, filterable)
        keep = np.ones(len(rows), dtype=bool)
        slow = []
        for key, predicate, value in options.filters:
            values = column(key.lower())
            if values is None:
                slow.append((key.lower(), predicate, value))
                continue
            hit = np.array([v is not None and str(v).lower() == value.lower() for v in values(rows)], dtype=bool) \
                if len(rows) else np.zeros(0, dtype=bool)
            keep &= hit if predicate == "=" else ~hit
        rows = rows[keep]
        built: dict[int, dict[str, Any]] = {}
        if slow:
            kept = []
            for i in rows:
                row = built[int(i)] = make_row(int(i))
                if all(_matches(row.get(key), predicate, value) for key, predicate, value in slow):
                    kept.append(i)
            rows = np.array(kept, dtype=np.int64)
        num_filtered = len(rows)
        chosen = rows[np.argsort(rank[rows], kind="stable")][:options.limit]
        wanted = detail_columns if options.detail else columns
        result = [_project(built.get(int(i)) or make_row(int(i)), wanted) for i in chosen]
        return {"total": int(total), "num_after_truncation": int(num_after_truncation), "num_filtered": num_filtered,
                "result": result, "partial_failure_warning": "", "warnings": None}

    def _rows_side(self, rows: list[dict[str, Any]], options: Options, filterable: frozenset[str],
                   columns: tuple[str, ...], detail_columns: tuple[str, ...], id_key: str, *, total: int,
                   num_after_truncation: int) -> dict[str, Any]:
        self._check_columns(options, filterable)
        kept = [r for r in rows if all(_matches(r.get(k.lower()), p, v) for k, p, v in options.filters)]
        kept.sort(key=lambda r: r[id_key])
        wanted = detail_columns if options.detail else columns
        return {"total": total, "num_after_truncation": num_after_truncation, "num_filtered": len(kept),
                "result": [_project(r, wanted) for r in kept[:options.limit]], "partial_failure_warning": "",
                "warnings": None}


def _matches(actual: object, predicate: str, value: str) -> bool:
    """do_filter's comparison: strings case-insensitively, ints and bools converted."""
    if actual is None:
        return predicate == "!="
    if isinstance(actual, bool):
        expected: object = {"true": True, "1": True, "false": False, "0": False}.get(value.lower(), value)
        equal = actual == expected
    elif isinstance(actual, int):
        equal = str(actual) == value
    else:
        equal = str(actual).lower() == value.lower()
    return equal if predicate == "=" else not equal


def _project(row: Mapping[str, Any], columns: Iterable[str]) -> dict[str, Any]:
    return {column: row.get(column) for column in columns}


@dataclass
class Options:
    """ListApiOptions as state_api_utils.options_from_req makes them."""

    limit: int = DEFAULT_LIMIT
    detail: bool = False
    filters: list[tuple[str, str, str]] = field(default_factory=list)
    exclude_driver: bool = True

    @classmethod
    def from_query(cls, query: Mapping[str, str], getall: Callable[[str, list[str]], list[str]]) -> Options:
        limit = int(query.get("limit") if query.get("limit") is not None else DEFAULT_LIMIT)
        if limit > MAX_LIMIT_FROM_API_SERVER:
            raise ValueError(f"Given limit {limit} exceeds the supported limit {MAX_LIMIT_FROM_API_SERVER}. Use a "
                             "lower limit, or set the `RAY_MAX_LIMIT_FROM_API_SERVER` environment variable to a "
                             "larger value.")
        keys, predicates, values = (getall("filter_keys", []), getall("filter_predicates", []),
                                    getall("filter_values", []))
        if len(keys) != len(values):
            raise AssertionError("filter_keys and filter_values differ in length")
        filters = list(zip(keys, predicates, values, strict=False))
        for _, predicate, _ in filters:
            if predicate not in ("=", "!="):
                raise ValueError(f"Unsupported filter predicate {predicate} is given. Available predicates: =, !=.")
        return cls(limit=limit, detail=_bool(query.get("detail", False)), filters=filters,
                   exclude_driver=_bool(query.get("exclude_driver", True)))


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("False", "false", "0"):
        return False
    if value in ("True", "true", "1"):
        return True
    raise ValueError(f"Failed to convert a value {value} of type {type(value)} to <class 'bool'>")


def _reply(status: int, message: str, result: object) -> tuple[web.Response, int]:
    """dashboard/routes.py rest_response (convert_google_style=False) around a state reply, and its size."""
    body = json.dumps({"result": status == 200, "msg": message, "data": {"result": result}}).encode()
    return web.Response(status=status, content_type="application/json", body=body), len(body)


class Stats:
    """What the fake served: requests and bytes by path (the cost of one collection, read by the bench)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    def add(self, path: str, size: int) -> None:
        self.requests[path] = self.requests.get(path, 0) + 1
        self.bytes[path] = self.bytes.get(path, 0) + size

    def reset(self) -> dict[str, Any]:
        taken = {"requests": dict(self.requests), "bytes": dict(self.bytes)}
        self.requests.clear()
        self.bytes.clear()
        return taken


def make_app(cluster: FakeCluster, stats: Stats | None = None) -> web.Application:
    """The dashboard's routes the exporter reads, answered as Ray 2.60 answers them."""
    stats = stats or Stats()
    in_flight = 0

    def state(handler: Callable[[Options], dict[str, Any]]):
        async def route(request: web.Request) -> web.StreamResponse:
            nonlocal in_flight
            if in_flight >= MAX_HTTP_REQUESTS:
                return _reply(429, f"Max number of in-progress requests={MAX_HTTP_REQUESTS} reached. To set a higher "
                              "limit, set environment variable: export RAY_STATE_SERVER_MAX_HTTP_REQUEST='xxx'. "
                              "Max allowed = 1000", None)[0]
            in_flight += 1
            try:
                options = Options.from_query(request.query, request.query.getall)
                result = await asyncio.to_thread(handler, options)  # the dashboard does this in its executor
            except ValueError as exc:
                return _reply(400, str(exc), None)[0]
            finally:
                in_flight -= 1
            response, size = _reply(200, "", result)
            stats.add(request.path, size)
            return response
        return route

    def static(body: Callable[[], bytes], content_type: str = "application/json"):
        async def route(request: web.Request) -> web.Response:
            data = body()
            stats.add(request.path, len(data))
            return web.Response(body=data, content_type=content_type)
        return route

    app = web.Application()
    app.router.add_get("/api/v0/actors", state(cluster.list_actors))
    app.router.add_get("/api/v0/tasks", state(cluster.list_tasks))
    app.router.add_get("/api/v0/nodes", state(cluster.list_nodes))
    app.router.add_get("/api/v0/placement_groups", state(cluster.list_placement_groups))
    app.router.add_get("/api/v0/tasks/summarize", state(cluster.summarize_tasks))
    app.router.add_get("/api/v0/actors/summarize", state(cluster.summarize_actors))
    version = json.dumps({"version": "4", "ray_version": RAY_VERSION, "ray_commit": "fake",
                          "session_name": cluster.session_name}).encode()
    app.router.add_get("/api/jobs/", static(lambda: cluster._jobs_body))
    app.router.add_get("/api/cluster_status", static(lambda: cluster._status_body))
    app.router.add_get("/api/version", static(lambda: version))
    app.router.add_get("/api/gcs_healthz", static(lambda: b"success", "text/plain"))

    # The harness's own (not Ray's): what was served since the last ask, and what a correct client finds.
    async def served(request: web.Request) -> web.Response:
        return web.json_response(stats.reset())

    async def truth(request: web.Request) -> web.Response:
        return web.json_response({"actors": cluster.actor_counts(), "targets": cluster.exporter_targets(),
                                  "running_jobs": {job: {"actors": cluster.actor_counts(job),
                                                         "tasks": cluster.task_counts(job)}
                                                   for job in cluster.running_job_ids()}})

    app.router.add_get("/fake/served", served)
    app.router.add_get("/fake/truth", truth)
    return app


def make_metrics_app(cluster: FakeCluster) -> web.Application:
    """The head node's metrics agent (`--metrics-export-port`): Prometheus text, no auth."""
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=cluster._metrics_body, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


@dataclass
class Served:
    runner: web.AppRunner
    url: str
    metrics_url: str | None
    stats: Stats
    metrics_runner: web.AppRunner | None = None

    async def close(self) -> None:
        await self.runner.cleanup()
        if self.metrics_runner is not None:
            await self.metrics_runner.cleanup()


async def serve(cluster: FakeCluster, host: str = "127.0.0.1", port: int = 0,
                metrics_port: int | None = 0) -> Served:
    """Start the fake dashboard (and the metrics agent unless metrics_port is None) on this event loop."""
    stats = Stats()
    runner = web.AppRunner(make_app(cluster, stats), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    metrics_runner, metrics_url = None, None
    if metrics_port is not None:
        metrics_runner = web.AppRunner(make_metrics_app(cluster), access_log=None)
        await metrics_runner.setup()
        metrics_site = web.TCPSite(metrics_runner, host, metrics_port)
        await metrics_site.start()
        metrics_url = f"http://{host}:{metrics_site._server.sockets[0].getsockname()[1]}/metrics"  # type: ignore[union-attr]
    return Served(runner, f"http://{host}:{bound}", metrics_url, stats, metrics_runner)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--actors", type=int, default=1_000)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8265)
    parser.add_argument("--metrics-port", type=int, default=0, help="the head's metrics agent; -1: none")
    parser.add_argument("--raylets-per-host", type=int, default=1)
    parser.add_argument("--label-ports", action="store_true", help="nodes carry the exporter-port label")
    args = parser.parse_args()
    started = time.monotonic()
    cluster = FakeCluster(Spec(nodes=args.nodes, actors=args.actors, tasks=args.tasks, jobs=args.jobs, seed=args.seed,
                               raylets_per_host=args.raylets_per_host, label_ports=args.label_ports))

    async def run() -> None:
        served = await serve(cluster, args.host, args.port, None if args.metrics_port < 0 else args.metrics_port)
        print(json.dumps({"dashboard": served.url, "metrics": served.metrics_url,
                          "made_in_seconds": round(time.monotonic() - started, 2),
                          "actors": cluster.actor_counts(), "running_jobs": cluster.running_job_ids()[:5]}),
              flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
