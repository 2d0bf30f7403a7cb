"""The fleet-wide panels read the recorded pre-aggregations (alerts/rules/scale.yaml), and give the
same answer on one Prometheus (raw GPU series, the records evaluated from them) as on a store that
holds two shards' records (each with its shard's external label, which the panels sum away). The
dashboards' variables narrow them. promtool evaluates the panels' own queries from the committed JSON.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import promql
from dashboards.boards import common
from dashboards.provisioner import JSON_DIR
from dashboards.selectors import ALERT_RULES, records
from launcher.deploy import prometheus_scale
from tests.conftest import binary

DASHBOARDS = {path.stem: json.loads(path.read_text()) for path in sorted(JSON_DIR.glob("*.json"))}
SHARD = prometheus_scale.SHARD_LABEL  # the external label `launcher prometheus-config --shards` sets
# Cluster c1: node n1 (GPUs a, b) on shard 0, node n2 (GPUs c, d) on shard 1; job s1 holds all four.
# Cluster c2 (node m1, job s2) is what $cluster and $submission leave out.
# GPU x on n2 is lost (raypulse_gpu_up 0, no other family): counted among the GPUs, never as an idle one.
GPUS = {("c1", "n1", "a"): 0.25, ("c1", "n1", "b"): 0.75, ("c1", "n2", "c"): 1.0, ("c1", "n2", "d"): 0.5,
        ("c1", "n2", "x"): None, ("c2", "m1", "e"): 0.0}
SHARD_OF = {"n1": "0", "n2": "1", "m1": "0"}
JOB_OF = {"c1": ("01000000", "s1"), "c2": ("02000000", "s2")}
MEMORY_TOTAL, MEMORY_USED_SHARE, WATTS = 100 * 2**30, 0.25, 200
C1, S1 = {"cluster": "c1"}, {"cluster": "c1", "submission_id": "s1"}
N1, N2 = {"cluster": "c1", "node": "n1"}, {"cluster": "c1", "node": "n2"}
# What each panel's queries (in order) must return for c1 and s1, however the records are stored.
EXPECTED = {
    ("raypulse-cluster", "GPUs"): [[(C1, 5)]],
    ("raypulse-cluster", "GPU utilization"): [[(C1, 0.625)]],
    ("raypulse-cluster", "GPU memory in use"): [[(C1, MEMORY_USED_SHARE)]],
    ("raypulse-cluster", "GPU power"): [[(C1, 4 * WATTS)]],
    ("raypulse-cluster", "GPU utilization by node"): [[(N1, 0.5), (N2, 0.75)]],
    ("raypulse-cluster", "GPU utilization heat map"): [[(N1, 0.5), (N2, 0.75)]],
    ("raypulse-job", "Whole job: GPUs"): [[(S1, 4)]],
    ("raypulse-job", "Whole job: GPU utilization"): [[(S1, 0.625)], [(S1, 0.3125)]],
    ("raypulse-job", "Whole job: GPU memory"): [[(S1, 4 * 2**30)]],
    ("raypulse-job", "Whole job: GPU power"): [[(S1, 4 * WATTS)]],
}
VARIABLES = {"cluster": "c1", "submission": "s1", "node": ".*", "gpu": ".*"}


def _series(name: str, labels: dict[str, str], value: float) -> dict[str, str]:
    text = ",".join(f'{key}="{val}"' for key, val in labels.items())
    return {"series": f"{name}{{{text}}}", "values": f"{value:.17g}x5"}


def raw_series() -> list[dict[str, str]]:
    """What one Prometheus scrapes from the exporters: every GPU's families and the jobs' processes on them."""
    series = []
    for (cluster, node, uuid), utilization in GPUS.items():
        gpu = {"cluster": cluster, "node": node, "instance": f"{node}:9477", "job": "raypulse", "gpu": "0",
               "uuid": uuid}
        job_id, submission = JOB_OF[cluster]
        held = {**gpu, "job_id": job_id, "submission_id": submission}
        if utilization is None:
            series.append(_series("raypulse_gpu_up", gpu, 0))
            continue
        series += [_series("raypulse_gpu_up", gpu, 1), _series("raypulse_gpu_utilization_ratio", gpu, utilization),
                   _series("raypulse_gpu_memory_total_bytes", gpu, MEMORY_TOTAL),
                   _series("raypulse_gpu_memory_used_bytes", gpu, MEMORY_TOTAL * MEMORY_USED_SHARE),
                   _series("raypulse_gpu_power_usage_watts", gpu, WATTS),
                   _series("raypulse_job_gpu_processes", held, 1),
                   _series("raypulse_job_gpu_sm_utilization_ratio", held, utilization / 2),
                   _series("raypulse_job_gpu_memory_used_bytes", held, 2**30)]
    return series


def sharded_records() -> list[dict[str, str]]:
    """What a store holds from two shards: each shard's records over its own nodes, with its external label."""
    parts: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def add(record: str, value: float, **labels: str) -> None:
        key = (record, tuple(sorted(labels.items())))
        parts[key] = parts.get(key, 0) + value

    for (cluster, node, _), utilization in GPUS.items():
        shard = SHARD_OF[node]
        job_id, submission = JOB_OF[cluster]
        per_job = {"cluster": cluster, "job_id": job_id, "submission_id": submission, SHARD: shard}
        add(common.CLUSTER_GPUS, 1, cluster=cluster, **{SHARD: shard})
        add(common.NODE_GPUS, 1, cluster=cluster, node=node, **{SHARD: shard})
        if utilization is None:  # lost: only its raypulse_gpu_up
            continue
        add(common.CLUSTER_UTILIZATION_GPUS, 1, cluster=cluster, **{SHARD: shard})
        add(common.NODE_UTILIZATION_GPUS, 1, cluster=cluster, node=node, **{SHARD: shard})
        for record, value in ((common.CLUSTER_UTILIZATION, utilization),
                              (common.CLUSTER_MEMORY_USED, MEMORY_TOTAL * MEMORY_USED_SHARE),
                              (common.CLUSTER_MEMORY_TOTAL, MEMORY_TOTAL), (common.CLUSTER_POWER, WATTS)):
            add(record, value, cluster=cluster, **{SHARD: shard})
        add(common.NODE_UTILIZATION, utilization, cluster=cluster, node=node, **{SHARD: shard})
        for record, value in ((common.JOB_GPUS, 1), (common.JOB_UTILIZATION, utilization),
                              (common.JOB_SM, utilization / 2), (common.JOB_MEMORY, 2**30),
                              (common.JOB_POWER, WATTS)):
            add(record, value, **per_job)
    return [_series(record, dict(labels), value) for (record, labels), value in parts.items()]


def panel_queries(dashboard: str, title: str) -> list[str]:
    return [promql.fill(target["expr"], VARIABLES) for panel, target in promql.iter_targets(DASHBOARDS[dashboard])
            if panel["title"] == title]


def expression_tests() -> list[dict]:
    tests = []
    for (dashboard, title), expected in EXPECTED.items():
        queries = panel_queries(dashboard, title)
        assert len(queries) == len(expected), f"{dashboard} / {title}: {queries}"
        for expr, samples in zip(queries, expected, strict=True):
            tests.append({"expr": expr, "eval_time": "3m", "exp_samples": [
                {"labels": "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "value": value}
                for labels, value in samples]})
    return tests


@pytest.mark.parametrize("store", ["one Prometheus", "two shards in a store"])
def test_the_fleet_panels_show_the_same_numbers_on_one_prometheus_and_on_a_sharded_store(tmp_path: Path, store: str):
    inputs = raw_series() if store == "one Prometheus" else sharded_records()
    document = {"rule_files": [str(ALERT_RULES / "scale.yaml")], "evaluation_interval": "1m", "tests": [{
        "name": store, "interval": "1m", "input_series": inputs, "promql_expr_test": expression_tests()}]}
    path = tmp_path / "panels_test.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    result = subprocess.run([binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_record_a_panel_reads_is_summed_by_the_panels_labels():
    """`sum by (<labels>) (record{...})`: a store's external labels (the shard's, a replica's) never split
    or double a panel's series, and each `by` label is one the record keeps."""
    read = 0
    for uid, dashboard in DASHBOARDS.items():
        for panel, target in promql.iter_targets(dashboard):
            expr = target["expr"]
            for selector in promql.selectors(expr):
                if selector.metric not in records():
                    continue
                read += 1
                match = re.search(rf"sum by \(([^)]*)\) \({re.escape(selector.metric)}\{{", expr)
                assert match, f"{uid}: {panel['title']}: {selector.metric} is not summed by labels in {expr}"
                by = {label.strip() for label in match.group(1).split(",")}
                assert by <= records()[selector.metric], f"{uid}: {panel['title']}: by {by} in {expr}"
    assert read >= 10, "the fleet-wide panels no longer read the records"
