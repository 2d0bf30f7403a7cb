"""Every node's health digest from the user's Prometheus (`health.source: prometheus`): the path for a
fleet past one head exporter's reach, where a Prometheus (sharded, or behind a store such as Thanos or
Mimir) already scrapes every node and does the fan-in.

One instant query per rule (RULES: one per family a digest is made of, exporter/contract/digest.py
FAMILIES), each aggregated by the node's labels and only those the digest reads, so an answer holds one
short series per rank or GPU fault, never every node's exposition. The samples of each node (by its
`node` label and its target, `instance`) become its digest through the one reduction every path uses
(`digest.build`), so a fault is the same fault however the node was read.

Which nodes are the run's: the clusters (the label contract's cluster label) where the job's series are
(its processes, progress reports or logs, by its submission id: SCOPE_FAMILIES), so a Prometheus that
scrapes many clusters gives this run's alone. A target of those clusters that Prometheus shows down
(`up == 0`) is blind, an entry that says so, never a missing one; one that was never up in the last hour
may be starting (the watcher's grace, launcher/health/watcher.py).

Prometheus is foreign input: every query goes through launcher/promql.py (deadline, size caps, strict
parse). A check whose queries do not all answer gives no document (the watcher reads the head's, else
each exporter) and Prometheus is asked again at the next check: unlike an older head, which will not
start serving a document, a store that was slow once (a compaction, a restart) is usually not slow at
the next check, and reading every exporter meanwhile is what a large fleet cannot afford.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pydantic import ValidationError

from alerts.config import DEFAULT as ALERTS
from exporter.contract import digest
from exporter.contract.labels import LabelContract
from launcher.health.exporters import NodeRead, ReadError, Target
from launcher.health.fleet import names_apart
from launcher.promql import Prometheus, VectorSample

# An answer of every rank of a 10,000-node run (8 ranks a node) is ~8 MB of JSON; gzip makes it ~1.
MAX_WIRE_BYTES = 32 * 2**20
MAX_INFLATED_BYTES = 128 * 2**20
PARALLEL = 8  # queries in flight at once: Prometheus evaluates them, the launcher only waits
INSTANCE = "instance"  # Prometheus's own label for a scrape target (host:port)
DOWN = "down in Prometheus (up == 0)"
NOT_A_DIGEST = "series in Prometheus past a digest's bounds"
EVER_UP_WINDOW = "1h"  # a target down now that was up within this window answered before (not starting)
# The job's series that say which clusters are the run's: its processes, its ranks' reports, its driver's
# log (the head's, as soon as the driver runs); one of them is there whatever the job reports.
SCOPE_FAMILIES = ("raypulse_job_processes", *digest.PROGRESS_TIME, *digest.OUTPUT_TIME)


@dataclass(frozen=True)
class Rule:
    """One family's query: aggregated by the node and `by`, with extra `matchers` and a `keep` filter."""

    family: str
    aggregate: str  # how the node's series of one label set combine: as digest.build() reduces them
    by: tuple[str, ...] = ()
    job: bool = True  # the submission's own series (else the GPU's and Ray's, of the run's clusters)
    matchers: str = ""
    keep: str = ""  # a filter on the aggregate: only what can be a fault comes back


RANKED = ("rank",)
GPU = ("gpu", "uuid")
RULES = (
    Rule("raypulse_train_step", "max", RANKED),
    Rule("raypulse_rl_iteration", "max", RANKED),
    *(Rule(family, "max", RANKED) for family in digest.PROGRESS_TIME),
    Rule("raypulse_train_first_step", "min", RANKED),
    Rule("raypulse_train_first_progress_time_seconds", "min", RANKED),
    Rule("raypulse_train_nonfinite_values_total", "sum", (*RANKED, "field"), matchers=',field="loss"', keep=" > 0"),
    Rule("raypulse_train_reports_total", "max"),
    Rule(digest.PHASE_START, "min", ("phase",)),
    Rule(digest.PHASE_SECONDS, "max", ("phase",)),
    Rule("raypulse_train_checkpoint_step", "max"),
    *(Rule(family, "max") for family in (digest.CHECKPOINT_SECONDS, digest.CHECKPOINT_TIME, digest.CHECKPOINTS)),
    *(Rule(family, "max") for family in digest.OUTPUT_TIME),
    Rule("raypulse_job_processes", "max", keep=" > 0"),
    Rule("raypulse_gpu_xid_last_timestamp_seconds", "max", (*GPU, "xid"), job=False),
    Rule("raypulse_gpu_up", "min", GPU, job=False, keep=" == 0"),
    Rule("raypulse_gpu_row_remap_failed", "max", GPU, job=False, keep=" == 1"),
    Rule("raypulse_gpu_recovery_action", "max", GPU, job=False, keep=" > 0"),
    Rule("raypulse_gpu_ecc_errors_total", "sum", (*GPU, "type"), job=False,
         matchers=f',type=~"{"|".join(digest.UNCORRECTED)}"', keep=" > 0"),
    Rule("raypulse_ray_node_alive", "max", ("node_id", "node_ip"), job=False),
    Rule("raypulse_ray_node_info", "max", ("node_id",), job=False),
)
assert sorted(rule.family for rule in RULES) == sorted(digest.FAMILIES), "a digest family without its rule"


def quoted(value: str) -> str:
    """A PromQL string literal (its escapes are Go's, which JSON's are a subset of)."""
    return json.dumps(value)


class Queries:
    """The PromQL of one submission's checks: which clusters are the run's (`scope`), then each rule's
    expression and the listing of the targets, for those clusters."""

    def __init__(self, submission_id: str, labels: LabelContract = ALERTS.labels) -> None:
        self.labels = labels
        self._job = f"{labels.selector},submission_id={quoted(submission_id)}"
        self.node = (labels.node, INSTANCE)
        named = "|".join(SCOPE_FAMILIES)
        self.scope = f'group by ({labels.cluster}) ({{__name__=~"{named}",{self._job}}})'

    def clusters(self, scope: list[VectorSample]) -> str:
        """The matchers of the run's clusters, from the scope's answer (a cluster label absent: "")."""
        names = sorted({item.metric.get(self.labels.cluster, "") for item in scope})
        return f",{self.labels.cluster}=~{quoted('|'.join(re.escape(name) for name in names))}"

    def rule(self, rule: Rule, clusters: str) -> str:
        # The job's rules keep its submission id, which digest.build() groups by: every label an answer's
        # sample carries is one the digest reads, passed on as it comes.
        by = ", ".join((*self.node, *(("submission_id",) if rule.job else ()), *rule.by))
        selector = self._job if rule.job else f"{self.labels.selector}{clusters}"
        return f"{rule.aggregate} by ({by}) ({rule.family}{{{selector}{rule.matchers}}}){rule.keep}"

    def listing(self, clusters: str) -> str:
        """Every target of the run's clusters: 2 up, 1 down now but up within the window, 0 never up."""
        up = f"up{{{self.labels.selector}{clusters}}}"
        return f"{up} + max_over_time({up}[{EVER_UP_WINDOW}])"


class PromqlReader:
    """The run's nodes as Prometheus has them, read once per check; None from read() when it cannot say."""

    def __init__(self, url: str, labels: LabelContract = ALERTS.labels) -> None:
        self.prometheus = Prometheus(url, max_wire_bytes=MAX_WIRE_BYTES, max_inflated_bytes=MAX_INFLATED_BYTES)
        self._labels = labels
        self._queries: tuple[str, Queries] | None = None  # by the submission they ask for
        self._pool: ThreadPoolExecutor | None = None
        self.why_not: str | None = None  # why the last check read no document

    def read(self, timeout: float, submission_id: str) -> list[NodeRead] | None:
        """Every target of the run's clusters with its digest, or why it has none; None: Prometheus could not
        say (the watcher reads the head's document, else each exporter)."""
        if self._queries is None or self._queries[0] != submission_id:
            self._queries = (submission_id, Queries(submission_id, self._labels))
        queries = self._queries[1]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="promql")
        deadline = time.monotonic() + timeout
        try:
            scope = self._query(queries.scope, deadline)
            if not scope:
                self.why_not = (f"Prometheus {self.prometheus.shown} has no series of submission {submission_id} "
                                "yet")
                return None  # asked again at the next check: the job is starting
            clusters = queries.clusters(scope)
            asked = [queries.listing(clusters), *(queries.rule(rule, clusters) for rule in RULES)]
            listing, *answers = self._pool.map(lambda expr: self._query(expr, deadline), asked)
        except ReadError as exc:  # PrometheusError among them
            self.why_not = f"{exc} (the check's queries share one {timeout:g}s deadline)"
            return None
        self.why_not = None
        return self._reads(listing, answers)

    def _query(self, expr: str, deadline: float) -> list[VectorSample]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ReadError(f"Prometheus {self.prometheus.shown}: no time left")
        return self.prometheus.query(expr, timeout=left)

    def _reads(self, listing: list[VectorSample], answers: list[list[VectorSample]]) -> list[NodeRead]:
        node_label = self._labels.node
        samples: dict[tuple[str, str], list[tuple[str, dict[str, str], float]]] = {}
        for rule, answer in zip(RULES, answers, strict=True):
            for item in answer:
                labels = item.metric
                key = (labels.get(node_label, ""), labels.get(INSTANCE, ""))
                samples.setdefault(key, []).append((rule.family, labels, item.value[1]))
        state = {(item.metric.get(node_label, ""), item.metric.get(INSTANCE, "")): item.value[1] for item in listing}
        keys = [*state, *(key for key in samples if key not in state)]
        names = names_apart([(node or instance, instance) for node, instance in keys])
        reads = []
        for (node, instance), name in zip(keys, names, strict=True):
            target = Target(name, f"http://{instance}")
            up = state.get((node, instance), 2.0)
            if up < 2:
                reads.append(NodeRead(target, error=DOWN if up >= 1 else digest.NOT_READ_YET, answered_before=up >= 1))
                continue
            try:
                made = digest.build(samples.get((node, instance), ()))
            except ValidationError:  # past a digest's bounds (a label too long, too many ranks): that node's alone
                reads.append(NodeRead(target, error=NOT_A_DIGEST, answered_before=True))
                continue
            reads.append(NodeRead(target, digest=made))
        return reads
