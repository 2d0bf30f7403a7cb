"""A large cluster's record as a distribution (launcher/recording.py, above FLEET_NODES targets): per round,
per kept metric and the labels that are not a node's, a GPU's or a rank's identity, the fleet's count, sum,
min, max and quantiles, written as series named the way recording rules are (`fleet:<metric>:<operation>`,
e.g. `fleet:raypulse_gpu_utilization_ratio:p95`); and which targets are outliers that round, so that the
recorder keeps their own series for a window.

The outlier rule (docs/reports.md): among at least MIN_COUNT values of one metric and label set, a value
outside [p25 - slack, p75 + slack], slack = 3 x (p75 - p25) + 10% of |median| (Tukey's far-out fences, widened
by a tenth of the median so that a fleet whose values are all equal does not call a one-step lag an outlier,
while a fault counter at 1 among zeros, or an `up` of 0 among ones, is one).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

FLEET_NODES = 64  # above this many targets a round keeps the fleet's distribution, not every node's series
LEVEL = "fleet"
OPERATIONS = ("count", "sum", "min", "p5", "p50", "p95", "max")
# Labels that name one member of the fleet: left out of the distribution's labels (it is across them).
IDENTITY = frozenset({"node", "instance", "ray_node_id", "gpu", "uuid", "pci_bus_id", "serial", "rank", "pid",
                      "node_id", "node_ip", "node_name", "hostname", "vbios_version"})
MIN_COUNT = 8  # fewer values than this make no distribution to be an outlier of
FENCE_IQRS = 3.0
FENCE_MEDIAN_SHARE = 0.1


def series_name(name: str, operation: str) -> str:
    """The recording-rule name of one aggregate of the sample name `name`."""
    return f"{LEVEL}:{name}:{operation}"


def parse_name(name: str) -> tuple[str, str] | None:
    """(metric, operation) of an aggregate's name, None for any other series."""
    level, _, rest = name.partition(":")
    metric, _, operation = rest.rpartition(":")
    return (metric, operation) if level == LEVEL and operation in OPERATIONS and metric else None


@dataclass
class Round:
    """One round's distribution: per key (Fleet.keys' index) each operation's value, and each outlying
    target's score (how far out, in fences' units)."""

    keys: np.ndarray
    stats: dict[str, np.ndarray]
    outliers: dict[int, float]


class Fleet:
    """Maps every series id the recorder gives out to its distribution key (its name and labels without
    IDENTITY), and reduces a round's values to distributions."""

    def __init__(self) -> None:
        self.keys: list[tuple[str, dict[str, str]]] = []  # (sample name, labels) per key index
        self._index: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._of = array("q")  # series id -> key index, -1: none

    def note(self, ident: int, name: str, labels: Mapping[str, str]) -> None:
        kept = {k: v for k, v in labels.items() if k not in IDENTITY}
        key = (name, tuple(sorted(kept.items())))
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.keys)
            self.keys.append((name, kept))
        if len(self._of) <= ident:
            self._of.extend([-1] * (ident + 1 - len(self._of)))
        self._of[ident] = index

    def reduce(self, parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> Round:
        """The distribution of each key over a round; `parts` is each target's (ids, values)."""
        lengths = [len(ids) for ids, _ in parts]
        ids = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
        values = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
        owner = np.repeat(np.arange(len(parts)), lengths)
        of = np.frombuffer(self._of, np.int64) if len(self._of) else np.zeros(0, np.int64)
        valid = (ids >= 0) & (ids < len(of))
        key = np.full(len(ids), -1, np.int64)
        key[valid] = of[ids[valid]]
        keep = (key >= 0) & np.isfinite(values)
        key, values, owner = key[keep], values[keep], owner[keep]
        if not len(key):
            return Round(np.zeros(0, np.int64), {op: np.zeros(0) for op in OPERATIONS}, {})
        order = np.lexsort((values, key))
        key, values, owner = key[order], values[order], owner[order]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        counts = np.diff(np.r_[starts, len(key)])

        def quantile(share: float) -> np.ndarray:  # the nearest rank
            return values[starts + np.floor(share * (counts - 1) + 0.5).astype(np.int64)]

        stats = {"count": counts.astype(float), "sum": np.add.reduceat(values, starts), "min": values[starts],
                 "p5": quantile(0.05), "p50": quantile(0.5), "p95": quantile(0.95), "max": values[starts + counts - 1]}
        low, high = quantile(0.25), quantile(0.75)
        spread = high - low
        slack = FENCE_IQRS * spread + FENCE_MEDIAN_SHARE * np.abs(stats["p50"])
        group = np.repeat(np.arange(len(starts)), counts)
        out = (counts[group] >= MIN_COUNT) & ((values < (low - slack)[group]) | (values > (high + slack)[group]))
        outliers: dict[int, float] = {}
        if out.any():
            unit = np.maximum(np.maximum(spread, FENCE_MEDIAN_SHARE * np.abs(stats["p50"])), 1e-12)[group[out]]
            scores = np.abs(values[out] - stats["p50"][group[out]]) / unit
            for target, score in zip(owner[out].tolist(), scores.tolist(), strict=True):
                outliers[target] = max(score, outliers.get(target, 0.0))
        return Round(key[starts], stats, outliers)
