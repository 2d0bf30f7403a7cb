"""The metric catalog: every metric family raypulse exports, declared exactly once.

A collector module declares its families at import time with `gauge()`, `counter()` or
`info()` and then uses those same objects to emit samples, so a family's name, type, unit,
help and label names live in one place. `docs/metrics.md` is generated from this catalog and
the tests hold the live `/metrics` output and the catalog equal.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

PREFIX = "raypulse_"
# The standard process families every Prometheus client library exports under these names
# (prometheus_client's ProcessCollector): dashboards and alerts written for any exporter read them.
STANDARD_PREFIX = "process_"
# Units are Prometheus base units; the name must end in the unit (before `_total`).
UNITS = ("seconds", "bytes", "celsius", "watts", "joules", "hertz", "ratio", "volts", "amperes")
_NAME_RE = re.compile(rf"^({PREFIX}|{STANDARD_PREFIX})[a-z][a-z0-9_]*[a-z0-9]$")
_LABEL_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# Target labels Prometheus attaches itself; a series carrying them would be renamed exported_*.
_RESERVED_LABELS = frozenset({"job", "instance", "le", "quantile"})


class MetricType(enum.StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    INFO = "info"


@dataclass(frozen=True, eq=False)
class MetricSpec:
    """One metric family. Identity is the object itself; names are unique in the catalog."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...]
    collector: str
    unit: str = ""
    # Why the family may legitimately be absent from a live scrape ("only with InfiniBand
    # devices"); None means a running collector always emits it.
    only_when: str | None = None
    _label_index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_label_index", {n: i for i, n in enumerate(self.labels)})

    @property
    def base_name(self) -> str:
        """The name prometheus_client's family classes expect (no `_total` / `_info`)."""
        if self.type is MetricType.COUNTER:
            return self.name.removesuffix("_total")
        if self.type is MetricType.INFO:
            return self.name.removesuffix("_info")
        return self.name

    def label_values(self, labels: dict[str, object]) -> tuple[str, ...]:
        """Order `labels` as declared; a missing or unknown label name is a programming error."""
        if len(labels) != len(self.labels):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != declared {list(self.labels)}")
        values = [""] * len(self.labels)
        for key, value in labels.items():
            try:
                values[self._label_index[key]] = str(value)
            except KeyError:
                raise ValueError(f"{self.name}: unknown label {key!r}") from None
        return tuple(values)


class Catalog:
    """The registry of every declared family, keyed by name."""

    def __init__(self) -> None:
        self._specs: dict[str, MetricSpec] = {}

    def declare(self, spec: MetricSpec) -> MetricSpec:
        problems = naming_problems(spec)
        if problems:
            raise ValueError(f"metric {spec.name}: " + "; ".join(problems))
        if spec.name in self._specs:
            raise ValueError(f"metric {spec.name} is declared twice")
        self._specs[spec.name] = spec
        return spec

    def __iter__(self):
        return iter(sorted(self._specs.values(), key=lambda s: (s.collector, s.name)))

    def __len__(self) -> int:
        return len(self._specs)

    def get(self, name: str) -> MetricSpec | None:
        return self._specs.get(name)

    def for_collector(self, collector: str) -> list[MetricSpec]:
        return [s for s in self if s.collector == collector]


def naming_problems(spec: MetricSpec) -> list[str]:
    """The naming conventions (docs/metrics.md: prefix, domain, base units, _total on counters) as
    checks; an empty list means the spec is fine."""
    problems: list[str] = []
    if not _NAME_RE.match(spec.name) or "__" in spec.name:
        problems.append(f"name must be {PREFIX} (or the standard {STANDARD_PREFIX}) followed by snake_case")
    if spec.type is MetricType.COUNTER and not spec.name.endswith("_total"):
        problems.append("counter names end in _total")
    if spec.type is not MetricType.COUNTER and spec.name.endswith("_total"):
        problems.append("only counters end in _total")
    if (spec.type is MetricType.INFO) != spec.name.endswith("_info"):
        problems.append("info families, and only they, end in _info")
    if spec.unit:
        if spec.unit not in UNITS:
            problems.append(f"unit {spec.unit!r} is not a base unit {UNITS}")
        elif not spec.base_name.endswith("_" + spec.unit):
            problems.append(f"name must end in _{spec.unit}" + ("_total" if spec.type is MetricType.COUNTER else ""))
    else:
        for unit in UNITS:
            if spec.base_name.endswith("_" + unit):
                problems.append(f"name ends in _{unit} but unit is not declared")
    for label in spec.labels:
        if not _LABEL_RE.match(label):
            problems.append(f"label {label!r} is not snake_case")
        if label in _RESERVED_LABELS:
            problems.append(f"label {label!r} is reserved by Prometheus")
    if len(set(spec.labels)) != len(spec.labels):
        problems.append("duplicate label names")
    if not spec.help or spec.help[0].islower() or not spec.help.endswith("."):
        problems.append("help is a sentence: no lower-case first letter, ends in a period")
    return problems


CATALOG = Catalog()


def _declare(kind: MetricType, name: str, help: str, collector: str, labels: tuple[str, ...] | list[str],
             unit: str, only_when: str | None) -> MetricSpec:
    return CATALOG.declare(MetricSpec(name=name, type=kind, help=help, labels=tuple(labels),
                                      collector=collector, unit=unit, only_when=only_when))


def gauge(name: str, help: str, *, collector: str, labels: tuple[str, ...] | list[str] = (),
          unit: str = "", only_when: str | None = None) -> MetricSpec:
    return _declare(MetricType.GAUGE, name, help, collector, labels, unit, only_when)


def counter(name: str, help: str, *, collector: str, labels: tuple[str, ...] | list[str] = (),
            unit: str = "", only_when: str | None = None) -> MetricSpec:
    return _declare(MetricType.COUNTER, name, help, collector, labels, unit, only_when)


def info(name: str, help: str, *, collector: str, labels: tuple[str, ...] | list[str] = (),
         only_when: str | None = None) -> MetricSpec:
    return _declare(MetricType.INFO, name, help, collector, labels, "", only_when)
