"""The exporter of one node of a local cluster: where it listens and its `exporter serve` command
line. (Exporters on an existing cluster are placed by Ray: launcher/deploy/.)"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class ExporterPlan:
    node: str  # "head", "workers-1", ...
    role: str  # "head" or "worker"
    port: int
    progress_port: int
    dashboard_url: str
    cluster: str
    simulate_gpus: int = 0  # 0: none
    gpu_control: str | None = None  # the simulated GPUs' fault-injection file (`exporter gpu-fault --control`)
    # Where /metrics listens: the node's IP as Ray reports it (Ray resolves even a loopback
    # --node-ip-address to the host's address), because the head exporter's /sd advertises
    # <node ip>:<raypulse.io/exporter-port> to Prometheus. The progress endpoint stays on loopback.
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def progress_url(self) -> str:
        """RAYPULSE_PROGRESS_URL for the node's processes."""
        return f"http://127.0.0.1:{self.progress_port}"

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "exporter", "serve", "--listen", f"{self.host}:{self.port}",
                   "--ray-dashboard", self.dashboard_url, "--cluster", self.cluster, "--ray-role", self.role,
                   "--progress-listen", f"127.0.0.1:{self.progress_port}"]
        if self.simulate_gpus:
            command += ["--simulate-gpus", str(self.simulate_gpus)]
            if self.gpu_control:
                command += ["--gpu-control", self.gpu_control]
        return command
