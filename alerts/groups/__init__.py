"""One module per area; `groups(config)` lists them in rule-file order."""

from __future__ import annotations

from alerts.config import Config
from alerts.groups import exporter, gpu, jobs, node, ray, rl, scale, training
from alerts.model import Group


def groups(config: Config) -> list[Group]:
    """The groups loaded by default (rules/*.yaml); the Watchdog's only with `config.watchdog`."""
    watchdog = [exporter.watchdog_group(config)] if config.watchdog else []
    return [gpu.group(config), node.group(config), ray.group(config), jobs.group(config),
            training.group(config), rl.group(config), exporter.group(config), *watchdog, scale.group(config)]


def opt_in(config: Config) -> list[Group]:
    """The groups written but not loaded by default (rules/<name>.yml, outside the *.yaml glob)."""
    return [] if config.watchdog else [exporter.watchdog_group(config)]
