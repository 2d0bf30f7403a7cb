"""Prometheus for large clusters (issue 26): sharding, remote_write and the cut of `launcher
prometheus-config`, checked by promtool and by real Prometheus servers scraping fake exporters of ours."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from click.testing import CliRunner

from alerts import prometheus
from dashboards import cut as cutting
from dashboards.coverage import ALERT_RULES
from dashboards.selectors import catalog
from launcher.cli import main as launcher_main
from launcher.deploy import prometheus_scale
from launcher.deploy.manifests import Options, scrape_config, service_monitor
from launcher.exitcodes import ExitCode
from tests.conftest import binary, http_get, wait_until
from tests.launcher_support import launcher
from tests.ray_testcluster import start_prometheus, stop_process
from tests.test_k8s_manifests import problems, validators  # noqa: F401 -- the fixture

TARGETS = 12


def _body() -> bytes:
    """One sample of every per-link family (the cut's candidates) and of a family nobody cuts."""
    lines = []
    for name in [*cutting.candidates(), "raypulse_gpu_up"]:
        labels = ",".join(f'{label}="0"' for label in catalog()[name].labels)
        lines += [f"# TYPE {name} gauge", f"{name}{{{labels}}} 1"]
    return ("\n".join(lines) + "\n").encode()


class _Handler(BaseHTTPRequestHandler):
    body = b""
    pushes: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def do_POST(self) -> None:  # a remote_write receiver: keeps the headers, accepts everything
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.pushes.append(dict(self.headers))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def served() -> Iterator[int]:
    """A fake exporter on every loopback address (0.0.0.0:port): targets 127.0.0.1..12 are 12 targets."""
    _Handler.body = _body()
    server = ThreadingHTTPServer(("0.0.0.0", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def _targets(port: int) -> list[str]:
    return [f"127.0.0.{index}:{port}" for index in range(1, TARGETS + 1)]


def _query(url: str, expr: str) -> list[dict]:
    status, _, body = http_get(f"{url}/api/v1/query?query={expr}")
    assert status == 200, body
    return json.loads(body)["data"]["result"]


def _check_config(tmp_path: Path, document: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "prometheus.yml"
    path.write_text(prometheus.render(document))
    return subprocess.run([binary("promtool"), "check", "config", str(path)], capture_output=True, text=True)


def test_a_sharded_remote_writing_cut_config_passes_promtool(tmp_path: Path):
    (tmp_path / "rw.pass").write_text("not-printed-secret\n")
    document = prometheus.config(sd_url="http://head:9477/sd")
    prometheus_scale.shard(document, 4, 3)
    prometheus_scale.remote_write(document, "https://mimir.example/api/v1/push", user="raypulse",
                                  password_file=str(tmp_path / "rw.pass"))
    prometheus_scale.cut(document)
    result = _check_config(tmp_path, document)
    assert result.returncode == 0, result.stdout + result.stderr
    assert document["global"]["external_labels"] == {prometheus_scale.SHARD_LABEL: "3"}
    assert "not-printed-secret" not in prometheus.render(document)


def test_the_manifests_cut_validates_and_prometheus_accepts_it(validators, tmp_path: Path):  # noqa: F811
    options = Options(cut=True)
    monitor = service_monitor(options)
    assert problems(validators, monitor) == []
    [relabel] = monitor["spec"]["endpoints"][0]["metricRelabelings"]
    assert relabel == {"sourceLabels": ["__name__"], "regex": "|".join(cutting.derive().dropped), "action": "drop"}
    assert "metricRelabelings" not in service_monitor(Options())["spec"]["endpoints"][0]
    # Debian's promtool has no Kubernetes discovery (as in test_kustomize.py): a static target in its place.
    job = {key: value for key, value in scrape_config(options).items() if key != "kubernetes_sd_configs"}
    job["static_configs"] = [{"targets": ["127.0.0.1:9477"]}]
    assert job["metric_relabel_configs"] == cutting.relabel_configs(cutting.derive())
    result = _check_config(tmp_path, {"global": {"scrape_interval": "15s"}, "scrape_configs": [job]})
    assert result.returncode == 0, result.stdout + result.stderr


def test_exporter_manifests_takes_the_cut():
    result = CliRunner().invoke(launcher_main, ["exporters", "manifests", "--cut"])
    assert result.exit_code == 0, result.output
    (monitor,) = [obj for obj in yaml.safe_load_all(result.output) if obj["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["metricRelabelings"][0]["action"] == "drop"


def test_the_cut_keeps_every_family_a_rule_or_a_variable_reads_and_a_query_in_every_panel():
    cut = cutting.derive()
    assert cut.dropped, "the cut drops nothing: were the per-link families renamed?"
    assert set(cut.dropped) <= set(cutting.candidates())
    dropped = set(cut.dropped)
    assert not dropped & cutting.rule_families()
    assert not dropped & cutting.variable_families()
    panels: dict[tuple[str, str], list[cutting.Query]] = {}
    for query in cutting.panel_queries():
        panels.setdefault((query.dashboard, query.panel), []).append(query)
    empty = [panel for panel, queries in panels.items() if all(query.families & dropped for query in queries)]
    assert not empty, f"panels the cut leaves without data: {empty}"


def test_the_cut_follows_the_rules_not_a_list(tmp_path: Path):
    """A rule that starts reading a dropped family takes it out of the cut."""
    victim = cutting.derive().dropped[0]
    for path in ALERT_RULES.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "extra.yaml").write_text(yaml.safe_dump({"groups": [{"name": "extra", "rules": [
        {"record": "node:extra:sum", "expr": f"sum by (node) ({victim})"}]}]}))
    again = cutting.derive(rules_dir=tmp_path)
    assert victim not in again.dropped
    assert "rule" in again.kept_candidates[victim]


def _kept_targets(url: str) -> set[str]:
    """The targets this Prometheus keeps, once it has placed all of them (kept or dropped by relabeling)."""
    def targets() -> dict:
        return json.loads(http_get(f"{url}/api/v1/targets")[2])["data"]

    wait_until(lambda: len(targets()["activeTargets"]) + len(targets()["droppedTargets"]) == TARGETS, 60,
               "every target kept or dropped")
    return {target["labels"]["instance"] for target in targets()["activeTargets"]}


def test_each_target_is_scraped_by_exactly_one_shard_and_the_cut_is_not_stored(served: int, tmp_path: Path):
    shards, running = 3, []
    try:
        for index in range(shards):
            document = prometheus.config(targets=_targets(served), scrape_interval="1s", rules=[])
            prometheus_scale.cut(prometheus_scale.shard(document, shards, index))
            (tmp_path / str(index)).mkdir()
            running.append(start_prometheus(tmp_path / str(index), prometheus.render(document)))
        kept = [_kept_targets(server.url) for _, server in running]
        assert sorted(instance for shard in kept for instance in shard) == sorted(_targets(served))
        dropped = set(cutting.derive().dropped)
        for (_, server), instances in zip(running, kept, strict=True):
            wait_until(lambda url=server.url, n=len(instances): len(_query(url, "raypulse_gpu_up")) == n,  # noqa: B008
                       60, "a scrape of every kept target")
            for family in cutting.candidates():
                stored = len(_query(server.url, family))
                assert stored == (0 if family in dropped else len(instances)), family
    finally:
        for process, _ in running:
            stop_process(process)


def test_remote_write_reads_its_password_from_the_file(served: int, tmp_path: Path):
    secret = "rw-secret-in-a-file"
    (tmp_path / "rw.pass").write_text(secret)
    _Handler.pushes = []
    document = prometheus.config(targets=_targets(served)[:1], scrape_interval="1s", rules=[])
    prometheus_scale.remote_write(document, f"http://127.0.0.1:{served}/api/v1/push", user="raypulse",
                                  password_file=str(tmp_path / "rw.pass"))
    text = prometheus.render(document)
    assert secret not in text
    process, _ = start_prometheus(tmp_path, text)
    try:
        wait_until(lambda: bool(_Handler.pushes), 120, "a remote_write push")
    finally:
        stop_process(process)
    expected = "Basic " + base64.b64encode(f"raypulse:{secret}".encode()).decode()
    assert _Handler.pushes[0]["Authorization"] == expected


@pytest.mark.parametrize(("args", "names"), [
    (["--shards", "2", "--shard", "2"], "--shard 2"),
    (["--remote-write", "mimir:9009"], "--remote-write"),
    (["--remote-write", "http://mimir/api/v1/push", "--remote-write-user", "u"], "--remote-write-user"),
    (["--remote-write-password-file", "/x"], "--remote-write URL"),
])
def test_bad_scale_options_fail_in_one_line_before_asking_the_cluster(tmp_path: Path, args: list[str], names: str):
    # Port 9 (discard): nothing answers there, so reaching the cluster would be an infrastructure error instead.
    result = launcher("prometheus-config", "--address", "http://127.0.0.1:9", *args, home=tmp_path, timeout=60,
                      RAY_AUTH_TOKEN="t")
    assert result.returncode == int(ExitCode.BAD_INPUT), result.stderr
    assert names in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
