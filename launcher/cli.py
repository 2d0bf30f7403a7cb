"""`launcher` command line. The submit/status/logs/stop/list/up/down/render verbs arrive with the
launcher itself; this entry point exists so the distribution's two console scripts are stable."""

from __future__ import annotations

import click

from exporter import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="raypulse launcher")
def main() -> None:
    """raypulse launcher: one command from a training script to a finished Ray job."""
