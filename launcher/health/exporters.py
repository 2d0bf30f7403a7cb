"""What the cluster's exporters serve now: one read of every node's /metrics, kept to the families the
watcher looks at. The watcher asks nothing of Ray: the exporters already collect all of it.

Where the exporters are: a local cluster's record lists them; on an existing cluster the head
exporter's /sd lists every node's (as it does for Prometheus). Exporters under a web config (TLS,
basic auth) are read through the ExporterAccess the launcher keeps for them (state.ExporterAccess).
"""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from exporter import wire
from launcher.state import ExporterAccess

READ_TIMEOUT_S = 3.0
MAX_PARALLEL = 16
# The families the watcher reads; every other line of /metrics is skipped before parsing.
FAMILIES = (
    "raypulse_train_step", "raypulse_train_last_progress_time_seconds", "raypulse_train_nonfinite_values_total",
    "raypulse_rl_last_iteration_time_seconds", "raypulse_rl_iteration",
    "raypulse_train_checkpoint_step", "raypulse_train_last_checkpoint_time_seconds",
    "raypulse_job_output_last_write_time_seconds", "raypulse_job_driver_log_last_write_time_seconds",
    "raypulse_job_processes", "raypulse_gpu_xid_last_timestamp_seconds", "raypulse_gpu_up",
    "raypulse_gpu_ecc_errors_total", "raypulse_gpu_row_remap_failed", "raypulse_gpu_recovery_action",
    "raypulse_ray_node_alive", "raypulse_ray_node_info",
)
_PREFIXES = tuple(name + suffix for name in FAMILIES for suffix in ("{", " "))


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Target:
    node: str  # the launcher's or /sd's name for the node
    url: str  # the exporter's base URL
    access: ExporterAccess | None = None  # TLS trust and credentials, when the exporter has a web config


@dataclass
class NodeRead:
    """One exporter's answer (or why there was none)."""

    target: Target
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def select(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    @property
    def ray_node_ids(self) -> set[str]:
        """The Ray nodes this exporter watches."""
        return {s.labels.get("node_id", "") for s in self.select("raypulse_ray_node_info")} - {""}


def parse(text: str) -> list[Sample]:
    """The watched families' samples of an exposition (other families skipped unparsed)."""
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(_PREFIXES))
    samples = []
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            samples.append(Sample(sample.name, dict(sample.labels), float(sample.value)))
    return samples


def fetch_metrics(url: str, access: ExporterAccess | None, timeout: float = READ_TIMEOUT_S) -> str:
    """An exporter's /metrics text (`url` is its base URL), gzip on the wire, through `access` when
    it has a web config. Raises OSError/ValueError/EOFError as urllib and gzip do."""
    request = urllib.request.Request(url.rstrip("/") + wire.METRICS_PATH, headers={"Accept-Encoding": "gzip"})
    opened = access.urlopen(request, timeout) if access else urllib.request.urlopen(request, timeout=timeout)
    with opened as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return body.decode(errors="replace")


def fetch_sd(sd_url: str, access: ExporterAccess | None, timeout: float = READ_TIMEOUT_S) -> list[dict]:
    """The target groups the head exporter's /sd lists."""
    opened = access.urlopen(sd_url, timeout) if access else urllib.request.urlopen(sd_url, timeout=timeout)
    with opened as response:
        return json.loads(response.read())


def read(target: Target, timeout: float = READ_TIMEOUT_S) -> NodeRead:
    try:
        return NodeRead(target, parse(fetch_metrics(target.url, target.access, timeout)))
    except (OSError, ValueError, EOFError) as exc:  # URLError, timeouts, refused, a broken body
        return NodeRead(target, error=str(getattr(exc, "reason", exc)))


def read_all(targets: Iterable[Target]) -> list[NodeRead]:
    """Every exporter, in parallel; a slow one costs at most READ_TIMEOUT_S."""
    targets = list(targets)
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(targets)), thread_name_prefix="health-read") as pool:
        return list(pool.map(read, targets))


def sd_targets(sd_url: str, timeout: float = READ_TIMEOUT_S, access: ExporterAccess | None = None) -> list[Target]:
    """Every node's exporter as the head exporter's /sd lists them (with `access`: all read through it)."""
    scheme = access.scheme if access else "http"
    found = []
    for group in fetch_sd(sd_url, access, timeout):
        labels = group.get("labels") or {}
        for address in group.get("targets") or []:
            found.append(Target(node=str(labels.get("node") or address), url=f"{scheme}://{address}", access=access))
    return found


TargetSource = Callable[[], list[Target]]


def from_sd(sd_url: str, access: ExporterAccess | None = None) -> TargetSource:
    """A target source that re-reads /sd at every check (nodes come and go); an unreachable /sd
    gives no targets, which the watcher reports."""

    def targets() -> list[Target]:
        try:
            return sd_targets(sd_url, access=access)
        except (OSError, ValueError):
            return []

    return targets
