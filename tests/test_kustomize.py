"""The kustomize base and overlays (exporter/kustomize/): what `launcher exporters manifests --kustomize` generates,
committed, and rendered offline by kubectl's built-in kustomize into objects that validate strictly
against the vendored Kubernetes and prometheus-operator schemas (tests/test_k8s_manifests.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from exporter import assets
from launcher.cli import main as launcher_main
from launcher.deploy import manifests
from launcher.deploy.manifests import KUSTOMIZE_DIR, Options, kustomize
from tests.conftest import binary
from tests.test_k8s_manifests import problems, validators  # noqa: F401 -- the fixture

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed")
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


def build(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [obj for obj in yaml.safe_load_all(result.stdout) if obj]


def dashboards(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].startswith(
        f"{manifests.DEFAULT_NAME}-dashboard-")]


def test_the_committed_base_and_overlays_are_what_the_generator_writes():
    expected = kustomize(Options())
    committed = {str(path.relative_to(KUSTOMIZE_DIR)): path.read_text()
                 for path in KUSTOMIZE_DIR.rglob("*.yaml")}
    assert sorted(committed) == sorted(expected), "run `launcher exporters manifests --kustomize exporter/kustomize`"
    stale = [name for name, text in expected.items() if committed[name] != text]
    assert not stale, f"{stale} out of date: run `launcher exporters manifests --kustomize exporter/kustomize`"


def test_the_base_is_every_object_without_the_stack_specific_labels(validators):  # noqa: F811
    objects = build(KUSTOMIZE_DIR / "base")
    assert [error for obj in objects for error in problems(validators, obj)] == []
    assert sorted(obj["kind"] for obj in objects) == sorted(obj["kind"] for obj in manifests.render())
    assert len(dashboards(objects)) == len(assets.dashboards()) == 6
    for obj in objects:
        assert obj["metadata"]["namespace"] == manifests.DEFAULT_NAMESPACE
        assert "release" not in obj["metadata"]["labels"]
        assert manifests.DASHBOARD_LABEL not in obj["metadata"]["labels"]


def test_the_kube_prometheus_stack_overlay_adds_the_release_and_the_sidecar_labels(validators):  # noqa: F811
    objects = build(KUSTOMIZE_DIR / "overlays" / "kube-prometheus-stack")
    assert [error for obj in objects for error in problems(validators, obj)] == []
    assert {obj["kind"] for obj in objects} >= OPERATOR_KINDS
    for obj in objects:
        assert obj["metadata"]["labels"]["release"] == manifests.KPS_RELEASE, obj["metadata"]["name"]
    maps = dashboards(objects)
    assert len(maps) == 6
    assert all(obj["metadata"]["labels"][manifests.DASHBOARD_LABEL] == "1" for obj in maps)
    # kube-prometheus-stack has its own Watchdog: ours is not among the rules (the plain overlay has it).
    (rule,) = [obj for obj in objects if obj["kind"] == "PrometheusRule"]
    assert "RaypulseWatchdog" not in yaml.safe_dump(rule)
    (daemonset,) = [obj for obj in objects if obj["kind"] == "DaemonSet"]
    # The selector (immutable on a DaemonSet) and the pods are the base's: only metadata is labelled.
    assert "release" not in daemonset["spec"]["selector"]["matchLabels"]
    assert build(KUSTOMIZE_DIR / "base") == [_without_overlay(obj) for obj in objects]


def _without_overlay(obj: dict[str, Any]) -> dict[str, Any]:
    labels = {key: value for key, value in obj["metadata"]["labels"].items()
              if key not in ("release", manifests.DASHBOARD_LABEL)}
    return {**obj, "metadata": {**obj["metadata"], "labels": labels}}


def test_the_plain_overlay_needs_no_operator_and_prometheus_accepts_its_scrape_job_and_rules(validators,  # noqa: F811
                                                                                             tmp_path):
    objects = build(KUSTOMIZE_DIR / "overlays" / "plain")
    assert [error for obj in objects for error in problems(validators, obj)] == []
    assert not OPERATOR_KINDS & {obj["kind"] for obj in objects}
    assert all(obj["apiVersion"] in ("v1", "apps/v1") for obj in objects)
    assert all(obj["metadata"]["labels"][manifests.DASHBOARD_LABEL] == "1" for obj in dashboards(objects))
    (config,) = [obj for obj in objects if obj["metadata"]["name"] == f"{manifests.DEFAULT_NAME}-prometheus"]
    data = config["data"]
    # The rule files and our Watchdog (no kube-prometheus-stack Watchdog here), loaded as *.yaml.
    assert set(data) == {manifests.SCRAPE_CONFIG_KEY, *assets.rule_files(), "watchdog.yaml"}
    assert "RaypulseWatchdog" in data["watchdog.yaml"]
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    (job,) = yaml.safe_load(data[manifests.SCRAPE_CONFIG_KEY])
    # The same labels as the ServiceMonitor gives: the rules' job, node and cluster.
    assert job["job_name"] == "raypulse"
    assert {item.get("target_label") for item in job["relabel_configs"]} >= {"node", "cluster"}
    assert job["kubernetes_sd_configs"] == [{"role": "endpoints",
                                             "namespaces": {"names": [manifests.DEFAULT_NAMESPACE]}}]
    # Debian's Prometheus is built without the Kubernetes service discovery (promtool refuses the key), so
    # promtool checks the rest of the job (relabelings, paths) with a static target in its place.
    checked = {**{key: value for key, value in job.items() if key != "kubernetes_sd_configs"},
               "static_configs": [{"targets": ["127.0.0.1:9477"]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "scrape_configs": [checked],
        "rule_files": sorted(str(tmp_path / name) for name in data if name != manifests.SCRAPE_CONFIG_KEY)}))
    result = subprocess.run([binary("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_knobs_reach_a_generated_base_and_its_overlays(tmp_path, validators):  # noqa: F811
    result = CliRunner().invoke(launcher_main, [
        "exporters", "manifests", "--kustomize", str(tmp_path), "--namespace", "gpu-monitoring", "--release", "kps",
        "--profile", "node-exporter-companion", "--web-config-secret", "raypulse-web", "--toleration", "*",
        "--priority-class", "", "--image-pull-secret", "regcred", "--node-selector", "nvidia.com/gpu.present=true",
        "--affinity", "{podAntiAffinity: {}}", "--arg=--log-level", "--arg=debug", "--env", "A=b"])
    assert result.exit_code == 0, result.output
    for overlay in ("kube-prometheus-stack", "plain"):
        objects = build(tmp_path / "overlays" / overlay)
        assert [error for obj in objects for error in problems(validators, obj)] == []
        assert {obj["metadata"]["namespace"] for obj in objects} == {"gpu-monitoring"}
        (daemonset,) = [obj for obj in objects if obj["kind"] == "DaemonSet"]
        pod = daemonset["spec"]["template"]["spec"]
        assert pod["tolerations"] == [{"operator": "Exists"}]
        assert "priorityClassName" not in pod
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["affinity"] == {"podAntiAffinity": {}}
        assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
        (container,) = pod["containers"]
        assert "node-exporter-companion" in container["args"]
        assert container["args"][-2:] == ["--log-level", "debug"]
        assert {"name": "A", "value": "b"} in container["env"]
        assert any(volume.get("secret", {}).get("secretName") == "raypulse-web" for volume in pod["volumes"])
    kps = build(tmp_path / "overlays" / "kube-prometheus-stack")
    assert {obj["metadata"]["labels"]["release"] for obj in kps} == {"kps"}
    (monitor,) = [obj for obj in kps if obj["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["scheme"] == "https"
    # Generating again into the same directory leaves nothing of the earlier generation behind.
    (tmp_path / "base" / "99-configmap-stale.yaml").write_text("stale\n")
    assert CliRunner().invoke(launcher_main, ["exporters", "manifests", "--kustomize", str(tmp_path)]).exit_code == 0
    assert not (tmp_path / "base" / "99-configmap-stale.yaml").exists()
    refused = CliRunner().invoke(launcher_main, ["exporters", "manifests", "--kustomize", str(tmp_path),
                                                 "--dir", str(tmp_path / "x")])
    assert refused.exit_code == 2
