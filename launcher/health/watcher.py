"""The watcher: every check interval it reads the exporters, finds the attempt's faults and says
what is new since the last check (a fault is reported once; an exporter that stops answering is
news, and so is its return). It decides nothing about actions: the run does, by its policy.

A check reads one document when the head serves it: every node's health digest as the head
gathered them, only the entries changed since the last check (launcher/health/fleet.py). With
`health.source: prometheus` it asks the user's Prometheus first, one query per rule
(launcher/health/promql.py), and the head's document only while Prometheus cannot say. Otherwise
it reads each exporter itself, only the watched families (exporters.FAMILIES_PATH), If-None-Match
the ETag each gave last: an unchanged node is a 304 whose digest is the last one kept here.

A node that was never read and refuses connections is starting (its exporter starts with the
attempt): it is unreachable only after STARTING_GRACE_S. A node that is not read is judged by no
rule, and never stops a rule for the others (faults.find).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.contract.digest import NOT_READ_YET, REFUSED
from launcher.health import faults as found
from launcher.health.exporters import READ_TIMEOUT_S, Known, NodeRead, TargetSource, read_all
from launcher.health.faults import Attempt, Baseline, Fault, Progress
from launcher.health.fleet import FleetReader
from launcher.health.policy import HealthPolicy
from launcher.health.promql import PromqlReader
from launcher.health.threshold import HangLearner, Threshold

STARTING_GRACE_S = 60.0


@dataclass
class Check:
    """What one check found that is new."""

    faults: list[Fault] = field(default_factory=list)
    unreachable: list[tuple[str, str]] = field(default_factory=list)  # (node, error) that stopped answering
    back: list[str] = field(default_factory=list)  # nodes whose exporter answers again
    progress: Progress | None = None
    reads: list[NodeRead] = field(default_factory=list)
    seconds: float = 0.0  # the check's wall time, from the targets' listing to its last finding
    source: str = "direct"  # where the reads came from: prometheus, head (its fleet document), direct (each exporter)
    threshold: Threshold | None = None  # the hang threshold in force at this check

    @property
    def via_fleet(self) -> bool:
        """Read from the head's fleet document."""
        return self.source == "head"

    @property
    def not_modified(self) -> int:
        """Exporters that answered 304: nothing changed in the watched families since the last check."""
        return sum(1 for read in self.reads if read.not_modified)


class Watcher:
    def __init__(self, policy: HealthPolicy, targets: TargetSource,
                 dead_nodes: Callable[[], list[str]] = list, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, fleet: FleetReader | None = None,
                 promql: PromqlReader | None = None) -> None:
        self.policy = policy
        self._targets = targets
        self.fleet = fleet
        self.promql = promql
        self._dead_nodes = dead_nodes
        self._clock = clock
        self._monotonic = monotonic
        self.attempt: Attempt | None = None
        self._baseline = Baseline()
        self._retired: set[str] = set()  # Ray node ids of nodes taken out: their death is old news
        self._reported: set[str] = set()
        self._unreachable: dict[str, str] = {}
        self._answered: set[str] = set()  # nodes read at least once (their exporter is up: not starting)
        self._listed_at: dict[str, float] = {}  # when each node was first listed (monotonic)
        self._next_check = 0.0
        self._known: Known = {}  # each exporter's last ETag and samples: an unchanged one answers 304
        self.read_timeout = READ_TIMEOUT_S  # one deadline for all of a check's reads
        self.last: Check | None = None
        self.learner = HangLearner()  # the run's pace, for the hang threshold (health.adaptive_hang)

    def watch(self, attempt: Attempt) -> None:
        """From now on, the faults of this attempt (a new one starts with a new baseline)."""
        self.attempt = attempt
        self._baseline = Baseline()
        self.learner.new_attempt()
        self._next_check = 0.0

    def retire(self, node: str) -> None:
        """The node was taken out (replaced, drained): Ray declaring its old node dead later, during the
        next attempt, is not that attempt's fault."""
        self._retired.update(node_id for node_id, name in self._baseline.alive_nodes.items() if name == node)

    def running(self, at: float) -> None:
        if self.attempt is not None and self.attempt.running_at is None:
            self.attempt.running_at = at

    def due(self) -> bool:
        return self.attempt is not None and self._monotonic() >= self._next_check

    def check(self) -> Check:
        """Read every node once (Prometheus's answers, the head's document of them all, or each exporter); what is
        new. Call when due()."""
        assert self.attempt is not None
        began = time.monotonic()
        self._next_check = self._monotonic() + self.policy.check_interval_seconds
        source = "prometheus"
        # A store's answers at fleet size take longer than an exporter's, and reading the nodes instead is
        # what a fleet that size cannot afford: Prometheus gets half the interval, at least the read deadline.
        promql_timeout = max(self.read_timeout, self.policy.check_interval_seconds / 2)
        reads = self.promql.read(promql_timeout, self.attempt.submission_id) if self.promql else None
        if reads is None:
            source = "head"
            reads = self.fleet.read(self.read_timeout, self.policy.check_interval_seconds) if self.fleet else None
        if reads is None:
            source = "direct"
            targets = self._targets()
            listed = {target.url for target in targets}
            for url in [url for url in self._known if url not in listed]:  # nodes gone from /sd: forgotten
                del self._known[url]
            reads = read_all(targets, self._known, self.read_timeout)
        result = Check(source=source, reads=reads)
        self._note_reachability(reads, result)
        self._baseline.take(reads, self._retired)
        now = self._clock()
        usable = [read for read in reads if read.ok]
        result.progress = seen = found.progress(usable, self.attempt.submission_id)
        reported = [at for at in seen.last_report.values() if at >= self.attempt.started_at]
        self.learner.observe(found.jobs(usable, self.attempt.submission_id), max(reported, default=None),
                             seen.newest_step)
        result.threshold = found.hang_threshold(self.policy, self.learner, usable, self.attempt)
        for fault in found.find(self.policy, reads, self.attempt, self._baseline, now, self._dead_nodes(),
                                seen, result.threshold):
            if fault.key not in self._reported:
                self._reported.add(fault.key)
                result.faults.append(fault)
        result.seconds = time.monotonic() - began
        self.last = result
        return result

    def _note_reachability(self, reads: list[NodeRead], result: Check) -> None:
        """Nodes that stop answering, and those that answer again; one starting is neither."""
        now = self._monotonic()
        listed = set()
        for read in reads:
            name = read.target.node
            listed.add(name)
            first = self._listed_at.setdefault(name, now)
            if read.ok:
                self._answered.add(name)
                if self._unreachable.pop(name, None) is not None:
                    result.back.append(name)
                continue
            if name in self._unreachable:
                continue
            error = read.error or "no answer"
            starting = name not in self._answered and not read.answered_before and \
                (error.startswith(REFUSED) or error == NOT_READ_YET)
            if starting and now - first < STARTING_GRACE_S:
                continue
            self._unreachable[name] = error
            result.unreachable.append((name, error))
        if len(self._listed_at) > len(listed):  # nodes no longer listed are forgotten: bounded by the nodes
            for name in [name for name in self._listed_at if name not in listed]:
                self._listed_at.pop(name)
                self._answered.discard(name)
                self._unreachable.pop(name, None)
