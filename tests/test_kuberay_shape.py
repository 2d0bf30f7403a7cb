"""`launcher render` shapes the Ray pods as a Kubernetes user needs: a pod template merged into every
Ray pod (--pod-template FILE, and per group in the spec file with node selectors), the CUDA image for GPU
groups, no sidecar on request, no namespace pinned, and a Ray token stable per run id. Everything rendered
still validates against KubeRay's CRD and Kubernetes' own PodTemplateSpec."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import REPO
from tests.schemas import strict

DATA = Path(__file__).parent / "data"
POD_TEMPLATE = {
    "metadata": {"labels": {"team": "nlp"}, "annotations": {"example.com/owner": "alice"}},
    "spec": {
        "serviceAccountName": "trainer",
        "priorityClassName": "high",
        "nodeSelector": {"pool": "a100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "imagePullSecrets": [{"name": "regcred"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        "containers": [{"name": "ray", "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        "env": [{"name": "HF_HOME", "value": "/data/hf"}]}],
    },
}
JOB = {"name": "sft", "entrypoint": "python train.py", "run_id": "sft-0001",
       "worker_groups": [{"name": "gpu", "count": 2, "gpus": 1, "node_selector": {"gpu-type": "h100"},
                          "pod_template": {"spec": {"tolerations": [{"key": "spot", "operator": "Exists"}]}}},
                         {"name": "cpu", "count": 1}]}


@pytest.fixture(scope="module")
def rayjob_validator() -> jsonschema.Draft7Validator:
    schema = strict(json.loads((DATA / "kuberay" / "rayjob-v1-openapi.json").read_text()))
    return jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())


@pytest.fixture(scope="module")
def pod_validator() -> jsonschema.Draft4Validator:
    definitions = json.loads((DATA / "kubernetes" / "definitions-v1.36.json").read_text())["definitions"]
    definitions["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["integer", "string"]}
    definitions["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": ["string", "number"]}
    schema = {"$ref": "#/definitions/io.k8s.api.core.v1.PodTemplateSpec", "definitions": strict(definitions)}
    return jsonschema.Draft4Validator(schema)


def render(tmp_path: Path, *args: str, job: dict[str, Any] | None = None) -> subprocess.CompletedProcess:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job or JOB))
    return subprocess.run([sys.executable, "-m", "launcher", "render", "-f", str(spec), *args], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "RAYPULSE_HOME": str(tmp_path / "home")},
                          timeout=60)


def rendered(tmp_path: Path, *args: str, job: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    result = render(tmp_path, *args, job=job)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def pods(rayjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    return {"head": cluster["headGroupSpec"]["template"],
            **{group["groupName"]: group["template"] for group in cluster["workerGroupSpecs"]}}


def check(rayjob: dict[str, Any], rayjob_validator, pod_validator) -> None:
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in rayjob_validator.iter_errors(rayjob)]
    for name, pod in pods(rayjob).items():
        errors += [f"{name} {'/'.join(map(str, e.path))}: {e.message}" for e in pod_validator.iter_errors(pod)]
    assert not errors, "\n".join(errors)


def test_a_pod_template_is_merged_into_every_ray_pod(tmp_path: Path, rayjob_validator, pod_validator):
    template = tmp_path / "pod.yaml"
    template.write_text(yaml.safe_dump(POD_TEMPLATE))
    _, rayjob, _ = rendered(tmp_path, "--pod-template", str(template))
    check(rayjob, rayjob_validator, pod_validator)
    for name, pod in pods(rayjob).items():
        spec = pod["spec"]
        for field in ("serviceAccountName", "priorityClassName", "affinity", "imagePullSecrets"):
            assert spec[field] == POD_TEMPLATE["spec"][field], (name, field)
        assert POD_TEMPLATE["spec"]["tolerations"][0] in spec["tolerations"]
        assert {"name": "data", "persistentVolumeClaim": {"claimName": "data"}} in spec["volumes"]
        assert any(volume["name"] == "raypulse-tmp" for volume in spec["volumes"])  # the sidecar's kept
        ray = spec["containers"][0]
        assert ray["name"] in ("ray-head", "ray-worker")  # `ray` in the template means the Ray container
        assert {"name": "HF_HOME", "value": "/data/hf"} in ray["env"]
        assert {"name": "RAYPULSE_PROGRESS_URL", "value": "http://127.0.0.1:9478"} in ray["env"]
        assert ray["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
        assert [c["name"] for c in spec["containers"]] == [ray["name"], "raypulse-exporter"]
        assert pod["metadata"]["labels"]["team"] == "nlp"
        assert pod["metadata"]["labels"]["raypulse.io/run-id"] == "sft-0001"  # ours stay: the PodMonitor's selector
        assert pod["metadata"]["annotations"] == {"example.com/owner": "alice"}
    # Per group, from the spec file: its node selector beside the template's, its tolerations added.
    gpu, cpu, head = pods(rayjob)["gpu"]["spec"], pods(rayjob)["cpu"]["spec"], pods(rayjob)["head"]["spec"]
    assert gpu["nodeSelector"] == {"pool": "a100", "gpu-type": "h100"}
    assert {"key": "spot", "operator": "Exists"} in gpu["tolerations"]
    assert cpu["nodeSelector"] == head["nodeSelector"] == {"pool": "a100"}
    assert {"key": "spot", "operator": "Exists"} not in cpu["tolerations"]


def test_a_pod_template_that_is_not_one_is_refused_naming_the_field(tmp_path: Path):
    template = tmp_path / "pod.yaml"
    template.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "spec": {}}))
    result = render(tmp_path, "--pod-template", str(template))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "pod_template: " in result.stderr
    assert "unknown key 'apiVersion'; a PodTemplateSpec has metadata and spec" in result.stderr


def test_gpu_groups_get_the_cuda_image_by_default(tmp_path: Path, rayjob_validator, pod_validator):
    _, rayjob, _ = rendered(tmp_path)
    check(rayjob, rayjob_validator, pod_validator)
    images = {name: pod["spec"]["containers"][0]["image"] for name, pod in pods(rayjob).items()}
    assert images["gpu"] == images["head"] + "-gpu"
    assert images["cpu"] == images["head"]
    assert images["head"].startswith("rayproject/ray:")
    _, chosen, _ = rendered(tmp_path, "--image", "registry.example.com/train:1")
    assert {pod["spec"]["containers"][0]["image"] for pod in pods(chosen).values()} == {"registry.example.com/train:1"}


def test_no_sidecar_leaves_the_exporter_and_its_pod_monitor_out(tmp_path: Path, rayjob_validator, pod_validator):
    documents = rendered(tmp_path, "--no-sidecar")
    assert [document["kind"] for document in documents] == ["Secret", "RayJob"]
    rayjob = documents[1]
    check(rayjob, rayjob_validator, pod_validator)
    for pod in pods(rayjob).values():
        assert [c["name"] for c in pod["spec"]["containers"]] in (["ray-head"], ["ray-worker"])
        assert "shareProcessNamespace" not in pod["spec"]
        assert "env" not in pod["spec"]["containers"][0]  # no progress endpoint to point at
    assert rayjob["spec"]["rayClusterSpec"]["authOptions"]["secretName"] == documents[0]["metadata"]["name"]


def test_no_object_pins_a_namespace(tmp_path: Path):
    result = render(tmp_path, "--worker-gpus", "1", job={"entrypoint": "python train.py"})
    assert result.returncode == 0, result.stderr
    for document in yaml.safe_load_all(result.stdout):
        assert "namespace" not in document["metadata"], document["kind"]
    assert ".svc" not in result.stdout  # the sidecars reach the head by its short Service name
    assert "--namespace" not in result.stderr


def test_the_token_is_stable_per_run_id(tmp_path: Path):
    def token(*args: str) -> str:
        return rendered(tmp_path, *args)[0]["stringData"]["auth_token"]

    first = token()
    assert token() == first  # the same run id rendered again: the same token, nothing rotated
    assert token("--run-id", "sft-0002") != first
    assert len(first) == 64
    key = tmp_path / "home" / "kuberay-token.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert first not in key.read_text()


def test_release_labels_the_pod_monitor_for_kube_prometheus_stack(tmp_path: Path):
    documents = rendered(tmp_path, "--release", "kps")
    [monitor] = [document for document in documents if document["kind"] == "PodMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert all("release" not in document["metadata"].get("labels", {}) for document in documents
               if document["kind"] != "PodMonitor")
    refused = render(tmp_path, "--release", "Not A Name")
    assert refused.returncode == 2
    assert "release" in refused.stderr
