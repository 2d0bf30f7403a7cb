"""A collector that hangs or raises never blocks the server or the other collectors.

The exporter runs in-process with real HTTP on a loopback port and test collectors that misbehave
on purpose; the framework code under test is the production code.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import load_config
from exporter.framework.catalog import MetricSpec, MetricType
from exporter.framework.collector import AsyncCollector, BlockingCollector
from exporter.serving.server import Exporter

INTERVAL = 0.2
# The hanging collector's one value is served this many intervals (3 s): seconds for the test to see it first.
STALE_AFTER_INTERVALS = 15

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
    # The healthy collector gets a long deadline: a loaded machine may slow it, never fail it.
    config = load_config({"listen": "127.0.0.1:0", "stale_after_intervals": STALE_AFTER_INTERVALS,
                          "collectors": {"healthy": {"deadline_seconds": 30}}}, environ={})
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


async def metrics_when(session: aiohttp.ClientSession, exporter: Exporter, ready: Callable[[str], bool],
                       what: str, timeout: float = 15.0) -> str:
    """/metrics as soon as `ready` holds for it (polled: what the framework guarantees, not when)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        _, text = await get(session, exporter, "/metrics")
        if ready(text):
            return text
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


RAISED = "raypulse_exporter_collector_errors_total"


async def test_failing_collectors_are_isolated_and_counted(exporter):
    exporter, hanging = exporter
    async with aiohttp.ClientSession() as session:
        first = await metrics_when(session, exporter, lambda text: value(text, "raypulse_test_ticks_total") and (
            value(text, RAISED, collector="raising", kind="exception") or 0) > 0, "a first tick and failure")
        assert (await get(session, exporter, "/healthz"))[0] == 200
        second = await metrics_when(session, exporter, lambda text: (
            value(text, "raypulse_test_ticks_total") > value(first, "raypulse_test_ticks_total")
            and value(text, RAISED, collector="raising", kind="exception") >
            value(first, RAISED, collector="raising", kind="exception")
            and value(text, "raypulse_exporter_collector_stuck", collector="hanging") == 1
            and (value(text, RAISED, collector="hanging", kind="busy") or 0) >= 1
            and (value(text, RAISED, collector="async_hanging", kind="timeout") or 0) >= 2),
            "more ticks, more failures, the hanging collector stuck and skipped")

    # The healthy collector kept publishing while the others failed.
    assert value(second, "raypulse_exporter_collector_up", collector="healthy") == 1
    # The raising one is down.
    assert value(second, "raypulse_exporter_collector_up", collector="raising") == 0
    # The hanging one is down, timed out once, and skipped (busy) rather than stacking threads.
    assert value(second, "raypulse_exporter_collector_up", collector="hanging") == 0
    assert value(second, RAISED, collector="hanging", kind="timeout") >= 1
    assert [t.name for t in threading.enumerate()].count("collector-hanging") == 1
    assert hanging.runs == 2
    # A coroutine collector that never answers is cancelled at its deadline each time.
    assert value(second, "raypulse_exporter_collector_up", collector="async_hanging") == 0


async def test_a_stuck_collector_serves_its_last_snapshot_until_stale_then_drops_it(exporter):
    exporter, hanging = exporter
    async with aiohttp.ClientSession() as session:
        await metrics_when(session, exporter, lambda text: value(text, "raypulse_test_hanging_value") == 42,
                           "the first run's value")
        stale = await metrics_when(session, exporter, lambda text: (
            value(text, "raypulse_exporter_collector_stuck", collector="hanging") == 1
            and value(text, "raypulse_test_hanging_value") is None), "the stuck collector's value to go stale")
        assert value(stale, "raypulse_exporter_collector_series", collector="hanging") == 0  # dropped, not frozen
        assert value(stale, "raypulse_test_ticks_total") is not None

        hanging.release.set()  # the source comes back
        recovered = await metrics_when(session, exporter, lambda text: (
            value(text, "raypulse_exporter_collector_up", collector="hanging") == 1
            and value(text, "raypulse_test_hanging_value") == 42), "the collector to recover")
    assert value(recovered, "raypulse_exporter_collector_stuck", collector="hanging") == 0


async def test_readiness_waits_for_every_collector_to_run_once():
    # A long deadline: the hanging first run keeps the collector pending until it is released.
    config = load_config({"listen": "127.0.0.1:0", "collectors": {"hanging": {"deadline_seconds": 60}}}, environ={})
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
            deadline = asyncio.get_running_loop().time() + 15
            while (await get(session, exporter, "/readyz"))[0] != 200:
                assert asyncio.get_running_loop().time() < deadline, "not ready 15 s after the release"
                await asyncio.sleep(0.05)
    finally:
        slow.release.set()
        await exporter.stop()


def nvml_works_here() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_readiness_says_what_the_exporter_cannot_see(start_exporter):
    """A real exporter with no GPU visibility and no Ray process in view (the sidecar without
    shareProcessNamespace or the NVIDIA runtime's GPUs) is ready, and its /readyz body says why it
    serves no GPU or Ray process series; what it does see gets no line."""
    blind = start_exporter("--progress-listen", "off", "--ray-role", "worker",
                           "--ray-node-id", "f" * 56)  # a node that is nowhere: no raylet to watch
    status, _, body = blind.get("/readyz")
    lines = body.decode().splitlines()
    assert status == 200
    assert lines[0] == "ready"
    assert [line for line in lines if line.startswith("ray_processes: no Ray processes visible (")]
    gpu = [line for line in lines if line.startswith("gpu: NVML not available (")]
    if not nvml_works_here():  # the GPU line names NVML's error
        assert gpu
        assert "library_not_found" in gpu[0] or "driver_not_loaded" in gpu[0] or "no_permission" in gpu[0]

    seeing = start_exporter("--progress-listen", "off", "--simulate-gpus", "1", "--no-collector.ray_processes")
    status, _, body = seeing.get("/readyz")
    assert status == 200
    assert body.decode() == "ready\n"
