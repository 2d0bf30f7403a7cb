"""A RayJob's attempts as the attempt engine (launcher/run.py) follows them, like any run's: KubeRay
supervises it (its retries, its deadlines: `retries_itself`), the engine watches and records it in the
run's journal, streams the driver's output, heals it, and exits with the run's code. This module says
what an attempt's status is (from the RayJob's), where its log comes from, how it is stopped and how a
restart is done; the life of an attempt is the engine's.

What KubeRay stores, and how it is read here (rayjob_types.go, rayjob_controller.go):
- the end is the *deployment* status (Complete, Failed), never the Ray job status alone: with retries
  left KubeRay stores `jobStatus: FAILED` beside `jobDeploymentStatus: Retrying`, and on
  DeadlineExceeded `jobStatus` stays RUNNING;
- ValidationFailed is not terminal by KubeRay's own helper: a follower that waits for a terminal state
  waits for ever; here it ends the run as bad input, and the RayJob (which never ran) is deleted so the
  corrected spec can be applied under the same run id;
- each retry has a new `status.jobId`: a new attempt in the journal. KubeRay sets it at New ->
  Initializing, before the RayCluster exists, and under Kueue suspends the RayJob right after (Kueue's
  webhook created it suspended), resetting the jobId, and names a new one on admission: a jobId is an
  attempt only once the deployment is past Initializing (Running, or an end), so a queued RayJob has no
  attempt that never ran;
- a suspend not asked here (Kueue's preemption: Suspending -> Suspended of a running RayJob) ends the
  attempt as STOPPED and *preempted* (event `attempt.preempted`): not a failure, no retry's backoff, not
  counted against max_retries (launcher/run.py `preemptions`); the run follows the attempt KubeRay starts
  once Kueue admits the RayJob again;
- the time in Kueue's queue is journal events, one per change, from the RayJob as it is seen (by the follower,
  or by `catch_up` for a run nobody follows): `run.queued` when the RayJob waits suspended (spec.suspend) before
  it runs (created suspended by Kueue's webhook, or preempted: from Suspending on), `run.admitted` when Kueue
  lets it go (spec.suspend false). The ledger (launcher/ledger.py) paints that span `queued`. A suspend asked
  here (a stop under Kueue) is not a queue. Pods Pending for want of a node are not told apart: neither the
  RayJob's status nor its rayClusterStatus says a pod is unschedulable (only each pod's PodScheduled condition
  does, which would take a pod watch per run), and an unschedulable pod is also how the cluster autoscaler's
  scale-up begins (provisioning, not a queue);
- the driver's output is the submitter Job's pod log (`batch.kubernetes.io/job-name=<RayJob>`); a retry
  replaces that pod, so each attempt's log is saved as it streams.

The RayJob is watched with a field selector on its name; a watch the server closes (they all end) is
opened again from the last resourceVersion, and a 410 (too old) starts again from a fresh list (watched
from the list's resourceVersion: the object's own may be older than the server's compacted history).

With a health policy (launcher/backends/kuberay/heal.py says what is read and how), the watcher checks
the running attempt beside the engine's loop. A fault the policy restarts for ends the attempt the one way
KubeRay allows (the RayJob deleted, foreground: its RayCluster, Secret and PodMonitor go first), then the
same RayJob is applied again as the next attempt, with RAYPULSE_RESUME_FROM and a backoffLimit of what is
left of max_retries: one numbering of attempts, one budget, with KubeRay's own retries in between.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from launcher.backends.base import RunEnds, Seen, Submission
from launcher.backends.kuberay import render as kuberay
from launcher.backends.kuberay.access import KubeAccess, api_error, kube_api, retry_after, transient
from launcher.backends.kuberay.render import KUEUE_QUEUE_LABEL
from launcher.errors import BadInput, InfraError
from launcher.jobs import ClusterLost
from launcher.journal import Journal
from launcher.ledger import queue_waits
from launcher.run import LOST_AFTER_S, finish_run, preemptions
from launcher.state import RunRecord, stop_requested

if TYPE_CHECKING:
    from launcher.backends.kuberay.render import Applied
    from launcher.spec import JobSpec

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # the label Kubernetes puts on a Job's pods
WATCH_SECONDS = 60  # a watch asks the server to close it after this long; it is opened again at once
POLL_S = 0.5  # how often a submitter pod (or a deleted RayJob's end) is looked for
RETRY_AFTER_MAX_S = 10.0  # the longest a server's Retry-After is waited before a change is asked again
VIEW_POLL_S = 0.05  # how often an attempt's log stream looks whether KubeRay started it (no API call)
LOG_JOIN_S = 5.0  # an ended attempt's log stream gets this long to drain
LOG_NOTE_S = 5.0  # a submitter pod not there this long after its attempt started is said (once)
LOG_POLL_MAX_S = 10.0  # the longest wait between two looks for a submitter pod
GONE_WAIT_S = 300.0  # a RayJob deleted to restart it gets this long to go (its pods stop, the finalizer runs)

# KubeRay's failure reasons that are not the job's own failure (the run's infrastructure).
INFRA_REASONS = {"SubmissionFailed", "JobDeploymentStatusTransitionGracePeriodExceeded", "RayClusterFailed"}
VALIDATION_FAILED = "ValidationFailed"
# Deployment states before an attempt runs: KubeRay may have named it (status.jobId), Kueue may take that back.
NOT_STARTED = {None, "", "New", "Initializing", "Waiting", "Suspending", "Suspended"}
SUSPENDED = {"Suspending", "Suspended"}


@dataclass
class _PodLog:
    """The driver's output of one attempt: the newest submitter pod not seen before, once KubeRay started the
    attempt, followed to its end."""

    jobs: RayJobAttempts
    attempt: int
    write: Callable[[str], None]
    text: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="rayjob-log", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        jobs = self.jobs
        try:
            pod = self._pod()
            if pod is None:
                return
            response = jobs.core.read_namespaced_pod_log(pod, jobs.namespace, follow=True, _preload_content=False)
            try:
                for chunk in response.stream(4096):
                    text = chunk.decode("utf-8", "replace")
                    self.text.append(text)
                    self.write(text)
            finally:
                response.release_conn()
        except Exception as exc:  # noqa: BLE001 - the log is a courtesy; the run's outcome stands
            jobs.journal.reporter.warn(f"the driver's log stream ended early: {type(exc).__name__}")
        finally:
            self.done.set()

    def _pod(self) -> str | None:
        """The attempt's submitter pod: KubeRay creates its Job once the attempt runs, and the pod may wait long
        for a node (a GPU node's scale-up). Looked for while the attempt lives, every POLL_S doubling up to
        LOG_POLL_MAX_S, through the API server's blinks; said once when it is not there after LOG_NOTE_S. An
        ended attempt gets one last look (an ended submitter pod's log stays readable)."""
        jobs, wait, since, said = self.jobs, POLL_S, None, False
        while not jobs.finished.is_set():
            if self.attempt not in jobs.views:
                if jobs.number is not None and jobs.number > self.attempt:
                    return None  # it never started here: nothing of it to read
                time.sleep(VIEW_POLL_S)
                continue
            if jobs.number is not None and jobs.number > self.attempt:
                # A later attempt runs: KubeRay deleted this one's submitter pod, and the fresh one is the later's.
                jobs.journal.reporter.warn(f"the driver's log of attempt {self.attempt} is gone: KubeRay replaced "
                                           "its submitter pod before it could be read")
                return None
            since = since or time.monotonic()
            ended = jobs.views[self.attempt].end_time is not None  # read before the look: one last look
            try:
                pods = jobs.core.list_namespaced_pod(jobs.namespace,
                                                     label_selector=f"{JOB_NAME_LABEL}={jobs.name}").items
            except Exception:  # noqa: BLE001 - the API server's trouble is the watch's to judge: look again
                pods = []
            fresh = sorted((pod for pod in pods if pod.metadata.uid not in jobs.pods_seen),
                           key=lambda pod: pod.metadata.creation_timestamp or 0)
            if fresh:
                jobs.pods_seen.add(fresh[-1].metadata.uid)
                return fresh[-1].metadata.name
            if ended:
                return None
            if not said and time.monotonic() - since > LOG_NOTE_S:
                said = True
                jobs.journal.reporter.warn(f"the driver's log of attempt {self.attempt} is not available yet (no "
                                           f"submitter pod {LOG_NOTE_S:.0f}s after it started: its pod may wait "
                                           "for a node); still looking while the attempt lives")
            time.sleep(wait)
            wait = min(wait * 2, LOG_POLL_MAX_S)
        return None


def outcome(deployment: str, job_status: str | None, reason: str | None, message: str | None) -> tuple[str, str | None]:
    """KubeRay's end as the run's final state, and the reason it names."""
    said = f"KubeRay: {deployment}" + (f" ({reason})" if reason else "") + (f": {message}" if message else "")
    if deployment == "Complete":
        return ("SUCCEEDED", None) if job_status == "SUCCEEDED" else \
            ("STOPPED", said) if job_status == "STOPPED" else ("FAILED", said)
    if reason == "DeadlineExceeded":
        return "DEADLINE_EXCEEDED", said
    if reason in INFRA_REASONS:
        return "INFRA_ERROR", said
    return "FAILED", said


class RayJobAttempts:
    """A run's attempts as KubeRay makes them of one RayJob: the attempt engine's Jobs on KubeRay. The RayJob's
    changes come from a watch (its own thread) and are taken in when the engine asks for an attempt's status;
    each new `status.jobId` is the next attempt, numbered on from the run's record."""

    names_attempts = False  # KubeRay names each attempt (status.jobId)
    retries_itself = True  # backoffLimit, activeDeadlineSeconds
    restart_removes_pods = True  # the foreground delete: the attempt's last values are recorded before it
    token = None  # the RayCluster's token is KubeRay's: no per-attempt progress token from here

    def __init__(self, applied: Applied, access: KubeAccess, journal: Journal, spec: JobSpec | None = None) -> None:
        from kubernetes import client

        self.access, self.journal, self.spec = access, journal, spec  # the spec: applied again to restart
        self.address = access.server
        self.cluster_name: str | None = None  # the current attempt's RayCluster (status.rayClusterName)
        self._generation = 0  # the RayJob applied last; a watch of an earlier one is dropped
        self.namespace = applied.namespace
        self.name = applied.rayjob["metadata"]["name"]
        self.kueue = KUEUE_QUEUE_LABEL in (applied.rayjob["metadata"].get("labels") or {})
        self.custom = client.CustomObjectsApi(access.api_client)
        self.core = client.CoreV1Api(access.api_client)
        self.finished = threading.Event()
        self._taking = threading.Lock()  # the watch's thread takes changes in; the engine's reads them
        self._refused: BadInput | None = None  # KubeRay refused the RayJob (ValidationFailed)
        self.views: dict[int, Seen] = {}  # each attempt followed here, as KubeRay has it now
        self.number: int | None = None  # the attempt the RayJob is on
        self._ended: set[int] = set()
        self._run_end: tuple[str, str | None] | None = None
        self._lost: BaseException | None = None
        self._logs: dict[int, _PodLog] = {}
        self.pods_seen: set[str] = set()
        self._stopping: str | None = None

    @property
    def record(self) -> RunRecord:
        assert self.journal.record is not None
        return self.journal.record

    def watch(self) -> None:
        """Start following the RayJob applied last (its changes come in on a thread of their own)."""
        threading.Thread(target=self._watch, args=(self._generation,), name="rayjob-watch", daemon=True).start()

    def close(self) -> None:
        """The run has ended (or is left to KubeRay): no more watching, no more waiting for pods."""
        self.finished.set()

    # --- Jobs ---------------------------------------------------------------------------------------

    def status(self, attempt: int, sid: str | None) -> Seen | None:
        with self._taking:
            return self._status(attempt)

    def _status(self, attempt: int) -> Seen | None:
        if self._refused is not None:
            raise self._refused
        if self._lost is not None:
            raise ClusterLost(f"the Kubernetes API server {self.access.server} does not answer "
                              f"({type(self._lost).__name__})")
        view = self.views.get(attempt)
        if view is not None:
            return replace(view)  # as it is now: the watch's thread goes on changing its own
        if self.number is not None and attempt < self.number:  # KubeRay moved past it before it was followed
            item = self.record.attempt(attempt)
            return Seen(item.submission_id if item else None, "FAILED", end_time=time.time())
        if self._run_end is not None:  # the run ended before this attempt started
            return Seen(None, "STOPPED" if self._run_end[0] == "STOPPED" else "FAILED", run_end=self._run_end)
        return None

    def submit(self, sid: str | None, submission: Submission) -> None:
        """The next attempt after one the engine stopped for a fault: the same RayJob applied again, with what
        is left of max_retries as its backoffLimit and of the deadline as its activeDeadlineSeconds."""
        spec = self.spec
        assert spec is not None
        limit = spec.active_deadline_seconds
        if limit is not None:  # KubeRay counts it from the RayJob's start: the new one gets what is left
            left = limit - (time.time() - self.record.created_at)
            if left < 1:
                raise RunEnds("DEADLINE_EXCEEDED", f"active_deadline_seconds ({limit}s) passed before the restart")
            spec = spec.model_copy(update={"active_deadline_seconds": int(left)})
        applied = kuberay.apply(spec, self.access, attempt_env=submission.env,
                                backoff_limit=spec.max_attempts + preemptions(self.record) - submission.attempt)
        self.kueue = KUEUE_QUEUE_LABEL in (applied.rayjob["metadata"].get("labels") or {})
        self.cluster_name = None
        self.watch()

    def stopping(self, restart: bool) -> str | None:
        return "suspending the RayJob (Kueue)" if self.kueue and not restart else "deleting the RayJob"

    def stop(self, attempt: int, sid: str | None, restart: bool, why: str | None) -> None:
        """For good: the RayJob deleted (under Kueue, suspended: its quota is given back and the RayJob stays
        for the queue to see); the run ends when the watch sees it go. To restart: deleted, foreground (its
        RayCluster, Secret and PodMonitor go first), and waited for, so the next one can be applied."""
        if not restart:
            self._stopping = "stop requested"
            if self.kueue:
                self._call("patch rayjobs", lambda: self.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, self.name, {"spec": {"suspend": True}}))
            else:
                self._delete()
            return
        from launcher.backends.kuberay import evidence

        evidence.keep(self, attempt)  # its stacks and pods' logs, before the delete takes them (bounded)
        with self._taking:
            self._generation += 1  # the deleted RayJob's watch ends; its news is dropped
        self._delete(foreground=True)
        self.cluster_name = None  # its pods are going: no longer the watcher's or the recorder's targets
        gone = self._gone()
        if gone is None:
            raise RunEnds("STOPPED", "stop requested while the RayJob deleted to restart it was going")
        with self._taking:
            if attempt in self.views and attempt not in self._ended:
                self._end(attempt, "STOPPED", why)
        if not gone:
            raise RunEnds("INFRA_ERROR", f"the RayJob {self.name}, deleted to restart it, was still there after "
                          f"{GONE_WAIT_S:.0f}s")

    def follow_logs(self, attempt: int, sid: str | None, write: Callable[[str], None]) -> threading.Thread:
        log = self._logs[attempt] = _PodLog(self, attempt, write)
        return log.start()

    def logs(self, attempt: int, sid: str | None) -> str:
        log = self._logs.get(attempt)
        if log is None:
            raise LookupError(f"the submitter pod's log of attempt {attempt} was not followed")
        log.done.wait(LOG_JOIN_S)
        if not log.text:  # nothing read: an empty saved log would hide the pod's (`launcher logs` reads it live)
            raise LookupError(f"no output of attempt {attempt} was read from its submitter pod")
        return "".join(log.text)

    # --- the RayJob's changes --------------------------------------------------------------------------

    def _put(self, update: tuple[int, str, dict[str, Any]] | BaseException) -> None:
        """One change from the watch, taken in at once (an error: the API server is lost until a change comes
        again), so an attempt's start is known as it happens (its submitter pod's log is read from then)."""
        with self._taking:
            if isinstance(update, BaseException):
                self._lost = update
                return
            self._lost = None
            generation, kind, obj = update
            if generation != self._generation:  # the RayJob deleted to restart it: not the run's news
                return
            try:
                self._take(kind, obj)
            except BadInput as exc:
                self._refused = exc
                return
        if kind != "DELETED":
            self.queue(obj)  # after the lock: the engine's reads never wait for the journal's write

    def queue(self, obj: dict[str, Any]) -> None:
        """The RayJob's place in Kueue's queue, in the journal when it changes: `run.queued` once it waits
        suspended before it runs, `run.admitted` once Kueue lets it go (spec.suspend false)."""
        suspended = bool((obj.get("spec") or {}).get("suspend"))
        deployment = (obj.get("status") or {}).get("jobDeploymentStatus")
        if self._stopping or (suspended and deployment not in NOT_STARTED):
            return  # suspended to stop it (not a queue), or preempted while KubeRay has not suspended it yet
        waits = queue_waits(self.record.events)
        waiting = bool(waits) and waits[-1][1] is None
        if suspended and not waiting:
            self.journal.emit("run.queued", queue=(obj.get("metadata", {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL))
        elif waiting and not suspended:
            self.journal.emit("run.admitted", seconds=round(time.time() - waits[-1][0], 1))

    def _answered(self) -> None:
        """The API server answered again: it is not lost (whatever the RayJob did meanwhile comes by the watch)."""
        with self._taking:
            self._lost = None

    def _take(self, kind: str, obj: dict[str, Any]) -> None:
        """One version of the RayJob, as the attempts' views and the run's end. BadInput for ValidationFailed
        (the RayJob is deleted)."""
        current = self.number
        view = self.views.get(current) if current is not None else None
        if kind == "DELETED":
            if current is not None and view is not None and current not in self._ended:
                self._end(current, "STOPPED", None)
            self._run_ends(("STOPPED", f"the RayJob was deleted ({self._stopping or 'not by this launcher'})"))
            return
        status = obj.get("status") or {}
        deployment, job_status = status.get("jobDeploymentStatus"), status.get("jobStatus")
        reason, message = status.get("reason"), status.get("message")
        self.cluster_name = status.get("rayClusterName") or self.cluster_name
        if deployment == VALIDATION_FAILED:
            self._delete()
            raise BadInput(f"KubeRay refused RayJob {self.name} ({VALIDATION_FAILED}: {message or 'no message'}); "
                           "it never ran and was deleted: fix the spec and submit again")
        job_id = status.get("jobId")
        # A new jobId is the next attempt; so is the same one coming back after a retry (a user's
        # --submission-id is the RayJob's spec.jobId, which KubeRay reuses on every retry).
        again = current in self._ended and deployment == "Running" and job_status in ("PENDING", "RUNNING")
        if job_id and deployment not in NOT_STARTED and (view is None or view.submission_id != job_id or again):
            if current is not None and view is not None and current not in self._ended:
                self._end(current, "FAILED", message)  # KubeRay moved on: the last attempt failed
            current = self._started(job_id)
            view = self.views[current]
        if current is None or view is None:
            return
        if job_status == "RUNNING" and view.status == "PENDING" and deployment not in ("Failed", "Complete"):
            view.status = "RUNNING"
        if deployment == "Retrying" and current not in self._ended:
            self._end(current, job_status or "FAILED", message, retried=True)
        elif deployment == "Suspended" and self._stopping:
            if current not in self._ended:
                self._end(current, "STOPPED", message)
            self._run_ends(("STOPPED", f"the RayJob was suspended ({self._stopping})"))
        elif deployment in SUSPENDED and not self._stopping and current not in self._ended:
            self._end(current, "STOPPED", "preempted: the RayJob was suspended (Kueue) while it ran", preempted=True)
        elif deployment in ("Complete", "Failed"):
            state, why = outcome(deployment, job_status, reason, message)
            if current not in self._ended:
                self._end(current, job_status or state, message if state != "SUCCEEDED" else None)
            self._run_ends((state, why))

    def _started(self, job_id: str) -> int:
        """A new jobId: KubeRay's next attempt (or, following a RayJob again, one the record has already)."""
        followed = set(self.views)
        known = next((item for item in self.record.attempts
                      if item.submission_id == job_id and item.attempt not in followed), None)
        number = known.attempt if known is not None else max(
            [item.attempt for item in self.record.attempts] + list(followed), default=0) + 1
        self.views[number] = Seen(job_id, "PENDING")
        self.number = number
        return number

    def _end(self, attempt: int, status: str, message: str | None, retried: bool = False,
             preempted: bool = False) -> None:
        view = self.views[attempt]
        view.status, view.message, view.end_time, view.retried = status, message, time.time(), retried
        view.preempted = preempted
        self._ended.add(attempt)

    def _run_ends(self, end: tuple[str, str | None]) -> None:
        self._run_end = end
        if self.number is not None and self.number in self.views:
            self.views[self.number].run_end = end

    def _watch(self, generation: int) -> None:
        """Feed the RayJob's changes to the follow loop; opened again whenever the server closes it (until
        the RayJob is deleted, or deleted and applied again: that one has a watch of its own)."""
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        version: str | None = None
        failed = False  # the last call failed: the server is lost until one answers
        while not self.finished.is_set() and generation == self._generation:
            try:
                if failed and version is not None:
                    # A watch opened again from a known version is quiet while the RayJob is unchanged, for up
                    # to WATCH_SECONDS: a one-object list says at once that the server answers again. Its object
                    # is not taken in: the watch from `version` brings every change since, in order.
                    self.custom.list_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PLURAL, field_selector=f"metadata.name={self.name}")
                    self._answered()
                failed = False
                if version is None:  # a fresh read: the object now, and the list's version to watch from
                    # (the object's own resourceVersion may be older than the server's compacted history)
                    listed = self.custom.list_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PLURAL, field_selector=f"metadata.name={self.name}")
                    if not listed.get("items"):
                        self._put((generation, "DELETED", {}))
                        return
                    version = listed["metadata"].get("resourceVersion")
                    self._put((generation, "MODIFIED", listed["items"][0]))
                stream = watch.Watch().stream(
                    self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                    field_selector=f"metadata.name={self.name}", resource_version=version,
                    timeout_seconds=WATCH_SECONDS, _request_timeout=(5, WATCH_SECONDS + 10))
                for event in stream:
                    obj = event["raw_object"]
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    self._put((generation, event["type"], obj))
                    if self.finished.is_set() or generation != self._generation:
                        break
            except ApiException as exc:
                if exc.status == 410:  # the version is too old to watch from: read the object again
                    version = None
                    continue
                if exc.status == 404:
                    self._put((generation, "DELETED", {}))
                    return
                self._put(exc)
                failed = True
                time.sleep(1)
            except Exception as exc:  # noqa: BLE001 - the loop decides when a lost server ends the run
                self._put(exc)
                failed = True
                time.sleep(1)

    def _gone(self) -> bool | None:
        """Wait until the RayJob is gone (True), or GONE_WAIT_S passed (False), or a stop is asked (None)."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        deadline = time.monotonic() + GONE_WAIT_S
        while time.monotonic() < deadline:
            if stop_requested(self.record.run_id):
                return None
            try:
                self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
            except ApiException as exc:
                if exc.status == 404:
                    return True
            except HTTPError:
                pass  # the API server blinked: ask again
            time.sleep(POLL_S)
        return False

    def _delete(self, foreground: bool = False) -> None:
        """Foreground to restart: the RayJob goes only after what it owns (its Secret among them), so the one
        applied next never finds a Secret the garbage collector is about to take."""
        self._call("delete rayjobs", lambda: self.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name,
            propagation_policy="Foreground" if foreground else "Background"))

    def _call(self, action: str, call: Any) -> None:
        """A change the run needs (a delete, a suspend): asked again while the server's trouble lasts (429,
        5xx, a lost connection), up to the loss limit; then the run ends as lost (InfraError), the request's
        own fault (4xx) at once as bad input."""
        from kubernetes.client.rest import ApiException

        lost_at = time.monotonic() + LOST_AFTER_S
        while True:
            try:
                call()
                return
            except ApiException as exc:
                if exc.status == 404:  # gone already is what was asked
                    return
                error: Exception = exc
            except Exception as exc:  # noqa: BLE001 - classified below: a connection error is the server's
                error = exc
            if not transient(error):
                raise api_error(error, self.access, action, self.namespace) from None
            left = lost_at - time.monotonic()
            if left <= 0:
                raise InfraError(f"kubernetes: {self.access.server} did not answer {action} in namespace "
                                 f"{self.namespace} for {LOST_AFTER_S:.0f}s ({_short(error)})") from None
            time.sleep(retry_after(error, POLL_S, min(left, RETRY_AFTER_MAX_S)))


def _short(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    return f"{status} {getattr(exc, 'reason', '')}".strip() if status else type(exc).__name__


# --- runs nothing follows (--no-wait, a launcher that was killed) ----------------------------------


def _reach(record: RunRecord) -> tuple[RayJobAttempts, dict[str, Any] | None]:
    """The run's RayJob, read once, through the context and namespace its record names (None: gone)."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    from launcher.backends.kuberay.render import Applied

    access = kube_api(record.spec.get("context"))
    namespace = record.spec.get("namespace") or access.namespace
    follower = RayJobAttempts(Applied(namespace, {"metadata": {"name": record.run_id}}, [], True, "ok"), access,
                              Journal(record=record))
    try:
        obj = follower.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, record.run_id)
    except ApiException as exc:
        if exc.status == 404:
            return follower, None
        raise api_error(exc, access, "get rayjobs", namespace) from None
    except HTTPError as exc:
        raise api_error(exc, access, "get rayjobs", namespace) from None
    follower.kueue = KUEUE_QUEUE_LABEL in (obj["metadata"].get("labels") or {})
    return follower, obj


def catch_up(record: RunRecord) -> None:
    """A KubeRay run no launcher follows: its record brought up to the RayJob's state, finished once
    KubeRay has ended it (what `status`, `list` and `logs` read)."""
    if record.exit_code is not None:
        return
    follower, obj = _reach(record)
    if obj is None:
        finish_run(follower.journal, "STOPPED", f"the RayJob {record.run_id} is gone (deleted)")
        return
    follower.queue(obj)
    status = obj.get("status") or {}
    deployment, job_id = status.get("jobDeploymentStatus"), status.get("jobId")
    if job_id and deployment not in NOT_STARTED and not any(item.submission_id == job_id for item in record.attempts):
        follower.journal.emit("attempt.submitted", attempt=len(record.attempts) + 1, submission_id=job_id,
                              address=follower.access.server)
    if deployment in ("Complete", "Failed"):
        if record.attempts and record.attempts[-1].ended_at is None:
            latest, ended = record.attempts[-1], status.get("jobStatus") or "FAILED"
            latest.status, latest.message, latest.ended_at = ended, status.get("message"), time.time()
            follower.journal.emit("attempt.finished", attempt=latest.attempt, submission_id=latest.submission_id,
                                  status=ended, state=ended, message=latest.message)
        finish_run(follower.journal, *outcome(deployment, status.get("jobStatus"), status.get("reason"),
                                                        status.get("message")))
    elif deployment == VALIDATION_FAILED:
        finish_run(follower.journal, "FAILED", f"KubeRay refused RayJob {record.run_id} "
                                                  f"({VALIDATION_FAILED}: {status.get('message') or 'no message'})")
    elif status.get("jobStatus") == "RUNNING" and record.attempts and record.attempts[-1].running_at is None:
        latest = record.attempts[-1]
        latest.status = "RUNNING"
        follower.journal.emit("attempt.running", attempt=latest.attempt, submission_id=latest.submission_id)


def stop_unfollowed(record: RunRecord) -> list[str]:
    """`launcher stop` of a KubeRay run no launcher follows: the RayJob deleted (suspended under Kueue) and
    the run finished STOPPED. The RayJob's name, if it was still there."""
    follower, obj = _reach(record)
    if obj is not None:
        follower.journal.emit("attempt.stopping", attempt=0, submission_id=follower.name, reason="STOPPED",
                              why=follower.stopping(restart=False))
        follower.stop(0, None, False, None)
    if record.exit_code is None:
        done = "was gone" if obj is None else "suspended (Kueue)" if follower.kueue else "deleted"
        finish_run(follower.journal, "STOPPED", f"stopped by `launcher stop` (the RayJob {done})")
    return [record.run_id] if obj is not None else []


def pod_log(record: RunRecord, write: Any, follow: bool) -> bool:
    """`launcher logs` of a KubeRay run's latest attempt while its submitter pod is there: the pod's log
    (followed to its end with `follow`). False when there is no such pod (the saved log is then read)."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    follower, obj = _reach(record)
    if obj is None:
        return False
    try:
        pods = follower.core.list_namespaced_pod(follower.namespace,
                                                 label_selector=f"{JOB_NAME_LABEL}={record.run_id}").items
        if not pods:
            return False
        pod = max(pods, key=lambda item: str(item.metadata.creation_timestamp or "")).metadata.name
        response = follower.core.read_namespaced_pod_log(pod, follower.namespace, follow=follow,
                                                         _preload_content=False)
        try:
            for chunk in response.stream(4096):
                write(chunk.decode("utf-8", "replace"))
        finally:
            response.release_conn()
    except (ApiException, HTTPError) as exc:
        raise api_error(exc, follower.access, "get pods/log", follower.namespace) from None
    return True
