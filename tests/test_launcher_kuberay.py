"""The KubeRay manifests: the RayJob validates against KubeRay's v1 CRD schema (vendored under
tests/data/kuberay/, strictly: unknown fields fail) and follows KubeRay's own validation rules; the
exporter runs beside Ray in every pod and a PodMonitor scrapes it. No Kubernetes cluster needed."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from launcher.kuberay import render
from launcher.spec import build_spec
from tests.conftest import REPO
from tests.schemas import strict

SCHEMA_FILE = Path(__file__).parent / "data" / "kuberay" / "rayjob-v1-openapi.json"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = strict(json.loads(SCHEMA_FILE.read_text()))
    return jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())


FULL_JOB = {
    "name": "llm-sft", "entrypoint": "python train.py --epochs 3", "run_id": "llm-sft-0001",
    "working_dir": "https://example.com/code.zip",
    "runtime_env": {"pip": ["torch==2.5.1", "datasets"], "env_vars": {"NCCL_DEBUG": "WARN"}},
    "head": {"cpus": 2, "memory": "8Gi", "resources": {"head_slot": 1}},
    "worker_groups": [{"name": "gpu", "count": 4, "cpus": 8, "gpus": 2, "memory": "64Gi", "resources": {"ib": 1}},
                      {"name": "cpu", "count": 2, "cpus": 0.5, "memory": "2Gi"}],
    "max_retries": 3, "active_deadline_seconds": 7200, "pre_running_deadline_seconds": 600,
    "workspace": "research", "user": "alice", "labels": {"team": "nlp", "priority": "high"},
    "image": "registry.example.com/train:1.0", "backend": "kuberay", "namespace": "ml", "queue": "team-nlp",
}


def manifests(**changes: Any) -> tuple[dict, dict, dict]:
    secret, rayjob, pod_monitor = render(build_spec({**FULL_JOB, **changes}))
    return secret, rayjob, pod_monitor


def test_rendered_rayjob_validates_against_the_crd(validator):
    _, rayjob, _ = manifests()
    errors = sorted(validator.iter_errors(rayjob), key=lambda error: list(error.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


@pytest.mark.parametrize("changes", [{}, {"worker_groups": []}, {"queue": None, "max_retries": 0},
                                     {"keep_cluster": True, "queue": None}, {"working_dir": None}])
def test_variants_validate_too(validator, changes):
    _, rayjob, _ = manifests(**changes)
    assert not list(validator.iter_errors(rayjob))


def test_the_strict_schema_catches_a_misspelt_field(validator):
    _, rayjob, _ = manifests()
    broken = copy.deepcopy(rayjob)
    broken["spec"]["backofflimit"] = broken["spec"].pop("backoffLimit")
    broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "4"
    messages = [error.message for error in validator.iter_errors(broken)]
    assert any("'backofflimit' was unexpected" in message for message in messages)
    assert any("'4' is not of type 'integer'" in message for message in messages)


def test_rayjob_carries_the_job_model():
    _, rayjob, _ = manifests()
    spec = rayjob["spec"]
    assert rayjob["metadata"]["name"] == "llm-sft-0001"
    assert rayjob["metadata"]["namespace"] == "ml"
    assert spec["entrypoint"] == "python train.py --epochs 3"
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["preRunningDeadlineSeconds"]) == (3, 7200, 600)
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["submissionMode"] == "K8sJobMode"
    assert spec["submitterConfig"] == {"backoffLimit": 2}
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {
        "working_dir": "https://example.com/code.zip", "pip": ["torch==2.5.1", "datasets"],
        "env_vars": {"NCCL_DEBUG": "WARN"}}
    assert spec["metadata"] == {
        "raypulse.job_name": "llm-sft", "raypulse.run_id": "llm-sft-0001", "raypulse.max_attempts": "4",
        "raypulse.workspace": "research", "raypulse.user": "alice", "raypulse.label.team": "nlp",
        "raypulse.label.priority": "high"}
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert json.loads(head["rayStartParams"]["resources"]) == {"head_slot": 1}
    assert head["template"]["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "2", "memory": "8Gi"}
    gpu, cpu = cluster["workerGroupSpecs"]
    assert (gpu["groupName"], gpu["replicas"], gpu["minReplicas"], gpu["maxReplicas"]) == ("gpu", 4, 4, 4)
    assert gpu["rayStartParams"]["num-gpus"] == "2"
    assert gpu["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}
    assert cpu["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "500m"


def test_kuberay_validation_rules_hold():
    """Rules KubeRay's webhook adds on top of the schema (ray-operator/controllers/ray/utils/validation.go)."""
    _, rayjob, _ = manifests()
    name = rayjob["metadata"]["name"]
    assert len(name) <= 47
    assert name[0].isalpha()
    cluster = rayjob["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        assert "labels" not in group["rayStartParams"], "KubeRay wants node labels in the group's labels field"
        assert not (group.get("resources") and {"num-cpus", "resources"} & set(group["rayStartParams"]))
    assert cluster["authOptions"]["mode"] == "token"
    assert tuple(map(int, cluster["rayVersion"].split(".")[:2])) >= (2, 52)


def test_every_ray_pod_has_an_exporter_sidecar_with_the_token():
    secret, rayjob, _ = manifests()
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert cluster["authOptions"]["secretName"] == secret["metadata"]["name"]
    assert len(secret["stringData"]["auth_token"]) == 64
    for role, group in [("head", cluster["headGroupSpec"]), *[("worker", g) for g in cluster["workerGroupSpecs"]]]:
        ray, exporter = group["template"]["spec"]["containers"]
        assert exporter["name"] == "raypulse-exporter"
        assert exporter["ports"] == [{"name": "raypulse", "containerPort": 9477, "protocol": "TCP"}]
        assert exporter["args"][exporter["args"].index("--ray-role") + 1] == role
        token = next(env for env in exporter["env"] if env["name"] == "RAY_AUTH_TOKEN")
        assert token["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "auth_token"}
        assert {"name": "RAYPULSE_PROGRESS_URL", "value": "http://127.0.0.1:9478"} in ray["env"]
        assert group["labels"]["raypulse.io/exporter-port"] == "9477"
    worker_exporter = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][1]
    dashboard = worker_exporter["args"][worker_exporter["args"].index("--ray-dashboard") + 1]
    assert dashboard == f"http://{cluster['headGroupSpec']['headService']['metadata']['name']}.ml.svc:8265"


def test_pod_monitor_selects_the_job_pods_and_queue_label_is_set():
    _, rayjob, pod_monitor = manifests()
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-nlp"
    selector = pod_monitor["spec"]["selector"]["matchLabels"]
    head_labels = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    assert selector.items() <= head_labels.items()
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "raypulse"
    assert "kueue.x-k8s.io/queue-name" not in manifests(queue=None)[1]["metadata"]["labels"]


def launcher(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=60)


def test_render_command_writes_the_three_manifests(tmp_path: Path, validator):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({**FULL_JOB, "backend": None}))
    result = launcher("render", "-f", str(spec), "--workers", "2", "--worker-group", "x:count=1",
                      env={"RAYPULSE_HOME": str(tmp_path)})
    assert result.returncode == 2
    assert "not both" in result.stderr
    result = launcher("render", "-f", str(spec), env={"RAYPULSE_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert kinds == ["Secret", "RayJob", "PodMonitor"]
    assert not list(validator.iter_errors(list(yaml.safe_load_all(result.stdout))[1]))


def test_local_working_dir_cannot_go_to_kubernetes(tmp_path: Path):
    result = launcher("render", "--working-dir", str(tmp_path), "--", "python train.py",
                      env={"RAYPULSE_HOME": str(tmp_path)})
    assert result.returncode == 2
    assert "working_dir: " in result.stderr
    assert "remote URI" in result.stderr


def test_submit_to_kuberay_without_a_kubeconfig_is_bad_input(tmp_path: Path):
    result = launcher("submit", "--backend", "kuberay", "--", "python train.py",
                      env={"RAYPULSE_HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "missing")})
    assert result.returncode == 2
    assert f"no kubeconfig at {tmp_path / 'missing'}" in result.stderr
    assert "launcher render" in result.stderr


def sidecars(rayjob: dict) -> list[tuple[dict, dict]]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"], *[group["template"] for group in cluster["workerGroupSpecs"]]]
    return [(pod, next(c for c in pod["spec"]["containers"] if c["name"] == "raypulse-exporter")) for pod in pods]


def test_every_exporter_sidecar_runs_unprivileged():
    _, rayjob, _ = manifests()
    for pod, sidecar in sidecars(rayjob):
        security = sidecar["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == 1000  # the ray images' `ray` user
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert "privileged" not in security
        # A read-only root: the exporter's scratch space is an emptyDir of its own.
        tmp = next(m for m in sidecar["volumeMounts"] if m["mountPath"] == "/tmp")
        assert any(v["name"] == tmp["name"] and "emptyDir" in v for v in pod["spec"]["volumes"])
        assert "securityContext" not in pod["spec"]  # the Ray container's settings are left alone


def test_a_web_config_secret_is_mounted_into_every_sidecar(validator):
    secret, rayjob, pod_monitor = manifests(exporter_web_config_secret="raypulse-web")
    assert not list(validator.iter_errors(rayjob))
    for pod, sidecar in sidecars(rayjob):
        args = sidecar["args"]
        assert args[args.index("--web-config") + 1] == "/etc/raypulse/web/web-config.yml"
        mount = next(m for m in sidecar["volumeMounts"] if m["mountPath"] == "/etc/raypulse/web")
        assert mount["readOnly"] is True
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == "raypulse-web"
        assert all(mount["name"] not in {m["name"] for m in c.get("volumeMounts", [])}
                   for c in pod["spec"]["containers"] if c is not sidecar)  # the Ray container never sees it
        for probe in ("readinessProbe", "livenessProbe"):
            assert sidecar[probe]["httpGet"]["scheme"] == "HTTPS"
    endpoint = pod_monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "raypulse-web", "key": "ca.crt"}}
    assert secret["metadata"]["name"] != "raypulse-web"  # the user's Secret is theirs: not rendered


def test_without_a_web_config_secret_the_sidecar_serves_plain_http():
    _, rayjob, pod_monitor = manifests()
    for pod, sidecar in sidecars(rayjob):
        assert "--web-config" not in sidecar["args"]
        assert sidecar["livenessProbe"]["httpGet"]["scheme"] == "HTTP"
        assert [v["name"] for v in pod["spec"]["volumes"]] == ["raypulse-tmp"]
    assert "scheme" not in pod_monitor["spec"]["podMetricsEndpoints"][0]


def test_the_render_flag_names_the_secret_and_a_local_file_is_refused(tmp_path: Path):
    result = launcher("render", "--exporter-web-config-secret", "raypulse-web", "--", "python train.py",
                      env={"RAYPULSE_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "&id0" not in result.stdout  # every pod spelled out, no YAML aliases between them
    rayjob = list(yaml.safe_load_all(result.stdout))[1]
    assert all("--web-config" in sidecar["args"] for _, sidecar in sidecars(rayjob))
    (tmp_path / "web.yml").write_text("{}\n")
    result = launcher("render", "--exporter-web-config", str(tmp_path / "web.yml"), "--", "python train.py",
                      env={"RAYPULSE_HOME": str(tmp_path)})
    assert result.returncode == 2
    assert "exporter_web_config: applies to backend local only" in result.stderr
    assert "exporter_web_config_secret" in result.stderr
