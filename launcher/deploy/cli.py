"""`launcher exporters deploy|status|remove` and `launcher prometheus-config`: observe an existing
Ray cluster (its dashboard URL and token, as for `launcher submit --address`). `launcher exporters
manifests` (manifests_cli.py) renders the same exporters for a Kubernetes cluster's nodes instead."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from exporter.config import ConfigError
from exporter.contract import wire
from exporter.outputflag import format_option
from launcher.deploy import remote
from launcher.deploy.manifests_cli import manifests
from launcher.errors import BadInput, InfraError
from launcher.exitcodes import ExitCode
from launcher.failing import fail
from launcher.jobs import JobsClient, read_token
from launcher.journal import Journal
from launcher.state import forget_deployment, load_deployment_access


def _target(func: Callable) -> Callable:
    func = click.option("--token-path", type=click.Path(path_type=Path),
                        help="Ray auth token file (else RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH).")(func)
    return click.option("--address", required=True, metavar="URL", help="The Ray dashboard, http://head:8265.")(func)


def _client(action: str, address: str, token_path: Path | None) -> JobsClient:
    try:
        return JobsClient(address, read_token(token_path))
    except BadInput as exc:
        fail(action, str(exc), ExitCode.BAD_INPUT, address=address)


@click.group(name="exporters")
def exporters_group() -> None:
    """One raypulse exporter on every node: of an existing Ray cluster, placed and kept by Ray (deploy, status,
    remove), or of a Kubernetes cluster, as a DaemonSet with its monitoring objects (manifests)."""


exporters_group.add_command(manifests)


@exporters_group.command()
@_target
@click.option("--port", type=click.IntRange(1, 65534), default=wire.EXPORTER_PORT, show_default=True,
              help="Each node's exporter port (progress on port+1); nodes sharing an IP take port+2k.")
@click.option("--cluster", "cluster_name", default="ray", show_default=True, help="The `cluster` label of /sd.")
@click.option("--simulate-gpus", type=click.IntRange(min=0), default=0, help="Simulated GPUs per node (demos).")
@click.option("--interval", type=click.FloatRange(0.5, 3600), default=5.0, show_default=True,
              help="Seconds between the supervisor's rounds (new nodes, dead nodes, dead exporters).")
@click.option("--start-timeout", type=click.FloatRange(1, 3600), default=60.0, show_default=True,
              help="Seconds an exporter may take to answer /healthz before its node counts as failed.")
@click.option("--pip", multiple=True, metavar="REQ", help="Extra pip requirement for the runtime env (repeatable).")
@click.option("--with-deps", is_flag=True,
              help="Also pip-install the exporter's dependencies that Ray does not bring, pinned to this "
                   "launcher's versions (hosts with Ray only; needs a package index the nodes can reach).")
@click.option("--web-config", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="TLS and basic auth for every exporter (exporter-toolkit web config, here on this machine): "
                   "checked here, then sent with the certificates it names to every node.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def deploy(address: str, token_path: Path | None, port: int, cluster_name: str, simulate_gpus: int,
           interval: float, start_timeout: float, pip: tuple[str, ...], with_deps: bool, web_config: Path | None,
           output: str) -> None:
    """Place an exporter on every alive node, and a supervisor that keeps doing so. Idempotent."""
    bundle = None
    if web_config is not None:
        try:
            bundle = remote.web_config_bundle(web_config)
        except ConfigError as exc:
            fail("exporters.deploy", f"--web-config: {exc}; fix the file, or leave --web-config out",
                 ExitCode.BAD_INPUT, address=address)
    if with_deps:
        pip = (*remote.exporter_requirements(), *pip)
    client = _client("exporters.deploy", address, token_path)
    config: dict[str, object] = {"port": port, "cluster": cluster_name, "simulate_gpus": simulate_gpus,
                                 "interval_s": interval, "start_timeout_s": start_timeout}
    if bundle is not None:  # the digest only: a second deploy compares settings, and they are shown
        config.update(tls=bundle.tls, web_config_sha256=bundle.sha256)
    try:
        run = remote.run_agent(client, ["deploy", json.dumps(config, sort_keys=True)], pip,
                               files=bundle.files if bundle is not None else None)
    except InfraError as exc:
        fail("exporters.deploy", str(exc), ExitCode.INFRA_ERROR, address=address)
    if run.result is None:
        fail("exporters.deploy", f"the deploy job {run.submission_id} ended {run.status} without a result "
              f"(can the cluster import the exporter package?); its log ends:\n{run.logs[-3000:]}",
              ExitCode.INFRA_ERROR, address=address)
    if output == "json":
        click.echo(json.dumps(run.result, indent=2))
    if "error" in run.result:
        fail("exporters.deploy", run.result["error"], ExitCode.BAD_INPUT, address=address)
    if not run.result.get("supervisor_existed"):  # these exporters run with this deploy's web config (or none)
        forget_deployment(address)
        if bundle is not None:
            remote.save_access(address, bundle)
    elif bundle is not None and load_deployment_access(address) is None:
        click.echo("launcher: warning: these exporters were deployed from elsewhere with this web config; this "
                   "launcher has no credentials of its own for them (`exporters remove`, then deploy again, to "
                   "get some)", err=True)
    nodes = run.result["nodes"]
    failed = [node for node in nodes if not node["ok"]]
    if output == "text":
        for node in nodes:
            change = "placed" if node.get("placed_now") else "unchanged"
            state = "up" if node["ok"] else "FAILED"
            click.echo(f"{node['node_id'][:16]}  {node['role']:<6} {node.get('url', '-'):<28} "
                       f"{state:<6} {change}")
    Journal().emit("exporters.deployed", address=address, nodes=len(nodes),
                   failed=[node["node_id"] for node in failed])
    for node in failed:
        tail = (node.get("stderr_tail") or "").strip()
        click.echo(f"launcher: node {node['node_id']} ({node['host']}): {node['error']}"
                   + (f"; the exporter's output ends:\n{tail}" if tail else ""), err=True)
    if failed:
        click.echo(f"launcher: {len(failed)} of {len(nodes)} nodes have no working exporter; the supervisor "
                   "keeps retrying them (`launcher exporters remove` to stop)", err=True)
        sys.exit(int(ExitCode.FAILED))


@exporters_group.command()
@_target
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def status(address: str, token_path: Path | None, output: str) -> None:
    """Every alive node with its exporter: URL, up, version. Exits 1 unless every node's answers."""
    client = _client("exporters.status", address, token_path)
    try:
        report = remote.exporters_status(client, load_deployment_access(address))
    except InfraError as exc:
        fail("exporters.status", str(exc), ExitCode.INFRA_ERROR, address=address)
    if output == "json":
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(f"supervisor: {'running' if report['supervisor'] else 'not running'}")
        click.echo(f"{'NODE ID':<58} {'ADDRESS':<16} {'ROLE':<7} {'EXPORTER':<28} {'UP':<4} VERSION")
        for row in report["nodes"]:
            click.echo(f"{row['node_id']:<58} {row['address']:<16} {row['role']:<7} {row['exporter_url'] or '-':<28} "
                       f"{'yes' if row['up'] else 'no':<4} {row['version'] or '-'}")
    sys.exit(0 if report["complete"] else int(ExitCode.FAILED))


@exporters_group.command()
@_target
@format_option()
def remove(address: str, token_path: Path | None, output: str) -> None:
    """Remove the supervisor, every node's actor and its exporter process. -o json: what was removed."""
    client = _client("exporters.remove", address, token_path)
    try:
        run = remote.run_agent(client, ["remove"])
    except InfraError as exc:
        fail("exporters.remove", str(exc), ExitCode.INFRA_ERROR, address=address)
    if run.result is None or run.result.get("left"):
        fail("exporters.remove", f"the remove job {run.submission_id} ended {run.status}; still there: "
              f"{(run.result or {}).get('left', '?')}; its log ends:\n{run.logs[-3000:]}", ExitCode.INFRA_ERROR,
              address=address)
    forget_deployment(address)
    Journal().emit("exporters.removed", address=address, removed=run.result["removed"])
    if output == "json":
        click.echo(json.dumps({"address": address, "removed": run.result["removed"]}, indent=2))
        return
    click.echo(f"launcher: removed {len(run.result['removed'])} actors (and their exporters)", err=True)


def _scale_options(func: Callable) -> Callable:
    """Sharding, remote_write and the cut (launcher/deploy/prometheus_scale.py), for clusters of thousands of nodes."""
    options = [
        click.option("--shards", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Prometheus servers sharing the targets (hashmod of the target address)."),
        click.option("--shard", type=click.IntRange(min=0), default=0, show_default=True,
                     help="This server's number, 0 to --shards - 1."),
        click.option("--remote-write", metavar="URL", help="Also send every sample to this long-term store "
                     "(Thanos Receive, Mimir, VictoriaMetrics: its push URL)."),
        click.option("--remote-write-user", metavar="USER", help="Basic auth user for --remote-write."),
        click.option("--remote-write-password-file", metavar="PATH", help="...and the file with its password, "
                     "as Prometheus will read it (never read or printed here)."),
        click.option("--remote-write-bearer-token-file", metavar="PATH", help="Or a bearer token file for "
                     "--remote-write, as Prometheus will read it."),
        click.option("--cut", is_flag=True, help="Drop the high-cardinality families no alert needs and no panel "
                     "depends on (per-link NVLink; `python -m dashboards.cut` lists them)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _scale(document: dict[str, Any], shards: int, shard: int, remote_write: str | None, remote_write_user: str | None,
           remote_write_password_file: str | None, remote_write_bearer_token_file: str | None,
           cut: bool) -> dict[str, Any]:
    from launcher.deploy import prometheus_scale

    document = prometheus_scale.shard(document, shards, shard)
    if remote_write:
        document = prometheus_scale.remote_write(document, remote_write, user=remote_write_user,
                                                 password_file=remote_write_password_file,
                                                 bearer_token_file=remote_write_bearer_token_file)
    elif remote_write_user or remote_write_password_file or remote_write_bearer_token_file:
        raise prometheus_scale.ScaleError("--remote-write-user/--remote-write-*-file: give them with "
                                          "--remote-write URL")
    return prometheus_scale.cut(document) if cut else document


@click.command(name="prometheus-config")
@_target
@click.option("--scrape-interval", default="15s", show_default=True)
@click.option("--sd-refresh-interval", default="30s", show_default=True, help="How often Prometheus re-reads /sd.")
@click.option("--alertmanager", metavar="HOST:PORT", help="Send alerts here.")
@click.option("--ca-file", metavar="PATH", help="Exporters deployed with TLS: the CA Prometheus verifies them with "
              "[the system's]; their certificates must name the nodes' IPs.")
@click.option("--basic-auth-user", metavar="USER", help="Exporters deployed with basic auth: Prometheus's user.")
@click.option("--basic-auth-password-file", metavar="PATH", help="...and the file with its password, as "
              "Prometheus will read it.")
@_scale_options
@format_option(("yaml", "json"))
def prometheus_config(address: str, token_path: Path | None, scrape_interval: str, sd_refresh_interval: str,
                      alertmanager: str | None, ca_file: str | None, basic_auth_user: str | None,
                      basic_auth_password_file: str | None, output: str, **scale: Any) -> None:
    """Print a Prometheus config: every node's exporter through the head exporter's /sd, and the
    rules of alerts/rules/ (absolute paths). Large clusters: --shards/--shard, --remote-write, --cut
    (docs/scale.md). -o json: the same document as JSON (Prometheus reads YAML)."""
    # The rules, the scale-out and the cut (which reads the dashboards) load for this command only: every
    # `launcher` command registers it, few run it.
    from alerts import prometheus
    from launcher.deploy import prometheus_scale

    if bool(basic_auth_user) != bool(basic_auth_password_file):
        fail("prometheus-config", "--basic-auth-user: give it with --basic-auth-password-file (Prometheus reads "
             "the password from that file)", ExitCode.BAD_INPUT, address=address)
    try:  # bad options fail here, before the cluster is asked
        _scale({"global": {}, "scrape_configs": []}, **{**scale, "cut": False})
    except prometheus_scale.ScaleError as exc:
        fail("prometheus-config", str(exc), ExitCode.BAD_INPUT, address=address)
    client = _client("prometheus-config", address, token_path)
    try:
        report = remote.exporters_status(client, load_deployment_access(address))
    except InfraError as exc:
        fail("prometheus-config", str(exc), ExitCode.INFRA_ERROR, address=address)
    head = next((row for row in report["nodes"] if row["role"] == "head" and row["exporter_url"]), None)
    if head is None:
        fail("prometheus-config", f"no exporter is deployed on the head node of {address}; run `launcher "
              "exporters deploy` first", ExitCode.BAD_INPUT, address=address)
    document = prometheus.config(sd_url=head["exporter_url"] + wire.SD_PATH, scrape_interval=scrape_interval,
                                 sd_refresh_interval=sd_refresh_interval, alertmanager=alertmanager)
    # The same TLS and credentials for /sd and for every node's /metrics (one web config on all nodes);
    # Ray's metrics agents and the rollout servers serve plain HTTP and are sent no credentials (only the read
    # of /sd/ray and /sd/rollout is).
    client_settings: dict[str, object] = {}
    if head["exporter_url"].startswith("https:"):
        client_settings["tls_config"] = {"ca_file": ca_file} if ca_file else {}
    if basic_auth_user:
        client_settings["basic_auth"] = {"username": basic_auth_user, "password_file": basic_auth_password_file}
    if client_settings:
        for job in document["scrape_configs"]:
            if job["job_name"] not in (wire.RAY_METRICS_JOB, wire.ROLLOUT_METRICS_JOB):
                job.update(client_settings, scheme="https" if "tls_config" in client_settings else "http")
            for sd in job.get("http_sd_configs", []):
                sd.update(client_settings)
    try:
        document = _scale(document, **scale)
    except prometheus_scale.ScaleError as exc:
        fail("prometheus-config", str(exc), ExitCode.BAD_INPUT, address=address)
    click.echo(json.dumps(document, indent=2) if output == "json" else prometheus.render(document), nl=output == "json")

