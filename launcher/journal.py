"""The journal: every change of a run (and every action the launcher takes) is one event, emitted
once, and the journal turns it into everything that follows from it: the run record, the audit
line, the trace span and the line a person reads.

    journal.emit("attempt.submitted", attempt=2, submission_id="mnist-1a2b-a2", ...)

An event kind is one line of KINDS: what it says (a line for the display, or none), whether it
is an audit line (and under which action), and whether it is a warning. What a kind does to the
run record and to the trace is in `_apply` and `_TraceSink.on`; a kind they do not know is kept
in the record's event list and added to the current span as a span event, so a new kind (a
health decision, say) is one line in KINDS.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from launcher import audit, redact
from launcher.display import Reporter
from launcher.exitcodes import FINAL_STATES
from launcher.state import AttemptRecord, EventRecord, RunRecord, release_supervision
from launcher.tracing import AttemptSpan, RunTrace, traceparent

Level = Literal["info", "warn", "step", "done"]
Details = Mapping[str, Any]


@dataclass(frozen=True)
class Kind:
    name: str
    say: Callable[[Details], str] | None = None  # the display line; None: nothing shown
    level: Level = "info"  # info/warn: a line; step/done: a step of the live display (key: `step`)
    audit: str | Callable[[Details], str] | None = None  # the audit action; None: not an audit line
    result: Callable[[Details], str] = lambda _: "ok"  # the audit line's result
    step: str = ""


_SOURCES = {"head": "the head exporter's fleet document", "direct": "each exporter"}


def _attempt_of(d: Details) -> str:
    return f"attempt {d['attempt']}/{d['max_attempts']}"


def _finished(d: Details) -> str:
    message = d.get("message")
    return f"{_attempt_of(d)} {d['status']}" + (f": {message}" if d["status"] == "FAILED" and message else "")


_ACTIONS = {"restart": "stopping the attempt; a new one resumes from the last checkpoint",
            "stop": "stopping the run (the health policy says stop)", "report": "reported only (health policy)"}


def _why_again(d: Details) -> str:
    cause = d.get("cause")
    return "failed" if not cause or cause == "failed" else f"stopped ({cause})"


def _exporters_of(d: Details) -> str:
    """`the exporter of workers-1`, or `the exporters of 1,230 nodes (workers-1, workers-2, ...)`."""
    count = d.get("count", 1)
    if count == 1:
        return f"the exporter of {d['node']}"
    more = ", ..." if count > len(d.get("nodes", ())) else ""
    return f"the exporters of {count:,} nodes ({', '.join(d.get('nodes', ()))}{more})"


def _unreachable(d: Details) -> str:
    if d.get("count", 1) == 1:
        return (f"the exporter of {d['node']} does not answer ({d['error']}); that node is not watched until it does "
                "(never a reason to restart)")
    return (f"{_exporters_of(d)} do not answer ({d['node']}: {d['error']}); those nodes are not watched until they do "
            "(never a reason to restart)")


def _killed(d: Details) -> str:
    return f"; {d['killed']} process(es) needed SIGKILL" if d.get("killed") else ""


KINDS: dict[str, Kind] = {kind.name: kind for kind in (
    # a local cluster
    Kind("cluster.starting"),
    Kind("cluster.nodes_started"),
    Kind("cluster.up", audit="cluster.up"),
    Kind("cluster.failed", audit="cluster.up", result=lambda d: d["result"]),
    Kind("cluster.kept", say=lambda d: f"cluster {d['cluster']} kept at {d['address']}; `launcher down "
                                       f"{d['cluster']}` stops it"),
    Kind("cluster.teardown", say=lambda d: f"tearing down cluster {d['cluster']}", level="step", step="teardown"),
    Kind("cluster.down", say=lambda d: f"cluster {d['cluster']} torn down{_killed(d)}", level="done",
         step="teardown", audit="cluster.down"),
    Kind("cluster.jobs_stopped", say=lambda d: f"stopped {len(d['stopped'])} unfinished job(s) first: "
                                               f"{', '.join(d['stopped'])}"),
    # a run's attempts
    Kind("attempt.found", say=lambda d: f"run {d['run_id']} already has attempt {d['attempt']} "
                                        f"({d['submission_id']}, {d['status']}); following it instead of "
                                        "submitting again"),
    Kind("attempt.submitting"),
    Kind("attempt.submitted", say=lambda d: f"{_attempt_of(d)} submitted as {d['submission_id']}",
         audit="attempt.submit"),
    Kind("attempt.submit_failed", audit="attempt.submit", result=lambda d: f"error: {d['error']}"),
    Kind("attempt.running", say=lambda d: f"{_attempt_of(d)} RUNNING"),
    Kind("attempt.stopping", say=lambda d: f"stopping attempt {d['attempt']} ({d['why']})", audit="attempt.stop",
         result=lambda _: "sent"),
    Kind("attempt.finished", say=_finished),
    Kind("attempt.preempted", say=lambda d: f"attempt {d['attempt']} preempted (its RayJob suspended by Kueue): not "
         f"a failure, not counted against max_retries; attempt {d['attempt'] + 1} runs once it is admitted again"),
    # a run's wait in its platform's queue (Kueue, launcher/backends/kuberay/follow.py): the ledger's `queued`
    Kind("run.queued", say=lambda d: "waiting in Kueue's queue" + (f" {d['queue']}" if d.get("queue") else "")
         + ": the RayJob stays suspended until it is admitted"),
    Kind("run.admitted", say=lambda d: f"admitted by Kueue after {d['seconds']:g}s in the queue"),
    Kind("retry.scheduled", say=lambda d: f"attempt {d['attempt']} {_why_again(d)}; attempt {d['attempt'] + 1} in "
                                          f"{d['delay']:g}s"),
    Kind("run.resume", say=lambda d: f"attempt {d['attempt']} resumes from the checkpoint of step {d.get('step')}"
                                     + (f" ({d['path']})" if d.get("path") else "")),
    # the health watcher and what it does (launcher/healing.py)
    Kind("health.blind", level="warn", say=lambda d: "the watcher finds no exporter to read: this run's health is "
         "not watched (" + (d.get("hint") or "is an exporter on the head? `launcher exporters deploy`") + ")"),
    Kind("health.exporter_unreachable", level="warn", say=_unreachable),
    Kind("health.exporter_back", say=lambda d: f"{_exporters_of(d)} answer{'s' if d.get('count', 1) == 1 else ''} "
         "again"),
    Kind("health.source_fallback", say=lambda d: f"the watcher reads {_SOURCES[d['source']]}: Prometheus cannot say "
         f"({d['why']}); said once until it can again"),
    Kind("health.check_failed", level="warn", say=lambda d: f"a health check failed ({d['error']}); the next one "
         "runs as planned (said once until a check works again)"),
    Kind("health.check_slow", level="warn", say=lambda d: f"a health check took {d['seconds']:g}s, longer than "
         "its interval" + (f" of {d['interval']:g}s" if d.get("interval") is not None else "")
         + (f" ({d['exporters']} exporters)" if d.get("exporters") is not None else "")
         + ": faults are seen later; the run is followed as before (said once until a check fits again)"),
    Kind("health.fault", level="warn", audit="health.fault", result=lambda d: d["action"],
         say=lambda d: f"attempt {d['attempt']}: {d['summary']}; {_ACTIONS[d['action']]}"),
    Kind("health.threshold", say=lambda d: f"attempt {d['attempt']}: a hang is judged after {d['seconds']:g}s "
         + (f"in phase {d['phase']}" if d.get("phase") else "without progress") + f" ({d['basis']})"),
    Kind("health.stacks", say=lambda d: f"stacks of attempt {d['attempt']}: {d['summary']}"
                                        + (f" (saved in {d['directory']})" if d.get("directory") else "")),
    Kind("health.evidence", say=lambda d: f"evidence of attempt {d['attempt']} before its RayJob is deleted: "
         f"{d['summary']}" + (f" (saved in {d['directory']})" if d.get("directory") else "")),
    Kind("health.recovered", audit="health.recovered", say=lambda d: (
        f"attempt {d['attempt']} recovered from the {d['fault']}: first step {d['first_step']} "
        f"{d['recover_seconds']:g}s after the fault (detected in {d['detect_seconds']:g}s; "
        f"{d['steps_lost'] if d.get('steps_lost') is not None else 'unknown'} step(s) lost"
        + (f", resumed from the checkpoint of step {d['resumed_from']}" if d.get("resumed_from") is not None else "")
        + ")")),
    Kind("node.replaced", audit="node.replace", say=lambda d: f"{d['node']} replaced by a fresh node in "
                                                              f"{d['seconds']:g}s ({d['reason']})"),
    Kind("node.retired", level="warn", audit="node.retire", say=lambda d: f"{d['node']} faulted twice: retired for "
                                                                          "good, the run goes on without it"),
    Kind("node.drained", audit="node.drain", say=lambda d: f"{d['node']} drained through Ray ({d['reason']})"
         + (f"; host {d['host_denied']} denied for the rest of the run" if d.get("host_denied") else "")),
    Kind("node.cordoned", audit="node.cordon", say=lambda d: f"Kubernetes node {d['node']} cordoned: the next "
         f"attempt's pods land elsewhere ({d['reason']}); `kubectl uncordon {d['node']}` once it is repaired"),
    Kind("node.left", level="warn", say=lambda d: f"Kubernetes node {d['node']} left alone ({d['why']}); the next "
         "attempt's pods may land on it again"),
    Kind("node.remedy_failed", level="warn", audit="node.remedy", result=lambda d: f"error: {d['error']}",
         say=lambda d: f"could not take {d['node']} out of the next attempt: {d['error']}"),
    # the run
    # the run's recording (launcher/recording.py)
    Kind("recording.started"),
    Kind("recording.stopped"),
    # a target the recorder could not read (gone, broken, slow): its `up` is 0 for the round; said once
    # until it answers again, and not shown (an exporter's read trouble is the watcher's news)
    Kind("recording.target_failed"),
    Kind("recording.round_failed", level="warn", say=lambda d: f"a recording round failed ({d['error']}); the "
         "recording goes on with the next one"),
    Kind("recording.samples_dropped", level="warn", say=lambda d: f"the recording leaves out {d['dropped']} "
         f"sample(s) whose metric or label name is not a Prometheus name (e.g. {d['example']})"),
    Kind("recording.alerts_unread", level="warn", say=lambda d: f"the recording cannot read the run's alerts "
         f"({d['error']}); it asks again each minute and keeps recording"),
    Kind("recording.capped", level="warn", say=lambda d: f"recording stopped early: {d['reason']}; what it "
         f"recorded until then is kept in {d['path']}"),
    Kind("run.placed"),
    Kind("run.detached", say=lambda d: f"run {d['run_id']} submitted; not followed from here (--no-wait): no "
                                       "retries, health watching or deadlines. `launcher logs -f "
                                       f"{d['run_id']}` follows it, `launcher status {d['run_id']}` shows it, "
                                       f"`launcher stop {d['run_id']}` stops it"),
    Kind("run.stop_requested", audit="run.stop"),
    Kind("run.deadline"),
    Kind("run.finished", audit="run.finish", result=lambda d: d["state"]),
    # what the launcher does besides runs
    Kind("command.refused", audit=lambda d: d["command"], result=lambda _: "bad input"),
    Kind("command.failed", audit=lambda d: d["command"], result=lambda _: "error"),
    Kind("manifests.rendered", audit="render"),
    Kind("manifests.applied", audit="kuberay.apply", result=lambda d: d.get("error") or "ok"),
    Kind("exporters.deployed", audit="exporters.deploy", result=lambda d: "error" if d.get("failed") else "ok"),
    Kind("exporters.removed", audit="exporters.remove"),
)}

# Details that belong in the audit line of a kind but not in the run record's event list.
_NOT_RECORDED = {"entrypoint"}


def _apply(record: RunRecord, kind: str, at: float, d: Details) -> None:
    """What an event changes in the run record (besides being listed in record.events)."""
    if kind == "run.placed":
        record.address = d.get("address", record.address)
        record.cluster, record.cluster_kept = d.get("cluster"), bool(d.get("kept"))
    elif kind == "cluster.up":
        record.address = d.get("address", record.address)
    elif kind == "attempt.submitted":
        if record.attempt(d["attempt"]) is None:
            record.attempts.append(AttemptRecord(attempt=d["attempt"], submission_id=d["submission_id"],
                                                 submitted_at=at))
            record.attempts.sort(key=lambda item: item.attempt)
        record.state = "PENDING"
    elif kind == "attempt.running":
        attempt = record.attempt(d["attempt"])
        if attempt is not None and attempt.running_at is None:
            attempt.running_at = at
        record.state = "RUNNING"
    elif kind == "run.detached":
        record.detached, record.pid = True, None
    elif kind == "retry.scheduled":
        record.state = "RETRYING"
    elif kind == "run.deadline":
        record.reason = d["why"]
    elif kind == "node.drained" and d.get("host_denied") and d["host_denied"] not in record.denied_hosts:
        record.denied_hosts.append(d["host_denied"])
    elif kind == "run.finished":
        record.state = d["state"]
        record.reason = d.get("reason")
        record.exit_code = int(FINAL_STATES[d["state"]])
        record.finished_at = at


class _TraceSink:
    """Spans follow the events: a phase opens on one event and ends on another."""

    def __init__(self, run_trace: RunTrace) -> None:
        self.run_trace = run_trace
        self.tracer = run_trace.tracer
        self.attempt: AttemptSpan | None = None
        self._open: dict[str, Span] = {}  # cluster.start, cluster.wait_nodes, retry.backoff, cluster.teardown

    def _child(self, name: str, parent: Span | None = None, **attributes: Any) -> None:
        context = trace.set_span_in_context(parent or self.run_trace.root)
        self._open[name] = self.tracer.start_span(name, context=context, attributes=attributes)

    def _end(self, name: str, error: str | None = None) -> None:
        span = self._open.pop(name, None)
        if span is not None:
            if error:
                span.set_status(Status(StatusCode.ERROR, error))
            span.end()

    def traceparent(self) -> str | None:
        return traceparent(self.attempt.span) if self.attempt is not None else None

    def end_attempt(self, state: str, message: str | None = None, driver_exit_code: int | None = None) -> None:
        if self.attempt is not None:
            self.attempt.end(state, message, driver_exit_code)
            self.attempt = None

    def on(self, kind: str, d: Details) -> None:
        if kind == "cluster.starting":
            self._child("cluster.start", **{"raypulse.cluster": d["cluster"], "raypulse.nodes": d["nodes"]})
        elif kind == "cluster.nodes_started":
            self._child("cluster.wait_nodes", self._open.get("cluster.start"), **{"raypulse.nodes": d["nodes"]})
        elif kind in ("cluster.up", "cluster.failed"):
            error = d.get("result") if kind == "cluster.failed" else None
            self._end("cluster.wait_nodes", error)
            self._end("cluster.start", error)
        elif kind == "cluster.teardown":
            self._child("cluster.teardown", **{"raypulse.cluster": d["cluster"]})
        elif kind == "cluster.down":
            self._end("cluster.teardown")
        elif kind in ("attempt.submitting", "attempt.found"):
            self._end("retry.backoff")
            self.end_attempt("ABANDONED")  # not expected: an attempt's span ends with the attempt
            self.attempt = AttemptSpan(self.run_trace, d["run_id"], d["attempt"], d["submission_id"])
            if kind == "attempt.submitting":
                self.attempt.open_child("attempt.submit")
            else:
                self.attempt.phase(d["status"])
        elif kind == "attempt.submitted" and self.attempt is not None:
            self.attempt.close_child()
            self.attempt.phase("PENDING")
        elif kind == "attempt.submit_failed" and self.attempt is not None:
            self.attempt.close_child(error=d["error"])
            self.end_attempt("FAILED", f"not submitted: {d['error']}")
        elif kind == "attempt.running" and self.attempt is not None:
            self.attempt.phase("RUNNING")
        elif kind == "attempt.finished":
            self.end_attempt(d["state"], d.get("message"), d.get("driver_exit_code"))
        elif kind == "retry.scheduled":
            self._child("retry.backoff", **{"raypulse.backoff_seconds": d["delay"],
                                            "raypulse.next_attempt": d["attempt"] + 1})
        elif kind == "run.finished":
            self._end("retry.backoff")
            self.end_attempt(d["state"])
        else:
            span = self.attempt.span if self.attempt is not None else self.run_trace.root
            span.add_event(kind, {key: str(value) for key, value in redact.details(d).items() if value is not None})

    def close(self, state: str) -> None:
        """The run is left (its launcher closes): whatever is open ends as it is."""
        self.end_attempt(state)
        for name in list(self._open):
            self._end(name)


class Journal:
    """Where a run's events go. `record` is the run record this process owns (None for events
    outside a run, or of a run another process follows); `run_trace` the run's trace."""

    def __init__(self, reporter: Reporter | None = None, record: RunRecord | None = None,
                 run_trace: RunTrace | None = None, run_id: str | None = None) -> None:
        self.reporter = reporter or Reporter()
        self.record = record
        self.run_trace = run_trace or RunTrace.off()
        self.run_id = record.run_id if record is not None else run_id
        self._trace = _TraceSink(self.run_trace)
        # One event at a time: the recorder's thread emits too (recording.capped), and an event
        # changes the record it saves.
        self._lock = threading.RLock()

    @property
    def tracer(self) -> trace.Tracer:
        return self.run_trace.tracer

    def traceparent(self) -> str | None:
        """W3C traceparent of the current attempt's span (what its TRACEPARENT carries)."""
        return self._trace.traceparent()

    def emit(self, kind: str, /, *, show: bool = True, **details: Any) -> EventRecord:
        """Record one event; `show=False` keeps it off the display (a quiet teardown)."""
        with self._lock:
            return self._emit(kind, show, details)

    def _emit(self, kind: str, show: bool, details: dict[str, Any]) -> EventRecord:
        spec = KINDS[kind]
        at = time.time()
        trace_id = details.pop("trace_id", None) or self.run_trace.trace_id
        if self.run_id is not None:
            details.setdefault("run_id", self.run_id)
        if self.record is not None:
            details.setdefault("max_attempts", self.record.max_attempts)
        line = spec.say(details) if spec.say is not None else None
        event = EventRecord(time=at, kind=kind, message=line, attempt=details.get("attempt"),
                            details={key: value for key, value in details.items()
                                     if value is not None and key not in _NOT_RECORDED and key != "run_id"})
        if self.record is not None:
            _apply(self.record, kind, at, details)
            self.record.events.append(event)
            self.record.save()
        if spec.audit is not None:
            action = spec.audit(details) if callable(spec.audit) else spec.audit
            audit.record(action, spec.result(details), trace_id=trace_id,
                         **{key: value for key, value in details.items() if key != "max_attempts"})
        self._trace.on(kind, details)
        if line is not None and show:
            self._show(spec, line)
        return event

    def _show(self, spec: Kind, line: str) -> None:
        if spec.level == "warn":
            self.reporter.warn(line)
        elif spec.level == "step":
            self.reporter.step(spec.step, line)
        elif spec.level == "done":
            self.reporter.done(spec.step, line)
        else:
            self.reporter.info(line)

    def close(self, state: str) -> None:
        """End what is still open in the trace (the launcher leaves before the run's end), and let
        another launcher supervise the run."""
        self._trace.close(state)
        if self.record is not None:
            release_supervision(self.record.run_id)
