"""When the Ray head dies the exporter keeps answering, its Ray series go away (stale in
Prometheus, not frozen) and `raypulse_ray_up` says 0; when the head is back, so are the series,
from the same exporter process. Also: a wrong or missing token is reported as such.

Run under `flock /tmp/raypulse-ray.lock` (the launcher's tests start Ray clusters too).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from alerts.prometheus import config, render
from tests.conftest import free_port, wait_until
from tests.ray_testcluster import start_cluster, start_exporter, start_prometheus, stop_process

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

FAST = {"RAYPULSE_EXPORTER_COLLECTORS__RAY__INTERVAL_SECONDS": "1",
        "RAYPULSE_EXPORTER_COLLECTORS__RAY_HEAD__INTERVAL_SECONDS": "1",
        "RAYPULSE_EXPORTER_COLLECTORS__RAY_PROCESSES__INTERVAL_SECONDS": "1"}
RAY_SERIES = ("raypulse_ray_nodes", "raypulse_ray_jobs", "raypulse_ray_resource_capacity", "raypulse_ray_info")


def families(exporter) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(exporter.metrics_text())}


def dashboard_errors(exporter) -> dict[str, float]:
    return {s.labels["kind"]: s.value for s in families(exporter).get("raypulse_ray_dashboard_errors", [])
            if s.name.endswith("_total")}


def ray_up(exporter) -> float | None:
    samples = families(exporter).get("raypulse_ray_up")
    return samples[0].value if samples else None


@pytest.fixture(scope="module")
def setup():
    base = Path(tempfile.mkdtemp(prefix="rpo-", dir="/tmp"))
    cluster = start_cluster(base / "ray", worker_cpus=(), head_cpus=1)
    started = []
    try:
        exporter = start_exporter(base, cluster.head.exporter_port, "--ray-role", "head", "--ray-dashboard",
                                  cluster.dashboard_url, "--progress-listen", "off",
                                  env={**cluster.env(), **FAST})
        started.append(exporter.process)
        (base / "prometheus").mkdir()
        process, prometheus = start_prometheus(base / "prometheus", render(config(
            targets=[exporter.url.removeprefix("http://")], scrape_interval="1s", rules=[])))
        started.append(process)
        yield cluster, exporter, prometheus, base
    finally:
        for process in started:
            stop_process(process)
        cluster.kill()
        shutil.rmtree(base, ignore_errors=True)


def test_a_wrong_token_is_reported_as_unauthorized(setup):
    cluster, _, _, base = setup
    env = {**os.environ, **FAST, "RAY_AUTH_TOKEN": "not-the-token", "RAY_AUTH_TOKEN_PATH": str(base / "none")}
    exporter = start_exporter(base, free_port(), "--ray-role", "head", "--ray-dashboard", cluster.dashboard_url,
                              "--progress-listen", "off", env=env)
    try:
        wait_until(lambda: dashboard_errors(exporter).get("unauthorized", 0) > 0, 20, "an unauthorized error")
        assert ray_up(exporter) == 0
        assert "raypulse_ray_nodes" not in families(exporter)
        assert "RAY_AUTH_TOKEN" in exporter.log.read_text()  # the log says how to fix it
    finally:
        stop_process(exporter.process)


def test_the_head_dies_and_comes_back_without_restarting_the_exporter(setup):
    cluster, exporter, prometheus, _ = setup
    pid = exporter.process.pid
    wait_until(lambda: all(name in families(exporter) for name in RAY_SERIES), 30, "Ray series")
    wait_until(lambda: prometheus.query("raypulse_ray_nodes"), 30, "Ray series in Prometheus")
    assert ray_up(exporter) == 1

    cluster.kill()  # the head (and with it, without GCS fault tolerance, the cluster)
    # ray_up comes from the `ray` collector, the other Ray series from `ray_head`: a run of the latter
    # already in flight at the kill may still publish once, so the two are awaited together.
    wait_until(lambda: ray_up(exporter) == 0 and not [name for name in RAY_SERIES if name in families(exporter)],
               20, "raypulse_ray_up to say 0 and the Ray series to go")
    assert exporter.get("/healthz")[0] == 200
    assert exporter.get("/readyz")[0] == 200
    wait_until(lambda: prometheus.query("raypulse_ray_nodes") == [] and prometheus.query("raypulse_ray_up == 0"),
               30, "the Ray series to go stale in Prometheus and raypulse_ray_up 0 there")
    # The exporter itself was never down (a scrape is cheap; the last one answered).
    wait_until(lambda: prometheus.query('up{job="raypulse"} == 1'), 30, "the exporter's target up")
    errors = dashboard_errors(exporter)
    assert errors["unreachable"] + errors["timeout"] > 0

    cluster.restart()
    cluster.wait_ready(1)
    wait_until(lambda: ray_up(exporter) == 1, 60, "raypulse_ray_up to come back")
    wait_until(lambda: all(name in families(exporter) for name in RAY_SERIES), 30, "the Ray series to come back")
    wait_until(lambda: prometheus.query("raypulse_ray_nodes{state='ALIVE'} == 1"), 30, "them in Prometheus")
    assert exporter.process.pid == pid
    assert exporter.process.poll() is None
