"""A fleet of N simulated 8-GPU nodes for the recorder (launcher/recording.py), in process: each node's
exposition is the exporter's (the families, label names, types and `_total` counters of exporter/'s
catalog for GPU utilization, memory, power, temperature, up and XIDs, node memory, and training step and
loss per rank), answered through the recorder's own transport hook (ScrapeTarget.reader, which KubeRay
uses) with ETags as the exporter gives them: an unchanged body is a 304. No HTTP, so a week of rounds
can be driven in minutes; values move when `tick()` says so.

Faults (`fault(node, kind)`): "xid" (an XID 79 counted on GPU 3), "idle" (GPU 3 at 0% while the others
work: an outlier), "down" (the node's exporter does not answer: `up` 0); `heal(node)` ends one.
"""

from __future__ import annotations

import math

from launcher.health.exporters import Answer, Reader, ReadError
from launcher.recording import ScrapeTarget

GPUS = 8
CLUSTER = "fleet"
SUBMISSION = "fleet-1-a1"


class FakeFleet:
    def __init__(self, nodes: int, gpus: int = GPUS) -> None:
        self.nodes, self.gpus = nodes, gpus
        self.version = 0  # bumped by tick(): every node's values move
        self.step = 0
        self.faults: dict[int, str] = {}
        self._cache: dict[int, tuple[str, bytes]] = {}

    def name(self, node: int) -> str:
        return f"node-{node:04d}"

    def targets(self) -> list[ScrapeTarget]:
        """Every node's exporter as /sd would list it, with the labels Prometheus would give it."""
        found = []
        for node in range(self.nodes):
            address = f"10.{node // 250}.{node % 250}.1:9400"
            labels = {"cluster": CLUSTER, "node": self.name(node), "role": "head" if node == 0 else "worker",
                      "ray_node_id": f"ray-{node:04d}", "job": "raypulse", "instance": address}
            found.append(ScrapeTarget(address, labels, reader=self._reader(node)))
        return found

    def tick(self, steps: int = 1) -> None:
        self.version += 1
        self.step += steps

    def fault(self, node: int, kind: str) -> None:
        self.faults[node] = kind
        self._cache.pop(node, None)

    def heal(self, node: int) -> None:
        self.faults.pop(node, None)
        self._cache.pop(node, None)

    def _reader(self, node: int) -> Reader:
        def read(path: str, timeout: float, etag: str | None) -> Answer:
            if self.faults.get(node) == "down":
                raise ReadError(f"{self.name(node)}: connection refused")
            tag, body = self._body(node)
            return Answer(None, tag) if etag == tag else Answer(body, tag)
        return read

    def _body(self, node: int) -> tuple[str, bytes]:
        cached = self._cache.get(node)
        tag = f'"{self.version}-{self.faults.get(node, "")}"'
        if cached is not None and cached[0] == tag:
            return cached
        fault, v = self.faults.get(node), self.version
        lines = []
        for family, kind, unit_help in (("raypulse_gpu_utilization_ratio", "gauge", "GPU busy share"),
                                        ("raypulse_gpu_memory_used_bytes", "gauge", "GPU memory used"),
                                        ("raypulse_gpu_power_usage_watts", "gauge", "GPU power"),
                                        ("raypulse_gpu_temperature_celsius", "gauge", "GPU temperature"),
                                        ("raypulse_gpu_up", "gauge", "1 if the GPU answers")):
            lines += [f"# HELP {family} {unit_help}", f"# TYPE {family} {kind}"]
            for gpu in range(self.gpus):
                wave = math.sin(v / 7 + node * 0.37 + gpu)  # each GPU moves a little, differently
                idle = fault == "idle" and gpu == 3
                value = {"raypulse_gpu_utilization_ratio": 0.0 if idle else 0.9 + 0.05 * wave,
                         "raypulse_gpu_memory_used_bytes": float(int(6e10 + 1e9 * wave)),
                         "raypulse_gpu_power_usage_watts": 80.0 if idle else round(600 + 40 * wave, 1),
                         "raypulse_gpu_temperature_celsius": round(62 + 4 * wave, 1),
                         "raypulse_gpu_up": 1.0}[family]
                sensor = ',sensor="gpu"' if family.endswith("_celsius") else ""
                lines.append(f'{family}{{gpu="{gpu}",uuid="GPU-{node:04d}-{gpu}"{sensor}}} {value}')
        lines += ["# HELP raypulse_gpu_xid_errors XID errors", "# TYPE raypulse_gpu_xid_errors counter"]
        lines += [f'raypulse_gpu_xid_errors_total{{gpu="{gpu}",uuid="GPU-{node:04d}-{gpu}",xid="79"}} '
                  f'{1.0 if fault == "xid" and gpu == 3 else 0.0}' for gpu in range(self.gpus)]
        lines += ["# HELP raypulse_node_memory_available_bytes memory available",
                  "# TYPE raypulse_node_memory_available_bytes gauge",
                  f"raypulse_node_memory_available_bytes {float(int(1.5e12 + 1e10 * math.sin(v / 5 + node)))}"]
        for family, help_ in (("raypulse_train_step", "step"), ("raypulse_train_loss", "loss")):
            lines += [f"# HELP {family} {help_}", f"# TYPE {family} gauge"]
            for local in range(self.gpus):
                rank = node * self.gpus + local
                value = float(self.step) if family.endswith("step") else round(3.0 / (1 + self.step / 500), 6)
                lines.append(f'{family}{{job_id="",submission_id="{SUBMISSION}",rank="{rank}"}} {value}')
        body = ("\n".join(lines) + "\n").encode()
        self._cache[node] = (tag, body)
        return tag, body
