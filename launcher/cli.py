"""`launcher` command line: submit, status, logs, stop, list, up, down, render.

Verbs and flags follow `ray job` and kubectl (`--output json`, `logs --follow`); every submit option
is a field of the job spec (SPEC_OPTIONS) so `-f job.yaml` and flags mix freely, flags winning.
Exit codes are launcher.exitcodes.ExitCode; bad input exits 2 before anything starts.
"""

from __future__ import annotations

import json
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import psutil

from exporter import __version__
from launcher import api, detach, kuberay, redact, runtime_env, target
from launcher.display import PlainReporter, Reporter, reporter_for_terminal
from launcher.errors import BadInput, InfraError
from launcher.exitcodes import ExitCode
from launcher.failing import fail
from launcher.journal import Journal
from launcher.local import Cancelled
from launcher.run import finish_run
from launcher.spec import JobSpec, SpecError, WorkerGroup, build_spec, load_spec_file
from launcher.state import RunRecord, list_clusters, list_runs, load_run

# Option (click parameter name) -> the spec field it sets. tests/test_launcher_spec.py holds this
# and JobSpec equal both ways: a new field needs a flag, a new flag needs a field.
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
    "backend": "backend",
    "address": "address",
    "cluster": "cluster",
    "keep_cluster": "keep_cluster",
    "record": "record",
    "record_interval": "record_interval",
    "prometheus": "prometheus",
    "simulate_gpus": "simulate_gpus",
    "exporter_port": "exporter_port",
    "progress_port": "progress_port",
    "token_path": "token_path",
    "namespace": "namespace",
    "queue": "queue",
    "exporter_image": "exporter_image",
    "exporter_web_config": "exporter_web_config",
    "exporter_web_config_secret": "exporter_web_config_secret",
    "otlp_endpoint": "otlp_endpoint",
    "checkpoint_dir": "checkpoint_dir",
    "no_health": "health.enabled",
    "health_check_interval": "health.check_interval_seconds",
    "hang_after": "health.hang_after_seconds",
    "silence_after": "health.silence_after_seconds",
    "on_hang": "health.on_hang",
    "on_gpu_fault": "health.on_gpu_fault",
    "on_node_lost": "health.on_node_lost",
    "on_nonfinite_loss": "health.on_nonfinite_loss",
    "no_stacks": "health.stacks",
}
NEGATIONS = {"no_health", "no_stacks"}  # flags that turn a default-on field off
WORKER_SHORTHANDS = {"workers": "count", "worker_cpus": "cpus", "worker_gpus": "gpus", "worker_memory": "memory",
                     "worker_resource": "resources"}


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
        elif key in WorkerGroup.model_fields and key not in ("name", "resources"):
            group[key] = value
        else:
            raise click.BadParameter(f"unknown key {key!r} in {text!r}; use count, cpus, gpus, memory, resource.NAME",
                                     param_hint="--worker-group")
    return group


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
    given = {key: value for key, value in options.items() if value not in (None, (), False)}
    command = given.pop("command", None)
    if command:
        data["entrypoint"] = command[0] if len(command) == 1 else shlex.join(command)
    data = _runtime_env_flags(data, given)
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
    """The options that fill a job spec (shared by submit and render)."""
    options = [
        click.option("-f", "--file", type=click.Path(path_type=Path, dir_okay=False),
                     help="YAML job spec; flags override its fields."),
        click.option("--name", help="Job name (lowercase DNS label) [job]."),
        click.option("--working-dir", metavar="DIR|URI",
                     help="Directory uploaded with the job, or a remote zip (https://, s3://, ...)."),
        click.option("--runtime-env", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
                     help="Ray runtime env (YAML/JSON, as `ray job submit --runtime-env`: pip, uv, py_modules, "
                     "excludes, env_vars, working_dir). Each field it gives replaces the spec file's (env_vars merge "
                     "by name); --working-dir, --pip and --env win over it."),
        click.option("--runtime-env-json", metavar="JSON", help="The same, inline: '{\"pip\": [\"numpy\"]}'."),
        click.option("--pip", multiple=True, metavar="REQ", help="pip requirement for the job (repeatable)."),
        click.option("--env", multiple=True, metavar="KEY=VALUE", help="Environment variable of the job (repeatable)."),
        click.option("--head-cpus", type=float, help="Head container CPUs on Kubernetes [1]; Ray sees 0 on the head."),
        click.option("--head-memory", metavar="SIZE", help="Head container memory on Kubernetes [2Gi]."),
        click.option("--head-resource", multiple=True, metavar="NAME=QTY", help="Custom resource on the head."),
        click.option("--workers", type=int, help="Number of workers [1]."),
        click.option("--worker-cpus", type=float, help="CPUs per worker [1]."),
        click.option("--worker-gpus", type=int, help="GPUs per worker [0]."),
        click.option("--worker-memory", metavar="SIZE", help="Memory per worker (bytes or 4Gi)."),
        click.option("--worker-resource", multiple=True, metavar="NAME=QTY", help="Custom resource per worker."),
        click.option("--worker-group", multiple=True, metavar="NAME:count=N,cpus=C,gpus=G,memory=M,resource.X=Q",
                     help="A worker group (repeatable), instead of the --workers/--worker-* shorthands."),
        click.option("--max-retries", type=int, help="New attempts after a failed or unhealthy one [3]."),
        click.option("--retry-backoff", type=float, metavar="SECONDS", help="Wait before the first retry [10]."),
        click.option("--retry-backoff-max", type=float, metavar="SECONDS", help="Longest wait between attempts [300]."),
        click.option("--active-deadline-seconds", type=int, help="Stop the run after this long (exit 4)."),
        click.option("--pre-running-deadline-seconds", type=int, help="Stop an attempt not RUNNING by then (exit 4)."),
        click.option("--workspace", help="Workspace label [default]."),
        click.option("--user", help="User label [login name]."),
        click.option("--label", multiple=True, metavar="KEY=VALUE", help="Other label (repeatable, bounded)."),
        click.option("--image", help="Container image on Kubernetes [rayproject/ray:<this Ray>]."),
        click.option("--run-id", help="Idempotency key: re-running with it follows the run instead of repeating it."),
        click.option("--backend", type=click.Choice(["local", "existing", "kuberay"]),
                     help="Where to run [local; existing when --address/--cluster is given, or on submit "
                     "RAY_API_SERVER_ADDRESS/RAY_ADDRESS]."),
        click.option("--address", metavar="URL", help="Dashboard URL of an existing Ray cluster (Jobs API) "
                     "[submit: RAY_API_SERVER_ADDRESS, then RAY_ADDRESS, as `ray job submit`]."),
        click.option("--cluster", metavar="NAME", help="A kept local cluster (launcher up)."),
        click.option("--keep-cluster", is_flag=True, help="Leave the local cluster running after the job."),
        click.option("--record", type=click.Choice(["on", "off"]), help="Keep the run's metrics in its directory "
                     "for `launcher report` and `launcher export` [on]."),
        click.option("--record-interval", type=float, metavar="SECONDS", help="Seconds between recorded scrapes [15]."),
        click.option("--prometheus", metavar="URL", help="Your Prometheus scrapes this run: reports read it and "
                     "nothing is recorded."),
        click.option("--simulate-gpus", is_flag=True, help="Local workers' exporters simulate their --worker-gpus."),
        click.option("--exporter-port", type=int, help="Head exporter port; local node i uses +2i [9477]."),
        click.option("--progress-port", type=int, help="Head progress endpoint port; local node i uses +2i [9478]."),
        click.option("--token-path", type=click.Path(path_type=Path), help="Ray auth token file of --address."),
        click.option("--namespace", help="Kubernetes namespace [default]."),
        click.option("--queue", help="Kueue LocalQueue (adds kueue.x-k8s.io/queue-name)."),
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
                     help="How often the watcher reads the exporters [10]."),
        click.option("--hang-after", type=float, metavar="SECONDS",
                     help="No progress from any rank for this long is a hang [900, as the alert rule]."),
        click.option("--silence-after", type=float, metavar="SECONDS",
                     help="A job reporting no progress is hung after this long without output [1800]."),
        click.option("--on-hang", type=click.Choice(["restart", "stop", "report"]), help="[restart]"),
        click.option("--on-gpu-fault", type=click.Choice(["restart", "stop", "report"]), help="[restart]"),
        click.option("--on-node-lost", type=click.Choice(["restart", "stop", "report"]), help="[restart]"),
        click.option("--on-nonfinite-loss", type=click.Choice(["restart", "stop", "report"]), help="[restart]"),
        click.option("--no-stacks", is_flag=True, help="Do not take the processes' stacks before acting on a hang."),
        click.argument("command", nargs=-1, type=click.UNPROCESSED),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def target_options(func: Callable) -> Callable:
    """Where a read or stop command looks: the local records by default, or a cluster."""
    options = [
        click.option("--address", metavar="URL", help="Ask this Ray dashboard instead of the local records."),
        click.option("--cluster", metavar="NAME", help="Ask this kept local cluster."),
        click.option("--token-path", type=click.Path(path_type=Path), help="Ray auth token file for --address."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


EVENTS_SHOWN = 20  # `status` lists the run's latest events; `status -o json` has them all
QUIET_EVENTS = {"run.placed", "cluster.starting", "cluster.nodes_started", "attempt.submitting"}  # not news
OUTPUT = click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="raypulse launcher")
def main() -> None:
    """raypulse launcher: one command from a training script to a finished Ray job.

    \b
    Exit codes: 0 succeeded, 1 failed, 2 bad input (nothing started), 3 stopped,
                4 deadline exceeded, 5 cluster failed or lost, 6 failing the same way
                again, 7 unhealthy (health policy stopped it, or healing ran out of retries).
    """


def _signals_to(cancel: threading.Event) -> None:
    """SIGINT/SIGTERM only set the event: the launcher then stops the job and tears down in order.
    (Nothing else runs in the handler: it may interrupt code that holds the output lock.)"""

    def handler(signum: int, frame: Any) -> None:
        cancel.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _summary(record: RunRecord) -> str:
    attempts = len(record.attempts)
    plural = "s" if attempts != 1 else ""
    text = f"run {record.run_id} {record.state} after {attempts} attempt{plural} (exit {record.exit_code})"
    return text + (f": {record.reason}" if record.reason and record.state != "SUCCEEDED" else "")


@main.command()
@spec_options
@click.option("--no-wait", is_flag=True, help="Submit, print the run id on stdout and return (exit 0), as `ray job "
              "submit --no-wait`; where the cluster outlives the command (--address, --cluster, --keep-cluster, "
              "KubeRay). Nothing then retries, watches health or enforces deadlines: a later `launcher submit "
              "--run-id RUN_ID ...` without --no-wait supervises the run from where it is.")
def submit(file: Path | None, no_wait: bool, **options: Any) -> None:
    """Run a job: launcher submit [OPTIONS] -- COMMAND, or launcher submit -f job.yaml.

    Starts a local cluster (default), or uses --address/--cluster (or, as `ray job submit`,
    RAY_API_SERVER_ADDRESS / RAY_ADDRESS when they hold a dashboard URL), or applies a KubeRay RayJob
    (--backend kuberay); streams the job's output to stdout and exits with its final state.
    With --no-wait it returns once the job is submitted (see `launcher logs -f`, `status`, `stop`).
    """
    try:
        data, source = spec_data(file, options)
        data, taken = target.from_environment(data)
        spec = build_spec(data, taken.source(source) if taken else source).with_run_id()
        if no_wait:
            spec = detach.spec_for_no_wait(spec)
    except BadInput as exc:
        fail("submit", exc, ExitCode.BAD_INPUT)
    if spec.resolved_backend == "kuberay":
        try:
            kuberay.apply(spec)
        except BadInput as exc:
            fail("submit", exc, ExitCode.BAD_INPUT, run_id=spec.run_id)
        click.echo(f"launcher: applied RayJob {spec.run_id} in namespace {spec.namespace}; "
                   f"follow it with `kubectl get rayjob {spec.run_id} -n {spec.namespace} -w`", err=True)
        if no_wait:
            click.echo(spec.run_id)
        return
    cancel = threading.Event()
    _signals_to(cancel)
    reporter = reporter_for_terminal()
    if taken is not None:
        reporter.info(taken.note)
    reporter.info(f"run {spec.run_id} ({spec.resolved_backend}"
                  + (f", {spec.worker_count} worker(s)" if spec.resolved_backend == "local" else "") + ")")
    try:
        handle = api.submit(spec, reporter=reporter, cancel=cancel, follow_logs=not no_wait, detach=no_wait)
    except BadInput as exc:
        reporter.close()
        fail("submit", exc, ExitCode.BAD_INPUT, run_id=spec.run_id)
    except Cancelled:
        reporter.close()
        _stop_before_start(spec)
        sys.exit(int(ExitCode.STOPPED))
    except InfraError as exc:
        reporter.close()
        fail("submit", exc, ExitCode.INFRA_ERROR, run_id=spec.run_id)
    if no_wait:
        reporter.close()
        click.echo(spec.run_id)  # alone on stdout: RUN=$(launcher submit --no-wait ...)
        return
    record = handle.wait()
    reporter.info(_summary(record))
    reporter.close()
    sys.exit(record.exit_code)


def _stop_before_start(spec: JobSpec) -> None:
    """Interrupted while the cluster started: the run ends STOPPED with nothing submitted."""
    record = load_run(spec.run_id) or RunRecord(run_id=spec.run_id, name=spec.name, backend=spec.resolved_backend)
    finish_run(Journal(record=record), "STOPPED", "interrupted while the cluster started; nothing was submitted")
    click.echo(f"launcher: run {spec.run_id} STOPPED before its job was submitted (exit 3)", err=True)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if stamp else "-"


def _status_text(record: RunRecord) -> str:
    lines = [
        f"run       {record.run_id}   (job {record.name})",
        f"state     {record.state}" + (f"   exit {record.exit_code}" if record.exit_code is not None else ""),
    ]
    if record.reason:
        lines.append(f"reason    {record.reason}")
    if record.exit_code is None and record.detached:
        lines.append(f"note      submitted with --no-wait: nothing retries it, watches its health or enforces its "
                     f"deadlines; `launcher submit --run-id {record.run_id} ...` without --no-wait supervises it")
    elif record.exit_code is None and record.pid and not psutil.pid_exists(record.pid):
        lines.append(f"note      the launcher that ran it (pid {record.pid}) is gone; `launcher submit --run-id "
                     f"{record.run_id} ...` again follows the run where it is")
    where = record.address or "-"
    if record.cluster:
        where = f"local cluster {record.cluster} ({record.address or 'not started'})"
    lines += [f"where     {record.backend}: {where}", f"started   {_when(record.created_at)}",
              f"finished  {_when(record.finished_at)}",
              f"attempts  {len(record.attempts)} of {record.max_attempts}"]
    for attempt in record.attempts:
        detail = attempt.message or ""
        if attempt.driver_exit_code is not None and attempt.status == "FAILED":
            detail = f"driver exit {attempt.driver_exit_code}; {detail}"
        lines.append(f"  {attempt.attempt}  {attempt.submission_id}  {attempt.status:<9} "
                     f"{_when(attempt.submitted_at)} -> {_when(attempt.ended_at)}  {detail}".rstrip())
    shown = [event for event in record.events if event.message or event.kind not in QUIET_EVENTS]
    if shown:
        lines.append(f"events    {len(shown)}" + (f" (the latest {EVENTS_SHOWN})" if len(shown) > EVENTS_SHOWN else ""))
        for event in shown[-EVENTS_SHOWN:]:
            lines.append(f"  {_when(event.time)}  {event.kind:<22} {event.message or ''}".rstrip())
    return redact.text("\n".join(lines))  # reasons and messages may quote a command or a URL


def _read(action: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except BadInput as exc:
        click.echo(f"launcher: {exc}", err=True)
        sys.exit(int(ExitCode.BAD_INPUT))
    except InfraError as exc:
        click.echo(f"launcher: {action}: {exc}", err=True)
        sys.exit(int(ExitCode.INFRA_ERROR))


@main.command(name="report")
@click.argument("run_id")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              help="The HTML file [<the run's directory>/report.html].")
@click.option("--prometheus", metavar="URL", help="A Prometheus with raypulse's rules: the alerts that fired (and "
              "the series of a run not recorded) [the run's own --prometheus].")
def report_command(run_id: str, output: Path | None, prometheus: str | None) -> None:
    """Write a run's report: one HTML file that opens from disk with no network (docs/reports.md)."""
    from launcher import report

    click.echo(str(_read("report", lambda: report.render(run_id, output, prometheus=prometheus))))


@main.command(name="export")
@click.argument("run_id")
@click.option("--format", "fmt", type=click.Choice(["openmetrics"]), default="openmetrics", show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), help="The file [<run id>.om].")
def export_command(run_id: str, fmt: str, output: Path | None) -> None:
    """Write a run's recording for your Prometheus: `promtool tsdb create-blocks-from openmetrics FILE DIR`."""
    from launcher import export

    path = output or Path(f"{run_id}.om")
    samples = _read("export", lambda: export.export_run(run_id, path))
    click.echo(f"launcher: {samples} samples of run {run_id} in {path}; backfill with `promtool tsdb "
               f"create-blocks-from openmetrics {path} DATA_DIR`", err=True)


@main.command()
@click.argument("run_id")
@target_options
@OUTPUT
def status(run_id: str, address: str | None, cluster: str | None, token_path: Path | None, output: str) -> None:
    """Show a run: its state, exit code and every attempt."""
    record = _read("status", lambda: api.status(run_id, address=address, cluster=cluster, token_path=token_path))
    if output == "json":
        _print_json(redact.details(record.model_dump(mode="json", exclude={"spec"})))
    else:
        click.echo(_status_text(record))


@main.command()
@click.argument("run_id")
@click.option("--attempt", type=int, help="Attempt number [the latest].")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the attempt ends.")
@target_options
@OUTPUT
def logs(run_id: str, attempt: int | None, follow: bool, address: str | None, cluster: str | None,
         token_path: Path | None, output: str) -> None:
    """Print a run's driver log (live from its cluster, or as saved after the cluster is gone)."""
    if follow and output == "json":
        click.echo("launcher: --follow streams text; drop --output json", err=True)
        sys.exit(int(ExitCode.BAD_INPUT))
    chunks: list[str] = []

    def write(text: str) -> None:
        if output == "json":
            chunks.append(text)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    _read("logs", lambda: api.logs(run_id, attempt=attempt, follow=follow, write=write, address=address,
                                   cluster=cluster, token_path=token_path))
    if output == "json":
        _print_json({"run_id": run_id, "attempt": attempt, "log": "".join(chunks)})


@main.command()
@click.argument("run_id")
@target_options
def stop(run_id: str, address: str | None, cluster: str | None, token_path: Path | None) -> None:
    """Stop a run: its running attempt is stopped and no retry follows (its submit exits 3)."""
    stopped = _read("stop", lambda: api.stop(run_id, address=address, cluster=cluster, token_path=token_path))
    click.echo(f"launcher: stopped {', '.join(stopped)}" if stopped else
               f"launcher: run {run_id} has no running attempt; it will not be retried", err=True)


@main.command()
@click.argument("run_id")
@click.option("--live/--saved", default=None, help="Take the stacks now (the default while the run's attempt runs), "
              "or show those saved when a hang was found.")
@target_options
@OUTPUT
def diagnose(run_id: str, live: bool | None, address: str | None, cluster: str | None, token_path: Path | None,
             output: str) -> None:
    """Every process's Python stack of a run, grouped by where they are: most ranks of a hung collective
    wait in the same frame, the suspects elsewhere."""
    found = _read("diagnose", lambda: api.diagnose(run_id, live=live, address=address, cluster=cluster,
                                                   token_path=token_path))
    if output == "json":
        _print_json([{"directory": evidence.directory, "summary": evidence.summary, "groups": evidence.groups}
                     for evidence in found])
        return
    for evidence in found:
        click.echo(f"{evidence.directory}\n  {evidence.summary}")
        for frame, members in evidence.groups:
            click.echo(f"\n  {len(members)} in {frame}: {', '.join(members)}")
            sample = _stack_file(Path(evidence.directory), members[0])
            if sample is not None:
                click.echo("    " + "\n    ".join(sample.read_text().rstrip().splitlines()))
        click.echo("")


def _stack_file(directory: Path, member: str) -> Path | None:
    """The saved stack of a group's member (`actor Rank 4242@10.0.0.2`)."""
    pid = member.split("@")[0].split()[-1]
    return next(iter(sorted(directory.glob(f"*-{pid}-*.txt"))), None)


@main.command(name="list")
@target_options
@OUTPUT
def list_command(address: str | None, cluster: str | None, token_path: Path | None, output: str) -> None:
    """List runs and local clusters recorded here, or the runs on a cluster."""
    if address or cluster:
        runs = list(_read("list", lambda: api.runs_on_cluster(api.client_for(address, cluster, token_path))).values())
        clusters = []
    else:
        runs, clusters = list_runs(), list_clusters()
    if output == "json":
        _print_json(redact.details({"runs": [run.model_dump(mode="json", exclude={"spec"}) for run in runs],
                                    "clusters": [item.model_dump(mode="json") for item in clusters]}))
        return
    click.echo(f"{'RUN':<34} {'STATE':<18} {'ATTEMPTS':<8} {'BACKEND':<8} STARTED")
    for run in runs:
        click.echo(f"{run.run_id:<34} {run.state:<18} {len(run.attempts):<8} {run.backend:<8} {_when(run.created_at)}")
    if clusters:
        click.echo(f"\n{'CLUSTER':<34} {'NODES':<6} {'KEPT':<5} ADDRESS")
        for item in clusters:
            nodes = sum(1 for process in item.processes if process.role != "exporter")
            click.echo(f"{item.name:<34} {nodes:<6} {'yes' if item.kept else 'no':<5} {item.address}")


@main.command()
@spec_options
def up(file: Path | None, **options: Any) -> None:
    """Start a local cluster without a job; submit to it with --cluster NAME, stop it with down."""
    options["command"] = options.get("command") or ("true",)  # a cluster needs no entrypoint
    options["name"] = options.get("name") or "local"
    try:
        spec = spec_from_options(file, options)
        if spec.resolved_backend != "local":
            raise SpecError("backend: up starts a local cluster; --address/--cluster/--backend do not apply")
    except BadInput as exc:
        fail("cluster.up", exc, ExitCode.BAD_INPUT)
    cancel = threading.Event()
    _signals_to(cancel)
    reporter = reporter_for_terminal()
    try:
        record = api.up(spec, reporter=reporter, cancel=cancel)
    except BadInput as exc:
        reporter.close()
        fail("cluster.up", exc, ExitCode.BAD_INPUT, cluster=spec.name)
    except Cancelled:
        reporter.close()
        sys.exit(int(ExitCode.STOPPED))
    except InfraError as exc:
        reporter.close()
        fail("cluster.up", exc, ExitCode.INFRA_ERROR, cluster=spec.name)
    reporter.close()
    click.echo(f"cluster {record.name} is up: dashboard {record.address}, token {record.token_path}")
    for exporter in record.exporters:
        click.echo(f"  exporter {exporter.node:<12} {exporter.url}/metrics")
    click.echo(f"submit with: launcher submit --cluster {record.name} -- python train.py; "
               f"stop with: launcher down {record.name}")


@main.command()
@click.argument("names", nargs=-1)
@click.option("--all", "all_clusters", is_flag=True, help="Every local cluster recorded here.")
def down(names: tuple[str, ...], all_clusters: bool) -> None:
    """Tear down local clusters (from up or --keep-cluster)."""
    targets = [item.name for item in list_clusters()] if all_clusters else list(names)
    if not targets:
        click.echo("launcher: name a cluster (see `launcher list`) or pass --all", err=True)
        sys.exit(int(ExitCode.BAD_INPUT))
    reporter: Reporter = PlainReporter()
    for name in targets:
        _read("down", lambda name=name: api.down(name, reporter=reporter))


@main.command()
@spec_options
def render(file: Path | None, **options: Any) -> None:
    """Print the KubeRay manifests of a job: Secret, RayJob (+ exporter sidecars), PodMonitor."""
    options["backend"] = "kuberay"
    try:
        spec = spec_from_options(file, options).with_run_id()
        manifests = kuberay.render(spec)
    except BadInput as exc:
        fail("render", exc, ExitCode.BAD_INPUT)
    Journal().emit("manifests.rendered", run_id=spec.run_id, namespace=spec.namespace)
    click.echo(kuberay.to_yaml(manifests), nl=False)



# `launcher exporters ...` and `launcher prometheus-config` live in launcher/deploy/.
from launcher.deploy import exporters_group, prometheus_config  # noqa: E402

main.add_command(exporters_group)
main.add_command(prometheus_config)
