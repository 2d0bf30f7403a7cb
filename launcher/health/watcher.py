"""The watcher: every check interval it reads the exporters, finds the attempt's faults and says
what is new since the last check (a fault is reported once; an exporter that stops answering is
news, and so is its return). It decides nothing about actions: the run does, by its policy.

A check reads only the watched families (exporters.FAMILIES_PATH), If-None-Match the ETag each
exporter gave last: an unchanged node is a 304 whose samples are the last ones kept here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from launcher.health import faults as found
from launcher.health.exporters import READ_TIMEOUT_S, Known, NodeRead, TargetSource, read_all
from launcher.health.faults import Attempt, Baseline, Fault, Progress
from launcher.health.policy import HealthPolicy


@dataclass
class Check:
    """What one check found that is new."""

    faults: list[Fault] = field(default_factory=list)
    unreachable: list[tuple[str, str]] = field(default_factory=list)  # (node, error) that stopped answering
    back: list[str] = field(default_factory=list)  # nodes whose exporter answers again
    progress: Progress | None = None
    reads: list[NodeRead] = field(default_factory=list)
    seconds: float = 0.0  # the check's wall time, from the targets' listing to its last finding

    @property
    def not_modified(self) -> int:
        """Exporters that answered 304: nothing changed in the watched families since the last check."""
        return sum(1 for read in self.reads if read.not_modified)


class Watcher:
    def __init__(self, policy: HealthPolicy, targets: TargetSource,
                 dead_nodes: Callable[[], list[str]] = list, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._targets = targets
        self._dead_nodes = dead_nodes
        self._clock = clock
        self._monotonic = monotonic
        self.attempt: Attempt | None = None
        self._baseline = Baseline()
        self._retired: set[str] = set()  # Ray node ids of nodes taken out: their death is old news
        self._reported: set[str] = set()
        self._unreachable: dict[str, str] = {}
        self._next_check = 0.0
        self._known: Known = {}  # each exporter's last ETag and samples: an unchanged one answers 304
        self.read_timeout = READ_TIMEOUT_S  # one deadline for all of a check's reads
        self.last: Check | None = None

    def watch(self, attempt: Attempt) -> None:
        """From now on, the faults of this attempt (a new one starts with a new baseline)."""
        self.attempt = attempt
        self._baseline = Baseline()
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
        """Read every exporter once; what is new. Call when due()."""
        assert self.attempt is not None
        began = time.monotonic()
        self._next_check = self._monotonic() + self.policy.check_interval_seconds
        targets = self._targets()
        listed = {target.url for target in targets}
        for url in [url for url in self._known if url not in listed]:  # nodes gone from /sd: forgotten
            del self._known[url]
        reads = read_all(targets, self._known, self.read_timeout)
        result = Check(reads=reads)
        for read in reads:
            name = read.target.node
            if not read.ok and name not in self._unreachable:
                self._unreachable[name] = read.error or "no answer"
                result.unreachable.append((name, read.error or "no answer"))
            elif read.ok and name in self._unreachable:
                del self._unreachable[name]
                result.back.append(name)
        if not self._baseline.taken and reads and all(read.ok for read in reads):
            self._baseline.take(reads, self._retired)
        now = self._clock()
        for fault in found.find(self.policy, reads, self.attempt, self._baseline, now, self._dead_nodes()):
            if fault.key not in self._reported:
                self._reported.add(fault.key)
                result.faults.append(fault)
        result.progress = found.progress([read for read in reads if read.ok], self.attempt.submission_id)
        result.seconds = time.monotonic() - began
        self.last = result
        return result
