"""The Grafana dashboards and Prometheus rule files that ship inside the package, and the one way to
write them out (`exporter assets --dir DIR`): for a Grafana or Prometheus set up by hand, without
a checkout of the repository. `launcher exporters manifests` wraps the same files into Kubernetes objects.

They are package data of `dashboards` (json/*.json) and `alerts` (rules/*.yaml, alertmanager.yml),
read through importlib.resources, so they come from the wheel as they come from a checkout. Reading
them imports neither the Grafana SDK nor Ray.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

DASHBOARDS_SUBDIR = "dashboards"
RULES_SUBDIR = "rules"
OPT_IN_SUBDIR = "opt-in"  # docs/migrating-from-dcgm-exporter.md
ALERTMANAGER_FILE = "alertmanager.yml"


def _texts(directory: Traversable, suffix: str) -> dict[str, str]:
    found = {entry.name: entry.read_text(encoding="utf-8") for entry in directory.iterdir()
             if entry.is_file() and entry.name.endswith(suffix)}
    if not found:
        raise FileNotFoundError(f"no *{suffix} files in {directory}: the raypulse package was installed without "
                                "its package data (reinstall it from a wheel or a checkout)")
    return dict(sorted(found.items()))


def dashboards() -> dict[str, str]:
    """File name (`<uid>.json`) -> the dashboard JSON, as `make dashboards` generated it."""
    return _texts(files("dashboards").joinpath("json"), ".json")


def rule_files() -> dict[str, str]:
    """File name -> a Prometheus rule file, as `make alerts` generated it."""
    return _texts(files("alerts").joinpath("rules"), ".yaml")


def opt_in_rule_files() -> dict[str, str]:
    """Rule files nobody loads by default (`*.yml`: dcgm-exporter's names recorded from ours)."""
    return _texts(files("alerts").joinpath("rules"), ".yml")


def alertmanager_example() -> str:
    return files("alerts").joinpath(ALERTMANAGER_FILE).read_text(encoding="utf-8")


def write(output: Path) -> list[Path]:
    """Write DIR/dashboards/*.json, DIR/rules/*.yaml, DIR/opt-in/*.yml and DIR/alertmanager.yml; returns
    the paths written."""
    written = []
    for subdir, texts in ((DASHBOARDS_SUBDIR, dashboards()), (RULES_SUBDIR, rule_files()),
                          (OPT_IN_SUBDIR, opt_in_rule_files()),
                          ("", {ALERTMANAGER_FILE: alertmanager_example()})):
        directory = output / subdir
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            path = directory / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written
