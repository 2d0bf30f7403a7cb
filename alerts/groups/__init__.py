"""One module per area; `groups(config)` lists them in rule-file order."""

from __future__ import annotations

from alerts.config import Config
from alerts.groups import exporter, gpu, jobs, node, ray, rl, scale, training
from alerts.model import Group


def groups(config: Config) -> list[Group]:
    return [gpu.group(config), node.group(config), ray.group(config), jobs.group(config),
            training.group(config), rl.group(config), exporter.group(config), exporter.meta_group(config),
            scale.group(config)]
