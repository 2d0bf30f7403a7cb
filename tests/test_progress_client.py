"""`exporter.progress` in real training-like processes: it never raises, never blocks, drops and
counts when nobody listens, and what it sends shows up in a real exporter's /metrics."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.contract import digest, wire
from tests.conftest import REPO, free_port, wait_until


def run_client(code: str, env: dict[str, str], timeout: float = 60) -> dict:
    """Run `code` in a fresh interpreter (the client is per process); it prints one JSON line last."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY", "RAYPULSE", "RANK"))}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=timeout, cwd=REPO, env={**base, **env})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def job_config(submission_id: str) -> str:
    return json.dumps({"runtime_env": {}, "metadata": {"job_submission_id": submission_id}})


def test_without_an_exporter_reports_are_dropped_counted_and_cheap():
    stats = run_client("""
        import json, time
        from exporter import progress
        worst = 0.0
        for step in range(5000):
            started = time.perf_counter()
            progress.report(step, loss=0.5, samples=32)
            worst = max(worst, time.perf_counter() - started)
        progress.checkpoint_saved(5000)
        progress.flush(5)
        print(json.dumps({**progress.stats(), "worst": worst}))
    """, {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{free_port()}",
          "RAY_JOB_CONFIG_JSON_ENV_VAR": job_config("no-exporter")})
    assert stats["sent"] == 0
    assert stats["dropped"] + stats["queued"] == 5001  # every report accounted for; the queue holds at most 1000
    assert stats["dropped"] >= 4000
    # Each call only enqueues: one that waited on the network would take the sender's 2 s timeout.
    assert stats["worst"] < 1.5


def test_a_stalled_exporter_never_blocks_the_training_loop():
    with socket.socket() as server:  # accepts connections (the kernel does) but never answers
        server.bind(("127.0.0.1", 0))
        server.listen(100)
        stats = run_client("""
            import json, time
            from exporter import progress
            worst = 0.0
            for step in range(3000):
                started = time.perf_counter()
                progress.report(step, loss=1.0, rank=2)
                worst = max(worst, time.perf_counter() - started)
            print(json.dumps({**progress.stats(), "worst": worst}))
        """, {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{server.getsockname()[1]}", "RAY_JOB_ID": "05000000"})
    assert stats["worst"] < 1.5  # no call waited on the network (that would take the sender's 2 s timeout)
    assert stats["sent"] == 0
    assert stats["queued"] + stats["dropped"] >= 3000 - 100  # at most one batch in flight
    assert stats["dropped"] >= 3000 - 1000 - 100  # the bounded queue holds 1000


def test_nonsense_arguments_never_raise():
    stats = run_client("""
        import json
        from exporter import progress
        progress.report("seven", loss=object(), samples=-3, tokens="many", grad_norm=[1], learning_rate=None)
        progress.report(None, rank="a")
        progress.checkpoint_saved(step=object(), rank=None)
        progress.report(3, loss=float("inf"), samples=2**70)
        progress.flush(3)
        print(json.dumps(progress.stats()))
    """, {"RAYPULSE_PROGRESS_URL": "http://[::1:bad", "RAY_JOB_ID": "05000000"})
    assert stats["sent"] == 0
    assert stats["dropped"] == 4  # three reports and a checkpoint, none deliverable, none raised


@pytest.fixture
def exporter_with_progress(start_exporter, tmp_path):
    def start(listen: str):
        env = {"RAYPULSE_EXPORTER_COLLECTORS__TRAIN__INTERVAL_SECONDS": "0.5",
               "RAYPULSE_EXPORTER_RAY__DASHBOARD_URL": f"http://127.0.0.1:{free_port()}"}
        return start_exporter("--progress-listen", listen, env=env)
    return start


def series(exporter, family: str) -> dict[tuple, float]:
    found = {}
    for metric in text_string_to_metric_families(exporter.metrics_text()):
        for sample in metric.samples:
            if sample.name == family:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


TRAINING = """
    import json, math
    from exporter import progress
    for step in range(1, 21):
        progress.report(step, loss=math.nan if step == 7 else 1.0 / step, samples=32, tokens=4096,
                        grad_norm=0.5, learning_rate=3e-4)
    progress.checkpoint_saved(20)
    assert progress.flush(5)
    print(json.dumps(progress.stats()))
"""


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_reports_reach_the_exporter(exporter_with_progress, tmp_path, transport):
    if transport == "tcp":
        port = free_port()
        listen, url = f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"
    else:
        listen = url = f"unix:{tmp_path / 'progress.sock'}"
    exporter = exporter_with_progress(listen)
    stats = run_client(TRAINING, {"RAYPULSE_PROGRESS_URL": url, "RAY_JOB_CONFIG_JSON_ENV_VAR": job_config("sub-7"),
                                  "RANK": "3"})
    assert stats == {"sent": 21, "dropped": 0, "rejected": 0, "queued": 0}
    labels = (("job_id", ""), ("rank", "3"), ("submission_id", "sub-7"))
    wait_until(lambda: series(exporter, "raypulse_train_step").get(labels) == 20, 10, "step 20 in /metrics")
    assert series(exporter, "raypulse_train_samples_total")[labels] == 20 * 32
    assert series(exporter, "raypulse_train_tokens_total")[labels] == 20 * 4096
    assert series(exporter, "raypulse_train_loss")[labels] == pytest.approx(1 / 20)
    assert series(exporter, "raypulse_train_nonfinite_values_total")[(("field", "loss"), *labels)] == 1
    assert series(exporter, "raypulse_train_checkpoint_step")[labels] == 20
    last = series(exporter, "raypulse_train_last_progress_time_seconds")[labels]
    assert time.time() - 60 < last <= time.time()


CHECKPOINTING = """
    import json, time
    from exporter import progress
    for step in (10, 20):
        progress.report(step)
        with progress.checkpoint(step):
            time.sleep(0.3)  # the save
    assert progress.flush(5)
    print(json.dumps(progress.stats()))
"""


def test_a_timed_checkpoint_reaches_the_exporters_metrics_and_its_health_digest(exporter_with_progress):
    port = free_port()
    exporter = exporter_with_progress(f"127.0.0.1:{port}")
    run_client(CHECKPOINTING, {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{port}",
                               "RAY_JOB_CONFIG_JSON_ENV_VAR": job_config("sub-8")})
    labels = (("job_id", ""), ("rank", "0"), ("submission_id", "sub-8"))
    wait_until(lambda: series(exporter, "raypulse_train_checkpoints_total").get(labels) == 2, 10, "2 saves in /metrics")
    assert series(exporter, "raypulse_train_checkpoint_duration_seconds")[labels] >= 0.3
    status, _, body = exporter.get(wire.DIGEST_PATH)
    job = digest.NodeDigest.model_validate_json(body).jobs["sub-8"]
    assert status == 200
    assert (job.checkpoints, job.checkpoint_step) == (2, 20)
    assert job.checkpoint_seconds is not None
    assert job.checkpoint_seconds >= 0.3


def test_the_runs_checkpoint_intervals_are_served_as_gauges(exporter_with_progress):
    port = free_port()
    exporter = exporter_with_progress(f"127.0.0.1:{port}")
    report = {"kind": "run", "run_id": "run-9", "time": time.time(), "checkpoint_interval_seconds": 1800.0,
              "checkpoint_advised_interval_seconds": 98.0}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{wire.PROGRESS_PATH}", method="POST",
                                     data=json.dumps({"reports": [report]}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 204
    run = (("run_id", "run-9"),)
    wait_until(lambda: series(exporter, "raypulse_run_checkpoint_interval_seconds").get(run) == 1800.0, 10,
               "the interval in /metrics")
    assert series(exporter, "raypulse_run_checkpoint_advised_interval_seconds")[run] == 98.0


def test_where_the_runs_time_went_is_served_by_cause_and_an_unknown_cause_is_refused(exporter_with_progress):
    port = free_port()
    exporter = exporter_with_progress(f"127.0.0.1:{port}")

    def post(time_seconds: dict[str, float]) -> int:
        report = {"kind": "run", "run_id": "run-10", "time": time.time(), "time_seconds": time_seconds}
        request = urllib.request.Request(f"http://127.0.0.1:{port}{wire.PROGRESS_PATH}", method="POST",
                                         data=json.dumps({"reports": [report]}).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as error:
            return error.code

    assert post({"made_up": 1.0}) == 400  # a cause is one of the ledger's: the label stays bounded
    assert post({"productive": 120.0, "startup": 12.5, "detecting": 0.0}) == 204
    wait_until(lambda: len(series(exporter, "raypulse_run_time_seconds")) == 3, 10, "the split in /metrics")
    split = {dict(labels)["cause"]: value for labels, value in series(exporter, "raypulse_run_time_seconds").items()}
    assert split == {"productive": 120.0, "startup": 12.5, "detecting": 0.0}


def test_reports_the_exporter_refuses_are_counted_not_raised(exporter_with_progress):
    port = free_port()
    exporter_with_progress(f"127.0.0.1:{port}")
    stats = run_client("""
        import json
        from exporter import progress
        progress.report(1, loss=0.1)  # no Ray job id, no submission id: the exporter answers 400
        progress.flush(5)
        print(json.dumps(progress.stats()))
    """, {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{port}"})
    assert (stats["sent"], stats["rejected"], stats["dropped"]) == (0, 1, 1)


def test_the_job_comes_from_what_ray_puts_in_the_process(exporter_with_progress):
    port = free_port()
    exporter = exporter_with_progress(f"127.0.0.1:{port}")
    url = {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{port}"}
    code = "import json\nfrom exporter import progress\nprogress.report(1)\nprogress.flush(5)\n" \
           "print(json.dumps(progress.stats()))"
    run_client(code, {**url, "RAY_JOB_ID": "0a000000"})  # a worker Ray started for job 0a
    run_client(code, {**url, "RAY_JOB_ID": "ffffffff"})  # a prestarted worker: no job yet, so refused
    wait_until(lambda: series(exporter, "raypulse_train_reports_total"), 10, "a report in /metrics")
    reported = {dict(labels)["job_id"] for labels in series(exporter, "raypulse_train_reports_total")}
    assert reported == {"0a000000"}


def test_the_ray_train_helper_forwards_to_ray_train_and_reports_the_step(exporter_with_progress):
    """ray[train] is not installed here, so its two calls the helper uses are stood in for; the
    client, the endpoint and the exporter are real."""
    port = free_port()
    exporter = exporter_with_progress(f"127.0.0.1:{port}")
    stats = run_client("""
        import json, sys, types
        calls = []
        train = types.ModuleType("ray.train")
        train.report = lambda metrics, checkpoint=None, **kwargs: calls.append([metrics["step"], checkpoint, kwargs])
        train.get_context = lambda: types.SimpleNamespace(get_world_rank=lambda: 3)
        ray = types.ModuleType("ray")
        ray.train, ray.is_initialized = train, lambda: True
        ray.get_runtime_context = lambda: types.SimpleNamespace(get_job_id=lambda: "0b000000")
        sys.modules.update({"ray": ray, "ray.train": train})
        from exporter import progress
        progress.ray_train_report({"step": 4, "loss": 0.5, "lr": 0.01, "samples": 64})
        progress.ray_train_report({"step": 5, "train_loss": 0.25, "lr": 0.01, "samples": 64}, checkpoint="ckpt-5",
                                  checkpoint_dir_name="x")
        progress.flush(5)
        print(json.dumps({**progress.stats(), "calls": calls}))
    """, {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{port}"})
    assert stats["calls"] == [[4, None, {}], [5, "ckpt-5", {"checkpoint_dir_name": "x"}]]
    assert stats["sent"] == 3
    labels = (("job_id", "0b000000"), ("rank", "3"), ("submission_id", ""))
    wait_until(lambda: series(exporter, "raypulse_train_checkpoint_step").get(labels) == 5, 10, "the checkpoint")
    assert series(exporter, "raypulse_train_step")[labels] == 5
    assert series(exporter, "raypulse_train_loss")[labels] == 0.25
    assert series(exporter, "raypulse_train_samples_total")[labels] == 128
    assert series(exporter, "raypulse_train_learning_rate")[labels] == 0.01


def test_each_checkpoint_report_carries_the_ranks_saves_so_far(monkeypatch: pytest.MonkeyPatch):
    """So that a save whose report is lost on the way (a full queue, an exporter that did not take it) is made
    up by the next: the exporter's count is the client's, not the reports it happened to get."""
    from exporter import progress
    from exporter.config import ProgressSettings
    from exporter.progress import client as progress_client
    from exporter.progress.store import ProgressStore, parse_batch

    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", job_config("ckpt-a1"))  # the job the reports are of
    sent: list[dict] = []
    fresh = progress_client._Client(f"http://127.0.0.1:{free_port()}")
    monkeypatch.setattr(fresh, "enqueue", sent.append)
    monkeypatch.setattr(progress_client, "_client", fresh)
    for step in (30, 60, 90):
        progress.checkpoint_saved(step, seconds=0.5, rank=0)
    assert [entry["checkpoints_total"] for entry in sent] == [1, 2, 3]
    store = ProgressStore(ProgressSettings())
    store.apply(parse_batch({"reports": [sent[0], sent[2]]}))  # the second save's report never arrived
    [state] = [ranks[0] for ranks in store.jobs.values()]
    assert (state.checkpoints, state.checkpoint_step) == (3, 90)
