"""Kubernetes manifests for running the exporter on every node, next to kube-prometheus-stack:
`exporter manifests --namespace NS --release NAME -o DIR` (docs/kubernetes.md).

In apply order: a DaemonSet (the host's PID namespace, /proc, /sys and / mounted read-only and
passed as --procfs/--sysfs/--rootfs, every GPU of the node through the NVIDIA container runtime, the
kubelet's pod-resources socket, tolerations, a priority class), a headless Service, a ServiceMonitor
whose relabelings give every series the `node` and `cluster` labels (or the names of another label
contract, exporter/labels.py, with the rules and dashboards following it) and the scrape job the alert
rules select, a PrometheusRule holding alerts/rules/*.yaml, and one ConfigMap per Grafana dashboard
(`grafana_dashboard: "1"`, what kube-prometheus-stack's Grafana sidecar loads). Every object carries
the namespace and, with `release`, the `release` label kube-prometheus-stack's Prometheus selects.

Plain data, like launcher/kuberay.py renders the RayJob; tests/test_k8s_manifests.py validates each
object against the Kubernetes OpenAPI schema or the prometheus-operator CRD vendored in tests/data/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from exporter import __version__, assets, wire
from exporter.labels import DEFAULT_CLUSTER, DEFAULT_NODE, DEFAULT_RUNBOOK_BASE, DEFAULT_SCRAPE_JOB, LabelContract

DEFAULT_IMAGE = f"ghcr.io/raypulse/raypulse-exporter:{__version__}"
DEFAULT_NAMESPACE = "monitoring"
DEFAULT_NAME = "raypulse-exporter"
PORT_NAME = "metrics"
READY_PATH = "/readyz"  # exporter/server.py serves it; wire.py names no constant for it yet
# Where the host's file systems appear in the container, as node_exporter's manifests put them.
HOST_PROC, HOST_SYS, HOST_ROOT = "/host/proc", "/host/sys", "/host/root"
POD_RESOURCES = "/var/lib/kubelet/pod-resources"  # the kubelet's PodResources gRPC socket (kubelet.sock)
# kube-prometheus-stack's Grafana sidecar loads ConfigMaps with this label (its default `sidecar.dashboards.label`).
DASHBOARD_LABEL = "grafana_dashboard"
DASHBOARD_FOLDER_ANNOTATION = "grafana_folder"  # the sidecar's usual `folderAnnotation`
# The rayproject/ray images run Ray as uid 1000, gid 100; the image's own user is the same, so an
# unprivileged exporter may still read Ray's processes (same uid) and nothing else's.
IMAGE_USER, IMAGE_GROUP = 1000, 100
# Reading /proc/<pid>/environ, io and fd of other users' processes (Ray processes -> jobs, the
# process collectors) takes the DAC bypass for reading and ptrace-read access: root with these two
# capabilities, nothing else (`unprivileged=True` runs as the image's user without them).
PROCESS_CAPABILITIES = ("SYS_PTRACE", "DAC_READ_SEARCH")
DEFAULT_RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "1", "memory": "512Mi"},
}
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Options:
    """What `exporter manifests` is told; the defaults match /sd and the alert rules."""

    namespace: str = DEFAULT_NAMESPACE
    release: str | None = None  # kube-prometheus-stack's Helm release: its Prometheus selects `release: <it>`
    name: str = DEFAULT_NAME  # of the DaemonSet and Service; the other objects' names start with it
    image: str = DEFAULT_IMAGE
    cluster: str = "default"  # the value of the cluster label on every series
    # The label contract (exporter/labels.py), as alerts.build and dashboards.build take it: the label
    # names (as the head exporter's /sd gives them by default), the `job` the alert rules select, and
    # where the rules' runbook links point. The PrometheusRule and the dashboards follow it.
    cluster_label: str = DEFAULT_CLUSTER
    node_label: str = DEFAULT_NODE
    scrape_job: str = DEFAULT_SCRAPE_JOB
    runbook_base: str = DEFAULT_RUNBOOK_BASE
    scrape_interval: str = "15s"
    runtime_class: str | None = None  # e.g. "nvidia" where the NVIDIA runtime is not containerd's default
    priority_class: str | None = "system-node-critical"
    host_network: bool = True  # the node's interfaces, not the pod's, in the network and tcp series
    unprivileged: bool = False  # run as the image's user without capabilities (see PROCESS_CAPABILITIES)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ({"operator": "Exists"},)  # every node, GPU taints included
    resources: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: DEFAULT_RESOURCES)

    def __post_init__(self) -> None:
        for what, value, longest in (("namespace", self.namespace, 63), ("name", self.name, 40)):
            if len(value) > longest or not _DNS_LABEL.match(value):
                raise ValueError(f"{what} {value!r} must be a DNS label of at most {longest} characters: lower-case "
                                 "letters, digits and '-', starting with a letter")
        if self.release is not None and (not self.release or len(self.release) > 63
                                         or not _LABEL_VALUE.match(self.release)):
            raise ValueError(f"release {self.release!r} is not a Kubernetes label value (at most 63 characters: "
                             "letters, digits, '-', '_', '.', starting and ending alphanumeric)")
        self.labels  # noqa: B018 -- validates the label names

    @property
    def labels(self) -> LabelContract:
        return LabelContract(cluster=self.cluster_label, node=self.node_label, scrape_job=self.scrape_job,
                             runbook_base=self.runbook_base)


def _labels(options: Options) -> dict[str, str]:
    labels = {**_selector(options), "app.kubernetes.io/version": __version__, "app.kubernetes.io/part-of": "raypulse",
              "app.kubernetes.io/component": "exporter", "app.kubernetes.io/managed-by": "raypulse"}
    if options.release:
        labels["release"] = options.release
    return labels


def _selector(options: Options) -> dict[str, str]:
    return {"app.kubernetes.io/name": "raypulse-exporter", "app.kubernetes.io/instance": options.name}


def _metadata(options: Options, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": options.namespace, "labels": _labels(options), **extra}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _container(options: Options) -> dict[str, Any]:
    args = ["serve", "--listen", f"0.0.0.0:{wire.EXPORTER_PORT}",
            "--procfs", HOST_PROC, "--sysfs", HOST_SYS, "--rootfs", HOST_ROOT,
            "--cluster", options.cluster,
            # Training progress goes to the exporter beside Ray in the KubeRay pod (the sidecar).
            "--progress-listen", "off"]
    if options.unprivileged:
        user: dict[str, Any] = {"runAsUser": IMAGE_USER, "runAsGroup": IMAGE_GROUP, "runAsNonRoot": True,
                                "capabilities": {"drop": ["ALL"]}}
    else:
        user = {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False,
                "capabilities": {"drop": ["ALL"], "add": list(PROCESS_CAPABILITIES)}}
    probe = {"port": PORT_NAME, "scheme": "HTTP"}
    return {
        "name": "exporter",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["exporter"],
        "args": args,
        "ports": [{"name": PORT_NAME, "containerPort": wire.EXPORTER_PORT, "protocol": "TCP"}],
        "env": [
            # The node's name in raypulse_node_info and the pod series: the Kubernetes node's, as `node` is.
            _field_env(f"{wire.ENV_EXPORTER_PREFIX}NODE__NAME", "spec.nodeName"),
            _field_env("NODE_NAME", "spec.nodeName"),
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            _field_env("POD_UID", "metadata.uid"),
            # The NVIDIA container runtime (or its CDI hook) mounts every GPU of the node and the
            # driver's NVML library without the pod requesting nvidia.com/gpu (which would take GPUs
            # away from the jobs); `utility` is the capability that carries libnvidia-ml.
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ],
        "readinessProbe": {"httpGet": {"path": READY_PATH, **probe}, "periodSeconds": 10, "timeoutSeconds": 3},
        "livenessProbe": {"httpGet": {"path": wire.HEALTH_PATH, **probe}, "periodSeconds": 20, "timeoutSeconds": 3,
                          "failureThreshold": 6},
        "resources": {kind: dict(amounts) for kind, amounts in options.resources.items()},
        "securityContext": {**user, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "privileged": False},
        "volumeMounts": [
            {"name": "proc", "mountPath": HOST_PROC, "readOnly": True},
            {"name": "sys", "mountPath": HOST_SYS, "readOnly": True},
            # HostToContainer: volumes mounted on the host later (checkpoints) are seen too.
            {"name": "root", "mountPath": HOST_ROOT, "readOnly": True, "mountPropagation": "HostToContainer"},
            {"name": "pod-resources", "mountPath": POD_RESOURCES, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def daemonset(options: Options) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "hostPID": True,  # Ray's processes of every pod on the node, and the GPU processes NVML reports
        "hostNetwork": options.host_network,
        "automountServiceAccountToken": False,  # it never talks to the API server
        "enableServiceLinks": False,
        "nodeSelector": {"kubernetes.io/os": "linux", **options.node_selector},
        "tolerations": [dict(toleration) for toleration in options.tolerations],
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(options)],
        "volumes": [
            {"name": "proc", "hostPath": {"path": "/proc", "type": "Directory"}},
            {"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}},
            {"name": "root", "hostPath": {"path": "/", "type": "Directory"}},
            {"name": "pod-resources", "hostPath": {"path": POD_RESOURCES, "type": "DirectoryOrCreate"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        ],
    }
    if options.host_network:
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    if options.priority_class:
        pod["priorityClassName"] = options.priority_class
    if options.runtime_class:
        pod["runtimeClassName"] = options.runtime_class
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _metadata(options, options.name),
        "spec": {
            "selector": {"matchLabels": _selector(options)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {"metadata": {"labels": _labels(options),
                                      "annotations": {"kubectl.kubernetes.io/default-container": "exporter"}},
                         "spec": pod},
        },
    }


def service(options: Options) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(options, options.name),
        "spec": {
            "clusterIP": "None",  # only for discovery: Prometheus scrapes each pod
            # A pod that is not ready yet (a collector still pending) is scraped all the same: its
            # raypulse_exporter_collector_up series say which collector holds it back.
            "publishNotReadyAddresses": True,
            "selector": _selector(options),
            "ports": [{"name": PORT_NAME, "port": wire.EXPORTER_PORT, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }


def relabelings(options: Options) -> list[dict[str, Any]]:
    """The labels rules and dashboards select on, as /sd gives them outside Kubernetes; applied after
    the operator's own, so they also replace its `job` (the Service's name)."""
    return [
        {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": options.labels.node},
        {"action": "replace", "targetLabel": options.labels.cluster, "replacement": options.cluster},
        {"action": "replace", "targetLabel": wire.SD_JOB_LABEL, "replacement": options.labels.scrape_job},
    ]


def service_monitor(options: Options) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _metadata(options, options.name),
        "spec": {
            "selector": {"matchLabels": _selector(options)},
            "namespaceSelector": {"matchNames": [options.namespace]},
            "endpoints": [{"port": PORT_NAME, "path": wire.METRICS_PATH, "scheme": "http",
                           "interval": options.scrape_interval, "relabelings": relabelings(options)}],
        },
    }


def prometheus_rule(options: Options) -> dict[str, Any]:
    contract = options.labels  # the shipped files use the default contract
    docs = [yaml.safe_load(text) for text in assets.rule_files().values()]
    groups = [group for doc in docs for group in (doc if contract.is_default else contract.rule_file(doc))["groups"]]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _metadata(options, f"{options.name}-rules"),
        "spec": {"groups": groups},
    }


def dashboard_configmaps(options: Options) -> list[dict[str, Any]]:
    maps = []
    for file_name, text in assets.dashboards().items():
        short = file_name.removesuffix(".json").removeprefix("raypulse-")
        metadata = _metadata(options, f"{options.name}-dashboard-{short}",
                             annotations={DASHBOARD_FOLDER_ANNOTATION: "raypulse"})
        metadata["labels"][DASHBOARD_LABEL] = "1"
        # Compact: `kubectl apply` (client side) keeps a copy in an annotation of at most 256 KiB.
        dashboard = json.loads(text)
        if not options.labels.is_default:
            dashboard = options.labels.dashboard(dashboard)
        compact = json.dumps(dashboard, separators=(",", ":"), ensure_ascii=False)
        maps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {file_name: compact}})
    return maps


def render(options: Options | None = None) -> list[dict[str, Any]]:
    """Every object, in apply order."""
    options = options or Options()
    return [daemonset(options), service(options), service_monitor(options), prometheus_rule(options),
            *dashboard_configmaps(options)]


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # one plain document per object, no &anchors
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def to_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=4096, allow_unicode=True)


def write(objects: Sequence[Mapping[str, Any]], directory: Path) -> list[Path]:
    """One file per object, numbered in apply order (`kubectl apply -f DIR` takes them so)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, obj in enumerate(objects, start=1):
        path = directory / f"{number:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path.write_text(to_yaml([obj]), encoding="utf-8")
        paths.append(path)
    return paths
