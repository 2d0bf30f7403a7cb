"""The fault drill, end to end, on its quick subset (`make drill` runs every fault): a real local
Ray cluster from the launcher, exporters with simulated GPUs, a real Prometheus, Alertmanager and
webhook receiver. A healthy run raises nothing; each fault's alert arrives, with the labels that
locate it, within scrape + evaluation interval + `for` + the source's delay + slack.

Starts Ray: run under `flock /tmp/raypulse-ray.lock` (about 2-3 minutes once it holds the lock).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from alerts import build
from scripts import stack
from scripts.drill.faults import QUICK, Context, catalog
from scripts.drill.report import render
from scripts.drill.run import Outcome, Report, budget
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(900)


def _context() -> Context:
    return Context(cluster="c", gpu_node="gpu-1", cpu_node="cpu-1", spare_node="spare", gpu_control=Path("g"),
                   spare_control=Path("s"), job_control=Path("j"), submission_id="run-a1", job_gpu=0,
                   free_gpus=list(range(1, 16)), cluster_processes=[], restart_spare=lambda: None)


def test_the_catalog_expects_real_alerts_and_covers_every_simulator_fault():
    alerts = {alert.name for _, alert in build.all_alerts()}
    faults = catalog(_context())
    assert set(QUICK) <= {fault.key for fault in faults}
    for fault in faults:
        assert fault.expect, fault.key
        for expect in [*fault.expect, *fault.allow]:
            assert expect.alertname in alerts, f"{fault.key}: {expect.alertname} is not an alert"
        for expect in fault.expect:
            assert budget(expect, fault) < 60, f"{fault.key}: {expect} would take minutes at the drill's scale"
    injected_gpus = [fault.title for fault in faults if " on GPU " in fault.title]
    assert len(injected_gpus) == len(set(injected_gpus)), "two GPU faults on one GPU would blur the attribution"
    simulator_faults = {"xid", "ecc-dbe", "ecc-sbe", "row-remap-pending", "row-remap-failed", "thermal-throttle",
                        "power-brake", "nvlink-down", "gpu-lost", "recovery-action", "nvml-hang", "nvml-error",
                        "nvml-init-error", "gpu-load-collapse"}
    assert all(any(fault.key.startswith(kind) for fault in faults) for kind in simulator_faults)


def test_the_report_marks_late_and_missing_alerts():
    report = Report(quick=True, scale=1 / 30, healthy_seconds=45, outcomes=[
        Outcome("xid-79", "XID 79", "RaypulseGpuLost{gpu=1}", 14.0, {"alertname": "RaypulseGpuLost"}, 4.2),
        Outcome("nan-loss", "NaN", "RaypulseTrainingLossNonFinite", 12.0, {"alertname": "X"}, 13.5),
        Outcome("job-failed", "fail", "RaypulseJobFailed", 15.0)])
    assert [outcome.ok for outcome in report.outcomes] == [True, False, False]
    assert not report.ok
    text = render(report)
    assert "| 4.2s | 14s | yes |" in text
    assert text.count("**no**") == 2
    assert "Result: **FAILED**" in text


@pytest.mark.ray
def test_quick_drill_raises_each_expected_alert_in_time_and_nothing_else(tmp_path):
    if stack.binaries() is None:
        pytest.fail("prometheus and prometheus-alertmanager are not installed (make system-deps)")
    results = tmp_path / "drill.json"
    # A process of its own: the drill sets the environment its cluster's exporters inherit.
    run = subprocess.run([sys.executable, "-m", "scripts.drill", "--quick", "--healthy", "45", "--json", str(results),
                          "--output", str(tmp_path / "drill.md"), "--workdir", str(tmp_path / "work")],
                         cwd=REPO, capture_output=True, text=True, timeout=840)
    assert results.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(results.read_text())
    assert report["healthy_alerts"] == [], "alerts fired on a healthy cluster"
    assert report["false_alarms"] == [], "alerts fired that no injected fault explains"
    assert {outcome["fault"] for outcome in report["outcomes"]} == set(QUICK)
    for outcome in report["outcomes"]:
        assert outcome["received"] is not None, f"{outcome['fault']}: {outcome['expected']} never arrived"
        assert outcome["latency"] <= outcome["budget"], outcome
        # the alert says where: its cluster, and the node, GPU or job of the fault
        for key, value in outcome["expected_labels"].items():
            assert outcome["received"].get(key) == value, (outcome["fault"], key)
    assert run.returncode == 0, run.stdout[-3000:]
