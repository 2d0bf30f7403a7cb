"""A small fleet of real exporters for the health digest tests: each node is the production
`exporter.serving.server.Exporter` in this process (real HTTP on its own loopback port, its scheduler,
publisher, /metrics, /health/digest), whose collectors emit the samples a test sets; the head is one
more, whose /sd (the ray_head collector's ServiceDiscovery slot, exporter/framework/shared.py, filled
here as that collector fills it from Ray's GCS) lists the nodes, so that it serves /health/fleet.

Only the sources are scripted (what NVML, Ray and the training code would say); everything from the
collectors' sinks to the bytes on the wire is the exporter's own code. All of it runs on one event
loop in a thread of its own; the test drives it with plain calls.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import aiohttp

from exporter.config import load_config
from exporter.contract import digest, wire
from exporter.framework.catalog import CATALOG
from exporter.framework.collector import BlockingCollector, load_collectors
from exporter.framework.shared import ServiceDiscovery, Shared
from exporter.serving.server import Exporter

INTERVAL_S = 0.1
load_collectors()  # the catalog knows every family once every collector module is imported
# The collectors whose families a digest is made of (exporter/contract/digest.py FAMILIES).
SOURCES = sorted({CATALOG.get(name).collector for name in digest.FAMILIES})

Sample = tuple[str, Mapping[str, str], float]


def _collector(source: str, node: Node) -> BlockingCollector:
    """A collector named as the real one (so it may emit that one's families) that emits what the test set."""

    class Scripted(BlockingCollector):
        name = source
        description = f"the {source} families a test sets"
        default_interval = INTERVAL_S

        def collect(self, out: Any) -> None:
            for name, labels, value in list(node.samples):
                spec = CATALOG.get(name)
                if spec is not None and spec.collector == source:
                    out.add(spec, value, **{label: labels.get(label, "") for label in spec.labels})

    return Scripted(node.config, node.shared)


class Node:
    def __init__(self, name: str) -> None:
        self.name = name
        self.samples: list[Sample] = []
        # Series stay fresh for 100 intervals: a loaded machine slowing a collector never drops them.
        self.config = load_config({"listen": "127.0.0.1:0", "progress": {"listen": "off"},
                                   "stale_after_intervals": 100}, environ={})
        self.shared = Shared.for_config(self.config)
        self.exporter = Exporter(self.config, collectors=[_collector(source, self) for source in SOURCES],
                                 shared=self.shared)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.exporter.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"


class Fleet:
    """`nodes` real exporters and a head exporter listing them; use as a context manager."""

    def __init__(self, names: list[str]) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fleet", daemon=True)
        self._thread.start()
        self.nodes = {name: Node(name) for name in names}
        self.head = Node("head")
        self.silent: list[str] = []  # addresses listed where nothing listens

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def __enter__(self) -> Fleet:
        for node in [*self.nodes.values(), self.head]:
            self.call(node.exporter.start())
        self.relist()
        return self

    def relist(self, extra: Mapping[str, str] | None = None) -> None:
        """/sd on the head lists every node (and `extra`: node -> address with nothing behind it)."""
        listed = {**{name: node.address for name, node in self.nodes.items()}, **(extra or {})}
        groups = tuple({"targets": [address], "labels": {"cluster": "c", "node": name}}
                       for name, address in listed.items())
        self.head.shared.service_discovery.publish(ServiceDiscovery("head", groups))

    def set(self, name: str, samples: list[Sample]) -> None:
        """What node `name` sees from now on; returns once its digest says so (and /metrics, rendered with it)."""
        node = self.nodes[name]
        node.samples = samples
        wanted = digest.encode(digest.build(samples))
        deadline = time.monotonic() + 20
        while self.call(_get(node.url + wire.DIGEST_PATH)) != wanted:
            assert time.monotonic() < deadline, f"{name}'s digest never came to say what was set"
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        for node in [*self.nodes.values(), self.head]:
            self.call(node.exporter.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


async def _get(url: str) -> bytes:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.read()
