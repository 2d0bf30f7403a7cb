"""`/metrics?name[]=...`: only the families asked for, the same bytes as the whole body, an ETag and 304
while they are unchanged, the same auth, a cap on names, and a selection cache that stays in its bounds."""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import urllib.request

import bcrypt
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.contract import wire
from exporter.framework.catalog import MetricSpec, MetricType
from exporter.framework.snapshot import SampleSink, Snapshot
from exporter.serving.exposition import Format, Publisher, encode
from launcher.health.exporters import FAMILIES as WATCHED
from tests.conftest import binary, wait_until
from tests.test_exporter_output import OPENMETRICS_ACCEPT, live_families
from tests.test_gpu_exporter import gpu_fault, matching
from tests.test_web_config import basic

STABLE = ("raypulse_gpu_up", "raypulse_gpu_info", "raypulse_exporter_build_info")  # change only on a fault


def etag(headers: dict[str, str]) -> str:
    return headers["ETag"]


def samples_of(text: str, families: set[str]) -> list[tuple[str, tuple, float]]:
    return sorted((s.name, tuple(sorted(s.labels.items())), s.value) for f in parse_text(text)
                  for s in f.samples if f.name in families or f.name + "_total" in families)


@pytest.fixture
def gpu_node(start_exporter, tmp_path):
    """An exporter with 8 simulated GPUs (a training node's families) and its fault control file."""
    control = tmp_path / "gpus.json"
    exporter = start_exporter("--simulate-gpus", "8", "--gpu-control", str(control))
    wait_until(lambda: "raypulse_gpu_up{" in exporter.metrics_text(), 15, "the GPUs to be collected")
    return exporter, control


def test_a_selection_has_exactly_the_families_asked_for_with_the_samples_of_the_whole_body(gpu_node):
    exporter, _ = gpu_node
    path = wire.metrics_path([*WATCHED, "raypulse_no_such_family", "not even a name"])

    read: list[str] = []

    def consistent() -> bool:
        """A whole body and a selection of the same snapshots: the whole body's ETag equal before and after."""
        before, selected, after = exporter.get("/metrics"), exporter.get(path), exporter.get("/metrics")
        assert before[0] == selected[0] == after[0] == 200
        read[:] = [before[2].decode(), selected[2].decode()]
        return etag(before[1]) == etag(after[1])

    wait_until(consistent, 60, "a selection read between two equal whole bodies")
    whole, selected = read
    served = set(live_families(whole)) & set(WATCHED)
    assert {"raypulse_gpu_up", "raypulse_gpu_ecc_errors_total"} <= served  # what 8 GPUs always have
    assert set(live_families(selected)) == served  # unknown names are simply absent
    assert samples_of(selected, served) == samples_of(whole, served)

    result = subprocess.run([binary("promtool"), "check", "metrics"], input=selected, capture_output=True,
                            text=True, timeout=60)
    assert result.stdout + result.stderr == ""

    status, headers, body = exporter.get(path, headers={"Accept": OPENMETRICS_ACCEPT})
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    names = {f.name + ("_total" if f.type == "counter" else "") for f in parse_openmetrics(body.decode())}
    assert names == served


def test_an_unchanged_selection_costs_a_304_and_a_change_gives_a_new_etag_and_body(gpu_node):
    exporter, control = gpu_node
    path = wire.metrics_path(STABLE)
    status, headers, body = exporter.get(path)
    assert status == 200
    first = etag(headers)
    assert {v.strip() for v in headers["Vary"].split(",")} == {"Accept", "Accept-Encoding"}

    status, headers, unsent = exporter.get(path, headers={"If-None-Match": first})
    assert (status, etag(headers), unsent) == (304, first, b"")
    status, headers, _ = exporter.get(path, headers={"If-None-Match": f'"other", W/{first}'})  # weak comparison
    assert status == 304

    # gzip is another representation: its own ETag, which names it alone; the same content inflated.
    status, headers, compressed = exporter.get(path, headers={"Accept-Encoding": "gzip"})
    assert (status, headers["Content-Encoding"], etag(headers)) == (200, "gzip", first[:-1] + '-gzip"')
    assert gzip.decompress(compressed) == body
    assert exporter.get(path, headers={"Accept-Encoding": "gzip", "If-None-Match": first})[0] == 200
    assert exporter.get(path, headers={"Accept-Encoding": "gzip", "If-None-Match": etag(headers)})[0] == 304
    openmetrics = exporter.get(path, headers={"Accept": OPENMETRICS_ACCEPT})[1]
    assert etag(openmetrics) != first

    gpu_fault(control, "--gpu", "1", "xid", "79")
    wait_until(lambda: matching(exporter.get(path)[2].decode(), "raypulse_gpu_up", gpu=1) == [0.0], 30,
               "GPU 1 to be lost in the selection")
    status, headers, changed = exporter.get(path, headers={"If-None-Match": first})
    assert status == 200
    assert etag(headers) != first
    assert changed != body


def test_head_answers_the_headers_of_get_without_the_body(gpu_node):
    exporter, _ = gpu_node
    path = wire.metrics_path(STABLE)
    get_headers = exporter.get(path)[1]
    request = urllib.request.Request(exporter.url + path, method="HEAD")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200
        assert response.headers["ETag"] == etag(get_headers)
        assert response.read() == b""


def test_a_selection_asks_for_the_same_credentials_as_metrics(start_exporter, tmp_path):
    password = "s3cret-scrape"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    (tmp_path / "web.yml").write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    exporter = start_exporter("--disable-collector", "gpu", "--web-config", str(tmp_path / "web.yml"), ready=False)
    wait_until(lambda: exporter.get("/readyz", headers=basic("prometheus", password))[0] == 200, 30,
               "the exporter to become ready")
    path = wire.metrics_path(["raypulse_exporter_build_info"])
    status, headers, body = exporter.get(path, headers=basic("prometheus", password))
    assert status == 200
    assert b"raypulse_exporter_build_info{" in body
    for credentials in ({}, basic("prometheus", "wrong")):  # nor can an ETag be tried without them
        assert exporter.get(path, headers={**credentials, "If-None-Match": etag(headers)})[0] == 401


def test_more_names_than_the_cap_are_refused_with_400_saying_so(start_exporter):
    exporter = start_exporter("--disable-collector", "gpu")
    names = [f"raypulse_family_{i}" for i in range(wire.METRICS_MAX_NAMES + 1)]
    query = "&".join(f"{wire.METRICS_NAME_PARAM}={name}" for name in names)
    status, _, body = exporter.get(f"{wire.METRICS_PATH}?{query}")
    assert status == 400
    assert f"at most {wire.METRICS_MAX_NAMES} families per request".encode() in body
    assert exporter.get(wire.metrics_path(names[:-1]))[0] == 200  # at the cap: served (here, nothing)
    with pytest.raises(ValueError, match="ask for them in parts"):
        wire.metrics_path(names)


# -- the selection cache, in process ---------------------------------------------------------------------------

SPECS = [MetricSpec(name=f"raypulse_test_family_{i}", type=MetricType.GAUGE, help="A test family.", labels=("n",),
                    collector=f"test{i % 3}") for i in range(40)]


def snapshots(value: float) -> list[Snapshot]:
    """Three collectors' snapshots of the test families, each series at `value`."""
    sinks = {f"test{c}": SampleSink(f"test{c}") for c in range(3)}
    for spec in SPECS:
        for n in range(5):
            sinks[spec.collector].add(spec, value, n=n)
    return [sink.freeze(0.0) for sink in sinks.values()]


def test_a_selection_is_the_whole_bodys_blocks_rendered_once_per_change_and_the_cache_keeps_its_bounds():
    async def scenario() -> None:
        served = snapshots(1.0)
        publisher = Publisher(lambda now: served, lambda now: None, max_selections=6, max_selection_bytes=4000)
        await publisher.render_now()

        names = frozenset({SPECS[3].name, SPECS[4].name, SPECS[17].name})
        selection = await publisher.selection(Format.TEXT, names)
        blocks = [chunk for snapshot in served for chunk in encode(Format.TEXT, snapshot)
                  if chunk.split(b"\n", 1)[0].split()[2].decode() in names]  # "# HELP <name> ..."
        assert selection.body == b"".join(blocks)
        assert await publisher.selection(Format.TEXT, names) is selection  # kept, not rendered per request
        assert publisher.selections_rendered == 1

        served = snapshots(2.0)  # a change: the next request gets a new rendering, with a new digest
        await publisher.render_now()
        changed = await publisher.selection(Format.TEXT, names)
        assert changed is not selection
        assert changed.digest != selection.digest

        for i in range(len(SPECS) - 3):  # many distinct sets: never more than the bounds
            await publisher.selection(Format.TEXT, frozenset(spec.name for spec in SPECS[i:i + 3]))
            count, held = publisher.selection_cache()
            assert count <= 6, count
            assert held <= 4000, held

        big = frozenset(spec.name for spec in SPECS)  # larger than the byte cap alone: kept, alone
        assert (await publisher.selection(Format.TEXT, big)).size > 4000
        assert publisher.selection_cache()[0] == 1

    asyncio.run(scenario())
