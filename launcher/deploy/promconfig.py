"""The Prometheus configuration `launcher prometheus-config` prints: one scrape job fed by the
head exporter's /sd (HTTP service discovery of every node's exporter) and raypulse's rule files."""

from __future__ import annotations

from typing import Any

import yaml

from alerts.build import RULES_DIR

SCRAPE_JOB = "raypulse"


def config(sd_url: str, scrape_interval: str = "15s", sd_refresh_interval: str = "30s",
           alertmanager: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        # Absolute paths: the file works wherever Prometheus is started from.
        "rule_files": [str(path.resolve()) for path in sorted(RULES_DIR.glob("*.yaml"))],
        "scrape_configs": [{"job_name": SCRAPE_JOB,
                            "http_sd_configs": [{"url": sd_url, "refresh_interval": sd_refresh_interval}]}],
    }
    if alertmanager:
        result["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return result


def render(sd_url: str, scrape_interval: str = "15s", sd_refresh_interval: str = "30s",
           alertmanager: str | None = None) -> str:
    return yaml.safe_dump(config(sd_url, scrape_interval, sd_refresh_interval, alertmanager), sort_keys=False)
