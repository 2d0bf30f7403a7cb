"""Samples a collector gathers in one run, and the immutable snapshot they become.

A collector writes into a `SampleSink` while it runs; the framework freezes the sink into a
`Snapshot` only when the run succeeds, so a failed or late run never publishes half its data.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from exporter.framework.catalog import MetricSpec

LabelValues = tuple[str, ...]
Series = tuple[tuple[LabelValues, float], ...]


class SampleSink:
    """Write-only buffer of samples for the families one collector owns."""

    def __init__(self, collector: str) -> None:
        self.collector = collector
        self._samples: dict[MetricSpec, dict[LabelValues, float]] = {}
        self.partial_errors = 0

    def add(self, spec: MetricSpec, value: float | int | bool | None, **labels: object) -> None:
        """Record one sample. `None` or NaN means "no reading": the series is omitted."""
        if spec.collector != self.collector:
            raise ValueError(f"{spec.name} belongs to collector {spec.collector!r}, not {self.collector!r}")
        if value is None:
            return
        value = float(value)
        if math.isnan(value):
            return
        self._samples.setdefault(spec, {})[spec.label_values(labels)] = value

    def add_info(self, spec: MetricSpec, **labels: object) -> None:
        self.add(spec, 1.0, **labels)

    def partial_error(self) -> None:
        """Count a part of the collection that failed while the rest succeeded."""
        self.partial_errors += 1

    def freeze(self, taken_at: float) -> Snapshot:
        families = {spec: tuple(series.items()) for spec, series in self._samples.items()}
        return Snapshot(self.collector, taken_at, MappingProxyType(families))


@dataclass(frozen=True)
class Snapshot:
    """What one successful collector run saw. `taken_at` is on the monotonic clock."""

    collector: str
    taken_at: float
    families: Mapping[MetricSpec, Series]

    def series_count(self) -> int:
        return sum(len(series) for series in self.families.values())

    def __iter__(self) -> Iterator[tuple[MetricSpec, Series]]:
        return iter(self.families.items())

    def value(self, spec: MetricSpec, **labels: object) -> float | None:
        """Look one sample up; for tests and for collectors that build on others."""
        wanted = spec.label_values(labels)
        for values, value in self.families.get(spec, ()):
            if values == wanted:
                return value
        return None
