"""A real `exporter serve --simulate-gpus N` process: clean exposition, catalog agreement, and faults
injected with `exporter gpu-fault` while it runs (a hung NVML call, a GPU falling off the bus)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.framework.catalog import CATALOG, MetricType
from exporter.framework.collector import load_collectors
from tests.conftest import REPO, RunningExporter, binary, exporter_command, http_get, wait_until

FAST = {"RAYPULSE_EXPORTER_COLLECTORS__GPU__INTERVAL_SECONDS": "0.5",
        "RAYPULSE_EXPORTER_COLLECTORS__GPU__DEADLINE_SECONDS": "0.5",
        "RAYPULSE_EXPORTER_COLLECTORS__GPU_EVENTS__INTERVAL_SECONDS": "0.5"}


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, family: str, **labels: object) -> float | None:
    return samples(text).get((family, frozenset((k, str(v)) for k, v in labels.items())))


def matching(text: str, family: str, **labels: object) -> list[float]:
    """Values of every series of `family` that carries at least these labels."""
    wanted = {(k, str(v)) for k, v in labels.items()}
    return [v for (n, series), v in samples(text).items() if n == family and wanted <= series]


def gpu_fault(control: Path, *args: str) -> None:
    result = subprocess.run(exporter_command("gpu-fault", "--control", str(control), *args), capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def simulated(start_exporter, tmp_path):
    """An exporter with 4 simulated GPUs, fast GPU intervals, and its control file."""
    control = tmp_path / "gpus.json"
    exporter = start_exporter("--simulate-gpus", "4", "--gpu-control", str(control), env=FAST)
    wait_until(lambda: "raypulse_gpu_sm_active_ratio" in exporter.metrics_text(), 15, "GPM's second sample")
    return exporter, control


def test_eight_simulated_gpus_expose_clean_metrics_that_match_the_catalog(start_exporter):
    exporter = start_exporter("--simulate-gpus", "8", env=FAST)
    wait_until(lambda: "raypulse_gpu_sm_active_ratio" in exporter.metrics_text(), 15, "GPM's second sample")
    text = exporter.metrics_text()

    result = subprocess.run([binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                            timeout=60)
    assert result.stdout + result.stderr == ""
    assert result.returncode == 0

    load_collectors()
    gpu_families = [f for f in text_string_to_metric_families(text) if f.name.startswith("raypulse_gpu_")]
    assert len(gpu_families) >= 70  # the families an H100 has without faults, processes or MIG
    for family in gpu_families:
        spec = CATALOG.get(family.name + ("_total" if family.type == "counter" else ""))
        assert spec is not None, family.name
        assert spec.collector in ("gpu", "gpu_events"), family.name
        assert family.type == ("gauge" if spec.type is MetricType.INFO else spec.type.value), family.name
        assert {frozenset(s.labels) for s in family.samples} == {frozenset(spec.labels)}, family.name

    infos = matching(text, "raypulse_gpu_info", simulated="true", name="NVIDIA H100 80GB HBM3")
    assert len(infos) == 8
    assert value(text, "raypulse_gpu_devices") == 8
    assert value(text, "raypulse_gpu_event_watcher_up") == 1
    assert value(text, "raypulse_exporter_collector_up", collector="gpu") == 1


def test_a_hanging_nvml_call_leaves_metrics_and_healthz_answering(simulated):
    exporter, control = simulated
    gpu_fault(control, "hang", "nvmlDeviceGetPowerUsage")
    wait_until(lambda: value(exporter.metrics_text(), "raypulse_exporter_collector_stuck", collector="gpu") == 1,
               10, "the gpu collector to be marked stuck")

    # The server answers at once (a 2 s client timeout fails the test otherwise), over and over.
    for _ in range(5):
        status, _, _body = http_get(exporter.url + "/metrics", timeout=2)
        assert status == 200
        assert http_get(exporter.url + "/healthz", timeout=2)[0] == 200
    wait_until(lambda: value(exporter.metrics_text(), "raypulse_exporter_collector_errors_total", collector="gpu",
                             kind="busy") >= 2, 10, "runs skipped while the hung one has not returned")

    # XIDs still arrive while the GPU collector is stuck: the watcher and its collector are apart.
    gpu_fault(control, "--gpu", "2", "xid", "48")
    wait_until(lambda: matching(exporter.metrics_text(), "raypulse_gpu_xid_errors_total", gpu=2, xid=48) == [1.0],
               10, "the XID counted while collection hangs")
    text = exporter.metrics_text()
    assert value(text, "raypulse_exporter_collector_up", collector="gpu_events") == 1
    # The stuck collector's series went stale and were dropped, not served frozen.
    wait_until(lambda: "raypulse_gpu_power_usage_watts" not in exporter.metrics_text(), 10, "stale GPU series")

    gpu_fault(control, "clear", "hang")
    wait_until(lambda: value(exporter.metrics_text(), "raypulse_exporter_collector_stuck", collector="gpu") == 0
               and len(matching(exporter.metrics_text(), "raypulse_gpu_power_usage_watts")) == 4,
               10, "the gpu collector to recover")


def test_a_gpu_that_falls_off_the_bus_goes_down_and_comes_back(simulated):
    exporter, control = simulated
    gpu_fault(control, "--gpu", "1", "xid", "79")
    wait_until(lambda: matching(exporter.metrics_text(), "raypulse_gpu_up", gpu=1) == [0.0], 10, "gpu 1 down")
    wait_until(lambda: matching(exporter.metrics_text(), "raypulse_gpu_xid_errors_total", gpu=1, xid=79) == [1.0],
               10, "XID 79 counted")
    # The run that finds the GPU lost keeps the readings it gave before the loss (they were real); the
    # runs after it give nothing but its identity.
    wait_until(lambda: matching(exporter.metrics_text(), "raypulse_gpu_power_usage_watts", gpu=1) == [], 10,
               "gpu 1's readings gone")
    text = exporter.metrics_text()
    assert sorted(matching(text, "raypulse_gpu_up")) == [0.0, 1.0, 1.0, 1.0]
    assert matching(text, "raypulse_gpu_lost_events_total", gpu=1) == [1.0]
    assert matching(text, "raypulse_gpu_power_usage_watts", gpu=1) == []
    assert value(text, "raypulse_exporter_collector_up", collector="gpu") == 1  # one lost GPU is not a failure

    gpu_fault(control, "--gpu", "1", "clear", "lost")
    wait_until(lambda: matching(exporter.metrics_text(), "raypulse_gpu_up", gpu=1) == [1.0], 10, "gpu 1 back")
    assert len(matching(exporter.metrics_text(), "raypulse_gpu_power_usage_watts", gpu=1)) == 1


def test_without_simulation_the_gpu_collector_never_switches_it_on(start_exporter: object) -> None:
    exporter: RunningExporter = start_exporter()  # type: ignore[operator]
    wait_until(lambda: "raypulse_gpu_nvml_up" in exporter.metrics_text(), 15, "the gpu collector's first run")
    text = exporter.metrics_text()
    assert not matching(text, "raypulse_gpu_info", simulated="true")
    assert not matching(text, "raypulse_gpu_nvml_info", simulated="true")
