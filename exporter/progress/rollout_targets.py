"""The rollout servers RL runs report (reports of kind "rollout": verl's vLLM/SGLang HTTP servers, which
serve their engine's own /metrics), held for the head exporter's wire.ROLLOUT_SD_PATH.

One bound for every job together, MAX_TARGETS servers: a job's servers are the union of what it reported
(a run may start several sets of servers, verl's standalone and hybrid ones), and a batch that would pass
the bound first lets go of the jobs Ray says have ended (`doubtful`), then of the others that reported
least recently; a job whose own servers pass it is refused (429, nothing kept). They do not expire with time (a server
set is reported once, when it starts): they go when Ray says their job ended (the train collector releases
it) or when room is needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

MAX_TARGETS = 4096  # every job's servers together: 4096 replicas of one GPU each, or 8 runs of 512
JobKey = tuple[str, str]  # (job_id, submission_id) as reported; either may be ""


class TooManyTargets(Exception):
    """One job's servers alone would pass MAX_TARGETS."""


class RolloutTargets:
    """Per job: server (host:port) -> its engine, in the order reported; changed from the event loop only."""

    def __init__(self, limit: int = MAX_TARGETS) -> None:
        self.limit = limit
        self.jobs: dict[JobKey, Mapping[str, str]] = {}  # values replaced whole: readers may hold one
        self._touched: dict[JobKey, float] = {}

    @property
    def count(self) -> int:
        return sum(map(len, self.jobs.values()))

    def plan(self, reports: Iterable[Any]) -> dict[JobKey, dict[str, str]]:
        """Each reporting job's servers once the batch is applied; TooManyTargets when a job alone passes the
        bound. Nothing is changed yet (the rest of the batch may still be refused)."""
        planned: dict[JobKey, dict[str, str]] = {}
        for report in reports:
            key = (report.job_id or "", report.submission_id or "")
            servers = planned.setdefault(key, dict(self.jobs.get(key, {})))
            servers.update((server, report.rollout) for server in report.servers)
        if sum(map(len, planned.values())) > self.limit:
            names = ", ".join(key[1] or key[0] for key in planned)
            raise TooManyTargets(f"job {names}: {sum(map(len, planned.values()))} rollout servers; the exporter "
                                 f"holds at most {self.limit} (every job's together)")
        return planned

    def commit(self, planned: Mapping[JobKey, dict[str, str]], doubtful: Iterable[JobKey], now: float) -> None:
        """Apply a plan, letting go of ended jobs, then of the least recently reported, while over the bound."""
        for key, servers in planned.items():
            self.jobs[key] = MappingProxyType(servers)
            self._touched[key] = now
        ended = set(doubtful)
        for key in sorted((k for k in self.jobs if k not in planned), key=lambda k: (k not in ended, self._touched[k])):
            if self.count <= self.limit:
                break
            self.release([key])

    def last_report(self, key: JobKey) -> float | None:
        return self._touched.get(key)

    def release(self, keys: Iterable[JobKey]) -> None:
        for key in keys:
            self.jobs.pop(key, None)
            self._touched.pop(key, None)
