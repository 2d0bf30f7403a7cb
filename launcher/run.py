"""A run: one logical job across attempts, on a cluster reached through the Jobs API.

Submission is idempotent by submission id, as KubeRay's submitter does it: attempt n of run R is
`R-a<n>`; before submitting, the run asks the cluster for that id and follows the job it finds
instead of submitting twice. A failed attempt is retried as a new attempt after a backoff (doubling,
capped) up to max_retries; a stop or a deadline ends the run without retry. Every attempt carries
the raypulse.* metadata that the exporter turns into job labels. Each attempt, its phases and each
backoff are spans of the run's trace (launcher/tracing.py), whose id goes to the attempt's metadata.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from launcher import audit
from launcher.display import Reporter
from launcher.errors import BadInput, InfraError
from launcher.exitcodes import FINAL_STATES, ExitCode
from launcher.jobs import TERMINAL, ClusterLost, JobsClient
from launcher.spec import JobSpec
from launcher.state import AttemptRecord, RunRecord, request_stop, stop_requested
from launcher.tracing import AttemptSpan, RunTrace, traceparent

POLL_S = 0.25
LOST_AFTER_S = 30.0  # the Jobs API failing this long means the cluster is gone
STOP_WAIT_S = 20.0  # Ray sends SIGTERM, then SIGKILL after its own timeout
EXPORTERS_AFTER_S = 5.0  # an attempt still pending this long gets its on_running call anyway


def submission_id(run_id: str, attempt: int) -> str:
    return f"{run_id}-a{attempt}"


def job_metadata(spec: JobSpec, attempt: int, trace_id: str | None = None) -> dict[str, str]:
    """The Ray job metadata shared with the exporter (it labels job series with these), and the run's
    trace id when it is traced (so the trace can be found from the job)."""
    metadata = {
        "raypulse.job_name": spec.name,
        "raypulse.run_id": spec.run_id or "",
        "raypulse.attempt": str(attempt),
        "raypulse.max_attempts": str(spec.max_attempts),
        "raypulse.workspace": spec.workspace,
        "raypulse.user": spec.user,
    }
    metadata.update({f"raypulse.label.{key}": value for key, value in spec.labels.items()})
    if trace_id:
        metadata["raypulse.trace_id"] = trace_id
    return metadata


def runtime_env(spec: JobSpec, attempt: int | None = None, trace_parent: str | None = None) -> dict[str, Any]:
    """Ray's runtime_env of an attempt. Its processes also get RAYPULSE_RUN_ID and RAYPULSE_ATTEMPT,
    so training code can tell a retry (and, say, resume from its last checkpoint), and in a traced
    run TRACEPARENT (W3C), so the job's own spans can join the attempt's."""
    env: dict[str, Any] = {}
    if spec.working_dir:
        env["working_dir"] = spec.working_dir
    if spec.runtime_env.pip:
        env["pip"] = list(spec.runtime_env.pip)
    env_vars = dict(spec.runtime_env.env_vars)
    if attempt is not None:
        env_vars.update({"RAYPULSE_RUN_ID": spec.run_id or "", "RAYPULSE_ATTEMPT": str(attempt)})
    if trace_parent:
        env_vars["TRACEPARENT"] = trace_parent
    if env_vars:
        env["env_vars"] = env_vars
    return env


def backoff_seconds(spec: JobSpec, failed_attempt: int) -> float:
    return min(spec.retry_backoff_seconds * 2 ** (failed_attempt - 1), spec.retry_backoff_max_seconds)


def update_attempt(record: RunRecord, attempt: int, details: Any) -> AttemptRecord:
    """Copy what Ray says about an attempt (its JobDetails) into the run record."""
    item = record.attempt(attempt)
    if item is None:
        sid = details.submission_id or submission_id(record.run_id, attempt)
        item = AttemptRecord(attempt=attempt, submission_id=sid)
        record.attempts.append(item)
        record.attempts.sort(key=lambda entry: entry.attempt)
    item.status = details.status.value
    # Ray appends the log's tail to a failure message; the log is kept whole beside the run.
    item.message = (details.message or "").split("\n", 1)[0].split(", last available logs", 1)[0].rstrip(":, ") or None
    item.error_type = details.error_type
    item.driver_exit_code = getattr(details, "driver_exit_code", None)
    if details.start_time and item.submitted_at is None:
        item.submitted_at = details.start_time / 1000
    if details.end_time:
        item.ended_at = details.end_time / 1000
    return item


class Run:
    """Drives a run's attempts on one cluster. `start()` submits (or finds) the current attempt,
    `wait()` follows it to the end, retrying; `stop()` may be called from any thread."""

    def __init__(self, spec: JobSpec, client: JobsClient, record: RunRecord, reporter: Reporter,
                 cancel: threading.Event, follow_logs: bool = True,
                 on_running: Callable[[], None] | None = None, run_trace: RunTrace | None = None) -> None:
        self.spec = spec
        self.trace = run_trace or RunTrace.off()
        self._attempt_span: AttemptSpan | None = None  # the current attempt's, until it ends
        # Called once, when the first attempt runs (or has waited EXPORTERS_AFTER_S, or ended):
        # the local backend starts its exporters then, off the path to a running job.
        self._on_running = on_running
        self.client = client
        self.record = record
        self.reporter = reporter
        self.cancel = cancel
        self.follow_logs = follow_logs
        self.current = 0
        self._attempt_started = record.created_at

    # --- submission ----------------------------------------------------------------------------

    def start(self) -> None:
        """Status first, then submit: find the attempts this run already has on the cluster and
        follow the latest, or submit attempt 1. A run re-submitted after it ended is followed to
        its end again (with more attempts if max_retries now allows them)."""
        self.record.exit_code = self.record.finished_at = self.record.reason = None
        latest = None
        for attempt in range(1, self.spec.max_attempts + 1):
            details = self.client.details(submission_id(self.record.run_id, attempt))
            if details is None:
                break
            latest = (attempt, details)
            update_attempt(self.record, attempt, details)
        if latest is None:
            self._submit(1)
            return
        attempt, details = latest
        self.current = attempt
        self.reporter.info(f"run {self.record.run_id} already has attempt {attempt} "
                           f"({submission_id(self.record.run_id, attempt)}, {details.status.value}); "
                           "following it instead of submitting again")
        if details.status.value == "FAILED" and attempt < self.spec.max_attempts:
            self._submit(attempt + 1)
        else:
            self._open_attempt_span(attempt).phase(details.status.value)

    def _submit(self, attempt: int) -> None:
        sid = submission_id(self.record.run_id, attempt)
        self.current = attempt
        self._attempt_started = time.time() if attempt > 1 else self.record.created_at
        span = self._open_attempt_span(attempt)
        if self.client.details(sid) is None:  # status first, also for retries
            try:
                with span.child("attempt.submit"):
                    self.client.submit(sid, self.spec.entrypoint,
                                       runtime_env(self.spec, attempt, traceparent(span.span)),
                                       job_metadata(self.spec, attempt, self.trace.trace_id))
            except RuntimeError as exc:
                self.end_attempt_span("FAILED", f"not submitted: {exc}")
                audit.record("attempt.submit", f"error: {exc}", run_id=self.record.run_id, submission_id=sid)
                if "status code 4" in str(exc):
                    raise BadInput(f"the cluster refused attempt {attempt}: {exc}") from None
                raise InfraError(f"submitting attempt {attempt} failed: {exc}") from None
            audit.record("attempt.submit", "ok", run_id=self.record.run_id, submission_id=sid, attempt=attempt,
                         address=self.client.address, entrypoint=self.spec.entrypoint)
        if self.record.attempt(attempt) is None:
            self.record.attempts.append(AttemptRecord(attempt=attempt, submission_id=sid, submitted_at=time.time()))
        self.record.state = "PENDING"
        self.record.save()
        span.phase("PENDING")
        self.reporter.info(f"attempt {attempt}/{self.spec.max_attempts} submitted as {sid}")

    def _open_attempt_span(self, attempt: int) -> AttemptSpan:
        self.end_attempt_span("ABANDONED")  # not expected: an attempt's span ends with the attempt
        self._attempt_span = AttemptSpan(self.trace, self.record.run_id, attempt,
                                         submission_id(self.record.run_id, attempt))
        return self._attempt_span

    def end_attempt_span(self, state: str, message: str | None = None, driver_exit_code: int | None = None) -> None:
        """End the current attempt's span (also when the run is left mid-attempt)."""
        if self._attempt_span is not None:
            self._attempt_span.end(state, message, driver_exit_code)
            self._attempt_span = None

    # --- following -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the run to stop: the current attempt is stopped and nothing is retried."""
        request_stop(self.record.run_id)
        self.cancel.set()

    def wait(self) -> RunRecord:
        """Follow attempts until the run is final; returns the final record (exit_code set)."""
        while True:
            outcome = self._follow(self.current)
            if outcome == "FAILED" and self.current < self.spec.max_attempts:
                delay = backoff_seconds(self.spec, self.current)
                self.record.state = "RETRYING"
                self.record.save()
                self.reporter.info(f"attempt {self.current} failed; attempt {self.current + 1} in {delay:g}s")
                with self.trace.span("retry.backoff", **{"raypulse.backoff_seconds": delay,
                                                         "raypulse.next_attempt": self.current + 1}):
                    interrupted = self._sleep(delay)
                if interrupted:
                    return self._finish(interrupted, "stopped during the backoff before a retry")
                self._submit(self.current + 1)
                continue
            reason = None
            attempt = self.record.attempt(self.current)
            if outcome == "FAILED" and attempt is not None:
                reason = attempt.message
            return self._finish(outcome, reason)

    def _sleep(self, seconds: float) -> str | None:
        """Sleep unless stopped or past the active deadline; returns the final state that cut it short."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.cancel.is_set() or stop_requested(self.record.run_id):
                return "STOPPED"
            if self._active_deadline_passed():
                return "DEADLINE_EXCEEDED"
            self.cancel.wait(min(POLL_S, max(0.0, deadline - time.monotonic())))
        return None

    def _active_deadline_passed(self) -> bool:
        limit = self.spec.active_deadline_seconds
        return limit is not None and time.time() - self.record.created_at > limit

    def _follow(self, attempt: int) -> str:
        """Poll the attempt until it ends, stopping it on a stop request or a deadline. Returns
        SUCCEEDED, FAILED, STOPPED or DEADLINE_EXCEEDED."""
        sid = submission_id(self.record.run_id, attempt)
        printed = [0]
        lock = threading.Lock()
        closed = [False]

        def write(chunk: str) -> None:
            with lock:
                if not closed[0]:
                    printed[0] += len(chunk)
                    self.reporter.log(chunk)

        tail = self.client.follow_logs(sid, write) if self.follow_logs else None
        ending: str | None = None  # our reason for stopping the attempt, if we stopped it
        stop_sent_at = 0.0
        last_ok = followed = time.monotonic()
        status = "PENDING"
        while True:
            if ending is None:
                ending = self._reason_to_stop(status)
                if ending is not None:
                    what = {"STOPPED": "stop requested", "DEADLINE_EXCEEDED": self.record.reason}.get(ending, ending)
                    self.reporter.info(f"stopping attempt {attempt} ({what})")
                    self.client.stop(sid)
                    stop_sent_at = time.monotonic()
                    audit.record("attempt.stop", "sent", run_id=self.record.run_id, submission_id=sid,
                                 reason=ending)
            try:
                details = self.client.details(sid)
                last_ok = time.monotonic()
            except ClusterLost:
                if time.monotonic() - last_ok > LOST_AFTER_S:
                    raise
                details = None
            if details is not None:
                update_attempt(self.record, attempt, details)
                status = details.status.value
                if self._attempt_span is not None:
                    self._attempt_span.phase(status)
                record = self.record.attempt(attempt)
                if status == "RUNNING" and record.running_at is None:
                    record.running_at = time.time()
                    self.record.state = "RUNNING"
                    self.record.save()
                    self.reporter.info(f"attempt {attempt}/{self.spec.max_attempts} RUNNING")
                if self._on_running and (status != "PENDING" or time.monotonic() - followed > EXPORTERS_AFTER_S):
                    self._on_running()
                    self._on_running = None
                if status in TERMINAL:
                    break
            if ending is not None and time.monotonic() - stop_sent_at > STOP_WAIT_S:
                break  # Ray did not confirm the stop in time; the run ends as we decided anyway
            if ending is None:
                self.cancel.wait(POLL_S)  # a stop wakes the loop at once
            else:
                time.sleep(POLL_S)  # cancel is already set: wait() would not wait
        if tail is not None:
            tail.join(timeout=1)  # Ray closes the stream a little after the end; the rest is caught up below
        with lock:
            closed[0] = True
        self._save_log(attempt, sid, printed[0])
        final = self.record.attempt(attempt)
        self.end_attempt_span(ending or status, final.message, final.driver_exit_code)
        self.reporter.info(f"attempt {attempt}/{self.spec.max_attempts} {final.status}"
                           + (f": {final.message}" if final.status == "FAILED" and final.message else ""))
        self.record.save()
        return ending or status

    def _reason_to_stop(self, status: str) -> str | None:
        if self.cancel.is_set() or stop_requested(self.record.run_id):
            return "STOPPED"
        if self._active_deadline_passed():
            self.record.reason = f"active_deadline_seconds ({self.spec.active_deadline_seconds}s) passed"
            return "DEADLINE_EXCEEDED"
        limit = self.spec.pre_running_deadline_seconds
        if limit is not None and status == "PENDING" and time.time() - self._attempt_started > limit:
            self.record.reason = f"pre_running_deadline_seconds ({limit}s) passed before the job was RUNNING"
            return "DEADLINE_EXCEEDED"
        return None

    def _save_log(self, attempt: int, sid: str, printed: int) -> None:
        """Keep the attempt's whole log with the run (the cluster may go away) and print what the
        stream did not."""
        try:
            text = self.client.logs(sid)
        except Exception as exc:  # noqa: BLE001 - the log is a courtesy; the run's result stands
            self.reporter.warn(f"could not fetch the log of attempt {attempt}: {exc}")
            return
        if self.follow_logs and len(text) > printed:
            self.reporter.log(text[printed:])
        path = self.record.attempt_log(attempt)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def _finish(self, state: str, reason: str | None) -> RunRecord:
        # A deadline's reason was set when it passed (which one, how long).
        return finish_run(self.record, state, self.record.reason if state == "DEADLINE_EXCEEDED" else reason)

    def finish_with(self, code: ExitCode, reason: str) -> RunRecord:
        """End the run for a reason outside the job (the cluster was lost)."""
        return finish_run(self.record, code.name, reason)


def finish_run(record: RunRecord, state: str, reason: str | None) -> RunRecord:
    """Give the run its final state and exit code, save it and audit it."""
    record.state = state
    record.reason = reason
    record.exit_code = int(FINAL_STATES[state])
    record.finished_at = time.time()
    record.save()
    audit.record("run.finish", state, run_id=record.run_id, attempts=len(record.attempts),
                 exit_code=record.exit_code, reason=reason, trace_id=record.trace_id)
    return record
