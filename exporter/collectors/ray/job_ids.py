"""Which Ray job id goes with which submission id, from the Jobs API, read only when an id is new.

Workers know their Ray job id, drivers of submitted jobs their submission id, training code
either or both; every job series carries both, so the node-side collectors look the other up
here. The list is read at once when an id never seen shows up, then again with a doubling wait
while some id stays unknown (a submitted job gets its Ray job id only when its driver connects,
and one whose entrypoint never connects never does), so an unresolvable id costs little.
It also remembers which jobs have ended, for whoever wants to let go of them (`standing`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from exporter.collectors.ray.dashboard import DashboardSession

FIRST_RETRY_SECONDS = 2.0
MAX_RETRY_SECONDS = 60.0
ENDED = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})  # Ray's terminal job statuses


class JobDirectory:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._submission_by_job: dict[str, str] = {}
        self._job_by_submission: dict[str, str] = {}
        self._read_at = -float("inf")
        self._wait = FIRST_RETRY_SECONDS
        self._asked: set[str] = set()  # ids already looked for, resolved or not
        self._ended: set[str] = set()  # job and submission ids of jobs that have ended
        self._listed: set[str] = set()  # every id in the latest listing
        self.listed_once = False

    def submission_of(self, job_id: str) -> str:
        return self._submission_by_job.get(job_id, "")

    def job_of(self, submission_id: str) -> str:
        return self._job_by_submission.get(submission_id, "")

    def resolve(self, job_id: str, submission_id: str) -> tuple[str, str]:
        """Fill in whichever of (job_id, submission_id) is missing, if known."""
        return job_id or self.job_of(submission_id), submission_id or self.submission_of(job_id)

    def standing(self, job_id: str, submission_id: str) -> str:
        """"running", "ended", or "unknown" (not in Ray's latest listing); "running" until one was read."""
        ids = {i for i in (job_id, submission_id) if i}
        if not self.listed_once or not ids:
            return "running"
        if ids & self._ended:
            return "ended"
        return "running" if ids & self._listed else "unknown"

    def older_than(self, seconds: float) -> bool:
        """Whether the latest listing was read more than `seconds` ago (or never)."""
        return self._clock() - self._read_at >= seconds

    def _unknown(self, pairs: Iterable[tuple[str, str]]) -> set[str]:
        unknown = set()
        for job_id, submission_id in pairs:
            if job_id and job_id not in self._submission_by_job:
                unknown.add(job_id)
            if submission_id and submission_id not in self._job_by_submission:
                unknown.add(submission_id)
        return unknown

    def due(self, pairs: Iterable[tuple[str, str]]) -> bool:
        pairs = list(pairs)
        unknown = self._unknown(pairs)
        new = unknown - self._asked
        self._asked = (self._asked & {i for pair in pairs for i in pair}) | unknown  # only ids still in use
        if new:
            self._wait = FIRST_RETRY_SECONDS / 2  # read now, then after 2 s, 4 s, ...
            return True
        return bool(unknown) and self._clock() - self._read_at >= self._wait

    async def refresh(self, api: DashboardSession) -> None:
        self._read_at = self._clock()
        self._wait = min(MAX_RETRY_SECONDS, self._wait * 2)
        listed = await api.json("/api/jobs/")
        if not isinstance(listed, list):
            return
        by_job, by_submission = {}, {}
        ended, seen = set(), set()
        for job in listed:
            if not isinstance(job, dict):
                continue
            job_id, submission_id = str(job.get("job_id") or ""), str(job.get("submission_id") or "")
            ids = {i for i in (job_id, submission_id) if i}
            seen |= ids
            if job.get("status") in ENDED:
                ended |= ids
            if job_id:
                by_job[job_id] = submission_id
            if submission_id and job_id:  # a job id appears when the driver connects; ask again until then
                by_submission[submission_id] = job_id
        self._submission_by_job, self._job_by_submission = by_job, by_submission
        self._ended, self._listed, self.listed_once = ended, seen, True
