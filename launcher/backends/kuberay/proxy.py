"""Reading a KubeRay pod's raypulse sidecar through the Kubernetes API server's pod proxy
(`GET /api/v1/namespaces/{ns}/pods/{[https:]pod:port}/proxy/{path}`), for a launcher that cannot reach
the pods' network. Authenticated as the kubeconfig (or the in-cluster service account) says, through the
kubernetes client's own ApiClient and urllib3 pool; RBAC: `get pods/proxy`.

The same bounds as every other exporter read (launcher/health/exporters.py): one deadline for the whole
request (the reaper shuts the socket down at it), the caps on the bytes on the wire and on what they
inflate to, and every failure one ReadError. The body is read raw (`decode_content=False`): urllib3
would otherwise inflate a gzip bomb before any cap saw it. Until the answer's headers come, each wait
is bounded by urllib3's timeout set to the time left (the reaper has no socket to cut before then);
from the headers on, the reaper cuts the connection at the deadline.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any
from urllib.parse import quote

from launcher.health import exporters
from launcher.health.exporters import Answer, ReadError, Target

ERROR_BODY_BYTES = 4096  # of an answer that is not a 200: enough for a Kubernetes Status or a pod's reason


class PodProxyReader:
    """Reads one pod's exporter port through the API server (a Target's Reader)."""

    def __init__(self, api_client: Any, namespace: str, pod: str, port: int, https: bool = False,
                 headers: dict[str, str] | None = None) -> None:
        self.api_client = api_client
        # Sent on to the pod (the API server keeps the Authorization header for itself).
        self.headers = dict(headers or {})
        # The proxy's name: `https:` makes the API server speak TLS to the pod (it does not verify the pod's cert).
        self.resource = (f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/"
                         f"{'https:' if https else ''}{quote(pod, safe='')}:{port}/proxy")
        self.url = api_client.configuration.host.rstrip("/") + self.resource

    def __call__(self, path: str, timeout: float, etag: str | None = None) -> Answer:
        deadline = time.monotonic() + timeout
        try:
            return self._get(path, deadline, timeout, etag)
        except Exception as exc:  # noqa: BLE001 - foreign input: whatever a read raises is its ReadError
            raise exporters.why(exc) from None

    def _get(self, path: str, deadline: float, timeout: float, etag: str | None) -> Answer:
        import urllib3

        headers = {**self.headers, "Accept-Encoding": "gzip"}
        if etag:
            headers["If-None-Match"] = etag
        # The client's own serialization: its auth (bearer token, refreshed in-cluster; client certificates
        # live in its pool) and host. The path and query go as the watcher wrote them.
        _, url, headers, _, _ = self.api_client.param_serialize(
            "GET", self.resource + path, header_params=headers, auth_settings=["BearerToken"])
        left = max(0.001, deadline - time.monotonic())
        response = self.api_client.rest_client.pool_manager.request(
            "GET", url, headers=headers, preload_content=False, decode_content=False, redirect=False, retries=False,
            timeout=urllib3.Timeout(connect=left, read=left))
        expired = threading.Event()
        connection = getattr(response, "connection", None)
        entry = exporters.cut_at(deadline, connection, expired) if connection is not None else None
        done = False
        try:
            tag = exporters.etag_of(response.headers.get("ETag"))
            if response.status == 304 and etag:
                done = True
                return Answer(None, tag or etag)
            if response.status != 200:
                body = response.read(ERROR_BODY_BYTES)  # a few words of why; bounded like the rest
                raise ProxiedStatus(f"HTTP {response.status} through the API server's pod proxy "
                                    f"({_proxy_reason(response, body)})", response.status, body)
            body = exporters.read_body(lambda size: response.read1(size, decode_content=False),
                             lambda: response.length_remaining, response.headers.get("Content-Length"), expired,
                             deadline, timeout, exporters.MAX_WIRE_BYTES)
            done = True
            return exporters.answer_of(body, response.headers.get("Content-Encoding"), tag)
        except Exception:
            if expired.is_set():
                raise ReadError(f"no whole answer within {timeout:g}s") from None
            raise
        finally:
            if entry is not None:
                exporters.forget_cut(entry)
            if not done:
                response.close()  # a connection cut or left mid-body is not one to reuse
            response.release_conn()


class ProxiedStatus(ReadError):
    """An answer other than a 200 (or a 304 asked for): the pod's own, or the API server's (`by_api_server`:
    a Kubernetes Status, such as RBAC's 403 or a gone pod's 404)."""

    def __init__(self, message: str, status: int, body: bytes) -> None:
        super().__init__(message)
        self.status, self.body = status, body

    @property
    def by_api_server(self) -> bool:
        return _is_status(self.body)


def _is_status(body: bytes) -> bool:
    try:
        return json.loads(body).get("kind") == "Status"
    except (ValueError, AttributeError):
        return False


def _proxy_reason(response: Any, body: bytes = b"") -> str:
    """The API server's or the pod's reason in a few printable words (the API server's 403 names the
    missing RBAC)."""
    if response.status == 403 and _is_status(body):
        return "forbidden: the launcher's account needs `get pods/proxy`"
    reason = "".join(ch if " " <= ch <= "~" else "?" for ch in str(response.reason or ""))[:60]
    return reason or "no reason given"


def pod_target(api_client: Any, namespace: str, pod: str, node: str, port: int, https: bool) -> Target:
    """A Ray pod's sidecar as a watcher target, named by the pod's Kubernetes node (spec.nodeName)."""
    reader = PodProxyReader(api_client, namespace, pod, port, https)
    return Target(node=node, url=reader.url, reader=reader, pod=pod)
