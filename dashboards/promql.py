"""Just enough PromQL reading for the lint, the coverage script and the live test: the series
selectors an expression reads (metric name and label matchers), the range windows it uses, and
Grafana's macros and variables filled in so Prometheus can run it. Syntax itself is promtool's
job (tests/test_dashboards.py); this only has to find selectors in expressions that parse.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and",
                      "or", "unless", "atan2", "inf", "nan", "Inf", "NaN"})
LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<number>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?))
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<lbrace>\{)
  | (?P<other>\S)
""", re.VERBOSE)
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")\s*,?')
MACROS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value without quotes)

    def matcher(self, label: str) -> tuple[str, str] | None:
        for name, op, value in self.matchers:
            if name == label:
                return op, value
        return None


def _matchers(body: str) -> tuple[tuple[str, str, str], ...]:
    found, position = [], 0
    while position < len(body.strip()):
        match = _MATCHER.match(body, position)
        if match is None:
            raise ValueError(f"cannot read label matchers {{{body}}}")
        found.append((match.group(1), match.group(2), match.group(3)[1:-1]))
        position = match.end()
    return tuple(found)


def _braced(expr: str, start: int) -> int:
    """Index just past the `}` closing the `{` at `start`, skipping quoted strings."""
    position = start + 1
    while position < len(expr):
        char = expr[position]
        if char in "\"'`":
            position = expr.index(char, position + 1) if char == "`" else _string_end(expr, position)
        elif char == "}":
            return position + 1
        position += 1
    raise ValueError(f"unclosed {{ in {expr!r}")


def _string_end(expr: str, start: int) -> int:
    quote, position = expr[start], start + 1
    while expr[position] != quote:
        position += 2 if expr[position] == "\\" else 1
    return position


def selectors(expr: str) -> list[Selector]:
    """Every vector selector in `expr` (names in `by (...)` lists and function names are not)."""
    found: list[Selector] = []
    position, skip_label_list = 0, False
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:  # whitespace
            position += 1
            continue
        kind, text = match.lastgroup, match.group()
        position = match.end()
        if kind == "other" and text == "(" and skip_label_list:
            position = expr.index(")", position) + 1
            skip_label_list = False
            continue
        skip_label_list = False
        if kind == "ident":
            if text in LABEL_LIST_KEYWORDS:
                skip_label_list = True
                continue
            rest = expr[position:].lstrip()
            if text in KEYWORDS or rest.startswith("(") or re.match(r"(by|without)\b", rest):
                continue  # a keyword, a function or an aggregation (`sum by (x) (...)` too)
            if rest.startswith("{"):
                open_at = expr.index("{", position)
                close_at = _braced(expr, open_at)
                found.append(Selector(text, _matchers(expr[open_at + 1:close_at - 1])))
                position = close_at
            else:
                found.append(Selector(text, ()))
        elif kind == "lbrace":
            close_at = _braced(expr, position - 1)
            found.append(Selector("", _matchers(expr[position:close_at - 1])))
            position = close_at
    return found


def ranges(expr: str) -> list[str]:
    """The windows of every range selector or subquery (`5m`, `$__rate_interval`, `1h:1m`)."""
    return [m.group()[1:-1] for m in _TOKEN.finditer(expr) if m.lastgroup == "range"]


def metrics(expr: str) -> set[str]:
    return {selector.metric for selector in selectors(expr) if selector.metric}


def fill(expr: str, variables: Mapping[str, str], macros: Mapping[str, str] = MACROS) -> str:
    """The expression Grafana would send: macros and `$var` / `${var}` replaced (longest names first)."""
    for name in sorted(macros, key=len, reverse=True):
        expr = expr.replace(name, macros[name])
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", variables[name]).replace("$" + name, variables[name])
    return expr


def label_values_selector(query: str) -> str | None:
    """The selector of a `label_values(<selector>, <label>)` variable query (None without one)."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*", query)
    return match.group(1) if match else None


def iter_targets(dashboard: Mapping) -> Iterator[tuple[Mapping, Mapping]]:
    """(panel, target) for every query of a dashboard's JSON, collapsed rows included."""
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets") or []:
                yield inner, target
