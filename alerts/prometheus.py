"""The Prometheus side of raypulse: where its rule files and Alertmanager example are (package data,
one accessor each) and the one builder of a Prometheus configuration that scrapes the exporters and
evaluates the rules. `launcher prometheus-config`, `make demo`, the drills and the tests all use it.

    config(sd_url="http://head:9477/sd")                 # every node's exporter via the head's /sd,
                                                         # Ray's metrics agents via /sd/ray (job "ray"),
                                                         # RL runs' rollout servers via /sd/rollout (job "rollout")
    config(targets=["10.0.0.5:9477"], labels={"cluster": "c1"}, alertmanager="127.0.0.1:9093")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from alerts.config import DEFAULT, Config
from exporter.contract import wire

RULES_DIR = Path(str(files("alerts").joinpath("rules")))
ALERTMANAGER_EXAMPLE = Path(str(files("alerts").joinpath("alertmanager.yml")))
# Rule files Prometheus loads by default (rule_files: rules/*.yaml), and opt-in ones (`.yml`, outside that glob).
DEFAULT_SUFFIX, OPT_IN_SUFFIX = ".yaml", ".yml"
# RaypulseWatchdog's group and rule file: opt-in unless built with Config.watchdog.
WATCHDOG = "watchdog"


def rule_files(directory: Path = RULES_DIR, *, watchdog: bool = False) -> list[Path]:
    """raypulse's rule files (absolute paths, so a config works wherever Prometheus starts): `*.yaml`,
    and with `watchdog` the opt-in Watchdog too (a setup without kube-prometheus-stack's Watchdog)."""
    paths = sorted(directory.glob(f"*{DEFAULT_SUFFIX}"))
    if watchdog and not (directory / f"{WATCHDOG}{DEFAULT_SUFFIX}").exists():
        opt_in = directory / f"{WATCHDOG}{OPT_IN_SUFFIX}"
        if not opt_in.is_file():
            raise FileNotFoundError(f"{opt_in} is missing: write the rules with `python -m alerts.build` "
                                    "(it writes the Watchdog there)")
        paths.append(opt_in)
    return [path.resolve() for path in paths]


Target = str | tuple[str, Mapping[str, str]]  # "host:port", or ("host:port", labels of its own)


def config(*, sd_url: str | None = None, targets: Sequence[Target] = (), labels: Mapping[str, str] | None = None,
           scrape_interval: str = "15s", evaluation_interval: str | None = None,
           sd_refresh_interval: str | None = None, alertmanager: str | None = None,
           rules: Sequence[Path] | None = None, relabel_configs: Sequence[Mapping[str, Any]] = (),
           alerts_config: Config = DEFAULT, ray_metrics: bool = True, rollout_metrics: bool = True) -> dict[str, Any]:
    """One scrape job (named as the alert rules select it) fed by a head exporter's /sd and/or fixed
    targets (each with `labels`, and labels of its own), the rule files (raypulse's by default;
    `rules=[]` for none), and Alertmanager when given. With /sd and `ray_metrics`, a second job,
    wire.RAY_METRICS_JOB, scrapes every Ray node's metrics agent the head lists at wire.RAY_SD_PATH
    (what runs on the nodes reports there: vLLM's engines in an RL run); with `rollout_metrics` a third,
    wire.ROLLOUT_METRICS_JOB, scrapes the rollout servers RL runs reported, listed at wire.ROLLOUT_SD_PATH
    (verl's vLLM/SGLang servers, their engine's own /metrics)."""
    job: dict[str, Any] = {"job_name": alerts_config.scrape_job}
    if sd_url:
        job["http_sd_configs"] = [{"url": sd_url, "refresh_interval": sd_refresh_interval or scrape_interval}]
    if targets:
        # One group per target, so each gets a `node` label (the target itself unless given):
        # inhibition by node needs one on every series.
        groups = [(target, {}) if isinstance(target, str) else target for target in targets]
        job["static_configs"] = [{"targets": [target], "labels": {alerts_config.labels.node: target, **(labels or {}),
                                                                  **own}}
                                 for target, own in groups]
    if relabel_configs:
        job["relabel_configs"] = [dict(item) for item in relabel_configs]
    jobs = [job]
    for wanted, name, path in ((ray_metrics, wire.RAY_METRICS_JOB, wire.RAY_SD_PATH),
                               (rollout_metrics, wire.ROLLOUT_METRICS_JOB, wire.ROLLOUT_SD_PATH)):
        if sd_url and wanted:
            jobs.append({"job_name": name, "http_sd_configs": [{"url": sd_url.removesuffix(wire.SD_PATH) + path,
                                                                "refresh_interval": sd_refresh_interval or
                                                                scrape_interval}]})
    result: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval or scrape_interval},
        "rule_files": [str(path) for path in (rule_files() if rules is None else rules)],
        "scrape_configs": jobs,
    }
    if alertmanager:
        result["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return result


def render(document: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(document), sort_keys=False)
