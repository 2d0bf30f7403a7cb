"""The wire contract: every name that crosses the boundary between the launcher, the exporter, the
deploy agent and training code, spelled once. Standard library only: training code, the exporter,
the launcher and the agent that `launcher exporters deploy` ships to the nodes all import it.

What crosses:
- Ray node labels the launcher puts on the nodes it starts (the exporter's /sd reads them);
- Ray job metadata the launcher puts on every attempt (the exporter labels job series with it);
- environment variables the launcher gives the nodes and the job's processes;
- default ports and HTTP paths of the exporter, and how /metrics is asked for a few families;
- the names of the actors `launcher exporters deploy` places (the exporter's /sd reads them);
- where the Ray auth token is found, as Ray itself looks for it;
- the token a job's processes show the progress endpoint (derived from the Ray token).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path

# --- ports and paths of the exporter ---------------------------------------------------------------
EXPORTER_PORT = 9477  # /metrics, /healthz, /readyz, /sd
PROGRESS_PORT = 9478  # the progress endpoint (loopback by default)
PROGRESS_PATH = "/v1/progress"
SD_PATH = "/sd"  # Prometheus HTTP service discovery, on the head's exporter
# ...and of every Ray node's metrics agent (ray.util.metrics, vLLM's engines), scraped as job RAY_METRICS_JOB
RAY_SD_PATH = "/sd/ray"
RAY_METRICS_JOB = "ray"  # the job Ray's own file discovery and KubeRay's PodMonitor give these targets
RAY_SD_FILE = "prom_metrics_service_discovery.json"  # Ray's file discovery, in its session directory
# ...and of an RL run's rollout servers (verl's vLLM/SGLang HTTP servers serve their engine's own /metrics), which
# the job reports to the head's progress endpoint (reports of kind "rollout"), scraped as job ROLLOUT_METRICS_JOB
ROLLOUT_SD_PATH = "/sd/rollout"
ROLLOUT_METRICS_JOB = "rollout"  # the job verl's own Prometheus config gives them (verl/workers/rollout/utils.py)
# Their target label naming the engine (vllm, sglang): not `engine`, which vLLM's own series carry (its engine index)
ROLLOUT_LABEL = "rollout"
ROLLOUT_MAX_SERVERS_PER_REPORT = 512  # a report's list of servers; the client sends more in several
ROLLOUT_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"  # an engine's name as the framework spells it: vllm, sglang
HEAD_NODE_RESOURCE = "node:__internal_head__"  # Ray's resource of the head node: a task that asks for it runs there
# A scrape target: host:port, an IPv6 host in brackets (as Ray's file discovery and verl write them)
TARGET_PATTERN = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}"
METRICS_PATH = "/metrics"
HEALTH_PATH = "/healthz"
# A node's health digest (exporter/contract/digest.py), and on the head every node's in one document:
# ?since=CURSOR&generation=G asks only for the nodes whose entry changed since that answer.
DIGEST_PATH = "/health/digest"
FLEET_PATH = "/health/fleet"
FLEET_SINCE_PARAM = "since"
FLEET_GENERATION_PARAM = "generation"
FLEET_INTERVAL_PARAM = "interval"  # how often the asker checks: the head reads the nodes as often (>= 1 s)

# --- /metrics, only the families asked for ----------------------------------------------------------
# GET /metrics?name[]=raypulse_gpu_up&name[]=raypulse_train_step serves those families only, as /metrics
# serves all (formats, gzip, auth), with an ETag; If-None-Match with it is answered 304 while they are
# unchanged. Names are exact, as docs/metrics.md spells them (counters with _total); unknown ones are
# absent. `[]` as in Prometheus' /federate?match[]= and node_exporter's collect[]=; `name`, not `match`,
# because these are names, not series selectors.
METRICS_NAME_PARAM = "name[]"
# More name[] parameters in one request are answered 400. 64 of the longest names fit in aiohttp's
# 8190-byte request line, brackets percent-encoded; a longer list is asked for in parts.
METRICS_MAX_NAMES = 64


def metrics_path(names: Iterable[str]) -> str:
    """The path and query of /metrics restricted to `names` (sorted and deduplicated, so that one set is
    always one URL); ValueError for more than METRICS_MAX_NAMES."""
    unique = sorted(set(names))
    if len(unique) > METRICS_MAX_NAMES:
        raise ValueError(f"{len(unique)} families asked for; at most {METRICS_MAX_NAMES} per request: "
                         "ask for them in parts")
    return f"{METRICS_PATH}?{urllib.parse.urlencode([(METRICS_NAME_PARAM, name) for name in unique])}"

# --- the kubelet's pod-resources API (which pod holds which GPU) and the pod's own name -------------
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"  # the kubelet serves kubelet.sock here (KEP-606)
POD_RESOURCES_SOCKET = f"{POD_RESOURCES_DIR}/kubelet.sock"
POD_NAME_ENV, POD_NAMESPACE_ENV = "POD_NAME", "POD_NAMESPACE"  # the downward API variables manifests set

# --- node_exporter beside the exporter (the node-exporter-companion profile) ----------------------
NODE_EXPORTER_PORT = 9100  # node_exporter's default --web.listen-address port
NODE_EXPORTER_JOB = "node"  # the `job` its /sd targets get: what node-mixin's rules and dashboards select
SD_JOB_LABEL = "job"  # Prometheus keeps a `job` target label that discovery sets over the scrape job's name

# --- Ray node labels (set by the launcher with `ray start --labels`) ------------------------------
NODE_LABEL_EXPORTER_PORT = "raypulse.io/exporter-port"  # the port of the node's exporter
NODE_LABEL_NODE = "raypulse.io/node"  # the launcher's name for the node: head, workers-1, ...
NODE_LABEL_GROUP = "raypulse.io/group"  # its worker group (head for the head)
# On a Kubernetes node the launcher cordoned for a run (health.cordon_nodes): which run, why, when (JSON).
NODE_ANNOTATION_CORDONED = "raypulse.io/cordoned"

# --- Ray job metadata (set by the launcher on every attempt) --------------------------------------
META_PREFIX = "raypulse."
META_JOB_NAME = "raypulse.job_name"
META_RUN_ID = "raypulse.run_id"
META_ATTEMPT = "raypulse.attempt"
META_MAX_ATTEMPTS = "raypulse.max_attempts"
META_WORKSPACE = "raypulse.workspace"
META_USER = "raypulse.user"
META_TRACE_ID = "raypulse.trace_id"
META_LABEL_PREFIX = "raypulse.label."  # + a user label's key
# Jobs of raypulse's own tools (the deploy agent), not user runs.
META_TOOL = "raypulse.io/tool"
META_TOOL_ACTION = "raypulse.io/action"

# --- environment variables -------------------------------------------------------------------------
# Ray's worker_process_setup_hook of a job submitted with --framework-metrics: reports what frameworks log
FRAMEWORK_SETUP_HOOK = "exporter.progress.hooks.setup"
ENV_PROGRESS_URL = "RAYPULSE_PROGRESS_URL"  # where training code reports progress (its node's exporter)
ENV_RUN_ID = "RAYPULSE_RUN_ID"  # the run an attempt belongs to
ENV_ATTEMPT = "RAYPULSE_ATTEMPT"  # the attempt's number (1-based)
ENV_CHECKPOINT_DIR = "RAYPULSE_CHECKPOINT_DIR"  # where the run's checkpoints go (outlives the attempts)
ENV_RESUME_FROM = "RAYPULSE_RESUME_FROM"  # the latest checkpoint of an earlier attempt (JSON: step, path)
ENV_SUBMISSION_ID = "RAYPULSE_SUBMISSION_ID"  # the attempt's submission id, for every process of the job
ENV_PROGRESS_TOKEN = "RAYPULSE_PROGRESS_TOKEN"  # the attempt's progress token (progress_token below)
CHECKPOINT_MARKER = "raypulse-checkpoint.json"  # in the checkpoint dir: the latest checkpoint (step, path, time)
ENV_CLUSTER_TAG = "RAYPULSE_CLUSTER_TAG"  # every process of a local cluster carries it (teardown finds them)
ENV_HOME = "RAYPULSE_HOME"  # the launcher's state directory (default ~/.raypulse)
ENV_EXPORTER_PREFIX = "RAYPULSE_EXPORTER_"  # the exporter's settings, e.g. RAYPULSE_EXPORTER_LISTEN
ENV_GPU_CONTROL_FILE = "RAYPULSE_EXPORTER_GPU__CONTROL_FILE"  # the simulated GPUs' fault-injection file

# --- RL post-training reports (progress.phase / progress.report_iteration; the endpoint checks the same) --
RL_NAME_MAX_LENGTH = 40
RL_NAME_PATTERN = rf"^[A-Za-z0-9_.:-]{{1,{RL_NAME_MAX_LENGTH}}}$"  # a phase or reward-source name (a label value)
RL_MAX_PHASES = 16  # named phases per rank
RL_MAX_SOURCES = 16  # reward sources per rank
RL_WEIGHT_SYNC_PHASE = "weight_sync"  # a phase of this name also gives the iteration's weight-sync time

# --- fault classes of the launcher's health watcher (the exporter counts recoveries by them) -------
FAULT_HANG = "hang"
FAULT_GPU = "gpu_fault"
FAULT_NODE_LOST = "node_lost"
FAULT_NONFINITE_LOSS = "nonfinite_loss"
FAULT_CLASSES = (FAULT_HANG, FAULT_GPU, FAULT_NODE_LOST, FAULT_NONFINITE_LOSS)
# Where a launcher run's wall time went (launcher/ledger.py): the `cause` of raypulse_run_time_seconds.
RUN_TIME_CAUSES = ("productive", "queued", "provisioning", "startup", "detecting", "stopping", "backoff", "redone",
                   "checkpoint_stall", "lost_to_end")

# --- `launcher exporters deploy`: its named actors, which the head exporter's /sd reads -----------
DEPLOY_NAMESPACE = "raypulse"
DEPLOY_SUPERVISOR = "supervisor"
DEPLOY_NODE_ACTOR_PREFIX = "exporter-"
DEPLOY_RESULT_MARKER = "RAYPULSE_AGENT_RESULT "  # the agent's last log line: this marker, then JSON


def node_actor_name(node_id: str, port: int) -> str:
    """The deploy agent's actor on a node; the port travels in the name (node labels are fixed at start)."""
    return f"{DEPLOY_NODE_ACTOR_PREFIX}{node_id}-{port}"


def parse_node_actor_name(name: str) -> tuple[str, int] | None:
    """(node id, exporter port) of a node actor's name, or None for any other name."""
    if not name.startswith(DEPLOY_NODE_ACTOR_PREFIX):
        return None
    node_id, _, port = name.removeprefix(DEPLOY_NODE_ACTOR_PREFIX).rpartition("-")
    if node_id and port.isdigit() and 0 < int(port) < 65536:
        return node_id, int(port)
    return None


# --- the Ray auth token, found where Ray looks for it ---------------------------------------------
ENV_RAY_AUTH_MODE = "RAY_AUTH_MODE"
ENV_RAY_AUTH_TOKEN = "RAY_AUTH_TOKEN"
ENV_RAY_AUTH_TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"

# --- where Ray's clients find a cluster (`ray job submit` reads the first, then the second) -------
ENV_RAY_API_SERVER_ADDRESS = "RAY_API_SERVER_ADDRESS"  # a dashboard URL (Jobs API)
ENV_RAY_ADDRESS = "RAY_ADDRESS"  # a dashboard URL, or a GCS address (head:6379, auto) for ray.init


# A token goes into an Authorization header: one line of printable ASCII. Anything else (a second line, a
# control character) would make the HTTP client refuse the header with the token in its error message.
_TOKEN = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
NOT_A_TOKEN = ("holds more than one line, or characters a token cannot have (not shown: it is a credential); "
               "the token goes alone on one line")


class RayTokenUnreadable(OSError):
    """The token file that was named (or found) cannot be read, or what it (or RAY_AUTH_TOKEN: path None)
    holds is not a token."""

    def __init__(self, path: Path | None, source: str, reason: str) -> None:
        super().__init__(f"cannot read the Ray auth token file {path} ({source}): {reason}" if path is not None
                         else f"cannot use the Ray auth token of {source}: {reason}")
        self.path = path
        self.source = source  # which setting named the file
        self.reason = reason


_file_cache: dict[Path, tuple[float, str | None]] = {}


def _read_token_file(path: Path, source: str) -> str | None:
    """The file's token, re-read only when its mtime changes (callers ask on every request)."""
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        if source == "~/.ray/auth_token":
            return None  # the fallback is optional
        raise RayTokenUnreadable(path, source, "no such file") from None
    except OSError as exc:
        raise RayTokenUnreadable(path, source, exc.strerror or str(exc)) from None
    cached = _file_cache.get(path)
    if cached is None or cached[0] != mtime:
        try:
            cached = (mtime, path.read_text().strip() or None)
        except (OSError, UnicodeDecodeError) as exc:
            raise RayTokenUnreadable(path, source, getattr(exc, "strerror", None) or str(exc)) from None
        if cached[1] is not None and not _TOKEN.fullmatch(cached[1]):
            raise RayTokenUnreadable(path, source, NOT_A_TOKEN)
        _file_cache[path] = cached
    return cached[1]


def ray_auth_token(environ: Mapping[str, str] = os.environ, home: Path | None = None,
                   token_path: Path | None = None) -> str | None:
    """The Ray auth token for `Authorization: Bearer`, or None when there is none to send.

    Order as Ray reads it (its token-authentication docs): an explicit `token_path` (the
    launcher's --token-path) first, then RAY_AUTH_MODE=disabled (none), RAY_AUTH_TOKEN, the file
    named by RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token. Raises RayTokenUnreadable when a file
    that was named cannot be read, or the token found is not one line of printable ASCII."""
    if token_path is not None:
        return _read_token_file(token_path.expanduser(), "token_path")
    if environ.get(ENV_RAY_AUTH_MODE, "").strip().lower() == "disabled":
        return None
    token = environ.get(ENV_RAY_AUTH_TOKEN, "").strip()
    if token:
        if not _TOKEN.fullmatch(token):
            raise RayTokenUnreadable(None, ENV_RAY_AUTH_TOKEN, NOT_A_TOKEN)
        return token
    if environ.get(ENV_RAY_AUTH_TOKEN_PATH):
        return _read_token_file(Path(environ[ENV_RAY_AUTH_TOKEN_PATH]).expanduser(), ENV_RAY_AUTH_TOKEN_PATH)
    return _read_token_file((home or Path.home()) / ".ray" / "auth_token", "~/.ray/auth_token")


# --- the progress endpoint's per-job token ------------------------------------------------------------
# A report names whose progress it is (a submission id, else a Ray job id; a launcher run for kind
# "run"); where Ray token authentication is on, the endpoint accepts it only with the token for that
# owner: HMAC-SHA256(Ray token, "<kind>:<id>"). The launcher hands each attempt its token; a process
# that can read the Ray token could act as the whole cluster anyway, so it may derive one itself.
PROGRESS_OWNER_KINDS = ("submission", "job", "run")


def progress_owner(kind: str, run_id: str | None, submission_id: str | None, job_id: str | None) -> tuple[str, str]:
    """Whose progress a report is: its run for kind "run", else its submission id, else its Ray job id."""
    if kind == "run":
        return "run", run_id or ""
    if submission_id:
        return "submission", submission_id
    return "job", job_id or ""


def progress_token(key: str, owner_kind: str, owner_id: str) -> str:
    """The token for one owner, hex; `key` is the Ray auth token."""
    if owner_kind not in PROGRESS_OWNER_KINDS:
        raise ValueError(f"owner kind must be one of {PROGRESS_OWNER_KINDS}, not {owner_kind!r}")
    message = f"raypulse-progress/{owner_kind}:{owner_id}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()
