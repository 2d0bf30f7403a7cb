"""Run every dashboard query against a live Prometheus, as Grafana would, and say which return
nothing: a panel that can never show data is a bug in the panel or in the exporter.

    python -m dashboards.livecheck --prometheus http://127.0.0.1:9090 --var cluster=demo

Each target of each committed dashboard gets the variables filled in (unset ones: All, `.*`) and
runs as a range query over the last `--window` seconds. An empty result is explained when a
family it reads has no series at all in this Prometheus (e.g. no InfiniBand adapter here).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dashboards import promql
from dashboards.provisioner import JSON_DIR


@dataclass
class Result:
    dashboard: str
    panel: str
    ref_id: str
    expr: str  # as sent, variables filled in
    series: int = 0
    error: str | None = None
    absent: list[str] = field(default_factory=list)  # families it reads that Prometheus has never seen

    @property
    def name(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref_id}"


def _get(url: str, timeout: float = 30) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def names_present(prometheus: str) -> set[str]:
    """Every metric name with samples in this Prometheus's TSDB."""
    return set(_get(f"{prometheus}/api/v1/label/__name__/values")["data"])


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    reply = _get(f"{prometheus}/api/v1/query_range?{params}")
    return reply["data"]["result"]


def run(prometheus: str, variables: Mapping[str, str], window: float = 300, step: float = 2,
        rate_interval: str = "5s", json_dir: Path = JSON_DIR,
        keep: Callable[[str], bool] | None = None) -> list[Result]:
    """One Result per target of every dashboard (with `keep`, of those whose expression it keeps).
    `rate_interval` stands for $__rate_interval: Grafana makes it at least four scrape intervals."""
    end = time.time()
    macros = {"$__rate_interval": rate_interval, "$__interval": f"{step:g}s", "$__range": f"{int(window)}s"}
    present = names_present(prometheus)
    results = []
    for path in sorted(json_dir.glob("*.json")):
        dashboard = json.loads(path.read_text())
        names = [v["name"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
        values = {name: variables.get(name, ".*") for name in names}
        for panel, target in promql.iter_targets(dashboard):
            if keep is not None and not keep(target["expr"]):
                continue
            expr = promql.fill(target["expr"], values, macros)
            result = Result(path.stem, panel["title"], target["refId"], expr)
            try:
                result.series = len(query_range(prometheus, expr, end - window, end, step))
            except urllib.error.HTTPError as error:
                result.error = error.read().decode(errors="replace")
            result.absent = sorted(promql.metrics(target["expr"]) - present - {"ALERTS"})
            results.append(result)
    return results


def summary(results: list[Result]) -> str:
    panels = {(r.dashboard, r.panel) for r in results}
    empty = [r for r in results if not r.series]
    lines = [f"checked {len(results)} queries of {len(panels)} panels in {len({r.dashboard for r in results})} "
             f"dashboards: {len(results) - len(empty)} returned data, {len(empty)} did not"]
    lines += [f"  empty: {r.name}" + (f" (never seen here: {', '.join(r.absent)})" if r.absent else "")
              + (f" error: {r.error}" if r.error else "") for r in empty]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                        help="a dashboard variable's value (regex); unset variables are All")
    parser.add_argument("--window", type=float, default=300, help="seconds of history each query covers")
    parser.add_argument("--rate-interval", default="1m", help="what $__rate_interval stands for")
    args = parser.parse_args(argv)
    variables = dict(item.split("=", 1) for item in args.var)
    results = run(args.prometheus, variables, window=args.window, step=max(args.window / 200, 1),
                  rate_interval=args.rate_interval)
    print(summary(results))
    return 1 if any(not r.series for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
