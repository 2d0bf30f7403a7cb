"""The GPU collector on simulated GPUs: every family, every fault, lost GPUs, NVML failures, XIDs,
and the per-process table the Ray collector reads. The collector code is the production code; only
the NVML module under it is simulated."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType

import pynvml
import pytest

from exporter import plugins
from exporter.collectors.gpu import (
    clocks,
    ecc,
    health,
    inventory,
    memory,
    mig,
    nvlink,
    pcie,
    power,
    processes,
    thermal,
    utilization,
)
from exporter.collectors.gpu import event_collector as events
from exporter.collectors.gpu.collector import GpuCollector
from exporter.collectors.gpu.reader import NvmlDown
from exporter.config import ConfigError, load_config
from exporter.framework.catalog import CATALOG, MetricSpec
from exporter.framework.collector import load_collectors
from exporter.framework.shared import NO_OWNER, GpuProcessUsage, Shared
from exporter.framework.snapshot import SampleSink, Snapshot
from exporter.gpusim import control
from exporter.gpusim.nvml import SimulatedNvml

load_collectors()
GPU_FAMILIES = {spec.name for spec in CATALOG if spec.collector in ("gpu", "gpu_events")}


class Rig:
    """A collector over simulated GPUs, their control file, and helpers to run and read it."""

    def __init__(self, tmp_path: Path, count: int, model: str, clock: Callable[[], float] | None,
                 gpu_clock: Callable[[], float] | None, **settings: object) -> None:
        self.path = tmp_path / f"gpus-{model}.json"
        self.config = load_config({"gpu": {"simulate": count, "simulate_model": model,
                                           "control_file": str(self.path), **settings}}, environ={})
        self.nvml = SimulatedNvml(count, model, self.path, clock=gpu_clock or time.monotonic)
        # Short event waits: the watcher notices it should stop sooner, so tests end sooner.
        self.collector = GpuCollector(self.config, nvml=self.nvml, clock=clock or time.monotonic, event_wait_ms=100)
        self.events = events.GpuEventsCollector(self.config, self.collector.shared)

    def change(self, apply: Callable[[control.Control], object]) -> None:
        control.update(self.path, lambda document: apply(document) and None)
        time.sleep(0.1)  # the simulator re-reads the control file at most every 50 ms

    def gpu(self, index: int) -> Callable[[control.Control], control.GpuControl]:
        return lambda document: control.gpu_entry(document, index)

    def run(self) -> Snapshot:
        sink = SampleSink("gpu")
        self.collector.collect(sink)
        return sink.freeze(time.monotonic())

    def runs(self, count: int = 2) -> Snapshot:
        """Several runs a little apart (GPM needs two samples); the last one's snapshot."""
        for _ in range(count - 1):
            self.run()
            time.sleep(0.05)
        return self.run()

    def event_snapshot(self) -> Snapshot:
        sink = SampleSink("gpu_events")
        asyncio.run(self.events.collect(sink))
        return sink.freeze(time.monotonic())

    def labels(self, index: int) -> dict[str, object]:
        return {"gpu": index, "uuid": self.nvml.gpus[index].uuid, **NO_OWNER}

    def value(self, snapshot: Snapshot, spec: MetricSpec, index: int, **labels: object) -> float | None:
        return snapshot.value(spec, **self.labels(index), **labels)

    def wait_for_events(self, predicate: Callable[[Snapshot], bool], timeout: float = 5.0) -> Snapshot:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snapshot = self.event_snapshot()
            if predicate(snapshot):
                return snapshot
            time.sleep(0.05)
        raise AssertionError("the XID watcher did not report the events in time")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(count: int = 2, model: str = "H100", clock: Callable[[], float] | None = None,
             gpu_clock: Callable[[], float] | None = None, **settings) -> Rig:
        made.append(Rig(tmp_path, count, model, clock, gpu_clock, **settings))
        return made[-1]

    yield make
    for each in made:
        for gpu in range(len(each.nvml.gpus)):  # release anything hung, then stop the watcher
            control.update(each.path, lambda document, gpu=gpu: setattr(control.gpu_entry(document, gpu), "hang", []))
        each.collector.close()


def families(snapshot: Snapshot) -> set[str]:
    return {spec.name for spec, _ in snapshot}


def test_every_gpu_family_appears_on_simulated_gpus(rig, tmp_path):
    seen: set[str] = set()
    # A configured pod-resources socket that is absent: raypulse_gpu_pod_resources_up says 0.
    busy = rig(count=2, model="H100", pod_resources_socket=str(tmp_path / "kubelet.sock"))
    busy.change(lambda d: (
        busy.gpu(0)(d).processes.extend([control.Process(pid=4242, memory_bytes=20 << 30, sm_utilization=0.6),
                                         control.Process(pid=4343, memory_bytes=2 << 30)]),
        setattr(busy.gpu(0)(d), "errors", {"nvmlDeviceGetEnforcedPowerLimit": "UNKNOWN"}),
        control.inject_xid(busy.gpu(0)(d), 48),
        setattr(busy.gpu(1)(d), "mig", ["3g.40gb", "3g.40gb"])))
    busy.runs(3)
    seen |= families(busy.runs(2))
    seen |= families(busy.wait_for_events(lambda s: s.value(events.XID_ERRORS, **busy.labels(0), xid=48) == 1))
    for model in ("B200", "V100", "RTX6000ADA"):  # NVLink5 counters; page retirement and NVENC; fans
        seen |= families(rig(count=1, model=model).runs(2))
    failing = rig(count=1)
    failing.change(lambda d: (setattr(d, "init_error", "DRIVER_NOT_LOADED"),
                              setattr(d, "errors", {"nvmlEventSetWait_v2": "UNKNOWN"})))
    seen |= families(failing.run())
    failing.change(lambda d: setattr(d, "init_error", None))
    failing.collector._session._next_attempt = 0  # skip the backoff: it has its own test
    failing.run()
    seen |= families(failing.wait_for_events(lambda s: bool(s.families.get(events.WATCHER_ERRORS))))
    assert GPU_FAMILIES - seen == set()


def test_the_catalog_has_at_least_eighty_gpu_families():
    assert len(GPU_FAMILIES) >= 80


def test_series_are_in_base_units_and_sane_ranges(rig):
    gpus = rig(count=2)
    snapshot = gpus.runs(2)
    for spec, series in snapshot:
        for labels, value in series:
            where = f"{spec.name}{labels}"
            if spec.unit == "ratio":
                assert 0 <= value <= 1, where
            elif spec.unit == "celsius":
                assert 15 <= value <= 110, where
            elif spec.unit in ("watts", "bytes", "hertz", "joules", "seconds"):
                assert value >= 0, where
    assert 70 <= gpus.value(snapshot, power.USAGE, 0) <= gpus.value(snapshot, power.LIMIT, 0) == 700
    assert gpus.value(snapshot, memory.TOTAL, 0) == 81559 << 20
    assert gpus.value(snapshot, clocks.CLOCK_MAX, 0, clock="sm") == 1980e6
    assert gpus.value(snapshot, nvlink.LINK_SPEED, 0) == 26562e6


def test_gpu_info_names_the_gpu_and_says_it_is_simulated(rig):
    snapshot = rig(count=1).run()
    ((labels, value),) = snapshot.families[inventory.INFO]
    info = dict(zip(inventory.INFO.labels, labels, strict=True))
    assert value == 1
    assert info["simulated"] == "true"
    assert info["name"] == "NVIDIA H100 80GB HBM3"
    assert info["pci_bus_id"] == "00000000:18:00.0"
    assert info["compute_capability"] == "9.0"
    assert info["architecture"] == "hopper"
    assert info["driver_version"]
    assert info["cuda_driver_version"] == "12.8"


def test_the_configuration_chooses_simulated_or_real_nvml():
    config = load_config({"gpu": {"simulate": 3, "simulate_model": "h200"}}, environ={})
    simulated = plugins.nvml_module(config)
    assert isinstance(simulated, SimulatedNvml)
    assert len(simulated.gpus) == 3
    assert simulated.model.key == "H200"
    assert plugins.nvml_module(load_config(environ={})) is pynvml
    # The framework chooses it where it chooses the collectors; the collector only reads what it is given.
    collectors = plugins.enabled_collectors(config, Shared.for_config(config))
    try:
        (gpu,) = [c for c in collectors if c.name == "gpu"]
        assert isinstance(gpu.nvml, SimulatedNvml)
        assert gpu.simulated
    finally:
        for collector in collectors:
            collector.close()


@pytest.mark.parametrize(("settings", "message"), [
    ({"simulate_model": "X100"}, "gpu.simulate_model: unknown simulated GPU model 'X100'; choose one of H100"),
    ({"simulate": -1}, "gpu.simulate: Input should be greater than or equal to 0"),
    ({"simulate": 2, "contol_file": "x"}, "gpu.contol_file: unknown setting"),
])
def test_bad_gpu_settings_name_the_field(settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        plugins.load({"gpu": settings}, environ={})


def test_without_nvml_the_run_succeeds_and_says_why(tmp_path):
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML")
    collector = GpuCollector(load_config(environ={}))
    sink = SampleSink("gpu")
    collector.collect(sink)  # no exception: the other collectors and /metrics are unaffected
    snapshot = sink.freeze(0)
    assert snapshot.value(health.NVML_UP) == 0
    assert snapshot.value(health.INIT_FAILURES, error="library_not_found") == 1
    assert collector.shared.gpu_processes.get() == {}


def test_thermal_throttle_shows_in_temperature_clocks_and_clock_events(rig):
    gpus = rig(count=2)
    before = gpus.runs(2)
    gpus.change(lambda d: setattr(gpus.gpu(0)(d), "thermal_throttle", True))
    time.sleep(0.3)
    after = gpus.run()
    slowdown = gpus.value(after, thermal.THRESHOLD, 0, threshold="slowdown")
    assert gpus.value(after, thermal.TEMPERATURE, 0, sensor="gpu") > slowdown
    assert gpus.value(after, thermal.MARGIN, 0) < 0
    for reason in ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown"):
        assert gpus.value(after, clocks.EVENT_ACTIVE, 0, reason=reason) == 1
        assert gpus.value(before, clocks.EVENT_ACTIVE, 0, reason=reason) == 0
    assert gpus.value(after, clocks.EVENT_SECONDS, 0, reason="hw_thermal_slowdown") > gpus.value(
        before, clocks.EVENT_SECONDS, 0, reason="hw_thermal_slowdown")
    assert gpus.value(after, clocks.CLOCK, 0, clock="sm") < gpus.value(after, clocks.CLOCK_MAX, 0, clock="sm")
    assert gpus.value(after, clocks.EVENT_ACTIVE, 1, reason="hw_thermal_slowdown") == 0  # only GPU 0


def test_power_brake_caps_power_and_shows_as_a_clock_event(rig):
    gpus = rig(count=2)
    gpus.change(lambda d: (setattr(d, "load", 1.0), setattr(gpus.gpu(0)(d), "power_brake", True)))
    snapshot = gpus.runs(2)
    assert gpus.value(snapshot, clocks.EVENT_ACTIVE, 0, reason="hw_power_brake_slowdown") == 1
    assert gpus.value(snapshot, power.USAGE, 0) == pytest.approx(0.35 * 700)
    assert gpus.value(snapshot, power.USAGE, 1) > 600
    assert gpus.value(snapshot, clocks.EVENT_ACTIVE, 1, reason="hw_power_brake_slowdown") == 0


def test_double_bit_ecc_and_row_remapping_show_in_the_memory_health_series(rig):
    gpus = rig(count=2)
    before = gpus.run()
    gpus.change(lambda d: (setattr(gpus.gpu(0)(d), "ecc_dbe", 3), setattr(gpus.gpu(0)(d), "row_remap_pending", True),
                           setattr(gpus.gpu(1)(d), "row_remap_failed", True)))
    after = gpus.run()
    assert gpus.value(before, ecc.ERRORS, 0, type="uncorrected") == 0
    assert gpus.value(after, ecc.ERRORS, 0, type="uncorrected") == 3
    assert gpus.value(after, ecc.LIFETIME_ERRORS, 0, type="uncorrected") == 3
    assert gpus.value(after, ecc.LOCATION_ERRORS, 0, type="uncorrected", location="device_memory") == 3
    assert gpus.value(after, ecc.REMAPPED_ROWS, 0, cause="uncorrectable") == 3
    assert gpus.value(after, ecc.ROW_REMAP_PENDING, 0) == 1
    assert gpus.value(after, ecc.ROW_REMAP_FAILED, 0) == 0
    assert gpus.value(after, ecc.ROW_REMAP_FAILED, 1) == 1
    assert gpus.value(after, ecc.BANK_AVAILABILITY, 1, level="none") > 0
    assert gpus.value(after, ecc.ERRORS, 1, type="uncorrected") == 0


def test_xid_94_asks_for_a_gpu_reset(rig):
    gpus = rig(count=1)
    gpus.change(lambda d: control.inject_xid(gpus.gpu(0)(d), 94))
    snapshot = gpus.run()
    assert gpus.value(snapshot, inventory.RECOVERY_ACTION, 0) == pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    assert gpus.value(snapshot, ecc.ROW_REMAP_PENDING, 0) == 1


def test_an_nvlink_link_down_shows_per_link(rig):
    gpus = rig(count=1)
    gpus.change(lambda d: setattr(d, "load", 1.0))
    before = gpus.runs(2)
    gpus.change(lambda d: gpus.gpu(0)(d).nvlink_down.append(3))
    time.sleep(0.1)
    after = gpus.runs(2)
    assert gpus.value(before, nvlink.LINK_UP, 0, link=3) == 1
    assert gpus.value(after, nvlink.LINK_UP, 0, link=3) == 0
    assert gpus.value(after, nvlink.LINK_UP, 0, link=2) == 1
    assert gpus.value(after, nvlink.LINK_ERRORS, 0, link=3, type="recovery") == 1
    assert gpus.value(after, nvlink.ERRORS, 0, type="recovery") == 1
    from exporter.collectors.gpu import gpm

    assert gpus.value(after, gpm.NVLINK_LINK_THROUGHPUT, 0, link=3, direction="tx") == 0
    assert gpus.value(after, gpm.NVLINK_LINK_THROUGHPUT, 0, link=2, direction="tx") > 1e9


def test_a_lost_gpu_goes_down_alone_and_comes_back_under_its_uuid(rig):
    gpus = rig(count=3)
    before = gpus.runs(2)
    energy = gpus.value(before, power.ENERGY, 1)
    gpus.change(lambda d: control.inject_xid(gpus.gpu(1)(d), 79))
    lost = gpus.run()
    assert gpus.value(lost, inventory.UP, 1) == 0
    assert gpus.value(lost, inventory.LOST_EVENTS, 1) == 1
    assert gpus.value(lost, power.USAGE, 1) is None  # no readings from a lost GPU
    assert gpus.value(lost, inventory.INFO, 1, **_identity(before, gpus.nvml.gpus[1].uuid)) == 1  # kept to join on
    for other in (0, 2):
        assert gpus.value(lost, inventory.UP, other) == 1
        assert gpus.value(lost, power.USAGE, other) > 0
    assert lost.value(inventory.DEVICES) == 3
    still_lost = gpus.run()
    assert gpus.value(still_lost, inventory.LOST_EVENTS, 1) == 1  # one loss, counted once

    gpus.change(lambda d: setattr(gpus.gpu(1)(d), "lost", False))
    back = gpus.run()
    assert gpus.value(back, inventory.UP, 1) == 1
    assert gpus.value(back, inventory.LOST_EVENTS, 1) == 1
    assert gpus.value(back, power.ENERGY, 1) >= energy  # the counter carries on


def _identity(snapshot: Snapshot, uuid: str) -> dict[str, str]:
    for labels, _ in snapshot.families[inventory.INFO]:
        info = dict(zip(inventory.INFO.labels, labels, strict=True))
        if info["uuid"] == uuid:
            return {k: v for k, v in info.items() if k not in ("gpu", "uuid", *NO_OWNER)}
    raise AssertionError(uuid)


def test_not_supported_calls_are_omitted_and_not_asked_again_until_the_static_refresh(rig, monkeypatch):
    now = [0.0]  # the collector's clock: the static refresh comes when the test says, not when the machine does
    gpus = rig(count=2, static_refresh_seconds=0.5, clock=lambda: now[0])
    gpus.change(lambda d: gpus.gpu(0)(d).not_supported.extend(["nvmlDeviceGetPowerUsage", "NVML_FI_DEV_MEMORY_TEMP"]))
    asked: list[int] = []
    real = gpus.nvml.nvmlDeviceGetPowerUsage

    def counting(handle):
        asked.append(gpus.nvml.nvmlDeviceGetIndex(handle))
        return real(handle)

    monkeypatch.setattr(gpus.nvml, "nvmlDeviceGetPowerUsage", counting)
    snapshot = gpus.runs(3)
    assert gpus.value(snapshot, power.USAGE, 0) is None
    assert gpus.value(snapshot, power.USAGE, 1) > 0
    assert gpus.value(snapshot, thermal.TEMPERATURE, 0, sensor="memory") is None
    assert gpus.value(snapshot, thermal.TEMPERATURE, 1, sensor="memory") > 0
    assert (asked.count(0), asked.count(1)) == (1, 3)
    assert gpus.value(snapshot, health.CALL_UNSUPPORTED, 0, call="nvmlDeviceGetPowerUsage") == 1
    assert gpus.value(snapshot, health.CALL_UNSUPPORTED, 0, call="field:memory_temp") == 1
    assert snapshot.value(health.ERRORS, call="nvmlDeviceGetPowerUsage", error="not_supported") is None

    gpus.change(lambda d: gpus.gpu(0)(d).not_supported.clear())
    now[0] = 1.0  # past the static refresh, which asks again
    snapshot = gpus.run()
    assert gpus.value(snapshot, power.USAGE, 0) > 0
    assert gpus.value(snapshot, health.CALL_UNSUPPORTED, 0, call="nvmlDeviceGetPowerUsage") is None


def test_a_failing_call_is_counted_and_its_series_omitted(rig):
    gpus = rig(count=2)
    gpus.change(lambda d: setattr(gpus.gpu(1)(d), "errors", {"nvmlDeviceGetEnforcedPowerLimit": "UNKNOWN"}))
    sink = SampleSink("gpu")
    gpus.collector.collect(sink)
    gpus.collector.collect(sink)
    snapshot = sink.freeze(0)
    assert gpus.value(snapshot, power.LIMIT, 1) is None
    assert gpus.value(snapshot, power.LIMIT, 0) == 700
    assert snapshot.value(health.ERRORS, call="nvmlDeviceGetEnforcedPowerLimit", error="unknown") == 2
    assert sink.partial_errors == 2  # one per run: the framework's errors_total{kind="partial"}
    assert gpus.value(snapshot, inventory.UP, 1) == 1


def test_nvml_init_failures_are_retried_with_backoff(rig):
    now = [0.0]
    gpus = rig(count=1, clock=lambda: now[0], init_retry_max_seconds=4)
    gpus.change(lambda d: setattr(d, "init_error", "DRIVER_NOT_LOADED"))
    attempts = []
    for second in (0, 0.5, 1.1, 2.0, 3.2, 5.0, 7.3, 10.0, 11.4):
        now[0] = second
        snapshot = gpus.run()
        attempts.append(snapshot.value(health.INIT_FAILURES, error="driver_not_loaded"))
        assert snapshot.value(health.NVML_UP) == 0
        assert inventory.UP not in snapshot.families
    # Waits of 1, 2, 4, then 4 (the maximum) seconds between attempts.
    assert attempts == [1, 1, 2, 2, 3, 3, 4, 4, 5]
    gpus.change(lambda d: setattr(d, "init_error", None))
    now[0] = 20.0
    snapshot = gpus.run()
    assert snapshot.value(health.NVML_UP) == 1
    assert gpus.value(snapshot, inventory.UP, 0) == 1


def test_when_nvml_stops_working_the_run_fails_and_the_next_one_initializes_again(rig):
    gpus = rig(count=1)
    before = gpus.runs(2)
    gpus.nvml.nvmlShutdown()  # as after a driver reload: every call answers UNINITIALIZED
    with pytest.raises(NvmlDown, match="uninitialized"):
        gpus.run()
    after = gpus.run()
    assert after.value(health.NVML_UP) == 1
    assert gpus.value(after, inventory.UP, 0) == 1
    assert gpus.value(after, power.ENERGY, 0) >= gpus.value(before, power.ENERGY, 0)


def test_wrapping_counters_are_unwrapped(rig):
    now = [100.0]
    gpus = rig(count=1, gpu_clock=lambda: now[0])  # the GPUs' time moves only when the test says
    gpus.change(lambda d: setattr(d, "load", 1.0))
    gpus.run()
    simulated = gpus.nvml.gpus[0].pcie_bytes  # the simulator's own, unbounded count
    simulated["rx"] = (1 << 32) - 100_000_000  # the 32-bit field wraps after 0.2 s at full load
    now[0] += 0.01
    first, at_first = gpus.value(gpus.run(), pcie.BYTES, 0, direction="rx"), simulated["rx"]
    now[0] += 1.0
    second, at_second = gpus.value(gpus.run(), pcie.BYTES, 0, direction="rx"), simulated["rx"]
    assert at_first < 1 << 32 < at_second  # NVML's 32-bit value wrapped to a small number...
    assert second - first == at_second - at_first  # ...ours kept counting


def test_the_process_table_attributes_gpu_use_to_pids(rig):
    gpus = rig(count=2)
    trainer = control.Process(pid=7001, memory_bytes=30 << 30, sm_utilization=0.8, name="ray::TrainWorker")
    gpus.change(lambda d: (gpus.gpu(0)(d).processes.append(trainer),
                           gpus.gpu(1)(d).processes.extend([trainer, control.Process(pid=7002, memory_bytes=1 << 30)])))
    assert gpus.collector.shared.gpu_processes.get() == {}  # before the first run
    snapshot = gpus.runs(2)
    table = gpus.collector.shared.gpu_processes.get()
    assert isinstance(table, MappingProxyType)
    assert set(table) == {7001, 7002}
    assert [(u.gpu, u.uuid) for u in table[7001]] == [(0, gpus.nvml.gpus[0].uuid), (1, gpus.nvml.gpus[1].uuid)]
    usage = table[7001][0]
    assert usage == GpuProcessUsage(pid=7001, gpu=0, uuid=gpus.nvml.gpus[0].uuid, used_memory_bytes=30 << 30,
                                    sm_utilization=0.8, memory_bandwidth_utilization=usage.memory_bandwidth_utilization,
                                    process_name="ray::TrainWorker")
    with pytest.raises(TypeError):
        table[1] = ()  # type: ignore[index]
    with pytest.raises(AttributeError):
        usage.pid = 1  # type: ignore[misc]
    assert gpus.value(snapshot, processes.PROCESSES, 1) == 2
    assert gpus.value(snapshot, processes.PROCESSES, 0) == 1
    assert gpus.value(snapshot, processes.MEMORY_USED, 1, pid=7002) == 1 << 30
    assert gpus.value(snapshot, processes.SM_UTILIZATION, 0, pid=7001) == 0.8
    assert gpus.value(snapshot, processes.INFO, 0, pid=7001, process_name="ray::TrainWorker") == 1
    assert gpus.value(snapshot, memory.USED, 1) == (31 << 30) + gpus.nvml.model.reserved_bytes

    gpus.change(lambda d: gpus.gpu(1)(d).processes.clear())
    snapshot = gpus.run()
    assert set(gpus.collector.shared.gpu_processes.get()) == {7001}
    assert gpus.value(snapshot, processes.MEMORY_USED, 1, pid=7002) is None  # gone, not frozen
    assert gpus.value(snapshot, processes.PROCESSES, 1) == 0


def test_per_process_series_are_bounded_for_the_node_largest_memory_first(rig):
    gpus = rig(count=2, max_process_series=3)
    gpus.change(lambda d: (
        gpus.gpu(0)(d).processes.extend([control.Process(pid=100 + i, memory_bytes=(i + 1) << 30) for i in range(3)]),
        gpus.gpu(1)(d).processes.extend([control.Process(pid=200 + i, memory_bytes=(i + 10) << 30) for i in range(2)])))
    snapshot = gpus.runs(2)
    exported = {(labels["gpu"], labels["pid"]) for labels in _label_sets(snapshot, processes.MEMORY_USED)}
    assert exported == {("1", "200"), ("1", "201"), ("0", "102")}  # 11, 10 and 3 GiB: the 3 largest of the node
    assert {labels["pid"] for labels in _label_sets(snapshot, processes.INFO)} == {"200", "201", "102"}
    assert snapshot.value(processes.UNLISTED) == 2
    # The count and the Ray attribution still see every process.
    assert gpus.value(snapshot, processes.PROCESSES, 0) == 3
    assert set(gpus.collector.shared.gpu_processes.get()) == {100, 101, 102, 200, 201}


def test_per_process_series_can_be_turned_off(rig):
    off = rig(count=1, max_process_series=0)
    off.change(lambda d: off.gpu(0)(d).processes.append(control.Process(pid=300, memory_bytes=1 << 30)))
    snapshot = off.run()
    assert not _label_sets(snapshot, processes.MEMORY_USED)
    assert snapshot.value(processes.UNLISTED) == 1


def _label_sets(snapshot: Snapshot, spec: MetricSpec) -> list[dict[str, str]]:
    return [dict(zip(spec.labels, values, strict=True)) for values, _ in snapshot.families.get(spec, ())]


def test_mig_instances_are_reported_and_whole_gpu_utilization_is_omitted(rig):
    gpus = rig(count=2)
    gpus.change(lambda d: setattr(gpus.gpu(1)(d), "mig", ["4g.40gb", "2g.20gb", "1g.10gb"]))
    snapshot = gpus.runs(2)
    instances = [dict(zip(mig.INSTANCE_INFO.labels, labels, strict=True))
                 for labels, _ in snapshot.families[mig.INSTANCE_INFO]]
    assert sorted(i["profile"] for i in instances) == ["1g.10gb", "2g.20gb", "4g.40gb"]
    assert {i["uuid"] for i in instances} == {gpus.nvml.gpus[1].uuid}
    assert all(i["mig_uuid"].startswith("MIG-") for i in instances)
    assert gpus.value(snapshot, mig.MODE, 1, state="current") == 1
    assert gpus.value(snapshot, mig.MODE, 0,
                                                                                  state="current") == 0
    assert gpus.value(snapshot, mig.MEMORY_TOTAL, 1, gpu_instance_id=2) == 20e9
    assert 0 <= gpus.value(snapshot, mig.SM_ACTIVE, 1, gpu_instance_id=1) <= 1
    assert gpus.value(snapshot, utilization.UTILIZATION, 1) is None  # NVML has none with MIG on
    assert gpus.value(snapshot, utilization.UTILIZATION, 0) is not None


def test_xid_counters_count_per_gpu_and_code(rig):
    gpus = rig(count=2)
    gpus.run()  # starts the watcher
    started = time.time()
    gpus.change(lambda d: (control.inject_xid(gpus.gpu(0)(d), 48), control.inject_xid(gpus.gpu(0)(d), 48),
                           control.inject_xid(gpus.gpu(1)(d), 79)))

    def counted(snapshot: Snapshot) -> bool:
        return snapshot.value(events.XID_ERRORS, **gpus.labels(1), xid=79) == 1 and snapshot.value(
            events.XID_ERRORS, **gpus.labels(0), xid=48) == 2

    snapshot = gpus.wait_for_events(counted)
    assert snapshot.value(events.WATCHER_UP) == 1
    assert started <= snapshot.value(events.XID_LAST, **gpus.labels(0), xid=48) <= time.time()
    assert snapshot.value(events.EVENTS, **gpus.labels(0), type="double_bit_ecc") == 2
    assert snapshot.value(events.EVENTS, **gpus.labels(0), type="xid") == 2
    assert snapshot.value(events.XID_ERRORS, **gpus.labels(1), xid=48) is None
    assert gpus.value(gpus.run(), inventory.UP, 1) == 0  # 79: fallen off the bus


def test_the_events_collector_without_a_gpu_collector_reports_the_watcher_down(tmp_path):
    collector = events.GpuEventsCollector(load_config(environ={}))
    sink = SampleSink("gpu_events")
    asyncio.run(collector.collect(sink))
    assert sink.freeze(0).value(events.WATCHER_UP) == 0


def test_one_run_of_eight_gpus_reads_them_all(rig):
    gpus = rig(count=8)
    snapshot = gpus.runs(2)
    assert snapshot.value(inventory.DEVICES) == 8
    assert len({labels for labels, _ in snapshot.families[inventory.UP]}) == 8
    assert all(value == 1 for _, value in snapshot.families[inventory.UP])
    assert {dict(zip(inventory.INFO.labels, labels, strict=True))["uuid"]
            for labels, _ in snapshot.families[inventory.INFO]} == {g.uuid for g in gpus.nvml.gpus}
