"""A collector that hangs or raises never blocks the server or the other collectors.

The exporter runs in-process with real HTTP on a loopback port and test collectors that misbehave
on purpose; the framework code under test is the production code.
"""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.catalog import MetricSpec, MetricType
from exporter.collector import AsyncCollector, BlockingCollector
from exporter.config import load_config
from exporter.server import Exporter

INTERVAL = 0.2
STALE_AFTER_INTERVALS = 3

TICKS = MetricSpec("raypulse_test_ticks_total", MetricType.COUNTER, "Runs of the healthy collector.", (), "healthy")
HANGING_VALUE = MetricSpec("raypulse_test_hanging_value", MetricType.GAUGE, "Set by the first run.", (), "hanging")


class Healthy(BlockingCollector):
    name = "healthy"
    description = "Counts its own runs."
    default_interval = INTERVAL
    runs = 0

    def collect(self, out):
        self.runs += 1
        out.add(TICKS, self.runs)


class Raising(BlockingCollector):
    name = "raising"
    description = "Always raises."
    default_interval = INTERVAL

    def collect(self, out):
        raise PermissionError("cannot read /proc/something")


class Hanging(BlockingCollector):
    """Succeeds once, then blocks (like a wedged NVML call) until released."""

    name = "hanging"
    description = "Hangs after its first run."
    default_interval = INTERVAL

    def __init__(self, config):
        super().__init__(config)
        self.release = threading.Event()
        self.runs = 0

    def collect(self, out):
        self.runs += 1
        if self.runs > 1:
            self.release.wait()
        out.add(HANGING_VALUE, 42)


class AsyncHanging(AsyncCollector):
    name = "async_hanging"
    description = "An HTTP source that never answers."
    default_interval = INTERVAL

    async def collect(self, out):
        await asyncio.sleep(3600)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, name: str, **labels) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


@pytest.fixture
async def exporter():
    config = load_config({"listen": "127.0.0.1:0", "stale_after_intervals": STALE_AFTER_INTERVALS}, environ={})
    hanging = Hanging(config)
    exporter = Exporter(config, collectors=[Healthy(config), Raising(config), hanging, AsyncHanging(config)])
    await exporter.start()
    yield exporter, hanging
    hanging.release.set()
    await exporter.stop()


async def get(session: aiohttp.ClientSession, exporter: Exporter, path: str) -> tuple[int, str]:
    # A short client timeout: a blocked server would fail the test instead of stalling it.
    async with session.get(f"http://127.0.0.1:{exporter.port}{path}",
                           timeout=aiohttp.ClientTimeout(total=2)) as response:
        return response.status, await response.text()


async def test_failing_collectors_are_isolated_and_counted(exporter):
    exporter, hanging = exporter
    async with aiohttp.ClientSession() as session:
        await asyncio.sleep(INTERVAL * 2.5)
        status, first = await get(session, exporter, "/metrics")
        assert status == 200
        assert (await get(session, exporter, "/healthz"))[0] == 200

        await asyncio.sleep(INTERVAL * 3)
        _, second = await get(session, exporter, "/metrics")

    # The healthy collector kept publishing while the others failed.
    assert value(second, "raypulse_test_ticks_total") > value(first, "raypulse_test_ticks_total")
    assert value(second, "raypulse_exporter_collector_up", collector="healthy") == 1

    # The raising one is down and counts every failure.
    assert value(second, "raypulse_exporter_collector_up", collector="raising") == 0
    raised = "raypulse_exporter_collector_errors_total"
    assert value(second, raised, collector="raising", kind="exception") > value(
        first, raised, collector="raising", kind="exception") > 0

    # The hanging one is down, marked stuck, and skipped (busy) rather than stacking threads.
    assert value(second, "raypulse_exporter_collector_up", collector="hanging") == 0
    assert value(second, "raypulse_exporter_collector_stuck", collector="hanging") == 1
    assert value(second, raised, collector="hanging", kind="timeout") >= 1
    assert value(second, raised, collector="hanging", kind="busy") >= 1
    assert [t.name for t in threading.enumerate()].count("collector-hanging") == 1
    assert hanging.runs == 2

    # A coroutine collector that never answers is cancelled at its deadline each time.
    assert value(second, "raypulse_exporter_collector_up", collector="async_hanging") == 0
    assert value(second, raised, collector="async_hanging", kind="timeout") >= 2


async def test_a_stuck_collector_serves_its_last_snapshot_until_stale_then_drops_it(exporter):
    exporter, hanging = exporter
    stale_after = INTERVAL * STALE_AFTER_INTERVALS
    async with aiohttp.ClientSession() as session:
        await asyncio.sleep(INTERVAL * 0.5)
        _, fresh = await get(session, exporter, "/metrics")
        assert value(fresh, "raypulse_test_hanging_value") == 42  # first run succeeded

        await asyncio.sleep(stale_after + INTERVAL * 2)
        _, stale = await get(session, exporter, "/metrics")
        assert value(stale, "raypulse_test_hanging_value") is None  # dropped, not frozen
        assert value(stale, "raypulse_exporter_collector_series", collector="hanging") == 0
        assert value(stale, "raypulse_test_ticks_total") is not None

        hanging.release.set()  # the source comes back
        await asyncio.sleep(INTERVAL * 3)
        _, recovered = await get(session, exporter, "/metrics")
    assert value(recovered, "raypulse_exporter_collector_up", collector="hanging") == 1
    assert value(recovered, "raypulse_exporter_collector_stuck", collector="hanging") == 0
    assert value(recovered, "raypulse_test_hanging_value") == 42


async def test_readiness_waits_for_every_collector_to_run_once():
    config = load_config({"listen": "127.0.0.1:0"}, environ={})
    slow = Hanging(config)
    slow.runs = 1  # every run hangs, the first included
    exporter = Exporter(config, collectors=[slow])
    await exporter.start()
    try:
        async with aiohttp.ClientSession() as session:
            status, body = await get(session, exporter, "/readyz")
            assert status == 503
            assert "hanging" in body
            assert (await get(session, exporter, "/healthz"))[0] == 200
            assert (await get(session, exporter, "/metrics"))[0] == 200
            slow.release.set()
            await asyncio.sleep(INTERVAL * 2)
            assert (await get(session, exporter, "/readyz"))[0] == 200
    finally:
        slow.release.set()
        await exporter.stop()
