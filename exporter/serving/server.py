"""The exporter's HTTP server: serves pre-rendered bytes, never collects in a request.

    /metrics   Prometheus text 0.0.4, or OpenMetrics when the Accept header asks; gzip on request;
               ?name[]=A&name[]=B serves only those families; an ETag, and 304 to If-None-Match with it
    /healthz   the process is alive (never depends on collection)
    /readyz    every collector has run once; the body says what it cannot see (no NVML, no Ray processes)
    /          a landing page
    /sd        on the Ray head: Prometheus HTTP service discovery of every node's exporter (and
               node_exporter, when node_exporter.discover says so)
    /sd/ray    on the Ray head: every Ray node's metrics agent (what reports through ray.util.metrics)
    /sd/rollout  on the Ray head: the rollout servers RL runs reported (their engine's own /metrics)
    /health/digest  this node's health digest (exporter/serving/digest.py), ETag and 304 as /metrics
    /health/fleet   on the Ray head: every node's digest, gathered by the head (exporter/serving/fleet.py)

It also owns the training progress endpoint (a listener of its own, exporter/progress/endpoint.py)
and the OTLP pusher. What the parts hand each other goes through `Shared` (exporter/framework/shared.py).
Both ports are bounded by one `Guard` (exporter/serving/guard.py: connections, idle and slow clients,
scrapes at once, no compressed request bodies); client mistakes are 4xx and counted
(exporter/serving/httplog.py), never a 500.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import math
import os
import signal
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.helpers import ETAG_ANY, ETag
from prometheus_client.exposition import choose_encoder, gzip_accepted

from exporter import __version__, redact
from exporter.config import ExporterConfig, parse_listen
from exporter.contract import wire
from exporter.framework.catalog import CATALOG
from exporter.framework.collector import Collector
from exporter.framework.scheduler import Scheduler
from exporter.framework.shared import ServiceDiscovery, Shared
from exporter.plugins import enabled_collectors
from exporter.progress.endpoint import ProgressEndpoint
from exporter.serving import httplog
from exporter.serving.digest import DigestCache
from exporter.serving.exposition import Format, Publisher
from exporter.serving.fleet import FleetGatherer, FleetThread, listing_of
from exporter.serving.guard import Guard, GuardedTCPSite, identity_bodies_only, runner_options
from exporter.serving.nodeexporter_sd import node_exporter_groups

if TYPE_CHECKING:
    from exporter.serving.otlp import OtlpPusher
    from exporter.serving.webconfig import Middleware, WebConfig

log = logging.getLogger(__name__)


def negotiate(accept: str) -> Format:
    """prometheus_client's negotiation picks the format (we serve its canonical version); an Accept
    header it cannot parse (it raises on `version=x.y`) gets the text format, as if it had said nothing."""
    try:
        _, negotiated = choose_encoder(accept)
    except (TypeError, ValueError):
        return Format.TEXT
    return Format.OPENMETRICS if negotiated.startswith("application/openmetrics-text") else Format.TEXT


def not_modified(if_none_match: tuple[ETag, ...] | None, etag: str) -> bool:
    """If-None-Match's weak comparison (RFC 9110 13.1.2): `*`, or any listed tag, weak or not, equal to ours."""
    if not if_none_match:
        return False
    return any(tag.value in (etag, ETAG_ANY) for tag in if_none_match)


class Exporter:
    """Scheduler + publisher + aiohttp application; `start()`/`stop()` for tests and `serve()`."""

    def __init__(self, config: ExporterConfig, collectors: Sequence[Collector] | None = None,
                 web_config: WebConfig | None = None, shared: Shared | None = None) -> None:
        self.config = config
        # exporter.serving.webconfig (its models are ~1 MB) is loaded only where a web config is given.
        if web_config is None and config.web_config_file is not None:
            from exporter.serving.webconfig import load_web_config

            web_config = load_web_config(config.web_config_file)
        self.web_config = web_config  # None: plain HTTP, no auth
        self._ssl: ssl.SSLContext | None = None
        if web_config is not None and web_config.tls_server_config:
            from exporter.serving.webconfig import ssl_context

            self._ssl = ssl_context(web_config.tls_server_config)
        self.shared = shared or Shared.for_config(config)
        self.collectors = list(collectors) if collectors is not None else enabled_collectors(config, self.shared)
        self.guard = Guard(config.http)
        self.progress = ProgressEndpoint(config.progress, self.shared.progress, guard=self.guard,
                                         logger=httplog.LOGGER)
        self.publisher: Publisher | None = None
        self.digests: DigestCache | None = None
        self.fleet = FleetThread(FleetGatherer(self._fleet_listing))
        self.scheduler: Scheduler | None = None
        self._runner: web.AppRunner | None = None
        self._publisher_task: asyncio.Task[None] | None = None
        self._otlp: OtlpPusher | None = None
        self.port: int | None = None

    @property
    def scheme(self) -> str:
        return "https" if self._ssl else "http"

    def make_app(self) -> web.Application:
        # A compressed body is refused before anything else (no auth work for it); then the web config's
        # (rate limit, headers, client SANs, basic auth): a request refused by them never holds one of the
        # scrape slots.
        configured: list[Middleware] = []
        if self.web_config is not None:
            from exporter.serving.webconfig import middlewares

            configured = middlewares(self.web_config)
        app = web.Application(middlewares=[identity_bodies_only, *configured, self.guard.scrape_limit()])
        app.router.add_get(wire.METRICS_PATH, self._metrics)
        app.router.add_get(wire.HEALTH_PATH, self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/", self._index)
        app.router.add_get(wire.SD_PATH, self._sd)
        app.router.add_get(wire.RAY_SD_PATH, self._ray_sd)
        app.router.add_get(wire.ROLLOUT_SD_PATH, self._rollout_sd)
        app.router.add_get(wire.DIGEST_PATH, self._digest)
        app.router.add_get(wire.FLEET_PATH, self._fleet)
        return app

    async def start(self) -> None:
        scheduler = self.scheduler = Scheduler(self.collectors, self.config, on_change=self._changed)
        self.publisher = Publisher(scheduler.snapshots, scheduler.next_expiry)
        self.digests = DigestCache(self.publisher)
        scheduler.self_reporters.append(self.guard.report)
        self._start_otlp(scheduler)
        await self.publisher.render_now()
        self._publisher_task = asyncio.create_task(self.publisher.run(), name="publisher")
        self.shared.progress_endpoint_up.publish(await self.progress.start())
        self.scheduler.start()
        host, port = parse_listen(self.config.listen)
        self._runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False, logger=httplog.LOGGER,
                                     **runner_options(self.config.http))
        await self._runner.setup()
        site = GuardedTCPSite(self._runner, host, port, self.guard, ssl_context=self._ssl)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the real port when 0 was asked for
        log.info("raypulse exporter %s listening on %s://%s:%s with collectors: %s", __version__, self.scheme,
                 host, self.port, ", ".join(c.name for c in self.collectors))

    def _start_otlp(self, scheduler: Scheduler) -> None:
        url = self.config.otlp.url(os.environ)
        if url is None:
            return
        from exporter.serving.otlp import OtlpPusher  # opentelemetry is only loaded when OTLP is on

        publisher = self.publisher
        self._otlp = OtlpPusher(self.config.otlp, url, cluster=self.config.cluster,
                                snapshots=lambda: publisher.latest_snapshots)
        scheduler.self_reporters.append(self._otlp.report)
        log.info("pushing metrics over OTLP/HTTP to %s every %gs", redact.url(url), self.config.otlp.interval_seconds)

    def _changed(self) -> None:
        if self.publisher is not None:
            self.publisher.notify()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.fleet.close()
        if self._publisher_task is not None:
            self._publisher_task.cancel()
            await asyncio.gather(self._publisher_task, return_exceptions=True)
        if self.scheduler is not None:
            await self.scheduler.stop()
        await self.progress.stop()
        self.shared.progress_endpoint_up.publish(False)
        if self._otlp is not None:
            await asyncio.to_thread(self._otlp.shutdown)

    async def _metrics(self, request: web.Request) -> web.Response:
        """The whole body, or with `name[]` only the families named (wire.METRICS_NAME_PARAM); the same
        pre-rendered bytes either way, with an ETag that If-None-Match can name for a 304."""
        assert self.publisher is not None
        asked = request.query.getall(wire.METRICS_NAME_PARAM, [])
        if len(asked) > wire.METRICS_MAX_NAMES:
            return web.Response(status=400, text=f"{len(asked)} {wire.METRICS_NAME_PARAM} parameters; at most "
                                                 f"{wire.METRICS_MAX_NAMES} families per request: ask for them in "
                                                 f"parts, or for the whole {wire.METRICS_PATH}\n")
        fmt = negotiate(request.headers.get("Accept", ""))
        want_gzip = gzip_accepted(request.headers.get("Accept-Encoding", ""))
        if asked:
            # Names that no family has are dropped before the cache sees them: they select nothing, and
            # made-up names must not crowd out the sets in use.
            rendering = await self.publisher.selection(
                fmt, frozenset(name for name in asked if CATALOG.get(name) is not None))
        else:
            rendering = await self.publisher.rendering(fmt)
        etag = rendering.etag(want_gzip)
        # The body depends on both headers: a cache in between must key on them (as node_exporter's).
        headers = {"Vary": "Accept, Accept-Encoding", "ETag": f'"{etag}"'}
        if not_modified(request.if_none_match, etag):
            return web.Response(status=304, headers=headers)  # RFC 9110 15.4.5: ETag and Vary, no body
        headers["Content-Type"] = fmt.content_type
        if want_gzip:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=rendering.gzipped if want_gzip else rendering.body, headers=headers)

    def _head_view(self) -> ServiceDiscovery | None:
        """The cluster as the ray_head collector sees it, on the Ray head's exporter only."""
        found = self.shared.service_discovery.get()
        return found if found is not None and found.role == "head" else None

    def _not_head(self, path: str) -> web.Response:
        found = self.shared.service_discovery.get()
        role = found.role if found is not None else "not known yet"
        return web.Response(status=404, text=f"this exporter's Ray role is {role}; {path} is served by the exporter "
                                             "on the Ray head node\n")

    async def _sd(self, request: web.Request) -> web.Response:
        found = self._head_view()
        if found is None:
            return self._not_head(wire.SD_PATH)
        groups = list(found.groups)
        if self.config.discovers_node_exporter:  # node_exporter beside every exporter, labelled alike
            settings = self.config.node_exporter
            groups += node_exporter_groups(found.groups, settings.port, settings.job)
        return web.Response(text=json.dumps(groups), content_type="application/json",
                            headers={"Cache-Control": "no-store"})

    async def _ray_sd(self, request: web.Request) -> web.Response:
        found = self._head_view()
        if found is None:
            return self._not_head(wire.RAY_SD_PATH)
        return web.Response(text=json.dumps(found.metrics_agents), content_type="application/json",
                            headers={"Cache-Control": "no-store"})

    async def _rollout_sd(self, request: web.Request) -> web.Response:
        if self._head_view() is None:
            return self._not_head(wire.ROLLOUT_SD_PATH)
        return web.Response(body=self.shared.rollout_servers.get() or b"[]", content_type="application/json",
                            headers={"Cache-Control": "no-store"})

    async def _digest(self, request: web.Request) -> web.Response:
        assert self.digests is not None
        served = await self.digests.get()
        headers = {"ETag": f'"{served.etag}"', "Cache-Control": "no-cache"}
        if not_modified(request.if_none_match, served.etag):
            return web.Response(status=304, headers=headers)
        return web.Response(body=served.body, content_type="application/json", headers=headers)

    def _fleet_listing(self) -> list[tuple[str, str]] | None:
        found = self._head_view()
        return listing_of(found.groups) if found is not None else None

    async def _fleet(self, request: web.Request) -> web.Response:
        """Every node's digest as the head last read them; ?since=CURSOR&generation=G: the changed ones."""
        if self._head_view() is None:
            return self._not_head(wire.FLEET_PATH)
        if self.web_config is not None:
            return web.Response(status=404, text=f"{wire.FLEET_PATH} is not served under a web config (the head "
                                                 f"would need the nodes' credentials): read each node's "
                                                 f"{wire.DIGEST_PATH}\n")
        since_text = request.query.get(wire.FLEET_SINCE_PARAM)
        if since_text is not None and not (since_text.isdigit() and len(since_text) < 19):
            return web.Response(status=400, text=f"{wire.FLEET_SINCE_PARAM}: a cursor is a whole number, as a "
                                                 "document's `cursor` gave it\n")
        try:
            interval = float(request.query[wire.FLEET_INTERVAL_PARAM]) \
                if wire.FLEET_INTERVAL_PARAM in request.query else None
        except ValueError:
            interval = math.nan
        if interval is not None and not 0 < interval <= 3600:
            return web.Response(status=400, text=f"{wire.FLEET_INTERVAL_PARAM}: seconds between checks, more than 0 "
                                                 "and at most 3600\n")
        gzipped = gzip_accepted(request.headers.get("Accept-Encoding", ""))
        body = await self.fleet.document(int(since_text) if since_text is not None else None,
                                         request.query.get(wire.FLEET_GENERATION_PARAM), gzipped, interval)
        headers = {"Cache-Control": "no-store", "Vary": "Accept-Encoding"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, content_type="application/json", headers=headers)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        """200 once every collector ran (503 before); the body adds what the exporter cannot see, read
        from the collectors' last snapshots, so that a sidecar without GPU or process visibility says so
        (the status stays 200: a node without GPUs or Ray is a normal node)."""
        assert self.scheduler is not None
        blind = "".join(f"{line}\n" for line in self._blind_spots())
        if self.scheduler.ready:
            return web.Response(text="ready\n" + blind)
        return web.Response(status=503, text="waiting for collectors: " + ", ".join(self.scheduler.pending()) + "\n"
                            + blind)

    def _blind_spots(self) -> list[str]:
        assert self.scheduler is not None
        snapshots = {runner.name: runner.snapshot for runner in self.scheduler.runners}

        def samples(collector: str, name: str) -> list[tuple[tuple[str, ...], float]]:
            snapshot = snapshots.get(collector)
            return [] if snapshot is None else [s for spec, series in snapshot if spec.name == name for s in series]

        lines = []
        nvml_up = samples("gpu", "raypulse_gpu_nvml_up")
        if nvml_up and not nvml_up[0][1]:
            errors = ", ".join(labels[0] for labels, _ in samples("gpu", "raypulse_gpu_nvml_init_failures_total"))
            lines.append(f"gpu: NVML not available ({errors or 'not initialized'}; no GPU visibility: no NVIDIA "
                         "driver, or the container was given no GPUs, e.g. NVIDIA_VISIBLE_DEVICES)")
        raylets = samples("ray", "raypulse_ray_local_raylets")
        if "ray_processes" in snapshots and raylets and not raylets[0][1]:
            lines.append("ray_processes: no Ray processes visible (no raylet in this process table: Ray not "
                         "running here, or not visible: shareProcessNamespace in the Ray pod, hostPID for a DaemonSet)")
        return lines

    async def _index(self, request: web.Request) -> web.Response:
        assert self.scheduler is not None
        rows = "".join(
            f"<tr><td>{html.escape(r.name)}</td><td>{'up' if r.up else 'down'}</td><td>{r.interval:g}s</td>"
            f"<td>{html.escape(r.collector.description)}</td></tr>" for r in self.scheduler.runners)
        page = (f"<!doctype html><html><head><title>raypulse exporter</title></head><body>"
                f"<h1>raypulse exporter {html.escape(__version__)}</h1>"
                f'<p><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> · '
                f'<a href="/readyz">/readyz</a></p>'
                f"<table><tr><th>collector</th><th>state</th><th>interval</th><th>source</th></tr>{rows}</table>"
                f"</body></html>")
        return web.Response(text=page, content_type="text/html")


async def serve(config: ExporterConfig) -> None:
    """Run until SIGINT/SIGTERM, then shut down cleanly."""
    exporter = Exporter(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await exporter.start()
        await stop.wait()
        log.info("shutting down")
    finally:
        await exporter.stop()
