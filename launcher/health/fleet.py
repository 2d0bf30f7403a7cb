"""Every node's health digest in one read: the head exporter's fleet document (wire.FLEET_PATH,
exporter/serving/fleet.py), asked for the nodes whose entry changed since the last answer and kept
here between checks, so that a check of a 10,000-node run costs one bounded read and the entries
that changed.

The head is foreign input like any exporter: the read has one deadline and size caps, and the
document is strictly parsed whole (a hostile or broken head gives no document, never a wrong one).
A head that serves none (an exporter older than the fleet document, one under a web config, not the
head) is asked again after RETRY_AFTER_S; meanwhile the watcher reads each exporter itself.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable

from pydantic import ValidationError

from exporter.contract import wire
from exporter.contract.digest import FleetDocument, FleetEntry
from launcher.health.exporters import NodeRead, ReadError, Target, get
from launcher.state import ExporterAccess

RETRY_AFTER_S = 60.0
# A 10,000-node document whose every node changed is ~6 MB (8 GPUs and 8 ranks a node); gzip makes it ~1.
MAX_WIRE_BYTES = 32 * 2**20
MAX_INFLATED_BYTES = 128 * 2**20


class FleetReader:
    """The head's fleet document, read once per check; None from read() when there is none to read."""

    def __init__(self, url: Callable[[], str | None], access: Callable[[], ExporterAccess | None],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._url = url  # the head exporter's base URL (None: not known yet)
        self._access = access
        self._monotonic = monotonic
        self._generation: str | None = None
        self._cursor: int | None = None
        self._entries: dict[str, tuple[FleetEntry, Target]] = {}  # by the node's target
        self._retry_at = 0.0
        self.why_not: str | None = None  # why the last check read no document

    def read(self, timeout: float, interval: float) -> list[NodeRead] | None:
        """Every node the head lists, as it last read them; None: no document (the watcher reads the nodes)."""
        if self._monotonic() < self._retry_at:
            return None
        base = self._url()
        if not base:
            return None
        query = {wire.FLEET_INTERVAL_PARAM: f"{interval:g}"}
        if self._cursor is not None and self._generation is not None:
            query |= {wire.FLEET_SINCE_PARAM: str(self._cursor), wire.FLEET_GENERATION_PARAM: self._generation}
        access = self._access()
        try:
            body = get(f"{base.rstrip('/')}{wire.FLEET_PATH}?{urllib.parse.urlencode(query)}", access, timeout,
                       accept_gzip=True, max_wire_bytes=MAX_WIRE_BYTES, max_inflated_bytes=MAX_INFLATED_BYTES)
            document = FleetDocument.model_validate_json(body)
        except (ReadError, ValidationError) as exc:
            self.why_not = str(exc) if isinstance(exc, ReadError) else "a fleet document that does not parse"
            self._retry_at = self._monotonic() + RETRY_AFTER_S
            self._cursor = None  # what is kept may be stale by then: the next document is asked for whole
            return None
        self.why_not = None
        return self._apply(document, access)

    def _apply(self, document: FleetDocument, access: ExporterAccess | None) -> list[NodeRead]:
        if document.full:
            kept, self._entries = self._entries, {}
        else:
            kept = self._entries
        changed = set()
        for entry in document.nodes:
            before = kept.get(entry.target)
            target = before[1] if before is not None and before[1].node.startswith(entry.node) else \
                Target(entry.node, f"http://{entry.target}", access)
            self._entries[entry.target] = (entry, target)
            changed.add(entry.target)
        if document.full:
            self._name_apart()
        self._generation, self._cursor = document.generation, document.cursor
        return [NodeRead(target, error=(entry.error or "no digest") if entry.digest is None else None,
                         digest=entry.digest,
                         not_modified=key not in changed, answered_before=entry.answered)
                for key, (entry, target) in self._entries.items()]


    def _name_apart(self) -> None:
        names = names_apart([(entry.node, entry.target) for entry, _ in self._entries.values()])
        for (key, (entry, target)), name in zip(list(self._entries.items()), names, strict=True):
            if name != entry.node and target.node == entry.node:  # a name once told apart stays so
                self._entries[key] = (entry, Target(name, target.url, target.access))


def names_apart(nodes: list[tuple[str, str]]) -> list[str]:
    """Each (node, exporter) pair's name: nodes listed under one name (Ray nodes on one host, named by its
    IP) get their exporter's address beside it, since a node's name is what its events and faults say,
    one node each."""
    seen: dict[str, int] = {}
    for node, _ in nodes:
        seen[node] = seen.get(node, 0) + 1
    return [f"{node} ({exporter})" if seen[node] > 1 else node for node, exporter in nodes]
