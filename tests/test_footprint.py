"""The exporter's footprint (issue 15, docs/benchmarks.md): what `exporter serve` does without loading,
the worker threads that run blocking collectors, and the bodies kept between scrapes."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time

import pynvml

from exporter._malloc import serving
from exporter.cli import cap_malloc_arenas, pin_mmap_threshold
from exporter.framework.scheduler import Workers
from exporter.serving.exposition import Format, Rendering
from tests.conftest import REPO, wait_until

# What `exporter serve` imports with no config file and no web config, GPUs simulated: none of these.
_SERVE_IMPORTS = """
import json, sys
from exporter import plugins
import exporter.cli, exporter.serving.server
from exporter.plugins import enabled_collectors
from exporter.framework.shared import Shared
config = plugins.load({"gpu": {"simulate": 8}}, None)
enabled_collectors(config, Shared.for_config(config))
import exporter.gpusim.nvml
print(json.dumps(sorted(sys.modules)))
"""
NOT_LOADED = ["pydantic_settings", "dotenv", "yaml", "bcrypt", "psutil", "exporter.serving.webconfig",
              "exporter.gpusim.cli", "opentelemetry"]


def test_serve_loads_no_module_it_does_not_use():
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", _SERVE_IMPORTS], cwd=REPO, capture_output=True,
                                           text=True, check=True, env={"PATH": ""}).stdout))
    assert [name for name in NOT_LOADED if name in loaded] == []


def test_the_gpu_fault_command_still_answers_though_loaded_late():
    result = subprocess.run([sys.executable, "-m", "exporter", "gpu-fault", "--help"], cwd=REPO, capture_output=True,
                            text=True, check=True)
    assert "Inject faults into simulated GPUs" in result.stdout
    listing = subprocess.run([sys.executable, "-m", "exporter", "--help"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout
    assert "gpu-fault" in listing
    assert "serve" in listing


def test_capping_malloc_arenas_is_harmless_where_it_cannot_apply(monkeypatch):
    cap_malloc_arenas()  # glibc here: capped
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    cap_malloc_arenas()  # the environment's wins: nothing to do


def test_pinning_the_mmap_threshold_is_harmless_where_it_cannot_apply(monkeypatch):
    pin_mmap_threshold()  # glibc here: pinned
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    pin_mmap_threshold()  # the environment's wins: nothing to do


def test_malloc_is_tuned_early_only_for_serve():
    assert serving(["exporter", "serve", "--listen", ":9000"])
    assert serving(["/x/exporter/__main__.py", "serve"])
    assert not serving(["exporter", "metrics"])
    assert not serving(["pytest", "-q"])
    assert not serving(["exporter"])


def _names() -> list[str]:
    return sorted(thread.name for thread in threading.enumerate() if thread.name.startswith("collector-"))


def test_runs_one_after_another_reuse_one_thread():
    workers = Workers(idle_seconds=30)
    seen = []
    for _ in range(5):
        done = threading.Event()
        workers.submit(lambda done=done: (seen.append(threading.get_ident()), done.set()))
        assert done.wait(5)
        wait_until(lambda: workers._idle == 1, 5, "the thread back among the idle ones")
    assert len(set(seen)) == 1


def test_a_stuck_run_keeps_its_thread_and_the_others_go_on_in_another():
    workers = Workers(idle_seconds=30)
    release, ran = threading.Event(), threading.Event()

    def stuck() -> None:
        threading.current_thread().name = "collector-stuck-test"
        release.wait(10)

    workers.submit(stuck)
    workers.submit(ran.set)
    try:
        assert ran.wait(5)
        assert "collector-stuck-test" in _names()
    finally:
        release.set()


def test_idle_threads_end_and_no_run_is_lost_when_one_ends():
    workers = Workers(idle_seconds=0.01)
    done = []
    lock = threading.Lock()

    def run() -> None:
        with lock:
            done.append(1)

    for round_ in range(200):  # submits racing threads that give up waiting
        workers.submit(run)
        if round_ % 7 == 0:
            time.sleep(0.012)
    deadline = time.monotonic() + 10
    while len(done) < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(done) == 200
    wait_until(lambda: workers._idle == 0, 10, "every idle thread to end")


def test_a_rendering_keeps_the_chunks_and_joins_the_plain_body_when_asked():
    rendering = Rendering.of(Format.OPENMETRICS, [b"# TYPE a gauge\na 1\n", b"# TYPE b gauge\nb 2\n"])
    assert rendering.body == b"# TYPE a gauge\na 1\n# TYPE b gauge\nb 2\n# EOF\n"
    assert gzip.decompress(rendering.gzipped) == rendering.body
    assert rendering.body is rendering.body  # joined once


def test_openmetrics_bytes_are_those_of_prometheus_clients_default_escaping():
    """exposition encodes OpenMetrics with allow-utf-8 escaping (cheaper); for the catalog's names it must
    give exactly the bytes of the default, whatever the label values."""
    from prometheus_client.openmetrics import exposition as openmetrics

    from exporter.framework.catalog import CATALOG
    from exporter.framework.collector import load_collectors
    from exporter.serving.exposition import _Families, encode_family, metric_family

    load_collectors()
    values = ["gpu-0", 'a "quoted" \\ back\nslash', "ünï", ""]
    for spec in CATALOG:
        series = tuple((tuple(values[(i + j) % len(values)] for j in range(len(spec.labels))), float(i) + 0.5)
                       for i in range(3 if spec.labels else 1))
        default = openmetrics.generate_latest(_Families([metric_family(spec, series)]))
        assert encode_family(Format.OPENMETRICS, spec, series) + b"# EOF\n" == default, spec.name


# aiohttp imported as `exporter serve` imports it: its default client contexts load the CA store when first used,
# and the mimetypes module its system's types when first asked.
_DEFERRED_CA = """
import asyncio, json, ssl, sys
import exporter.cli  # first: it imports aiohttp through exporter.serving.aiohttp_lazy
import trustme
from aiohttp import ClientConnectorCertificateError, ClientSession, web
from aiohttp import connector
from exporter.serving.aiohttp_lazy import DeferredCAContext
verified, unverified = connector._SSL_CONTEXT_VERIFIED, connector._SSL_CONTEXT_UNVERIFIED
report = {"deferred": [type(c) is DeferredCAContext for c in (verified, unverified)]}
import mimetypes
report["mime types deferred"] = not mimetypes.inited
report["mime types"] = [mimetypes.guess_type("a.gz"), mimetypes.guess_type("a.js")[0]]
ca = trustme.CA()
server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
ca.issue_cert("127.0.0.1").configure_cert(server_context)
async def main():
    app = web.Application()
    app.router.add_get("/", lambda request: web.Response(text="ok"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context)
    await site.start()
    url = f"https://127.0.0.1:{runner.addresses[0][1]}/"
    async with ClientSession() as session:
        try:
            await session.get(url)
            report["verified"] = "answered"
        except ClientConnectorCertificateError:  # an unknown CA, as with aiohttp's own context
            report["verified"] = "refused"
        async with session.get(url, ssl=False) as response:
            report["unverified"] = await response.text()
    await runner.cleanup()
asyncio.run(main())
report["loaded"] = [type(c) is ssl.SSLContext for c in (verified, unverified)]
report["cas"] = verified.cert_store_stats()["x509_ca"] == ssl.create_default_context().cert_store_stats()["x509_ca"]
print(json.dumps(report))
"""


def test_aiohttp_loads_the_ca_store_and_mime_types_when_first_used():
    report = json.loads(subprocess.run([sys.executable, "-c", _DEFERRED_CA], cwd=REPO, capture_output=True, text=True,
                                       check=True).stdout)
    assert report == {"deferred": [True, True], "verified": "refused", "unverified": "ok", "loaded": [True, True],
                      "cas": True, "mime types deferred": True,
                      "mime types": [[None, "gzip"], "text/javascript"]}


def test_gpus_share_the_keys_and_labels_of_their_unsupported_fields():
    from exporter.collectors.gpu.reader import _field_key_and_label

    key, label = _field_key_and_label((pynvml.NVML_FI_DEV_MEMORY_TEMP, 0))
    assert (key, label) == (("field", pynvml.NVML_FI_DEV_MEMORY_TEMP, 0), "field:memory_temp")
    again = _field_key_and_label((pynvml.NVML_FI_DEV_MEMORY_TEMP, 0))
    assert again[0] is key
    assert again[1] is label
