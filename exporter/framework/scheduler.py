"""Runs every collector on its own interval with a deadline, and keeps their health.

One task per collector. A blocking collector runs in one of a few long-lived daemon threads
(`Workers`: a thread per run would make the event loop wait for each new thread to start, and
spread the heap over more malloc arenas); when it misses its deadline the run is abandoned (never
joined), the collector is marked stuck and keeps its thread, and no new run starts until that
thread returns, so a wedged source costs one thread, not one per interval. A successful run
publishes an immutable snapshot; a failed one keeps the previous snapshot until it is older than
`stale_after_intervals` intervals, after which its series are dropped rather than served frozen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import queue
import threading
import time
from collections.abc import Callable, Sequence
from importlib.metadata import version

from exporter import __version__
from exporter.config import ExporterConfig
from exporter.framework import selfmetrics
from exporter.framework.collector import AsyncCollector, BlockingCollector, Collector
from exporter.framework.snapshot import SampleSink, Snapshot

log = logging.getLogger(__name__)

ERROR_KINDS = ("exception", "timeout", "busy", "partial")
_PROMETHEUS_CLIENT_VERSION = version("prometheus-client")


class CollectorRunner:
    """One collector, its schedule and its health."""

    def __init__(self, collector: Collector, interval: float, deadline: float, stale_after_intervals: float,
                 on_change: Callable[[], None]) -> None:
        self.collector = collector
        self.name = collector.name
        self.interval = interval
        self.deadline = deadline
        self.stale_after = interval * stale_after_intervals
        self.snapshot: Snapshot | None = None
        self.up = False
        self.attempted = False
        self.runs = 0
        self.errors = dict.fromkeys(ERROR_KINDS, 0)
        self.last_success_time: float | None = None
        self.last_duration: float | None = None
        self._in_flight: asyncio.Future[SampleSink] | None = None
        self._on_change = on_change
        self._failing_since_logged = False

    @property
    def stuck(self) -> bool:
        return self._in_flight is not None and not self._in_flight.done()

    def fresh_snapshot(self, now: float) -> Snapshot | None:
        """The last good snapshot unless it is too old to serve (`now` on the monotonic clock)."""
        if self.snapshot is not None and now - self.snapshot.taken_at <= self.stale_after:
            return self.snapshot
        return None

    def expires_at(self) -> float | None:
        return None if self.snapshot is None else self.snapshot.taken_at + self.stale_after

    async def run_once(self) -> None:
        loop = asyncio.get_running_loop()
        if self.stuck:
            self._record_failure("busy", "previous run has not returned yet")
            self._on_change()
            return
        self.runs += 1
        started = loop.time()
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # races with the result, and shutdown would then wait for a task that never ends.
            async with asyncio.timeout(self.deadline):
                sink = await self._start(loop)
        except TimeoutError:
            self._record_failure("timeout", f"no result within {self.deadline:g}s")
        except Exception as exc:  # a collector bug or an unreadable source: count it, keep serving
            self._record_failure("exception", f"{type(exc).__name__}: {exc}")
            log.debug("collector %s raised", self.name, exc_info=True)
        else:
            self._in_flight = None
            self.snapshot = sink.freeze(loop.time())
            self.up = True
            self.last_success_time = time.time()
            self.errors["partial"] += sink.partial_errors
            if self._failing_since_logged:
                log.info("collector %s recovered", self.name)
                self._failing_since_logged = False
        finally:
            self.last_duration = loop.time() - started
            self.attempted = True
            self._on_change()

    def _start(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[SampleSink]:
        if isinstance(self.collector, AsyncCollector):
            return asyncio.ensure_future(self._collect_async())
        assert isinstance(self.collector, BlockingCollector)
        self._in_flight = _run_in_worker(loop, self.collector)
        # shield: a timeout abandons the wait, not the thread's future, so `stuck` stays true.
        return asyncio.shield(self._in_flight)

    async def _collect_async(self) -> SampleSink:
        sink = SampleSink(self.name)
        assert isinstance(self.collector, AsyncCollector)
        await self.collector.collect(sink)
        return sink

    def _record_failure(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        self.up = False
        if not self._failing_since_logged:
            log.warning("collector %s failed (%s): %s", self.name, kind, detail)
            self._failing_since_logged = True


class Workers:
    """Daemon threads that run blocking collections, kept between runs: a run takes an idle thread or,
    when every one is busy (or stuck), starts one; a thread idle for `idle_seconds` ends. A thread is
    named after the collector it runs (`collector-gpu`) and `collector-idle` between runs."""

    def __init__(self, idle_seconds: float = 60.0) -> None:
        self.idle_seconds = idle_seconds
        # queue.Queue, not SimpleQueue: CPython's SimpleQueue.get(timeout) can block past its timeout until a
        # later put, when another thread took the item it woke for (its retry waits with a negative timeout,
        # i.e. forever: Modules/_queuemodule.c, 3.11), so an idle thread would never end.
        self._runs: queue.Queue[Callable[[], None]] = queue.Queue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a run, less the runs queued for them

    def submit(self, run: Callable[[], None]) -> None:
        with self._lock:
            self._runs.put(run)
            if self._idle:
                self._idle -= 1
                return
        threading.Thread(target=self._work, name="collector-idle", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                run = self._runs.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle:  # more threads wait than runs are queued: this one may end
                        self._idle -= 1
                        return
                continue  # a run was queued for this thread just now
            run()
            threading.current_thread().name = "collector-idle"
            with self._lock:
                self._idle += 1


WORKERS = Workers()


def _run_in_worker(loop: asyncio.AbstractEventLoop, collector: BlockingCollector) -> asyncio.Future[SampleSink]:
    """Run one collection in a worker thread (daemon: a stuck one must never block interpreter exit)."""
    future: asyncio.Future[SampleSink] = loop.create_future()
    # A late failure nobody awaits any more must not be logged as "never retrieved".
    future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def settle(result: SampleSink | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        threading.current_thread().name = f"collector-{collector.name}"
        sink = SampleSink(collector.name)
        try:
            collector.collect(sink)
        except BaseException as exc:  # noqa: BLE001  (handed to the event loop, not swallowed)
            outcome: tuple[SampleSink | None, BaseException | None] = (None, exc)
        else:
            outcome = (sink, None)
        with contextlib.suppress(RuntimeError):  # the loop closed while we were stuck: shutting down
            loop.call_soon_threadsafe(settle, *outcome)

    WORKERS.submit(target)
    return future


class Scheduler:
    """Owns the runners, their tasks, and the framework's self metrics."""

    def __init__(self, collectors: Sequence[Collector], config: ExporterConfig,
                 on_change: Callable[[], None]) -> None:
        self.runners: list[CollectorRunner] = []
        for collector in collectors:
            settings = config.collector_settings(collector.name)
            interval = settings.interval_seconds or collector.default_interval
            deadline = settings.deadline_seconds or interval
            self.runners.append(CollectorRunner(collector, interval, deadline, config.stale_after_intervals,
                                                on_change))
        self.started_at = time.time()
        self._tasks: list[asyncio.Task[None]] = []
        # Parts outside the collectors (the OTLP pusher) add their health to the self snapshot.
        self.self_reporters: list[Callable[[SampleSink], None]] = []

    def start(self) -> None:
        for runner in self.runners:
            self._tasks.append(asyncio.create_task(self._run_forever(runner), name=f"collector-{runner.name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for runner in self.runners:
            if not runner.stuck:  # never touch a collector whose thread may still be inside it
                runner.collector.close()

    @staticmethod
    async def _run_forever(runner: CollectorRunner) -> None:
        loop = asyncio.get_running_loop()
        next_run = loop.time()
        while True:
            await runner.run_once()
            next_run += runner.interval
            now = loop.time()
            if next_run < now:  # a slow run: skip the missed ticks, keep the phase
                next_run += ((now - next_run) // runner.interval + 1) * runner.interval
            await asyncio.sleep(next_run - now)

    @property
    def ready(self) -> bool:
        return all(runner.attempted for runner in self.runners)

    def pending(self) -> list[str]:
        return [runner.name for runner in self.runners if not runner.attempted]

    def snapshots(self, now: float) -> list[Snapshot]:
        """Fresh collector snapshots plus the self-metrics snapshot, as of `now` (monotonic)."""
        fresh = [s for s in (runner.fresh_snapshot(now) for runner in self.runners) if s is not None]
        return [*fresh, self._self_snapshot(now)]

    def next_expiry(self, now: float) -> float | None:
        """When the next served snapshot goes stale (monotonic), if any will."""
        expiries = [e for e in (runner.expires_at() for runner in self.runners) if e is not None and e > now]
        return min(expiries, default=None)

    def _self_snapshot(self, now: float) -> Snapshot:
        out = SampleSink(selfmetrics.EXPORTER)
        out.add_info(selfmetrics.BUILD_INFO, version=__version__, python_version=platform.python_version(),
                     prometheus_client_version=_PROMETHEUS_CLIENT_VERSION)
        out.add(selfmetrics.START_TIME, self.started_at)
        for runner in self.runners:
            name = runner.name
            snapshot = runner.fresh_snapshot(now)
            out.add(selfmetrics.COLLECTOR_UP, runner.up, collector=name)
            out.add(selfmetrics.COLLECTOR_LAST_SUCCESS, runner.last_success_time, collector=name)
            out.add(selfmetrics.COLLECTOR_DURATION, runner.last_duration, collector=name)
            out.add(selfmetrics.COLLECTOR_INTERVAL, runner.interval, collector=name)
            out.add(selfmetrics.COLLECTOR_RUNS, runner.runs, collector=name)
            out.add(selfmetrics.COLLECTOR_STUCK, runner.stuck, collector=name)
            out.add(selfmetrics.COLLECTOR_SERIES, snapshot.series_count() if snapshot else 0, collector=name)
            for kind, count in runner.errors.items():
                out.add(selfmetrics.COLLECTOR_ERRORS, count, collector=name, kind=kind)
        for report in self.self_reporters:
            report(out)
        return out.freeze(now)
