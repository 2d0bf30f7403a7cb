"""What the exporter can be configured to run: the registered collectors and the simulator's GPU
models. The configuration names them but imports neither (exporter/config.py is a leaf); loading a
configuration through here checks the names as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporter.collector import load_collectors
from exporter.config import ExporterConfig, Known, load_config
from exporter.gpusim.models import MODELS


def known() -> Known:
    return Known(collectors=frozenset(load_collectors()), gpu_models=tuple(MODELS))


def load(flags: Mapping[str, Any] | None = None, config_file: Path | None = None,
         environ: Mapping[str, str] | None = None) -> ExporterConfig:
    """load_config with every name checked: what `exporter serve` and `check-config` use."""
    return load_config(flags, config_file, environ, known())
