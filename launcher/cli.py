"""`launcher` command line: submit, status, logs, stop, list, up, down, render.

Verbs and flags follow `ray job` and kubectl (`--output json`, `logs --follow`); every submit option
is a field of the job spec (launcher/flags.py) so `-f job.yaml` and flags mix freely, flags winning.
Exit codes are launcher.exitcodes.ExitCode; bad input exits 2 before anything starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import click
import psutil

from exporter import __version__, outputflag
from exporter.outputflag import format_option
from launcher import api, checkpoint_advice, detach, redact, target
from launcher.backends.base import Backend, HandedOff
from launcher.backends.existing import client_for
from launcher.backends.kuberay.backend import KubeRayBackend
from launcher.backends.local.backend import UP_CLUSTER_NAME, LocalBackend
from launcher.backends.registry import resolve
from launcher.display import PlainReporter, Reporter, RichReporter, own_line, printable, reporter_for_terminal
from launcher.errors import BadInput, Cancelled, InfraError
from launcher.exitcodes import ExitCode
from launcher.failing import fail
from launcher.flags import spec_data, spec_from_options, spec_options
from launcher.journal import Journal
from launcher.ledger import ledger
from launcher.run import finish_run
from launcher.spec import JobSpec, SpecError, build_spec
from launcher.state import RunRecord, list_clusters, list_runs, load_run


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
FORMATS = ("text", "json")
OUTPUT = format_option(FORMATS)


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
@OUTPUT
def submit(file: Path | None, no_wait: bool, output: str, **options: Any) -> None:
    """Run a job: launcher submit [OPTIONS] -- COMMAND, or launcher submit -f job.yaml.

    Starts a local cluster (default), or uses --address/--cluster (or, as `ray job submit`,
    RAY_API_SERVER_ADDRESS / RAY_ADDRESS when they hold a dashboard URL), or applies a KubeRay RayJob
    (--backend kuberay); streams the job's output to stdout and exits with its final state.
    With --no-wait it returns once the job is submitted (see `launcher logs -f`, `status`, `stop`).
    -o json: stdout holds only the run as `launcher status -o json` shows it, once it ends (the job's
    output is kept for `launcher logs`), or right away with --no-wait.
    """
    try:
        data, source = spec_data(file, options)
        data, taken = target.from_environment(data)
        spec = build_spec(data, taken.source(source) if taken else source).with_run_id()
        backend = resolve(spec)
        if no_wait:
            spec = detach.spec_for_no_wait(spec, backend)
    except BadInput as exc:
        fail("submit", exc, ExitCode.BAD_INPUT)
    cancel = threading.Event()
    _signals_to(cancel)
    reporter = _reporter(spec)
    if taken is not None:
        reporter.info(taken.note)
    if not backend.followed:  # its platform supervises the run; the launcher watches it to its end
        try:
            record = cast(HandedOff, backend).hand_off(reporter, cancel, detach=no_wait)
        except BadInput as exc:
            reporter.close()
            fail("submit", exc, ExitCode.BAD_INPUT, run_id=spec.run_id)
        reporter.close()
        if output == "json":
            _print_run(record)
        elif no_wait:
            click.echo(spec.run_id)
        if no_wait:
            return
        sys.exit(record.exit_code)
    reporter.info(f"run {spec.run_id} ({backend.describe()})")
    try:
        handle = api.submit(spec, reporter=reporter, cancel=cancel, follow_logs=not no_wait and output == "text",
                            detach=no_wait)
    except BadInput as exc:
        reporter.close()
        fail("submit", exc, ExitCode.BAD_INPUT, run_id=spec.run_id)
    except Cancelled:
        reporter.close()
        _stop_before_start(spec, backend)
        sys.exit(int(ExitCode.STOPPED))
    except InfraError as exc:
        reporter.close()
        fail("submit", exc, ExitCode.INFRA_ERROR, run_id=spec.run_id)
    if no_wait:
        reporter.close()
        if output == "json":
            _print_run(handle.record)
        else:
            click.echo(spec.run_id)  # alone on stdout: RUN=$(launcher submit --no-wait ...)
        return
    record = handle.wait()
    reporter.info(_summary(record))
    reporter.info(f"where the time went: {ledger(record).line()}")
    advice = checkpoint_advice.for_run(record)
    if advice is not None:
        reporter.info(checkpoint_advice.describe(advice))
    reporter.close()
    if output == "json":
        _print_run(record)
    sys.exit(record.exit_code)


def _reporter(spec: JobSpec) -> Reporter:
    """The launcher's lines as --log-style/--log-color say (Ray's meanings): record is plain lines,
    pretty the live display, auto pretty on a terminal; colour forced on or off through Rich's own
    FORCE_COLOR / NO_COLOR."""
    if spec.log_style == "record":
        return PlainReporter()
    if spec.log_style == "auto" and spec.log_color != "true" and not sys.stderr.isatty():
        return reporter_for_terminal()
    color = {"true": {"FORCE_COLOR": "1"}, "false": {"NO_COLOR": "1"}}.get(spec.log_color, {})
    with _environment(color):
        return RichReporter()


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` while a console is built (Rich reads them once, then)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _stop_before_start(spec: JobSpec, backend: Backend) -> None:
    """Interrupted while the cluster started: the run ends STOPPED with nothing submitted."""
    record = load_run(spec.run_id) or RunRecord(run_id=spec.run_id, name=spec.name, backend=backend.name)
    finish_run(Journal(record=record), "STOPPED", "interrupted while the cluster started; nothing was submitted")
    click.echo(f"launcher: run {spec.run_id} STOPPED before its job was submitted (exit 3)", err=True)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _print_run(record: RunRecord) -> None:
    """A run as `launcher status -o json` prints it: its record, and its checkpoint advice (null when there is
    nothing to advise on)."""
    advice = checkpoint_advice.for_run(record)
    _print_json(redact.details({**record.model_dump(mode="json", exclude={"spec"}),
                                "checkpoint_advice": checkpoint_advice.as_json(advice) if advice else None}))


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
    lines.append(f"time      {ledger(record).line()}")
    advice = checkpoint_advice.for_run(record)
    if advice is not None:
        lines.append(f"checkpts  {checkpoint_advice.summary(advice)}")
    lines += _hang_thresholds(record)
    shown = [event for event in record.events if event.message or event.kind not in QUIET_EVENTS]
    if shown:
        lines.append(f"events    {len(shown)}" + (f" (the latest {EVENTS_SHOWN})" if len(shown) > EVENTS_SHOWN else ""))
        for event in shown[-EVENTS_SHOWN:]:
            lines.append(f"  {_when(event.time)}  {event.kind:<22} {event.message or ''}".rstrip())
    # Reasons and messages may quote a command or a URL; much of it came from the cluster (a job's message
    # is its driver's log tail): each line printable, so nothing in it reaches the terminal as a control.
    return redact.text("\n".join(printable(line) for line in lines))


def _hang_thresholds(record: RunRecord) -> list[str]:
    """The hang thresholds in force (the latest health.threshold event of each), between reports first."""
    latest = {event.details.get("phase"): event for event in record.events if event.kind == "health.threshold"}
    ordered = sorted(latest.items(), key=lambda item: (item[0] is not None, item[0] or ""))
    return [f"hang      after {event.details['seconds']:g}s " + (f"in phase {phase}" if phase else "without progress")
            + f" ({event.details['basis']})" for phase, event in ordered]


def _read(action: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except BadInput as exc:
        click.echo(f"launcher: {own_line(str(exc))}", err=True)
        sys.exit(int(ExitCode.BAD_INPUT))
    except InfraError as exc:
        click.echo(f"launcher: {action}: {own_line(str(exc))}", err=True)
        sys.exit(int(ExitCode.INFRA_ERROR))


RUN_DIR = click.option("--run-dir", type=click.Path(path_type=Path, file_okay=False, exists=True), metavar="DIR",
                       help="Read a run directory kept elsewhere (copied from another machine) instead of a run id; "
                       "it is only read.")


def _run_or_dir(run_id: str | None, run_dir: Path | None) -> str | Path:
    """The run a read-side command is about: a run id under $RAYPULSE_HOME, or --run-dir."""
    if (run_id is None) == (run_dir is None):
        click.echo("launcher: give a RUN_ID (see `launcher list`) or --run-dir DIR, one of them", err=True)
        sys.exit(int(ExitCode.BAD_INPUT))
    return run_dir if run_dir is not None else str(run_id)


@main.command(name="report")
@click.argument("run_id", required=False)
@RUN_DIR
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="The HTML file [<the run's directory>/report.html; with --run-dir: <DIR name>-report.html here].")
@click.option("--prometheus", metavar="URL", help="A Prometheus with raypulse's rules: the alerts that fired (and "
              "the series of a run not recorded) [the run's own --prometheus].")
@format_option(legacy_path=True)
def report_command(run_id: str | None, run_dir: Path | None, out: Path | None, prometheus: str | None,
                   output: str) -> None:
    """Write a run's report: one HTML file that opens from disk with no network (docs/reports.md).
    Prints the file's path (-o json: {"path": ...})."""
    from launcher import report

    output, out = outputflag.resolve("launcher", output, out, FORMATS, "--out")
    run = _run_or_dir(run_id, run_dir)
    if run_dir is not None and out is None:
        out = Path(f"{run_dir.resolve().name}-report.html")  # a directory kept elsewhere is only read
    path = _read("report", lambda: report.render(run, out, prometheus=prometheus))
    if output == "json":
        _print_json({"path": str(path)})
    else:
        click.echo(str(path))


@main.command(name="export")
@click.argument("run_id", required=False)
@RUN_DIR
@click.option("--format", "fmt", type=click.Choice(["openmetrics"]), default="openmetrics", show_default=True)
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="The file [<run id>.om, or <DIR name>.om with --run-dir].")
@format_option(legacy_path=True)
def export_command(run_id: str | None, run_dir: Path | None, fmt: str, out: Path | None, output: str) -> None:
    """Write a run's recording for your Prometheus: `promtool tsdb create-blocks-from openmetrics FILE DIR`.
    -o json prints {"path", "samples", "left_out"} on stdout."""
    from launcher import export

    output, out = outputflag.resolve("launcher", output, out, FORMATS, "--out")
    run = _run_or_dir(run_id, run_dir)
    name = run_dir.resolve().name if run_dir is not None else run_id
    path = out or Path(f"{name}.om")
    dropped: list[Any] = []
    samples = _read("export", lambda: export.export_run(run, path, dropped))
    if output == "json":
        _print_json({"path": str(path), "samples": samples, "left_out": len(dropped)})
    if dropped:
        click.echo(f"launcher: left out {len(dropped)} series whose metric or label names are not Prometheus "
                   "names (a target could forge samples with them)", err=True)
    click.echo(f"launcher: {samples} samples of run {name} in {path}; backfill with `promtool tsdb "
               f"create-blocks-from openmetrics {path} DATA_DIR`", err=True)


@main.command()
@click.argument("run_id")
@target_options
@OUTPUT
def status(run_id: str, address: str | None, cluster: str | None, token_path: Path | None, output: str) -> None:
    """Show a run: its state, exit code and every attempt."""
    record = _read("status", lambda: api.status(run_id, address=address, cluster=cluster, token_path=token_path))
    if output == "json":
        _print_run(record)
    else:
        click.echo(_status_text(record))


@main.command()
@click.argument("run_id")
@click.option("--attempt", type=int, help="Attempt number [the latest].")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the attempt ends.")
@click.option("--all-nodes", is_flag=True, help="Save every node's log under the run's directory instead (KubeRay: "
              "each Ray pod's and the submitter's, as `kubectl ray log`; one size budget for all together).")
@target_options
@OUTPUT
def logs(run_id: str, attempt: int | None, follow: bool, all_nodes: bool, address: str | None, cluster: str | None,
         token_path: Path | None, output: str) -> None:
    """Print a run's driver log (live from its cluster, or as saved after the cluster is gone)."""
    if follow and output == "json":
        click.echo("launcher: --follow streams text; drop --output json", err=True)
        sys.exit(int(ExitCode.BAD_INPUT))
    if all_nodes:
        clash = next((flag for flag, given in (("--follow", follow), ("--attempt", attempt is not None),
                                               ("--address", address), ("--cluster", cluster)) if given), None)
        if clash:
            click.echo(f"launcher: --all-nodes saves the nodes' logs of a run recorded here, now; drop {clash}",
                       err=True)
            sys.exit(int(ExitCode.BAD_INPUT))
        gathered = _read("logs", lambda: api.node_logs(run_id, token_path=token_path))
        if output == "json":
            _print_json({"run_id": run_id, **gathered.as_dict()})
        else:
            click.echo(f"launcher: run {run_id}: {gathered.summary}; saved in {gathered.directory}")
        return
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
@OUTPUT
def stop(run_id: str, address: str | None, cluster: str | None, token_path: Path | None, output: str) -> None:
    """Stop a run: its running attempt is stopped and no retry follows (its submit exits 3)."""
    stopped = _read("stop", lambda: api.stop(run_id, address=address, cluster=cluster, token_path=token_path))
    if output == "json":
        _print_json({"run_id": run_id, "stopped": list(stopped)})
        return
    click.echo(f"launcher: stopped {printable(', '.join(stopped))}" if stopped else
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
        client = _read("list", lambda: client_for(address, cluster, token_path))
        runs = list(_read("list", lambda: api.runs_on_cluster(client)).values())
        clusters = []
    else:
        runs, clusters = list_runs(), list_clusters()
    if output == "json":
        _print_json(redact.details({"runs": [run.model_dump(mode="json", exclude={"spec"}) for run in runs],
                                    "clusters": [item.model_dump(mode="json") for item in clusters]}))
        return
    click.echo(f"{'RUN':<34} {'STATE':<18} {'ATTEMPTS':<8} {'BACKEND':<8} STARTED")
    for run in runs:  # a run on a cluster: its id and state came from there
        click.echo(printable(f"{run.run_id:<34} {run.state:<18} {len(run.attempts):<8} {run.backend:<8} "
                             f"{_when(run.created_at)}"))
    if clusters:
        click.echo(f"\n{'CLUSTER':<34} {'NODES':<6} {'KEPT':<5} ADDRESS")
        for item in clusters:
            nodes = sum(1 for process in item.processes if process.role != "exporter")
            click.echo(f"{item.name:<34} {nodes:<6} {'yes' if item.kept else 'no':<5} {item.address}")


@main.command()
@spec_options
@OUTPUT
def up(file: Path | None, output: str, **options: Any) -> None:
    """Start a local cluster without a job; submit to it with --cluster NAME, stop it with down.
    -o json prints the cluster's record (dashboard address, token file, exporters)."""
    options["command"] = options.get("command") or ("true",)  # a cluster needs no entrypoint
    options["name"] = options.get("name") or UP_CLUSTER_NAME
    try:
        spec = spec_from_options(file, options)
        if not isinstance(resolve(spec), LocalBackend):
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
    if output == "json":
        _print_json(record.model_dump(mode="json"))
        return
    click.echo(f"cluster {record.name} is up: dashboard {record.address}, token {record.token_path}")
    for exporter in record.exporters:
        click.echo(f"  exporter {exporter.node:<12} {exporter.url}/metrics")
    click.echo(f"submit with: launcher submit --cluster {record.name} -- python train.py; "
               f"stop with: launcher down {record.name}")


@main.command()
@click.argument("names", nargs=-1)
@click.option("--all", "all_clusters", is_flag=True, help="Every local cluster recorded here.")
@OUTPUT
def down(names: tuple[str, ...], all_clusters: bool, output: str) -> None:
    """Tear down local clusters (from up or --keep-cluster)."""
    targets = [item.name for item in list_clusters()] if all_clusters else list(names)
    if not targets:
        click.echo("launcher: name a cluster (see `launcher list`) or pass --all", err=True)
        sys.exit(int(ExitCode.BAD_INPUT))
    reporter: Reporter = PlainReporter()
    for name in targets:
        _read("down", lambda name=name: api.down(name, reporter=reporter))
    if output == "json":
        _print_json({"down": targets})


@main.command()
@spec_options
@format_option(("yaml", "json"))
def render(file: Path | None, output: str, **options: Any) -> None:
    """Print the KubeRay manifests of a job: Secret, RayJob (+ exporter sidecars), PodMonitor (-o json:
    one v1 List, as kubectl)."""
    from launcher.backends.kuberay import render as kuberay  # the KubeRay renderer: for this command only

    options["backend"] = KubeRayBackend.name
    try:
        spec = spec_from_options(file, options).with_run_id()
        manifests = kuberay.render(spec)
    except BadInput as exc:
        fail("render", exc, ExitCode.BAD_INPUT)
    Journal().emit("manifests.rendered", run_id=spec.run_id, namespace=spec.namespace)
    if output == "json":
        _print_json({"apiVersion": "v1", "kind": "List", "items": manifests})
    else:
        click.echo(kuberay.to_yaml(manifests), nl=False)



# `launcher exporters ...` and `launcher prometheus-config` live in launcher/deploy/.
from launcher.deploy import exporters_group, prometheus_config  # noqa: E402

main.add_command(exporters_group)
main.add_command(prometheus_config)
