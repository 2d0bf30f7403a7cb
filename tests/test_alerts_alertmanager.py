"""alerts/alertmanager.yml: valid for amtool, routes by severity, and inhibits on a live Alertmanager
(0.25) that notifies a real webhook receiver."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from scripts import stack
from scripts.drill.run import GROUPING
from scripts.webhook import Webhook
from tests.conftest import REPO, binary

pytestmark = pytest.mark.slow  # real servers for several seconds each: left out of `make test-quick`

CONFIG = REPO / "alerts" / "alertmanager.yml"


def test_amtool_check_config_is_clean():
    result = subprocess.run([binary("amtool"), "check-config", str(CONFIG)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_drills_sub_second_grouping_is_valid_for_amtool(tmp_path):
    config = stack.alertmanager_config("http://127.0.0.1:9096", fast=True, grouping=GROUPING)
    assert (config["route"]["group_wait"], config["route"]["group_interval"]) == (GROUPING, GROUPING)
    rendered = tmp_path / "alertmanager.yml"
    rendered.write_text(yaml.safe_dump(config, sort_keys=False))
    result = subprocess.run([binary("amtool"), "check-config", str(rendered)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(("labels", "receiver"), [
    ({"alertname": "RaypulseGpuLost", "severity": "critical", "scope": "gpu"}, "pager"),
    ({"alertname": "RaypulseJobFailed", "severity": "critical", "cluster": "c1", "submission_id": "s"}, "pager"),
    ({"alertname": "RaypulseGpuThermalSlowdown", "severity": "warning", "scope": "gpu"}, "tickets"),
    ({"alertname": "SomethingElse", "severity": "info"}, "blackhole"),
    ({"alertname": "RaypulseExporterDown", "severity": "warning", "scope": "exporter"}, "tickets"),
    ({"alertname": "RaypulseWatchdog", "severity": "none"}, "watchdog"),  # opt-in (rules/watchdog.yml)
    ({"alertname": "NoSeverity"}, "tickets"),
])
def test_routes_by_severity(labels, receiver):
    result = subprocess.run([binary("amtool"), "config", "routes", "test", f"--config.file={CONFIG}",
                             f"--verify.receivers={receiver}", *(f"{k}={v}" for k, v in labels.items())],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _post(url: str, alerts: list[dict]) -> None:
    now = datetime.now(UTC)
    body = [{"labels": labels, "annotations": {"summary": "Test."}, "startsAt": now.isoformat(),
             "endsAt": (now + timedelta(minutes=5)).isoformat()} for labels in alerts]
    request = urllib.request.Request(f"{url}/api/v2/alerts", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def _alert(name: str, severity: str, scope: str, **labels: str) -> dict[str, str]:
    return {"alertname": name, "severity": severity, "scope": scope, **labels}


# A warning (as kps' TargetDown) that still mutes the critical alerts located on its node.
NODE_DOWN = _alert("RaypulseExporterDown", "warning", "exporter", cluster="c1", node="n1", instance="n1:9477")
GPU_ON_DOWN_NODE = _alert("RaypulseGpuLost", "critical", "gpu", cluster="c1", node="n1", gpu="0", uuid="GPU-0")
GPU_ELSEWHERE = _alert("RaypulseGpuLost", "critical", "gpu", cluster="c1", node="n2", gpu="0", uuid="GPU-8")
RANK_ON_DOWN_NODE = _alert("RaypulseTrainingLossNonFinite", "critical", "training", cluster="c1", node="n1",
                           submission_id="s2", rank="0")
VOLUME_CRITICAL = _alert("RaypulseCheckpointVolumeAlmostFull", "critical", "node", cluster="c1", node="n2",
                         instance="n2:9477", mountpoint="/ckpt")
VOLUME_WARNING = {**VOLUME_CRITICAL, "severity": "warning"}
OTHER_VOLUME_WARNING = {**VOLUME_WARNING, "node": "n3", "instance": "n3:9477"}
JOB_FAILED = _alert("RaypulseJobFailed", "critical", "job", cluster="c1", submission_id="s1")
STALL_OF_FAILED_JOB = _alert("RaypulseTrainingStalled", "critical", "training", cluster="c1", submission_id="s1")
STALL_OF_OTHER_JOB = _alert("RaypulseTrainingStalled", "critical", "training", cluster="c1", submission_id="s3")

DELIVERED = [NODE_DOWN, GPU_ELSEWHERE, VOLUME_CRITICAL, OTHER_VOLUME_WARNING, JOB_FAILED, STALL_OF_OTHER_JOB]
INHIBITED = [GPU_ON_DOWN_NODE, RANK_ON_DOWN_NODE, VOLUME_WARNING, STALL_OF_FAILED_JOB]


@pytest.fixture
def alertmanager(tmp_path):
    if stack.binaries() is None:
        pytest.fail("prometheus and prometheus-alertmanager are not installed (make system-deps)")
    with Webhook() as hook, stack.start(tmp_path, webhook_url=hook.url, fast=True, with_prometheus=False) as s:
        yield s, hook


def test_inhibition_and_grouping_on_a_live_alertmanager(alertmanager):
    s, hook = alertmanager
    _post(s.alertmanager_url, DELIVERED + INHIBITED)
    for expected in DELIVERED:
        assert hook.wait_for(lambda a, e=expected: a.labels == e, timeout=30), f"not delivered: {expected}"
    time.sleep(3)  # several group_intervals (1s): an inhibited alert would have been sent by now
    received = [alert.labels for alert in hook.snapshot()]
    for muted in INHIBITED:
        assert muted not in received, f"should have been inhibited: {muted}"
    held = {json.dumps(a["labels"], sort_keys=True): a["status"] for a in s.alertmanager_alerts()}
    for muted in INHIBITED:
        status = held[json.dumps(muted, sort_keys=True)]
        assert status["state"] == "suppressed", status
        assert status["inhibitedBy"], status
    by_receiver = {alert.name + "/" + alert.labels["severity"]: alert.receiver for alert in hook.snapshot()}
    assert by_receiver["RaypulseCheckpointVolumeAlmostFull/warning"] == "tickets"
    assert by_receiver["RaypulseJobFailed/critical"] == "pager"
    groups = {json.dumps(p["groupLabels"], sort_keys=True) for p in hook.payloads}
    assert '{"cluster": "c1", "submission_id": "s1"}' in groups  # one notification group per cluster and job
    assert all(p["version"] == "4" for p in hook.payloads)
