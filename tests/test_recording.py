"""Recording a run's metrics (launcher/recording.py) and backfilling them (launcher/export.py), against
real exporters with simulated GPUs, listed by a real HTTP service discovery endpoint in the shape of
the head exporter's /sd, with training progress posted to their real progress endpoints.

What the recorder guarantees: it keeps the allowed families of every exporter /sd lists, with the
labels Prometheus would give them (and Prometheus's `up`); exporters may come and go; it never
writes past its size cap or into the disk's last bytes, and says why it stopped; a file cut short
by a crash still reads up to its last whole round; the export is what promtool backfills, and a
Prometheus started on those blocks answers the dashboards' queries for the run.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dashboards import livecheck
from exporter.contract import wire
from launcher import export, recording, report
from launcher.errors import BadInput
from launcher.state import RunRecord
from scripts.ports import free_port
from tests.conftest import REPO, binary, wait_until

SUBMISSION = "sim-1-a1"


class SdServer:
    """HTTP service discovery in the head exporter's shape; the test edits `groups` as nodes come and go."""

    def __init__(self) -> None:
        self.groups: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(owner.groups).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}{wire.SD_PATH}"

    def add(self, node: str, role: str, port: int) -> None:
        self.groups.append({"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": "sim", "node": node, "role": role,
                                                                         "ray_node_id": f"{node}-id"}})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Node:
    name: str
    process: subprocess.Popen
    port: int
    progress_port: int


@dataclass
class SimCluster:
    sd: SdServer
    nodes: list[Node] = field(default_factory=list)
    workdir: Path = Path()

    def start_node(self, name: str, role: str, gpus: int) -> Node:
        port, progress_port = free_port(), free_port()
        log = self.workdir / f"exporter-{name}.log"
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{port}", "--simulate-gpus", str(gpus),
             "--progress-listen", f"127.0.0.1:{progress_port}", "--cluster", "sim", "--ray-role", "worker"],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO)
        node = Node(name, process, port, progress_port)
        wait_until(lambda: process.poll() is not None or _ready(port), 30, f"exporter {name} to be ready")
        assert process.poll() is None, log.read_text()
        # Ready means every collector ran once; /metrics serves their series a debounce later.
        if gpus:
            wait_until(lambda: _serves(port, "raypulse_gpu_up{"), 30, f"exporter {name}'s GPU series")
        self.nodes.append(node)
        self.sd.add(name, role, port)
        return node


def _serves(port: int, text: str) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        return text in response.read().decode()


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def post_progress(node: Node, rank: int, step: int) -> None:
    report = {"kind": "progress", "submission_id": SUBMISSION, "rank": rank, "time": time.time(), "step": step,
              "loss": 2.0 / (1 + step), "samples_total": 64 * step, "learning_rate": 0.001}
    request = urllib.request.Request(f"http://127.0.0.1:{node.progress_port}{wire.PROGRESS_PATH}",
                                     data=json.dumps({"reports": [report]}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status < 300


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Iterator[SimCluster]:
    """A head (no GPU) and two workers with 2 simulated GPUs each; rank r trains on worker r."""
    cluster = SimCluster(SdServer(), workdir=tmp_path_factory.mktemp("sim"))
    try:
        cluster.start_node("head", "head", 0)
        cluster.start_node("workers-1", "worker", 2)
        cluster.start_node("workers-2", "worker", 2)
        yield cluster
    finally:
        for node in cluster.nodes:
            node.process.terminate()
        for node in cluster.nodes:
            node.process.wait(10)
        cluster.sd.close()


def train(sim: SimCluster, steps: range, shown: bool = False) -> None:
    """Ranks 0 and 1 (on workers-1 and workers-2) report these steps; with `shown`, until both
    exporters serve the last one (the progress collector publishes on its own interval)."""
    for step in steps:
        for rank, node in enumerate(sim.nodes[1:3]):
            post_progress(node, rank, step)
    if shown:
        for rank, node in enumerate(sim.nodes[1:3]):
            wait_until(lambda node=node, rank=rank: _serves_step(node, rank, steps[-1]), 30, "the step on /metrics")


def _serves_step(node: Node, rank: int, step: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.port}{wire.METRICS_PATH}", timeout=5) as response:
        text = response.read().decode()
    return any(line.startswith("raypulse_train_step{") and f'rank="{rank}"' in line and line.endswith(f" {step}.0")
               for line in text.splitlines())


def recorder(run_dir: Path, sim: SimCluster, **options: Any) -> recording.Recorder:
    """A started recorder whose own loop waits an hour between rounds: the test drives the rounds."""
    return recording.Recorder(run_dir, sim.sd.url, interval=3600, **options).start()


def rounds(rec: recording.Recorder, count: int, between: Any = None) -> None:
    for index in range(count):
        if between is not None:
            between(index)
        rec.record_once()


# --- what is kept ---------------------------------------------------------------------------------


def test_keeps_the_allowed_families_of_every_exporter_sd_lists_with_prometheus_labels(tmp_path: Path, sim):
    train(sim, range(1, 4), shown=True)
    rec = recorder(tmp_path, sim)
    rounds(rec, 3, lambda i: train(sim, range(4 + i, 5 + i)))
    rec.stop()

    assert stat.S_IMODE((tmp_path / recording.FILE_NAME).stat().st_mode) == 0o600  # as private as run.json
    read = recording.read(tmp_path)
    assert not read.cut_short
    assert [end["reason"] for end in read.ends] == ["stopped"]
    assert read.rounds == 5  # the recorder's first round, then three, then the last one at stop()
    assert all(recording.allowed(s.name) or s.name == recording.UP for s in read.series.values())
    ups = {s.labels["node"]: s.values for s in read.select("up")}
    assert ups == {"head": [1.0] * 5, "workers-1": [1.0] * 5, "workers-2": [1.0] * 5}
    steps = {s.labels["rank"]: s for s in read.select("raypulse_train_step", submission_id=SUBMISSION)}
    assert sorted(steps) == ["0", "1"]
    assert steps["1"].values[0] >= 3.0
    assert steps["1"].values == sorted(steps["1"].values)
    assert {k: steps["1"].labels[k] for k in ("cluster", "node", "role", "job", "instance")} == {
        "cluster": "sim", "node": "workers-2", "role": "worker", "job": "raypulse",
        "instance": f"127.0.0.1:{sim.nodes[2].port}"}
    gpus = {(s.labels["node"], s.labels["gpu"]) for s in read.select("raypulse_gpu_utilization_ratio")}
    assert gpus == {("workers-1", "0"), ("workers-1", "1"), ("workers-2", "0"), ("workers-2", "1")}
    for family in ("raypulse_gpu_memory_used_bytes", "raypulse_gpu_power_usage_watts",
                   "raypulse_gpu_temperature_celsius", "raypulse_node_cpu_seconds_total",
                   "raypulse_node_memory_available_bytes", "raypulse_node_network_receive_bytes_total",
                   "raypulse_train_loss", "raypulse_train_samples_total"):
        assert read.select(family), family
    assert read.families["raypulse_node_cpu_seconds"]["type"] == "counter"
    assert not read.select("raypulse_gpu_pcie_bytes_total")  # not on the allow-list


def test_an_exporter_that_comes_late_and_one_that_goes_away(tmp_path: Path, sim):
    rec = recorder(tmp_path, sim)
    late = sim.start_node("workers-3", "worker", 1)
    rounds(rec, 2)
    late.process.send_signal(signal.SIGKILL)
    late.process.wait(10)
    rounds(rec, 2)
    sim.sd.groups.pop()  # /sd no longer lists it
    sim.nodes.remove(late)
    rounds(rec, 1)
    rec.stop()

    read = recording.read(tmp_path)
    up = {s.labels["node"]: s.values for s in read.select("up")}
    assert up["workers-3"] == [1.0, 1.0, 0.0, 0.0]  # not in the first round, up twice, then gone
    assert up["workers-1"] == [1.0] * 7  # and the last round, at stop()
    assert len(read.select("raypulse_gpu_up", node="workers-3")[0].values) == 2


def test_a_recording_stops_at_its_size_cap_only_when_its_last_hour_does_not_fit_and_says_so(tmp_path: Path, sim):
    """The cap is a budget that older rounds are rolled up to meet; these rounds are all within the last
    hour (kept whole at every level), so a cap this small is reached and said."""
    said: list[tuple[str, dict]] = []
    cap = 16 * 1024
    rec = recorder(tmp_path, sim, max_bytes=cap, notify=lambda kind, details: said.append((kind, dict(details))))
    for _ in range(3000):
        if rec.ended:
            break
        rec.record_once()
    assert rec.ended == "size cap of 16.0 KiB reached"
    rec.stop()
    assert (tmp_path / recording.FILE_NAME).stat().st_size <= cap
    read = recording.read(tmp_path)
    assert read.capped == "size cap of 16.0 KiB reached"
    assert read.rounds == rec.rounds > 1
    assert [kind for kind, _ in said] == ["recording.started", "recording.capped"]
    assert said[-1][1]["bytes"] <= cap


def test_no_recording_when_the_disk_is_nearly_full(tmp_path: Path, sim):
    said: list[str] = []
    rec = recorder(tmp_path, sim, min_free_bytes=2**62, notify=lambda kind, details: said.append(details.get(
        "reason", kind)))
    rec.stop()
    assert rec.ended is not None
    assert rec.ended.startswith("disk nearly full")
    assert not (tmp_path / recording.FILE_NAME).exists()  # not one byte written
    assert said[-1].startswith("disk nearly full")


CRASHING = """
import sys, time
from pathlib import Path
from launcher import recording
rec = recording.Recorder(Path(sys.argv[1]), sys.argv[2], interval=0.2).start()
while rec.rounds < 3:
    time.sleep(0.05)
print("recorded", flush=True)
time.sleep(3600)
"""


def test_a_recording_cut_short_by_a_crash_reads_up_to_its_last_whole_round(tmp_path: Path, sim):
    process = subprocess.Popen([sys.executable, "-c", CRASHING, str(tmp_path), sim.sd.url], cwd=REPO,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "recorded"
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    whole = recording.read(tmp_path)
    assert whole.rounds >= 3
    assert whole.ends == []  # it never said it stopped
    # A crash in the middle of a write: the file loses its last bytes.
    data = (tmp_path / recording.FILE_NAME).read_bytes()
    torn = tmp_path / "torn.jsonl.gz"
    torn.write_bytes(data[:-7])
    read = recording.read(torn)
    assert read.cut_short
    assert read.rounds == whole.rounds - 1
    assert read.select("up")


# --- backfill into a real Prometheus ------------------------------------------------------------


def start_prometheus_on(blocks: Path, workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text("global: {}\n")
    log = workdir / "prometheus.log"
    process = subprocess.Popen([binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={blocks}",
                                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                               stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: process.poll() is not None or _get(f"{url}/-/ready") is not None, 60, "Prometheus to be ready")
    assert process.poll() is None, log.read_text()
    return process, url


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read()
    except OSError:
        return None


def query(url: str, expr: str, at: float) -> list[dict]:
    reply = _get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": at}))
    assert reply is not None
    return json.loads(reply)["data"]["result"]


@pytest.mark.slow
def test_an_exported_recording_backfills_and_the_training_board_reads_it(tmp_path: Path, sim):
    train(sim, range(1, 10), shown=True)
    rec = recorder(tmp_path / "run", sim)
    rounds(rec, 6, lambda i: train(sim, range(10 + 3 * i, 13 + 3 * i), shown=True))
    rec.stop()
    read = recording.read(tmp_path / "run")
    assert read.start is not None
    assert read.end is not None

    om = tmp_path / "run.om"
    written = export.export(tmp_path / "run", om)
    assert written == sum(len(s.times) for s in read.series.values())
    assert om.read_text().endswith("# EOF\n")
    blocks = tmp_path / "tsdb"
    result = subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(om), str(blocks)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # An alert that fired during the run, as a Prometheus evaluating the rules would have stored it.
    alerts = tmp_path / "alerts.om"
    alerts.write_text("# TYPE ALERTS gauge\n" + "".join(
        f'ALERTS{{alertname="RaypulseTrainingStalled",alertstate="firing",cluster="sim",severity="warning"}} 1 '
        f"{at:.3f}\n" for at in (read.start + 1, read.end - 1)) + "# EOF\n")
    result = subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(alerts),
                             str(blocks)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr

    process, url = start_prometheus_on(blocks, tmp_path)
    try:
        steps = query(url, f'raypulse_train_step{{submission_id="{SUBMISSION}"}}', read.end)
        assert {(s["metric"]["rank"], s["metric"]["node"], s["metric"]["job"]) for s in steps} == {
            ("0", "workers-1", "raypulse"), ("1", "workers-2", "raypulse")}
        last = {s.labels["rank"]: s.values[-1] for s in read.select("raypulse_train_step")}
        assert {s["metric"]["rank"]: float(s["value"][1]) for s in steps} == last
        counted = query(url, f'count_over_time(raypulse_train_step{{rank="0",submission_id="{SUBMISSION}"}}[1h])',
                        read.end)
        assert counted[0]["value"][1] == str(len(read.select("raypulse_train_step", rank="0")[0].times))
        assert len(query(url, "raypulse_gpu_utilization_ratio", read.end)) == 4
        assert query(url, "raypulse_gpu_utilization_ratio", read.start - 600) == []  # nothing before the run
        # The training board's own queries, as Grafana would send them, over the run's minutes.
        boards = tmp_path / "boards"
        boards.mkdir()
        board = livecheck.JSON_DIR / "raypulse-training.json"
        (boards / board.name).write_text(board.read_text())
        # $__rate_interval as Grafana makes it, at least four scrape intervals: here four of the longest gap
        # between the test's rounds (a busy machine spaces them out), so every rate has its two samples.
        times = sorted({t for series in read.series.values() for t in series.times})
        gap = max(later - earlier for earlier, later in itertools.pairwise(times))
        results = livecheck.run(url, {"cluster": "sim"}, window=time.time() - read.start + 60, step=1,
                                rate_interval=f"{max(5, math.ceil(4 * gap))}s", json_dir=boards)
        # A report of the run without a recording reads its series, and the alerts, from this Prometheus.
        run = tmp_path / "runs" / "sim-1"
        run.mkdir(parents=True)
        (run / "run.json").write_text(RunRecord(run_id="sim-1", name="sim", backend="existing", cluster="sim",
                                                state="SUCCEEDED", exit_code=0, created_at=read.start - 5,
                                                finished_at=read.end).model_dump_json())
        text = report.render(run, prometheus=url).read_text()
    finally:
        process.terminate()
        process.wait(20)
    assert "series were read from Prometheus" in text
    assert 'id="chart-step"' in text
    assert 'id="chart-gpu-util"' in text
    assert "RaypulseTrainingStalled" in text
    # Every query whose families the recording has returns data (the others name what is missing:
    # checkpoints, tokens, healing, alerts that this toy training never produced).
    answerable = [r for r in results if not r.absent and "ALERTS" not in r.expr]
    assert any("raypulse_train_step" in r.expr for r in answerable)
    assert any("raypulse_train_loss" in r.expr for r in answerable)
    assert [r.name for r in answerable if not r.series] == [], livecheck.summary(results)


def test_promtool_refuses_nothing_of_a_recording_with_odd_label_values(tmp_path: Path):
    """Label values with quotes, backslashes and newlines, a NaN and a counter: escaped as OpenMetrics wants."""
    lines = [{"kind": "meta", "version": 1, "started": 1.7e9, "interval": 15.0},
             {"kind": "family", "name": "raypulse_job_info", "type": "gauge", "help": 'who "a" job is\\'},
             {"kind": "series", "id": 0, "family": "raypulse_job_info", "name": "raypulse_job_info",
              "labels": {"job_name": 'a "quoted"\nname\\', "cluster": "c"}},
             {"kind": "family", "name": "raypulse_train_nonfinite_values", "type": "counter", "help": "x"},
             {"kind": "series", "id": 1, "family": "raypulse_train_nonfinite_values",
              "name": "raypulse_train_nonfinite_values_total", "labels": {"rank": "0"}},
             {"kind": "family", "name": "raypulse_train_loss", "type": "gauge", "help": "x"},
             {"kind": "series", "id": 2, "family": "raypulse_train_loss", "name": "raypulse_train_loss",
              "labels": {"rank": "0"}}]
    lines += [{"kind": "scrape", "t": 1.7e9 + 15 * i, "s": [[0, 1.0], [1, float(i)], [2, float("nan") if i else 0.5]]}
              for i in range(3)]
    (tmp_path / recording.FILE_NAME).write_bytes(
        gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode()))
    om = tmp_path / "odd.om"
    assert export.export(tmp_path, om) == 9
    result = subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(om),
                             str(tmp_path / "tsdb")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr + om.read_text()
    assert "NUM SAMPLES" in result.stdout


def test_exporting_an_unknown_run_or_one_without_a_recording_is_bad_input(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(wire.ENV_HOME, str(tmp_path))
    with pytest.raises(BadInput, match="no run 'nope' is recorded here"):
        export.export_run("nope", tmp_path / "out.om")
    (tmp_path / "runs" / "plain-1").mkdir(parents=True)
    (tmp_path / "runs" / "plain-1" / "run.json").write_text("{}")
    with pytest.raises(BadInput, match="run 'plain-1' has no recording"):
        export.export_run("plain-1", tmp_path / "out.om")
    assert not os.path.exists(tmp_path / "out.om")
