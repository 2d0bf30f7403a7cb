"""The GPU collector against the real NVML of this machine (scripts/gpu_check.sh runs these).

Skipped unless RAYPULSE_GPU_CHECK=1; with it, a machine without a working NVIDIA driver fails at
once with the reason. Prints what it found: the GPUs, the families present, the ones omitted and
the NVML calls the GPUs do not support, the time a run takes per GPU.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from exporter.collectors.gpu import event_collector as events
from exporter.collectors.gpu import health, inventory, memory, pcie, power
from exporter.collectors.gpu.collector import GpuCollector
from exporter.config import load_config
from exporter.framework.catalog import CATALOG
from exporter.framework.collector import load_collectors
from exporter.framework.snapshot import SampleSink, Snapshot

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(os.environ.get("RAYPULSE_GPU_CHECK") != "1",
                                                  reason="needs a real NVIDIA GPU: run scripts/gpu_check.sh")]

# What every NVIDIA GPU with a current driver answers; anything else may be knowingly omitted.
REQUIRED = {"raypulse_gpu_info", "raypulse_gpu_up", "raypulse_gpu_devices", "raypulse_gpu_lost_events_total",
            "raypulse_gpu_collection_duration_seconds", "raypulse_gpu_memory_total_bytes",
            "raypulse_gpu_memory_used_bytes", "raypulse_gpu_memory_free_bytes", "raypulse_gpu_clock_hertz",
            "raypulse_gpu_clock_max_hertz", "raypulse_gpu_temperature_celsius", "raypulse_gpu_power_usage_watts",
            "raypulse_gpu_power_limit_watts", "raypulse_gpu_pcie_link_generation", "raypulse_gpu_pcie_link_width",
            "raypulse_gpu_performance_state", "raypulse_gpu_nvml_up", "raypulse_gpu_nvml_info",
            "raypulse_gpu_processes"}


@dataclass
class RealRun:
    collector: GpuCollector
    snapshot: Snapshot
    wall_seconds: float
    cpu_seconds: float


@pytest.fixture(scope="module")
def real() -> Iterator[RealRun]:
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        pytest.fail(f"NVML is not available here ({type(exc).__name__}: {exc}): this check needs an NVIDIA GPU "
                    "with its driver loaded (and, in a container, the NVIDIA runtime)")
    load_collectors()
    collector = GpuCollector(load_config(environ={}))
    assert collector.nvml is pynvml
    assert not collector.simulated
    run = None
    for _ in range(3):  # the first run also reads static values; GPM needs two samples
        sink = SampleSink("gpu")
        wall, cpu = time.perf_counter(), time.thread_time()
        collector.collect(sink)
        run = RealRun(collector, sink.freeze(time.monotonic()), time.perf_counter() - wall, time.thread_time() - cpu)
        time.sleep(1.0)
    assert run is not None
    yield run
    collector.close()


def series(snapshot: Snapshot, name: str) -> list[tuple[dict[str, str], float]]:
    spec = CATALOG.get(name)
    return [(dict(zip(spec.labels, labels, strict=True)), v) for labels, v in snapshot.families.get(spec, ())]


def test_every_gpu_is_seen(real):
    import pynvml

    pynvml.nvmlInit()
    try:
        uuids = {pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(pynvml.nvmlDeviceGetCount())}
    finally:
        pynvml.nvmlShutdown()
    infos = series(real.snapshot, "raypulse_gpu_info")
    for labels, _ in infos:
        print(f"GPU {labels['gpu']}: {labels['name']} {labels['uuid']} bus {labels['pci_bus_id']} driver "
              f"{labels['driver_version']} CUDA {labels['cuda_driver_version']} cc {labels['compute_capability']}")
    assert {labels["uuid"] for labels, _ in infos} == uuids
    assert real.snapshot.value(inventory.DEVICES) == len(uuids)
    assert all(v == 1 for _, v in series(real.snapshot, "raypulse_gpu_up")), "a GPU is lost"
    if shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=60).stdout.split()
        assert set(listed) == uuids


def test_families_are_present_or_knowingly_omitted(real):
    gpu_families = {s.name: s for s in CATALOG if s.collector == "gpu"}
    present = {spec.name for spec, _ in real.snapshot}
    absent = sorted(set(gpu_families) - present)
    unsupported = sorted({labels["call"] for labels, _ in series(real.snapshot, "raypulse_gpu_nvml_call_unsupported")})
    print(f"\nfamilies present: {len(present & set(gpu_families))} of {len(gpu_families)}")
    for name in absent:
        print(f"  omitted {name}: present {gpu_families[name].only_when}")
    print(f"NVML calls and fields these GPUs answer NOT_SUPPORTED: {', '.join(unsupported) or 'none'}")
    assert REQUIRED - present == set(), "families every NVIDIA GPU should give"
    assert all(gpu_families[name].only_when for name in absent), "an always-expected family is missing"
    errors = series(real.snapshot, "raypulse_gpu_nvml_errors_total")
    assert not errors, f"NVML calls failed (not NOT_SUPPORTED): {errors}"


def test_values_are_in_sane_ranges(real):
    snapshot = real.snapshot
    for spec, rows in snapshot:
        for labels, value in rows:
            where = f"{spec.name}{labels}"
            if spec.unit == "ratio":
                assert 0 <= value <= 1, where
            elif spec.unit == "celsius":
                assert -10 <= value <= 130, where
            elif spec.unit == "watts":
                assert 0 <= value <= 3000, where
            elif spec.unit == "hertz":
                assert 0 <= value <= 1e10, where
            elif spec.unit in ("bytes", "joules", "seconds") or spec.name.endswith("_total"):
                assert value >= 0, where
    for labels, _ in series(snapshot, "raypulse_gpu_up"):
        gpu = {"gpu": labels["gpu"], "uuid": labels["uuid"]}
        assert snapshot.value(memory.USED, **gpu) <= snapshot.value(memory.TOTAL, **gpu)
        assert snapshot.value(power.USAGE, **gpu) <= 1.2 * snapshot.value(power.LIMIT, **gpu)
        maximum = snapshot.value(pcie.MAX_GENERATION, **gpu)
        assert maximum is None or 1 <= snapshot.value(pcie.GENERATION, **gpu) <= maximum
        assert 1 <= snapshot.value(pcie.WIDTH, **gpu) <= 32


def test_cycle_time_per_gpu(real):
    durations = series(real.snapshot, "raypulse_gpu_collection_duration_seconds")
    count = len(durations)
    print(f"\none run: {real.wall_seconds * 1000:.1f} ms wall, {real.cpu_seconds * 1000:.1f} ms CPU for {count} "
          f"GPU(s): {real.wall_seconds / count * 1000:.1f} ms wall per GPU")
    for labels, seconds in durations:
        print(f"  GPU {labels['gpu']}: {seconds * 1000:.1f} ms")
        assert seconds < 2.0, f"GPU {labels['gpu']} took {seconds:.2f}s (is persistence mode off?)"
    assert real.snapshot.value(health.NVML_UP) == 1


def test_the_xid_watcher_listens(real):
    collector = events.GpuEventsCollector(real.collector.config, real.collector.shared)
    deadline = time.monotonic() + 5
    up = 0.0
    while time.monotonic() < deadline and up != 1:
        sink = SampleSink("gpu_events")
        asyncio.run(collector.collect(sink))
        up = sink.freeze(0).value(events.WATCHER_UP) or 0.0
        time.sleep(0.2)
    assert up == 1, "the XID watcher could not register for NVML events"


def test_the_process_table_agrees_with_the_process_series(real):
    table = real.collector.shared.gpu_processes.get()
    print(f"\nprocesses on the GPUs at the last run: {sorted(table) or 'none'}")
    per_gpu: dict[str, int] = {}
    for pid, uses in table.items():
        for use in uses:
            assert use.pid == pid
            assert use.sm_utilization is None or 0 <= use.sm_utilization <= 1
            per_gpu[use.uuid] = per_gpu.get(use.uuid, 0) + 1
    for labels, count in series(real.snapshot, "raypulse_gpu_processes"):
        assert per_gpu.get(labels["uuid"], 0) == count, labels
