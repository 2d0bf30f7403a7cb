"""How a cluster takes a faulty node out of the next attempt: the protocol each backend's remedy
implements (launcher/backends/: a local cluster replaces the worker, an existing cluster drains the
node through Ray). The health package depends on this protocol only, never on a backend."""

from __future__ import annotations

from typing import Any, Protocol

from launcher.health.faults import Fault
from launcher.state import RunRecord


class NodeRemedy(Protocol):
    """How a cluster takes a faulty node out of the next attempt."""

    def dead_nodes(self) -> list[str]: ...

    def take_out(self, node: str, fault: Fault, for_good: bool) -> tuple[str, dict[str, Any]]:
        """Act; returns the journal event kind (node.replaced, node.drained, node.retired) and its details."""
        ...

    def before_attempt(self, record: RunRecord) -> None:
        """Keep denied hosts out before an attempt starts (their nodes may have come back)."""
        ...
