"""The node panels on a real node_exporter, live: no Ray, a few seconds of data.

Two `exporter serve` processes (started with node_exporter's flag names) stand for two Ray nodes on
this host: `companion` in the node-exporter-companion profile (no CPU, memory, vmstat, disk,
network or pressure series of its own) and `both` in the default profile. A head exporter's /sd
(the real handler, fed the two nodes' target groups as the ray_head collector feeds it) lists them
and, in the companion profile, each node's node_exporter: the real
/usr/bin/prometheus-node-exporter. A real Prometheus discovers all four targets from that /sd.

Every dashboard query that reads a node_exporter family runs with node = `companion` and must
return data (node_exporter is its only source), and on `both` the same panels show raypulse's
series, never node_exporter's beside them.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from alerts import prometheus
from alerts.config import DEFAULT as ALERTS_CONFIG
from dashboards import livecheck, promql
from dashboards.provisioner import JSON_DIR
from exporter import profiles
from exporter.contract import node_exporter, wire
from exporter.framework.shared import ServiceDiscovery
from exporter.plugins import load
from exporter.serving.server import Exporter
from tests.conftest import REPO, RunningPrometheus, binary, exporter_command, free_port, wait_until
from tests.ray_testcluster import start_prometheus, stop_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CLUSTER = "ne-live"
# node_exporter families this host may lack; a query reading only such may be empty while Prometheus
# has never seen them (where the host has them, the query must return data).
NOT_ON_THIS_HOST = {
    "node_memory_HardwareCorrupted_bytes": "kernel without memory-failure handling",
    "node_network_speed_bytes": "only virtual interfaces (no link speed)",
    **{name: "kernel without PSI" for name in node_exporter.FAMILIES if name.startswith("node_pressure_")},
}
# Nothing Ray or GPU: the panels checked read node and exporter families only.
NOT_NEEDED = ("gpu", "gpu_events", "ray", "ray_head", "ray_processes", "train")


@dataclass
class Scene:
    prometheus: RunningPrometheus


def reads_node_exporter(expr: str) -> bool:
    """A query with a node_exporter side, and no Ray job's processes to join with (those need Ray)."""
    metrics = promql.metrics(expr)
    return bool(metrics & set(node_exporter.FAMILIES)) and "raypulse_job_processes" not in metrics


def serve(base: Path, name: str, *args: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    flags = [f"--no-collector.{collector}" for collector in NOT_NEEDED]
    process = subprocess.Popen(
        exporter_command("serve", "--web.listen-address", f"127.0.0.1:{port}", "--progress-listen", "off",
                         "--cluster", CLUSTER, *flags, *args),
        stdout=(base / f"exporter-{name}.log").open("wb"), stderr=subprocess.STDOUT, cwd=REPO)
    return process, port


class HeadSd:
    """An exporter serving /sd on an event loop of its own, as the head's does."""

    def __init__(self, groups: list[dict], node_exporter_port: int) -> None:
        config = load({"listen": "127.0.0.1:0", "progress": {"listen": "off"}, "profile": profiles.COMPANION,
                       "node_exporter": {"port": node_exporter_port}}, environ={})
        self.exporter = Exporter(config, collectors=[])
        self.exporter.shared.service_discovery.publish(ServiceDiscovery("head", tuple(groups)))
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self.exporter.start(), self.loop).result(30)
        self.url = f"http://127.0.0.1:{self.exporter.port}{wire.SD_PATH}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.exporter.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def present(running: RunningPrometheus, promql_text: str, count: int = 1) -> bool:
    return len(running.query(promql_text)) >= count


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    base = Path(tempfile.mkdtemp(prefix="rpne-", dir="/tmp"))
    started: list[subprocess.Popen] = []
    head: HeadSd | None = None
    try:
        node_exporter_port = free_port()
        started.append(subprocess.Popen(
            [binary("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{node_exporter_port}"],
            stdout=(base / "node_exporter.log").open("wb"), stderr=subprocess.STDOUT))
        companion, companion_port = serve(base, "companion", "--profile", profiles.COMPANION)
        both, both_port = serve(base, "both")
        started += [companion, both]
        groups = [{"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": CLUSTER, "node": node, "role": "worker"}}
                  for node, port in (("companion", companion_port), ("both", both_port))]
        head = HeadSd(groups, node_exporter_port)
        (base / "prometheus").mkdir()
        process, running = start_prometheus(base / "prometheus", prometheus.render(prometheus.config(
            sd_url=head.url, scrape_interval="1s", rules=[])))
        started.append(process)
        wait_until(lambda: present(running, f'up{{job="{wire.NODE_EXPORTER_JOB}"}} == 1', 2)
                   and present(running, "raypulse_exporter_build_info", 2)
                   and present(running, 'raypulse_node_cpus{node="both"}'), 60, "all four targets scraped")
        time.sleep(8)  # rates over the 6 s rate interval, and a few scrapes of everything
        yield Scene(running)
    finally:
        for process in started:
            stop_process(process)
        if head is not None:
            head.close()
        shutil.rmtree(base, ignore_errors=True)


def test_node_exporter_is_scraped_with_the_nodes_labels_under_its_own_job(scene):
    targets = {(s["metric"]["job"], s["metric"]["node"]) for s in scene.prometheus.query(f'up{{cluster="{CLUSTER}"}}')}
    ours = ALERTS_CONFIG.scrape_job  # the scrape job's name: what /sd leaves raypulse's own targets
    assert targets == {(ours, "companion"), (ours, "both"),
                       (wire.NODE_EXPORTER_JOB, "companion"), (wire.NODE_EXPORTER_JOB, "both")}
    # The companion leaves the node to node_exporter and keeps what only raypulse has.
    assert not scene.prometheus.query('raypulse_node_cpu_seconds_total{node="companion"}')
    assert scene.prometheus.query('raypulse_node_filesystem_avail_bytes{node="companion"}')


def test_the_node_panels_read_node_exporter_where_the_exporter_leaves_the_node_to_it(scene, capsys):
    results = livecheck.run(scene.prometheus.url, {"cluster": CLUSTER, "node": "companion"}, window=60, step=2,
                            rate_interval="6s", keep=reads_node_exporter)
    empty = [r for r in results if not r.series]
    not_here = [r for r in empty if (theirs := set(r.absent) & set(node_exporter.FAMILIES))
                and theirs <= set(NOT_ON_THIS_HOST)]
    with capsys.disabled():
        print(f"\nnode_exporter live check: {len({(r.dashboard, r.panel) for r in results})} panels, "
              f"{len(results)} queries on node_exporter alone; {len(results) - len(empty)} returned data; "
              f"{len(not_here)} read only families this host lacks")
    assert {r.dashboard for r in results} == {"raypulse-node", "raypulse-cluster"}
    assert not [r for r in results if r.error], [f"{r.name}: {r.error}" for r in results if r.error]
    failing = [r for r in empty if r not in not_here]
    assert not failing, "panels without data:\n" + "\n".join(f"{r.name}: {r.expr} absent={r.absent}" for r in failing)


def _node_panel(title: str) -> str:
    """The first query of a node dashboard panel, as committed."""
    board = json.loads((JSON_DIR / "raypulse-node.json").read_text())
    return next(target["expr"] for panel, target in promql.iter_targets(board) if panel["title"] == title)


@pytest.mark.parametrize(("title", "ours", "theirs"), [
    ("Memory size", "raypulse_node_memory_total_bytes", "node_memory_MemTotal_bytes"),
    ("Load average", "raypulse_node_load1", "node_load1"),
])
def test_a_node_shows_one_source_raypulses_where_it_has_it(scene, title, ours, theirs):
    expr = _node_panel(title)
    for node, name in (("companion", theirs), ("both", ours)):
        filled = promql.fill(expr, {"cluster": CLUSTER, "node": node})
        series = scene.prometheus.query(filled)
        assert [s["metric"]["__name__"] for s in series] == [name], (node, series)


def test_per_node_aggregates_are_not_counted_twice(scene):
    """Each node's busy share is one source's, never both added: at one instant, the panel's value is exactly
    raypulse's where the node has it and node_exporter's elsewhere (not a bound such as <= 1, which a rate
    over a few busy seconds may pass on a loaded machine)."""
    expr = promql.fill(_node_panel("CPU busy by node"), {"cluster": CLUSTER, "node": ".*"},
                       {"$__rate_interval": "6s"})
    # The panel is node_exporter.either(): `((ours) or on (ON) ((theirs) and on (ON) exporters))`.
    ours, _, rest = expr.removeprefix("((").partition(f") or on ({node_exporter.ON}) ((")
    theirs = rest.partition(f") and on ({node_exporter.ON}) ")[0]
    at = time.time()

    def by_node(promql_expr: str) -> dict[str, float]:
        from urllib.parse import quote

        found = scene.prometheus.api(f"/api/v1/query?query={quote(promql_expr)}&time={at}")["data"]["result"]
        return {series["metric"]["node"]: float(series["value"][1]) for series in found}

    panel = by_node(expr)
    assert sorted(panel) == ["both", "companion"]
    assert panel["both"] == by_node(ours)["both"]
    assert panel["companion"] == by_node(theirs)["companion"]
    assert all(value >= 0 for value in panel.values())
