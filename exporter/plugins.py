"""What the exporter can be configured to run, and the one place that chooses it: the registered
collectors, the simulator's GPU models, and the NVML the gpu collector reads (the real pynvml, or
simulated GPUs). The configuration names them but imports neither (exporter/config.py is a leaf);
loading a configuration through here checks the names as well.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporter.collectors.gpu.families import COLLECTOR as GPU_COLLECTOR
from exporter.config import ExporterConfig, Known, load_config
from exporter.framework.collector import Collector, load_collectors
from exporter.framework.shared import Shared
from exporter.gpusim.models import MODELS


def known() -> Known:
    return Known(collectors=frozenset(load_collectors()), gpu_models=tuple(MODELS))


def load(flags: Mapping[str, Any] | None = None, config_file: Path | None = None,
         environ: Mapping[str, str] | None = None) -> ExporterConfig:
    """load_config with every name checked: what `exporter serve` and `check-config` use."""
    return load_config(flags, config_file, environ, known())


def nvml_module(config: ExporterConfig) -> Any:
    """The NVML the configuration asks for: the real pynvml, or simulated GPUs."""
    settings = config.gpu
    if settings.simulate:
        from exporter.gpusim.nvml import SimulatedNvml

        # One seed per exporter, so that exporters of several simulated nodes on one host get
        # different GPU UUIDs, and a restarted exporter the same ones.
        seed = f"{config.node.name or socket.gethostname()}:{config.listen}"
        return SimulatedNvml(settings.simulate, settings.simulate_model, settings.control_file, seed=seed)
    import pynvml

    return pynvml


def enabled_collectors(config: ExporterConfig, shared: Shared) -> list[Collector]:
    """Instantiate every registered collector that the configuration enables; the gpu collector gets
    the NVML chosen above."""
    collectors = []
    for name, cls in sorted(load_collectors().items()):
        enabled = config.collector_settings(name).enabled
        if enabled if enabled is not None else cls.default_enabled:
            sources = {"nvml": nvml_module(config)} if name == GPU_COLLECTOR else {}
            collectors.append(cls(config, shared, **sources))
    return collectors
