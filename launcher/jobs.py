"""Talking to a Ray cluster's Jobs API: Ray's JobSubmissionClient with our token header, after
checking that the cluster is reachable, new enough and accepts the token.

Ray's client reads RAY_ADDRESS / RAY_API_SERVER_ADDRESS and lets them override the address it is
given; the launcher has already resolved its target (launcher/target.py reads them for `submit`),
so the client is built without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from packaging.version import Version

from exporter.contract import wire
from launcher.errors import BadInput, InfraError
from launcher.raydash import RayDashboard

MIN_RAY_VERSION = Version("2.6")
ADDRESS_VARIABLES = (wire.ENV_RAY_API_SERVER_ADDRESS, wire.ENV_RAY_ADDRESS)  # Ray's precedence
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


class TargetError(BadInput):
    """The cluster cannot be used as given (unreachable, too old, token missing or refused)."""


class ClusterLost(InfraError):
    """The cluster stopped answering while a job ran."""


def read_token(token_path: Path | None) -> str | None:
    """The Ray auth token: --token-path, else where Ray looks (wire.ray_auth_token)."""
    try:
        return wire.ray_auth_token(os.environ, token_path=token_path)
    except wire.RayTokenUnreadable as exc:
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
        from ray.job_submission import JobSubmissionClient

        # Ray's client logs uploads and closed log streams at INFO on stderr, between the job's own
        # lines; the launcher reports what matters itself.
        logging.getLogger("ray").setLevel(logging.WARNING)
        with _without_address_env():
            self._client = JobSubmissionClient(self.address, headers=self.headers, verify=self.verify)

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
        try:
            version = json.loads(body)["ray_version"]
        except (ValueError, KeyError) as exc:
            raise TargetError(f"{field}: {self.address}/api/version did not name a Ray version ({exc})") from None
        if Version(version) < MIN_RAY_VERSION:
            raise TargetError(f"{field}: the cluster at {self.address} runs Ray {version}; the launcher needs Ray >= "
                              f"{MIN_RAY_VERSION} (Jobs API with submission ids and metadata). Upgrade the cluster.")
        return version

    # --- jobs ---------------------------------------------------------------------------------

    def details(self, submission_id: str) -> Any | None:
        """Ray's JobDetails, or None when no job has this submission id."""
        try:
            return self._client.get_job_info(submission_id)
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
        return self._client.get_job_logs(submission_id)

    def list(self) -> list[Any]:
        return self._client.list_jobs()

    def follow_logs(self, submission_id: str, write: Callable[[str], None]) -> threading.Thread:
        """Stream the job's log to `write` from a thread until the job ends (or the socket closes)."""

        async def tail() -> None:
            async for chunk in self._client.tail_job_logs(submission_id):
                write(chunk)

        def run() -> None:
            with contextlib.suppress(Exception):  # a closed socket ends the stream; the caller catches up
                asyncio.run(tail())

        thread = threading.Thread(target=run, name=f"logs-{submission_id}", daemon=True)
        thread.start()
        return thread
