"""`exporter` command line: serve, check-config, metrics."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, ClassVar

import click

# In this order, before the rest: _malloc tunes glibc's malloc when the process serves (before the imports
# fill the heap); aiohttp_lazy imports aiohttp (which plugins import) without its import-time loads of the CA
# store and the MIME types, both left to their first use.
from exporter import _malloc  # noqa: F401
from exporter.serving import aiohttp_lazy  # noqa: F401

# isort: split
from exporter import __version__, outputflag, plugins, profiles, redact
from exporter._malloc import cap_malloc_arenas, pin_mmap_threshold
from exporter.config import DEFAULT_PORT, ENV_PREFIX, ConfigError, ExporterConfig, unknown_environment
from exporter.outputflag import format_option

EXIT_CONFIG_ERROR = 2


# Flag (click parameter name) -> where it goes in the config. Options that collect several
# values (multiple=True) arrive as tuples and become lists.
_FLAG_PATHS: dict[str, tuple[str, ...]] = {
    "listen": ("listen",),
    "web_config": ("web_config_file",),
    "log_level": ("log_level",),
    "profile": ("profile",),
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


def _flags(enable: tuple[str, ...] = (), disable: tuple[str, ...] = (), disable_defaults: bool = False,
           **values: Any) -> dict[str, Any]:
    """Only the flags actually given, shaped like the config file."""
    if disable_defaults:  # node_exporter's spelling of --profile none
        if values.get("profile") not in (None, profiles.NONE):
            raise click.UsageError(f"--collector.disable-defaults is --profile {profiles.NONE}; it contradicts "
                                   f"--profile {values['profile']} (give one of them)")
        values["profile"] = profiles.NONE
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
            from exporter.serving.webconfig import load_web_config

            load_web_config(config.web_config_file)
        return config
    except ConfigError as exc:
        click.echo(f"exporter: {exc}", err=True)
        sys.exit(EXIT_CONFIG_ERROR)


def _config_options(func: Any) -> Any:
    options = [
        click.option("--listen", "--web.listen-address", "listen", metavar="HOST:PORT",
                     help=f"Address to serve on [default: 0.0.0.0:{DEFAULT_PORT}; env {ENV_PREFIX}LISTEN]."),
        click.option("--config", "config_file", type=click.Path(path_type=Path),
                     help="YAML config file (same shape as docs/configuration.md)."),
        click.option("--web-config", "--web.config.file", "web_config", type=click.Path(path_type=Path),
                     help="TLS / basic auth file in Prometheus exporter-toolkit format."),
        click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"])),
        click.option("--profile", type=click.Choice(profiles.NAMES),
                     help=f"Collectors that run unless named [default: {profiles.DEFAULT}]; {profiles.COMPANION} "
                          "leaves to node_exporter what it reads too (docs/configuration.md)."),
        click.option("--collector.disable-defaults", "disable_defaults", is_flag=True, default=False,
                     help=f"node_exporter's name for --profile {profiles.NONE}: no collector runs unless named."),
        click.option("--enable-collector", "enable", multiple=True, metavar="NAME",
                     help="Turn a collector on, whatever the profile (repeatable; also --collector.NAME)."),
        click.option("--disable-collector", "disable", multiple=True, metavar="NAME",
                     help="Turn a collector off, whatever the profile (repeatable; also --no-collector.NAME)."),
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


# node_exporter's per-collector flags. Collector names are open-ended (and checked by the configuration,
# which names the known ones), so these become --enable-collector/--disable-collector NAME before click
# parses; `--collector.<name>.<setting>` (a node_exporter collector setting) is left alone and refused.
_COLLECTOR_FLAG = re.compile(r"--(no-)?collector\.([A-Za-z0-9_]+)")


def node_exporter_collector_flags(args: list[str]) -> list[str]:
    """`--collector.NAME` -> `--enable-collector NAME`, `--no-collector.NAME` -> `--disable-collector NAME`."""
    rewritten: list[str] = []
    for index, arg in enumerate(args):
        if arg == "--":
            return rewritten + args[index:]
        match = _COLLECTOR_FLAG.fullmatch(arg)
        if match is None:
            rewritten.append(arg)
        else:
            rewritten += ["--disable-collector" if match[1] else "--enable-collector", match[2]]
    return rewritten


class _NodeExporterFlags(click.Command):
    """A command that also takes node_exporter's --collector.NAME and --no-collector.NAME."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, node_exporter_collector_flags(args))


class _Commands(click.Group):
    """The commands, some loaded only when named (or listed by --help): `exporter serve` does without
    their modules."""

    LAZY: ClassVar[dict[str, tuple[str, str]]] = {"gpu-fault": ("exporter.gpusim.cli", "gpu_fault")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.LAZY:
            module, attribute = self.LAZY[name]
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="raypulse exporter")
def main() -> None:
    """raypulse exporter: job, node/pod and GPU metrics of a Ray node for Prometheus."""


@main.command(cls=_NodeExporterFlags)
@_config_options
def serve(config_file: Path | None, **flag_args: Any) -> None:
    """Serve /metrics, /healthz, /readyz and / until interrupted."""
    cap_malloc_arenas()
    pin_mmap_threshold()
    config = _load(config_file, **flag_args)
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from exporter.serving.server import serve as run_server

    try:
        asyncio.run(run_server(config))
    except OSError as exc:  # e.g. the port is taken
        click.echo(f"exporter: cannot listen on {config.listen}: {exc.strerror or exc}", err=True)
        sys.exit(1)


@main.command("check-config", cls=_NodeExporterFlags)
@_config_options
@format_option(("yaml", "json"))
def check_config(config_file: Path | None, output: str, **flag_args: Any) -> None:
    """Validate the configuration and print the effective settings as YAML (-o json: JSON)."""
    import yaml

    config = _load(config_file, **flag_args)
    effective = config.model_dump(mode="json")
    effective["otlp"]["headers"] = redact.values(config.otlp.headers)  # API keys are not for the terminal
    if config.otlp.endpoint:
        effective["otlp"]["endpoint"] = redact.url(config.otlp.endpoint)
    click.echo(json.dumps(effective, indent=2) if output == "json" else yaml.safe_dump(effective, sort_keys=False),
               nl=output != "yaml")


DOCUMENT_FORMATS = ("markdown", "json")
WROTE_FORMATS = ("text", "json")


@main.command("config-reference")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Write here instead of stdout.")
@format_option(DOCUMENT_FORMATS, legacy_path=True)
def config_reference(out: Path | None, output: str) -> None:
    """Print every setting with its environment variable and flag (docs/configuration.md); -o json: the
    settings' JSON schema (defaults, descriptions)."""
    from exporter import reference

    output, out = outputflag.resolve("exporter", output, out, DOCUMENT_FORMATS, "--out")
    _write(reference.configuration_markdown() if output == "markdown" else
           json.dumps(ExporterConfig.model_json_schema(), indent=2) + "\n", out)


@main.command()
@click.option("--format", "fmt", type=click.Choice(DOCUMENT_FORMATS), hidden=True,
              help="The old spelling of -o (still taken).")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Write here instead of stdout.")
@format_option(DOCUMENT_FORMATS, legacy_path=True)
def metrics(fmt: str | None, out: Path | None, output: str) -> None:
    """Print the metric catalog (docs/metrics.md is this command's markdown)."""
    from exporter import reference

    output, out = outputflag.resolve("exporter", output, out, DOCUMENT_FORMATS, "--out")
    output = fmt or output
    _write(reference.markdown() if output == "markdown" else reference.as_json() + "\n", out)


def _write(text: str, out: Path | None) -> None:
    if out:
        out.write_text(text)
    else:
        click.echo(text, nl=False)


@main.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Directory to write dashboards/*.json, rules/*.yaml and alertmanager.yml into (required).")
@format_option(WROTE_FORMATS, legacy_path=True)
def assets(directory: Path | None, output: str) -> None:
    """Write the Grafana dashboards and Prometheus rule files that ship with raypulse."""
    from exporter import assets as packaged

    output, directory = outputflag.resolve_dir("exporter", output, directory, WROTE_FORMATS)
    if directory is None:
        raise click.UsageError("give --dir DIR: where the dashboards and rule files go")
    outputflag.echo_wrote(packaged.write(directory), output)


# The deployment (DaemonSet, ServiceMonitor, PrometheusRule, dashboards) carries the rules and dashboards, so
# the launcher renders it, above the exporter: this name only says where it went.
MANIFESTS_MOVED = ("`exporter manifests` is now `launcher exporters manifests`, with the same flags (the launcher "
                   "renders the deployment: it carries the alert rules and dashboards)")


@main.command(hidden=True, add_help_option=False,
              context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def manifests(args: tuple[str, ...]) -> None:
    """Moved: `launcher exporters manifests`."""
    click.echo(f"exporter: {MANIFESTS_MOVED}", err=True)
    sys.exit(EXIT_CONFIG_ERROR)
