"""The KubeRay manifests: the RayJob validates against KubeRay's v1 CRD schema (vendored under
tests/data/kuberay/, strictly: unknown fields fail) and follows KubeRay's own validation rules; the
exporter runs beside Ray in every pod (its own image, the Ray container's processes and GPUs in view,
its command line accepted by a real exporter) and a PodMonitor, valid against prometheus-operator's
CRD, scrapes it with the labels the rules and dashboards use. No Kubernetes cluster needed."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from alerts.config import DEFAULT as ALERTS_CONFIG
from exporter import __version__
from exporter.contract import wire
from launcher.backends.kuberay.render import render
from launcher.deploy.manifests import Options
from launcher.spec import build_spec
from scripts.ports import free_port
from tests.conftest import REPO, http_get, wait_until
from tests.schemas import strict

DATA = Path(__file__).parent / "data"
SCHEMA_FILE = DATA / "kuberay" / "rayjob-v1-openapi.json"
POD_MONITOR_SCHEMA = DATA / "prometheus-operator" / "podmonitor-v1-openapi.json"
K8S_DEFINITIONS = DATA / "kubernetes" / "definitions-v1.36.json"


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
    assert "namespace" not in rayjob["metadata"]  # the apply namespace wins (kubectl apply -n, the context's)
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
    # By its short name: the pod's DNS search path holds whatever namespace it was applied to.
    assert dashboard == f"http://{cluster['headGroupSpec']['headService']['metadata']['name']}:8265"


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
                   for c in pod["spec"]["containers"] if c is not sidecar)  # not mounted into the Ray container
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


@pytest.fixture(scope="module")
def pod_monitor_validator() -> jsonschema.Draft7Validator:
    schema = strict(json.loads(POD_MONITOR_SCHEMA.read_text()))
    return jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())


@pytest.fixture(scope="module")
def pod_template_validator() -> jsonschema.Draft4Validator:
    """Kubernetes' own PodTemplateSpec (tests/data/kubernetes/), stricter than the CRD's copy of it."""
    definitions = json.loads(K8S_DEFINITIONS.read_text())["definitions"]
    definitions["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["integer", "string"]}
    definitions["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": ["string", "number"]}
    schema = {"$ref": "#/definitions/io.k8s.api.core.v1.PodTemplateSpec", "definitions": strict(definitions)}
    return jsonschema.Draft4Validator(schema)


def env_of(container: dict) -> dict[str, Any]:
    return {env["name"]: env.get("value", env.get("valueFrom")) for env in container["env"]}


def test_the_sidecar_runs_the_exporter_image_with_its_entrypoint():
    _, rayjob, _ = manifests()
    dockerfile = (REPO / "Dockerfile").read_text()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for _, sidecar in sidecars(rayjob):
        assert sidecar["image"] == f"ghcr.io/raypulse/raypulse-exporter:{__version__}"  # docs/kubernetes.md's name
        assert sidecar["command"] == ["exporter"]
        assert 'ENTRYPOINT ["exporter"]' in dockerfile
        assert scripts["exporter"] == "exporter.cli:main"
        args = sidecar["args"]
        assert args[0] == "serve"
        assert args[args.index("--cluster") + 1] == "$(RAYPULSE_RAY_CLUSTER)"  # the kubelet expands it
        assert args[args.index("--progress-listen") + 1] == "127.0.0.1:9478"
        env = env_of(sidecar)
        assert env["RAYPULSE_RAY_CLUSTER"] == {"fieldRef": {"fieldPath": "metadata.labels['ray.io/cluster']"}}
        assert env["RAYPULSE_EXPORTER_NODE__NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    _, overridden, _ = manifests(exporter_image="registry.example.com/raypulse:dev")
    assert {sidecar["image"] for _, sidecar in sidecars(overridden)} == {"registry.example.com/raypulse:dev"}


def test_the_sidecar_sees_the_ray_containers_processes_and_gpus(pod_template_validator):
    _, rayjob, _ = manifests()
    cluster = rayjob["spec"]["rayClusterSpec"]
    for pod, sidecar in sidecars(rayjob):
        assert not list(pod_template_validator.iter_errors(pod))
        assert pod["spec"]["shareProcessNamespace"] is True
        assert "hostPID" not in pod["spec"]
        assert not {"requests", "limits"} & {key for key, amounts in sidecar["resources"].items()
                                              if "nvidia.com/gpu" in amounts}
    gpu_pod, cpu_pod = (group["template"] for group in cluster["workerGroupSpecs"])
    gpu_sidecar, cpu_sidecar, head_sidecar = (
        next(c for c in pod["spec"]["containers"] if c["name"] == "raypulse-exporter")
        for pod in (gpu_pod, cpu_pod, cluster["headGroupSpec"]["template"]))
    # GPUs: every GPU of the node, read-only (NVML's `utility`), without a GPU request of its own.
    assert env_of(gpu_sidecar)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env_of(gpu_sidecar)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "--disable-collector" not in gpu_sidecar["args"]
    for sidecar in (cpu_sidecar, head_sidecar):  # no GPUs in the Ray container: none for the sidecar either
        assert "NVIDIA_VISIBLE_DEVICES" not in env_of(sidecar)
        disabled = [sidecar["args"][i + 1] for i, arg in enumerate(sidecar["args"]) if arg == "--disable-collector"]
        assert disabled == ["gpu", "gpu_events"]


def test_sharing_the_process_namespace_can_be_turned_off(pod_template_validator, tmp_path: Path):
    """`share_process_namespace: false` (--no-share-process-namespace): the pods keep their own process namespace
    (a cluster policy may forbid sharing); the sidecars stay, seeing only their own processes."""
    _, rayjob, _ = manifests(share_process_namespace=False)
    for pod, sidecar in sidecars(rayjob):
        assert not list(pod_template_validator.iter_errors(pod))
        assert "shareProcessNamespace" not in pod["spec"]
        assert sidecar["name"] == "raypulse-exporter"
    result = subprocess.run([sys.executable, "-m", "launcher", "render", "--run-id", "own-1",
                             "--no-share-process-namespace", "--", "python train.py"], capture_output=True, text=True,
                            cwd=REPO, env={**os.environ, "RAYPULSE_HOME": str(tmp_path)}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "shareProcessNamespace" not in result.stdout


def test_pod_resources_mounts_the_kubelets_socket_into_gpu_pods_sidecars_only(pod_template_validator, tmp_path: Path):
    """`pod_resources` (--pod-resources, off by default: a hostPath volume) mounts the kubelet's pod-resources
    directory read-only into the sidecars of GPU pods, where the exporter finds kubelet.sock at its standard
    path (wire.POD_RESOURCES_SOCKET) and reports its own pod's GPUs; the head and CPU pods get nothing."""
    _, plain, _ = manifests()
    for pod, _ in sidecars(plain):
        assert wire.POD_RESOURCES_DIR not in json.dumps(pod)
    _, rayjob, _ = manifests(pod_resources=True)
    head, gpu, cpu = sidecars(rayjob)
    for pod, _ in (head, gpu, cpu):
        assert not list(pod_template_validator.iter_errors(pod))
    pod, sidecar = gpu
    [mount] = [m for m in sidecar["volumeMounts"] if m["mountPath"] == wire.POD_RESOURCES_DIR]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == wire.POD_RESOURCES_DIR
    assert wire.POD_RESOURCES_SOCKET.startswith(mount["mountPath"] + "/")
    ray = next(c for c in pod["spec"]["containers"] if c["name"] != "raypulse-exporter")
    assert all(m["name"] != mount["name"] for m in ray.get("volumeMounts", []))
    for pod, _ in (head, cpu):
        assert wire.POD_RESOURCES_DIR not in json.dumps(pod)
    result = subprocess.run([sys.executable, "-m", "launcher", "render", "--run-id", "podres-1", "--worker-gpus", "1",
                             "--pod-resources", "--", "python train.py"], capture_output=True, text=True,
                            cwd=REPO, env={**os.environ, "RAYPULSE_HOME": str(tmp_path)}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert wire.POD_RESOURCES_DIR in result.stdout


def test_the_pod_monitor_validates_and_relabels_to_the_label_contract(pod_monitor_validator):
    _, _, pod_monitor = manifests()
    assert not list(pod_monitor_validator.iter_errors(pod_monitor))
    assert "release" not in pod_monitor["metadata"]["labels"]
    options = Options()
    rules = {rule["targetLabel"]: rule for rule in pod_monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert rules[options.cluster_label]["sourceLabels"] == ["__meta_kubernetes_pod_label_ray_io_cluster"]
    assert rules[options.node_label]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    assert rules["job"]["replacement"] == ALERTS_CONFIG.scrape_job
    released = render(build_spec({**FULL_JOB}), release="kube-prometheus-stack")[2]
    assert released["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert not list(pod_monitor_validator.iter_errors(released))
    _, _, tls = manifests(exporter_web_config_secret="raypulse-web")
    assert not list(pod_monitor_validator.iter_errors(tls))


def test_the_strict_pod_monitor_schema_catches_a_misspelt_field(pod_monitor_validator):
    _, _, pod_monitor = manifests()
    pod_monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["sourcelabels"] = ["x"]
    messages = [error.message for error in pod_monitor_validator.iter_errors(pod_monitor)]
    assert any("'sourcelabels' was unexpected" in message for message in messages)


def kubelet_env(container: dict, fields: dict[str, str], secrets: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet makes it: downward API fields and Secret keys."""
    env = {}
    for item in container["env"]:
        source = item.get("valueFrom", {})
        if "fieldRef" in source:
            env[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            env[item["name"]] = secrets[source["secretKeyRef"]["key"]]
        else:
            env[item["name"]] = item["value"]
    return env


def test_a_real_exporter_runs_the_sidecars_command_line(tmp_path: Path):
    """The rendered command and arguments, `$(VAR)` expanded as the kubelet does, start an exporter
    that takes its node and cluster from the downward API and says on /readyz what it cannot see."""
    port, progress = free_port(), free_port()
    secret, rayjob, _ = manifests(exporter_port=port, progress_port=progress)
    sidecar = sidecars(rayjob)[0][1]  # the head's
    fields = {"metadata.labels['ray.io/cluster']": "llm-sft-0001-x7k2p", "spec.nodeName": "gpu-node-7",
              "metadata.name": "llm-sft-0001-x7k2p-head-abcde", "metadata.namespace": "ml", "metadata.uid": "u-1"}
    env = kubelet_env(sidecar, fields, secret["stringData"])
    args = [re.sub(r"\$\((\w+)\)", lambda match: env[match.group(1)], arg) for arg in sidecar["args"]]
    args[args.index("--listen") + 1] = f"127.0.0.1:{port}"  # the pod's 0.0.0.0, kept off this machine's interfaces
    entrypoint = Path(sys.executable).parent / sidecar["command"][0]  # the console script the image runs
    log = tmp_path / "sidecar.log"
    process = subprocess.Popen([str(entrypoint), *args], cwd=tmp_path, stdout=log.open("wb"),
                               stderr=subprocess.STDOUT, env={**os.environ, **env})
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return http_get(url + "/readyz")[0] == 200
            except OSError:  # not listening yet
                return False

        wait_until(lambda: process.poll() is not None or ready(), 20, "the sidecar to become ready")
        assert process.poll() is None, log.read_text()
        # Ready once every collector ran; the rendering that holds them all follows: the node's name
        # from the downward API, in the host collector's raypulse_node_info.
        wait_until(lambda: 'node_name="gpu-node-7"' in http_get(url + "/metrics")[2].decode(), 10,
                   "a rendering with the node's name")
        wait_until(lambda: "raypulse_ray_local_raylets" in http_get(url + "/metrics")[2].decode(), 10,
                   "a rendering with the ray collector's")
        body = http_get(url + "/readyz")[2].decode()
        metrics = http_get(url + "/metrics")[2].decode()
        assert body.startswith("ready\n")
        assert 'collector="gpu"' not in metrics  # the head's sidecar does not look for GPUs
        assert "gpu:" not in body
        if "raypulse_ray_local_raylets 0.0" in metrics:  # no Ray on this machine: the sidecar says so
            assert "ray_processes: no Ray processes visible (" in body
    finally:
        process.terminate()
        process.wait(10)
