"""Reading what a framework logged (a dict of metric name -> value) for exporter.progress: the
framework modules beside this one (trl.py, verl.py, openrlhf.py) map its keys to raypulse's fields."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def number(logged: Mapping[str, Any], key: str) -> float | None:
    """The value logged under `key` as a finite float (Python, numpy and 0-d torch numbers alike); None for
    a key not logged, a bool, or anything else."""
    value = logged.get(key)
    if isinstance(value, bool):
        return None
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) else None
