"""`exporter` command line: serve, check-config, metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from exporter import __version__, plugins, redact
from exporter.config import DEFAULT_PORT, ENV_PREFIX, ConfigError, ExporterConfig, unknown_environment
from exporter.gpusim.cli import gpu_fault

EXIT_CONFIG_ERROR = 2


# Flag (click parameter name) -> where it goes in the config. Options that collect several
# values (multiple=True) arrive as tuples and become lists.
_FLAG_PATHS: dict[str, tuple[str, ...]] = {
    "listen": ("listen",),
    "web_config": ("web_config_file",),
    "log_level": ("log_level",),
    "checkpoint_paths": ("node", "checkpoint_paths"),
    "procfs": ("node", "procfs"),
    "sysfs": ("node", "sysfs"),
    "rootfs": ("node", "rootfs"),
    "otlp_endpoint": ("otlp", "endpoint"),
    "cluster": ("cluster",),
    "ray_dashboard": ("ray", "dashboard_url"),
    "ray_role": ("ray", "role"),
    "ray_node_id": ("ray", "node_id"),
    "progress_listen": ("progress", "listen"),
    "simulate_gpus": ("gpu", "simulate"),
    "gpu_control": ("gpu", "control_file"),
}


def _flags(enable: tuple[str, ...] = (), disable: tuple[str, ...] = (), **values: Any) -> dict[str, Any]:
    """Only the flags actually given, shaped like the config file."""
    flags: dict[str, Any] = {}
    for name, value in values.items():
        if value is None or value == ():
            continue
        *parents, leaf = _FLAG_PATHS[name]
        section = flags
        for parent in parents:
            section = section.setdefault(parent, {})
        section[leaf] = list(value) if isinstance(value, tuple) else value
    collectors = {name: {"enabled": True} for name in enable}
    collectors |= {name: {"enabled": False} for name in disable}
    if collectors:
        flags["collectors"] = collectors
    return flags


def _load(config_file: Path | None, **flag_args: Any) -> ExporterConfig:
    for name in unknown_environment(os.environ):  # before logging is set up: straight to stderr
        click.echo(f"exporter: warning: {name} names no setting and is ignored (check the spelling; see "
                   "docs/configuration.md)", err=True)
    try:
        config = plugins.load(_flags(**flag_args), config_file)
        if config.web_config_file is not None:
            from exporter.webconfig import load_web_config

            load_web_config(config.web_config_file)
        return config
    except ConfigError as exc:
        click.echo(f"exporter: {exc}", err=True)
        sys.exit(EXIT_CONFIG_ERROR)


def _config_options(func: Any) -> Any:
    options = [
        click.option("--listen", metavar="HOST:PORT",
                     help=f"Address to serve on [default: 0.0.0.0:{DEFAULT_PORT}; env {ENV_PREFIX}LISTEN]."),
        click.option("--config", "config_file", type=click.Path(path_type=Path),
                     help="YAML config file (same shape as docs/configuration.md)."),
        click.option("--web-config", type=click.Path(path_type=Path),
                     help="TLS / basic auth file in Prometheus exporter-toolkit format."),
        click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"])),
        click.option("--enable-collector", "enable", multiple=True, metavar="NAME",
                     help="Turn a collector on (repeatable)."),
        click.option("--disable-collector", "disable", multiple=True, metavar="NAME",
                     help="Turn a collector off (repeatable)."),
        click.option("--checkpoint-path", "checkpoint_paths", multiple=True, type=click.Path(path_type=Path),
                     help="A checkpoint directory whose volume is always watched (repeatable)."),
        click.option("--procfs", type=click.Path(path_type=Path), help="procfs mount point [/proc]."),
        click.option("--sysfs", type=click.Path(path_type=Path), help="sysfs mount point [/sys]."),
        click.option("--rootfs", type=click.Path(path_type=Path), help="Host root for filesystem stats [/]."),
        click.option("--otlp-endpoint", metavar="URL",
                     help="Also push every metric to this OTLP/HTTP endpoint (e.g. http://collector:4318)."),
        click.option("--cluster", metavar="NAME", help="Name of the Ray cluster (the cluster label of /sd targets)."),
        click.option("--ray-dashboard", metavar="URL",
                     help="Ray dashboard URL, sent the Ray token [default: the one this node's raylet uses (the token "
                          "only when it is this host's and trusted), else http://127.0.0.1:8265 without it]."),
        click.option("--ray-node-id", metavar="HEX", help="Watch only this Ray node (several nodes on one host)."),
        click.option("--ray-role", type=click.Choice(["auto", "head", "worker"]),
                     help="head also exports jobs/cluster metrics and serves /sd [default: auto]."),
        click.option("--progress-listen", metavar="HOST:PORT|unix:PATH|off",
                     help="Training progress endpoint [default: 127.0.0.1:9478; loopback or unix socket]."),
        click.option("--simulate-gpus", type=click.IntRange(min=0), metavar="N",
                     help="Simulate N GPUs instead of reading NVML; their series say simulated=\"true\" "
                          "(docs/gpu-simulation.md)."),
        click.option("--gpu-control", type=click.Path(path_type=Path), metavar="FILE",
                     help="Fault-injection control file of the simulated GPUs (see `exporter gpu-fault`)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="raypulse exporter")
def main() -> None:
    """raypulse exporter: job, node/pod and GPU metrics of a Ray node for Prometheus."""


@main.command()
@_config_options
def serve(config_file: Path | None, **flag_args: Any) -> None:
    """Serve /metrics, /healthz, /readyz and / until interrupted."""
    config = _load(config_file, **flag_args)
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from exporter.server import serve as run_server

    try:
        asyncio.run(run_server(config))
    except OSError as exc:  # e.g. the port is taken
        click.echo(f"exporter: cannot listen on {config.listen}: {exc.strerror or exc}", err=True)
        sys.exit(1)


@main.command("check-config")
@_config_options
def check_config(config_file: Path | None, **flag_args: Any) -> None:
    """Validate the configuration and print the effective settings as YAML."""
    import yaml

    config = _load(config_file, **flag_args)
    effective = config.model_dump(mode="json")
    effective["otlp"]["headers"] = redact.values(config.otlp.headers)  # API keys are not for the terminal
    if config.otlp.endpoint:
        effective["otlp"]["endpoint"] = redact.url(config.otlp.endpoint)
    click.echo(yaml.safe_dump(effective, sort_keys=False), nl=False)


@main.command("config-reference")
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write here instead of stdout.")
def config_reference(output: Path | None) -> None:
    """Print every setting with its environment variable and flag (docs/configuration.md)."""
    from exporter import reference

    _write(reference.configuration_markdown(), output)


@main.command()
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write here instead of stdout.")
def metrics(fmt: str, output: Path | None) -> None:
    """Print the metric catalog (docs/metrics.md is this command's markdown)."""
    from exporter import reference

    _write(reference.markdown() if fmt == "markdown" else reference.as_json() + "\n", output)


def _write(text: str, output: Path | None) -> None:
    if output:
        output.write_text(text)
    else:
        click.echo(text, nl=False)


main.add_command(gpu_fault)  # exporter gpu-fault: fault injection for simulated GPUs
