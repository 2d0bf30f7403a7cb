"""Kubernetes manifests for running the exporter on every node, next to kube-prometheus-stack:
`launcher exporters manifests --namespace NS --release NAME --dir DIR` (docs/kubernetes.md). They carry the
exporter, the alert rules and the dashboards, so they are rendered here, above all three (the exporter
imports neither dashboards nor alerts).

In apply order: a ServiceAccount of its own (no Role: the exporter never calls the API server, and the
pods get no token), a DaemonSet (the host's PID namespace, /proc, /sys and / mounted read-only and
passed as --procfs/--sysfs/--rootfs, every GPU of the node through the NVIDIA container runtime, the
kubelet's pod-resources socket, tolerations, a priority class), a headless Service, a ServiceMonitor
whose relabelings give every series the `node` and `cluster` labels (or the names of another label
contract, exporter/contract/labels.py, with the rules and dashboards following it) and the scrape job the alert
rules select, a PrometheusRule holding alerts/rules/*.yaml (not the opt-in RaypulseWatchdog: kube-prometheus-
stack has its own Watchdog; `watchdog=True` adds ours), and one ConfigMap per Grafana dashboard
(`grafana_dashboard: "1"`, what kube-prometheus-stack's Grafana sidecar loads). Every object carries
the namespace and, with `release`, the `release` label kube-prometheus-stack's Prometheus selects.

The deploy knobs of dcgm-exporter's chart (deployment/values.yaml) are Options fields and flags: the
collector profile, a web-config Secret (TLS and basic auth), tolerations, nodeSelector, affinity,
priorityClassName, imagePullSecrets, extra args and env. `kustomize(options)` lays the same objects out
as a kustomize base with two overlays (exporter/kustomize/, `launcher exporters manifests --kustomize DIR`):
`kube-prometheus-stack` (its `release` label, its Grafana sidecar's label) and `plain` (a Prometheus
without the Operator: a scrape job and the rule files, our Watchdog among them, as ConfigMaps instead of
the two CRD objects).

Plain data, like launcher/backends/kuberay/render.py renders the RayJob; tests/test_k8s_manifests.py validates each
object against the Kubernetes OpenAPI schema or the prometheus-operator CRD vendored in tests/data/,
and tests/test_kustomize.py renders the committed base and overlays with `kubectl kustomize`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from exporter import __version__, assets, profiles
from exporter.contract import wire
from exporter.contract.labels import (
    DEFAULT_CLUSTER,
    DEFAULT_NODE,
    DEFAULT_RUNBOOK_BASE,
    DEFAULT_SCRAPE_JOB,
    LabelContract,
)

DEFAULT_IMAGE = f"ghcr.io/raypulse/raypulse-exporter:{__version__}"
DEFAULT_NAMESPACE = "monitoring"
DEFAULT_NAME = "raypulse-exporter"
PORT_NAME = "metrics"
READY_PATH = "/readyz"  # exporter/serving/server.py serves it; contract/wire.py names no constant for it yet
# Where the host's file systems appear in the container, as node_exporter's manifests put them.
HOST_PROC, HOST_SYS, HOST_ROOT = "/host/proc", "/host/sys", "/host/root"
POD_RESOURCES = wire.POD_RESOURCES_DIR  # the kubelet's PodResources gRPC socket (kubelet.sock)
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
# The GPU Operator's and the device plugin's taint on GPU nodes; dcgm-exporter's DaemonSet tolerates it too.
GPU_TOLERATION: Mapping[str, str] = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# A web config Secret (TLS, basic auth: docs/web-config.md) as the KubeRay sidecar mounts it
# (launcher/backends/kuberay/render.py): the key web-config.yml and the files it names beside it; ca.crt is
# what the scrape trusts.
WEB_CONFIG_VOLUME = "web-config"
WEB_CONFIG_MOUNT = "/etc/raypulse/web"
WEB_CONFIG_KEY = "web-config.yml"
CA_KEY = "ca.crt"
TLS_SERVER_NAME = "raypulse-exporter"  # the DNS name the exporters' certificate must carry
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")  # what the API server accepts as an env var name


@dataclass(frozen=True)
class Options:
    """What `launcher exporters manifests` is told; the defaults match /sd and the alert rules."""

    namespace: str = DEFAULT_NAMESPACE
    release: str | None = None  # kube-prometheus-stack's Helm release: its Prometheus selects `release: <it>`
    name: str = DEFAULT_NAME  # of the DaemonSet and Service; the other objects' names start with it
    image: str = DEFAULT_IMAGE
    cluster: str = "default"  # the value of the cluster label on every series
    # The label contract (exporter/contract/labels.py), as alerts.build and dashboards.build take it: the label
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
    tolerations: Sequence[Mapping[str, Any]] = (GPU_TOLERATION,)  # GPU nodes are tainted nvidia.com/gpu
    affinity: Mapping[str, Any] | None = None  # the pod's `affinity`, as Kubernetes spells it
    resources: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: DEFAULT_RESOURCES)
    profile: str | None = None  # the exporter's --profile (exporter/profiles.py); None: its default
    # A Secret holding web-config.yml (and the certificate files it names): the exporter serves HTTPS
    # (basic auth if it lists users), the probes and the scrape speak HTTPS, the scrape trusts its ca.crt.
    web_config_secret: str | None = None
    image_pull_secrets: Sequence[str] = ()
    extra_args: Sequence[str] = ()  # appended to `exporter serve ...`: they win over the ones above
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment, e.g. RAYPULSE_EXPORTER_* settings
    cut: bool = False  # drop the families no rule needs and no panel depends on (dashboards/cut.py, docs/scale.md)
    # RaypulseWatchdog (always firing) in the PrometheusRule. Off: kube-prometheus-stack has its own Watchdog, and
    # its Alertmanager sends only that one to its null receiver. The plain overlay (no kps) always has it.
    watchdog: bool = False

    def __post_init__(self) -> None:
        for what, value, longest in (("namespace", self.namespace, 63), ("name", self.name, 40)):
            if len(value) > longest or not _DNS_LABEL.fullmatch(value):
                raise ValueError(f"{what} {value!r} must be a DNS label of at most {longest} characters: lower-case "
                                 "letters, digits and '-', starting with a letter")
        if self.release is not None and (not self.release or len(self.release) > 63
                                         or not _LABEL_VALUE.fullmatch(self.release)):
            raise ValueError(f"release {self.release!r} is not a Kubernetes label value (at most 63 characters: "
                             "letters, digits, '-', '_', '.', starting and ending alphanumeric)")
        if self.profile is not None and self.profile not in profiles.NAMES:
            raise ValueError(f"profile {self.profile!r} is not one of {', '.join(profiles.NAMES)}")
        for what, names in (("web config secret", [self.web_config_secret] if self.web_config_secret else []),
                            ("image pull secret", self.image_pull_secrets)):
            for name in names:
                if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
                    raise ValueError(f"{what} {name!r} is not a Secret name (lower-case letters, digits, '-' "
                                     "and '.', at most 253 characters)")
        for name in self.env:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"env {name!r} is not an environment variable name (letters, digits, '_', '-', "
                                 "'.', not starting with a digit)")
        for toleration in self.tolerations:
            if not isinstance(toleration, Mapping) or toleration.get("operator", "Equal") not in ("Exists", "Equal"):
                raise ValueError(f"toleration {toleration!r} needs operator Exists or Equal")
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
    if options.profile:
        args += ["--profile", options.profile]
    if options.web_config_secret:
        args += ["--web-config", f"{WEB_CONFIG_MOUNT}/{WEB_CONFIG_KEY}"]
    args += list(options.extra_args)
    if options.unprivileged:
        user: dict[str, Any] = {"runAsUser": IMAGE_USER, "runAsGroup": IMAGE_GROUP, "runAsNonRoot": True,
                                "capabilities": {"drop": ["ALL"]}}
    else:
        user = {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False,
                "capabilities": {"drop": ["ALL"], "add": list(PROCESS_CAPABILITIES)}}
    # The kubelet does not check the certificate and sends no credentials: with basic auth, the web config
    # lists /healthz and /readyz in auth_excluded_paths (docs/deploy.md).
    probe = {"port": PORT_NAME, "scheme": "HTTPS" if options.web_config_secret else "HTTP"}
    mounts: list[dict[str, Any]] = [
        {"name": "proc", "mountPath": HOST_PROC, "readOnly": True},
        {"name": "sys", "mountPath": HOST_SYS, "readOnly": True},
        # HostToContainer: volumes mounted on the host later (checkpoints) are seen too.
        {"name": "root", "mountPath": HOST_ROOT, "readOnly": True, "mountPropagation": "HostToContainer"},
        {"name": "pod-resources", "mountPath": POD_RESOURCES, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if options.web_config_secret:
        mounts.append({"name": WEB_CONFIG_VOLUME, "mountPath": WEB_CONFIG_MOUNT, "readOnly": True})
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
            *({"name": name, "value": value} for name, value in options.env.items()),
        ],
        "readinessProbe": {"httpGet": {"path": READY_PATH, **probe}, "periodSeconds": 10, "timeoutSeconds": 3},
        "livenessProbe": {"httpGet": {"path": wire.HEALTH_PATH, **probe}, "periodSeconds": 20, "timeoutSeconds": 3,
                          "failureThreshold": 6},
        "resources": {kind: dict(amounts) for kind, amounts in options.resources.items()},
        "securityContext": {**user, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "privileged": False},
        "volumeMounts": mounts,
    }


def service_account(options: Options) -> dict[str, Any]:
    """The pods' own identity, bound to no Role: the exporter reads the node, never the API server."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(options, options.name),
            "automountServiceAccountToken": False}


def daemonset(options: Options) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "hostPID": True,  # Ray's processes of every pod on the node, and the GPU processes NVML reports
        "hostNetwork": options.host_network,
        "serviceAccountName": options.name,
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
    if options.web_config_secret:
        # Readable by the image's user too (--unprivileged) without an fsGroup.
        pod["volumes"].append({"name": WEB_CONFIG_VOLUME,
                               "secret": {"secretName": options.web_config_secret, "defaultMode": 0o444}})
    if options.affinity:
        pod["affinity"] = copy.deepcopy(dict(options.affinity))
    if options.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in options.image_pull_secrets]
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


def _endpoint(options: Options) -> dict[str, Any]:
    endpoint: dict[str, Any] = {"port": PORT_NAME, "path": wire.METRICS_PATH, "scheme": "http",
                                "interval": options.scrape_interval}
    if options.web_config_secret:  # with basic auth, add the endpoint's basicAuth (docs/kubernetes.md)
        endpoint.update(scheme="https", tlsConfig={"ca": {"secret": {"name": options.web_config_secret, "key": CA_KEY}},
                                                   "serverName": TLS_SERVER_NAME})
    endpoint["relabelings"] = relabelings(options)
    if options.cut:
        endpoint["metricRelabelings"] = [{"sourceLabels": rule["source_labels"], "regex": rule["regex"],
                                          "action": rule["action"]} for rule in _cut_relabels()]
    return endpoint


def _cut_relabels() -> list[dict[str, Any]]:
    from dashboards import cut  # the dashboards and rules decide what the cut drops; only manifests need them

    return cut.relabel_configs(cut.derive())


def service_monitor(options: Options) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _metadata(options, options.name),
        "spec": {
            "selector": {"matchLabels": _selector(options)},
            # No namespaceSelector: the ServiceMonitor's own namespace, which follows a kustomize `namespace:`.
            "endpoints": [_endpoint(options)],
        },
    }


def _rule_files(options: Options, watchdog: bool) -> dict[str, dict[str, Any]]:
    """File name -> rule file; with `watchdog`, the opt-in Watchdog too, named to be loaded (`*.yaml`)."""
    contract = options.labels  # the shipped files use the default contract
    texts = assets.rule_files()
    if watchdog:
        from alerts.prometheus import DEFAULT_SUFFIX, OPT_IN_SUFFIX, WATCHDOG  # the rules' file names; only here

        texts[f"{WATCHDOG}{DEFAULT_SUFFIX}"] = assets.opt_in_rule_files()[f"{WATCHDOG}{OPT_IN_SUFFIX}"]
    docs = {name: yaml.safe_load(text) for name, text in texts.items()}
    return {name: doc if contract.is_default else contract.rule_file(doc) for name, doc in docs.items()}


def prometheus_rule(options: Options) -> dict[str, Any]:
    groups = [group for doc in _rule_files(options, options.watchdog).values() for group in doc["groups"]]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _metadata(options, f"{options.name}-rules"),
        "spec": {"groups": groups},
    }


def dashboard_configmaps(options: Options, sidecar_label: bool = True) -> list[dict[str, Any]]:
    """One per dashboard; `sidecar_label`: labelled for Grafana's dashboard sidecar (kube-prometheus-stack's
    and the Grafana chart's default label)."""
    maps = []
    for file_name, text in assets.dashboards().items():
        short = file_name.removesuffix(".json").removeprefix("raypulse-")
        metadata = _metadata(options, f"{options.name}-dashboard-{short}",
                             annotations={DASHBOARD_FOLDER_ANNOTATION: "raypulse"})
        if sidecar_label:
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
    return [service_account(options), daemonset(options), service(options), service_monitor(options),
            prometheus_rule(options), *dashboard_configmaps(options)]


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


# --- kustomize ---------------------------------------------------------------------------------------

# The committed base and overlays, beside the exporter they deploy (docs/kubernetes.md points kustomize there).
KUSTOMIZE_DIR = Path(__file__).resolve().parents[2] / "exporter" / "kustomize"
KPS_RELEASE = "kube-prometheus-stack"  # the chart's usual release name; `--release` for another
_KUSTOMIZATION = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
_GENERATED = ("# Generated by `launcher exporters manifests --kustomize` (launcher/deploy/manifests.py); "
              "do not edit.\n")
SCRAPE_CONFIG_KEY = "scrape-config.yaml"


def scrape_config(options: Options) -> dict[str, Any]:
    """The ServiceMonitor as one Prometheus scrape job, for a Prometheus without the Operator: the
    exporters' Service endpoints, the same `node`, `cluster` and `job` labels."""
    job: dict[str, Any] = {
        "job_name": options.labels.scrape_job,  # the job label the rules select
        "scrape_interval": options.scrape_interval,
        "metrics_path": wire.METRICS_PATH,
        "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": [options.namespace]}}],
        "relabel_configs": [
            {"action": "keep", "regex": f"{options.name};{PORT_NAME}",
             "source_labels": ["__meta_kubernetes_service_name", "__meta_kubernetes_endpoint_port_name"]},
            {"action": "replace", "source_labels": ["__meta_kubernetes_pod_node_name"],
             "target_label": options.labels.node},
            {"action": "replace", "target_label": options.labels.cluster, "replacement": options.cluster},
        ],
    }
    if options.web_config_secret:  # the Secret's ca.crt, mounted into Prometheus where this path says
        job["scheme"] = "https"
        job["tls_config"] = {"ca_file": f"/etc/prometheus/secrets/{options.web_config_secret}/{CA_KEY}",
                             "server_name": TLS_SERVER_NAME}
    if options.cut:
        job["metric_relabel_configs"] = _cut_relabels()
    return job


def prometheus_configmap(options: Options) -> dict[str, Any]:
    """The scrape job and the rule files, for a Prometheus that mounts them (no Operator to read the CRDs). Our
    Watchdog among them: such a Prometheus has no kube-prometheus-stack Watchdog."""
    data = {SCRAPE_CONFIG_KEY: to_yaml([[scrape_config(options)]])}
    data |= {name: to_yaml([doc]) for name, doc in _rule_files(options, watchdog=True).items()}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(options, f"{options.name}-prometheus"),
            "data": data}


def _file_name(number: int, obj: Mapping[str, Any]) -> str:
    return f"{number:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def _kustomization(**fields: Any) -> str:
    return _GENERATED + to_yaml([{**_KUSTOMIZATION, **fields}])


def kustomize(options: Options | None = None) -> dict[str, str]:
    """A kustomize base and two overlays, by path relative to the directory they go in.

    base/: every object of `render` but neutral: no `release` label, dashboards without the sidecar label.
    overlays/kube-prometheus-stack/: adds `release` (`options.release`, else kube-prometheus-stack) to
    every object and `grafana_dashboard: "1"` to the dashboards.
    overlays/plain/: no Prometheus Operator: drops the ServiceMonitor and the PrometheusRule, adds a
    ConfigMap with the same scrape job and rule files (and our Watchdog) for a Prometheus to mount, labels
    the dashboards for the Grafana chart's sidecar (the same label)."""
    options = options or Options()
    base_options = dataclasses.replace(options, release=None)
    objects = [service_account(base_options), daemonset(base_options), service(base_options),
               service_monitor(base_options), prometheus_rule(base_options),
               *dashboard_configmaps(base_options, sidecar_label=False)]
    files = {f"base/{_file_name(number, obj)}": to_yaml([obj]) for number, obj in enumerate(objects, start=1)}
    files["base/kustomization.yaml"] = _kustomization(
        namespace=options.namespace, resources=[path.removeprefix("base/") for path in files])
    sidecar = {"target": {"kind": "ConfigMap", "name": f"{options.name}-dashboard-.*"},
               "patch": to_yaml([[{"op": "add", "path": f"/metadata/labels/{DASHBOARD_LABEL}", "value": "1"}]])}
    files["overlays/kube-prometheus-stack/kustomization.yaml"] = _kustomization(
        resources=["../../base"],
        # Metadata only: the selectors and the pod template stay the base's (a DaemonSet's selector is immutable).
        labels=[{"pairs": {"release": options.release or KPS_RELEASE}}],
        patches=[sidecar])
    prometheus = prometheus_configmap(base_options)
    deletions = [{"patch": to_yaml([{"$patch": "delete", "apiVersion": obj["apiVersion"], "kind": obj["kind"],
                                     "metadata": {"name": obj["metadata"]["name"],
                                                  "namespace": obj["metadata"]["namespace"]}}])}
                 for obj in (service_monitor(base_options), prometheus_rule(base_options))]
    prometheus_file = _file_name(1, prometheus)
    files[f"overlays/plain/{prometheus_file}"] = to_yaml([prometheus])
    files["overlays/plain/kustomization.yaml"] = _kustomization(
        resources=["../../base", prometheus_file], patches=[*deletions, sidecar])
    return files


def write_kustomize(files: Mapping[str, str], directory: Path) -> list[Path]:
    """`kustomize()`'s files under `directory`; files of an earlier generation that it no longer makes go."""
    paths = []
    for relative, text in sorted(files.items()):
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    for stale in sorted({path.parent for path in paths}):
        for old in stale.glob("*.yaml"):
            if old not in paths:
                old.unlink()
    return paths
