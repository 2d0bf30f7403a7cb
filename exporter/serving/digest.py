"""This node's health digest (exporter/contract/digest.py) at wire.DIGEST_PATH: reduced from the same
snapshots /metrics serves, once per rendering of them, with an ETag that If-None-Match can name for a
304. The head's gatherer (exporter/serving/fleet.py) asks every node for it each round."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from exporter.contract import digest
from exporter.framework.snapshot import Snapshot
from exporter.serving.exposition import Publisher

_WATCHED = frozenset(digest.FAMILIES)


@dataclass(frozen=True)
class Served:
    body: bytes
    etag: str


def samples(snapshots: list[Snapshot]) -> Iterator[tuple[str, Mapping[str, str], float]]:
    """The watched families' samples of `snapshots`, as the digest is built from them."""
    for snapshot in snapshots:
        for spec, series in snapshot:
            if spec.name in _WATCHED:
                for values, value in series:
                    yield spec.name, dict(zip(spec.labels, values, strict=True)), value


def render(snapshots: list[Snapshot]) -> Served:
    body = digest.encode(digest.build(samples(snapshots)))
    return Served(body, hashlib.blake2b(body, digest_size=12).hexdigest())


class DigestCache:
    """The digest of the publisher's served snapshots: made off the loop once per rendering (the
    head's lists every Ray node), shared by the requests that ask while it is made."""

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher
        self._made: tuple[int, Served] | None = None
        self._making: tuple[int, asyncio.Future[Served]] | None = None

    async def get(self) -> Served:
        generation = self._publisher.renders
        if self._made is not None and self._made[0] == generation:
            return self._made[1]
        if self._making is None or self._making[0] != generation:
            future = asyncio.ensure_future(asyncio.to_thread(render, self._publisher.latest_snapshots))
            self._making = (generation, future)
        made = await asyncio.shield(self._making[1])
        if self._made is None or self._made[0] < generation:
            self._made = (generation, made)
        return made
