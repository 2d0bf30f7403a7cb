"""`launcher exporters manifests`: every object validates, strictly, against the Kubernetes OpenAPI definitions
(tests/data/kubernetes/) or the prometheus-operator CRD (tests/data/prometheus-operator/), and carries
what the exporter, the alert rules and kube-prometheus-stack expect of it. No Kubernetes API server:
what only one can check is listed in docs/kubernetes.md."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from alerts.config import DEFAULT as ALERTS_CONFIG
from exporter import assets
from exporter.cli import MANIFESTS_MOVED, main
from exporter.config import NodeSettings
from exporter.contract import wire
from launcher.cli import main as launcher_main
from launcher.deploy import manifests
from launcher.deploy.manifests import Options, render
from scripts.ports import free_port
from tests.conftest import http_get, wait_until
from tests.schemas import strict

DATA = Path(__file__).parent / "data"
K8S_DEFINITIONS = DATA / "kubernetes" / "definitions-v1.36.json"
CRDS = DATA / "prometheus-operator"
K8S_KINDS = {("apps/v1", "DaemonSet"): "io.k8s.api.apps.v1.DaemonSet",
             ("v1", "Service"): "io.k8s.api.core.v1.Service",
             ("v1", "ConfigMap"): "io.k8s.api.core.v1.ConfigMap",
             ("v1", "ServiceAccount"): "io.k8s.api.core.v1.ServiceAccount"}
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1-openapi.json",
             ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-v1-openapi.json"}
VARIANTS = [
    Options(),
    Options(namespace="ml-monitoring", release="kube-prometheus-stack", cluster="gpu-prod", runtime_class="nvidia"),
    Options(watchdog=True),  # a PrometheusRule for a Prometheus without kube-prometheus-stack's Watchdog
    Options(name="rp", unprivileged=True, host_network=False, priority_class=None,
            node_selector={"nvidia.com/gpu.present": "true"},
            tolerations=({"operator": "Exists"},)),
    # every deploy knob at once
    Options(profile="node-exporter-companion", web_config_secret="raypulse-web", image_pull_secrets=("regcred",),
            extra_args=("--log-level", "debug"), env={"RAYPULSE_EXPORTER_LOG_LEVEL": "debug"},
            affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}},
            tolerations=({"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},)),
]


@pytest.fixture(scope="module")
def validators() -> dict[tuple[str, str], jsonschema.Validator]:
    definitions = json.loads(K8S_DEFINITIONS.read_text())["definitions"]
    # As the API server reads them (README): an int or a string; a quantity as a string or a number.
    definitions["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["integer", "string"]}
    definitions["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": ["string", "number"]}
    definitions = strict(definitions)
    found: dict[tuple[str, str], jsonschema.Validator] = {}
    for key, name in K8S_KINDS.items():
        schema = {"$ref": f"#/definitions/{name}", "definitions": definitions}
        found[key] = jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())
    for key, file_name in CRD_KINDS.items():
        schema = strict(json.loads((CRDS / file_name).read_text()))
        found[key] = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    return found


def problems(validators, obj: dict[str, Any]) -> list[str]:
    validator = validators[(obj["apiVersion"], obj["kind"])]
    return [f"{obj['kind']} {'/'.join(map(str, error.path))}: {error.message}"
            for error in sorted(validator.iter_errors(obj), key=lambda error: list(error.path))]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = by_kind(objects, kind)
    return obj


@pytest.mark.parametrize("options", VARIANTS,
                         ids=["defaults", "kube-prometheus-stack", "watchdog", "unprivileged", "knobs"])
def test_every_object_validates_against_its_schema(validators, options):
    objects = render(options)
    assert sorted({obj["kind"] for obj in objects}) == ["ConfigMap", "DaemonSet", "PrometheusRule", "Service",
                                                        "ServiceAccount", "ServiceMonitor"]
    assert [error for obj in objects for error in problems(validators, obj)] == []


def test_the_strict_schemas_catch_a_misspelt_field(validators):
    objects = render()
    daemonset, monitor = one(objects, "DaemonSet"), one(objects, "ServiceMonitor")
    broken = copy.deepcopy(daemonset)
    broken["spec"]["template"]["spec"]["hostPid"] = broken["spec"]["template"]["spec"].pop("hostPID")
    assert any("hostPid" in error for error in problems(validators, broken))
    broken = copy.deepcopy(monitor)
    broken["spec"]["endpoints"][0]["relabelConfigs"] = broken["spec"]["endpoints"][0].pop("relabelings")
    assert any("relabelConfigs" in error for error in problems(validators, broken))
    broken = copy.deepcopy(daemonset)
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9477"
    assert problems(validators, broken)


def test_every_object_has_the_namespace_and_the_release_label():
    for obj in render(Options(namespace="obs", release="kps")):
        assert obj["metadata"]["namespace"] == "obs"
        assert obj["metadata"]["labels"]["release"] == "kps", obj["metadata"]["name"]
    assert all("release" not in obj["metadata"]["labels"] for obj in render(Options()))


def test_the_daemonset_watches_the_host_read_only_through_the_flags():
    daemonset = manifests.daemonset(Options())
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["hostPID"] is True
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    args = container["args"]
    for flag, host_path in (("--procfs", "/proc"), ("--sysfs", "/sys"), ("--rootfs", "/")):
        mount = mounts[args[args.index(flag) + 1]]
        assert volumes[mount["name"]]["hostPath"]["path"] == host_path
        assert mount["readOnly"] is True
    pod_resources = mounts[manifests.POD_RESOURCES]
    assert volumes[pod_resources["name"]]["hostPath"]["path"] == manifests.POD_RESOURCES
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert mounts["/tmp"]["name"] in {name for name, volume in volumes.items() if "emptyDir" in volume}
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= daemonset["spec"]["template"]["metadata"][
        "labels"].items()


def test_the_daemonset_sees_every_gpu_through_the_nvidia_runtime_without_taking_one():
    pod = manifests.daemonset(Options(runtime_class="nvidia"))["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
    assert pod["runtimeClassName"] == "nvidia"
    assert not any("nvidia.com/gpu" in amounts for amounts in container["resources"].values())
    assert "runtimeClassName" not in manifests.daemonset(Options())["spec"]["template"]["spec"]
    # The node's name reaches raypulse_node_info as the `node` label gets it: the Kubernetes node's.
    node_name = next(item for item in container["env"] if item["name"] == f"{wire.ENV_EXPORTER_PREFIX}NODE__NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_root_only_with_the_two_capabilities_that_process_attribution_needs():
    def security(options: Options) -> dict[str, Any]:
        return manifests.daemonset(options)["spec"]["template"]["spec"]["containers"][0]["securityContext"]

    privileged = security(Options())
    assert privileged["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "DAC_READ_SEARCH"]}
    assert privileged["privileged"] is False
    unprivileged = security(Options(unprivileged=True))
    assert unprivileged["runAsNonRoot"] is True
    assert unprivileged["runAsUser"] != 0
    assert unprivileged["capabilities"] == {"drop": ["ALL"]}


def test_the_probes_and_ports_are_the_exporters():
    objects = render()
    daemonset, service, monitor = (one(objects, kind) for kind in ("DaemonSet", "Service", "ServiceMonitor"))
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    (port,) = container["ports"]
    assert port["containerPort"] == wire.EXPORTER_PORT
    assert f"0.0.0.0:{wire.EXPORTER_PORT}" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": wire.HEALTH_PATH, "port": port["name"], "scheme": "HTTP"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]
    assert service_port["port"] == wire.EXPORTER_PORT
    assert service["spec"]["selector"] == daemonset["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service_port["name"]
    assert endpoint["path"] == wire.METRICS_PATH
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # No namespaceSelector: the operator looks in the ServiceMonitor's own namespace, the Service's.
    assert "namespaceSelector" not in monitor["spec"]
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]


def test_the_service_monitor_gives_the_labels_the_rules_and_dashboards_select_on():
    (endpoint,) = manifests.service_monitor(Options(cluster="gpu-prod"))["spec"]["endpoints"]
    targets = {item["targetLabel"]: item for item in endpoint["relabelings"]}
    assert targets["node"]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    assert targets["cluster"]["replacement"] == "gpu-prod"
    # Under the operator the job is the Service's name; the rules select the scrape job of alerts/config.py.
    assert targets[wire.SD_JOB_LABEL]["replacement"] == ALERTS_CONFIG.scrape_job
    rules = "".join(assets.rule_files().values())
    assert ALERTS_CONFIG.up in rules
    (endpoint,) = manifests.service_monitor(Options(cluster_label="ray_io_cluster"))["spec"]["endpoints"]
    assert "ray_io_cluster" in {item["targetLabel"] for item in endpoint["relabelings"]}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (make system-deps)")
def test_the_prometheus_rule_holds_every_rule_file_and_promtool_accepts_it(tmp_path):
    rule = manifests.prometheus_rule(Options())
    packaged = [group for text in assets.rule_files().values() for group in yaml.safe_load(text)["groups"]]
    assert rule["spec"]["groups"] == packaged
    names = [group["name"] for group in rule["spec"]["groups"]]
    assert len(names) == len(set(names)), "the operator refuses a PrometheusRule with two groups of one name"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _alerts(rule: dict) -> set[str]:
    return {item["alert"] for group in rule["spec"]["groups"] for item in group["rules"] if "alert" in item}


def test_the_prometheus_rule_fits_kube_prometheus_stack_and_our_watchdog_is_opt_in():
    """kube-prometheus-stack has its own Watchdog (its Alertmanager sends only that one to its null
    receiver): ours is not in the PrometheusRule unless asked for, and the rule carries `release`."""
    default = manifests.prometheus_rule(Options(release="kps"))
    assert default["metadata"]["labels"]["release"] == "kps"
    assert "RaypulseWatchdog" not in _alerts(default)
    down = next(item for group in default["spec"]["groups"] for item in group["rules"]
                if item.get("alert") == "RaypulseExporterDown")
    assert (down["labels"]["severity"], down["for"]) == ("warning", "10m")  # as kps' TargetDown
    with_it = manifests.prometheus_rule(Options(watchdog=True))
    assert _alerts(with_it) - _alerts(default) == {"RaypulseWatchdog"}
    names = [group["name"] for group in with_it["spec"]["groups"]]
    assert len(names) == len(set(names))
    monitor = manifests.service_monitor(Options(release="kps"))
    assert monitor["metadata"]["labels"]["release"] == "kps"


def test_one_configmap_per_dashboard_for_grafanas_sidecar():
    maps = manifests.dashboard_configmaps(Options(release="kps"))
    packaged = assets.dashboards()
    assert len(maps) == len(packaged)
    for configmap in maps:
        assert configmap["metadata"]["labels"][manifests.DASHBOARD_LABEL] == "1"
        ((file_name, text),) = configmap["data"].items()
        assert json.loads(text) == json.loads(packaged[file_name])
        # `kubectl apply` without --server-side keeps the object in an annotation of at most 256 KiB.
        assert len(json.dumps(configmap)) < 256 * 1024, file_name
    assert len({configmap["metadata"]["name"] for configmap in maps}) == len(maps)


def test_bad_names_are_refused_with_the_rule():
    with pytest.raises(ValueError, match="DNS label"):
        Options(namespace="Monitoring")
    with pytest.raises(ValueError, match="label value"):
        Options(release="kube prometheus")
    with pytest.raises(ValueError, match="Prometheus label name"):
        Options(cluster_label="ray.io/cluster")


def test_the_command_writes_one_file_per_object(tmp_path, validators):
    result = CliRunner().invoke(launcher_main, ["exporters", "manifests", "--namespace", "obs", "--release", "kps",
                                                "--runtime-class", "nvidia", "--node-selector",
                                                "nvidia.com/gpu.present=true", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    files = sorted(tmp_path.glob("*.yaml"))
    objects = [yaml.safe_load(path.read_text()) for path in files]
    assert [obj["kind"] for obj in objects[:5]] == ["ServiceAccount", "DaemonSet", "Service", "ServiceMonitor",
                                                    "PrometheusRule"]
    assert {obj["kind"] for obj in objects[5:]} == {"ConfigMap"}
    assert all(obj["metadata"]["labels"]["release"] == "kps" for obj in objects)
    assert [error for obj in objects for error in problems(validators, obj)] == []
    pod = objects[1]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    stdout = CliRunner().invoke(launcher_main, ["exporters", "manifests", "--priority-class", ""])
    assert stdout.exit_code == 0
    assert "priorityClassName" not in one(list(yaml.safe_load_all(stdout.output)), "DaemonSet")["spec"]["template"][
        "spec"]
    refused = CliRunner().invoke(launcher_main, ["exporters", "manifests", "--namespace", "Bad_NS"],
                                 env={"RAYPULSE_HOME": str(tmp_path / "home")})
    assert refused.exit_code == 2
    assert "DNS label" in refused.output


def test_assets_writes_the_packaged_dashboards_and_rules(tmp_path):
    result = CliRunner().invoke(main, ["assets", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    repo = Path(__file__).resolve().parent.parent
    for written, source in ((tmp_path / "dashboards", repo / "dashboards" / "json"),
                            (tmp_path / "rules", repo / "alerts" / "rules")):
        expected = {path.name: path.read_text() for path in source.iterdir() if path.suffix in (".json", ".yaml")}
        assert {path.name: path.read_text() for path in written.iterdir()} == expected
    assert (tmp_path / "alertmanager.yml").read_text() == (repo / "alerts" / "alertmanager.yml").read_text()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a private mount namespace")
def test_the_exporter_run_as_the_daemonset_runs_it_reports_the_hosts_node_series(tmp_path):
    """The DaemonSet's hostPath volumes bind-mounted read-only where its volumeMounts put them (under
    tmp_path instead of /, in a private mount namespace whose own /proc and /sys are hidden) and its
    own arguments: the node series are this host's, read through the flags and the mounts only."""
    pod = manifests.daemonset(Options())["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    script = ["set -e"]
    for mount in container["volumeMounts"]:
        host_path = volumes[mount["name"]].get("hostPath", {}).get("path")
        if host_path is None or not Path(host_path).exists():
            continue  # the emptyDir /tmp; the pod-resources socket of a machine without a kubelet
        target = tmp_path / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True)
        script.append(f"mount --rbind {shlex.quote(host_path)} {shlex.quote(str(target))}")
        if mount.get("readOnly"):
            script.append(f"mount -o remount,bind,ro {shlex.quote(str(target))}")
    # Hide the namespace's own /proc and /sys: the node series can only come through the flags and
    # the mounts. (The `self` collector reads the exporter's own process through /proc/self: off.)
    script += ["mount -t tmpfs -o ro,size=4k hidden /proc", "mount -t tmpfs -o ro,size=4k hidden /sys"]
    port = free_port()
    args = [str(tmp_path) + arg if arg.startswith("/host/") else arg for arg in container["args"]]
    args += ["--disable-collector", "self"]
    args[args.index("--listen") + 1] = f"127.0.0.1:{port}"
    exporter_bin = Path(sys.executable).parent / "exporter"
    script.append(shlex.join(["exec", str(exporter_bin), *args]))
    server = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        def served() -> bool:
            assert server.poll() is None, server.stderr.read() if server.stderr else "exited"
            status, _, body = http_get(f"http://127.0.0.1:{port}{wire.METRICS_PATH}")
            return status == 200 and all(family in body for family in (  # each collector asserted on below has run
                b"raypulse_node_memory_total_bytes ", b"raypulse_node_info{",
                b"raypulse_node_network_receive_bytes_total{", b"raypulse_node_filesystem_size_bytes{"))
        wait_until(served, 60, "the exporter's node series")
        text = http_get(f"http://127.0.0.1:{port}{wire.METRICS_PATH}")[2].decode()
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    mem_total_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemTotal:"))
    assert [sample.value for sample in samples["raypulse_node_memory_total_bytes"]] == [mem_total_kib * 1024]
    excluded = re.compile(NodeSettings().network_exclude_interfaces)
    interfaces = {line.split(":")[0].strip() for line in Path("/proc/net/dev").read_text().splitlines()[2:]}
    assert {sample.labels["interface"] for sample in samples["raypulse_node_network_receive_bytes_total"]} == {
        name for name in interfaces if not excluded.match(name)}
    mountpoints = {sample.labels["mountpoint"] for sample in samples["raypulse_node_filesystem_size_bytes"]}
    assert "/" in mountpoints  # the host's root, measured through --rootfs


# --- deploy knobs (dcgm-exporter's chart values: deployment/values.yaml) -----------------------------------

def pod_spec(options: Options) -> dict[str, Any]:
    return manifests.daemonset(options)["spec"]["template"]["spec"]


def test_by_default_the_pods_tolerate_the_gpu_taint_and_are_node_critical():
    pod = pod_spec(Options())
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "system-node-critical"
    for absent in ("affinity", "imagePullSecrets"):
        assert absent not in pod


def test_the_pods_run_as_their_own_service_account_without_a_token():
    objects = render()
    account = one(objects, "ServiceAccount")
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False
    assert pod["automountServiceAccountToken"] is False
    assert not {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} & {obj["kind"] for obj in objects}


def test_profile_extra_args_and_env_reach_the_container_and_the_exporter_accepts_them():
    options = Options(profile="node-exporter-companion", extra_args=("--log-level", "debug"),
                      env={"RAYPULSE_EXPORTER_LOG_LEVEL": "debug"})
    (container,) = pod_spec(options)["containers"]
    args = container["args"]
    assert args[args.index("--profile") + 1] == "node-exporter-companion"
    assert args[-2:] == ["--log-level", "debug"]  # last: they win over the generated ones
    assert {"name": "RAYPULSE_EXPORTER_LOG_LEVEL", "value": "debug"} in container["env"]
    # The same arguments, as `exporter serve` would parse them (check-config takes serve's flags).
    result = CliRunner().invoke(main, ["check-config", *args[1:]], env={"RAYPULSE_EXPORTER_LOG_LEVEL": "debug"})
    assert result.exit_code == 0, result.output
    effective = yaml.safe_load(result.output)
    assert effective["profile"] == "node-exporter-companion"
    assert effective["log_level"] == "debug"
    assert "--profile" not in pod_spec(Options())["containers"][0]["args"]


def test_a_web_config_secret_means_https_for_the_probes_and_the_scrape():
    options = Options(web_config_secret="raypulse-web")
    pod = pod_spec(options)
    (container,) = pod["containers"]
    volume = next(volume for volume in pod["volumes"] if "secret" in volume)
    assert volume["secret"]["secretName"] == "raypulse-web"
    mount = next(mount for mount in container["volumeMounts"] if mount["name"] == volume["name"])
    assert mount["readOnly"] is True
    args = container["args"]
    assert args[args.index("--web-config") + 1] == f"{mount['mountPath']}/{manifests.WEB_CONFIG_KEY}"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (endpoint,) = manifests.service_monitor(options)["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "raypulse-web", "key": manifests.CA_KEY}
    (plain,) = manifests.service_monitor(Options())["spec"]["endpoints"]
    assert plain["scheme"] == "http"
    assert "tlsConfig" not in plain


def test_affinity_and_image_pull_secrets_are_the_pods():
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}}
    pod = pod_spec(Options(affinity=affinity, image_pull_secrets=("regcred", "mirror")))
    assert pod["affinity"] == affinity
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]


def test_bad_knobs_are_refused_with_the_rule():
    with pytest.raises(ValueError, match="profile"):
        Options(profile="everything")
    with pytest.raises(ValueError, match="Secret name"):
        Options(web_config_secret="Web_Config")
    with pytest.raises(ValueError, match="Secret name"):
        Options(image_pull_secrets=("reg cred",))
    with pytest.raises(ValueError, match="environment variable"):
        Options(env={"1BAD": "x"})
    with pytest.raises(ValueError, match="operator"):
        Options(tolerations=({"key": "a", "operator": "In"},))


def test_the_command_takes_every_knob(tmp_path, validators):
    affinity = tmp_path / "affinity.yaml"
    affinity.write_text("podAntiAffinity: {}\n")
    result = CliRunner().invoke(launcher_main, [
        "exporters", "manifests", "--profile", "none", "--web-config-secret", "raypulse-web", "--toleration", "*",
        "--toleration", "dedicated=ml:NoExecute", "--toleration", "nvidia.com/gpu", "--affinity", f"@{affinity}",
        "--image-pull-secret", "regcred", "--arg=--log-level", "--arg=debug", "--env", "A=b=c"])
    assert result.exit_code == 0, result.output
    objects = list(yaml.safe_load_all(result.output))
    assert [error for obj in objects for error in problems(validators, obj)] == []
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"operator": "Exists"},
                                  {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
                                  {"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert pod["affinity"] == {"podAntiAffinity": {}}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    (container,) = pod["containers"]
    assert container["args"][-2:] == ["--log-level", "debug"]
    assert "--profile" in container["args"]
    assert {"name": "A", "value": "b=c"} in container["env"]
    for bad, message in ((["--toleration", "key:Sometimes"], "KEY[=VALUE][:EFFECT]"),
                         (["--affinity", "[1, 2]"], "mapping"), (["--env", "NOVALUE"], "KEY=VALUE"),
                         (["--profile", "all"], "all")):
        refused = CliRunner().invoke(launcher_main, ["exporters", "manifests", *bad],
                                     env={"RAYPULSE_HOME": str(tmp_path / "home")})
        assert refused.exit_code == 2, (bad, refused.output)
        assert message in refused.output, (bad, refused.output)


def test_a_scrape_job_that_would_change_the_rules_promql_is_refused(tmp_path):
    refused = CliRunner().invoke(launcher_main, ["exporters", "manifests", "--scrape-job", 'j"} or vector(1) #'],
                                 env={"RAYPULSE_HOME": str(tmp_path / "home")})
    assert refused.exit_code == 2, refused.output
    assert refused.stdout == ""  # no rule, nothing half-written
    assert "scrape job 'j\"} or vector(1) #' is not a plain job name" in refused.stderr


def test_the_command_line_adds_our_watchdog_only_when_asked():
    def alerts(*flags: str) -> set[str]:
        result = subprocess.run([sys.executable, "-m", "launcher", "exporters", "manifests", "-o", "json", *flags],
                                capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent.parent)
        assert result.returncode == 0, result.stderr
        [rule] = [item for item in json.loads(result.stdout)["items"] if item["kind"] == "PrometheusRule"]
        return _alerts(rule)

    assert alerts("--watchdog") - alerts() == {"RaypulseWatchdog"}


@pytest.mark.parametrize("args", [[], ["--dir", "k8s", "--namespace", "obs"], ["--help"]])
def test_exporter_manifests_names_the_command_that_replaced_it(args: list[str]):
    result = subprocess.run([sys.executable, "-m", "exporter", "manifests", *args], capture_output=True, text=True,
                            timeout=60, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"exporter: {MANIFESTS_MOVED}"]
    assert "`launcher exporters manifests`" in MANIFESTS_MOVED


@pytest.mark.parametrize("field", ["namespace", "name", "release"])
def test_a_name_with_a_trailing_newline_is_refused(field: str):
    """`re.match` with `$` takes "abc\\n" as "abc": every name rule is matched whole (issue 41, finding 9)."""
    from launcher.deploy.manifests import Options

    with pytest.raises(ValueError, match=field):
        Options(**{field: "raypulse\n"})
