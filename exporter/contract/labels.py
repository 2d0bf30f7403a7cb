"""The label contract: the names of the labels Prometheus attaches to raypulse's series that the alert
rules and dashboards select on, like a monitoring mixin's `_config` (kubernetes-mixin's `clusterLabel`).

    LabelContract()                                # cluster, node, job="raypulse": what /sd and the DaemonSet give
    LabelContract(cluster="ray_io_cluster")        # KubeRay's own PodMonitor names the Ray cluster so
    PROFILES["kuberay"]                            # the same, as one switch

One object, read by `alerts.build`, `dashboards.build` and `launcher exporters manifests` (DESIGN.md, "One label
contract"). The rules and boards are written once, with the default names; a contract maps their
rendered form onto its own names here, in one place, so no rule, legend, variable or data link can
keep the old name: label matchers, `by`/`without`/`on`/`ignoring`/`group_*` lists, the label arguments
of label_replace/label_join/count_values, Grafana's label_values(), `{{node}}` legends,
`{{ $labels.node }}` alert templates and `${__field.labels.node}` / `${__data.fields.node}` links.
The default contract changes nothing, byte for byte.

It lives in the exporter package and imports only the standard library because every reader can
import it there: alerts/ and dashboards/ already import the exporter (the catalog), and the exporter,
whose `manifests` command relabels the shipped rule files and dashboards with it, imports neither.
"""

from __future__ import annotations

import argparse
import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

DEFAULT_CLUSTER = "cluster"  # the label names the head exporter's /sd gives (exporter/collectors/ray/sd.py)
DEFAULT_NODE = "node"
DEFAULT_SCRAPE_JOB = "raypulse"
DEFAULT_RUNBOOK_BASE = "https://github.com/raypulse/raypulse/blob/main/docs/runbooks.md"
# Labels a contract may not take for the cluster or the node: Prometheus's own and those our series carry.
RESERVED = frozenset({"job", "instance", "role", "ray_node_id", "gpu", "uuid", "job_id", "submission_id", "rank",
                      "alertname", "alertstate", "severity", "scope", "le", "quantile"})
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # fullmatch: `$` would let a trailing newline through
# A scrape job is a plain name: it goes into the rules' PromQL as job="<it>", so no quote, brace or space.
_SCRAPE_JOB = re.compile(r"[a-zA-Z0-9_][a-zA-Z0-9_.:-]{0,127}")


@dataclass(frozen=True)
class LabelContract:
    cluster: str = DEFAULT_CLUSTER  # the label naming the Ray cluster
    node: str = DEFAULT_NODE  # the label naming the node (the Kubernetes node under the DaemonSet)
    # The Prometheus job raypulse's exporters are scraped under; the alert rules select their `up` with it.
    scrape_job: str = DEFAULT_SCRAPE_JOB
    job_selector: str = ""  # the matchers of that `up{...}`; default job="<scrape_job>"
    runbook_base: str = DEFAULT_RUNBOOK_BASE  # each alert links to `<runbook_base>#<alertname lowercased>`

    def __post_init__(self) -> None:
        for what, value in (("cluster label", self.cluster), ("node label", self.node)):
            if not _LABEL_NAME.fullmatch(value) or value.startswith("__"):
                raise ValueError(f"{what} {value!r} is not a Prometheus label name (letters, digits and '_', "
                                 "not starting with a digit or '__'); e.g. ray_io_cluster, not ray.io/cluster")
            if value in RESERVED:
                raise ValueError(f"{what} {value!r} is a label raypulse's series already have; pick another name")
        if self.cluster == self.node:
            raise ValueError(f"the cluster and node labels must differ (both are {self.cluster!r})")
        if not _SCRAPE_JOB.fullmatch(self.scrape_job):
            raise ValueError(f"scrape job {self.scrape_job!r} is not a plain job name (at most 128 letters, digits, "
                             "'_', '.', ':' and '-'; e.g. raypulse): the alert rules select job=\"<it>\"")
        if not self.runbook_base:
            raise ValueError("the runbook base URL must not be empty")

    @property
    def selector(self) -> str:
        """The matchers that select the `up` series of raypulse's scrape targets."""
        return self.job_selector or f'job="{self.scrape_job}"'

    @property
    def renames(self) -> dict[str, str]:
        """Default label name -> this contract's, for the names that differ."""
        return {old: new for old, new in ((DEFAULT_CLUSTER, self.cluster), (DEFAULT_NODE, self.node)) if old != new}

    @property
    def is_default(self) -> bool:
        return self == DEFAULT

    def label(self, name: str) -> str:
        """This contract's name for a label spelled `name` in the rules and boards."""
        return self.renames.get(name, name)

    def promql(self, expr: str) -> str:
        """`expr` with every label name of the default contract in this contract's name."""
        return _rename_promql(expr, self.renames) if self.renames else expr

    def template(self, text: str) -> str:
        """Grafana legends and links, and alert annotation templates, in this contract's names."""
        renames = self.renames
        if not renames:
            return text
        names = "|".join(map(re.escape, renames))
        swap = lambda match: match.group(1) + renames[match.group(2)] + match.group(3)  # noqa: E731
        text = re.sub(rf"(\{{\{{\s*)({names})(\s*\}}\}})", swap, text)  # {{node}}: a legend
        text = re.sub(rf"(\$labels\.)({names})(\b)", swap, text)  # {{ $labels.node }}: an alert template
        return re.sub(rf"(\$\{{__(?:field\.labels|data\.fields)\.)({names})(\}})", swap, text)  # a data link

    def rule_file(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """A rule file (`{"groups": [...]}`) rendered with the default contract, in this one: label
        names, the `up` selector and the runbook links."""
        out = copy.deepcopy(dict(doc))
        for group in out.get("groups", []):
            for rule in group.get("rules", []):
                rule["expr"] = self.promql(rule["expr"]).replace(f"up{{{DEFAULT.selector}", f"up{{{self.selector}")
                for key, value in (rule.get("annotations") or {}).items():
                    if key == "runbook_url" and value.startswith(DEFAULT_RUNBOOK_BASE + "#"):
                        value = self.runbook_base + value[len(DEFAULT_RUNBOOK_BASE):]
                    rule["annotations"][key] = self.template(value)
        return out

    def dashboard(self, dashboard: Mapping[str, Any]) -> dict[str, Any]:
        """A dashboard's JSON rendered with the default contract, in this one: every query (panel
        targets, variable queries), legend and data link."""
        def walk(value: Any, key: str = "") -> Any:
            if isinstance(value, dict):
                return {k: walk(v, k) for k, v in value.items()}
            if isinstance(value, list):
                return [walk(item, key) for item in value]
            if isinstance(value, str):
                if key in ("expr", "query", "definition"):
                    value = self.promql(value)
                return self.template(value)
            return value
        return walk(dashboard)


DEFAULT = LabelContract()
# KubeRay's own PodMonitor (and its Grafana dashboards) carry the Ray cluster as `ray_io_cluster`;
# `cluster` stays free for the Kubernetes cluster, as kubernetes-mixin uses it.
KUBERAY = LabelContract(cluster="ray_io_cluster")
PROFILES: dict[str, LabelContract] = {"default": DEFAULT, "kuberay": KUBERAY}


# --- PromQL (and Grafana's label_values()) --------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<var>\$\{[^}]*\}|\$[a-zA-Z_][a-zA-Z0-9_]*)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<number>\d[0-9a-fA-FxX.eE+-]*)
  | (?P<matchop>=~|!~|!=|==|=)
  | (?P<other>\S)
  | (?P<space>\s+)
""", re.VERBOSE)
_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})


def _label_argument(function: str, index: int) -> bool:
    """Whether argument `index` (0-based) of `function` is a label name (a string literal)."""
    if function == "label_replace":  # (v, dst, replacement, src, regex)
        return index in (1, 3)
    if function == "label_join":  # (v, dst, separator, src...)
        return index == 1 or index >= 3
    if function == "count_values":  # (label, v)
        return index == 0
    return function in ("sort_by_label", "sort_by_label_desc") and index >= 1


def _rename_promql(expr: str, renames: Mapping[str, str]) -> str:
    out: list[str] = []
    stack: list[list[Any]] = []  # per open parenthesis: [function or "(labels)", argument index]
    pending: str | None = None  # the identifier just before a `(`: a function or a label-list keyword
    in_braces = False
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:  # cannot happen: every character matches `other` or `space`
            raise ValueError(f"cannot read PromQL at {expr[position:]!r}")
        kind, text = match.lastgroup, match.group()
        position = match.end()
        if kind == "space":
            out.append(text)
            continue
        call = pending
        pending = None
        frame = stack[-1] if stack else None
        if kind == "ident":
            rest = expr[position:].lstrip()
            matcher = in_braces and re.match(r"(=~|!~|!=|=)", rest) is not None  # {node="..."}
            listed = frame is not None and (frame[0] == "(labels)"  # by (node), on (node), ...
                                             or (frame[0] == "label_values" and frame[1] >= 1))  # Grafana's
            if matcher or listed:
                text = renames.get(text, text)
            elif rest.startswith("(") or text in _LABEL_LISTS:
                pending = text
        elif kind == "string" and frame is not None and not in_braces and _label_argument(frame[0], frame[1]):
            quote, inner = text[0], text[1:-1]
            text = quote + renames.get(inner, inner) + quote
        elif kind == "other":
            if text == "{":
                in_braces = True
            elif text == "}":
                in_braces = False
            elif text == "(":
                stack.append(["(labels)" if call in _LABEL_LISTS else (call or ""), 0])
            elif text == ")":
                if stack:
                    stack.pop()
            elif text == "," and frame is not None and not in_braces:
                frame[1] += 1
        out.append(text)
    return "".join(out)


# --- command lines --------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The contract's options, for `python -m alerts.build` and `python -m dashboards.build`."""
    group = parser.add_argument_group("label contract (exporter/labels.py; defaults: what /sd gives)")
    group.add_argument("--label-profile", choices=sorted(PROFILES), default="default",
                       help="a named contract; the options below change single names of it "
                            "(kuberay: the cluster label is ray_io_cluster)")
    group.add_argument("--cluster-label", help=f"the label naming the Ray cluster [default: {DEFAULT_CLUSTER}]")
    group.add_argument("--node-label", help=f"the label naming the node [default: {DEFAULT_NODE}]")
    group.add_argument("--scrape-job", help=f"the scrape job of the exporters [default: {DEFAULT_SCRAPE_JOB}]")
    group.add_argument("--job-selector",
                       help="the matchers of the exporters' `up` series [default: job=\"<scrape job>\"]")
    group.add_argument("--runbook-base", help="where docs/runbooks.md is published [default: the project's]")


def from_arguments(args: argparse.Namespace) -> LabelContract:
    given = {item.name: getattr(args, f"{item.name}_label" if item.name in ("cluster", "node") else item.name, None)
             for item in fields(LabelContract)}
    return replace(PROFILES[args.label_profile], **{key: value for key, value in given.items() if value is not None})
