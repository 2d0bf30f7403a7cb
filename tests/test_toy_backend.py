"""Adding a backend touches its own module, the registry and its tests, nothing else: a backend defined
here (it runs each attempt as a subprocess of this machine) is registered, and a run on it is submitted,
read, streamed and stopped through the launcher's Python API and its attempt engine, retried on failure,
and reached again from its record (`status`, `logs`, `stop`) by the same hooks as a built-in one's."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import launcher
from launcher import api
from launcher.backends import kinds, registry
from launcher.backends.base import Placement, Seen, Submission, new_record
from launcher.display import Reporter
from launcher.errors import BadInput
from launcher.health.exporters import Target
from launcher.health.faults import Fault
from launcher.jobs import JobsClient
from launcher.journal import Journal
from launcher.run import runtime_env
from launcher.spec import JobSpec, SpecError, build_spec
from launcher.state import RunRecord, request_stop
from tests.conftest import wait_until


class Subprocesses:
    """A run's attempts as subprocesses of this machine: attempt n is `bash -c ENTRYPOINT` in its own
    session with the attempt's environment, its output in a file. It answers as Ray's Jobs API does (the
    same status names; a stopped job is STOPPED, a non-zero exit FAILED with its exit code)."""

    names_attempts = True
    retries_itself = False
    restart_removes_pods = False
    token = None
    running: ClassVar[dict[str, subprocess.Popen]] = {}  # every toy job of this process, by submission id
    stopped: ClassVar[set[str]] = set()

    def __init__(self, spec: JobSpec, directory: Path) -> None:
        self.spec, self.directory = spec, directory
        self.address = f"toy://{directory}"

    def status(self, attempt: int, sid: str | None) -> Seen | None:
        assert sid is not None
        return job_status(sid)

    def submit(self, sid: str | None, submission: Submission) -> None:
        assert sid is not None
        env_vars = runtime_env(self.spec, submission.attempt, submission.traceparent, submission.env)["env_vars"]
        with open(self.directory / f"{sid}.log", "w") as log:
            self.running[sid] = subprocess.Popen(["bash", "-c", self.spec.entrypoint], stdout=log,
                                                 stderr=subprocess.STDOUT, env={**os.environ, **env_vars},
                                                 start_new_session=True)

    def stop(self, attempt: int, sid: str | None, restart: bool, why: str | None) -> None:
        assert sid is not None
        stop_job(sid)

    def stopping(self, restart: bool) -> str | None:
        return None

    def follow_logs(self, attempt: int, sid: str | None, write: Callable[[str], None]) -> threading.Thread:
        assert sid is not None

        def tail() -> None:
            with open(self.directory / f"{sid}.log") as log:
                while True:
                    ended = self.running[sid].poll() is not None
                    chunk = log.read()
                    if chunk:
                        write(chunk)
                    elif ended:
                        return
                    else:
                        time.sleep(0.05)

        thread = threading.Thread(target=tail, daemon=True)
        thread.start()
        return thread

    def logs(self, attempt: int, sid: str | None) -> str:
        return (self.directory / f"{sid}.log").read_text()


def job_status(sid: str) -> Seen | None:
    process = Subprocesses.running.get(sid)
    if process is None:
        return None
    code = process.poll()
    status = "RUNNING" if code is None else "SUCCEEDED" if code == 0 else \
        "STOPPED" if sid in Subprocesses.stopped else "FAILED"
    return Seen(sid, status, message=f"exit code {code}" if status == "FAILED" else None, driver_exit_code=code,
                end_time=time.time() if code is not None else None)


def stop_job(sid: str) -> None:
    process = Subprocesses.running[sid]
    if process.poll() is None:
        Subprocesses.stopped.add(sid)
        os.killpg(process.pid, signal.SIGTERM)


class NoExporters:
    access = None
    progress_url = None

    def targets(self) -> list[Target]:
        return []

    def sd_url(self) -> str | None:
        return None

    def head_url(self) -> str | None:
        return None


class NoRemedy:
    def dead_nodes(self) -> list[str]:
        return []

    def take_out(self, node: str, fault: Fault, for_good: bool) -> tuple[str, dict[str, Any]]:
        return "node.left", {}

    def before_attempt(self, record: RunRecord) -> None:
        pass


class ToyBackend(kinds.Kind):
    """The toy backend: its rules (a Kind: the name, nothing backend-specific taken) and the protocol."""

    name = "toy"

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec

    @staticmethod
    def reach(record: RunRecord, token_path: Path | None = None) -> JobsClient | None:
        return None  # no Ray dashboard

    def describe(self) -> str:
        return self.name

    def no_wait_refusal(self) -> str | None:
        return None  # its jobs outlive the submit (they are this test's processes)

    def checkpoint_dir(self) -> str | None:
        return None

    def run_record(self) -> RunRecord:
        return new_record(self.spec, self.name)

    def place(self, journal: Journal, cancel: threading.Event, detach: bool) -> Placement:
        assert journal.record is not None
        return Placement(jobs=Subprocesses(self.spec, journal.record.directory), dashboard=None,
                         exporters=NoExporters(), remedy=NoRemedy(), local_processes=True)

    @classmethod
    def refresh(cls, record: RunRecord, token_path: Path | None = None) -> None:
        from launcher.run import update_attempt

        for item in record.attempts:
            seen = job_status(item.submission_id)
            if seen is not None:
                update_attempt(record, item.attempt, seen)

    @classmethod
    def live_log(cls, record: RunRecord, attempt: int, write: Callable[[str], None], follow: bool,
                 token_path: Path | None = None) -> bool:
        item = record.attempt(attempt)
        path = record.directory / f"{item.submission_id}.log" if item else None
        if path is None or not path.exists():
            return False
        write(path.read_text())
        return True

    @classmethod
    def stop_recorded(cls, record: RunRecord, token_path: Path | None = None) -> list[str]:
        request_stop(record.run_id)
        live = [item.submission_id for item in record.attempts if (job_status(item.submission_id) or Seen(
            None, "SUCCEEDED")).status == "RUNNING"]
        for sid in live:
            stop_job(sid)
        return live


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[ToyBackend]]:
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    registry.register(ToyBackend)
    try:
        yield ToyBackend
    finally:
        registry.BACKENDS.pop(ToyBackend.name)
        kinds.KINDS.pop(ToyBackend.name)
        for process in Subprocesses.running.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def spec(**fields: Any) -> dict[str, Any]:
    return {"backend": "toy", "health": {"enabled": False}, "record": "off", **fields}


def log_of(run_id: str) -> str:
    written: list[str] = []
    api.logs(run_id, write=written.append)
    return "".join(written)


def test_an_unknown_backend_is_refused_naming_the_field_and_the_known_ones():
    with pytest.raises(SpecError, match="backend: Input should be 'local', 'existing' or 'kuberay'"):
        build_spec({"entrypoint": "true", "backend": "toy"})


def test_a_registered_backend_runs_a_job_that_is_read_streamed_and_stopped(toy: type[ToyBackend]):
    printed: list[str] = []
    reporter = Reporter()
    reporter.log = printed.append  # type: ignore[method-assign]
    handle = launcher.submit(spec(name="toy", entrypoint="echo hello from $RAYPULSE_ATTEMPT; exec sleep 300",
                                  run_id="toy-1"), reporter=reporter, follow_logs=True)
    sid = handle.record.attempts[0].submission_id
    assert Subprocesses.running[sid].poll() is None  # submitted through the backend's jobs
    assert handle.status().attempts[0].status == "RUNNING"
    wait_until(lambda: "hello from 1" in handle.logs(), 30, "the job's log")
    handle.stop()
    record = handle.wait()
    assert (record.state, record.exit_code) == ("STOPPED", 3)
    assert Subprocesses.running[sid].poll() is not None  # stopped through the backend
    assert [(item.attempt, item.status) for item in record.attempts] == [(1, "STOPPED")]
    assert "hello from 1" in "".join(printed)  # streamed by the engine while it ran
    kinds_seen = [event.kind for event in record.events]
    assert kinds_seen.count("attempt.submitted") == 1
    assert kinds_seen[-1] == "run.finished"
    assert "hello from 1" in log_of("toy-1")  # as saved with the run


def test_a_failed_attempt_is_retried_by_the_engine_on_the_registered_backend(toy: type[ToyBackend]):
    entrypoint = 'echo "attempt $RAYPULSE_ATTEMPT"; test "$RAYPULSE_ATTEMPT" = 2'
    record = launcher.submit(spec(name="toy", entrypoint=entrypoint, run_id="toy-2", max_retries=1,
                                  retry_backoff_seconds=0)).wait()
    assert (record.state, record.exit_code) == ("SUCCEEDED", 0)
    assert [(item.attempt, item.status) for item in record.attempts] == [(1, "FAILED"), (2, "SUCCEEDED")]
    assert record.attempt_log(1).read_text() == "attempt 1\n"
    assert record.attempt_log(2).read_text() == "attempt 2\n"


def test_a_recorded_run_on_the_registered_backend_is_read_and_stopped_through_it(toy: type[ToyBackend]):
    launcher.submit(spec(name="toy", entrypoint="echo left; exec sleep 300", run_id="toy-3"), detach=True)
    assert api.status("toy-3").attempts[0].status == "RUNNING"  # refreshed through the backend
    wait_until(lambda: "left" in log_of("toy-3"), 30, "the running attempt's log")
    stopped = api.stop("toy-3")
    assert len(stopped) == 1
    wait_until(lambda: api.status("toy-3").attempts[0].status == "STOPPED", 30, "the stop")
    with pytest.raises(BadInput, match="run_id: no run 'nope'"):
        api.status("nope")
