"""`launcher report`: one self-contained HTML file per run, checked in a real headless Chromium with
JavaScript on (driven over the DevTools protocol through --remote-debugging-pipe: no port, no
client library). Every chart must be drawn (coloured pixels inside its box in a screenshot), the
console must stay free of errors, and the file must load the same with the network off (Chromium
in a network namespace of its own, or, where that is not allowed, with the network emulated offline).

The end-to-end test records a real run (a kept local Ray cluster with simulated GPUs, a training
job that fails once and then succeeds from its checkpoint) with the Recorder, renders its report,
and keeps the screenshot as a test artefact (tests/artifacts/report.png). The others render
reports of what can go wrong: an unknown run, a run without a recording, a recording cut short.

Run the Ray test under `flock /tmp/raypulse-ray.lock`. Chromium: `apt-get install -y chromium`.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exporter.contract import wire
from launcher import recording, report
from launcher.errors import BadInput
from launcher.state import AttemptRecord, EventRecord, RunRecord
from tests.conftest import REPO, wait_until
from tests.launcher_support import cluster_processes, describe, free_base, launcher

ARTIFACTS = Path(os.environ.get("RAYPULSE_TEST_ARTIFACTS") or REPO / "tests" / "artifacts")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")


# --- a headless Chromium over the DevTools protocol ----------------------------------------------


def _netns_works() -> bool:
    """Whether this user may put a process in a network namespace of its own (root, or user namespaces)."""
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class Page:
    """What a page showed: its charts (box, traces drawn), console errors, requests, a screenshot."""

    charts: list[dict[str, Any]]
    errors: list[str]
    requests: list[str]
    screenshot: bytes
    ready: str | None
    failed: str | None
    offline_by: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)


class Chromium:
    """One headless Chromium speaking CDP over fds 3 (commands) and 4 (replies), NUL-separated JSON."""

    def __init__(self, offline: bool = False) -> None:
        assert CHROMIUM is not None
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        command = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                   "--disable-extensions", "--disable-background-networking", "--disable-dev-shm-usage",
                   "--remote-debugging-pipe", f"--user-data-dir={self.profile}", "about:blank"]
        self.offline_by = ""
        if offline and _netns_works():
            command = ["unshare", "-n", *command]  # no interface at all, not even loopback
            self.offline_by = "network namespace"
        elif offline:
            self.offline_by = "emulated"

        def fds() -> None:  # the child's fds 3 and 4 are the pipe ends Chromium expects
            # Through fresh copies: a pipe end may already be fd 3 or 4 (and dup2 onto itself would
            # leave it close-on-exec).
            read_end, write_end = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.process = subprocess.Popen(command, preexec_fn=fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def _read(self, timeout: float) -> dict[str, Any]:
        import select

        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 60) -> dict[str, Any]:
        self._next += 1
        ident = self._next
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(max(0.1, deadline - time.monotonic()))
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def pump(self, seconds: float) -> None:
        """Take in events for a while (console messages arrive on their own)."""
        deadline = time.monotonic() + seconds
        with contextlib.suppress(TimeoutError):
            while time.monotonic() < deadline:
                self.events.append(self._read(max(0.05, deadline - time.monotonic())))

    def open(self, path: Path, width: int = 1400, timeout: float = 90) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for method in ("Runtime.enable", "Log.enable", "Page.enable", "Network.enable"):
            self.send(method, session=session)
        if self.offline_by == "emulated":
            self.send("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": -1,
                                                           "uploadThroughput": -1}, session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 1000, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=session)
        self.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        deadline = time.monotonic() + timeout
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            state = self._evaluate(session, "({ready: document.body && document.body.dataset.ready || null, "
                                            "failed: document.body && document.body.dataset.failed || null})")
            if state.get("ready") or state.get("failed"):
                break
            self.pump(0.25)
        self.pump(0.5)  # late console messages
        charts = self._evaluate(session, """[...document.querySelectorAll('.chart')].map(d => {
            const r = d.getBoundingClientRect();
            return {id: d.id, title: d.dataset.title, x: r.left + scrollX, y: r.top + scrollY, width: r.width,
                    height: r.height, traces: d.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length,
                    links: d.querySelectorAll('svg.main-svg a').length};
        })""")
        size = self.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
            "x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1}}, session=session)
        return Page(charts, self._errors(), self._requests(), base64.b64decode(shot["data"]), state.get("ready"),
                    state.get("failed"), self.offline_by, list(self.events))

    def _evaluate(self, session: str, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session)
        return result.get("result", {}).get("value")

    def _errors(self) -> list[str]:
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(" ".join(str(arg.get("value", arg.get("description", ""))) for arg in params["args"]))
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"{params['entry'].get('source')}: {params['entry'].get('text')}")
        return found

    def _requests(self) -> list[str]:
        return [event["params"]["request"]["url"] for event in self.events
                if event.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close", timeout=5)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)


@contextlib.contextmanager
def chromium(offline: bool = False) -> Iterator[Chromium]:
    browser = Chromium(offline)
    try:
        yield browser
    finally:
        browser.close()


def coloured_pixels(png: bytes, box: dict[str, Any]) -> int:
    """Pixels inside the box that are clearly coloured (a trace), not white, grey or black (paper,
    grid, axes and text)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    left, top = int(box["x"]), int(box["y"])
    crop = image.crop((left, top, left + int(box["width"]), top + int(box["height"])))
    pixels = crop.tobytes()
    return sum(1 for i in range(0, len(pixels), 3) if max(pixels[i:i + 3]) - min(pixels[i:i + 3]) > 60)


def check_page(page: Page, expected_charts: set[str]) -> None:
    """Loaded, no console error, nothing fetched from the network, every expected chart drawn."""
    assert page.ready == "1", f"not every chart was drawn (failed: {page.failed}); errors: {page.errors}"
    assert page.errors == [], page.errors
    fetched = [url for url in page.requests if not url.startswith(("file:", "data:", "about:", "blob:"))]
    assert fetched == [], f"the report fetched from the network: {fetched}"
    assert {chart["id"] for chart in page.charts} == {f"chart-{name}" for name in expected_charts}
    for chart in page.charts:
        assert chart["width"] > 100, chart
        assert chart["height"] > 100, chart
        assert chart["traces"] >= 1, f"{chart['id']} has no trace drawn"
        assert chart["links"] == 0, f"{chart['id']} turned text into a link"  # plotly reads <a href> in text
        assert coloured_pixels(page.screenshot, chart) > 200, f"{chart['id']} looks blank in the screenshot"


# --- runs without a cluster: what can go wrong ---------------------------------------------------


def record_of(run_dir: Path, **fields: Any) -> RunRecord:
    now = time.time()
    record = RunRecord(run_id=run_dir.name, name="toy", backend="local", max_attempts=2, created_at=now - 60,
                       attempts=[AttemptRecord(attempt=1, submission_id=f"{run_dir.name}-a1", status="FAILED",
                                               driver_exit_code=1, submitted_at=now - 58, running_at=now - 55,
                                               ended_at=now - 40)], **fields)
    record.events.append(EventRecord(time=now - 39, kind="retry.scheduled", attempt=1, message="attempt 1 failed"))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(record.model_dump_json())
    return record


def test_an_unknown_run_is_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    with pytest.raises(BadInput, match="no run 'nope' is recorded here"):
        report.render("nope")


def test_the_report_advises_a_checkpoint_interval_from_the_saves_and_faults_seen(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    run = tmp_path / "runs" / "ckpt-1"
    record = record_of(run, state="FAILED", exit_code=1, finished_at=time.time())
    first = record.attempts[0]  # ran 15 s; a second attempt ran 85 s and failed: 2 faults over 100 s
    first.checkpoint_seconds, first.first_checkpoint, first.last_checkpoint = 2.0, (1.0, 10.0), (3.0, 70.0)
    assert first.ended_at is not None
    record.attempts.append(AttemptRecord(attempt=2, submission_id="ckpt-1-a2", status="FAILED",
                                         running_at=first.ended_at, ended_at=first.ended_at + 85))
    (run / "run.json").write_text(record.model_dump_json())
    text = report.render("ckpt-1").read_text()
    assert "<td>Young-Daly interval</td><td>14 s</td>" in text  # sqrt(2 x 2 s x 50 s)
    assert "<td>interval used</td><td>30 s</td>" in text
    assert "checkpoints too rare for this fault rate" in text


@needs_chromium
def test_a_run_without_a_recording_reports_its_record_and_says_why(tmp_path: Path):
    run = tmp_path / "runs" / "plain-1"
    record_of(run, state="FAILED", exit_code=1, finished_at=time.time())
    path = report.render(run)
    text = path.read_text()
    assert "This run has no recording" in text
    assert "plain-1-a1" in text
    with chromium() as browser:
        check_page(browser.open(path), {"attempts"})


@needs_chromium
def test_a_recording_cut_short_by_a_crash_still_reads_and_reports(tmp_path: Path):
    run = tmp_path / "runs" / "crashed-1"
    record_of(run, state="RUNNING")
    lines = [{"kind": "meta", "version": 1, "started": time.time() - 50, "interval": 1.0},
             {"kind": "family", "name": "raypulse_train_step", "type": "gauge", "help": "step"},
             {"kind": "series", "id": 0, "family": "raypulse_train_step", "name": "raypulse_train_step",
              "labels": {"submission_id": "crashed-1-a1", "rank": "0", "cluster": "c", "node": "n"}}]
    members = [gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode())]
    for step in range(5):
        scrape = {"kind": "scrape", "t": time.time() - 50 + step, "s": [[0, float(step)]]}
        members.append(gzip.compress((json.dumps(scrape) + "\n").encode()))
    whole = b"".join(members)
    (run / recording.FILE_NAME).write_bytes(whole[: len(whole) - 9])  # the last member loses its trailer
    rec = recording.read(run)
    assert rec.cut_short
    assert rec.select("raypulse_train_step")[0].values == [0.0, 1.0, 2.0, 3.0]
    path = report.render(run)
    assert "was still being written (the run is still going)" in path.read_text()
    with chromium() as browser:
        check_page(browser.open(path), {"attempts", "step", "throughput"})


@needs_chromium
def test_an_rl_run_gets_its_reward_phases_kl_and_truncation_drawn(tmp_path: Path):
    run = tmp_path / "runs" / "rl-1"
    record_of(run, state="SUCCEEDED", exit_code=0, finished_at=time.time())
    rank = {"submission_id": "rl-1-a1", "rank": "0", "cluster": "c", "node": "n"}
    families = {"raypulse_rl_iteration": rank, "raypulse_rl_reward_mean": rank, "raypulse_rl_kl": rank,
                "raypulse_rl_truncated_ratio": rank,
                "raypulse_rl_phase_iteration_seconds": {**rank, "phase": "generate"}}
    lines: list[dict[str, Any]] = [{"kind": "meta", "version": 1, "started": time.time() - 50, "interval": 1.0}]
    for number, (name, labels) in enumerate(families.items()):
        lines += [{"kind": "family", "name": name, "type": "gauge", "help": name},
                  {"kind": "series", "id": number, "family": name, "name": name, "labels": labels}]
    for t in range(6):
        values = (t, 0.1 * t, 0.01, 0.05, 2.0)
        lines.append({"kind": "scrape", "t": time.time() - 50 + t, "s": [[i, v] for i, v in enumerate(values)]})
    (run / recording.FILE_NAME).write_bytes(gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode()))
    path = report.render(run)
    assert "RL post-training" in path.read_text()
    with chromium() as browser:
        check_page(browser.open(path), {"attempts", "rl-reward", "rl-phases", "rl-kl", "rl-truncated"})


@needs_chromium
def test_a_large_fleet_is_drawn_as_bands_with_its_outlying_nodes_named(tmp_path: Path):
    """100 nodes (above record_fleet.FLEET_NODES): the recorder keeps distributions, and the report draws
    them as bands, with the node that stood out (an idle GPU) named over them, never a line per GPU."""
    from bench.fakefleet import FakeFleet

    run = tmp_path / "runs" / "fleet-1"
    record_of(run, state="SUCCEEDED", exit_code=0, finished_at=time.time())
    fleet, now = FakeFleet(100), [time.time() - 900]
    targets = fleet.targets()
    rec = recording.Recorder(run, lambda: targets, interval=3600, clock=lambda: now[0]).start()
    wait_until(lambda: rec.rounds >= 1, 10, "the recorder's first round")
    for index in range(40):
        if index == 20:
            fleet.fault(5, "idle")
        fleet.tick()
        now[0] += 15
        rec.record_once()
    rec.stop()
    path = report.render(run)
    figures = json.loads(path.read_text().partition('<script type="application/json" id="report-figures">')[2]
                         .partition("</script>")[0])
    names = [trace["name"] for trace in figures["gpu-util"]["data"]]
    assert "worker p5-p95" in names
    assert "worker median" in names
    assert "node-0005 GPU 3" in names  # the outlier, named
    assert len(names) < 100  # not one line per GPU (800)
    with chromium() as browser:
        check_page(browser.open(path), {"attempts", "step", "loss", "throughput", "gpu-util", "gpu-memory",
                                        "gpu-power", "gpu-temperature", "node-memory"})


HOSTILE = '<!--<script> & <a href="https://example.invalid/">click</a>'  # text an exporter or a job controls


def test_json_in_the_page_escapes_markup_and_chart_text_stays_text(tmp_path: Path):
    run = tmp_path / "runs" / "hostile-1"
    record = record_of(run, state="FAILED", exit_code=1, finished_at=time.time())
    record.events.append(EventRecord(time=time.time() - 30, kind="health.fault", attempt=1, message=HOSTILE))
    (run / "run.json").write_text(record.model_dump_json())
    text = report.render(run).read_text()
    figures = text.partition('<script type="application/json" id="report-figures">')[2].partition("</script>")[0]
    assert not {"<", ">", "&"} & set(figures)  # \u003c...: the HTML parser sees no markup, not even a comment
    marker = json.loads(figures)["attempts"]["data"][-1]
    assert marker["text"][-1:] == ["health.fault: &lt;!--&lt;script&gt; &amp; &lt;a href=\"https://example.invalid/\"&gt;"
                              "click&lt;/a&gt;"]  # plotly shows entities as the characters, and no tag


@needs_chromium
def test_a_hostile_string_neither_blanks_the_report_nor_becomes_a_link(tmp_path: Path):
    run = tmp_path / "runs" / "hostile-2"
    record = record_of(run, state="FAILED", exit_code=1, finished_at=time.time())
    record.events.append(EventRecord(time=time.time() - 30, kind="health.fault", attempt=1, message=HOSTILE))
    (run / "run.json").write_text(record.model_dump_json())
    lines: list[dict[str, Any]] = [
        {"kind": "meta", "version": 1, "started": time.time() - 50, "interval": 1.0},
        {"kind": "family", "name": "raypulse_train_step", "type": "gauge", "help": "step"}]
    for rank in (0, 1):  # two curves: plotly draws a legend, where a name's <a href> would become a link
        lines.append({"kind": "series", "id": rank, "family": "raypulse_train_step", "name": "raypulse_train_step",
                      "labels": {"submission_id": HOSTILE, "rank": str(rank), "cluster": "c", "node": "n"}})
    lines += [{"kind": "scrape", "t": time.time() - 50 + t, "s": [[0, float(t)], [1, float(t)]]} for t in range(5)]
    (run / recording.FILE_NAME).write_bytes(gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode()))
    path = report.render(run)
    with chromium() as browser:
        check_page(browser.open(path), {"attempts", "step", "throughput"})  # every script ran, no <a> drawn


# --- the report of a real run ----------------------------------------------------------------------

TRAIN = "python train.py --workers 2 --steps 60 --checkpoint-every 10 --fail-at-step 25 --step-seconds 0.25"
CHARTS = {"attempts", "step", "loss", "throughput", "gpu-util", "gpu-memory", "gpu-power", "gpu-temperature",
          "node-cpu", "node-memory"}


def _metrics_has(url: str, series: str, label: str) -> bool:
    """A line of the exporter's /metrics starts with `series` and holds `label` (labels come sorted by name)."""
    import urllib.request

    with urllib.request.urlopen(url + wire.METRICS_PATH, timeout=5) as response:
        return any(line.startswith(series) and label in line for line in response.read().decode().splitlines())


@contextlib.contextmanager
def gpu_users(cluster: dict[str, Any]) -> Iterator[None]:
    """While the run goes, each training actor (a `ray::Worker` process of the run) is listed as a
    process on a simulated GPU of its node, as NVML would list it, so that the exporter attributes
    that GPU to the job. Best effort: the report shows the attribution when it was seen."""
    import psutil

    by_progress = {ref["progress_url"]: ref for ref in cluster["exporters"] if ref.get("gpu_control")}
    done: set[int] = set()
    stop = threading.Event()

    def inject() -> None:
        while not stop.wait(0.5):
            for process in cluster_processes("recorded"):
                with contextlib.suppress(psutil.Error, IndexError):
                    if process.pid in done or not process.cmdline()[0].startswith("ray::Worker"):
                        continue
                    ref = by_progress.get(process.environ().get(wire.ENV_PROGRESS_URL, ""))
                    if ref is not None:
                        done.add(process.pid)
                        gpu = str(sum(1 for pid in done if pid != process.pid) % 2)
                        subprocess.run([sys.executable, "-m", "exporter", "gpu-fault", "--control", ref["gpu_control"],
                                        "--gpu", gpu, "process", str(process.pid), "20480", "--sm", "0.8"],
                                       cwd=REPO, capture_output=True, timeout=30)

    thread = threading.Thread(target=inject, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(40)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(420)
@needs_chromium
def test_the_report_of_a_real_run_that_failed_once_then_succeeded(tmp_path_factory):
    home = tmp_path_factory.mktemp("raypulse-home")
    exporter_port, progress_port = free_base(3)
    started = launcher("up", "--name", "recorded", "--workers", "2", "--worker-gpus", "2", "--simulate-gpus",
                       "--exporter-port", str(exporter_port), "--progress-port", str(progress_port), home=home)
    assert started.returncode == 0, started.stderr
    try:
        cluster = json.loads((home / "clusters" / "recorded" / "cluster.json").read_text())
        worker = next(ref for ref in cluster["exporters"] if ref["node"] == "workers-1")
        # A fault the report must show, and that no health policy acts on (XID 31: an application's MMU fault).
        fault = subprocess.run([sys.executable, "-m", "exporter", "gpu-fault", "--control", worker["gpu_control"],
                                "--gpu", "0", "xid", "31"], capture_output=True, text=True, cwd=REPO)
        assert fault.returncode == 0, fault.stderr
        wait_until(lambda: _metrics_has(worker["url"], "raypulse_gpu_xid_errors_total{", 'gpu="0"'), 60, "the XID")
        run_dir = home / "runs" / "recorded-1"
        with gpu_users(cluster):  # the launcher records the run itself (on by default), every second here
            result = launcher("submit", "--cluster", "recorded", "--run-id", "recorded-1", "--working-dir",
                              str(REPO / "examples"), "--max-retries", "1", "--retry-backoff", "1",
                              "--record-interval", "1", "--", TRAIN, home=home)
        assert result.returncode == 0, result.stderr
    finally:
        down = launcher("down", "recorded", home=home)
        assert down.returncode == 0, down.stderr
    assert not cluster_processes("recorded"), describe(cluster_processes("recorded"))

    rec = recording.read(run_dir)
    assert not rec.cut_short
    steps = {(s.labels["submission_id"], s.labels["rank"]) for s in rec.select("raypulse_train_step")}
    assert {("recorded-1-a1", "0"), ("recorded-1-a1", "1"), ("recorded-1-a2", "0"), ("recorded-1-a2", "1")} <= steps
    assert {s.labels["submission_id"] for s in rec.select("raypulse_job_attempt")} >= {"recorded-1-a1",
                                                                                       "recorded-1-a2"}
    assert len(rec.select("raypulse_gpu_utilization_ratio")) == 4

    path = report.render(run_dir, tmp_path_factory.mktemp("report") / "report.html")
    text = path.read_text()
    assert "XID 31" in text
    assert "recorded-1-a1" in text
    assert "FAILED" in text
    assert "SUCCEEDED" in text
    with chromium() as browser:
        page = browser.open(path)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "report.png").write_bytes(page.screenshot)
    check_page(page, CHARTS)
    with chromium(offline=True) as browser:
        offline = browser.open(path)
    check_page(offline, CHARTS)
    assert [(c["id"], c["traces"]) for c in offline.charts] == [(c["id"], c["traces"]) for c in page.charts]
    print(f"report: {path} ({path.stat().st_size / 2**20:.1f} MiB), screenshot {ARTIFACTS / 'report.png'}, "
          f"offline by {offline.offline_by}")
