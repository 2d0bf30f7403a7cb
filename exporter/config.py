"""Exporter configuration: defaults < YAML file < environment < command-line flags.

Everything is validated by one pydantic model; a bad value fails start-up with a message that
names the field, where it came from, and what is expected.
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from exporter import profiles, userinput
from exporter.contract import strict, wire

DEFAULT_PORT = wire.EXPORTER_PORT
ENV_PREFIX = wire.ENV_EXPORTER_PREFIX
UNKNOWN_SETTING = "unknown setting (check the spelling; see `exporter serve --help` and docs/configuration.md)"


class ConfigError(Exception):
    """Invalid configuration; the message is meant for the person who wrote it."""


@dataclass(frozen=True)
class Known:
    """The names a configuration may use that live outside it: the registered collectors and the
    simulator's GPU models. The configuration imports neither (it is a leaf); whoever loads it
    passes them (exporter/plugins.py), and without them the names are not checked."""


    collectors: frozenset[str]
    gpu_models: tuple[str, ...]  # upper case, e.g. H100


class _Strict(strict.Strict):
    model_config = ConfigDict(frozen=True)


# The shortest interval a collector runs at, as `launcher exporters deploy --interval` and the health
# checks take it: 1e-9 s kept a core and more busy collecting (issue 41; docs/security.md).
MIN_INTERVAL_SECONDS = 0.5


class CollectorSettings(_Strict):
    enabled: bool | None = Field(None, description="Run this collector; unset means its default.")
    interval_seconds: float | None = Field(None, ge=MIN_INTERVAL_SECONDS, le=3600,
                                           description=f"Seconds between runs ({MIN_INTERVAL_SECONDS:g} to 3600).")
    deadline_seconds: float | None = Field(None, gt=0, le=3600,
                                           description="A run taking longer counts as a timeout.")


class NodeSettings(_Strict):
    procfs: Path = Field(Path("/proc"), description="Where procfs is mounted (the host's, in a container).")
    sysfs: Path = Field(Path("/sys"), description="Where sysfs is mounted.")
    rootfs: Path = Field(Path("/"), description="Prefix for statvfs on mount points (host root in a container).")
    name: str | None = Field(None, description="Node name reported in raypulse_node_info; default the hostname.")
    checkpoint_paths: tuple[Path, ...] = Field((), description="Directories holding checkpoints; "
                                               "their volumes are always watched.")
    ray_temp_dir: Path = Field(Path("/tmp/ray"), description="Ray's temp/spill directory; its volume is watched.")
    object_store_dir: Path = Field(Path("/dev/shm"), description="Ray's object store (plasma) directory.")
    filesystem_exclude_fstypes: str = Field(
        r"^(autofs|binfmt_misc|bpf|cgroup2?|configfs|debugfs|devpts|devtmpfs|fusectl|hugetlbfs|iso9660|"
        r"mqueue|nsfs|proc|procfs|pstore|rpc_pipefs|securityfs|selinuxfs|squashfs|erofs|sysfs|tracefs|"
        r"ramfs|efivarfs)$",
        description="Regex of filesystem types never reported (unless they hold a watched path).")
    filesystem_exclude_mountpoints: str = Field(
        r"^/(dev|proc|run/credentials/.+|sys|var/lib/docker/.+|var/lib/containers/storage/.+|"
        r"var/lib/kubelet/pods/.+|snap/.+)($|/)",
        description="Regex of mount points never reported (unless they hold a watched path).")
    filesystem_stat_timeout_seconds: float = Field(2.0, gt=0, le=60,
                                                   description="A statvfs taking longer marks the mount stuck.")
    disk_exclude_devices: str = Field(r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]+|nvme\d+n\d+p|sr)\d+$",
                                      description="Regex of block devices never reported (partitions, loops).")
    network_exclude_interfaces: str = Field(
        r"^(lo|veth.*|cali.*|docker\d*|br-.*|virbr.*|flannel.*|cni.*|tunl\d*|vxlan.*|kube-ipvs\d*)$",
        description="Regex of network interfaces never reported.")

    @field_validator("filesystem_exclude_fstypes", "filesystem_exclude_mountpoints", "disk_exclude_devices",
                     "network_exclude_interfaces")
    @classmethod
    def _is_regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return value


class PodSettings(_Strict):
    cgroupfs: Path = Field(Path("/sys/fs/cgroup"), description="Where the cgroup hierarchy is mounted.")
    cgroup_path: str | None = Field(None, description="Cgroup to measure, relative to the hierarchy; "
                                    "default: this process's own, widened to its Kubernetes pod.")


class GpuSettings(_Strict):
    simulate: int = Field(0, ge=0, le=64, description="Simulate this many GPUs instead of reading NVML "
                          "(docs/gpu-simulation.md); 0: the real GPUs. Simulated series say simulated=\"true\".")
    simulate_model: str = Field("H100", description="Model of the simulated GPUs: H100, H200, B200, A100, V100 "
                                "or RTX6000ADA.")
    control_file: Path | None = Field(None, description="JSON file that injects faults into the simulated GPUs "
                                      "at run time (written by `exporter gpu-fault`).")
    init_retry_max_seconds: float = Field(300.0, gt=0, le=86400, description="Longest wait between NVML "
                                          "initialization attempts while they fail (the wait doubles from 1 s).")
    static_refresh_seconds: float = Field(300.0, gt=0, le=86400, description="Seconds between re-reads of what "
                                          "rarely changes (limits, maxima) and re-probes of unsupported calls.")
    max_process_series: int = Field(32, ge=0, le=4096, description=(
        "Most (GPU, process) pairs of the node exported as per-process series (a `pid` label each, which churns "
        "with every restart), the largest device memory first; 0: none. raypulse_gpu_processes and the Ray "
        "job attribution count every process either way."))

    pod_resources_socket: Path | None = Field(Path(wire.POD_RESOURCES_SOCKET), description=(
        "The kubelet's pod-resources gRPC socket, read for the pod, namespace and container holding each GPU "
        "(used when it exists; empty or null: off). An exporter whose own pod (POD_NAME/POD_NAMESPACE) holds GPUs "
        "reports only those."))
    pod_resources_refresh_seconds: float = Field(10.0, gt=0, le=3600, description="Seconds between reads of "
                                                 "the pod-resources API; GPU owners are cached in between.")
    pod_resources_timeout_seconds: float = Field(2.0, gt=0, le=30, description="Deadline of one pod-resources "
                                                 "call; past it the GPU series go without pod labels.")

    @field_validator("simulate_model")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.upper()

    @field_validator("pod_resources_socket", mode="before")
    @classmethod
    def _empty_is_off(cls, value: object) -> object:
        return None if value == "" else value  # an env var cannot say null


class OtlpSettings(_Strict):
    endpoint: str | None = Field(None, pattern=r"^https?://", description=(
        "OTLP/HTTP base URL (http://collector:4318; /v1/metrics is added) to push every metric to; "
        "unset: the standard OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT variables decide, none means no push."))
    interval_seconds: float = Field(15.0, ge=1, le=3600, description="Seconds between OTLP pushes (1 to 3600).")
    timeout_seconds: float = Field(10.0, gt=0, le=300, description="An OTLP push taking longer is dropped.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers (e.g. an API key) "
                                    "for the OTLP endpoint; OTEL_EXPORTER_OTLP_HEADERS works too.")

    def url(self, environ: Mapping[str, str]) -> str | None:
        """Where to push, or None when OTLP is off. `endpoint` is a base URL like
        OTEL_EXPORTER_OTLP_ENDPOINT (/v1/metrics is added) unless it already names the path."""
        if self.endpoint:
            return signal_url(self.endpoint, "/v1/metrics")
        if environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
            return environ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]
        if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            return signal_url(environ["OTEL_EXPORTER_OTLP_ENDPOINT"], "/v1/metrics")
        return None


def signal_url(base: str, path: str) -> str:
    """An OTLP base URL with a signal's path (/v1/metrics, /v1/traces) added to its path, unless
    it already ends with it; a query (an API key) stays after the path, where it belongs."""
    parts = urlsplit(base)
    prefix = parts.path.rstrip("/")
    return urlunsplit(parts._replace(path=prefix if prefix.endswith(path) else prefix + path))


LISTEN_OFF = "off"
_LABEL_VALUE = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$"


# An actor's part in an RL run (or any Ray workload), from the class name Ray gives its tasks: the last
# part of the qualified name (verl's WorkerDict, a class made inside a function, is "WorkerDict"). First
# match wins, so the narrow roles go first and verl's ActorRolloutRefWorker (the policy's trainer, with its
# rollout and reference) is no generator. Names from each framework's source:
# - verl 0.8.0.dev (b178a3c): workers/fsdp_workers.py and megatron_workers.py (ActorRolloutRefWorker,
#   CriticWorker, RewardModelWorker), workers/engine_workers.py (TrainingWorker), single_controller/ray/
#   base.py (WorkerDict, FusedWorker), workers/rollout/*_async_server.py (vLLMHttpServer, SGLangHttpServer,
#   TRTLLMHttpServer), experimental/agent_loop (AgentLoopWorker), experimental/reward_loop (RewardLoopWorker);
# - OpenRLHF 0.11.0 (3c3be62): trainer/ray/ (PolicyModelActor, ReferenceModelActor, RewardModelActor,
#   CriticModelActor, RolloutRayActor; LLMRayActor before it), trainer/ppo_trainer_async.py
#   (GenerateSamplesActor, TrainingActor);
# - Ray 2.60: Train's RayTrainWorker, RLlib's EnvRunners and _WrappedExecutable (how its LearnerGroup runs
#   its Learners). TRL under Ray Train runs in RayTrainWorkers.
DEFAULT_ACTOR_ROLES = {
    "reference": r"(?i)reference",
    "reward": r"(?i)reward",
    "critic": r"(?i)critic",
    "generator": r"(?i)generat|rollout(?!ref)|sampler|env_?runner|inference|vllm|llm_?engine|llmrayactor|sglang"
                 r"|trtllm|agentloop",
    "trainer": r"(?i)trainer|learner|train(?:ing)?_?(?:worker|actor)|policymodel|actorrolloutref|workerdict"
               r"|fusedworker|wrappedexecutable|fsdp|megatron|deepspeed",
}
MAX_ACTOR_ROLES = 8
ACTOR_ROLE_NAME = r"[a-z][a-z0-9_]{0,31}"


class RaySettings(_Strict):
    dashboard_url: str | None = Field(None, pattern=r"^https?://[^\s/]+/?$", description=(
        "Ray dashboard base URL (http://head:8265); the Ray token is sent there. Unset: the dashboard a raylet "
        "of this host names, else http://127.0.0.1:8265; the token then goes only to a dashboard on this host's "
        "own address, named by a raylet that is Ray's own binary run by this exporter's user or root, and "
        "served by that user or root (never to another host's dashboard: name that one here). The token "
        "comes from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, as Ray reads it."))
    node_id: str | None = Field(None, pattern=r"^[0-9a-f]{56}$", description=(
        "Watch only this Ray node (its hex id): for several Ray nodes on one host whose raylets carry no "
        "exporter-port label (`launcher exporters deploy` passes it). Unset: the raylets labelled with this "
        "exporter's port, else every unlabelled raylet of the host (only those of this host's own address "
        "once one was seen: hosts in network namespaces that share a process table)."))
    role: str = Field("auto", pattern=r"^(auto|head|worker)$", description=(
        "head: also export cluster-wide job, node and workload metrics and serve /sd; worker: only this "
        "node's Ray processes; auto: head when this host runs the head raylet, Ray's own binary run by this "
        "exporter's user or root (checked every run)."))
    metrics_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/\S*)?$", description=(
        "Ray's metrics endpoint on the head node (http://head:8080/metrics, the head's --metrics-export-port), "
        "where the head exporter reads the GCS's own `ray_actors` gauge for the cluster's actors by state: "
        "exact at any number of actors, where the State API stops at 10,000 rows. No token is sent there. "
        "Unset: the metrics port of the head raylet on this host (its command line), else the actors are "
        "counted through the State API."))
    discover_metrics_agents: bool = Field(True, description=(
        "On the head, list every Ray node's metrics agent at /sd/ray (from the discovery file Ray's dashboard "
        "writes in its session directory), labelled like the node's exporter, for a Prometheus scrape job "
        "named `ray`: what runs on the nodes reports there through ray.util.metrics, vLLM's engines in an RL "
        "run among them. Turn it off where Ray's own file discovery or a PodMonitor already scrapes them."))
    request_timeout_seconds: float = Field(3.0, gt=0, le=60, description="A dashboard request taking longer "
                                           "fails (and the series it feeds are omitted for that run).")
    finished_job_retention_seconds: float = Field(3600.0, ge=0, le=30 * 86400, description=(
        "Finished jobs stay exported this long after they end, then their series go away."))
    max_finished_jobs: int = Field(100, ge=0, le=10000, description="At most this many finished jobs "
                                   "(the most recent) are exported; running and pending jobs always are.")
    actor_roles: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_ACTOR_ROLES), description=(
        "Role -> regular expression searched in an actor's class name (first match wins): the `actor_role` "
        "label of the raypulse_job_process_* families and the raypulse_job_role_gpu_* families, the RL "
        "board's generator vs trainer view. At most 8 roles, named like `generator`; an actor matching "
        "none has no role."))

    @field_validator("actor_roles")
    @classmethod
    def _valid_roles(cls, roles: dict[str, str]) -> dict[str, str]:
        if len(roles) > MAX_ACTOR_ROLES:
            raise ValueError(f"at most {MAX_ACTOR_ROLES} roles (got {len(roles)}): merge some patterns")
        for role, pattern in roles.items():
            if not re.fullmatch(ACTOR_ROLE_NAME, role):
                raise ValueError(f"role {role!r}: a role is lower case letters, digits and _ (e.g. generator)")
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"role {role!r}: {pattern!r} is not a regular expression ({error})") from None
        return roles


class ProgressSettings(_Strict):
    listen: str = Field(f"127.0.0.1:{wire.PROGRESS_PORT}", description=(
        "Where training code reports progress (exporter.progress): HOST:PORT, unix:/path/to.sock, or off. "
        "Only loopback or a Unix socket unless allow_remote."))
    allow_remote: bool = Field(False, description="Allow a progress listen address other than loopback.")
    max_body_bytes: int = Field(65536, ge=1024, le=16 * 1024 * 1024, description="Largest report batch "
                                "accepted (bytes); larger ones get 413.")
    max_jobs: int = Field(64, ge=1, le=10000, description="Most jobs with progress series at once; a report "
                          "for one more gets 429 until one expires.")
    max_ranks_per_job: int = Field(1024, ge=1, le=100000, description="Most ranks (series sets) per job; a "
                                   "report for one more gets 429.")
    expire_after_seconds: float = Field(3600.0, gt=0, le=30 * 86400, description=(
        "A rank that has not reported for this long is dropped (a job with no rank left too)."))
    max_series: int = Field(10000, ge=100, le=1_000_000, description=(
        "Most series the progress store holds, all jobs, ranks and runs together (about 18 per rank): the "
        "one bound on its memory and on the size of /metrics. A report that would pass it gets 429, after "
        "jobs Ray no longer runs have been let go."))
    max_job_share: float = Field(0.5, ge=0.1, le=1, description=(
        "The part of max_series one job's ranks may hold (0.5: half), so that one job reporting many ranks "
        "or RL phases cannot fill the store and keep every other job out; a report that would take its job "
        "past it gets 429. 1 lets one job hold the whole store."))
    finished_grace_seconds: float = Field(300.0, ge=0, le=86400, description=(
        "A job Ray says has ended, or does not know, keeps its progress series this long after its last "
        "report, then they go (long before expire_after_seconds)."))
    token: str = Field("auto", pattern=r"^(auto|required|off)$", description=(
        "Whether a report must carry its job's token (wire.progress_token, derived from the Ray auth token; "
        "the launcher hands it to every attempt): auto = when this exporter can read a Ray auth token, "
        "required = always (start fails without a token), off = never."))

    @property
    def max_series_per_job(self) -> int:
        return int(self.max_series * self.max_job_share)

    @field_validator("listen")
    @classmethod
    def _is_listen(cls, value: str) -> str:
        if value == LISTEN_OFF or value.startswith("unix:"):
            if value.startswith("unix:") and not value.removeprefix("unix:").startswith("/"):
                raise ValueError("a Unix socket is unix:/absolute/path")
            return value
        parse_listen(value)
        return value

    @model_validator(mode="after")
    def _loopback_unless_allowed(self) -> ProgressSettings:
        if self.listen == LISTEN_OFF or self.listen.startswith("unix:") or self.allow_remote:
            return self
        host, _ = parse_listen(self.listen)
        if host != "localhost" and not _is_loopback(host):
            raise ValueError(f"listen: {self.listen!r} is not loopback; training code on other hosts could "
                             "write metrics. Use 127.0.0.1, a unix: socket, or set progress.allow_remote")
        return self


class NodeExporterSettings(_Strict):
    """node_exporter on every node, beside this exporter (exporter/profiles.py)."""

    discover: bool | None = Field(None, description=(
        "List every node's node_exporter in the head's /sd (its IP and `port`, the `cluster`, `node`, `role` "
        "and `ray_node_id` labels of the node's exporter, and `job` set to `node_exporter.job`), so the dashboards' "
        "node panels can read its series. "
        f"Unset: only in the {profiles.COMPANION} profile."))
    port: int = Field(wire.NODE_EXPORTER_PORT, ge=1, le=65535, description="The port node_exporter listens on, "
                      "the same on every node.")
    job: str = Field(wire.NODE_EXPORTER_JOB, pattern=_LABEL_VALUE, description=(
        "The `job` label of node_exporter's /sd targets (node-mixin selects job=\"node\"; raypulse's own "
        "targets keep the scrape job's name)."))


class HttpSettings(_Strict):
    """Bounds on what the clients of the exporter's HTTP ports may hold (exporter/serving/guard.py)."""

    max_connections: int = Field(256, ge=4, le=65536, description=(
        "Most open connections at once, /metrics and progress ports together (never more than a quarter "
        "of the process's file descriptor limit); one more is answered 503 and closed."))
    max_requests: int = Field(40, ge=1, le=10000, description=(
        "Most /metrics scrapes served at once (node_exporter's --web.max-requests); more get 503."))
    idle_timeout_seconds: float = Field(30.0, gt=0, le=3600, description=(
        "A client must send a whole request header within this long of connecting or of its previous "
        "request, and a progress report's whole body within this long of its header (else 408); an idle "
        "keep-alive connection is closed after it. At the connection cap, a connection silent for a second, "
        "then the one the longest in its header, is dropped to make room."))
    write_timeout_seconds: float = Field(30.0, gt=0, le=3600, description=(
        "A client that reads none of a response for this long is disconnected."))


def _is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ExporterConfig(strict.Strict):
    """The whole configuration; the YAML file has the same shape, and so do the RAYPULSE_EXPORTER_*
    variables (`__` nests; see _environment_values)."""

    model_config = ConfigDict(frozen=True, validate_default=True)

    listen: str = Field(f"0.0.0.0:{DEFAULT_PORT}", description="HOST:PORT the HTTP server listens on.")
    web_config_file: Path | None = Field(None, description="TLS and basic auth, exporter-toolkit format.")
    log_level: str = Field("info", pattern=r"^(debug|info|warning|error)$", description="Logging level.")
    stale_after_intervals: float = Field(3.0, ge=1, le=100,
                                         description="A collector's series are dropped when its last good "
                                                     "run is older than this many intervals.")
    profile: str = Field(profiles.DEFAULT, pattern=f"^({'|'.join(profiles.NAMES)})$", description=(
        "Which collectors run when not named under `collectors`: default (each its own default); "
        f"{profiles.COMPANION} (the default less what node_exporter's default collectors read too; see "
        "below); none (no collector, as node_exporter's --collector.disable-defaults). A collector turned on or "
        "off by name (`collectors.<name>.enabled`, a flag) is always as named."))
    collectors: dict[str, CollectorSettings] = Field(default_factory=dict,
                                                     description="Per-collector settings by name.")
    node: NodeSettings = Field(default_factory=NodeSettings)
    node_exporter: NodeExporterSettings = Field(default_factory=NodeExporterSettings)
    pod: PodSettings = Field(default_factory=PodSettings)
    gpu: GpuSettings = Field(default_factory=GpuSettings)
    otlp: OtlpSettings = Field(default_factory=OtlpSettings)
    cluster: str | None = Field(None, pattern=_LABEL_VALUE, description=(
        "Name of the Ray cluster: the `cluster` label of /sd targets, `cluster_name` of raypulse_ray_node_info."))
    ray: RaySettings = Field(default_factory=RaySettings)
    progress: ProgressSettings = Field(default_factory=ProgressSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)

    @field_validator("listen")
    @classmethod
    def _is_host_port(cls, value: str) -> str:
        parse_listen(value)
        return value

    def collector_settings(self, name: str) -> CollectorSettings:
        """The collector's settings; `enabled` unset means its own default unless the profile turns it off."""
        settings = self.collectors.get(name, CollectorSettings())
        if settings.enabled is None and profiles.turns_off(self.profile, name):
            return settings.model_copy(update={"enabled": False})
        return settings

    @property
    def discovers_node_exporter(self) -> bool:
        """Whether the head's /sd lists every node's node_exporter too."""
        discover = self.node_exporter.discover
        return profiles.discovers_node_exporter(self.profile) if discover is None else discover


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT` or `:PORT` (all interfaces) into (host, port)."""
    match = re.fullmatch(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})", value)
    if not match or not 0 <= int(match["port"]) < 65536:  # 0: any free port
        raise ValueError(f"expected HOST:PORT such as 127.0.0.1:{DEFAULT_PORT} or :{DEFAULT_PORT}, got {value!r}")
    host = match["v6"] or match["host"] or "0.0.0.0"
    return host, int(match["port"])


class YamlFileError(ConfigError):
    """A user's YAML file that is not a readable mapping. The message names the file; `problem` is
    what is wrong without it, `unreadable` the system's reason when the file could not be read."""

    def __init__(self, what: str, path: Path, problem: str, unreadable: str | None = None) -> None:
        super().__init__(f"{what} {path}: {problem}")
        self.problem = problem
        self.unreadable = unreadable


def read_yaml_file(path: Path, what: str, holds: str = "settings") -> dict[str, Any]:
    """The mapping in a user's YAML file (JSON is YAML too); an empty file is an empty mapping. Every
    user file goes through here (exporter and web configs, job specs, pod templates, runtime envs): one
    that is not a readable regular file within exporter/userinput.py's bounds (size, aliases, nesting),
    not UTF-8, not YAML or not a mapping (of `holds`) is a YamlFileError naming `what` and the file."""
    try:
        data = userinput.load_yaml(userinput.read_text(path))
    except userinput.InputError as exc:
        raise YamlFileError(what, path, exc.problem, unreadable=exc.unreadable) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise YamlFileError(what, path, f"the top level must be a mapping of {holds}, got {type(data).__name__}")
    return data


def load_config(flags: Mapping[str, Any] | None = None, config_file: Path | None = None,
                environ: Mapping[str, str] | None = None, known: Known | None = None) -> ExporterConfig:
    """Merge the sources (flags win, then environment, then file) and validate once; with `known`,
    collector and GPU model names are checked too."""
    file_values = read_yaml_file(config_file, "config file") if config_file else {}
    env_values = _environment_values(environ if environ is not None else os.environ)
    flag_values = dict(flags or {})
    merged = _deep_merge(_deep_merge(file_values, env_values), flag_values)
    sources = [("command-line flag", flag_values), (f"environment ({ENV_PREFIX}*)", env_values),
               (f"config file {config_file}", file_values)]
    try:
        config = ExporterConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, sources)) from None
    unknown = _unknown_names(config, known) if known is not None else []
    if unknown:
        raise ConfigError("\n".join(["invalid configuration:", *(
            f"  {'.'.join(loc)}: {message}{_from(loc, sources)}" for loc, message in unknown)]))
    return config


def _unknown_names(config: ExporterConfig, known: Known) -> list[tuple[list[str], str]]:
    """Names the configuration uses that nothing offers: (where, message) for each."""
    found = []
    unknown = sorted(set(config.collectors) - known.collectors)
    if unknown:
        found.append((["collectors"], f"unknown collector(s) {', '.join(unknown)}; known: "
                                      f"{', '.join(sorted(known.collectors))}"))
    if config.gpu.simulate_model not in known.gpu_models:
        found.append((["gpu", "simulate_model"], f"unknown simulated GPU model {config.gpu.simulate_model!r}; "
                                                 f"choose one of {', '.join(known.gpu_models)}"))
    return found


def format_validation_error(exc: ValidationError, sources: list[tuple[str, Mapping[str, Any]]]) -> str:
    """One line per problem: `field.path: message (from SOURCE)`."""
    lines = ["invalid configuration:"]
    for problem in strict.problems(exc, UNKNOWN_SETTING):
        loc = [str(part) for part in problem.loc]
        lines.append(f"  {'.'.join(loc) or '<top level>'}: {problem.message}{_from(loc, sources)}")
    return "\n".join(lines)


def _from(loc: list[str], sources: list[tuple[str, Mapping[str, Any]]]) -> str:
    origin = _origin(loc, sources)
    return f" (from {origin})" if origin else ""


def _origin(loc: list[str], sources: list[tuple[str, Mapping[str, Any]]]) -> str | None:
    """The source that set the field, or its closest parent (a missing field's section)."""
    for depth in range(len(loc), 0, -1):
        for name, values in sources:
            if _has_path(values, loc[:depth]):
                return name
    return sources[0][0] if len(sources) == 1 else None


def unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """RAYPULSE_EXPORTER_* variables whose first part names no setting: they are left out of the
    configuration, so whoever starts the exporter warns of them (a wrong name inside a section,
    RAYPULSE_EXPORTER_GPU__X, is refused by the model, naming the field)."""
    return sorted(name for name in environ if name.upper().startswith(ENV_PREFIX)
                  and name[len(ENV_PREFIX):].lower().split("__")[0] not in ExporterConfig.model_fields)


def _environment_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """The RAYPULSE_EXPORTER_* variables as the nested mapping a YAML file gives, for the same models to
    validate: names are case-insensitive, `__` nests (RAYPULSE_EXPORTER_NODE__PROCFS is node.procfs,
    RAYPULSE_EXPORTER_COLLECTORS__CPU__ENABLED is collectors.cpu.enabled), a setting that is a list, a
    mapping or a whole section takes JSON, and every other value stays a string that the model converts
    (as it converts the file's). A section given as JSON and some of its fields one by one are merged, the
    fields winning. Variables whose first part names no setting are left out (see unknown_environment)."""
    found = []
    for name, value in environ.items():
        if not name.upper().startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX):].lower().split("__")
        if path[0] not in ExporterConfig.model_fields:
            continue
        takes_json = _takes_json(_annotation_at(path))
        if takes_json:
            try:
                value = userinput.load_json(value)
            except userinput.InputError as exc:
                if takes_json == "must":
                    raise ConfigError(
                        f"invalid configuration in the environment: {name} ({'.'.join(path)}) is {exc.problem}; "
                        f"lists and mappings are JSON, e.g. {ENV_PREFIX}NODE__CHECKPOINT_PATHS='[\"/ckpt\"]'") from None
        found.append((path, value))
    values: dict[str, Any] = {}
    for path, value in sorted(found, key=lambda item: len(item[0])):  # a whole section first, then its fields
        for key in reversed(path):
            value = {key: value}
        values = _deep_merge(values, value)
    return values


def _annotation_at(path: list[str]) -> Any:
    """The type of the setting at `path` (through sections and mappings), None where no setting is."""
    annotation: Any = ExporterConfig
    for key in path:
        annotation = _without_none(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(key)
            if field is None:
                return None
            annotation = field.annotation
        elif get_origin(annotation) is dict:
            annotation = get_args(annotation)[1]
        else:
            return None
    return annotation


def _takes_json(annotation: Any) -> str:
    """Whether a value for this type is JSON: "must" for a list, mapping or section, "may" for a union
    with one among other types, "" otherwise."""
    members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    structured = [_is_structured(member) for member in members if member is not type(None)]
    return "" if not any(structured) else "must" if all(structured) else "may"


def _is_structured(annotation: Any) -> bool:
    origin = get_origin(annotation) or annotation
    return origin in (list, tuple, set, frozenset, dict) or (isinstance(origin, type) and issubclass(origin, BaseModel))


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        members = [member for member in get_args(annotation) if member is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = _deep_merge(result[key], value)
        else:
            result[key] = value
    return result


def _has_path(values: Mapping[str, Any], loc: list[str]) -> bool:
    current: Any = values
    for part in loc:
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, (list, tuple)) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return False
    return True
