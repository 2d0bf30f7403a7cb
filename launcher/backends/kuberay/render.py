"""KubeRay manifests for a job: a RayJob (head and worker groups, K8s-Job submitter, backoffLimit,
deadlines, shutdownAfterJobFinishes, runtime env, token auth), the Secret holding its token, the
exporter as a sidecar in every Ray pod, and a PodMonitor that scrapes those sidecars.

The sidecar runs the raypulse exporter image (launcher/deploy/manifests.py's DEFAULT_IMAGE, the Dockerfile's;
`exporter_image` overrides it) unprivileged (SIDECAR_SECURITY: non-root, no privilege escalation, no
capabilities, read-only root filesystem with an emptyDir /tmp). What it needs to see, and how it gets it
(docs/kubernetes.md, "KubeRay sidecar"): the Ray container's processes through shareProcessNamespace on
every Ray pod (same uid as Ray, so /proc/<pid> of Ray's processes is readable), and, in pods whose Ray
container requests GPUs, the node's GPUs read-only through the NVIDIA container runtime (GPU_VISIBILITY)
without requesting any. Its /readyz body says what it still cannot see. The PodMonitor relabels to the
label contract of the rules and dashboards (launcher/deploy/manifests.py's relabelings), with the cluster taken
from KubeRay's `ray.io/cluster` pod label, which the sidecar also passes as its --cluster.

With `exporter_web_config_secret` it serves TLS (and basic auth, if the web config has users) from a
Secret the user made: the Secret is mounted read-only at WEB_CONFIG_MOUNT and must hold web-config.yml
and the files it names (paths relative to it), the probes speak HTTPS and the PodMonitor scrapes HTTPS,
trusting the Secret's ca.crt (docs/deploy.md).

The RayJob validates against the v1 schema of KubeRay's CRD (tests/data/kuberay/) and follows
the rules KubeRay's own validation adds (DNS-1035 name of at most 47 characters, node labels in the
group `labels` field rather than rayStartParams, token auth with rayVersion >= 2.52). Queueing and
quota belong to Kueue: naming a queue adds its label, and Kueue suspends and admits the RayJob.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import importlib.metadata
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from exporter.contract import wire
from launcher import state
from launcher.backends.kuberay.access import KubeAccess, api_error, kube_api
from launcher.deploy.manifests import DEFAULT_IMAGE, Options, relabelings
from launcher.errors import BadInput
from launcher.health import stacks
from launcher.journal import Journal
from launcher.run import job_metadata, runtime_env
from launcher.runtime_env import is_remote
from launcher.spec import JobSpec, format_memory

if TYPE_CHECKING:
    from launcher.spec import WorkerGroup

RAY_PORTS = [("gcs-server", 6379), ("dashboard", 8265), ("client", 10001), ("metrics", 8080)]
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TOKEN_SECRET_KEY = "auth_token"  # KubeRay's RAY_AUTH_TOKEN_SECRET_KEY
EXPORTER_PORT_NAME = "raypulse"
POD_LABEL_RUN_ID = "raypulse.io/run-id"  # the PodMonitor selects the run's pods by it
WEB_CONFIG_VOLUME = "raypulse-web-config"
WEB_CONFIG_MOUNT = "/etc/raypulse/web"
WEB_CONFIG_KEY = "web-config.yml"  # the Secret's key holding the web config
CA_KEY = "ca.crt"  # the Secret's key the PodMonitor verifies the exporters' certificates with
TLS_SERVER_NAME = "raypulse-exporter"  # the name the exporters' certificate must carry (a DNS SAN)
TMP_VOLUME = "raypulse-tmp"
POD_RESOURCES_VOLUME = "raypulse-pod-resources"  # the kubelet's socket: which pod holds which GPU
RAY_CLUSTER_LABEL = "ray.io/cluster"  # KubeRay puts the RayCluster's name on every pod of it
CLUSTER_ENV = "RAYPULSE_RAY_CLUSTER"  # the sidecar's --cluster, from that label (downward API)
# GPU visibility without a GPU request (a request would take GPUs from the Ray container). With the
# device plugin the pod spec cannot name the GPUs the Ray container will get, so the sidecar asks the
# NVIDIA container runtime (or its CDI hook) for every GPU of the node with the `utility` capability
# only: libnvidia-ml and the device nodes, enough for a read-only NVML view, no compute. The device
# series are then the node's GPUs (the Ray container's among them), as nvidia-smi on the node shows.
# Runtimes that ignore the variable for unprivileged containers (the GPU operator's
# accept-nvidia-visible-devices-envvar-when-unprivileged=false) leave NVML unavailable: /readyz says so.
GPU_VISIBILITY = (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "utility"))
NO_GPU_COLLECTORS = ("gpu", "gpu_events")  # off in pods without GPUs: nothing to read, no node GPUs twice
# The rayproject/ray images run as `ray`, uid 1000 (gid 100): the exporter needs nothing more.
SIDECAR_USER, SIDECAR_GROUP = 1000, 100
GPU_IMAGE_SUFFIX = "-gpu"  # rayproject/ray:<version>-gpu: the CUDA build of the default image
RAY_CONTAINER_ALIAS = "ray"  # a pod template's container of this name merges into the Ray container
TOKEN_KEY_FILE = "kuberay-token.key"  # under $RAYPULSE_HOME, 0600: the run tokens' HMAC key
SIDECAR_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": SIDECAR_USER,
    "runAsGroup": SIDECAR_GROUP,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _pod_labels(spec: JobSpec) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/managed-by": "raypulse-launcher",
        "raypulse.io/job-name": spec.name,
        POD_LABEL_RUN_ID: spec.run_id or "",
        "raypulse.io/workspace": spec.workspace,
        "raypulse.io/user": spec.user,
    }
    labels.update({f"label.raypulse.io/{key}": value for key, value in spec.labels.items()})
    return labels


def _container_resources(cpus: float, memory: int | None, gpus: int = 0) -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": f"{int(cpus * 1000)}m" if cpus != int(cpus) else str(int(cpus))}
    if memory:
        amounts["memory"] = format_memory(memory)
    if gpus:
        amounts["nvidia.com/gpu"] = str(gpus)
    # Requests equal limits: Kueue counts requests, and a training pod should not be throttled.
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _exporter_sidecar(spec: JobSpec, role: str, dashboard: str, secret: str, gpus: int) -> dict[str, Any]:
    args = ["serve", "--listen", f"0.0.0.0:{spec.exporter_port}", "--ray-dashboard", dashboard,
            "--cluster", f"$({CLUSTER_ENV})", "--ray-role", role,
            "--progress-listen", f"127.0.0.1:{spec.progress_port}"]
    if not gpus:
        args += [arg for name in NO_GPU_COLLECTORS for arg in ("--disable-collector", name)]
    mounts = [{"name": TMP_VOLUME, "mountPath": "/tmp"}]
    if _pod_resources(spec, gpus):
        mounts.append({"name": POD_RESOURCES_VOLUME, "mountPath": wire.POD_RESOURCES_DIR, "readOnly": True})
    scheme = "HTTP"
    if spec.exporter_web_config_secret:
        args += ["--web-config", f"{WEB_CONFIG_MOUNT}/{WEB_CONFIG_KEY}"]
        mounts.append({"name": WEB_CONFIG_VOLUME, "mountPath": WEB_CONFIG_MOUNT, "readOnly": True})
        scheme = "HTTPS"  # the kubelet does not check the certificate; it sends no credentials (auth_excluded_paths)
    env = [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": TOKEN_SECRET_KEY}}},
        _field_env(CLUSTER_ENV, f"metadata.labels['{RAY_CLUSTER_LABEL}']"),
        # The Kubernetes node's name, as the PodMonitor's `node` label has it (raypulse_node_info, pod series).
        _field_env(f"{wire.ENV_EXPORTER_PREFIX}NODE__NAME", "spec.nodeName"),
        _field_env("NODE_NAME", "spec.nodeName"),
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("POD_UID", "metadata.uid"),
    ]
    if gpus:
        env += [{"name": name, "value": value} for name, value in GPU_VISIBILITY]
    return {
        "name": "raypulse-exporter",
        "image": spec.exporter_image or DEFAULT_IMAGE,
        "command": ["exporter"],  # the image's entrypoint, spelled out for images that have another
        "args": args,
        "ports": [{"name": EXPORTER_PORT_NAME, "containerPort": spec.exporter_port, "protocol": "TCP"}],
        "env": env,
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": EXPORTER_PORT_NAME, "scheme": scheme},
                           "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": wire.HEALTH_PATH, "port": EXPORTER_PORT_NAME, "scheme": scheme},
                          "periodSeconds": 20, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
        "securityContext": copy.deepcopy(SIDECAR_SECURITY),  # one object per pod: YAML without aliases
        "volumeMounts": mounts,
    }


def _pod_resources(spec: JobSpec, gpus: int) -> bool:
    """A GPU pod's sidecar reads the kubelet's pod-resources socket (`pod_resources`, off by default: a hostPath
    volume, which Pod Security's baseline level forbids), so it reports its own pod's GPUs alone, not the node's."""
    return spec.pod_resources and gpus > 0


def _sidecar_volumes(spec: JobSpec, gpus: int) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [{"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}}]
    if _pod_resources(spec, gpus):
        volumes.append({"name": POD_RESOURCES_VOLUME,
                        "hostPath": {"path": wire.POD_RESOURCES_DIR, "type": "Directory"}})
    if spec.exporter_web_config_secret:
        volumes.append({"name": WEB_CONFIG_VOLUME,
                        # Readable by the sidecar's user without an fsGroup (which would chown the Ray
                        # container's volumes too); mounted into the sidecar only.
                        "secret": {"secretName": spec.exporter_web_config_secret, "defaultMode": 0o444}})
    return volumes


def _process_namespace(spec: JobSpec) -> dict[str, Any]:
    """The sidecar sees the Ray container's processes only in a pod that shares its process namespace
    (`share_process_namespace`, on by default; off: the pod's own setting, the sidecar's own processes only)."""
    return {"shareProcessNamespace": True} if spec.share_process_namespace else {}


def _ray_container(spec: JobSpec, name: str, resources: dict[str, Any], ports: list[tuple[str, int]],
                   gpus: int = 0) -> dict:
    container: dict[str, Any] = {
        "name": name,
        "image": _image(spec, gpus),
        "resources": resources,
        "ports": [{"name": port_name, "containerPort": number} for port_name, number in ports],
    }
    if spec.sidecar:  # the training code's progress client finds the exporter sidecar through this
        container["env"] = [{"name": wire.ENV_PROGRESS_URL, "value": f"http://127.0.0.1:{spec.progress_port}"}]
    return container


def _image(spec: JobSpec, gpus: int) -> str:
    """The spec's image; GPU groups get the CUDA build of the default one (the CPU build has no CUDA)."""
    if gpus and "image" not in spec.model_fields_set:
        return spec.image + GPU_IMAGE_SUFFIX
    return spec.image


def _merge(ours: Any, theirs: Any) -> Any:
    """`theirs` laid over `ours` as a strategic merge patch would: mappings merge key by key, lists of
    named items (containers, volumes, env, imagePullSecrets) merge by name, other lists of objects (tolerations,
    topologySpreadConstraints) are appended to without duplicates, scalars and lists of scalars are
    replaced."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        merged = dict(ours)
        for key, value in theirs.items():
            merged[key] = _merge(ours[key], value) if key in ours else copy.deepcopy(value)
        return merged
    if isinstance(ours, list) and isinstance(theirs, list):
        if all(isinstance(item, dict) and "name" in item for item in ours + theirs):
            merged_items = {item["name"]: item for item in ours}
            for item in theirs:
                name = item["name"]
                merged_items[name] = _merge(merged_items[name], item) if name in merged_items else copy.deepcopy(item)
            return list(merged_items.values())
        if any(isinstance(item, dict) for item in ours + theirs):  # tolerations, topologySpreadConstraints
            return ours + [copy.deepcopy(item) for item in theirs if item not in ours]
    return copy.deepcopy(theirs)  # scalars and lists of them (command, args): the user's


def _shaped(pod: dict[str, Any], ray_container: str, *templates: dict[str, Any] | None) -> dict[str, Any]:
    """A Ray pod with the user's pod templates merged in, in order. A template container named `ray`
    means the Ray container (whatever our name for it); the pod's own labels win, so the PodMonitor and
    KubeRay still find it."""
    for template in templates:
        if not template:
            continue
        template = copy.deepcopy(template)
        for container in template.get("spec", {}).get("containers", []):
            if container["name"] == RAY_CONTAINER_ALIAS:
                container["name"] = ray_container
        labels = pod["metadata"]["labels"]
        pod = _merge(pod, template)
        pod["metadata"]["labels"] = {**pod["metadata"].get("labels", {}), **labels}
    return pod


def run_token(run_id: str) -> str:
    """The Ray auth token of a run: HMAC-SHA256 of its run id under a key kept 0600 in $RAYPULSE_HOME.
    Rendering the same run again gives the same token (a re-applied Secret does not rotate it under a
    running cluster), nothing per run is stored, and no one without the key can work it out from the
    run id. A cluster whose Secret already exists keeps its own (apply never overwrites it)."""
    path = state.home() / TOKEN_KEY_FILE
    try:
        key = bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        key = b""
    if len(key) < 32:
        key = secrets.token_bytes(32)
        state.write_private(path, key.hex() + "\n")
    return hmac.new(key, run_id.encode(), hashlib.sha256).hexdigest()


def _start_params(cpus: float, gpus: int, resources: dict[str, float], memory: int | None = None) -> dict[str, str]:
    params = {"num-cpus": str(int(cpus)) if cpus == int(cpus) else str(cpus), "num-gpus": str(gpus)}
    if memory:
        params["memory"] = str(memory)
    if resources:
        params["resources"] = json.dumps(resources)
    return params


def pod_monitor_relabelings() -> list[dict[str, Any]]:
    """The DaemonSet's relabelings (`node` from the pod's node, the alert rules' scrape `job`, label names
    from the one label contract), with the cluster taken from the RayCluster's pod label instead of a
    fixed value: every RayJob brings a RayCluster of its own."""
    options = Options()
    source = "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in RAY_CLUSTER_LABEL)
    return [{"action": "replace", "sourceLabels": [source], "targetLabel": options.cluster_label}
            if rule["targetLabel"] == options.cluster_label else rule for rule in relabelings(options)]


def _worker_group(spec: JobSpec, group: WorkerGroup, labels: dict[str, str], node_labels: dict[str, str],
                  dashboard: str, secret: str) -> dict[str, Any]:
    containers = [_ray_container(spec, "ray-worker", _container_resources(group.cpus, group.memory, group.gpus),
                                 [("metrics", 8080)], gpus=group.gpus)]
    pod: dict[str, Any] = {
        "metadata": {"labels": {**labels, "raypulse.io/role": "worker", "raypulse.io/group": group.name}},
        "spec": {"containers": containers},
    }
    if spec.sidecar:
        containers.append(_exporter_sidecar(spec, "worker", dashboard, secret, gpus=group.gpus))
        pod["spec"].update(volumes=_sidecar_volumes(spec, group.gpus), **_process_namespace(spec))
    selector = {"spec": {"nodeSelector": group.node_selector}} if group.node_selector else None
    return {
        "groupName": group.name,
        "replicas": group.count,
        "minReplicas": group.count,
        "maxReplicas": group.count,
        "rayStartParams": _start_params(group.cpus, group.gpus, group.resources, group.memory),
        "labels": {**node_labels, wire.NODE_LABEL_GROUP: group.name},
        "template": _shaped(pod, "ray-worker", spec.pod_template, group.pod_template, selector),
    }


def _entrypoint_fields(spec: JobSpec) -> dict[str, Any]:
    """`ray job submit`'s --submission-id and --entrypoint-* as the RayJob's fields (entrypointResources
    is a JSON string there). A RayJob has no field for the entrypoint's memory: the spec refuses it
    on this backend (launcher/backends/kinds.py)."""
    fields: dict[str, Any] = {}
    if spec.submission_id:
        fields["jobId"] = spec.submission_id  # KubeRay submits with it (each retry on a new cluster)
    if spec.entrypoint_num_cpus is not None:
        fields["entrypointNumCpus"] = spec.entrypoint_num_cpus
    if spec.entrypoint_num_gpus is not None:
        fields["entrypointNumGpus"] = spec.entrypoint_num_gpus
    if spec.entrypoint_resources:
        fields["entrypointResources"] = json.dumps(spec.entrypoint_resources, sort_keys=True)
    return fields


def render(spec: JobSpec, token: str | None = None, release: str | None = None,
           attempt_env: Mapping[str, str] | None = None, backoff_limit: int | None = None) -> list[dict[str, Any]]:
    """The manifests, in apply order: Secret, RayJob, PodMonitor (none with `sidecar` off). No object
    names a namespace: they land where they are applied (`kubectl apply -n`, the context's namespace).
    `token`: the Ray auth token (default: the run's, run_token). `release`: the `release` label
    kube-prometheus-stack's Prometheus selects PodMonitors by (its Helm release's name; default: the spec's).
    `attempt_env` and `backoff_limit`: a RayJob the launcher applies again after healing a fault (the
    checkpoint to resume from; what is left of max_retries)."""
    release = release or spec.release
    spec = spec.with_run_id()
    # The submitter pod passes the runtime env to the Jobs API: it cannot upload this machine's files.
    if spec.working_dir and not is_remote(spec.working_dir):
        raise BadInput(f"working_dir: {spec.working_dir} is a local directory; on Kubernetes give a remote URI "
                       "(https://.../code.zip, s3://..., gs://...) or bake the code into the image")
    for number, module in enumerate(spec.runtime_env.py_modules):
        if not is_remote(module):
            raise BadInput(f"runtime_env.py_modules[{number}]: {module} is a local path; on Kubernetes give a remote "
                           ".zip or .whl URI (https://, s3://, gs://...) or install the package in the image")
    name = spec.run_id or ""
    secret = f"{name}-ray-token"
    head_service = f"{name}-head"
    labels = _pod_labels(spec)
    node_labels = {wire.NODE_LABEL_EXPORTER_PORT: str(spec.exporter_port)}
    head_dashboard = "http://127.0.0.1:8265"  # same pod
    # The head's Service by its short name: the pods' DNS search path holds their own namespace.
    worker_dashboard = f"http://{head_service}:8265"

    head_containers = [_ray_container(spec, "ray-head", _container_resources(spec.head.cpus, spec.head.memory),
                                      RAY_PORTS)]
    if spec.sidecar:  # healing reads the sidecars; before a restart it takes stacks through the head's dashboard
        # (evidence.py), whose py-spy endpoint is off by default
        head_containers[0].setdefault("env", []).append({"name": stacks.PROFILING_ENV, "value": "1"})
    head_pod: dict[str, Any] = {"metadata": {"labels": {**labels, "raypulse.io/role": "head"}},
                                "spec": {"containers": head_containers}}
    if spec.sidecar:
        head_containers.append(_exporter_sidecar(spec, "head", head_dashboard, secret, gpus=0))
        head_pod["spec"].update(volumes=_sidecar_volumes(spec, 0), **_process_namespace(spec))
    worker_groups = [_worker_group(spec, group, labels, node_labels, worker_dashboard, secret)
                     for group in spec.worker_groups]
    ray_version = importlib.metadata.version("ray")
    env = runtime_env(spec, extra=attempt_env)
    metadata = job_metadata(spec, attempt=1)
    # KubeRay's own retries (backoffLimit) do not tell the job its attempt number; leave it out.
    metadata.pop(wire.META_ATTEMPT)
    rayjob: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name,
                     "labels": {**labels, **({KUEUE_QUEUE_LABEL: spec.queue} if spec.queue else {})}},
        "spec": {
            "entrypoint": spec.entrypoint,
            "metadata": metadata,
            "submissionMode": "K8sJobMode",
            "submitterConfig": {"backoffLimit": 2},
            "backoffLimit": spec.max_retries if backoff_limit is None else backoff_limit,
            "shutdownAfterJobFinishes": not spec.keep_cluster,
            "rayClusterSpec": {
                "rayVersion": ray_version,
                "authOptions": {"mode": "token", "secretName": secret},
                "headGroupSpec": {
                    "rayStartParams": {**_start_params(0, 0, spec.head.resources), "dashboard-host": "0.0.0.0"},
                    "labels": {**node_labels, wire.NODE_LABEL_GROUP: "head"},
                    "headService": {"metadata": {"name": head_service}},
                    "template": _shaped(head_pod, "ray-head", spec.pod_template),
                },
                "workerGroupSpecs": worker_groups,
            },
        },
    }
    if env:
        rayjob["spec"]["runtimeEnvYAML"] = yaml.safe_dump(env, sort_keys=False)
    rayjob["spec"].update(_entrypoint_fields(spec))
    if spec.active_deadline_seconds:
        rayjob["spec"]["activeDeadlineSeconds"] = spec.active_deadline_seconds
    if spec.pre_running_deadline_seconds:
        rayjob["spec"]["preRunningDeadlineSeconds"] = spec.pre_running_deadline_seconds
    token_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret, "labels": labels},
        "type": "Opaque",
        "stringData": {TOKEN_SECRET_KEY: token or run_token(name)},
    }
    if not spec.sidecar:
        return [token_secret, rayjob]
    endpoint: dict[str, Any] = {"port": EXPORTER_PORT_NAME, "path": "/metrics", "interval": "15s"}
    if spec.exporter_web_config_secret:
        endpoint.update(scheme="https", tlsConfig={
            "ca": {"secret": {"name": spec.exporter_web_config_secret, "key": CA_KEY}}, "serverName": TLS_SERVER_NAME})
    endpoint["relabelings"] = pod_monitor_relabelings()
    pod_monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": f"{name}-raypulse", "labels": {**labels, **({"release": release} if release else {})}},
        "spec": {
            "selector": {"matchLabels": {POD_LABEL_RUN_ID: name}},
            "podMetricsEndpoints": [endpoint],
        },
    }
    return [token_secret, rayjob, pod_monitor]


def to_yaml(manifests: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(manifests, sort_keys=False)


@dataclass(frozen=True)
class Applied:
    """What apply left in the cluster."""

    namespace: str
    rayjob: dict[str, Any]  # as the API server has it: metadata.uid, status
    manifests: list[dict[str, Any]]  # as rendered, with their ownerReferences
    existed: bool  # a RayJob of this run id was there already: it is followed, not repeated
    pod_monitor: str  # "ok", or why there is none


def owner_reference(rayjob: dict[str, Any]) -> dict[str, Any]:
    """A reference to the RayJob: what it owns goes when it goes (Kubernetes' garbage collector)."""
    return {"apiVersion": rayjob["apiVersion"], "kind": rayjob["kind"], "name": rayjob["metadata"]["name"],
            "uid": rayjob["metadata"]["uid"], "blockOwnerDeletion": True}


def apply(spec: JobSpec, access: KubeAccess | None = None, attempt_env: Mapping[str, str] | None = None,
          backoff_limit: int | None = None) -> Applied:
    """Create the manifests in the namespace given (else the context's), in the cluster of the kubeconfig
    context given (else the current one, else the pod's). Checks what it can (render, kubeconfig,
    server) before creating anything. The Secret first (the RayJob's pods read it), then the RayJob, then
    ownerReferences to the RayJob on the Secret and the PodMonitor (its uid exists only now). The same
    run id again finds its RayJob (409) and follows it: the existing Secret's token is kept."""
    spec = spec.with_run_id()
    manifests = render(spec, attempt_env=attempt_env, backoff_limit=backoff_limit)
    access = access or kube_api(spec.context)
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    namespace = spec.namespace or access.namespace
    core, custom = client.CoreV1Api(access.api_client), client.CustomObjectsApi(access.api_client)
    secret, rayjob = manifests[0], manifests[1]
    journal = Journal()
    action = "create secrets"
    existed = False
    try:
        try:
            core.create_namespaced_secret(namespace, secret)
        except ApiException as exc:
            if exc.status != 409:  # 409: this run's Secret is there already; its token stays
                raise
        action = "create rayjobs"
        try:
            created = custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", rayjob)
        except ApiException as exc:
            if exc.status != 409:
                raise
            action = "get rayjobs"
            created = custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs",
                                                          rayjob["metadata"]["name"])
            existed = True
        owner = owner_reference(created)
        for manifest in manifests:
            if manifest is not rayjob:
                manifest["metadata"]["ownerReferences"] = [owner]
        action = "patch secrets"
        core.patch_namespaced_secret(secret["metadata"]["name"], namespace,
                                     {"metadata": {"ownerReferences": [owner]}},
                                     _content_type="application/merge-patch+json")
    except (ApiException, HTTPError) as exc:
        journal.emit("manifests.applied", run_id=spec.run_id, namespace=namespace,
                     error=f"error: {getattr(exc, 'status', None) or type(exc).__name__} {action}")
        raise api_error(exc, access, action, namespace) from None
    monitored = "not rendered (sidecar off)"
    if len(manifests) > 2:
        try:
            custom.create_namespaced_custom_object("monitoring.coreos.com", "v1", namespace, "podmonitors",
                                                   manifests[2])
            monitored = "ok"
        except ApiException as exc:  # no Prometheus Operator: the job runs, metrics need another scrape config
            monitored = "ok" if exc.status == 409 else f"no PodMonitor ({exc.status} {exc.reason})"
        except HTTPError as exc:
            monitored = f"no PodMonitor ({type(exc).__name__})"
    journal.emit("manifests.applied", run_id=spec.run_id, namespace=namespace, pod_monitor=monitored,
                 existing=existed)
    return Applied(namespace=namespace, rayjob=created, manifests=manifests, existed=existed, pod_monitor=monitored)
