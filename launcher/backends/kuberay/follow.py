"""Following a RayJob to its end, like any run: KubeRay supervises it (its retries, its deadlines), the
launcher watches and records it in the run's journal, streams the driver's output, and exits with the
run's code.

What KubeRay stores, and how it is read here (rayjob_types.go, rayjob_controller.go):
- the end is the *deployment* status (Complete, Failed), never the Ray job status alone: with retries
  left KubeRay stores `jobStatus: FAILED` beside `jobDeploymentStatus: Retrying`, and on
  DeadlineExceeded `jobStatus` stays RUNNING;
- ValidationFailed is not terminal by KubeRay's own helper: a follower that waits for a terminal state
  waits for ever; here it ends the run as bad input, and the RayJob (which never ran) is deleted so the
  corrected spec can be applied under the same run id;
- each retry has a new `status.jobId`: a new attempt in the journal;
- the driver's output is the submitter Job's pod log (`batch.kubernetes.io/job-name=<RayJob>`); a retry
  replaces that pod, so each attempt's log is saved as it streams.

The RayJob is watched with a field selector on its name; a watch the server closes (they all end) is
opened again from the last resourceVersion, and a 410 (too old) starts again from a fresh list (watched
from the list's resourceVersion: the object's own may be older than the server's compacted history).

With a health policy (launcher/backends/kuberay/heal.py says what is read and how), the watcher checks
the running attempt beside the follow loop. A fault the policy restarts for ends the attempt the one way
KubeRay allows (the RayJob deleted, foreground: its RayCluster, Secret and PodMonitor go first), then the
same RayJob is applied again as the next attempt, with RAYPULSE_RESUME_FROM and a backoffLimit of what is
left of max_retries: one numbering of attempts, one budget, with KubeRay's own retries in between.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.backends.kuberay import render as kuberay
from launcher.backends.kuberay.access import KubeAccess, api_error, kube_api
from launcher.backends.kuberay.render import KUEUE_QUEUE_LABEL
from launcher.errors import BadInput
from launcher.journal import Journal
from launcher.run import Rounds, failures_so_far, finish_run, retry_delay
from launcher.state import RunRecord, stop_requested, write_private

if TYPE_CHECKING:
    from launcher.backends.kuberay.render import Applied
    from launcher.healing import Healing
    from launcher.health.faults import Fault
    from launcher.spec import JobSpec

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # the label Kubernetes puts on a Job's pods
WATCH_SECONDS = 60  # a watch asks the server to close it after this long; it is opened again at once
LOST_AFTER_S = 30.0  # the API server unreachable this long: the run ends as an infrastructure error
POLL_S = 0.5  # how often a stop (Ctrl-C, `launcher stop`) is looked for while nothing changes
LOG_JOIN_S = 5.0  # an ended attempt's log stream gets this long to drain
GONE_WAIT_S = 300.0  # a RayJob deleted to restart it gets this long to go (its pods stop, the finalizer runs)

# KubeRay's failure reasons that are not the job's own failure (the run's infrastructure).
INFRA_REASONS = {"SubmissionFailed", "JobDeploymentStatusTransitionGracePeriodExceeded", "RayClusterFailed"}
VALIDATION_FAILED = "ValidationFailed"


@dataclass
class _Attempt:
    number: int
    job_id: str
    running: bool = False
    ended: bool = False
    log: _PodLog | None = None


@dataclass
class _PodLog:
    """The driver's output of one attempt: the newest submitter pod not seen before, followed to its end."""

    follower: RayJobFollower
    seen: set[str]
    text: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name="rayjob-log", daemon=True).start()

    def _run(self) -> None:
        try:
            pod = self._pod()
            if pod is None:
                return
            response = self.follower.core.read_namespaced_pod_log(pod, self.follower.namespace, follow=True,
                                                                  _preload_content=False)
            try:
                for chunk in response.stream(4096):
                    text = chunk.decode("utf-8", "replace")
                    self.text.append(text)
                    self.follower.journal.reporter.log(text)
            finally:
                response.release_conn()
        except Exception as exc:  # noqa: BLE001 - the log is a courtesy; the run's outcome stands
            self.follower.journal.reporter.warn(f"the driver's log stream ended early: {type(exc).__name__}")
        finally:
            self.done.set()

    def _pod(self) -> str | None:
        """The attempt's submitter pod: KubeRay creates it a moment after the attempt's jobId."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not self.follower.finished.is_set():
            pods = self.follower.core.list_namespaced_pod(
                self.follower.namespace, label_selector=f"{JOB_NAME_LABEL}={self.follower.name}").items
            fresh = sorted((pod for pod in pods if pod.metadata.uid not in self.seen),
                           key=lambda pod: pod.metadata.creation_timestamp or 0)
            if fresh:
                self.seen.add(fresh[-1].metadata.uid)
                return fresh[-1].metadata.name
            time.sleep(POLL_S)
        return None


class RayJobFollower:
    """One RayJob followed to its end; its events go to the run's journal."""

    def __init__(self, applied: Applied, access: KubeAccess, journal: Journal, cancel: threading.Event,
                 healing: Healing | None = None, spec: JobSpec | None = None) -> None:
        from kubernetes import client

        self.access, self.journal, self.cancel = access, journal, cancel
        self.healing, self.spec = healing, spec  # with a health policy: the spec to apply again after a fault
        self.recorder: Rounds | None = None  # the run's recording: a round as each attempt starts and ends
        self.cluster_name: str | None = None  # the current attempt's RayCluster (status.rayClusterName)
        self._generation = 0  # the RayJob applied last; a watch of an earlier one is dropped
        self.namespace = applied.namespace
        self.name = applied.rayjob["metadata"]["name"]
        self.kueue = KUEUE_QUEUE_LABEL in (applied.rayjob["metadata"].get("labels") or {})
        self.custom = client.CustomObjectsApi(access.api_client)
        self.core = client.CoreV1Api(access.api_client)
        self.finished = threading.Event()
        self._updates: queue.Queue[tuple[int, str, dict[str, Any]] | BaseException] = queue.Queue()
        self._attempts: list[_Attempt] = []
        self._pods_seen: set[str] = set()
        self._stopping: str | None = None

    @property
    def record(self) -> RunRecord:
        assert self.journal.record is not None
        return self.journal.record

    # --- the watch -------------------------------------------------------------------------------

    def _watch(self, generation: int) -> None:
        """Feed the RayJob's changes to the follow loop; opened again whenever the server closes it (until
        the RayJob is deleted, or deleted and applied again: that one has a watch of its own)."""
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        version: str | None = None
        while not self.finished.is_set() and generation == self._generation:
            try:
                if version is None:  # a fresh read: the object now, and the list's version to watch from
                    # (the object's own resourceVersion may be older than the server's compacted history)
                    listed = self.custom.list_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PLURAL, field_selector=f"metadata.name={self.name}")
                    if not listed.get("items"):
                        self._updates.put((generation, "DELETED", {}))
                        return
                    version = listed["metadata"].get("resourceVersion")
                    self._updates.put((generation, "MODIFIED", listed["items"][0]))
                stream = watch.Watch().stream(
                    self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                    field_selector=f"metadata.name={self.name}", resource_version=version,
                    timeout_seconds=WATCH_SECONDS, _request_timeout=(5, WATCH_SECONDS + 10))
                for event in stream:
                    obj = event["raw_object"]
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    self._updates.put((generation, event["type"], obj))
                    if self.finished.is_set() or generation != self._generation:
                        break
            except ApiException as exc:
                if exc.status == 410:  # the version is too old to watch from: read the object again
                    version = None
                    continue
                if exc.status == 404:
                    self._updates.put((generation, "DELETED", {}))
                    return
                self._updates.put(exc)
                time.sleep(1)
            except Exception as exc:  # noqa: BLE001 - the loop decides when a lost server ends the run
                self._updates.put(exc)
                time.sleep(1)

    # --- the follow loop ------------------------------------------------------------------------

    def follow(self) -> RunRecord:
        """Follow the RayJob to KubeRay's end of it. BadInput for ValidationFailed (the RayJob is deleted)."""
        self._start_watch()
        lost_since: float | None = None
        try:
            while True:
                if self._stopping is None and self._stop_asked():
                    self._stop()
                fault = self._polled()
                if fault is not None:
                    ended = self._restart(fault)
                    if ended is not None:
                        return ended
                    continue
                try:
                    update = self._updates.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if isinstance(update, BaseException):
                    lost_since = lost_since or time.monotonic()
                    if time.monotonic() - lost_since > LOST_AFTER_S:
                        return self._end("INFRA_ERROR", f"the Kubernetes API server {self.access.server} was "
                                         f"unreachable for {LOST_AFTER_S:.0f}s ({type(update).__name__})")
                    continue
                lost_since = None
                generation, kind, obj = update
                if generation != self._generation:
                    continue  # the RayJob deleted to restart it: its last news is not the run's
                ended = self._observe(kind, obj)
                if ended is not None:
                    return ended
        finally:
            self.finished.set()

    def _observe(self, kind: str, obj: dict[str, Any]) -> RunRecord | None:
        """Take in one version of the RayJob; the run's record when it ended."""
        if kind == "DELETED":
            current = self._attempts[-1] if self._attempts else None
            if current is not None and not current.ended:
                self._attempt_ended(current, "STOPPED", None)
            return self._end("STOPPED", f"the RayJob was deleted ({self._stopping or 'not by this launcher'})")
        status = obj.get("status") or {}
        deployment, job_status = status.get("jobDeploymentStatus"), status.get("jobStatus")
        reason, message = status.get("reason"), status.get("message")
        self.cluster_name = status.get("rayClusterName") or self.cluster_name
        if deployment == VALIDATION_FAILED:
            self._delete()
            raise BadInput(f"KubeRay refused RayJob {self.name} ({VALIDATION_FAILED}: {message or 'no message'}); "
                           "it never ran and was deleted: fix the spec and submit again")
        job_id = status.get("jobId")
        current = self._attempts[-1] if self._attempts else None
        # A new jobId is the next attempt; so is the same one coming back after a retry (a user's
        # --submission-id is the RayJob's spec.jobId, which KubeRay reuses on every retry).
        again = current is not None and current.ended and deployment == "Running" \
            and job_status in ("PENDING", "RUNNING")
        if job_id and (current is None or current.job_id != job_id or again):
            if current is not None and not current.ended:  # KubeRay moved on: the last attempt failed
                self._attempt_ended(current, "FAILED", message)
            current = self._attempt_started(job_id)
        if current is None:
            return None
        if job_status == "RUNNING" and not current.running and deployment not in ("Failed", "Complete"):
            current.running = True
            item = self.record.attempt(current.number)
            if item is not None:
                item.status = "RUNNING"
            self.journal.emit("attempt.running", attempt=current.number, submission_id=current.job_id)
            if self.healing is not None:
                self.healing.running(time.time())
        if deployment == "Retrying" and not current.ended:
            self._attempt_ended(current, job_status or "FAILED", message)
            self.journal.emit("retry.scheduled", attempt=current.number, delay=0, cause="failed")
        elif deployment == "Suspended" and self._stopping:
            if not current.ended:
                self._attempt_ended(current, "STOPPED", message)
            return self._end("STOPPED", f"the RayJob was suspended ({self._stopping})")
        elif deployment in ("Complete", "Failed"):
            state, why = self._outcome(deployment, job_status, reason, message)
            if not current.ended:
                self._attempt_ended(current, job_status or state, message if state != "SUCCEEDED" else None)
            return self._end(state, why)
        return None

    @staticmethod
    def _outcome(deployment: str, job_status: str | None, reason: str | None,
                 message: str | None) -> tuple[str, str | None]:
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

    def _attempt_started(self, job_id: str) -> _Attempt:
        """A new jobId: KubeRay's next attempt (or, following a RayJob again, one the record has already)."""
        followed = {attempt.number for attempt in self._attempts}
        known = next((item for item in self.record.attempts
                      if item.submission_id == job_id and item.attempt not in followed), None)
        number = known.attempt if known is not None else max((item.attempt for item in self.record.attempts),
                                                              default=0) + 1
        attempt = _Attempt(number, job_id)
        self._attempts.append(attempt)
        if known is None:
            self.journal.emit("attempt.submitted", attempt=number, submission_id=job_id, address=self.access.server)
        attempt.log = _PodLog(self, self._pods_seen)
        attempt.log.start()
        if self.healing is not None:
            self.healing.watch(number, job_id)
        if self.recorder is not None:
            self.recorder.record_soon()
        return attempt

    def _attempt_ended(self, attempt: _Attempt, status: str, message: str | None, state: str | None = None) -> None:
        attempt.ended = True
        if self.healing is not None:
            self.healing.pause()  # no checks of an attempt that is over
        if self.recorder is not None:
            self.recorder.record_once()  # its last values, while its pods may still answer
        if attempt.log is not None:
            attempt.log.done.wait(LOG_JOIN_S)
            write_private(self.record.attempt_log(attempt.number), "".join(attempt.log.text))
        item = self.record.attempt(attempt.number)
        if item is not None:
            item.status, item.message = status, message
            item.ended_at = time.time()
        self.journal.emit("attempt.finished", attempt=attempt.number, submission_id=attempt.job_id, status=status,
                          state=state or status, message=message)

    def _end(self, state: str, reason: str | None) -> RunRecord:
        self.finished.set()
        if self.healing is None:
            return finish_run(self.journal, state, reason)
        ratio = self.healing.effective_training_ratio()
        self.healing.close()
        return finish_run(self.journal, state, reason, effective_training_ratio=ratio)

    # --- healing --------------------------------------------------------------------------------

    def _start_watch(self) -> None:
        threading.Thread(target=self._watch, args=(self._generation,), name="rayjob-watch", daemon=True).start()

    def _stop_asked(self) -> bool:
        return self.cancel.is_set() or stop_requested(self.record.run_id)

    def _polled(self) -> Fault | None:
        """The fault a check beside the loop decided for the running attempt, if any (never waits for one)."""
        current = self._attempts[-1] if self._attempts else None
        if self.healing is None or self._stopping or current is None or not current.running or current.ended:
            return None
        return self.healing.poll(None)

    def _restart(self, fault: Fault) -> RunRecord | None:
        """End the faulty attempt (the RayJob deleted) and, by the policy and what is left of max_retries,
        apply it again as the next attempt; the run's record when it ends here instead."""
        assert self.healing is not None
        assert self.spec is not None
        current = self._attempts[-1]
        self.journal.emit("attempt.stopping", attempt=current.number, submission_id=current.job_id,
                          reason="UNHEALTHY", why=f"{fault.summary}; deleting the RayJob")
        self._generation += 1  # the deleted RayJob's watch ends; its news is dropped
        self._delete(foreground=True)
        gone = self._gone()
        self._attempt_ended(current, "STOPPED", fault.summary, state="UNHEALTHY")
        if not gone:
            return self._end("INFRA_ERROR", f"the RayJob {self.name}, deleted to restart it, was still there after "
                             f"{GONE_WAIT_S:.0f}s")
        if self._stop_asked():
            return self._end("STOPPED", "stopped while the attempt was being restarted (the RayJob is deleted)")
        spec = self.spec
        ending = self.healing.end_instead(fault, current.number < spec.max_attempts, spec.max_retries)
        if ending is not None:
            return self._end(*ending)
        node_out = self._keep_out(fault)
        delay = retry_delay(spec, failures_so_far(self.record), node_out)
        self.journal.emit("retry.scheduled", attempt=current.number, delay=delay, cause=fault.kind.value)
        if self._stopped_within(delay):
            return self._end("STOPPED", "stopped during the backoff before a retry (the RayJob is deleted)")
        following = current.number + 1
        limit = spec.active_deadline_seconds
        if limit is not None:  # KubeRay counts it from the RayJob's start: the new one gets what is left
            left = limit - (time.time() - self.record.created_at)
            if left < 1:
                return self._end("DEADLINE_EXCEEDED", f"active_deadline_seconds ({limit}s) passed before the "
                                 "restart")
            spec = spec.model_copy(update={"active_deadline_seconds": int(left)})
        applied = kuberay.apply(spec, self.access, attempt_env=self.healing.attempt_env(following),
                                backoff_limit=spec.max_attempts - following)
        self.kueue = KUEUE_QUEUE_LABEL in (applied.rayjob["metadata"].get("labels") or {})
        self.cluster_name = None
        self._start_watch()
        return None

    def _stopped_within(self, seconds: float) -> bool:
        """Wait out the backoff; True as soon as a stop is asked (Ctrl-C sets `cancel`, `launcher stop` a file)."""
        deadline = time.monotonic() + seconds
        while True:
            if self._stop_asked():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.cancel.wait(min(POLL_S, left))

    def _keep_out(self, fault: Fault) -> bool:
        """The faulty node kept out of the next attempt where the policy allows (cordoned); True if it was."""
        assert self.healing is not None
        if not fault.node_out or fault.node is None:
            return False
        if self.healing.remedy is None:
            self.journal.emit("node.left", node=fault.node, reason=fault.summary,
                              why="health.cordon_nodes is off: the node is not cordoned")
            return False
        return self.healing.remedy_node(fault)

    def _gone(self) -> bool:
        """Wait until the RayJob is gone (True), or GONE_WAIT_S passed."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        deadline = time.monotonic() + GONE_WAIT_S
        while time.monotonic() < deadline:
            try:
                self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
            except ApiException as exc:
                if exc.status == 404:
                    return True
            except HTTPError:
                pass  # the API server blinked: ask again
            time.sleep(POLL_S)
        return False

    # --- stopping -------------------------------------------------------------------------------

    def _stop(self) -> None:
        """Ctrl-C or `launcher stop`: delete the RayJob (under Kueue, suspend it: its quota is given back and
        the RayJob stays for the queue to see). The run ends when the watch sees it go."""
        self._stopping = "stop requested"
        current = self._attempts[-1] if self._attempts else None
        self.journal.emit("attempt.stopping", attempt=current.number if current else 0,
                          submission_id=current.job_id if current else self.name, reason="STOPPED",
                          why="suspending the RayJob (Kueue)" if self.kueue else "deleting the RayJob")
        if self.kueue:
            self._call("patch rayjobs", lambda: self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name, {"spec": {"suspend": True}}))
        else:
            self._delete()

    def _delete(self, foreground: bool = False) -> None:
        """Foreground to restart: the RayJob goes only after what it owns (its Secret among them), so the one
        applied next never finds a Secret the garbage collector is about to take."""
        self._call("delete rayjobs", lambda: self.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name,
            propagation_policy="Foreground" if foreground else "Background"))

    def _call(self, action: str, call: Any) -> None:
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        try:
            call()
        except ApiException as exc:
            if exc.status != 404:  # gone already is what was asked
                raise api_error(exc, self.access, action, self.namespace) from None
        except HTTPError as exc:
            raise api_error(exc, self.access, action, self.namespace) from None


def follow(applied: Applied, access: KubeAccess, journal: Journal, cancel: threading.Event,
           healing: Healing | None = None, spec: JobSpec | None = None) -> RunRecord:
    """Follow the applied RayJob to its end (the journal's record is the run's), healing it by `healing`."""
    return RayJobFollower(applied, access, journal, cancel, healing, spec).follow()


# --- runs nothing follows (--no-wait, a launcher that was killed) ----------------------------------


def _reach(record: RunRecord) -> tuple[RayJobFollower, dict[str, Any] | None]:
    """The run's RayJob, read once, through the context and namespace its record names (None: gone)."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    from launcher.backends.kuberay.render import Applied

    access = kube_api(record.spec.get("context"))
    namespace = record.spec.get("namespace") or access.namespace
    follower = RayJobFollower(Applied(namespace, {"metadata": {"name": record.run_id}}, [], True, "ok"), access,
                              Journal(record=record), threading.Event())
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
    status = obj.get("status") or {}
    deployment, job_id = status.get("jobDeploymentStatus"), status.get("jobId")
    if job_id and not any(item.submission_id == job_id for item in record.attempts):
        follower.journal.emit("attempt.submitted", attempt=len(record.attempts) + 1, submission_id=job_id,
                              address=follower.access.server)
    if deployment in ("Complete", "Failed"):
        if record.attempts and record.attempts[-1].ended_at is None:
            latest, ended = record.attempts[-1], status.get("jobStatus") or "FAILED"
            latest.status, latest.message, latest.ended_at = ended, status.get("message"), time.time()
            follower.journal.emit("attempt.finished", attempt=latest.attempt, submission_id=latest.submission_id,
                                  status=ended, state=ended, message=latest.message)
        finish_run(follower.journal, *follower._outcome(deployment, status.get("jobStatus"), status.get("reason"),
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
        follower._stop()
    if record.exit_code is None:
        done = "was gone" if obj is None else "suspended (Kueue)" if follower.kueue else "deleted"
        finish_run(follower.journal, "STOPPED", f"stopped by `launcher stop` (the RayJob {done})")
    return [record.run_id] if obj is not None else []


def live_log(record: RunRecord, write: Any, follow: bool) -> bool:
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
