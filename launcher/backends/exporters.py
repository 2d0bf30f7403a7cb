"""Where a run's exporters are, for the health watcher and the recorder alike: the ones a local
cluster's record lists, or the ones the head exporter's /sd lists on any other cluster."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from exporter.contract import wire
from launcher.deploy import remote
from launcher.errors import InfraError
from launcher.jobs import JobsClient
from launcher.state import ClusterRecord, ExporterAccess, load_deployment_access

if TYPE_CHECKING:
    from launcher.health.exporters import Target, TargetSource


class ClusterExporters:
    """The exporters a local cluster's record lists: a cluster this run started (its record changes
    as nodes are replaced, so it is asked each time) or a kept one."""

    def __init__(self, record: Callable[[], ClusterRecord | None]) -> None:
        self._record = record

    @property
    def access(self) -> ExporterAccess | None:
        record = self._record()
        return record.exporter_access if record is not None else None

    @property
    def progress_url(self) -> str | None:
        record = self._record()
        return next((ref.progress_url for ref in record.exporters if ref.role == "head"), None) if record else None

    def targets(self) -> list[Target]:
        # The exporters' reader loads with the first read (its /metrics parser and the health digest are not for
        # every command that resolves a backend).
        from launcher.health.exporters import Target

        record = self._record()
        if record is None:
            return []
        # Exporters under a web config are read with the launcher's own credentials and trust.
        return [Target(ref.node, ref.url, record.exporter_access) for ref in record.exporters]

    def sd_url(self) -> str | None:
        record = self._record()  # read each time: a new cluster's exporters start once the job runs
        head = next((ref.url for ref in record.exporters if ref.role == "head"), None) if record else None
        return head + wire.SD_PATH if head else None

    def head_url(self) -> str | None:
        """None: the record names every exporter, by the launcher's own node names, on this machine (a local
        cluster is a few nodes; the head's /sd knows them by their Ray node IPs, which its exporters need
        not listen on)."""
        return None


class DeployedExporters:
    """The exporters of an existing cluster, as its head exporter's /sd lists them. The head exporter
    is found once, when first asked (off the submit's path), and read with the credentials and trust
    of `launcher exporters deploy` when it placed them with a web config."""

    progress_url = None  # the launcher does not publish to a cluster it did not start

    def __init__(self, client: JobsClient) -> None:
        self.client = client
        self.access = load_deployment_access(client.address)
        self._sd_url: str | None = None
        self._targets: TargetSource | None = None
        self._finding = threading.Lock()  # the watcher and the recorder ask from their own threads: found once

    def sd_url(self) -> str:
        from launcher.health.exporters import from_sd  # see ClusterExporters.targets

        with self._finding:
            if self._sd_url is None:
                self._sd_url = head_exporter(self.client, self.access) + wire.SD_PATH
                self._targets = from_sd(self._sd_url, self.access)
            return self._sd_url

    def targets(self) -> list[Target]:
        self.sd_url()
        assert self._targets is not None
        return self._targets()

    def head_url(self) -> str:
        return self.sd_url().removesuffix(wire.SD_PATH)


def head_exporter(client: JobsClient, access: ExporterAccess | None = None) -> str:
    """The head's exporter: the one `launcher exporters deploy` placed there, else the default port on
    the dashboard's host (an exporter started by hand)."""
    try:
        rows = remote.exporters_status(client, access)["nodes"]
        head = next((row["exporter_url"] for row in rows if row["role"] == "head" and row["exporter_url"]), None)
        if head:
            return head
    except (InfraError, OSError, KeyError):
        pass
    host = urlsplit(client.address).hostname or "127.0.0.1"
    return f"http://{host}:{wire.EXPORTER_PORT}"
