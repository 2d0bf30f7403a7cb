"""Kubernetes access as kubectl reads it: every file of `KUBECONFIG` merged (or ~/.kube/config), the
current context (or `--context`) with its namespace, and the pod's service account as the fallback
when there is no kubeconfig at all (a launcher run from a pod, a CI job, a notebook).

Merging follows kubectl (client-go's clientcmd loading rules): files in list order, the first file
to define a cluster, user or context by name wins, and so does the first file that sets
current-context. kubernetes' own `KubeConfigMerger` reads the list but lets the *last* file's
current-context win, and `load_config()` reads one path only; so the merge is fixed up here.

Every failure to reach the cluster is one line naming the server and the fix (BadInput, exit 2)
within seconds: one probe with a short timeout, no urllib3 retries (its default of three retries
turned a dead server into a storm of tracebacks), and a connect timeout on every later request.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter import userinput
from launcher.errors import BadInput, InfraError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

KUBECONFIG_ENV = "KUBECONFIG"
DEFAULT_KUBECONFIG = "~/.kube/config"
# A pod's service account, as client-go's in-cluster config reads it; tests point this elsewhere.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_HOST_ENV, SERVICE_PORT_ENV = "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"
POD_NAMESPACE_ENV = "POD_NAMESPACE"  # client-go's in-cluster namespace reads it before the file
CONNECT_TIMEOUT = 5.0  # seconds; a probe's read gets as long, so a dead server is an error within 10 s
INSTALL_HINT = "`pip install 'raypulse[kube]'`"


@dataclass(frozen=True)
class KubeAccess:
    """A client for one cluster. Requests time out on connect (CONNECT_TIMEOUT) and are not
    retried; a long read (a watch) passes its own `_request_timeout`."""

    api_client: ApiClient
    namespace: str  # the context's namespace, the service account's in a pod, else "default"
    server: str  # the API server's URL, for messages
    context: str | None = None  # None: the in-cluster service account

    def where(self) -> str:
        return f"{self.server} (context {self.context})" if self.context else f"{self.server} (in-cluster)"


def _client_module() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise BadInput(f"backend: the Kubernetes client is not installed; {INSTALL_HINT}") from None
    return kubernetes


def kubeconfig_paths() -> tuple[list[Path], str]:
    """The kubeconfig files kubectl would read (those that exist), and how they were named."""
    configured = os.environ.get(KUBECONFIG_ENV)
    named = configured if configured else DEFAULT_KUBECONFIG
    paths = [Path(entry).expanduser() for entry in named.split(os.pathsep) if entry]
    return [path for path in paths if path.is_file()], named


def _first_current_context(paths: list[Path]) -> str | None:
    for path in paths:
        try:
            current = (userinput.load_yaml(userinput.read_text(path)) or {}).get("current-context")
        except (userinput.InputError, AttributeError):
            continue  # the merger below reports an unreadable file
        if current:
            return str(current)
    return None


def _from_kubeconfig(paths: list[Path], context: str | None) -> tuple[Any, str, str]:
    """(Configuration, namespace, context name) from the merged files."""
    kubernetes = _client_module()
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

    listed = os.pathsep.join(str(path) for path in paths)
    try:
        merged = KubeConfigMerger(listed)
        if merged.config is None:
            raise ConfigException("no configuration found")
        current = _first_current_context(paths)
        if current:
            merged.config.value["current-context"] = current
        names = [str(item["name"]) for item in merged.config.value.get("contexts", [])]
        chosen = context or current
        if not chosen:
            raise BadInput(f"kubeconfig: {listed} sets no current-context; pick one with --context "
                           f"({', '.join(names) or 'it has no contexts'}) or `kubectl config use-context NAME`")
        if chosen not in names:
            raise BadInput(f"{'context' if context else 'kubeconfig'}: no context {chosen!r} in {listed} "
                           f"(it has: {', '.join(names) or 'none'}); see `kubectl config get-contexts`")
        loader = KubeConfigLoader(config_dict=merged.config, active_context=chosen, config_base_path=None)
        configuration = type.__call__(kubernetes.client.Configuration)
        loader.load_and_set(configuration)
    except BadInput:
        raise
    except ConfigException as exc:
        raise BadInput(f"kubeconfig: {listed}: {exc}; fix it, or check it with `kubectl config view`") from None
    except (OSError, ValueError) as exc:  # unreadable file, invalid YAML
        raise BadInput(f"kubeconfig: {listed}: {exc}") from None
    namespace = (loader.current_context.get("context") or {}).get("namespace") or "default"
    return configuration, str(namespace), chosen


def _in_cluster(service_account_dir: Path) -> tuple[Any, str]:
    """(Configuration, namespace) from the pod's service account."""
    kubernetes = _client_module()
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    configuration = type.__call__(kubernetes.client.Configuration)
    try:
        InClusterConfigLoader(token_filename=str(service_account_dir / "token"),
                              cert_filename=str(service_account_dir / "ca.crt")).load_and_set(configuration)
    except ConfigException as exc:
        raise BadInput(f"kubernetes: in a pod ({SERVICE_HOST_ENV} is set) but its service account at "
                       f"{service_account_dir} is unusable: {exc}; mount the service account token "
                       "(automountServiceAccountToken), or set KUBECONFIG") from None
    namespace = os.environ.get(POD_NAMESPACE_ENV, "")
    if not namespace:
        try:
            namespace = (service_account_dir / "namespace").read_text().strip()
        except OSError:
            namespace = ""
    return configuration, namespace or "default"


def _no_config(named: str) -> BadInput:
    source = KUBECONFIG_ENV if os.environ.get(KUBECONFIG_ENV) else "default path"
    return BadInput(f"backend: no kubeconfig at {Path(named).expanduser() if os.pathsep not in named else named} "
                    f"({source}) and not in a pod ({SERVICE_HOST_ENV} unset); point KUBECONFIG at one, or write "
                    "the manifests with `launcher render` and apply them yourself")


def kube_api(context: str | None = None, service_account_dir: Path | None = None) -> KubeAccess:
    """A checked client for the cluster kubectl would talk to (with `--context`: that context's).
    BadInput, one line naming the server and the fix, when there is no configuration, the server
    cannot be reached, or it refuses the credentials."""
    paths, named = kubeconfig_paths()
    in_pod = bool(os.environ.get(SERVICE_HOST_ENV))
    if paths or context:
        if not paths:
            raise _no_config(named)
        configuration, namespace, chosen = _from_kubeconfig(paths, context)
    elif in_pod:
        configuration, namespace = _in_cluster(service_account_dir or SERVICE_ACCOUNT_DIR)
        chosen = None
    else:
        raise _no_config(named)
    configuration.retries = False  # one try: a dead server is one error, not a storm of retries
    kubernetes = _client_module()
    api_client = kubernetes.client.ApiClient(configuration)
    import urllib3

    # Every pool the client makes connects within CONNECT_TIMEOUT; reads keep no limit (watches).
    api_client.rest_client.pool_manager.connection_pool_kw["timeout"] = urllib3.Timeout(connect=CONNECT_TIMEOUT)
    access = KubeAccess(api_client=api_client, namespace=namespace, server=configuration.host, context=chosen)
    _probe(access)
    return access


def _probe(access: KubeAccess) -> None:
    """One GET of /version with a short timeout: reachable (any HTTP answer but 401) or BadInput. The
    answer is not parsed: the generated model would refuse a server that leaves fields out."""
    from kubernetes.client.rest import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    client = access.api_client
    try:
        method, url, headers, _, _ = client.param_serialize("GET", "/version/", auth_settings=["BearerToken"])
        response = client.call_api(method, url, header_params=headers,
                                   _request_timeout=(CONNECT_TIMEOUT, CONNECT_TIMEOUT))
    # Connect errors, timeouts, TLS (the client's ApiException with status 0), a failing login plugin.
    except (HTTPError, OSError, ConfigException, ApiException) as exc:
        raise unreachable(access, exc) from None
    if response.status == 401:
        raise unauthorised(access)


def _reason(exc: BaseException) -> str:
    """The innermost cause of a urllib3 error, short: `Connection refused`, `timed out`."""
    reason = getattr(exc, "reason", None) or exc
    text = str(reason)
    if "Errno" in text:
        text = text[text.index("Errno"):].split("] ", 1)[-1].rstrip("')\"")
    text = " ".join(text.split())  # one line, whatever the library put in it
    return text.split(": ", 1)[-1] if len(text) > 160 else text


def _context_flag(access: KubeAccess) -> str:
    return f" --context {access.context}" if access.context else ""


def unreachable(access: KubeAccess, exc: BaseException) -> BadInput:
    """A server that does not answer: one line naming it and what to check."""
    reason = _reason(exc)
    if "CERTIFICATE_VERIFY_FAILED" in reason:
        return BadInput(f"kubernetes: the API server {access.where()} has a certificate this kubeconfig does not "
                        f"trust ({reason}); check the cluster's certificate-authority(-data) in the kubeconfig")
    return BadInput(f"kubernetes: cannot reach the API server {access.where()}: {reason}; check that the "
                    f"cluster is up and `kubectl{_context_flag(access)} cluster-info` works, or pick another "
                    "context with --context")


def unauthorised(access: KubeAccess) -> BadInput:
    return BadInput(f"kubernetes: the API server {access.where()} refused the credentials (401 Unauthorized); "
                    f"log in again (`kubectl{_context_flag(access)} get ns` runs your login plugin) or pick "
                    "another context with --context")


def _status(exc: Any) -> dict[str, Any] | None:
    """The API server's Status object in an ApiException's body, if it sent one."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return None
    return body if isinstance(body, dict) and body.get("kind") == "Status" else None


def rayjob_crd_missing(exc: Any) -> bool:
    """Whether an ApiException from a rayjobs request means the RayJob CRD (KubeRay) is not installed:
    a 404 that is not a Status about a named object (a missing RayJob or namespace is one)."""
    if getattr(exc, "status", None) != 404:
        return False
    status = _status(exc)
    return not (status and (status.get("details") or {}).get("kind"))


def transient(exc: Any) -> bool:
    """Whether a failed call is worth asking again, as Kubernetes clients take it: the server's trouble
    (client-go's retry: 429 Too Many Requests, 5xx, a connection that failed) or a 409 Conflict (the object
    moved under the change: client-go's RetryOnConflict), not the request's own fault."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        return exc.status == 429 or exc.status >= 500 or (exc.status == 409 and _status_reason(exc) == "Conflict")
    return isinstance(exc, (HTTPError, OSError))


def _status_reason(exc: Any) -> str | None:
    """The Status's reason (Conflict, AlreadyExists, ...) of a failed call."""
    return (_status(exc) or {}).get("reason")


def retry_after(exc: Any, least: float, most: float) -> float:
    """How long to wait before asking again: the server's `Retry-After` seconds (429s carry it), within
    [least, most]; `least` when it gives none."""
    headers = getattr(exc, "headers", None) or {}
    try:
        seconds = float(headers.get("Retry-After", least))
    except (TypeError, ValueError):  # an HTTP date, or garbage: the client's own pace
        seconds = least
    return min(max(seconds, least), most) if math.isfinite(seconds) else least


def api_error(exc: Any, access: KubeAccess, action: str, namespace: str) -> BadInput | InfraError:
    """An ApiException (or connection error) of `action` ("create rayjobs") as one line with the fix: the
    request's fault (4xx: bad input) or the server's (429, 5xx: infrastructure)."""
    from kubernetes.client.rest import ApiException

    if not isinstance(exc, ApiException) or not exc.status:  # status 0: TLS failed
        return unreachable(access, exc)
    where = access.where()
    if exc.status == 429 or exc.status >= 500:
        message = (_status(exc) or {}).get("message") or exc.reason
        return InfraError(f"kubernetes: {where} failed {action} in namespace {namespace} ({exc.status} "
                          f"{exc.reason}): {message}")
    if exc.status == 401:
        return unauthorised(access)
    if exc.status == 403:
        return BadInput(f"kubernetes: {where} forbids {action} in namespace {namespace}; ask for a Role that "
                        f"allows it (`kubectl auth can-i {action} -n {namespace}`), or use another --namespace")
    if exc.status == 404 and action.endswith("rayjobs") and rayjob_crd_missing(exc):
        return BadInput(f"kubernetes: {where} has no RayJob resource (ray.io/v1): the KubeRay CRDs are not "
                        "installed; install the KubeRay operator (`helm install kuberay-operator "
                        "kuberay/kuberay-operator`) or use another --context")
    status = _status(exc) or {}
    if exc.status == 404 and (status.get("details") or {}).get("kind") == "namespaces":
        return BadInput(f"namespace: {namespace} does not exist on {where}; create it "
                        f"(`kubectl create namespace {namespace}`) or give another --namespace")
    message = status.get("message") or f"{exc.status} {exc.reason}"
    return BadInput(f"kubernetes: {where} refused {action} in namespace {namespace} ({exc.status} "
                    f"{exc.reason}): {message}")
