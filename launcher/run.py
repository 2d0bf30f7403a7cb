"""A run: one logical job across attempts, and the one engine that lives them on every backend. What
differs per backend is its Jobs (launcher/backends/base.py): how an attempt is submitted, what its
status is, where its log comes from, how it is stopped; Ray's Jobs API for local and existing clusters
(launcher/backends/rayjobs.py), a RayJob on KubeRay (launcher/backends/kuberay/follow.py). The stops,
deadlines, a lost API, healing, each attempt's bookkeeping and the run's end are the engine's alone.

Submission is idempotent by submission id, as KubeRay's submitter does it: attempt n of run R is
`R-a<n>`; before submitting, the run asks the cluster for that id and follows the job it finds
instead of submitting twice. A failed attempt is retried as a new attempt after a backoff (doubling,
capped) up to max_retries; a stop or a deadline ends the run without retry. Where the platform retries
itself (KubeRay: `retries_itself`), the engine follows its retries and takes its end, enforces none of
the deadlines (the platform does), and restarts an attempt only for a fault it stopped. Every attempt carries
the raypulse.* metadata that the exporter turns into job labels. Every change is an event of the
run's journal (launcher/journal.py), which keeps the record, the audit log, the trace and the
display in step.

With a health policy (launcher/healing.py) the run is watched while it runs: a hang, a GPU fault, a
lost node or a non-finite loss stops the attempt, and the next one starts on a healthy node from
the last checkpoint; every restart counts against max_retries, and a run that keeps failing the
same way stops (REPEATED_FAILURE) instead of spending its retries. The checks run on a thread of their
own: the follow loop only picks up a decided fault, so a slow check never delays the status poll.

With a recorder (launcher/recording.py), the run's record has each attempt's ends: a round as an
attempt starts, and one as it ends (or before it is stopped), while its exporters still serve it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from exporter.contract import wire
from launcher.backends.base import Jobs, RunEnds, Seen, Submission
from launcher.errors import BadInput, InfraError
from launcher.exitcodes import FINAL_STATES, ExitCode
from launcher.jobs import TERMINAL, ClusterLost
from launcher.journal import Journal
from launcher.ledger import ledger
from launcher.spec import JobSpec
from launcher.state import AttemptRecord, RunRecord, request_stop, stop_requested, write_private
from launcher.submission import attempt_id

if TYPE_CHECKING:
    from launcher.healing import Healing
    from launcher.health.faults import Fault

POLL_S = 0.25
LOST_AFTER_S = 30.0  # the Jobs API failing this long means the cluster is gone
STOP_WAIT_S = 20.0  # Ray sends SIGTERM, then SIGKILL after its own timeout
EXPORTERS_AFTER_S = 5.0  # an attempt still pending this long gets its on_running call anyway


class Rounds(Protocol):
    """What the run asks of its recording (launcher.recording.Recorder): a round when an attempt starts,
    and one when it ends, while its processes and exporters still serve its last values."""

    def record_soon(self) -> None:
        """A round now, on the recorder's own thread (returns at once)."""
        ...

    def record_once(self) -> None:
        """A round now, on the caller's thread (bounded by the recorder's read deadline)."""
        ...

    def mark(self, why: str) -> None:
        """Keep the record whole around now (an attempt started, ended or is being stopped)."""
        ...


def submission_id(run_id: str, attempt: int, first: str | None = None) -> str:
    """Attempt `attempt`'s Ray submission id (launcher/submission.py: `first` is the user's --submission-id)."""
    return attempt_id(run_id, attempt, first)


def entrypoint_options(spec: JobSpec) -> dict[str, Any]:
    """What the spec reserves for the entrypoint, as Ray's submit_job takes it (only what was set)."""
    options: dict[str, Any] = {"entrypoint_num_cpus": spec.entrypoint_num_cpus,
                               "entrypoint_num_gpus": spec.entrypoint_num_gpus,
                               "entrypoint_memory": spec.entrypoint_memory,
                               "entrypoint_resources": dict(spec.entrypoint_resources) or None}
    return {key: value for key, value in options.items() if value is not None}


def job_metadata(spec: JobSpec, attempt: int, trace_id: str | None = None) -> dict[str, str]:
    """The Ray job metadata shared with the exporter (it labels job series with these), and the run's
    trace id when it is traced (so the trace can be found from the job), beside the user's own
    (--metadata-json; the spec refuses raypulse.* keys there, so nothing of ours is overridden)."""
    metadata = {**spec.metadata,
        wire.META_JOB_NAME: spec.name,
        wire.META_RUN_ID: spec.run_id or "",
        wire.META_ATTEMPT: str(attempt),
        wire.META_MAX_ATTEMPTS: str(spec.max_attempts),
        wire.META_WORKSPACE: spec.workspace,
        wire.META_USER: spec.user,
    }
    metadata.update({wire.META_LABEL_PREFIX + key: value for key, value in spec.labels.items()})
    if trace_id:
        metadata[wire.META_TRACE_ID] = trace_id
    return metadata


def runtime_env(spec: JobSpec, attempt: int | None = None, trace_parent: str | None = None,
                extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ray's runtime_env of an attempt (with --framework-metrics, raypulse's worker setup hook). Its
    processes also get RAYPULSE_RUN_ID and RAYPULSE_ATTEMPT, so training code can tell a retry, `extra`
    (the checkpoint dir and where to resume from), and in a traced run TRACEPARENT (W3C), so the job's
    own spans can join the attempt's."""
    env: dict[str, Any] = {"working_dir": spec.working_dir} if spec.working_dir else {}
    env.update(spec.runtime_env.for_ray())
    if spec.framework_metrics:
        env["worker_process_setup_hook"] = wire.FRAMEWORK_SETUP_HOOK
    env_vars = dict(spec.runtime_env.env_vars)
    if attempt is not None:
        env_vars.update({wire.ENV_RUN_ID: spec.run_id or "", wire.ENV_ATTEMPT: str(attempt)})
    env_vars.update(extra or {})
    if trace_parent:
        env_vars["TRACEPARENT"] = trace_parent
    if env_vars:
        env["env_vars"] = env_vars
    return env


def attempt_identity(ray_token: str | None, sid: str) -> dict[str, str]:
    """Every process of the attempt knows its submission id and, where Ray tokens are on, the token the
    progress endpoint wants for it (a process of another job cannot report as this one)."""
    env = {wire.ENV_SUBMISSION_ID: sid}
    if ray_token:
        env[wire.ENV_PROGRESS_TOKEN] = wire.progress_token(ray_token, "submission", sid)
    return env


def backoff_seconds(spec: JobSpec, failures_in_a_row: int) -> float:
    return min(spec.retry_backoff_seconds * 2 ** (failures_in_a_row - 1), spec.retry_backoff_max_seconds)


def retry_delay(spec: JobSpec, failures_in_a_row: int, node_taken_out: bool) -> float:
    """The wait before the next attempt. After a fault whose node was taken out (replaced or drained)
    the cause is gone: the first such restart in a row starts at once, since a wait would only add to
    the training time lost (a second one with no progress in between backs off like any failure)."""
    if node_taken_out and failures_in_a_row == 1:
        return 0.0
    return backoff_seconds(spec, failures_in_a_row)


def failures_in_a_row(before: int, ended: AttemptRecord | None) -> int:
    """Attempts ended in a row without progress, counting the one that just ended. One that made
    progress (a step past the checkpoint it resumed from) starts the count again, so a week-long run
    healed of a fault now and then waits the first backoff each time, not the longest (as Kubernetes
    resets CrashLoopBackOff after a container ran well); a job that reports no progress keeps doubling."""
    made_progress = ended is not None and ended.last_step is not None and \
        ended.last_step > (ended.resumed_from_step if ended.resumed_from_step is not None else -1)
    return 1 if made_progress else before + 1


def failures_so_far(record: RunRecord) -> int:
    """failures_in_a_row over the run's attempts that have ended, in order."""
    streak = 0
    for ended in sorted(record.attempts, key=lambda item: item.attempt):
        if ended.ended_at is not None:
            streak = failures_in_a_row(streak, ended)
    return streak


def preemptions(record: RunRecord) -> int:
    """Attempts the platform's queue took back (Kueue's preemption): they do not count against max_retries."""
    return sum(1 for event in record.events if event.kind == "attempt.preempted")


def update_attempt(record: RunRecord, attempt: int, seen: Seen) -> AttemptRecord:
    """Copy what the backend says of an attempt into the run record."""
    item = record.attempt(attempt)
    if item is None:
        sid = seen.submission_id or submission_id(record.run_id, attempt)
        item = AttemptRecord(attempt=attempt, submission_id=sid)
        record.attempts.append(item)
        record.attempts.sort(key=lambda entry: entry.attempt)
    item.status = seen.status
    # Ray appends the log's tail to a failure message; the log is kept whole beside the run.
    item.message = (seen.message or "").split("\n", 1)[0].split(", last available logs", 1)[0].rstrip(":, ") or None
    item.error_type = seen.error_type
    item.driver_exit_code = seen.driver_exit_code
    if seen.start_time and item.submitted_at is None:
        item.submitted_at = seen.start_time
    if seen.end_time:
        item.ended_at = seen.end_time
    return item


def seen_of(details: Any) -> Seen:
    """Ray's JobDetails as the engine reads an attempt."""
    return Seen(submission_id=details.submission_id, status=details.status.value, message=details.message,
                error_type=details.error_type, driver_exit_code=getattr(details, "driver_exit_code", None),
                start_time=details.start_time / 1000 if details.start_time else None,
                end_time=details.end_time / 1000 if details.end_time else None, job=job_view(details))


def finish_run(journal: Journal, state: str, reason: str | None, **details: Any) -> RunRecord:
    """Give the run its final state and exit code (one event: the record, the audit line, the trace)."""
    record = journal.record
    assert record is not None, "only the process that owns a run's record finishes it"
    split = ledger(record, time.time(), ending=state)  # where its time went, kept with its end
    journal.emit("run.finished", state=state, reason=reason, attempts=len(record.attempts),
                 exit_code=int(FINAL_STATES[state]),
                 seconds_by_cause={cause: round(seconds, 3) for cause, seconds in split.seconds.items() if seconds},
                 **details)
    return record


def job_view(details: Any) -> dict[str, Any]:
    """What the stacks need of Ray's JobDetails: the Ray job id and the driver."""
    driver = getattr(details, "driver_info", None)
    return {"job_id": getattr(details, "job_id", None),
            "driver": {"pid": getattr(driver, "pid", None), "node_ip_address": getattr(driver, "node_ip_address", None)}
            if driver is not None else None}


class _LogTail:
    """The attempt's log streamed to the display while it runs; counts what it printed, so the
    rest is printed once from the saved log at the end."""

    def __init__(self, jobs: Jobs, attempt: int, sid: str | None, show: Callable[[str], None]) -> None:
        self.printed = 0
        self._show = show
        self._lock = threading.Lock()
        self._closed = False
        self._thread = jobs.follow_logs(attempt, sid, self._write)

    def _write(self, chunk: str) -> None:
        with self._lock:
            if not self._closed:
                self.printed += len(chunk)
                self._show(chunk)

    def close(self, catch_up: float = 0.0) -> int:
        """Stop printing; returns how much was printed. The stream closes up to a second after the job's end
        (Ray's tail looks for it once a second): what it has not printed yet comes from the saved log, unless
        there will be none (the cluster stopped answering), when it gets `catch_up` seconds to come."""
        self._thread.join(timeout=catch_up)
        with self._lock:
            self._closed = True
        return self.printed


class Run:
    """The attempt engine: drives a run's attempts on any backend (its Jobs say how a job is submitted,
    read, streamed and stopped there). `start()` submits (or finds) the current attempt, `wait()` follows
    it to the end, retrying (or following the platform's retries, where it retries itself); `stop()` may
    be called from any thread."""

    def __init__(self, spec: JobSpec, jobs: Jobs, journal: Journal, cancel: threading.Event,
                 follow_logs: bool = True, on_running: Callable[[], None] | None = None,
                 healing: Healing | None = None, recorder: Rounds | None = None) -> None:
        assert journal.record is not None
        self.spec = spec
        self.jobs = jobs
        self._unanswered = False  # stopping, the cluster stopped answering: nothing more is asked of it
        self.journal = journal
        self.record: RunRecord = journal.record
        self.reporter = journal.reporter
        self.cancel = cancel
        self.follow_logs = follow_logs
        # Called once, when the first attempt runs (or has waited EXPORTERS_AFTER_S, or ended):
        # the local backend starts its exporters then, off the path to a running job.
        self._on_running = on_running
        self.healing = healing
        self.recorder = recorder  # the run's recording: a round as each attempt starts and ends
        self.current = 0
        self._attempt_started = self.record.created_at
        self._failures_in_a_row = 0  # the backoff doubles with these (failures_in_a_row)
        self._watched = 0  # the attempt the health watcher follows

    # --- submission ----------------------------------------------------------------------------

    def submission_id(self, attempt: int) -> str | None:
        """The id one of this run's attempts has where it runs (None: its platform has not named it yet)."""
        item = self.record.attempt(attempt)
        if item is not None:
            return item.submission_id
        return submission_id(self.record.run_id, attempt, self.spec.submission_id) if self.jobs.names_attempts \
            else None

    def start(self) -> None:
        """Status first, then submit: find the attempts this run already has on the cluster and
        follow the latest, or submit attempt 1. A run re-submitted after it ended is followed to
        its end again (with more attempts if max_retries now allows them). Where the platform retries
        itself, the run was handed to it: its latest attempt is followed (the next, once that ended)."""
        self.record.exit_code = self.record.finished_at = self.record.reason = None
        if self.jobs.retries_itself:
            latest = self.record.attempts[-1] if self.record.attempts else None
            self.current = 1 if latest is None else latest.attempt + (latest.ended_at is not None)
            self._failures_in_a_row = failures_so_far(self.record)
            return
        latest = None
        for attempt in range(1, self.spec.max_attempts + 1):
            seen = self.jobs.status(attempt, self.submission_id(attempt))
            if seen is None:
                break
            latest = (attempt, seen)
            update_attempt(self.record, attempt, seen)
        if latest is None:
            self._submit(1)
            return
        attempt, seen = latest
        self.current = attempt
        # A take-over keeps the streak of attempts that ended without progress (the next backoff's length).
        self._failures_in_a_row = failures_so_far(self.record)
        status = seen.status
        self.journal.emit("attempt.found", attempt=attempt, submission_id=self.submission_id(attempt), status=status)
        if status not in TERMINAL:
            self._take_over(attempt, status)
            return
        retry_at = self._retry_decided(attempt)
        retry = attempt < self.spec.max_attempts and (status == "FAILED" or retry_at is not None)
        # The launcher that supervised the run may have left (killed) after this attempt ended: the retry
        # it decided goes ahead, after what was left of its backoff.
        if retry and retry_at is not None and retry_at > time.time():
            self.reporter.info(f"attempt {attempt + 1} in {retry_at - time.time():.0f}s (the rest of the backoff "
                               "before the retry the run's earlier launcher scheduled)")
        if retry and (retry_at is None or not self._sleep(retry_at - time.time())):
            self._submit(attempt + 1)

    def _retry_decided(self, attempt: int) -> float | None:
        """When the next attempt was due, if the journal says a launcher decided to retry after
        `attempt` (a retry scheduled, or a fault it stopped the attempt to restart from) and the run
        has not finished since; None otherwise."""
        due = None
        for event in self.record.events:
            if event.kind == "run.finished":
                due = None
            elif event.attempt == attempt and event.kind == "retry.scheduled":
                due = event.time + float(event.details.get("delay") or 0)
            elif event.attempt == attempt and event.kind == "health.fault" and event.details.get("action") == "restart":
                due = event.time
        return due

    def _take_over(self, attempt: int, status: str) -> None:
        """Follow an attempt that runs already (its launcher left): watched from now on as if it had just started."""
        self._watch_health(attempt)
        if self.healing is not None and status == "RUNNING":
            self.healing.running(time.time())

    def _watch_health(self, attempt: int) -> None:
        """The health watcher follows this attempt from now on (once per attempt)."""
        sid = self.submission_id(attempt)
        if self.healing is not None and self._watched != attempt and sid is not None:
            self._watched = attempt
            self.healing.watch(attempt, sid)

    def _submit(self, attempt: int) -> None:
        sid = self.submission_id(attempt)
        self.current = attempt
        self._attempt_started = time.time() if attempt > 1 else self.record.created_at
        if sid is not None:
            self.journal.emit("attempt.submitting", attempt=attempt, submission_id=sid)
        if sid is None or self.jobs.status(attempt, sid) is None:  # status first, also for retries
            extra = {**(attempt_identity(self.jobs.token, sid) if sid is not None else {}),
                     **(self.healing.attempt_env(attempt) if self.healing is not None else {})}
            try:
                self.jobs.submit(sid, Submission(attempt, extra, self.journal.traceparent(),
                                                 self.journal.run_trace.trace_id))
            except (BadInput, InfraError) as exc:
                if sid is not None:  # the backend's own error, as it said it (the cause), in the journal
                    self.journal.emit("attempt.submit_failed", attempt=attempt, submission_id=sid,
                                      error=str(exc.__cause__ or exc))
                raise
        if sid is not None:
            self._submitted(attempt, sid)

    def _submitted(self, attempt: int, sid: str) -> None:
        self.journal.emit("attempt.submitted", attempt=attempt, submission_id=sid, address=self.jobs.address,
                          entrypoint=self.spec.entrypoint)
        self._watch_health(attempt)

    # --- following -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the run to stop: the current attempt is stopped and nothing is retried."""
        request_stop(self.record.run_id)
        self.cancel.set()

    def wait(self) -> RunRecord:
        """Follow attempts until the run is final; returns the final record (exit_code set)."""
        try:
            return self._wait()
        except RunEnds as end:
            return self._finish(end.state, end.reason)

    def _wait(self) -> RunRecord:
        while True:
            outcome, seen = self._follow(self.current)
            if seen is not None and seen.run_end is not None and outcome != "UNHEALTHY":
                return self._finish(*seen.run_end)  # the platform ended the run
            attempt = self.record.attempt(self.current)
            if seen is not None and seen.preempted and outcome != "UNHEALTHY":
                # The queue took it back and runs the RayJob again once admitted: no failure, no backoff.
                self.journal.emit("attempt.preempted", attempt=self.current, message=seen.message)
                self.current += 1
                continue
            if self.jobs.retries_itself and outcome == "FAILED":
                # The platform retries it: its next attempt is followed as it comes (nothing submitted).
                self._failures_in_a_row = failures_in_a_row(self._failures_in_a_row, attempt)
                if seen is not None and seen.retried:
                    self.journal.emit("retry.scheduled", attempt=self.current, delay=0, cause="failed")
                self.current += 1
                continue
            retries_left = self.current < self.spec.max_attempts + preemptions(self.record)
            fault = self._fault_of(outcome, retries_left)
            node_out = False
            if fault is not None:
                final = self._heal(fault, retries_left)
                if final is not None:
                    return final
                node_out = self._keep_out(fault)
            elif outcome == "FAILED" and retries_left:
                repeated = self.healing.repeated(None, attempt) if self.healing is not None else None
                if repeated:
                    return self._finish("REPEATED_FAILURE", f"{repeated}: retrying would not help")
            else:
                reason = attempt.message if outcome == "FAILED" and attempt is not None else None
                return self._finish(outcome, reason)
            self._failures_in_a_row = failures_in_a_row(self._failures_in_a_row, attempt)
            delay = retry_delay(self.spec, self._failures_in_a_row, node_out)
            self.journal.emit("retry.scheduled", attempt=self.current, delay=delay,
                              cause=fault.kind.value if fault is not None else "failed")
            interrupted = self._sleep(delay)
            if interrupted:
                return self._finish(interrupted, "stopped during the backoff before a retry")
            self._submit(self.current + 1)

    def _fault_of(self, outcome: str, retries_left: bool) -> Fault | None:
        """The fault behind an attempt's end: the one the watcher stopped it for, or a lost node or a
        faulty GPU under an attempt that failed on its own (worth healing only if a retry follows)."""
        if self.healing is None:
            return None
        if outcome == "UNHEALTHY":
            return self.healing.stopped_by
        if outcome == "FAILED" and retries_left:
            return self.healing.fault_after_failure()
        return None

    def _heal(self, fault: Fault, retries_left: bool) -> RunRecord | None:
        """Act on a fault between attempts; the final record when the run ends here, None to retry."""
        assert self.healing is not None
        self.healing.last_look()
        ending = self.healing.end_instead(fault, retries_left, self.spec.max_retries)
        return self._finish(*ending) if ending is not None else None

    def _keep_out(self, fault: Fault) -> bool:
        """The fault's node kept out of the next attempt by the backend's remedy; True if it was."""
        assert self.healing is not None
        if fault.node_out and fault.node is not None and self.healing.remedy is None:
            self.journal.emit("node.left", node=fault.node, reason=fault.summary,
                              why=self.healing.no_remedy or "the backend has no node remedy")
            return False
        return self.healing.remedy_node(fault)

    def _sleep(self, seconds: float) -> str | None:
        """Sleep unless stopped or past the active deadline; returns the final state that cut it short."""
        deadline = time.monotonic() + seconds
        while True:
            reason = self._reason_to_stop(None)
            if reason is not None:
                return reason
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.cancel.wait(min(POLL_S, left))

    def _follow(self, attempt: int) -> tuple[str, Seen | None]:
        """Follow the attempt to its end, stopping it on a stop request, a deadline or a fault. Returns
        SUCCEEDED, FAILED, STOPPED, DEADLINE_EXCEEDED or UNHEALTHY, and the backend's last view of it."""
        tail = _LogTail(self.jobs, attempt, self.submission_id(attempt), self.reporter.log) \
            if self.follow_logs else None
        try:
            ending, seen = self._watch(attempt)
        finally:
            if self.healing is not None:
                self.healing.pause()  # the attempt is no longer followed: no checks of it
        sid = self.submission_id(attempt)
        if sid is None or self.record.attempt(attempt) is None:  # it never started: nothing of it to keep
            if tail is not None:
                tail.close()
            return ending or (seen.status if seen is not None else "STOPPED"), seen
        # The attempt's last values, before a node is replaced or the cluster goes.
        self._record(True, f"attempt {attempt} ended")
        printed = tail.close(catch_up=1.0 if self._unanswered else 0.0) if tail is not None else 0
        if self._unanswered:  # its log would wait on a cluster that stopped answering, past a pod's grace period
            self.reporter.warn(f"the cluster did not answer: the log of attempt {attempt} was not fetched "
                               f"(`launcher logs {self.record.run_id} --attempt {attempt}` once it answers)")
        else:
            self._save_log(attempt, sid, printed)
        final = self.record.attempt(attempt)
        assert final is not None
        status = seen.status if seen is not None else final.status
        self.journal.emit("attempt.finished", attempt=attempt, submission_id=sid, status=final.status,
                          state=ending or status, message=final.message, error_type=final.error_type,
                          driver_exit_code=final.driver_exit_code)
        return ending or status, seen

    def _watch(self, attempt: int) -> tuple[str | None, Seen | None]:
        """Poll the attempt until its backend says it ended, or until it was stopped and the backend
        confirmed (or STOP_WAIT_S passed). Returns (our reason for stopping it, if any; the last view)."""
        ending: str | None = None
        stop_sent_at = 0.0
        last_ok = followed = time.monotonic()
        seen: Seen | None = None
        while True:
            if ending is None:
                ending = self._reason_to_stop(seen.status if seen is not None else "PENDING")
                if ending is not None:
                    # While the job's processes still run (not delaying the stop).
                    self._record(False, f"attempt {attempt} stopping")
                    self._stop_attempt(attempt, ending)
                    stop_sent_at = time.monotonic()
            try:
                now_seen = self.jobs.status(attempt, self.submission_id(attempt))
                last_ok = time.monotonic()
            except ClusterLost:
                if ending in ("STOPPED", "DEADLINE_EXCEEDED") and stop_sent_at:
                    # The run ends (a restart waits: its next attempt must not meet this one), the stop is
                    # sent, and the cluster does not answer: a confirmation may never come.
                    self._unanswered = True
                    return ending, seen
                if time.monotonic() - last_ok > LOST_AFTER_S:
                    raise
                now_seen = None
            if now_seen is not None:
                seen = now_seen
                status = self._observe(attempt, seen, time.monotonic() - followed)
                if status in TERMINAL or seen.run_end is not None:
                    return ending, seen
                if ending is None and self.healing is not None and status == "RUNNING":
                    fault = self.healing.poll(seen.job)  # the checks run beside; never waits for one
                    if fault is not None:
                        ending = "UNHEALTHY"
                        # The faulty attempt as it stood: not delaying the stop, unless the stop deletes its
                        # pods (KubeRay's restart): then its last values are read first.
                        self._record(self.jobs.restart_removes_pods, f"attempt {attempt} faulty")
                        self._stop_attempt(attempt, ending)
                        stop_sent_at = time.monotonic()
                        continue  # a backend that stops to restart knows at once: no wait for a poll
            if ending is not None and time.monotonic() - stop_sent_at > STOP_WAIT_S:
                return ending, seen  # the stop was not confirmed in time; the run ends as we decided anyway
            if ending is None:
                self.cancel.wait(POLL_S)  # a stop wakes the loop at once
            else:
                time.sleep(POLL_S)  # cancel is already set: wait() would not wait

    def _observe(self, attempt: int, seen: Seen, followed_for: float) -> str:
        """Take in what the backend says of the attempt; returns its status."""
        if seen.submission_id is not None and self.record.attempt(attempt) is None and not self.jobs.names_attempts:
            self._submitted(attempt, seen.submission_id)  # the platform started (named) it
        if seen.submission_id is None:
            return seen.status
        if not self.jobs.names_attempts:
            self._watch_health(attempt)  # a platform's attempt is watched from when it is seen (submit or find)
        record = update_attempt(self.record, attempt, seen)
        status = seen.status
        started = status == "RUNNING" and record.running_at is None
        if started:
            self.journal.emit("attempt.running", attempt=attempt, submission_id=record.submission_id)
            if self.healing is not None:
                self.healing.running(time.time())
        if self._on_running and (status != "PENDING" or followed_for > EXPORTERS_AFTER_S):
            self._on_running()
            self._on_running = None
        if started:
            # The attempt's start in the run's record (after its exporters start).
            self._record(False, f"attempt {attempt} started")
        return status

    def _record(self, now: bool, why: str) -> None:
        """A round of the run's recording: on this thread (`now`), or soon on the recorder's own; the record
        is kept whole around it (`why`: the attempt's event)."""
        if self.recorder is None:
            return
        try:
            self.recorder.mark(why)
            if now:
                self.recorder.record_once()
            else:
                self.recorder.record_soon()
        except Exception as exc:  # noqa: BLE001 - the record is a courtesy; it never ends the run
            self.reporter.warn(f"a recording round failed: {type(exc).__name__}: {exc}")

    def _stop_attempt(self, attempt: int, ending: str) -> None:
        restart = ending == "UNHEALTHY"
        fault = self.healing.stopped_by.summary if self.healing and self.healing.stopped_by else None
        why = {"STOPPED": "stop requested", "DEADLINE_EXCEEDED": self.record.reason, "UNHEALTHY": fault,
               }.get(ending) or ending
        how = self.jobs.stopping(restart)
        if how:
            why = f"{fault}; {how}" if restart and fault else how if ending == "STOPPED" else f"{why}; {how}"
        sid = self.submission_id(attempt)
        self.journal.emit("attempt.stopping", attempt=attempt, submission_id=sid or self.record.run_id,
                          reason=ending, why=why)
        self.jobs.stop(attempt, sid, restart, fault if restart else None)

    def _reason_to_stop(self, status: str | None) -> str | None:
        """Why the run must stop now (None: it need not). `status` is the current attempt's, None
        between attempts. Deadlines are the platform's where it retries itself."""
        if self.cancel.is_set() or stop_requested(self.record.run_id):
            return "STOPPED"
        if self.jobs.retries_itself:
            return None
        limit = self.spec.active_deadline_seconds
        if limit is not None and time.time() - self.record.created_at > limit:
            self.journal.emit("run.deadline", deadline="active_deadline_seconds",
                              why=f"active_deadline_seconds ({limit}s) passed")
            return "DEADLINE_EXCEEDED"
        limit = self.spec.pre_running_deadline_seconds
        if limit is not None and status == "PENDING" and time.time() - self._attempt_started > limit:
            self.journal.emit("run.deadline", deadline="pre_running_deadline_seconds", attempt=self.current,
                              why=f"pre_running_deadline_seconds ({limit}s) passed before the job was RUNNING")
            return "DEADLINE_EXCEEDED"
        return None

    def _save_log(self, attempt: int, sid: str, printed: int) -> None:
        """Keep the attempt's whole log with the run (the cluster may go away) and print what the
        stream did not."""
        try:
            text = self.jobs.logs(attempt, sid)
        except Exception as exc:  # noqa: BLE001 - the log is a courtesy; the run's result stands
            self.reporter.warn(f"could not fetch the log of attempt {attempt}: {exc}")
            return
        if self.follow_logs and len(text) > printed:
            self.reporter.log(text[printed:])
        write_private(self.record.attempt_log(attempt), text)  # 0600: a job's log may print its secrets

    def _finish(self, state: str, reason: str | None) -> RunRecord:
        # A deadline's reason was set when it passed (which one, how long).
        ratio = self.healing.effective_training_ratio() if self.healing is not None else None
        if self.healing is not None:
            self.healing.close()
        if state == "DEADLINE_EXCEEDED" and not self.jobs.retries_itself:
            reason = self.record.reason
        return finish_run(self.journal, state, reason, effective_training_ratio=ratio)

    def finish_with(self, code: ExitCode, reason: str) -> RunRecord:
        """End the run for a reason outside the job (the cluster was lost)."""
        return finish_run(self.journal, code.name, reason)
