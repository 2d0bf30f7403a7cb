"""Ray's Jobs API as a run's Jobs (what local and existing clusters share): attempt n is submitted as the
launcher's submission id for it, read, streamed and stopped through the cluster's dashboard; and a
recorded run reached again the same way (`launcher status`, `logs`, `stop`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from launcher.backends.base import NodeLogs, Seen, Submission
from launcher.errors import BadInput, InfraError
from launcher.jobs import TERMINAL, JobsClient
from launcher.journal import Journal
from launcher.run import entrypoint_options, finish_run, job_metadata, runtime_env, seen_of, update_attempt
from launcher.spec import JobSpec
from launcher.state import RunRecord, request_stop, write_private


class RayJobs:
    """A run's attempts as Ray jobs on one cluster, through its Jobs API."""

    names_attempts = True
    retries_itself = False
    restart_removes_pods = False

    def __init__(self, client: JobsClient, spec: JobSpec) -> None:
        self.client, self.spec = client, spec
        self.address = client.address
        self.token = client.dashboard.token

    def status(self, attempt: int, sid: str | None) -> Seen | None:
        assert sid is not None
        details = self.client.details(sid)
        return seen_of(details) if details is not None else None

    def submit(self, sid: str | None, submission: Submission) -> None:
        assert sid is not None
        attempt = submission.attempt
        try:
            self.client.submit(sid, self.spec.entrypoint, runtime_env(self.spec, attempt, submission.traceparent,
                                                                      submission.env),
                               job_metadata(self.spec, attempt, submission.trace_id), **entrypoint_options(self.spec))
        except (ValueError, TypeError) as exc:  # Ray's client checks the runtime env before it sends it
            raise BadInput(f"runtime_env: Ray's client refused attempt {attempt}: {exc}") from exc
        except RuntimeError as exc:  # (the cause is Ray's own error, which the journal keeps)
            if "status code 4" in str(exc):
                raise BadInput(f"the cluster refused attempt {attempt}: {exc}") from exc
            raise InfraError(f"submitting attempt {attempt} failed: {exc}") from exc

    def stop(self, attempt: int, sid: str | None, restart: bool, why: str | None) -> None:
        assert sid is not None
        self.client.stop(sid)

    def stopping(self, restart: bool) -> str | None:
        return None

    def follow_logs(self, attempt: int, sid: str | None, write: Callable[[str], None]) -> threading.Thread:
        assert sid is not None
        return self.client.follow_logs(sid, write)

    def logs(self, attempt: int, sid: str | None) -> str:
        assert sid is not None
        return self.client.logs(sid)


class OnRayJobs:
    """A recorded run of a backend whose attempts are Ray jobs, reached through its `reach` client."""

    reach: ClassVar[Callable[[RunRecord, Path | None], JobsClient | None]]  # each backend's own

    @classmethod
    def refresh(cls, record: RunRecord, token_path: Path | None = None) -> None:
        client = cls.reach(record, token_path)
        if client is None:
            return
        for attempt in record.attempts:
            details = client.details(attempt.submission_id)
            if details is not None:
                update_attempt(record, attempt.attempt, seen_of(details))
        if record.detached:
            catch_up(record, client)  # nobody else keeps its record up to date

    @classmethod
    def live_log(cls, record: RunRecord, attempt: int, write: Callable[[str], None], follow: bool,
                 token_path: Path | None = None) -> bool:
        client = cls.reach(record, token_path)
        chosen = record.attempt(attempt)
        return chosen is not None and client is not None and stream_log(client, chosen.submission_id, write, follow)

    @classmethod
    def node_logs(cls, record: RunRecord, token_path: Path | None = None) -> NodeLogs | None:
        return None  # Ray's own nodes keep their logs; the driver's is `launcher logs`

    @classmethod
    def stop_recorded(cls, record: RunRecord, token_path: Path | None = None) -> list[str]:
        return stop_attempts(cls.reach(record, token_path), record, record)


def stream_log(client: JobsClient, sid: str, write: Callable[[str], None], follow: bool) -> bool:
    """A job's log from its cluster (followed to its end with `follow`); False when the cluster has no such job."""
    if client.details(sid) is None:
        return False
    if follow:
        client.follow_logs(sid, write).join()
    else:
        write(client.logs(sid))
    return True


def stop_attempts(client: JobsClient | None, known: RunRecord, record: RunRecord | None) -> list[str]:
    """Stop the unfinished attempts of a run (`known`: as the cluster or this machine knows it) and tell its
    launcher (of the run `record`, if recorded here) not to retry. The submission ids stopped."""
    stopped = []
    if client is not None:
        for attempt in known.attempts:
            details = client.details(attempt.submission_id)
            if details is not None and details.status.value not in TERMINAL:
                stopped.append(attempt.submission_id)
    if record is not None:
        request_stop(record.run_id)  # first, so that the run's launcher does not retry the attempt stopped below
    for attempt_id in stopped:
        assert client is not None
        # The run's own launcher may see the request and stop it first: either way it is stopped.
        client.stop(attempt_id)
    Journal(run_id=known.run_id).emit("run.stop_requested", stopped=stopped,
                                      trace_id=record.trace_id if record else None)
    return stopped


def catch_up(record: RunRecord, client: JobsClient) -> None:
    """A detached run's record (launcher/detach.py) after its attempts were refreshed from `client`: its
    state, and once its latest attempt has ended, the run finished with that attempt's state and every log
    saved."""
    latest = record.attempts[-1] if record.attempts else None
    if latest is None or record.exit_code is not None:
        return
    if latest.status not in TERMINAL:
        if record.state != latest.status:
            record.state = latest.status
            record.save()
        return
    for attempt in record.attempts:
        path = record.attempt_log(attempt.attempt)
        if attempt.status in TERMINAL and not path.exists():
            with contextlib.suppress(Exception):  # the log is a courtesy; the run's result stands
                write_private(path, client.logs(attempt.submission_id))  # 0600: a log may print secrets
    finish_run(Journal(record=record), latest.status, latest.message if latest.status == "FAILED" else None)
