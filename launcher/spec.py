"""The job spec: what to run, on what cluster, with which retries and deadlines.

One pydantic model is the single description of a job. `launcher submit -f job.yaml` loads it from
YAML, the command-line options fill the same fields (flags.SPEC_OPTIONS maps each option to its field),
and every backend reads only this model. Validation errors name the field (`worker_groups[0].cpus`).
"""

from __future__ import annotations

import getpass
import importlib.metadata
import re
import secrets
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from exporter.config import ConfigError, read_yaml_file
from exporter.contract import strict, wire
from exporter.contract.strict import Strict
from launcher import submission
from launcher.backends import kinds
from launcher.entrypoint import EntrypointError, validate_entrypoint
from launcher.errors import BadInput
from launcher.health.policy import HealthPolicy
from launcher.runtime_env import NOT_TAKEN, RuntimeEnv, check_remote_package, is_remote

# Kubernetes DNS-1035 label (KubeRay's rule for RayJob names): names travel into RayJob, pod and
# service names and into Ray submission ids.
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# Label keys become Prometheus label names (`label_<key>`) and `raypulse.io/<key>` pod labels.
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# Label values must also be valid Kubernetes label values.
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
MAX_LABELS = 16
MAX_RUN_ID = 47  # KubeRay's MaxRayJobNameLength (53 for a RayCluster name, minus the 6 it appends)
MAX_NAME = MAX_RUN_ID - 9  # a new run's id is <name>-<8 hex>
RESERVED_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory"}

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


class SpecError(BadInput):
    """A job spec that cannot be used; the message names the field and what is wrong."""


def parse_memory(value: Any) -> int | None:
    """Bytes from `4Gi`, `512Mi`, `2G`, `1.5Gi` or a plain number of bytes."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]i?)?[bB]?\s*", str(value))
    if not match:
        raise ValueError(f"{value!r} is not a memory size; use bytes or a unit such as 512Mi, 4Gi, 2G")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


def format_memory(size: int) -> str:
    """The Kubernetes quantity for a size in bytes: `4Gi` when it divides evenly, else bytes."""
    for suffix in ("Ti", "Gi", "Mi", "Ki"):
        unit = _UNITS[suffix.lower()]
        if size % unit == 0 and size >= unit:
            return f"{size // unit}{suffix}"
    return str(size)


# ge on the int alone: on `int | None` pydantic would apply it to None too (a TypeError, not an error).
Memory = Annotated[Annotated[int, Field(ge=0)] | None, BeforeValidator(parse_memory)]
Resources = dict[str, Annotated[float, Field(ge=0)]]


def _check_resources(resources: dict[str, float]) -> dict[str, float]:
    for name in resources:
        if name in RESERVED_RESOURCES:
            raise ValueError(f"{name!r} has its own field (cpus, gpus, memory); custom resources are other names")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.:/-]{0,62}", name):
            raise ValueError(f"{name!r} is not a resource name (a letter, then letters, digits, _ . : / -)")
    return resources


# What an HTTP client sends as a header without refusing it (a refusal's error would quote the value, which
# may be a credential): a name is an RFC 9110 token, a value printable Latin-1 (tabs inside allowed),
# with no line break, control character or whitespace at either end.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_HEADER_VALUE = re.compile(r"(?:[\x21-\x7e\xa1-\xff](?:[\t\x20-\x7e\xa0-\xff]*[\x21-\x7e\xa1-\xff])?)?")


def check_headers(headers: dict[str, str]) -> dict[str, str]:
    """--headers as an HTTP client can send them; an error names the header, never its value."""
    for number, (name, value) in enumerate(headers.items(), 1):
        if not _HEADER_NAME.fullmatch(name):
            raise ValueError(f"header {number}'s name is not an HTTP header name (letters, digits and "
                             "!#$%&'*+-.^_`|~); fix it in --headers")
        if not _HEADER_VALUE.fullmatch(value):
            raise ValueError(f"the value of header {name!r} has a line break, a control character, a character "
                             "outside Latin-1 or whitespace at an end (not shown: it may be a credential); fix it "
                             "in --headers")
    return headers


def _dns_label(value: str, limit: int) -> str:
    if not DNS_LABEL.fullmatch(value) or len(value) > limit:
        raise ValueError(f"{value!r} must start with a letter, then lowercase letters, digits or '-', end "
                         f"alphanumeric, at most {limit} characters")
    return value


class _Strict(Strict):
    # Every number of a spec is finite, from a flag or a file: `inf` CPUs raised OverflowError in the
    # renderers and 1e309 GPUs rendered `.inf` into the KubeRay manifest (issue 41).
    model_config = ConfigDict(validate_assignment=True, allow_inf_nan=False)


class HeadSpec(_Strict):
    """The head node. It only runs the driver: Ray sees 0 CPUs and 0 GPUs there in every backend;
    cpus/memory size its container on Kubernetes, resources are custom logical resources on it."""

    cpus: float = Field(1, gt=0, description="CPUs of the head container (Kubernetes)")
    memory: Memory = Field(2 * 2**30, description="memory of the head container (Kubernetes)")
    resources: Resources = Field(default_factory=dict, description="custom logical resources on the head")

    @field_validator("resources")
    @classmethod
    def _resource_names(cls, value: dict[str, float]) -> dict[str, float]:
        return _check_resources(value)


def _pod_template(value: Any) -> Any:
    """A PodTemplateSpec as users write it (metadata, spec), inline or in a YAML file."""
    if isinstance(value, (str, Path)):
        try:
            value = read_yaml_file(Path(value).expanduser(), "pod template", holds="metadata and spec")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("a PodTemplateSpec is a mapping with metadata and spec "
                         "(`kubectl explain podtemplate.template`)")
    unknown = sorted(set(value) - {"metadata", "spec"})
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; a PodTemplateSpec has metadata and spec "
                         "(`kubectl explain podtemplate.template`)")
    for key in ("metadata", "spec"):
        if not isinstance(value.get(key, {}), dict):
            raise ValueError(f"{key} must be a mapping")
    containers = value.get("spec", {}).get("containers", [])
    if not isinstance(containers, list) or not all(isinstance(c, dict) and c.get("name") for c in containers):
        raise ValueError("spec.containers: a list of containers, each with a name (`ray` merges into the Ray "
                         "container)")
    return value


PodTemplate = Annotated[dict[str, Any] | None, BeforeValidator(_pod_template)]


class WorkerGroup(_Strict):
    """A group of identical workers; their Ray logical resources equal what they are given."""

    name: str = Field("workers", description="group name (a DNS label)")
    count: int = Field(1, ge=0, le=1000, description="number of workers")
    cpus: float = Field(1, gt=0, description="CPUs per worker")
    gpus: int = Field(0, ge=0, description="GPUs per worker")
    memory: Memory = Field(None, description="memory per worker (bytes or 4Gi)")
    resources: Resources = Field(default_factory=dict, description="custom logical resources per worker")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Kubernetes node labels this group's "
                                          "pods must match (as `kubectl ray`'s --node-selectors)")
    pod_template: PodTemplate = Field(None, description="PodTemplateSpec (YAML file or mapping) merged into this "
                                      "group's pods over the job's pod_template (Kubernetes)")

    @field_validator("resources")
    @classmethod
    def _resource_names(cls, value: dict[str, float]) -> dict[str, float]:
        return _check_resources(value)

    @field_validator("name")
    @classmethod
    def _dns(cls, value: str) -> str:
        return _dns_label(value, 30)


def _default_user() -> str:
    user = re.sub(r"[^A-Za-z0-9_.-]", "-", getpass.getuser()).strip("-_.")[:63]
    return user or "unknown"


def _default_image() -> str:
    return f"rayproject/ray:{importlib.metadata.version('ray')}"


class JobSpec(_Strict):
    """A Ray training job and where it runs. See README's launcher section for every field."""

    name: str = Field("job", description="job name (lowercase DNS label)")
    entrypoint: str = Field(description="one shell command line")
    working_dir: str | None = Field(None, description="local directory uploaded with the job, or a remote URI")
    runtime_env: RuntimeEnv = Field(default_factory=RuntimeEnv)
    head: HeadSpec = Field(default_factory=HeadSpec)
    worker_groups: list[WorkerGroup] = Field(default_factory=lambda: [WorkerGroup()])
    max_retries: int = Field(3, ge=0, le=100, description="new attempts after a failed or unhealthy one (one "
                             "budget for both); a run failing the same way twice stops early")
    retry_backoff_seconds: float = Field(10, ge=0, description=(
        "wait before the first retry; doubles with each failure in a row (none after a faulty node was taken out)"))
    retry_backoff_max_seconds: float = Field(300, ge=0, description="longest wait between attempts")
    active_deadline_seconds: int | None = Field(None, ge=1, description="stop the job after this long overall")
    pre_running_deadline_seconds: int | None = Field(None, ge=1, description="stop an attempt not RUNNING by then")
    workspace: str = Field("default", description="workspace label")
    user: str = Field(default_factory=_default_user, description="user label (default: the login name)")
    labels: dict[str, str] = Field(default_factory=dict, description="other bounded labels")
    image: str = Field(default_factory=_default_image, description="container image (Kubernetes)")
    run_id: str | None = Field(None, description="idempotency key of the run; attempts are <run_id>-a<N>")
    submission_id: str | None = Field(None, description="Ray submission id of the first attempt (as `ray job submit "
                                      "--submission-id`); attempt N>1 is <submission_id>-a<N>. Without run_id it "
                                      "is also the idempotency key: the run id is derived from it "
                                      "(launcher/submission.py)")
    metadata: dict[str, str] = Field(default_factory=dict, description="Ray job metadata (as `ray job submit "
                                     "--metadata-json`), beside the raypulse.* keys the launcher sets (reserved)")
    entrypoint_num_cpus: float | None = Field(None, ge=0, description="CPUs reserved for the entrypoint (driver)")
    entrypoint_num_gpus: float | None = Field(None, ge=0, description="GPUs reserved for the entrypoint (driver)")
    entrypoint_memory: int | None = Field(None, ge=0, description="memory in bytes reserved for the entrypoint "
                                          "(local, existing: a RayJob has no field for it)")
    entrypoint_resources: dict[str, float] = Field(default_factory=dict, description="custom resources reserved "
                                                   "for the entrypoint (NAME: quantity)")
    # Headers may carry credentials: kept out of the run's record (exclude) and out of reprs.
    headers: dict[str, str] | None = Field(None, exclude=True, repr=False, description="HTTP headers of the "
                                           "launcher's calls to an existing cluster's dashboard (never recorded)")
    verify: bool | str | None = Field(None, description="TLS verification of an existing cluster's dashboard: "
                                      "true, false, or a CA bundle file or directory (default: true)")
    log_style: Literal["auto", "record", "pretty"] = Field("auto", description="the launcher's own lines, as "
                                                           "`ray job submit --log-style`: pretty, record (plain), "
                                                           "auto (pretty on a terminal)")
    log_color: Literal["auto", "false", "true"] = Field("auto", description="colour the launcher's lines, as "
                                                        "`ray job submit --log-color`; auto: on a terminal")
    backend: str | None = Field(None, description="local (default), existing (--address/--cluster), kuberay, "
                                "or a registered one (launcher/backends/registry.py)")
    address: str | None = Field(None, description="dashboard URL of an existing Ray cluster")
    cluster: str | None = Field(None, description="a kept local cluster (launcher up / --keep-cluster)")
    keep_cluster: bool = Field(False, description="leave the local cluster running after the job")
    record: Literal["on", "off"] = Field("on", description="keep the run's metrics in its directory for "
                                         "`launcher report` and `launcher export` (launcher/recording.py)")
    record_interval: float = Field(15.0, gt=0, le=3600, description="seconds between recorded scrapes")
    record_nodes: list[str] = Field(default_factory=list, description="nodes (their `node` label) whose own series "
                                    "a large cluster's record keeps whole, beside the fleet's distributions")
    prometheus: str | None = Field(None, pattern=r"^https?://", description=(
        "your Prometheus scrapes this run: reports read it, and nothing is recorded unless record: on is given "
        "(the record then keeps whole the windows of the alerts it fires)"))
    simulate_gpus: bool = Field(False, description="local workers' exporters simulate their GPUs")
    framework_metrics: bool = Field(False, description=(
        "report what TRL's and Hugging Face trainers and verl's trainer log in the job's Ray workers as training "
        "steps and RL iterations, and where verl's rollout servers are (the head exporter's /sd/rollout), with no "
        "change to the code (Ray's worker_process_setup_hook, exporter/progress/hooks.py)"))
    exporter_port: int = Field(wire.EXPORTER_PORT, ge=1024, le=65000,
                               description="head exporter port; local node i: +2i")
    progress_port: int = Field(wire.PROGRESS_PORT, ge=1024, le=65000,
                               description="head progress port; local node i: +2i")
    token_path: Path | None = Field(None, description="file holding the Ray auth token of an existing cluster")
    namespace: str | None = Field(None, description="Kubernetes namespace (default: the kubeconfig context's, "
                                  "as kubectl)")
    context: str | None = Field(None, description="kubeconfig context (default: the current one)")
    pod_template: PodTemplate = Field(None, description="PodTemplateSpec (YAML file or mapping) merged into every "
                                      "Ray pod: tolerations, nodeSelector, affinity, volumes, serviceAccountName...")
    sidecar: bool = Field(True, description="run the exporter beside Ray in every pod, with a PodMonitor "
                          "(Kubernetes)")
    share_process_namespace: bool = Field(True, description="the Ray pods share one process namespace "
                                          "(shareProcessNamespace), so the exporter sidecar sees Ray's processes "
                                          "(Kubernetes; off: no per-process series from the sidecar)")
    pod_resources: bool = Field(False, description="mount the kubelet's pod-resources socket into the sidecars of GPU "
                                "pods, so each reports only its own pod's GPUs, with their pod labels (Kubernetes; a "
                                "hostPath volume: the namespace's Pod Security level must allow it)")
    queue: str | None = Field(None, description="Kueue LocalQueue name")
    release: str | None = Field(None, description="kube-prometheus-stack's Helm release: the PodMonitor gets the "
                                "`release` label its Prometheus selects on")
    exporter_image: str | None = Field(None, description="exporter sidecar image (default: the raypulse "
                                        "exporter image of this version, launcher/deploy/manifests.py DEFAULT_IMAGE)")
    exporter_web_config: Path | None = Field(None, description="web config file (TLS, basic auth; exporter-toolkit "
                                             "format) of the local cluster's exporters, checked before anything "
                                             "starts (docs/deploy.md)")
    exporter_web_config_secret: str | None = Field(None, description="Kubernetes Secret holding web-config.yml and "
                                                   "the certificates it names, mounted into every exporter sidecar; "
                                                   "the sidecars then serve HTTPS (docs/deploy.md)")
    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP base URL the run's trace goes to (/v1/traces is "
                                      "added); unset: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else no tracing")
    health: HealthPolicy = Field(default_factory=HealthPolicy)
    checkpoint_dir: str | None = Field(None, description="where the run's checkpoints go, kept across attempts "
                                       "(RAYPULSE_CHECKPOINT_DIR); local clusters: a directory under the run's "
                                       "record by default; existing clusters: a path every node reaches, or a URI")

    @model_validator(mode="before")
    @classmethod
    def _working_dir_in_runtime_env(cls, data: Any) -> Any:
        """Ray's runtime env holds the working dir; a spec written that way means the spec's own field."""
        runtime = data.get("runtime_env") if isinstance(data, dict) else None
        if not isinstance(runtime, dict) or "working_dir" not in runtime:
            return data
        runtime = dict(runtime)
        inner = runtime.pop("working_dir")
        if data.get("working_dir") not in (None, inner):
            raise ValueError(f"working_dir: given twice, {data['working_dir']!r} and runtime_env.working_dir "
                             f"{inner!r}; keep one")
        return {**data, "runtime_env": runtime, "working_dir": inner}

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        return _dns_label(value, MAX_NAME)

    @field_validator("working_dir")
    @classmethod
    def _remote_working_dir(cls, value: str | None) -> str | None:
        return check_remote_package(value, "working_dir") if value and is_remote(value) else value

    @field_validator("run_id", "cluster")
    @classmethod
    def _dns_id(cls, value: str | None) -> str | None:
        return value if value is None else _dns_label(value, MAX_RUN_ID)

    @field_validator("submission_id")
    @classmethod
    def _submission_id(cls, value: str | None) -> str | None:
        if value is not None and not submission.VALID.fullmatch(value):
            raise ValueError(f"{value!r} must be 1-{submission.MAX_LENGTH} letters, digits, '-', '_' or '.'")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return value if value is None else check_headers(value)

    @field_validator("verify")
    @classmethod
    def _ca_path(cls, value: bool | str | None) -> bool | str | None:
        if isinstance(value, str) and not Path(value).expanduser().exists():
            raise ValueError(f"{value!r} is neither true/false nor a CA bundle file or directory that exists")
        return str(Path(value).expanduser().absolute()) if isinstance(value, str) else value

    @field_validator("entrypoint_resources")
    @classmethod
    def _custom_resources(cls, value: dict[str, float]) -> dict[str, float]:
        reserved = sorted(set(value) & RESERVED_RESOURCES)
        if reserved:
            raise ValueError(f"{reserved[0]!r} is not a custom resource; use entrypoint_num_cpus, "
                             "entrypoint_num_gpus or entrypoint_memory (as `ray job submit`)")
        if any(quantity < 0 for quantity in value.values()):
            raise ValueError("quantities must be >= 0")
        return value

    @field_validator("metadata")
    @classmethod
    def _user_metadata(cls, value: dict[str, str]) -> dict[str, str]:
        clash = sorted(key for key in value if key.startswith(wire.META_PREFIX))
        if clash:
            raise ValueError(f"key {clash[0]!r} is reserved: the launcher sets the {wire.META_PREFIX}* keys; "
                             "rename it (or use --label KEY=VALUE for a label)")
        return value

    @field_validator("namespace", "queue", "release")
    @classmethod
    def _kubernetes_name(cls, value: str | None) -> str | None:
        if value is not None and (not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value) or len(value) > 63):
            raise ValueError(f"{value!r} is not a Kubernetes name (lowercase letters, digits, '-'; at most 63)")
        return value

    @field_validator("exporter_web_config_secret")
    @classmethod
    def _secret_name(cls, value: str | None) -> str | None:
        if value is not None and (not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                                                   value) or len(value) > 253):
            raise ValueError(f"{value!r} is not a Kubernetes Secret name (lowercase letters, digits, '-', '.')")
        return value

    @field_validator("exporter_web_config")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return value if value is None else value.expanduser().absolute()  # a retry may run from elsewhere

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+(/\S*)?$", value):
            raise ValueError(f"{value!r} is not an OTLP/HTTP URL like http://collector:4318")
        return value

    @field_validator("entrypoint")
    @classmethod
    def _one_command_line(cls, value: str) -> str:
        try:
            return validate_entrypoint(value)
        except EntrypointError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("workspace", "user")
    @classmethod
    def _label_value(cls, value: str) -> str:
        if not LABEL_VALUE.fullmatch(value):
            raise ValueError(f"{value!r} must be 1-63 letters, digits, '-', '_' or '.', alphanumeric at both ends")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS} labels (they become metric labels)")
        for key, label in value.items():
            if not LABEL_KEY.fullmatch(key):
                raise ValueError(f"label key {key!r} must be snake_case: a-z first, then a-z, 0-9, _")
            if key in ("workspace", "user", "job_name", "run_id", "attempt"):
                raise ValueError(f"label key {key!r} is reserved; use the {key} field")
            if not LABEL_VALUE.fullmatch(label):
                raise ValueError(f"label {key}={label!r}: the value must be 1-63 letters, digits, '-', '_' or '.', "
                                 "alphanumeric at both ends")
        return value

    @field_validator("worker_groups")
    @classmethod
    def _unique_groups(cls, value: list[WorkerGroup]) -> list[WorkerGroup]:
        names = [group.name for group in value]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"group names must be unique; repeated: {', '.join(duplicates)}")
        return value

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        if value is not None and value not in kinds.KINDS:
            *first, last = [repr(name) for name in kinds.KINDS]
            raise ValueError(f"Input should be {', '.join(first)} or {last} (the registered backends)"
                             if first else f"Input should be {last}")
        return value

    @model_validator(mode="after")
    def _backend_fields(self) -> JobSpec:
        if self.address and self.cluster:
            raise ValueError("address: give either address or cluster, not both")
        refused = kinds.refusal(self)
        if refused:
            raise ValueError(refused)
        self._check_health()
        self._check_web_config()
        if self.simulate_gpus and not any(group.gpus and group.count for group in self.worker_groups):
            raise ValueError("simulate_gpus: no worker has GPUs to simulate; set worker_groups[].gpus (--worker-gpus)")
        if self.address and not re.match(r"^https?://[^/\s]+/?$", self.address):
            raise ValueError(f"address: {self.address!r} is not a dashboard URL like http://head:8265")
        uploads = self.runtime_env.local_paths() + ([self.working_dir] if self.working_dir and not
                                                    is_remote(self.working_dir) else [])
        if self.runtime_env.excludes and not uploads:
            raise ValueError("runtime_env.excludes: leaves files out of a local working_dir or py_modules uploaded "
                             "with the job, and this job uploads none; drop excludes")
        return self

    def _check_web_config(self) -> None:
        """The exporters' web config is read and checked here, so that a file that cannot work is refused
        before anything starts: missing, unreadable, invalid, or needing a client certificate the
        launcher's own reads of the exporters (the health watcher) cannot present."""
        if self.exporter_web_config is None:
            return
        from exporter.serving.webconfig import load_web_config  # aiohttp's server side: only when a web config is given

        fix = "fix the file, or leave --exporter-web-config out"
        try:
            config = load_web_config(self.exporter_web_config)
        except ConfigError as exc:
            raise ValueError(f"exporter_web_config: {exc}; {fix}") from None
        tls = config.tls_server_config
        if tls is not None and tls.client_auth_type == "RequireAndVerifyClientCert" and self.health.enabled:
            raise ValueError(f"exporter_web_config: {self.exporter_web_config}: client_auth_type "
                             "RequireAndVerifyClientCert leaves the launcher's health watcher, which reads every "
                             "exporter, without a client certificate to present; use VerifyClientCertIfGiven "
                             "(the launcher then reads with the password it adds for itself), or turn the watcher "
                             "off (--no-health)")

    def _check_health(self) -> None:
        """A health policy that cannot work is refused before anything starts."""
        if not self.health.enabled:
            return
        problem = self.health.threshold_problem()
        if problem:
            raise ValueError(problem)
        restarts = self.health.explicit_restarts()
        if restarts and self.max_retries == 0:
            raise ValueError(f"health.{restarts[0]}: restart needs retries to spend, and max_retries is 0; set "
                             "max_retries (every restart counts against it) or choose stop or report")
        if self.checkpoint_dir and "://" not in self.checkpoint_dir and not self.checkpoint_dir.startswith("/"):
            raise ValueError(f"checkpoint_dir: {self.checkpoint_dir!r} must be an absolute path every node can "
                             "reach, or a URI (s3://, gs://, ...)")
        if self.health.source == "prometheus" and not self.prometheus:
            raise ValueError("health.source: prometheus reads the run's signals from your Prometheus, and none is "
                             "given; set prometheus (--prometheus URL, the Prometheus that scrapes this run) or "
                             "choose auto or direct")

    @property
    def max_attempts(self) -> int:
        return self.max_retries + 1

    @property
    def worker_count(self) -> int:
        return sum(group.count for group in self.worker_groups)

    @property
    def recorded(self) -> bool:
        """The run keeps its record (launcher/recording.py): `record: on`, and with the user's Prometheus
        (`prometheus:`, which keeps the run's series) only when `record: on` was given."""
        return self.record == "on" and (not self.prometheus or "record" in self.model_fields_set)

    def with_run_id(self) -> JobSpec:
        """This spec with a run id: the given one, the one derived from the submission id, or
        `<name>-<8 hex>` for a new run."""
        if self.run_id:
            return self
        if self.submission_id:  # the user's idempotency key, as `ray job submit --submission-id`
            return self.model_copy(update={"run_id": submission.run_id_of(self.submission_id)})
        return self.model_copy(update={"run_id": f"{self.name}-{secrets.token_hex(4)}"})


UNKNOWN_FIELD = "unknown field (check the spelling; see README's launcher section for the fields)"


def format_validation_error(error: ValidationError, source: str = "job spec") -> str:
    """One line per problem, each starting with the field's path; a Ray runtime env field the launcher
    does not take says what to do instead."""
    lines = []
    for problem in strict.problems(error, UNKNOWN_FIELD):
        message = problem.message
        if message == UNKNOWN_FIELD and problem.where.startswith("runtime_env."):
            message = NOT_TAKEN.get(problem.where.removeprefix("runtime_env."), message)
        lines.append(f"{source}: {problem.where or '(top level)'}: {message}")
    return "\n".join(lines)


def build_spec(data: dict[str, Any], source: str = "job spec") -> JobSpec:
    """A validated JobSpec, or SpecError with every problem on its own line."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, source)) from None


def load_spec_file(path: Path) -> dict[str, Any]:
    """The mapping in a YAML job spec file (validated later, together with command-line options)."""
    try:
        return read_yaml_file(path, "job spec", holds="fields (name, entrypoint, ...)")
    except ConfigError as exc:
        raise SpecError(str(exc)) from None
