"""Chaos around the health watcher and the recorder, on a real healed run: a local cluster started by
the launcher (a head and two workers with a simulated GPU each), every exporter read through a proxy the
test controls. While the job trains, one exporter dies mid-scrape (its body cut short of its
Content-Length), one trickles, one serves a gzip body that inflates past every cap. The run must go on,
the recording too (rounds keep landing, the broken targets `up` 0); once the exporters answer again, a
real fault (XID 79 on a worker's GPU) must still be healed: the node replaced, the run restarted from
its checkpoint, and SUCCEEDED.

Run under `flock /tmp/raypulse-heavy.lock` (it starts Ray).
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import launcher
from exporter.contract import wire
from launcher import recording
from launcher.state import RunRecord
from scripts.heal_drill.run import EXPORTER_FAST, RAY_HEALTH, inject_xid
from scripts.ports import free_port_range
from tests import broken_exporters as broken
from tests.conftest import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

# Two ranks, one per worker's GPU (a GPU fault counts on a node the job uses). Attempt 1 trains until
# it is stopped (a checkpoint every 10 steps); a later attempt resumes from the checkpoint it is given
# and ends ten steps on.
JOB = """\
import os, time
import ray
from exporter import progress

@ray.remote(num_cpus=1, num_gpus=1)
class Rank:
    def __init__(self, rank):
        self.rank = rank

    def step(self, step):
        time.sleep(0.2)
        progress.report(step, loss=1.0, rank=self.rank)

    def flush(self):
        progress.flush()

ray.init()
ranks = [Rank.remote(rank) for rank in range(2)]
resume = progress.resume_from() or {}
first = (resume.get("step") or 0) + 1
last = 10**6 if os.environ["RAYPULSE_ATTEMPT"] == "1" else first + 10
for step in range(first, last):
    ray.get([rank.step.remote(step) for rank in ranks])
    if step % 10 == 0:
        path = os.path.join(progress.checkpoint_dir(), f"step-{step}")
        with open(path, "w") as handle:
            handle.write(str(step))
        progress.checkpoint_saved(step, path=path, rank=0)
ray.get([rank.flush.remote() for rank in ranks])
progress.flush()
print("resumed from", resume.get("step"), flush=True)
"""
BOMB = broken.gzip_bomb(64 * 2**20)  # 64 MiB of zeros in ~64 KiB: past the reader's inflated cap


class ChaosProxy(broken.RawServer):
    """Stands in front of one exporter: forwards its /metrics and /sd (whose targets it points at the
    proxies), or answers /metrics the way `mode` says a broken exporter does."""

    def __init__(self, upstream: str, addresses: dict[str, str]) -> None:
        super().__init__(self._answer)
        self.upstream = upstream.rstrip("/")
        self.addresses = addresses  # exporter address -> its proxy's, for /sd
        self.mode = "pass"  # pass, cut (killed mid-scrape), trickle, bomb (oversized)
        self._path = threading.local()

    def _serve(self, connection: socket.socket) -> None:
        # The request line is read here (the base class reads the head and drops it).
        connection.settimeout(10)
        head = b""
        with connection:
            try:
                while broken.HEADERS_END not in head:
                    chunk = connection.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                self._path.value = head.split(b" ", 2)[1].decode()
                self.answer(connection, self)
            except OSError:
                pass

    def _answer(self, connection: socket.socket, server: broken.RawServer) -> None:
        path = self._path.value
        if path.startswith(wire.SD_PATH):
            body = self._upstream(path)
            for address, proxied in self.addresses.items():
                body = body.replace(address.encode(), proxied.encode())
        elif self.mode == "cut":
            broken.cut_short(connection, server)
            return
        elif self.mode == "bomb":
            BOMB(connection, server)
            return
        elif self.mode == "trickle":
            self.send(connection, broken.head("Content-Length: 1000"))
            while self.mode == "trickle":  # until the reader gives up (the send fails) or the chaos ends
                time.sleep(0.5)
                self.send(connection, b"x")
            return
        else:
            body = self._upstream(path)
        self.send(connection, broken.head(f"Content-Length: {len(body)}") + body)

    def _upstream(self, path: str) -> bytes:
        with urllib.request.urlopen(self.upstream + path, timeout=10) as response:
            return response.read()


@pytest.fixture
def environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The drill's fast exporter collectors and Ray health checks, and a home of the test's own."""
    for name, seconds in EXPORTER_FAST.items():
        monkeypatch.setenv(f"{wire.ENV_EXPORTER_PREFIX}COLLECTORS__{name.upper()}__INTERVAL_SECONDS", seconds)
    for key, value in RAY_HEALTH.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(wire.ENV_HOME, str(tmp_path / "home"))
    (tmp_path / "job.py").write_text(JOB)
    return tmp_path


@pytest.fixture
def proxies() -> Iterator[dict[str, ChaosProxy]]:
    made: dict[str, ChaosProxy] = {}
    yield made
    for proxy in made.values():
        proxy.mode = "pass"
        proxy.close()


def kinds_of(record: RunRecord, kind: str, since: float = 0.0) -> list:
    return [event for event in list(record.events) if event.kind == kind and event.time >= since]


def nodes_of(record: RunRecord, kind: str, since: float) -> set[str]:
    """The nodes events of `kind` name (one event names every node of its check, up to five)."""
    return {node for event in kinds_of(record, kind, since) for node in event.details["nodes"]}


def up_values(run_dir: Path, instance: str) -> list[float]:
    """The recorded `up` of one target (by its address), round by round."""
    read = recording.read(run_dir)
    return [value for series in read.select("up", instance=instance) for value in series.values]


def test_the_watcher_and_the_recorder_survive_broken_exporters_and_a_fault_is_healed_after(
        environment: Path, proxies: dict[str, ChaosProxy]):
    base = free_port_range(6)
    handle = launcher.submit({
        "name": "chaos", "run_id": "chaos-1", "entrypoint": "python job.py", "working_dir": str(environment),
        "worker_groups": [{"count": 2, "cpus": 1, "gpus": 1}], "simulate_gpus": True, "max_retries": 1,
        "retry_backoff_seconds": 1, "exporter_port": base, "progress_port": base + 1, "record_interval": 1,
        "health": {"check_interval_seconds": 1}})
    finished: list[RunRecord] = []
    waiter = threading.Thread(target=lambda: finished.append(handle.wait()), daemon=True)
    waiter.start()
    record, cluster = handle.record, handle.cluster
    run_dir = record.directory
    try:
        wait_until(lambda: bool(kinds_of(record, "attempt.running")) and bool(record.attempts[0].last_step), 180,
                   "attempt 1 to run and report a step")
        # Every exporter read goes through a proxy from now on (the watcher reads the cluster's record,
        # the recorder the head's /sd).
        addresses = {ref.url.split("://", 1)[1]: "" for ref in cluster.exporters}
        for ref in cluster.exporters:
            proxies[ref.node] = ChaosProxy(ref.url, addresses)
            addresses[ref.url.split("://", 1)[1]] = proxies[ref.node].address
        broken_modes = {"workers-2": "cut", "head": "trickle", "workers-1": "bomb"}
        for ref in cluster.exporters:
            ref.url = proxies[ref.node].url
        chaos_at = time.time()
        for node, mode in broken_modes.items():
            proxies[node].mode = mode

        # The watcher says each one does not answer; the recorder records each `up` 0 and goes on.
        wait_until(lambda: nodes_of(record, "health.exporter_unreachable", chaos_at) >= set(broken_modes), 90,
                   "the watcher to report every broken exporter")
        wait_until(lambda: all(0.0 in up_values(run_dir, proxy.address) for proxy in proxies.values()), 90,
                   "the recording to mark every broken target down")
        assert not finished, finished[0].reason  # the run went on
        rounds = recording.read(run_dir).rounds
        calm_at = time.time()
        for proxy in proxies.values():
            proxy.mode = "pass"
        wait_until(lambda: nodes_of(record, "health.exporter_back", calm_at) >= set(broken_modes), 90,
                   "the exporters to be read again")
        wait_until(lambda: recording.read(run_dir).rounds >= rounds + 2, 60, "recording rounds after the chaos")
        wait_until(lambda: (record.attempts[0].last_step or 0) >= 10, 60, "a checkpoint of attempt 1")

        # A real fault after all that is still healed.
        inject_xid(cluster, "workers-1")
        waiter.join(240)
    finally:
        if not finished:
            handle.stop()
            waiter.join(120)
    final = finished[0]
    assert (final.state, final.exit_code) == ("SUCCEEDED", 0), final.reason
    assert [attempt.status for attempt in final.attempts] == ["STOPPED", "SUCCEEDED"]
    [fault] = kinds_of(final, "health.fault")
    assert (fault.attempt, fault.details["fault"], fault.details["node"]) == (1, "gpu_fault", "workers-1")
    [resume] = kinds_of(final, "run.resume")
    assert resume.details["step"] is not None
    assert resume.details["step"] >= 10
    assert not kinds_of(final, "health.check_failed")  # every check ended as a check, never an error
    assert f"resumed from {resume.details['step']}" in final.attempt_log(2).read_text()
    ended = recording.read(run_dir)  # the recorder lived to the run's end, and said so in its file
    assert ended.rounds > rounds + 2
    assert [end["reason"] for end in ended.ends] == ["stopped"]
