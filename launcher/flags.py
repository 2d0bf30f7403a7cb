"""Command-line flags -> job spec: the options `launcher submit`, `up` and `render` share, and how
their values are laid over a spec file (`-f job.yaml`), flags winning.

Every option sets one JobSpec field (SPEC_OPTIONS; tests/test_launcher_spec.py holds the two equal
both ways). The defaults and choices --help shows are read from those fields, so the help cannot
drift from the spec; only a default computed when the spec is built (the login name, the image)
is a word. A flag is dropped only when it was not given: `--max-retries 0` is 0.
"""

from __future__ import annotations

import shlex
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import BaseModel

from exporter import userinput
from launcher import runtime_env
from launcher.backends import kinds
from launcher.health.policy import HealthPolicy
from launcher.runtime_env import RuntimeEnv
from launcher.spec import HeadSpec, JobSpec, SpecError, WorkerGroup, build_spec, format_memory, load_spec_file

# Option (click parameter name) -> the spec field it sets.
SPEC_OPTIONS: dict[str, str] = {
    "name": "name",
    "command": "entrypoint",
    "working_dir": "working_dir",
    "runtime_env": "runtime_env",
    "runtime_env_json": "runtime_env",
    "pip": "runtime_env.pip",
    "env": "runtime_env.env_vars",
    "head_cpus": "head.cpus",
    "head_memory": "head.memory",
    "head_resource": "head.resources",
    "worker_group": "worker_groups",
    "workers": "worker_groups[].count",
    "worker_cpus": "worker_groups[].cpus",
    "worker_gpus": "worker_groups[].gpus",
    "worker_memory": "worker_groups[].memory",
    "worker_resource": "worker_groups[].resources",
    "max_retries": "max_retries",
    "retry_backoff": "retry_backoff_seconds",
    "retry_backoff_max": "retry_backoff_max_seconds",
    "active_deadline_seconds": "active_deadline_seconds",
    "pre_running_deadline_seconds": "pre_running_deadline_seconds",
    "workspace": "workspace",
    "user": "user",
    "label": "labels",
    "image": "image",
    "run_id": "run_id",
    "submission_id": "submission_id",
    "metadata_json": "metadata",
    "entrypoint_num_cpus": "entrypoint_num_cpus",
    "entrypoint_num_gpus": "entrypoint_num_gpus",
    "entrypoint_memory": "entrypoint_memory",
    "entrypoint_resources": "entrypoint_resources",
    "headers": "headers",
    "verify": "verify",
    "log_style": "log_style",
    "log_color": "log_color",
    "backend": "backend",
    "address": "address",
    "cluster": "cluster",
    "keep_cluster": "keep_cluster",
    "record": "record",
    "record_interval": "record_interval",
    "record_nodes": "record_nodes",
    "prometheus": "prometheus",
    "simulate_gpus": "simulate_gpus",
    "framework_metrics": "framework_metrics",
    "exporter_port": "exporter_port",
    "progress_port": "progress_port",
    "token_path": "token_path",
    "namespace": "namespace",
    "context": "context",
    "pod_template": "pod_template",
    "no_sidecar": "sidecar",
    "no_share_process_namespace": "share_process_namespace",
    "pod_resources": "pod_resources",
    "queue": "queue",
    "release": "release",
    "exporter_image": "exporter_image",
    "exporter_web_config": "exporter_web_config",
    "exporter_web_config_secret": "exporter_web_config_secret",
    "otlp_endpoint": "otlp_endpoint",
    "checkpoint_dir": "checkpoint_dir",
    "no_health": "health.enabled",
    "health_check_interval": "health.check_interval_seconds",
    "health_source": "health.source",
    "hang_after": "health.hang_after_seconds",
    "fixed_hang": "health.adaptive_hang",
    "silence_after": "health.silence_after_seconds",
    "on_hang": "health.on_hang",
    "on_gpu_fault": "health.on_gpu_fault",
    "on_node_lost": "health.on_node_lost",
    "on_nonfinite_loss": "health.on_nonfinite_loss",
    "no_stacks": "health.stacks",
    "cordon_nodes": "health.cordon_nodes",
    "mtbf": "health.mtbf_seconds",
}
# flags that turn a default-on field off
NEGATIONS = {"no_health", "no_stacks", "no_sidecar", "no_share_process_namespace", "fixed_hang"}
WORKER_SHORTHANDS = {"workers": "count", "worker_cpus": "cpus", "worker_gpus": "gpus", "worker_memory": "memory",
                     "worker_resource": "resources"}
_SECTIONS: dict[str, type[BaseModel]] = {"": JobSpec, "head": HeadSpec, "worker_groups[]": WorkerGroup,
                                         "health": HealthPolicy, "runtime_env": RuntimeEnv}


def _field(option: str) -> tuple[str, Any]:
    """The name and pydantic FieldInfo of the spec field an option sets."""
    section, _, name = SPEC_OPTIONS[option].rpartition(".")
    return name, _SECTIONS[section].model_fields[name]


def default(option: str) -> str:
    """The default of an option's field as --help shows it: `3`, `10`, `900`, `2Gi`, `restart`."""
    name, field = _field(option)
    value = field.default
    if field.is_required() or field.default_factory is not None or value is None:
        raise ValueError(f"{SPEC_OPTIONS[option]} has no fixed default; say in words what it is")
    if name == "memory":
        return format_memory(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def choices(option: str) -> click.Choice:
    """The values an option's field takes (its Literal, None left out), as a click choice."""
    annotation = _field(option)[1].annotation
    literal = next(kind for kind in (annotation, *typing.get_args(annotation)) if typing.get_origin(kind) is Literal)
    return click.Choice(list(typing.get_args(literal)))


def was_given(value: Any) -> bool:
    """Whether an option was given: click passes None (or () when repeatable, False for a flag) when not;
    0, 0.0 and "" are values."""
    return value is not None and value is not False and value != ()


def _pairs(option: str, values: tuple[str, ...], convert: Callable[[str], Any] = str) -> dict[str, Any]:
    """KEY=VALUE flags (repeatable) as a dict; a malformed one is a usage error naming the flag."""
    result = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=option)
        try:
            result[key] = convert(value)
        except ValueError:
            raise click.BadParameter(f"{item!r}: {value!r} is not a number", param_hint=option) from None
    return result


def parse_worker_group(text: str) -> dict[str, Any]:
    """`NAME:count=2,cpus=4,gpus=1,memory=16Gi,resource.accel=1` (PAI DLC's role syntax) as a group."""
    name, _, rest = text.partition(":")
    group: dict[str, Any] = {"name": name}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} in {text!r} is not key=value", param_hint="--worker-group")
        if key.startswith("resource."):
            group.setdefault("resources", {})[key.removeprefix("resource.")] = value
        elif key in WorkerGroup.model_fields and key not in ("name", "resources", "node_selector", "pod_template"):
            group[key] = value
        else:
            raise click.BadParameter(f"unknown key {key!r} in {text!r}; use count, cpus, gpus, memory, resource.NAME",
                                     param_hint="--worker-group")
    return group


JSON_OPTIONS = {"metadata_json": "--metadata-json", "entrypoint_resources": "--entrypoint-resources",
                "headers": "--headers"}  # `ray job submit`'s JSON-valued flags: each a JSON object


def _json_object(flag: str, text: str) -> dict[str, Any]:
    """A JSON-object flag's value; the error names the flag and never repeats the text (--headers may
    hold a credential)."""
    try:
        value = userinput.load_json(text)
    except userinput.InputError as exc:
        raise SpecError(f"{flag}: {exc.problem}; give an object like '{{\"key\": \"value\"}}'") from None
    if not isinstance(value, dict):
        raise SpecError(f"{flag}: give a JSON object like '{{\"key\": \"value\"}}', not a {type(value).__name__}")
    return value


class BoolOrPath(click.ParamType):
    """`--verify`, as `ray job submit` takes it: true/1, false/0, or a CA bundle file or directory."""

    name = "BOOL|CA_PATH"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> bool | str:
        if isinstance(value, bool):
            return value
        text = str(value)
        if text.lower() in ("true", "1"):
            return True
        if text.lower() in ("false", "0"):
            return False
        return text


def spec_from_options(file: Path | None, options: dict[str, Any]) -> JobSpec:
    """The spec file (if any) with the given flags laid over it, validated."""
    return build_spec(*spec_data(file, options))


def _runtime_env_flags(data: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """--runtime-env FILE or --runtime-env-json (Ray's format) over the spec's runtime env, then
    --pip (added to its requirements) and --env (merged by name) over that."""
    if "runtime_env" in given and "runtime_env_json" in given:
        raise SpecError("runtime_env: give --runtime-env FILE or --runtime-env-json JSON, not both "
                        "(as `ray job submit`)")
    if "runtime_env" in given:
        data = runtime_env.layer(data, runtime_env.from_file(given.pop("runtime_env")))
    elif "runtime_env_json" in given:
        data = runtime_env.layer(data, runtime_env.from_json(given.pop("runtime_env_json")))
    if "pip" in given or "env" in given or "working_dir" in given:
        runtime = data["runtime_env"] = runtime_env.mapping(data.get("runtime_env"))
        if "working_dir" in given:
            runtime.pop("working_dir", None)  # --working-dir wins over a runtime env's
        if "pip" in given:
            try:
                runtime["pip"] = runtime_env.add_packages(runtime.get("pip"), list(given.pop("pip")))
            except ValueError as exc:
                raise SpecError(f"runtime_env.pip: {exc}") from None
        if "env" in given:
            runtime["env_vars"] = {**runtime_env.mapping(runtime.get("env_vars")), **_pairs("--env", given.pop("env"))}
    return data


def spec_data(file: Path | None, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The spec file's fields (if any) with the given flags laid over them, and where they come from
    (for errors); validated by build_spec."""
    data: dict[str, Any] = load_spec_file(file) if file else {}
    source = str(file) if file else "job spec"
    given = {key: value for key, value in options.items() if was_given(value)}
    command = given.pop("command", None)
    if command:
        data["entrypoint"] = command[0] if len(command) == 1 else shlex.join(command)
    data = _runtime_env_flags(data, given)
    for key, flag in JSON_OPTIONS.items():
        if key in given:
            data[SPEC_OPTIONS[key]] = _json_object(flag, given.pop(key))
    head = {key.removeprefix("head_"): given.pop(key) for key in ("head_cpus", "head_memory") if key in given}
    if "head_resource" in given:
        head["resources"] = _pairs("--head-resource", given.pop("head_resource"), float)
    if head:
        data["head"] = {**data.get("head", {}), **head}
    shorthands = {field: given.pop(key) for key, field in WORKER_SHORTHANDS.items() if key in given}
    if "resources" in shorthands:
        shorthands["resources"] = _pairs("--worker-resource", shorthands["resources"], float)
    if "worker_group" in given:
        if shorthands:
            raise SpecError(f"{source}: worker_groups: give either --worker-group or the --workers/--worker-* "
                            "shorthands, not both")
        data["worker_groups"] = [parse_worker_group(text) for text in given.pop("worker_group")]
    elif shorthands:
        groups = data.get("worker_groups") or [{}]
        if len(groups) != 1:
            raise SpecError(f"{source}: worker_groups: the --workers/--worker-* shorthands set one group and the "
                            f"spec has {len(groups)}; use --worker-group NAME:count=...,cpus=... for each")
        data["worker_groups"] = [{**groups[0], **shorthands}]
    if "label" in given:
        data["labels"] = {**data.get("labels", {}), **_pairs("--label", given.pop("label"))}
    for key, value in given.items():
        *sections, field = SPEC_OPTIONS[key].split(".")  # health.hang_after_seconds -> data["health"][...]
        target = data
        for section in sections:
            target = target.setdefault(section, {})
        target[field] = False if key in NEGATIONS else str(value) if isinstance(value, Path) else value
    return data, source


def spec_options(func: Callable) -> Callable:
    """The options that fill a job spec (shared by submit, up and render)."""
    options = [
        click.option("-f", "--file", type=click.Path(path_type=Path, dir_okay=False),
                     help="YAML job spec; flags override its fields."),
        click.option("--name", help=f"Job name (lowercase DNS label) [{default('name')}]."),
        click.option("--working-dir", metavar="DIR|URI",
                     help="Directory uploaded with the job, or a remote zip (https://, s3://, ...)."),
        click.option("--runtime-env", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
                     help="Ray runtime env (YAML/JSON, as `ray job submit --runtime-env`: pip, uv, py_modules, "
                     "excludes, env_vars, working_dir). Each field it gives replaces the spec file's (env_vars merge "
                     "by name); --working-dir, --pip and --env win over it."),
        click.option("--runtime-env-json", metavar="JSON", help="The same, inline: '{\"pip\": [\"numpy\"]}'."),
        click.option("--pip", multiple=True, metavar="REQ", help="pip requirement for the job (repeatable)."),
        click.option("--env", multiple=True, metavar="KEY=VALUE", help="Environment variable of the job (repeatable)."),
        click.option("--head-cpus", type=float,
                     help=f"Head container CPUs on Kubernetes [{default('head_cpus')}]; Ray sees 0 on the head."),
        click.option("--head-memory", metavar="SIZE",
                     help=f"Head container memory on Kubernetes [{default('head_memory')}]."),
        click.option("--head-resource", multiple=True, metavar="NAME=QTY", help="Custom resource on the head."),
        click.option("--workers", type=int, help=f"Number of workers [{default('workers')}]."),
        click.option("--worker-cpus", type=float, help=f"CPUs per worker [{default('worker_cpus')}]."),
        click.option("--worker-gpus", type=int, help=f"GPUs per worker [{default('worker_gpus')}]."),
        click.option("--worker-memory", metavar="SIZE", help="Memory per worker (bytes or 4Gi)."),
        click.option("--worker-resource", multiple=True, metavar="NAME=QTY", help="Custom resource per worker."),
        click.option("--worker-group", multiple=True, metavar="NAME:count=N,cpus=C,gpus=G,memory=M,resource.X=Q",
                     help="A worker group (repeatable), instead of the --workers/--worker-* shorthands."),
        click.option("--max-retries", type=int,
                     help=f"New attempts after a failed or unhealthy one [{default('max_retries')}]."),
        click.option("--retry-backoff", type=float, metavar="SECONDS",
                     help=f"Wait before the first retry [{default('retry_backoff')}]."),
        click.option("--retry-backoff-max", type=float, metavar="SECONDS",
                     help=f"Longest wait between attempts [{default('retry_backoff_max')}]."),
        click.option("--active-deadline-seconds", type=int, help="Stop the run after this long (exit 4)."),
        click.option("--pre-running-deadline-seconds", type=int, help="Stop an attempt not RUNNING by then (exit 4)."),
        click.option("--workspace", help=f"Workspace label [{default('workspace')}]."),
        click.option("--user", help="User label [login name]."),
        click.option("--label", multiple=True, metavar="KEY=VALUE", help="Other label (repeatable, bounded)."),
        click.option("--image", help="Container image on Kubernetes [rayproject/ray:<this Ray>]."),
        click.option("--run-id", help="Idempotency key: re-running with it follows the run instead of repeating it."),
        click.option("--submission-id", metavar="ID", help="Ray submission id of the job (as `ray job submit`): "
                     "attempt 1 is ID, attempt N ID-a<N>; without --run-id also the idempotency key (submitting it "
                     "again follows that run)."),
        click.option("--metadata-json", metavar="JSON", help="Ray job metadata, a JSON object (raypulse.* keys are "
                     "the launcher's)."),
        click.option("--entrypoint-num-cpus", type=float, help="CPUs reserved for the entrypoint (driver) [0]."),
        click.option("--entrypoint-num-gpus", type=float, help="GPUs reserved for the entrypoint (driver) [0]."),
        click.option("--entrypoint-memory", type=int, metavar="BYTES",
                     help="Memory reserved for the entrypoint (local, existing; not a RayJob field) [0]."),
        click.option("--entrypoint-resources", metavar="JSON",
                     help="Custom resources reserved for the entrypoint, a JSON object: '{\"accel\": 1}'."),
        click.option("--headers", metavar="JSON", help="HTTP headers of the calls to --address's dashboard, a JSON "
                     "object (never recorded or shown)."),
        click.option("--verify", type=BoolOrPath(), help="TLS verification of --address's dashboard: true, false, "
                     "or a CA bundle file or directory [true]."),
        click.option("--log-style", type=choices("log_style"), help="The launcher's own lines: pretty (live "
                     "progress), record (plain lines), auto (pretty on a terminal) "
                     f"[{default('log_style')}]."),
        click.option("--log-color", type=choices("log_color"), help="Colour the launcher's lines; auto: on a "
                     f"terminal [{default('log_color')}]."),
        click.option("--backend", type=click.Choice(list(kinds.KINDS)),
                     help="Where to run [local; existing when --address/--cluster is given, or on submit "
                     "RAY_API_SERVER_ADDRESS/RAY_ADDRESS]."),
        click.option("--address", metavar="URL", help="Dashboard URL of an existing Ray cluster (Jobs API) "
                     "[submit: RAY_API_SERVER_ADDRESS, then RAY_ADDRESS, as `ray job submit`]."),
        click.option("--cluster", metavar="NAME", help="A kept local cluster (launcher up)."),
        click.option("--keep-cluster", is_flag=True, help="Leave the local cluster running after the job."),
        click.option("--record", type=choices("record"), help="Keep the run's metrics in its directory "
                     f"for `launcher report` and `launcher export` [{default('record')}]."),
        click.option("--record-interval", type=float, metavar="SECONDS",
                     help=f"Seconds between recorded scrapes [{default('record_interval')}]."),
        click.option("--record-nodes", multiple=True, metavar="NODE", help="A node whose own series a large "
                     "cluster's record keeps whole (repeatable; above 64 nodes the record keeps distributions)."),
        click.option("--prometheus", metavar="URL", help="Your Prometheus scrapes this run: reports read it and "
                     "nothing is recorded unless --record on (then the record keeps its alerts' windows whole)."),
        click.option("--simulate-gpus", is_flag=True, help="Local workers' exporters simulate their --worker-gpus."),
        click.option("--framework-metrics", is_flag=True, help="Report what TRL's and Hugging Face trainers and "
                     "verl's trainer log in the job's Ray workers (steps, loss, rewards, KL, response lengths, "
                     "phases), and where verl's vLLM/SGLang rollout servers are (the head exporter's /sd/rollout), "
                     "with no change to the code: Ray's worker_process_setup_hook (docs/progress.md)."),
        click.option("--exporter-port", type=int,
                     help=f"Head exporter port; local node i uses +2i [{default('exporter_port')}]."),
        click.option("--progress-port", type=int,
                     help=f"Head progress endpoint port; local node i uses +2i [{default('progress_port')}]."),
        click.option("--token-path", type=click.Path(path_type=Path), help="Ray auth token file of --address."),
        click.option("--namespace", help="Kubernetes namespace [the kubeconfig context's, as kubectl]."),
        click.option("--context", help="kubeconfig context [the current one; in a pod: its service account]."),
        click.option("--pod-template", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
                     help="PodTemplateSpec YAML merged into every Ray pod (tolerations, nodeSelector, affinity, "
                     "volumes, serviceAccountName, imagePullSecrets...; a container named `ray` merges into Ray's)."),
        click.option("--no-sidecar", is_flag=True, help="No exporter sidecar in the Ray pods (and no PodMonitor)."),
        click.option("--no-share-process-namespace", is_flag=True, help="Ray pods without shareProcessNamespace "
                     "(the sidecar then sees no Ray process)."),
        click.option("--pod-resources", is_flag=True, help="Mount the kubelet's pod-resources socket "
                     "into GPU pods' sidecars: each reports only its pod's GPUs (a hostPath volume)."),
        click.option("--queue", help="Kueue LocalQueue (adds kueue.x-k8s.io/queue-name)."),
        click.option("--release", metavar="NAME", help="kube-prometheus-stack's Helm release: the PodMonitor gets "
                     "release=NAME, which its Prometheus selects on."),
        click.option("--exporter-image", help="Exporter sidecar image on Kubernetes [the raypulse exporter image "
                     "of this version]."),
        click.option("--exporter-web-config", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
                     help="TLS and basic auth of the local cluster's exporters (exporter-toolkit web config)."),
        click.option("--exporter-web-config-secret", metavar="SECRET",
                     help="Kubernetes Secret with web-config.yml (+ its certificates) for the exporter sidecars."),
        click.option("--otlp-endpoint", metavar="URL", help="Trace the run to this OTLP/HTTP collector "
                     "(http://collector:4318) [OTEL_EXPORTER_OTLP_ENDPOINT]."),
        click.option("--checkpoint-dir", metavar="PATH|URI", help="Where the run's checkpoints go, across attempts "
                     "(RAYPULSE_CHECKPOINT_DIR) [local: under the run's record]."),
        click.option("--no-health", is_flag=True, help="Do not watch the run's health (no hang or fault healing)."),
        click.option("--health-check-interval", type=float, metavar="SECONDS",
                     help=f"How often the watcher reads the exporters [{default('health_check_interval')}]."),
        click.option("--health-source", type=choices("health_source"), help="Where the watcher reads every node's "
                     "signals: auto (the head exporter's fleet document, else each exporter), direct (each "
                     "exporter), prometheus (--prometheus, one query per rule: fleets past one head's reach) "
                     f"[{default('health_source')}]."),
        click.option("--hang-after", type=float, metavar="SECONDS",
                     help=f"No progress from any rank for this long is a hang [{default('hang_after')}, as the "
                     "alert rule]; the most a threshold learned from the run's pace may be."),
        click.option("--mtbf", type=float, metavar="SECONDS", help="Mean time between faults for the checkpoint "
                     "advice [the one seen in this run and the finished runs under $RAYPULSE_HOME]."),
        click.option("--fixed-hang", is_flag=True, help="Judge a hang by --hang-after only, not by a threshold "
                     "learned from the run's pace (10 x its p99 report interval, at least 60 s)."),
        click.option("--silence-after", type=float, metavar="SECONDS",
                     help=f"A job reporting no progress is hung after this long without output "
                     f"[{default('silence_after')}]."),
        click.option("--on-hang", type=choices("on_hang"), help=f"[{default('on_hang')}]"),
        click.option("--on-gpu-fault", type=choices("on_gpu_fault"), help=f"[{default('on_gpu_fault')}]"),
        click.option("--on-node-lost", type=choices("on_node_lost"), help=f"[{default('on_node_lost')}]"),
        click.option("--on-nonfinite-loss", type=choices("on_nonfinite_loss"),
                     help=f"[{default('on_nonfinite_loss')}]"),
        click.option("--no-stacks", is_flag=True, help="Do not take the processes' stacks before acting on a hang."),
        click.option("--cordon-nodes", is_flag=True, help="KubeRay: cordon a faulty GPU's node before the next "
                     "attempt (needs `patch nodes`)."),
        click.argument("command", nargs=-1, type=click.UNPROCESSED),
    ]
    for option in reversed(options):
        func = option(func)
    return func
