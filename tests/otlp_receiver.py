"""A real OTLP/HTTP receiver for tests: an aiohttp server decoding protobuf with opentelemetry-proto."""

from __future__ import annotations

import asyncio
import gzip
import threading
import zlib
from dataclasses import dataclass, field

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import free_port


@dataclass
class OtlpReceiver:
    """Collects what is pushed; `mode` "ok", "hang" (never answers) or "error" (503)."""

    mode: str = "ok"
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request, message_type, sink: list) -> web.Response:
        body = await request.read()
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "error":
            return web.Response(status=503)
        encoding = request.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        message = message_type()
        message.ParseFromString(body)
        sink.append(message)
        return web.Response(body=b"", content_type="application/x-protobuf")

    def start(self) -> OtlpReceiver:
        ready = threading.Event()

        async def serve() -> None:
            app = web.Application(client_max_size=64 * 2**20)
            async def metrics(request: web.Request) -> web.Response:
                return await self._handle(request, ExportMetricsServiceRequest, self.metrics)

            async def traces(request: web.Request) -> web.Response:
                return await self._handle(request, ExportTraceServiceRequest, self.traces)

            app.router.add_post("/v1/metrics", metrics)
            app.router.add_post("/v1/traces", traces)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            ready.set()
            await asyncio.Event().wait()

        threading.Thread(target=asyncio.run, args=(serve(),), daemon=True, name="otlp-receiver").start()
        ready.wait(10)
        return self

    def metric_points(self) -> dict[str, list]:
        """Metric name -> every (metric, resource attributes) received, latest last."""
        found: dict[str, list] = {}
        for request in list(self.metrics):
            for resource_metrics in request.resource_metrics:
                resource = {a.key: a.value.string_value for a in resource_metrics.resource.attributes}
                for scope in resource_metrics.scope_metrics:
                    for metric in scope.metrics:
                        found.setdefault(metric.name, []).append((metric, resource))
        return found
