"""Start a real Prometheus and Alertmanager with raypulse's rules: for `make demo`, the fault drill
and the tests.

    with stack.start(workdir, targets=["127.0.0.1:9477"], webhook_url=hook.url) as s:
        s.firing()                      # alerts Prometheus has firing now

Prometheus scrapes the exporters under the job name of `Config.exporter_selector` ("raypulse"),
from a fixed target list and/or the head exporter's /sd (HTTP service discovery), evaluates
alerts/rules/*.yaml (or a drill variant) and the opt-in Watchdog (a local stack has no
kube-prometheus-stack Watchdog) and sends to Alertmanager, which runs
alerts/alertmanager.yml with its webhook URLs pointed at `webhook_url`.
`python -m scripts.stack --target HOST:PORT` runs one by hand until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from alerts import prometheus
from scripts.ports import free_port
from scripts.webhook import Webhook


def binaries() -> tuple[str, str] | None:
    """(prometheus, alertmanager) paths, or None when either is missing (Debian names the latter
    prometheus-alertmanager)."""
    prometheus = shutil.which("prometheus")
    alertmanager = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    return (prometheus, alertmanager) if prometheus and alertmanager else None


def alertmanager_config(webhook_url: str, fast: bool = False, grouping: str = "1s") -> dict[str, Any]:
    """alerts/alertmanager.yml with every webhook sent to `webhook_url` (same path), and with
    `fast`, group_wait and group_interval of `grouping` (a second unless told: tests/test_alerts_alertmanager.py
    counts on it) so that a test sees notifications at once."""
    config = yaml.safe_load(prometheus.ALERTMANAGER_EXAMPLE.read_text())
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            path = urllib.parse.urlsplit(hook["url"]).path
            hook["url"] = webhook_url.rstrip("/") + path
    if fast:
        routes = [config["route"], *config["route"].get("routes", [])]
        for route in routes:
            for key, value in (("group_wait", grouping), ("group_interval", grouping)):
                if key in route or route is config["route"]:
                    route[key] = value
    return config


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _wait_ready(url: str, process: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if _get(f"{url}/-/ready", 2) is not None:
                return
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    raise RuntimeError(f"{url} was not ready within {timeout:g}s:\n{log.read_text()[-2000:]}")


@dataclass
class Stack:
    prometheus_url: str
    alertmanager_url: str
    workdir: Path
    processes: list[subprocess.Popen] = field(default_factory=list)
    webhook: Webhook | None = None  # the receiver of start_demo()

    def query(self, promql: str) -> list[dict[str, Any]]:
        body = _get(f"{self.prometheus_url}/api/v1/query?query={urllib.parse.quote(promql)}")
        return json.loads(body)["data"]["result"]

    def targets(self) -> list[str]:
        """Each scrape target as `url: health (last error)`, for error messages."""
        active = json.loads(_get(f"{self.prometheus_url}/api/v1/targets"))["data"]["activeTargets"]
        return [f"{t['scrapeUrl']}: {t['health']}" + (f" ({t['lastError']})" if t.get("lastError") else "")
                for t in active]

    def firing(self) -> list[dict[str, Any]]:
        """Alerts Prometheus has firing now (pending ones excluded)."""
        alerts = json.loads(_get(f"{self.prometheus_url}/api/v1/alerts"))["data"]["alerts"]
        return [alert for alert in alerts if alert["state"] == "firing"]

    def alertmanager_alerts(self) -> list[dict[str, Any]]:
        """Alerts Alertmanager holds, with status.state active or suppressed (and inhibitedBy)."""
        return json.loads(_get(f"{self.alertmanager_url}/api/v2/alerts"))

    def rules(self) -> list[dict[str, Any]]:
        """The rule groups Prometheus loaded."""
        return json.loads(_get(f"{self.prometheus_url}/api/v1/rules"))["data"]["groups"]

    def describe(self) -> list[str]:
        """A few lines for a console: where things are, what is loaded, what fires."""
        groups = self.rules()
        alerts = sum(1 for group in groups for rule in group["rules"] if rule["type"] == "alerting")
        firing = sorted({a["labels"]["alertname"] for a in self.firing()} - {"RaypulseWatchdog"})
        lines = [f"Prometheus {self.prometheus_url}: {alerts} alerting rules in {len(groups)} groups "
                 f"(alerts/rules/*.yaml); firing: {', '.join(firing) or 'nothing but the Watchdog'}",
                 f"Alertmanager {self.alertmanager_url} (alerts/alertmanager.yml)"]
        if self.webhook is not None:
            received = sorted({f"{a.name} -> {a.receiver}" for a in self.webhook.snapshot()})
            lines.append(f"webhook {self.webhook.url}: {len(received)} alerts notified"
                         + (f" ({'; '.join(received)})" if received else ""))
        return lines

    def stop(self) -> None:
        if self.webhook is not None:
            self.webhook.stop()
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self.processes.clear()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start(workdir: Path, *, targets: list[str] | None = None, sd_url: str | None = None,
          labels: dict[str, str] | None = None, webhook_url: str = "http://127.0.0.1:9096",
          rules_dir: Path = prometheus.RULES_DIR, scrape_interval: str = "15s", evaluation_interval: str = "15s",
          fast: bool = False, grouping: str = "1s", with_prometheus: bool = True,
          relabel_configs: list[dict[str, Any]] | None = None, watchdog: bool = True) -> Stack:
    """Start Alertmanager, then Prometheus, both on free loopback ports, and wait until both are
    ready. `targets` (with `labels`, e.g. cluster and node) or `sd_url` (a head exporter's /sd)
    say what to scrape. `fast` shortens Alertmanager's grouping waits (to `grouping`, e.g. "100ms") and
    Prometheus's resend delay.
    `with_prometheus=False` starts Alertmanager alone (alerts are then posted to its API). `watchdog`:
    RaypulseWatchdog too (the opt-in rules/watchdog.yml where `rules_dir` has it)."""
    found = binaries()
    if found is None:
        raise FileNotFoundError("prometheus and prometheus-alertmanager are needed (make system-deps)")
    prometheus_bin, alertmanager_bin = found
    workdir.mkdir(parents=True, exist_ok=True)  # fresh data dirs in it: no alert state from an earlier run
    am_port, prom_port = free_port(), free_port()
    stack = Stack(f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}", workdir)
    try:
        am_config = workdir / "alertmanager.yml"
        am_config.write_text(yaml.safe_dump(alertmanager_config(webhook_url, fast, grouping), sort_keys=False))
        am_log, am_data = workdir / "alertmanager.log", tempfile.mkdtemp(prefix="alertmanager-", dir=workdir)
        stack.processes.append(subprocess.Popen(
            [alertmanager_bin, f"--config.file={am_config}", f"--storage.path={am_data}",
             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=", "--log.level=warn"],
            stdout=am_log.open("wb"), stderr=subprocess.STDOUT))
        _wait_ready(stack.alertmanager_url, stack.processes[-1], am_log)
        if not with_prometheus:
            return stack
        prom_config = workdir / "prometheus.yml"
        prom_config.write_text(prometheus.render(prometheus.config(
            targets=targets or (), sd_url=sd_url, labels=labels,
            rules=prometheus.rule_files(rules_dir, watchdog=watchdog), alertmanager=f"127.0.0.1:{am_port}",
            scrape_interval=scrape_interval, evaluation_interval=evaluation_interval,
            relabel_configs=relabel_configs or ())))
        prom_log, tsdb = workdir / "prometheus.log", tempfile.mkdtemp(prefix="tsdb-", dir=workdir)
        command = [prometheus_bin, f"--config.file={prom_config}", f"--storage.tsdb.path={tsdb}",
                   f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"]
        if fast:
            command.append("--rules.alert.resend-delay=1s")
        stack.processes.append(subprocess.Popen(command, stdout=prom_log.open("wb"), stderr=subprocess.STDOUT))
        _wait_ready(stack.prometheus_url, stack.processes[-1], prom_log)
    except BaseException:
        stack.stop()
        raise
    return stack


def start_demo(workdir: Path, *, targets: list[str] | None = None, sd_url: str | None = None,
               labels: dict[str, str] | None = None, interval: str = "5s") -> Stack | None:
    """`make demo`'s alerting: Prometheus and Alertmanager with raypulse's rules, notifying a webhook
    receiver in this process (Stack.webhook). None when the binaries are not installed."""
    if binaries() is None:
        return None
    hook = Webhook().start()
    try:
        started = start(workdir, targets=targets, sd_url=sd_url, labels=labels, webhook_url=hook.url,
                        scrape_interval=interval, evaluation_interval=interval, fast=True)
    except BaseException:
        hook.stop()
        raise
    started.webhook = hook
    return started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", action="append", default=[], help="an exporter HOST:PORT (repeatable)")
    parser.add_argument("--sd", help="a head exporter's /sd URL instead of --target")
    parser.add_argument("--cluster", default="local", help="cluster label of --target exporters")
    parser.add_argument("--workdir", type=Path, default=Path(".demo/alerting"))
    parser.add_argument("--webhook", default="http://127.0.0.1:9096", help="where the webhook receivers point")
    parser.add_argument("--interval", default="15s", help="scrape and evaluation interval (e.g. 5s)")
    args = parser.parse_args(argv)
    if not args.target and not args.sd:
        parser.error("give --target HOST:PORT or --sd URL")
    with start(args.workdir, targets=args.target, sd_url=args.sd, labels={"cluster": args.cluster},
               webhook_url=args.webhook, scrape_interval=args.interval, evaluation_interval=args.interval) as s:
        print(f"Prometheus {s.prometheus_url}  Alertmanager {s.alertmanager_url}  (logs: {args.workdir}; Ctrl-C stops)")
        try:
            while all(process.poll() is None for process in s.processes):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
