"""Node and pod collectors on hardware and kernels this machine does not have.

InfiniBand adapters and cgroup v2 / v1-with-limits hierarchies are laid out as sysfs/cgroupfs
trees (the kernel's file formats, copied from real hosts) and the real collectors read them, the
way node_exporter tests its collectors against fixture trees.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from exporter.collectors.node import filesystem, infiniband
from exporter.collectors.node.filesystem import StatvfsWithTimeout, mount_holding, parse_mounts
from exporter.collectors.pod import collector as pod
from exporter.collectors.pod.cgroup import locate, parse_proc_cgroup, read_stats
from exporter.config import load_config
from exporter.framework.catalog import CATALOG
from exporter.framework.collector import load_collectors
from exporter.framework.snapshot import SampleSink, Snapshot
from tests.conftest import wait_until

POD_UID = "0f4a6e3c-1d2b-4c5e-9f80-123456789abc"
CONTAINER = "a" * 64


def write_tree(root: Path, files: dict[str, str]) -> None:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def collect(collector_cls, **config) -> Snapshot:
    collector = collector_cls(load_config(config, environ={}))
    sink = SampleSink(collector.name)
    collector.collect(sink)
    return sink.freeze(time.monotonic())


def served_names(snapshot: Snapshot) -> set[str]:
    return {spec.name for spec, _ in snapshot}


IB_PORT = {
    "state": "4: ACTIVE\n", "phys_state": "5: LinkUp\n", "rate": "400 Gb/sec (4X NDR)\n",
    "link_layer": "InfiniBand\n",
    "counters/port_rcv_data": "1000\n", "counters/port_xmit_data": "2500\n",
    "counters/port_rcv_packets": "10\n", "counters/port_xmit_packets": "20\n", "counters/symbol_error": "3\n",
    "counters/link_downed": "1\n", "counters/link_error_recovery": "2\n", "counters/port_rcv_errors": "0\n",
    "counters/port_rcv_remote_physical_errors": "0\n", "counters/port_xmit_discards": "5\n",
    "counters/port_xmit_wait": "77\n", "counters/local_link_integrity_errors": "0\n",
    "counters/excessive_buffer_overrun_errors": "0\n",
    **{f"hw_counters/{name}": "9\n" for name in infiniband.HW_COUNTERS},
}


def test_infiniband_ports_report_every_family_with_converted_units(tmp_path):
    write_tree(tmp_path / "class/infiniband/mlx5_0", {
        "hca_type": "MT4129\n", "board_id": "MT_0000000838\n", "fw_ver": "28.39.1002\n",
        **{f"ports/1/{k}": v for k, v in IB_PORT.items()}})
    write_tree(tmp_path / "class/infiniband/mlx5_1",
               {"ports/1/state": "1: DOWN\n", "ports/1/phys_state": "3: Disabled\n"})
    snapshot = collect(infiniband.InfinibandCollector, node={"sysfs": str(tmp_path)})

    load_collectors()
    assert served_names(snapshot) == {spec.name for spec in CATALOG.for_collector("infiniband")}
    port = {"device": "mlx5_0", "port": "1"}
    assert snapshot.value(infiniband.STATE, **port) == 4
    assert snapshot.value(infiniband.RATE, **port) == 400e9 / 8
    receive = CATALOG.get("raypulse_node_infiniband_receive_bytes_total")
    assert snapshot.value(receive, **port) == 4000  # 4-byte words
    assert snapshot.value(infiniband.HW_COUNTER, **port, counter="out_of_sequence") == 9
    # A port with only a state file: its state is reported, absent counters are omitted (not 0).
    assert snapshot.value(infiniband.PHYSICAL_STATE, device="mlx5_1", port="1") == 3
    assert snapshot.value(receive, device="mlx5_1", port="1") is None


def test_no_infiniband_adapters_is_not_an_error(tmp_path):
    assert served_names(collect(infiniband.InfinibandCollector, node={"sysfs": str(tmp_path)})) == set()


def cgroup_v2_tree(root: Path) -> str:
    pod_dir = f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice"
    write_tree(root, {
        "cgroup.controllers": "cpu io memory pids\n",
        f"{pod_dir}/cpu.stat": "usage_usec 5000000\nuser_usec 4000000\nsystem_usec 1000000\nnr_periods 100\n"
                               "nr_throttled 25\nthrottled_usec 1500000\n",
        f"{pod_dir}/cpu.max": "200000 100000\n",
        f"{pod_dir}/memory.current": "3000000000\n",
        f"{pod_dir}/memory.max": "4294967296\n",
        f"{pod_dir}/memory.peak": "3500000000\n",
        f"{pod_dir}/memory.swap.current": "0\n",
        f"{pod_dir}/memory.stat": "anon 2000000000\nfile 900000000\ninactive_file 500000000\n",
        f"{pod_dir}/memory.events": "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n",
        f"{pod_dir}/pids.current": "57\n",
        f"{pod_dir}/pids.max": "max\n",
        f"{pod_dir}/io.stat": "259:0 rbytes=1000 wbytes=2000 rios=1 wios=2\n8:0 rbytes=10 wbytes=20 rios=1 wios=1\n",
        f"{pod_dir}/cpu.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=1500000\n"
                                   "full avg10=0.00 avg60=0.00 avg300=0.00 total=500000\n",
        f"{pod_dir}/memory.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                                      "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        f"{pod_dir}/io.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                                  "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        f"{pod_dir}/cri-containerd-{CONTAINER}.scope/cpu.stat": "usage_usec 1\n",
    })
    return f"0::/{pod_dir}/cri-containerd-{CONTAINER}.scope\n"


def test_cgroup_v2_pod_is_found_from_the_container_and_read(tmp_path, monkeypatch):
    own = cgroup_v2_tree(tmp_path)
    location = locate(tmp_path, own)
    assert location.version == 2
    assert location.path.endswith(f"pod{POD_UID.replace('-', '_')}.slice")  # widened from the container
    assert location.pod_uid == POD_UID
    assert location.container_id == CONTAINER

    stats = read_stats(location)
    assert stats.cpu_usage_seconds == 5.0
    assert stats.cpu_throttled_seconds == 1.5
    assert stats.cpu_limit_cpus == 2.0
    assert stats.memory_limit_bytes == 4294967296
    assert stats.memory_working_set_bytes == 2_500_000_000
    assert stats.memory_oom_kills == 2
    assert stats.memory_limit_hits == 12
    assert stats.pids == 57
    assert stats.pids_limit is None
    assert stats.io_read_bytes == 1010
    assert stats.io_written_bytes == 2020
    assert stats.pressure["cpu"] == {"some": 1.5, "full": 0.5}


def test_the_pod_collector_serves_every_family_from_a_cgroup_v2_pod(tmp_path, monkeypatch):
    procfs = tmp_path / "proc"
    write_tree(procfs, {"self/cgroup": cgroup_v2_tree(tmp_path / "cgroup")})
    monkeypatch.setenv("POD_NAME", "trainer-head-x7k2")
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    monkeypatch.setenv("NODE_NAME", "gpu-node-17")
    snapshot = collect(pod.PodCollector, node={"procfs": str(procfs)}, pod={"cgroupfs": str(tmp_path / "cgroup")})

    load_collectors()
    expected = {spec.name for spec in CATALOG.for_collector("pod")} - {"raypulse_pod_pids_limit"}
    assert served_names(snapshot) == expected
    (labels, _), = snapshot.families[pod.INFO]
    identity = dict(zip(pod.INFO.labels, labels, strict=True))
    assert identity["pod"] == "trainer-head-x7k2"
    assert identity["namespace"] == "ml"
    assert identity["pod_uid"] == POD_UID
    assert identity["container_id"] == CONTAINER
    assert identity["node_name"] == "gpu-node-17"
    assert identity["cgroup_version"] == "2"


def test_cgroup_v1_with_limits(tmp_path):
    pod_path = f"kubepods/burstable/pod{POD_UID}"
    own = (f"12:pids:/{pod_path}/{CONTAINER}\n11:memory:/{pod_path}/{CONTAINER}\n"
           f"4:cpu,cpuacct:/{pod_path}/{CONTAINER}\n3:blkio:/{pod_path}/{CONTAINER}\n0::/\n")
    write_tree(tmp_path, {
        f"cpu/{pod_path}/cpu.stat": "nr_periods 10\nnr_throttled 4\nthrottled_time 2000000000\n",
        f"cpu/{pod_path}/cpu.cfs_quota_us": "150000\n",
        f"cpu/{pod_path}/cpu.cfs_period_us": "100000\n",
        f"cpuacct/{pod_path}/cpuacct.usage": "7000000000\n",
        f"cpuacct/{pod_path}/cpuacct.stat": f"user {6 * os.sysconf('SC_CLK_TCK')}\nsystem 0\n",
        f"memory/{pod_path}/memory.usage_in_bytes": "1000\n",
        f"memory/{pod_path}/memory.limit_in_bytes": "2000\n",
        f"memory/{pod_path}/memory.max_usage_in_bytes": "1500\n",
        f"memory/{pod_path}/memory.failcnt": "3\n",
        f"memory/{pod_path}/memory.stat": "total_rss 600\ntotal_cache 400\ntotal_inactive_file 100\n",
        f"memory/{pod_path}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        f"pids/{pod_path}/pids.current": "9\n",
        f"pids/{pod_path}/pids.max": "4096\n",
        f"blkio/{pod_path}/blkio.throttle.io_service_bytes_recursive": "8:0 Read 100\n8:0 Write 50\n8:0 Total 150\n"
                                                                      "Total 150\n",
    })
    (tmp_path / f"cpuacct/{pod_path}").mkdir(parents=True, exist_ok=True)
    assert parse_proc_cgroup(own)["cpuacct"] == f"/{pod_path}/{CONTAINER}"
    location = locate(tmp_path, own)
    assert location.version == 1
    assert location.path == f"/{pod_path}"
    stats = read_stats(location)
    assert stats.cpu_usage_seconds == 7.0
    assert stats.cpu_user_seconds == 6.0
    assert stats.cpu_throttled_periods == 4
    assert stats.cpu_throttled_seconds == 2.0
    assert stats.cpu_limit_cpus == 1.5
    assert stats.memory_limit_bytes == 2000
    assert stats.memory_working_set_bytes == 900
    assert stats.memory_oom_kills == 1
    assert stats.memory_limit_hits == 3
    assert stats.pids == 9
    assert stats.pids_limit == 4096
    assert (stats.io_read_bytes, stats.io_written_bytes) == (100, 50)


def test_an_unlimited_v1_memory_cgroup_has_no_limit_series(tmp_path):
    write_tree(tmp_path, {"memory/job/memory.usage_in_bytes": "1\n",
                          "memory/job/memory.limit_in_bytes": "9223372036854771712\n"})
    stats = read_stats(locate(tmp_path, "5:memory:/job\n"))
    assert stats.memory_usage_bytes == 1
    assert stats.memory_limit_bytes is None


def test_mount_table_parsing_and_watched_paths():
    mounts = parse_mounts("/dev/vda / ext4 rw,relatime 0 0\nnfs:/ckpt /mnt/check\\040points nfs4 ro 0 0\n"
                          "tmpfs /dev/shm tmpfs rw 0 0\n")
    assert mounts[1].mountpoint == "/mnt/check points"
    assert mounts[1].readonly
    mountpoints = [m.mountpoint for m in mounts]
    assert mount_holding(Path("/mnt/check points/run-7"), mountpoints) == "/mnt/check points"
    assert mount_holding(Path("/tmp/ray"), mountpoints) == "/"
    assert mount_holding(Path("/dev/shm"), mountpoints) == "/dev/shm"


def test_watched_paths_map_to_their_mounts_on_this_machine(tmp_path):
    snapshot = collect(filesystem.FilesystemCollector, node={"checkpoint_paths": [str(tmp_path / "ckpt")]})
    roles = {dict(zip(filesystem.PATH_INFO.labels, labels, strict=True))["role"]: labels
             for labels, _ in snapshot.families[filesystem.PATH_INFO]}
    assert set(roles) == {"checkpoint", "ray_temp", "object_store"}
    checkpoint_mount = roles["checkpoint"][2]
    assert snapshot.value(filesystem.SIZE, mountpoint=checkpoint_mount) > 0
    assert snapshot.value(filesystem.DEVICE_ERROR, mountpoint=checkpoint_mount) == 0


def test_a_hung_statvfs_blocks_only_its_mount_and_is_skipped_until_it_returns():
    release = threading.Event()
    calls: list[str] = []

    def stat(path: str) -> os.statvfs_result:
        calls.append(path)
        if path == "/hung":
            release.wait()
        return os.statvfs("/")

    statvfs = StatvfsWithTimeout(2.0, stat)  # ample for a statvfs that does not hang, on a loaded machine too
    assert statvfs("/hung") is None  # timed out
    assert statvfs("/") is not None  # another mount still answers
    assert statvfs("/hung") is None  # still stuck: skipped, no second thread
    assert calls.count("/hung") == 1
    release.set()
    wait_until(lambda: statvfs("/hung") is not None, 10, "the mount back once the stuck call returned")


@pytest.mark.parametrize(("text", "expected"), [("200 Gb/sec (4X HDR)", 25e9), ("10 Gb/sec (1X QDR)", 1.25e9),
                                                ("garbage", None), (None, None)])
def test_infiniband_rate_parsing(text, expected):
    assert infiniband.parse_rate(text) == expected
