"""Talking to a Ray cluster's Jobs API: Ray's JobSubmissionClient with our token header, after
checking that the cluster is reachable, new enough and accepts the token.

Ray's client reads RAY_ADDRESS / RAY_API_SERVER_ADDRESS and lets them override the address it is
given; the launcher has already resolved its target (launcher/target.py reads them for `submit`),
so the client is built without them.

Ray's client calls `requests` with no timeout, follows redirects and reads whatever comes: a dashboard that
accepts a request and never answers held the launcher forever (SIGTERM waited behind the read), a 307 sent
the token, --headers and the job's runtime env to another host, and an answer's size had no bound. Here
every request has one deadline for its whole answer (REQUEST_TIMEOUT_S; an upload UPLOAD_TIMEOUT_S) and
is read within the bounds of every dashboard answer (launcher/raydash.py: the reads' reaper cuts the
connection at the deadline, a redirect is refused, an answer is read up to MAX_ANSWER_BYTES). A failed
or cut request is an OSError, which the follow loop counts against the loss limit (a dashboard silent past
it: the cluster is lost). What an answer holds is checked as strictly: one that is not what Ray's Jobs API
answers is a ClusterLost (a job row that is not, in a list, is left out: anyone can submit a job).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from packaging.version import Version

from exporter.contract import wire
from launcher.errors import BadInput, InfraError
from launcher.raydash import CONNECT_TIMEOUT_S, RayDashboard, bounded

MIN_RAY_VERSION = Version("2.6")
MAX_VERSION_CHARS = 64  # of /api/version's ray_version
ADDRESS_VARIABLES = (wire.ENV_RAY_API_SERVER_ADDRESS, wire.ENV_RAY_ADDRESS)  # Ray's precedence
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
# One call to the Jobs API, its whole answer: a status poll, a submit, a stop, a list. Short: a SIGTERM is
# seen between calls (a pod's grace period is 30 s), and the loss limit (launcher/run.py) spans several.
REQUEST_TIMEOUT_S = 5.0
LOGS_TIMEOUT_S = 60.0  # a job's whole log (`launcher logs`): up to MAX_ANSWER_BYTES
UPLOAD_TIMEOUT_S = 300.0  # a request with a body to send (a working_dir's package: megabytes)


class TargetError(BadInput):
    """The cluster cannot be used as given (unreachable, too old, token missing or refused)."""


class ClusterLost(InfraError):
    """The cluster stopped answering while a job ran."""


def read_token(token_path: Path | None) -> str | None:
    """The Ray auth token: --token-path, else where Ray looks (wire.ray_auth_token)."""
    try:
        return wire.ray_auth_token(os.environ, token_path=token_path)
    except wire.RayTokenUnreadable as exc:
        if exc.path is None:  # RAY_AUTH_TOKEN itself
            raise TargetError(f"{exc.source}: {exc.reason}") from None
        raise TargetError(f"{exc.source}: cannot read the token file {exc.path}: {exc.reason}") from None


@contextlib.contextmanager
def _without_address_env() -> Iterator[None]:
    saved = {key: os.environ.pop(key) for key in ADDRESS_VARIABLES if key in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


class JobsClient:
    """One cluster's Jobs API. Construction checks the cluster; errors say what to fix."""

    def __init__(self, address: str, token: str | None, field: str = "address", headers: dict[str, str] | None = None,
                 verify: bool | str | None = None) -> None:
        # headers and verify: `ray job submit --headers/--verify` (an existing cluster behind a proxy, or
        # with its own CA); the token's Authorization header wins over one given there.
        self.dashboard = RayDashboard(address, token, headers, verify)
        self.address = self.dashboard.address
        self.headers = self.dashboard.headers
        self.verify = True if verify is None else verify
        self.ray_version = self._check(field)
        # Ray's client logs uploads and closed log streams at INFO on stderr, between the job's own
        # lines; the launcher reports what matters itself.
        logging.getLogger("ray").setLevel(logging.WARNING)
        with _without_address_env():
            self._client = _bounded_client()(self.address, headers=self.headers, verify=self.verify)

    def _check(self, field: str) -> str:
        try:
            status, body = self.dashboard.get("/api/version")
            if status == 200:
                status, _ = self.dashboard.get("/api/jobs/")  # the version endpoint may be open; this one is not
        except OSError as exc:
            reason = getattr(exc, "reason", exc)
            raise TargetError(f"{field}: cannot reach the Ray dashboard at {self.address}: {reason}") from None
        if status == 401:
            raise TargetError(f"token: the cluster at {self.address} requires a Ray auth token; set RAY_AUTH_TOKEN "
                              "or RAY_AUTH_TOKEN_PATH, or pass --token-path")
        if status == 403:
            raise TargetError(f"token: the cluster at {self.address} refused the token; check --token-path, "
                              "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH")
        if status != 200:
            raise TargetError(f"{field}: {self.address} did not answer like a Ray dashboard (HTTP {status})")
        version = _ray_version(body)
        if version is None:
            raise TargetError(f"{field}: {self.address}/api/version did not name a Ray version (a JSON object with "
                              "ray_version, as Ray's dashboard answers); is this a Ray dashboard?")
        if version < MIN_RAY_VERSION:
            raise TargetError(f"{field}: the cluster at {self.address} runs Ray {version}; the launcher needs Ray >= "
                              f"{MIN_RAY_VERSION} (Jobs API with submission ids and metadata). Upgrade the cluster.")
        return str(version)

    # --- jobs ---------------------------------------------------------------------------------

    def details(self, submission_id: str) -> Any | None:
        """Ray's JobDetails, or None when no job has this submission id."""
        try:
            with self._answer("a job's details"):
                return self._client.get_job_info(submission_id)
        except ClusterLost:
            raise
        except RuntimeError as exc:
            if "status code 404" in str(exc):
                return None
            raise ClusterLost(f"the Jobs API at {self.address} failed: {exc}") from None
        except OSError as exc:
            raise ClusterLost(f"lost contact with the Ray dashboard at {self.address}: {exc}") from None

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any],
               metadata: dict[str, str], **entrypoint_options: Any) -> None:
        """Submit one Ray job; entrypoint_options: entrypoint_num_cpus/_num_gpus/_memory/_resources."""
        self._client.submit_job(entrypoint=entrypoint, submission_id=submission_id,
                                runtime_env=runtime_env or None, metadata=metadata, **entrypoint_options)

    def stop(self, submission_id: str) -> bool:
        try:
            return self._client.stop_job(submission_id)
        except (RuntimeError, OSError):
            return False

    def logs(self, submission_id: str) -> str:
        with self._answer("a job's log"):
            return self._client.get_job_logs(submission_id)

    def list(self) -> list[Any]:
        """Every job's JobDetails; a row that is not one is left out (anyone can submit a job: one row must
        not hide the others)."""
        with self._answer("the list of jobs"):
            return self._client.list_jobs()

    @contextlib.contextmanager
    def _answer(self, what: str) -> Iterator[None]:
        """An answer that is not what Ray's Jobs API answers (not JSON, nested past the parser, not its
        shape, a status Ray has not): ClusterLost, in one line that quotes none of it."""
        try:
            yield
        except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
            raise ClusterLost(f"the Jobs API at {self.address} answered {what} in a form Ray's does not have "
                              f"({type(exc).__name__}); is this a Ray dashboard?") from None

    def follow_logs(self, submission_id: str, write: Callable[[str], None]) -> threading.Thread:
        """Stream the job's log to `write` from a thread until the job ends (or the socket closes)."""
        import asyncio  # for Ray's log tail only: not at every command's start

        async def tail() -> None:
            async for chunk in self._client.tail_job_logs(submission_id):
                write(chunk)

        def run() -> None:
            with contextlib.suppress(Exception):  # a closed socket ends the stream; the caller catches up
                asyncio.run(tail())

        thread = threading.Thread(target=run, name=f"logs-{submission_id}", daemon=True)
        thread.start()
        return thread


def _ray_version(body: bytes) -> Version | None:
    """The version in Ray's /api/version answer ({"ray_version": "2.40.0", ...}); None for anything else."""
    try:
        answer = json.loads(body)
        version = answer.get("ray_version") if isinstance(answer, dict) else None
        return Version(version) if isinstance(version, str) and len(version) <= MAX_VERSION_CHARS else None
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested past the parser, not a version
        return None


@functools.cache
def _bounded_client() -> type:
    """Ray's JobSubmissionClient, every request bounded (the module's docstring): its own requests go
    through `_do_request`, which passes keyword arguments on to `requests.request`. Made at the first
    client (importing Ray is not for every launcher command)."""
    from ray.dashboard.modules.job.pydantic_models import JobDetails
    from ray.job_submission import JobSubmissionClient

    class BoundedJobSubmissionClient(JobSubmissionClient):
        def list_jobs(self) -> list[Any]:
            """Ray's list_jobs, a row that is not a JobDetails left out."""
            response = self._do_request("GET", "/api/jobs/")
            if response.status_code != 200:
                self._raise_error(response)
            rows = response.json()
            if not isinstance(rows, list):
                raise TypeError("not a list of jobs")
            jobs = []
            for row in rows:
                with contextlib.suppress(TypeError, ValueError):  # pydantic's ValidationError is a ValueError
                    jobs.append(JobDetails(**row))
            return jobs

        def _do_request(self, method: str, endpoint: str, *, data: bytes | None = None,
                        json_data: dict | None = None, **kwargs: Any) -> Any:
            timeout = UPLOAD_TIMEOUT_S if data is not None else LOGS_TIMEOUT_S if endpoint.endswith("/logs") \
                else REQUEST_TIMEOUT_S
            deadline = time.monotonic() + timeout
            kwargs.setdefault("timeout", (min(CONNECT_TIMEOUT_S, timeout), timeout))
            return super()._do_request(method, endpoint, data=data, json_data=json_data, allow_redirects=False,
                                       hooks={"response": lambda response, **_: bounded(response, deadline,
                                                                                         timeout)}, **kwargs)

    return BoundedJobSubmissionClient
