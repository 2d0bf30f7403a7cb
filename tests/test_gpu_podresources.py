"""GPUs attributed to pods through the kubelet's pod-resources API (a fake kubelet serving the real
proto, tests/fake_kubelet.py): labels, the sidecar/DaemonSet split, and a socket that is missing,
slow or refusing (the series lose the pod labels, never the samples)."""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.collectors.gpu import event_collector, inventory, power
from exporter.collectors.gpu.collector import GpuCollector
from exporter.config import load_config
from exporter.framework.collector import load_collectors
from exporter.framework.shared import NO_OWNER, OWNER_LABELS
from exporter.framework.snapshot import SampleSink, Snapshot
from exporter.gpusim import control
from exporter.gpusim.nvml import SimulatedNvml
from tests.fake_kubelet import FakeKubelet

load_collectors()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="kl") as directory:  # a unix socket path is short
        yield Path(directory)


@pytest.fixture
def control_file(tmp_path: Path) -> Path:
    return tmp_path / "gpus.json"


@pytest.fixture
def gpus(control_file: Path) -> SimulatedNvml:
    return SimulatedNvml(3, "H100", control_file)


def collector(gpus: SimulatedNvml, socket: Path, **settings: object) -> GpuCollector:
    # A kubelet's answer in 3 s even on a busy machine; the slow one below never answers (it waits 30 s).
    config = load_config({"gpu": {"simulate": len(gpus.gpus), "pod_resources_socket": str(socket),
                                  "pod_resources_refresh_seconds": 0.01, "pod_resources_timeout_seconds": 3.0,
                                  **settings}}, environ={})
    return GpuCollector(config, nvml=gpus, event_wait_ms=100)


def run(gpu_collector: GpuCollector) -> Snapshot:
    sink = SampleSink("gpu")
    gpu_collector.collect(sink)
    return sink.freeze(time.monotonic())


def series(snapshot: Snapshot, spec) -> dict[str, dict[str, str]]:
    """uuid -> its owner labels, for one per-GPU family."""
    found: dict[str, dict[str, str]] = {}
    for values, _ in snapshot.families.get(spec, ()):
        labels = dict(zip(spec.labels, values, strict=True))
        assert labels["uuid"] not in found  # each GPU once
        found[labels["uuid"]] = {name: labels[name] for name in OWNER_LABELS}
    return found


def two_pods(kubelet: FakeKubelet, uuids: list[str]) -> None:
    kubelet.pods[("team-a", "train-a-worker-0")] = {"ray-worker": [uuids[0]]}
    kubelet.pods[("team-b", "train-b-head")] = {"ray-head": [uuids[1]], "sidecar": []}


def test_a_daemonset_exporter_reports_every_gpu_with_the_pod_holding_it(gpus, socket_dir):
    uuids = [gpu.uuid for gpu in gpus.gpus]
    with FakeKubelet(socket_dir / "kubelet.sock", uuids) as kubelet:
        two_pods(kubelet, uuids)
        gpu_collector = collector(gpus, kubelet.socket)
        try:
            snapshot = run(gpu_collector)
        finally:
            gpu_collector.close()
    assert snapshot.value(inventory.POD_RESOURCES_UP) == 1
    for spec in (inventory.UP, power.USAGE, inventory.INFO):
        assert series(snapshot, spec) == {
            uuids[0]: {"pod": "train-a-worker-0", "namespace": "team-a", "container": "ray-worker"},
            uuids[1]: {"pod": "train-b-head", "namespace": "team-b", "container": "ray-head"},
            uuids[2]: dict(NO_OWNER)}  # no pod holds it: reported, without an owner


def test_two_gpu_pods_with_sidecars_on_one_node_report_each_gpu_once(gpus, socket_dir, monkeypatch):
    uuids = [gpu.uuid for gpu in gpus.gpus]
    seen: list[str] = []
    with FakeKubelet(socket_dir / "kubelet.sock", uuids) as kubelet:
        two_pods(kubelet, uuids)
        for namespace, pod in kubelet.pods:
            monkeypatch.setenv("POD_NAME", pod)
            monkeypatch.setenv("POD_NAMESPACE", namespace)
            sidecar = collector(gpus, kubelet.socket)
            try:
                snapshot = run(sidecar)
            finally:
                sidecar.close()
            owned = series(snapshot, inventory.UP)
            assert {owner["pod"] for owner in owned.values()} == {pod}  # only its own pod's GPUs
            assert series(snapshot, power.USAGE) == owned
            seen += owned
    assert sorted(seen) == sorted(uuids[:2])  # each GPU once; the GPU no pod holds is the DaemonSet's


def test_xid_events_carry_the_owner_and_a_sidecar_sees_only_its_own(gpus, control_file, socket_dir, monkeypatch):
    uuids = [gpu.uuid for gpu in gpus.gpus]
    monkeypatch.setenv("POD_NAME", "train-a-worker-0")
    monkeypatch.setenv("POD_NAMESPACE", "team-a")
    with FakeKubelet(socket_dir / "kubelet.sock", uuids) as kubelet:
        two_pods(kubelet, uuids)
        sidecar = collector(gpus, kubelet.socket)
        events = event_collector.GpuEventsCollector(sidecar.config, sidecar.shared)
        try:
            run(sidecar)
            for index in (0, 1):
                control.update(control_file, lambda d, i=index: control.inject_xid(control.gpu_entry(d, i), 31))
            deadline = time.monotonic() + 10
            while True:
                run(sidecar)
                sink = SampleSink("gpu_events")
                asyncio.run(events.collect(sink))
                xids = series(sink.freeze(time.monotonic()), event_collector.XID_ERRORS)
                if xids or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        finally:
            sidecar.close()
    assert xids == {uuids[0]: {"pod": "train-a-worker-0", "namespace": "team-a", "container": "ray-worker"}}


def _without_owners(snapshot: Snapshot, uuids: list[str]) -> None:
    assert snapshot.value(inventory.POD_RESOURCES_UP) == 0
    for spec in (inventory.UP, power.USAGE):
        assert series(snapshot, spec) == {uuid: dict(NO_OWNER) for uuid in uuids}  # every sample, no labels


def test_a_missing_socket_keeps_every_sample_without_pod_labels(gpus, socket_dir, caplog):
    gpu_collector = collector(gpus, socket_dir / "kubelet.sock")
    try:
        with caplog.at_level(logging.WARNING):
            _without_owners(run(gpu_collector), [gpu.uuid for gpu in gpus.gpus])
            time.sleep(0.02)  # past the refresh interval: asked again, said again only if it changes
            _without_owners(run(gpu_collector), [gpu.uuid for gpu in gpus.gpus])
    finally:
        gpu_collector.close()
    assert len([r for r in caplog.records if "pod-resources" in r.getMessage()]) == 1  # said once


@pytest.mark.parametrize("failure", ["slow", "refuse"])
def test_a_slow_or_refusing_kubelet_keeps_every_sample_and_the_labels_come_back(gpus, socket_dir, failure):
    uuids = [gpu.uuid for gpu in gpus.gpus]
    with FakeKubelet(socket_dir / "kubelet.sock", uuids) as kubelet:
        two_pods(kubelet, uuids)
        if failure == "slow":
            kubelet.slow.set()
        else:
            kubelet.refuse = True
        gpu_collector = collector(gpus, kubelet.socket)
        try:
            _without_owners(run(gpu_collector), uuids)
            kubelet.slow.clear()
            kubelet.refuse = False
            time.sleep(0.02)  # past the refresh interval
            back = run(gpu_collector)
        finally:
            gpu_collector.close()
    assert back.value(inventory.POD_RESOURCES_UP) == 1
    assert series(back, inventory.UP)[uuids[0]]["pod"] == "train-a-worker-0"


def test_the_standard_socket_absent_means_off_and_silent(gpus):
    config = load_config({"gpu": {"simulate": 3}}, environ={})
    gpu_collector = GpuCollector(config, nvml=gpus, event_wait_ms=100)
    try:
        snapshot = run(gpu_collector)
    finally:
        gpu_collector.close()
    assert inventory.POD_RESOURCES_UP not in snapshot.families  # not a Kubernetes node: nothing to say
    assert len(series(snapshot, inventory.UP)) == 3


def test_kubelet_gpu_ids_that_are_not_uuids_are_said_once(gpus, socket_dir, caplog):
    indexes = [str(index) for index in range(len(gpus.gpus))]  # --device-id-strategy=index
    with FakeKubelet(socket_dir / "kubelet.sock", indexes) as kubelet:
        kubelet.pods[("team-a", "train-a-worker-0")] = {"ray-worker": ["0"]}
        gpu_collector = collector(gpus, kubelet.socket, static_refresh_seconds=0.01)
        try:
            with caplog.at_level(logging.WARNING):
                first = run(gpu_collector)
                time.sleep(0.02)  # past the static refresh: enumerated again
                run(gpu_collector)
        finally:
            gpu_collector.close()
    assert first.value(inventory.POD_RESOURCES_UP) == 1
    assert series(first, inventory.UP) == {gpu.uuid: dict(NO_OWNER) for gpu in gpus.gpus}
    assert len([r for r in caplog.records if "device-id-strategy" in r.getMessage()]) == 1
