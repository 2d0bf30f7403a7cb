"""What a run does about its health: the watcher's findings become journal events, a fault the policy
acts on stops the attempt (with every process's stack first, for a hang), a faulty node is taken out
of the next attempt, and the next attempt resumes from the last checkpoint.

No restart loops: every restart counts against max_retries; a node that faults twice is taken out
for good; a run whose attempts keep failing the same way stops with its own exit code and says why.

The checks run beside the run's follow loop, on a thread of their own (`poll` starts it): the loop
polls the job's status every quarter second whatever a check costs, and only picks up the fault a
check decided. A check that takes longer than its interval is a `health.check_slow` event, never a
lost cluster. `check()` itself is the same check on the caller's thread (tests, one-off looks).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.contract import wire
from launcher import checkpoint_advice
from launcher.health import stacks
from launcher.health.exporters import NodeRead, TargetSource
from launcher.health.faults import Attempt, Fault, Progress, progress
from launcher.health.fleet import FleetReader
from launcher.health.policy import FaultClass, HealthPolicy
from launcher.health.promql import PromqlReader
from launcher.health.remedy import NodeRemedy
from launcher.health.threshold import Threshold
from launcher.health.watcher import Check, Watcher
from launcher.journal import Journal
from launcher.ledger import Ledger, ledger, steps_lost
from launcher.raydash import RayDashboard
from launcher.state import AttemptRecord, RunRecord, list_runs

LOST_NODE_GRACE_S = 5.0  # after a failed attempt, how long a node's death may take to show
PUBLISH_TIMEOUT_S = 1.0
CHECK_TICK_S = 0.1  # how often the checks' thread looks whether one is due
NAMED = 5  # nodes an event about many names


@dataclass
class Pending:
    """A fault that stopped an attempt, until the next attempt makes its first step."""

    fault: Fault
    decided_at: float
    made: int | None = None  # the newest step the ranks reported, read once more after the attempt ended
    attempt: int | None = None  # the attempt it ended, and its submission (the last look sets them)
    submission_id: str | None = None

    @property
    def last_step(self) -> int | None:
        """The last step made before the attempt ended: the redone steps count from it."""
        return self.made if self.made is not None else self.fault.last_step


class Healing:
    def __init__(self, policy: HealthPolicy, journal: Journal, targets: TargetSource,
                 remedy: NodeRemedy | None = None, dashboard: RayDashboard | None = None,
                 progress_url: str | None = None, local_processes: bool = False, blind_hint: str | None = None,
                 no_remedy: str | None = None, fleet: FleetReader | None = None,
                 promql: PromqlReader | None = None) -> None:
        self.policy = policy
        self.journal = journal
        self.record: RunRecord = journal.record  # type: ignore[assignment]
        self.remedy = remedy
        self.dashboard = dashboard
        self.progress_url = progress_url  # the head exporter's progress endpoint: the run's health metrics go there
        self.local_processes = local_processes  # the job's processes run on this machine (a local cluster)
        self.blind_hint = blind_hint  # where to look when no exporter is found (the backend knows)
        self.no_remedy = no_remedy  # why a faulty node is left as it is, without a remedy (the backend knows)
        self.watcher = Watcher(policy, targets, dead_nodes=remedy.dead_nodes if remedy else list, fleet=fleet,
                               promql=promql)
        self.stopped_by: Fault | None = None  # the fault that stopped the current attempt
        self.pending: Pending | None = None
        self._resume_step: int | None = None  # what the attempt being submitted resumes from
        self._blind_said = False
        self._check_failed: str | None = None  # the last failed check's error, said once
        # Beside the follow loop: one check at a time (the loop's thread, or fault_after_failure's caller)
        self._checking = threading.Lock()
        self._job: dict[str, Any] | None = None  # Ray's latest view of the job, as the follow loop saw it
        self._active = False  # the attempt runs: checks are due (the follow loop says so at every poll)
        self._decided: Fault | None = None  # a fault the checks decided to act on, until the loop takes it
        self._handover = threading.Lock()  # _decided, between the checks' thread and the loop's
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._slow_said = False
        self._fallback_said = False  # the watcher reads another source than the Prometheus asked for, said once
        self._thresholds_said: dict[str | None, Threshold] = {}  # by phase (None: between reports)
        self._past: checkpoint_advice.FaultRate | None = None  # the other runs' faults under $RAYPULSE_HOME, read once

    # --- an attempt's life ---------------------------------------------------------------------------

    def attempt_env(self, attempt: int) -> dict[str, str]:
        """RAYPULSE_CHECKPOINT_DIR for every attempt, RAYPULSE_RESUME_FROM for one after another."""
        env: dict[str, str] = {}
        if self.record.checkpoint_dir:
            env[wire.ENV_CHECKPOINT_DIR] = self.record.checkpoint_dir
        if attempt > 1:
            resume = self.resume_point()
            if resume:
                env[wire.ENV_RESUME_FROM] = json.dumps(resume)
                self._resume_step = resume.get("step")
                self.journal.emit("run.resume", attempt=attempt, step=self._resume_step, path=resume.get("path"))
        return env

    def resume_point(self) -> dict[str, Any] | None:
        """The latest checkpoint: the marker the progress client writes in the checkpoint dir, else the
        newest checkpoint step the exporters saw."""
        directory = self.record.checkpoint_dir
        if directory and "://" not in directory:
            try:
                marker = json.loads((Path(directory) / wire.CHECKPOINT_MARKER).read_text())
                if isinstance(marker, dict) and (marker.get("step") is not None or marker.get("path")):
                    return {key: marker.get(key) for key in ("step", "path")}
            except (OSError, ValueError):
                pass
        seen = self.watcher.last.progress if self.watcher.last is not None else None
        if seen is not None and seen.checkpoint_step is not None:
            return {"step": seen.checkpoint_step, "path": None}
        return None

    def watch(self, attempt: int, submission_id: str) -> None:
        if self.remedy is not None:
            self.remedy.before_attempt(self.record)
        # After a check in flight, under its lock: that check's fault (and progress) is the attempt it read,
        # published and journalled as that attempt's; the new attempt starts with nothing decided.
        with self._checking:
            self.stopped_by = None
            with self._handover:
                self._decided = None
            item = self.record.attempt(attempt)
            if item is not None and self._resume_step is not None:
                item.resumed_from_step, self._resume_step = self._resume_step, None
            # An attempt taken over from a launcher that was killed began before this process did: its steps
            # since it was submitted are its own (a hang that began before the take-over is still a hang).
            now = time.time()
            started = min(item.submitted_at or now, now) if item is not None else now
            self.watcher.watch(Attempt(attempt, submission_id, started_at=started))
            if item is not None and item.running_at is not None:
                self.watcher.running(item.running_at)

    def running(self, at: float) -> None:
        self.watcher.running(at)

    def check(self, job: dict[str, Any] | None = None) -> Fault | None:
        """A check when due: its news as events; the fault the policy acts on (restart or stop), if any.
        `job` is Ray's view of the job (job_id, driver_info) for taking stacks. Never raises: a check
        that fails is a `health.check_failed` event (once per distinct error) and the next one runs."""
        if not self.policy.enabled or not self.watcher.due():
            return None
        with self._checking:
            return self._checked(job)

    def _checked(self, job: dict[str, Any] | None) -> Fault | None:
        """check(), its lock held."""
        try:
            fault = self._check(job)
        except Exception as exc:  # noqa: BLE001 - the watcher must never take the run down with it
            error = f"{type(exc).__name__}: {exc}"
            if error != self._check_failed:
                self._say_check_failed(error)
            self._check_failed = error
            return None
        self._check_failed = None
        return fault

    # --- beside the follow loop --------------------------------------------------------------------------

    def poll(self, job: dict[str, Any] | None = None) -> Fault | None:
        """For the run's follow loop, while the attempt runs: Ray's latest view of the job (for stacks),
        the checks started beside the loop if they are not yet; the fault a check decided, once. Never
        waits for a check."""
        if not self.policy.enabled:
            return None
        self._job, self._active = job, True
        if self._thread is None:
            self._thread = threading.Thread(target=self._beside, name="health-checks", daemon=True)
            self._thread.start()
        with self._handover:
            fault, self._decided = self._decided, None
        return fault

    def pause(self) -> None:
        """The attempt stopped running (or the loop stopped following it): no more checks until a poll."""
        self._active = False

    def close(self, timeout: float = 5.0) -> None:
        """No more checks (the run ended); waits a little for a check in flight."""
        self._active = False
        self._closing.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _beside(self) -> None:
        while not self._closing.is_set():
            if self._active and self._decided is None and self.stopped_by is None and self.watcher.due():
                began = time.monotonic()
                # The check and the hand-over of its fault under one lock: an attempt change (watch) waits
                # for both, so a fault of attempt N is never left for the loop to act on against N+1.
                with self._checking:
                    fault = self._checked(self._job) if self._active and self.watcher.due() else None
                    if fault is not None:
                        with self._handover:
                            self._decided, self._active = fault, False
                self._note_duration(time.monotonic() - began)
            self._closing.wait(CHECK_TICK_S)

    def _note_duration(self, seconds: float) -> None:
        """A check longer than its interval is said (once, until one fits again): the watcher sees the
        cluster later than the policy asks, and the next check starts right after it."""
        interval = self.policy.check_interval_seconds
        if seconds <= interval:
            self._slow_said = False
            return
        if not self._slow_said:
            self._slow_said = True
            last = self.watcher.last
            attempt = self.watcher.attempt.number if self.watcher.attempt else None
            with contextlib.suppress(Exception):  # a journal that cannot take it must not end the checks
                self.journal.emit("health.check_slow", attempt=attempt, seconds=round(seconds, 2),
                                  interval=interval, exporters=len(last.reads) if last else None)

    def _note_source(self, attempt: int, source: str) -> None:
        """With health.source: prometheus, a check that could not read it (and read what was there) is said once."""
        promql = self.watcher.promql
        if promql is None:
            return
        fell_back = source != "prometheus"
        if fell_back and not self._fallback_said:
            self.journal.emit("health.source_fallback", attempt=attempt, source=source, why=promql.why_not)
        self._fallback_said = fell_back

    def _say_check_failed(self, error: str) -> None:
        attempt = self.watcher.attempt.number if self.watcher.attempt else None
        with contextlib.suppress(Exception):  # a journal that cannot take it either must not end the run
            self.journal.emit("health.check_failed", attempt=attempt, error=error)

    def _check(self, job: dict[str, Any] | None) -> Fault | None:
        result = self.watcher.check()
        attempt = self.watcher.attempt
        assert attempt is not None
        self._note_source(attempt.number, result.source)
        if not result.reads and not self._blind_said:
            self._blind_said = True
            self.journal.emit("health.blind", attempt=attempt.number, hint=self.blind_hint)
        # One event per check for all the nodes it concerns: at 10,000 nodes a bad minute is one line.
        if result.unreachable:
            (node, error), *_ = result.unreachable
            self.journal.emit("health.exporter_unreachable", attempt=attempt.number, node=node, error=error,
                              count=len(result.unreachable), nodes=[name for name, _ in result.unreachable[:NAMED]])
        if result.back:
            self.journal.emit("health.exporter_back", attempt=attempt.number, node=result.back[0],
                              count=len(result.back), nodes=result.back[:NAMED])
        self._keep_books(attempt.number, result)
        for fault in result.faults:
            action = self.policy.action(fault.kind)
            self.journal.emit("health.fault", attempt=attempt.number, fault=fault.kind.value, summary=fault.summary,
                              action=action, node=fault.node, at=round(fault.at, 3), last_step=fault.last_step,
                              evidence=dict(fault.evidence))
            if action == "report":
                continue
            if fault.kind == FaultClass.HANG and self.policy.stacks:
                self._take_stacks(attempt.number, job)
            self.stopped_by = fault
            self.pending = Pending(fault, time.time())
            return fault
        return None

    def fault_after_failure(self) -> Fault | None:
        """An attempt failed on its own: was a node lost (or a GPU faulty) under it? Checked at once,
        then for a few seconds, since a node's death shows a little after the job's failure."""
        if not self.policy.enabled:
            return None
        deadline = time.monotonic() + (LOST_NODE_GRACE_S if self.remedy is not None else 0)
        while True:
            try:
                with self._checking:  # after a check in flight beside the loop, if one is
                    result = self.watcher.check()
            except Exception as exc:  # noqa: BLE001 - as in check(): the run goes on without this look
                self._say_check_failed(f"{type(exc).__name__}: {exc}")
                return None
            for fault in result.faults:
                if fault.node_out and self.policy.action(fault.kind) != "report":
                    attempt = self.watcher.attempt.number if self.watcher.attempt else None
                    self.journal.emit("health.fault", attempt=attempt, fault=fault.kind.value,
                                      summary=fault.summary, action=self.policy.action(fault.kind), node=fault.node,
                                      at=round(fault.at, 3), last_step=fault.last_step, evidence=dict(fault.evidence))
                    self.pending = Pending(fault, time.time())
                    return fault
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.5)

    def _take_stacks(self, attempt: int, job: dict[str, Any] | None) -> None:
        directory = self.record.directory / "stacks" / f"attempt-{attempt}"
        if self.dashboard is None:
            self.journal.emit("health.stacks", attempt=attempt, summary="no stacks: no dashboard to ask",
                              directory=None)
            return
        try:
            submission = self.watcher.attempt.submission_id if self.watcher.attempt else None
            processes = stacks.job_processes(self.dashboard, (job or {}).get("job_id"), (job or {}).get("driver"),
                                             submission_id=submission, local=self.local_processes)
            evidence = stacks.collect(self.dashboard, processes, directory, local=self.local_processes)
        except Exception as exc:  # noqa: BLE001 - evidence is a courtesy: the fault is acted on all the same
            self.journal.emit("health.stacks", attempt=attempt, summary=f"no stacks: {exc}", directory=None)
            return
        self.journal.emit("health.stacks", attempt=attempt, summary=evidence.summary, directory=evidence.directory,
                          taken=evidence.taken, failed=evidence.failed)

    # --- between attempts ----------------------------------------------------------------------------

    def remedy_node(self, fault: Fault) -> bool:
        """Take the fault's node out of the next attempt: replaced (local), drained (existing); for good
        the second time the same node faults. True when it was taken out."""
        if not fault.node_out or fault.node is None or self.remedy is None:
            return False
        for_good = self._faults_on(fault.node) >= 2
        try:
            kind, details = self.remedy.take_out(fault.node, fault, for_good)
        except Exception as exc:  # noqa: BLE001 - a remedy that fails is reported; the retry still happens
            self.journal.emit("node.remedy_failed", node=fault.node, error=str(exc))
            return False
        self.journal.emit(kind, node=fault.node, reason=fault.summary, **details)
        self.watcher.retire(fault.node)
        return True

    def end_instead(self, fault: Fault, retries_left: bool, max_retries: int) -> tuple[str, str] | None:
        """Why the run ends at this fault rather than restart (its final state and reason): the policy
        says stop, no retries are left, or the same fault came twice with no progress. None: restart."""
        if self.policy.action(fault.kind) == "stop":
            return "UNHEALTHY", f"{fault.summary}; health.on_{fault.kind.value} is stop"
        if not retries_left:
            return "UNHEALTHY", f"{fault.summary}; no retries left (max_retries {max_retries})"
        repeated = self.repeated(fault, None)
        if repeated:
            return "REPEATED_FAILURE", f"{repeated}: retrying would not help"
        return None

    def last_look(self) -> None:
        """The attempt a fault ended: the newest step its ranks reported, read once more now that it
        stopped. The fault's own step is the newest a check happened to see; the ranks may have gone on
        after it (up to a check interval before it, the peers of a lost node or the job on a faulty GPU
        until it was stopped), and those steps are redone too. A read that finds nothing (the exporters
        let the job go, a node gone with its ranks' reports) leaves the fault's step."""
        pending, attempt = self.pending, self.watcher.attempt
        if pending is None or attempt is None or not self.policy.enabled:
            return
        pending.attempt, pending.submission_id = attempt.number, attempt.submission_id
        seen = None
        try:
            with self._checking:
                before = self.watcher.last
                try:
                    seen = self.watcher.check().progress
                finally:  # a look aside: what the attempt's checks saw (its checkpoint, for resume_point) stays
                    self.watcher.last = before
        except Exception as exc:  # noqa: BLE001 - as in check(): the fault's own step stands
            self._say_check_failed(f"{type(exc).__name__}: {exc}")
        self._keep_made(pending, seen.newest_step if seen is not None else None)

    def _keep_made(self, pending: Pending, made: int | None) -> None:
        """A newer step of the attempt the fault ended, into the pending fault and the record; the record's step
        also when it is the fault's: a fault found after the attempt failed on its own (a lost node) comes from
        a check of its own, which may have seen steps the attempt's last check did not."""
        if made is not None and (pending.last_step is None or made > pending.last_step):
            pending.made = made
        item = self.record.attempt(pending.attempt) if pending.attempt is not None else None
        last = pending.last_step
        if item is not None and last is not None and (item.last_step is None or last > item.last_step):
            item.last_step = last

    def _late_steps(self, reads: list[NodeRead]) -> None:
        """Until the next attempt's first step ends the recovery, each check reads the ended attempt's newest
        step again: an exporter serves a report a collector interval after it came, and a lost node's peers
        send their last ones as they exit, after the last look (the exporters keep serving that attempt)."""
        pending = self.pending
        if pending is not None and pending.submission_id is not None and pending.fault is not self.stopped_by:
            self._keep_made(pending, progress([read for read in reads if read.ok], pending.submission_id).newest_step)

    def repeated(self, fault: Fault | None, failed: AttemptRecord | None) -> str | None:
        """Why retrying would not help: the same fault (or the same failure) twice in a row, with no
        progress in between. None when it might."""
        attempts = [item for item in self.record.attempts if item.ended_at or item is failed]
        if fault is not None:
            previous = [event for event in self.record.events if event.kind == "health.fault"
                        and event.details.get("action") != "report"]
            if len(previous) >= 2 and previous[-2].details.get("fault") == fault.kind.value and \
                    previous[-2].details.get("node") == fault.node and not self._progress_between(previous[-2].attempt):
                where = f" on {fault.node}" if fault.node else ""
                return f"the same {fault.kind.value}{where} twice in a row with no progress in between"
            return None
        if failed is None or len(attempts) < 2:
            return None
        before = self.record.attempt(failed.attempt - 1)
        if before is None or before.status != "FAILED":
            return None
        same = (before.error_type, before.driver_exit_code, before.message) == \
            (failed.error_type, failed.driver_exit_code, failed.message)
        progressed = failed.last_step is not None and (before.last_step is None or failed.last_step > before.last_step)
        if same and not progressed:
            how = failed.message or f"driver exit code {failed.driver_exit_code}"
            return f"attempts {before.attempt} and {failed.attempt} failed the same way ({how}) with no progress"
        return None

    def _faults_on(self, node: str) -> int:
        return sum(1 for event in self.record.events if event.kind == "health.fault"
                   and event.details.get("node") == node and event.details.get("action") != "report")

    def _progress_between(self, since_attempt: int | None) -> bool:
        """A step advanced in an attempt after `since_attempt`."""
        later = [item for item in self.record.attempts if since_attempt is not None and item.attempt > since_attempt]
        return any(item.last_step is not None and item.first_step is not None and item.last_step > item.first_step
                   for item in later)

    # --- progress ------------------------------------------------------------------------------------

    def _keep_books(self, attempt: int, result: Check) -> None:
        """The check's bookkeeping (thresholds said, progress facts, the ledger's gauge). Its failure is said
        (health.check_failed) and never costs the check its faults: those were read once and are acted on."""
        try:
            if result.progress is not None and result.progress.step:  # a job that reports no steps: its silence
                self._note_thresholds(attempt)
            self._late_steps(result.reads)
            self._note_progress(attempt, result.progress, result.threshold)
        except Exception as exc:  # noqa: BLE001 - the faults below matter more than the books
            self._say_check_failed(f"{type(exc).__name__}: {exc}")

    def _note_thresholds(self, attempt: int) -> None:
        """A hang threshold (between reports, or an RL phase's) that changed its rule or by a tenth: an
        event (`launcher status` shows the latest). Each changes rarely: a phase's grows with its longest
        duration, the one between reports settles once its intervals are seen."""
        for threshold in self.watcher.learner.learned(self.policy):
            said = self._thresholds_said.get(threshold.phase)
            if said is not None and said.rule == threshold.rule and \
                    abs(said.seconds - threshold.seconds) < 0.1 * said.seconds:
                continue
            self._thresholds_said[threshold.phase] = threshold
            self.journal.emit("health.threshold", attempt=attempt, seconds=round(threshold.seconds, 1),
                              rule=threshold.rule, basis=threshold.basis, phase=threshold.phase)

    def _note_progress(self, attempt: int, seen: Progress | None, threshold: Threshold | None = None) -> None:
        """Keep the attempt's first and newest step (the effective training time comes from them); the
        first step of the attempt after a healed fault ends the recovery. The first step and its time
        are the job's own (the exporters serve each rank's first step of the attempt), not when a check
        happened to see progress: a check every 10 s would otherwise add up to 10 s to every recovery."""
        if seen is None or not seen.step:
            return
        item = self.record.attempt(attempt)
        if item is None:
            return
        step = max(seen.step.values())
        newest = max(seen.last_report.values(), default=time.time())
        started = seen.started
        if item.first_step is None:
            if started is not None:
                item.first_step, item.first_step_at = started
            else:  # an exporter without the first-step families, or an RL loop: the first step seen
                item.first_step = min(seen.step.values())
                item.first_step_at = min(seen.last_report.values(), default=newest)
        item.last_step, item.last_progress_at = step, newest
        if seen.checkpoint_seconds is not None:
            item.checkpoint_seconds = seen.checkpoint_seconds
        if seen.checkpoints is not None and seen.checkpoint_at is not None:
            item.last_checkpoint = (seen.checkpoints, seen.checkpoint_at)
            item.first_checkpoint = item.first_checkpoint or item.last_checkpoint
        split = ledger(self.record)
        report: dict[str, Any] = {"effective_training_ratio": _ettr(split),
                                  "time_seconds": {cause: round(value, 1) for cause, value in split.seconds.items()},
                                  "hang_threshold_seconds": round(threshold.seconds, 1) if threshold else None,
                                  **self._checkpoint_report()}
        pending = self.pending
        if pending is not None and pending.fault is not self.stopped_by:
            self.pending = None
            recovery = {"fault": pending.fault.kind.value,
                        "detect_seconds": round(pending.decided_at - pending.fault.at, 1),
                        "recover_seconds": round(max(0.0, item.first_step_at - pending.fault.at), 1),
                        "steps_lost": steps_lost(pending.last_step, item.resumed_from_step,
                                                 started[0] if started is not None else None)}
            self.journal.emit("health.recovered", attempt=attempt, first_step=item.first_step,
                              resumed_from=item.resumed_from_step, **recovery)
            report.update(recovery)
        self._publish(report)

    def _checkpoint_report(self) -> dict[str, float | None]:
        """The checkpoint interval in use and the one advised for the fault rate (launcher/checkpoint_advice.py)."""
        if self._past is None:  # summed once: the check keeps two numbers, not every past run's record
            self._past = checkpoint_advice.past_faults(list_runs(), self.record.run_id)
        advice = checkpoint_advice.for_run(self.record, self._past)
        if advice is None:
            return {}
        return {key: round(value, 1) if value else None for key, value in
                (("checkpoint_interval_seconds", advice.interval_s),
                 ("checkpoint_advised_interval_seconds", advice.advised_s))}

    def _publish(self, fields: dict[str, Any]) -> None:
        """The run's health as metrics, through the head exporter's progress endpoint (best effort: it
        is loopback-only on the head, so only a local cluster's launcher reaches it)."""
        if not self.progress_url:
            return
        report = {"kind": "run", "run_id": self.record.run_id, "time": time.time(),
                  **{key: value for key, value in fields.items() if value is not None}}
        headers = {"Content-Type": "application/json"}
        token = self.dashboard.token if self.dashboard is not None else None
        if token:
            headers["Authorization"] = f"Bearer {wire.progress_token(token, 'run', self.record.run_id)}"
        request = urllib.request.Request(self.progress_url.rstrip("/") + wire.PROGRESS_PATH,
                                         data=json.dumps({"reports": [report]}).encode(), method="POST",
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=PUBLISH_TIMEOUT_S):
                pass
        except (OSError, http.client.HTTPException, ValueError):
            pass  # the metrics are a view of the journal, which has it all

    def effective_training_ratio(self) -> float | None:
        """The share of the run's wall time spent making progress that was kept (the ledger's productive
        seconds, launcher/ledger.py); None before any."""
        return _ettr(ledger(self.record))


def _ettr(split: Ledger) -> float | None:
    """The ledger's productive share; None before any progress."""
    return split.ettr if split.seconds["productive"] else None
