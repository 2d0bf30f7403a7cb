"""The launcher's one reader of exporters' Prometheus text, for the health watcher and the run recorder:
an answer cut down to the families a reader keeps, then parsed by prometheus_client's parser, only the
sample lines that changed since the same target's last answer.

A node's /metrics is mostly families a reader does not keep, and from one answer to the next a training
node's kept lines differ in a few (its steps); the parser is most of what a read costs. So the lines of
other families are skipped unparsed, each kept sample line is hashed, and a line with the hash of the
line at its place in the last answer is not parsed again: the exporter serves its series in one order,
so an unchanged line is at its place (a line that moved is parsed again: correct, only slower). A line
whose series (all before its value) is the one at its place, with another value, has only its value read
(a gauge that moved: most of what changes on a GPU node from one scrape to the next). A read costs what it
keeps and what changed; what it skips costs one regex match (in C) a line. Callers read in worker threads,
never on an event loop.
"""

from __future__ import annotations

import math
import re
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


@dataclass(frozen=True, slots=True)
class Family:
    """A sample name's family as its HELP and TYPE lines say (`untyped` and no help without them)."""

    name: str
    type: str
    help: str


@dataclass(frozen=True, slots=True)
class Line:
    """One sample line, parsed."""

    family: Family
    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Value:
    """A sample line of the same series as the line at `position` in the last answer, with `value` now."""

    position: int
    value: float


@dataclass(frozen=True, slots=True)
class Read:
    """An answer's kept sample lines, in order: `keys` a hash of each (64-bit: a changed line keeping its
    hash is ~1e-19 likely), `items` for each either its position in the last answer's lines (the same
    line there: the caller has it already), a Value (the same series there, another value: only that
    read), or the line parsed now; `series` a hash of each line's series (what precedes its value), 0 for
    a line whose value is not read alone (the next read's `last_series`)."""

    keys: array
    items: list[int | Value | Line]
    series: array


def name_of(line: str) -> str | None:
    """The metric name a line of the text format is about (HELP, TYPE, or a sample); None for others."""
    if line.startswith("#"):
        parts = line.split(" ", 3)
        return parts[2] if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") else None
    end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
    return line[:end] if end > 0 else None


def keeping(names: Iterable[str] = (), prefixes: Iterable[str] = ()) -> re.Pattern[str]:
    """What read() keeps: the lines (HELP, TYPE and samples) whose metric name is one of `names` or starts
    with one of `prefixes`, as one regex whose group 1 is the name."""
    alternatives = [re.escape(name) for name in names] + [re.escape(prefix) + "[a-zA-Z0-9_:]*" for prefix in prefixes]
    if not alternatives:
        raise ValueError("keeping(): no names and no prefixes")
    return re.compile(r"(?:# (?:HELP|TYPE) )?(" + "|".join(alternatives) + r")(?=[ {]|$)")


def read(text: str, keep: re.Pattern[str], last: array | None, families: dict[str, Family],
         last_series: array | None = None) -> Read:
    """The lines of `text` that `keep` (from keeping()) matches, but a counter's `_created` (not a series),
    parsing only the sample lines not at their place in the answer whose keys are `last`; with that answer's
    `series` as `last_series`, a line of the series at its place there has only its value read (a Value).
    The family of every sample name parsed whole is noted in `families`; a changed line is parsed alone, so
    its name's family must be noted there already, else the whole answer is parsed. Raises what the parser
    raises on a broken exposition, and ValueError when its lines are not one sample each."""
    kept, lines = [], []
    for line in text.splitlines():
        match = keep.match(line)
        if match is None or match[1].endswith("_created"):
            continue
        kept.append(line)
        if not line.startswith("#"):
            lines.append(line)
    keys = array("q", (hash(line) for line in lines))
    if last is not None:
        items: list[int | Value | Line | None] = [
            position if position < len(last) and last[position] == key else None for position, key in enumerate(keys)]
        series = array("q", bytes(8 * len(lines)))  # 0: without `last_series`, none is compared
        if last_series is not None:
            for position, item in enumerate(items):
                if item is not None:  # the same line: the same series
                    series[position] = last_series[position] if position < len(last_series) else 0
                    continue
                head, value = _split(lines[position])
                series[position] = hashed = hash(head) if head is not None else 0
                if hashed and position < len(last_series) and last_series[position] == hashed \
                        and (number := _value(value)) is not None:
                    items[position] = Value(position, number)
        fresh = [line for line, item in zip(lines, items, strict=True) if item is None]
        parsed = [sample for family in text_string_to_metric_families("\n".join(fresh) + "\n")
                  for sample in family.samples] if fresh else []
        if len(parsed) == len(fresh) and all(sample.name in families for sample in parsed):
            new = iter(parsed)
            return Read(keys, [item if item is not None else _line(families[(sample := next(new)).name], sample)
                               for item in items], series)
    # The whole answer, with its HELP and TYPE lines: every sample name's family learnt.
    whole = []
    for family in text_string_to_metric_families("\n".join(kept) + "\n"):
        noted = Family(sys.intern(family.name), family.type, family.documentation)
        for sample in family.samples:
            families[sample.name] = noted
            whole.append(_line(noted, sample))
    if len(whole) != len(lines):
        raise ValueError(f"{len(whole)} samples of {len(lines)} sample lines")
    return Read(keys, whole, array("q", (_series(line) for line in lines)))


# What precedes a sample line's value when the parser reads that line as the series it names and the value
# as the one token after the last space (no timestamp): a bare name, or a name and a label set whose only
# `}` closes it (a `}` inside a label value could make the parser end the labels earlier).
_BARE_NAME = re.compile(r"[^\s{}\"#]+")


def _split(line: str) -> tuple[str | None, str]:
    """A sample line's series part and its value's text, or None for the series part when reading the value
    alone could differ from the parser's reading of the line."""
    head, space, value = line.rpartition(" ")
    if not space or not ((head.endswith("}") and head.count("}") == 1) or _BARE_NAME.fullmatch(head)):
        return None, value
    return head, value


def _series(line: str) -> int:
    head, _ = _split(line)
    return hash(head) if head is not None else 0


def _value(text: str) -> float | None:
    """A value as prometheus_client's parser reads one (an int if it is one, else a float; never `_` or
    whitespace), or None where it would not: the line is then parsed, and refused as the parser refuses it."""
    if not text or "_" in text or text != text.strip():  # whitespace within: neither int() nor float() takes it
        return None
    try:
        # float(int(text)) where int() takes it: the same float, correctly rounded both ways, but where the
        # int is too large for a float (the parser's line then fails): infinite here, left to the parser.
        value = float(text)
    except ValueError:
        return None
    return None if math.isinf(value) else value


def _line(family: Family, sample: Sample) -> Line:
    # Names interned: a few dozen, held by every kept sample of every node.
    return Line(family, sys.intern(sample.name), {sys.intern(key): value for key, value in sample.labels.items()},
                float(sample.value))
