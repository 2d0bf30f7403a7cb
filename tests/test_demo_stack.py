"""scripts.stack end to end without Ray (what `make demo` gets): a real exporter with simulated GPUs,
Prometheus with every rule file, Alertmanager, and the webhook receiver. Quiet while healthy;
a GPU fault reaches the webhook, routed by severity and labelled with its GPU and node."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from alerts import build
from scripts import stack
from tests.conftest import REPO, wait_until

pytestmark = pytest.mark.slow  # real servers for several seconds each: left out of `make test-quick`

FAST = {"RAYPULSE_EXPORTER_COLLECTORS__GPU__INTERVAL_SECONDS": "1"}


@pytest.fixture
def demo(tmp_path, start_exporter):
    if stack.binaries() is None:
        pytest.fail("prometheus and prometheus-alertmanager are not installed (make system-deps)")
    control = tmp_path / "gpus.json"
    exporter = start_exporter("--simulate-gpus", "2", "--gpu-control", str(control), "--progress-listen", "off",
                              env=FAST)
    target = exporter.url.removeprefix("http://")
    s = stack.start_demo(tmp_path / "alerting", targets=[target], labels={"cluster": "demo", "node": "n1"},
                         interval="1s")
    yield s, control
    s.stop()


def test_the_demo_stack_loads_every_rule_and_notifies_a_gpu_fault(demo):
    s, control = demo
    wait_until(lambda: s.query('up{job="raypulse"} == 1'), 30, "the exporter to be scraped")
    rules = len(build.all_alerts())
    assert any(f"{rules} alerting rules" in line for line in s.describe()), s.describe()
    assert s.webhook.wait_for(lambda a: a.name == "RaypulseWatchdog", timeout=30), "no Watchdog notification"
    time.sleep(5)  # a few evaluations of a healthy exporter
    assert [a.labels for a in s.webhook.snapshot() if a.name != "RaypulseWatchdog"] == []
    injected = time.time()
    subprocess.run([sys.executable, "-m", "exporter", "gpu-fault", "--control", str(control), "--gpu", "1",
                    "row-remap-failed"], cwd=REPO, check=True, capture_output=True)
    alert = s.webhook.wait_for(lambda a: a.name == "RaypulseGpuRowRemapFailed", timeout=30, since=injected)
    assert alert is not None, s.describe()
    assert alert.receiver == "pager"  # critical
    assert (alert.labels["cluster"], alert.labels["node"], alert.labels["gpu"]) == ("demo", "n1", "1")
    assert alert.annotations["runbook_url"].endswith("#raypulsegpurowremapfailed")
    assert any("RaypulseGpuRowRemapFailed" in line for line in s.describe())
