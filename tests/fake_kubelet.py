"""A fake kubelet pod-resources API: a real gRPC server on a unix socket serving `v1.PodResourcesLister`.

What it copies, and from where:
- the service and its two unary calls `List` and `GetAllocatableResources` with the v1 messages of
  k8s.io/kubelet/pkg/apis/podresources/v1/api.proto (Kubernetes v1.30), encoded by the same message
  classes the exporter uses (exporter/collectors/gpu/podresources.py builds them from that proto);
- the kubelet's answers (pkg/kubelet/apis/podresources/server_v1.go): every pod on the node with each
  container's devices per resource name; the NVIDIA device plugin's device ids for `nvidia.com/gpu`
  are GPU UUIDs; allocatable lists every device of the node;
- `slow`: a kubelet that does not answer in time (the call sleeps past the client's deadline);
  `refuse`: one that answers every call with UNAVAILABLE, as the kubelet's rate limiter does with
  RESOURCE_EXHAUSTED and a restarting kubelet's socket with UNAVAILABLE.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from exporter.collectors.gpu.podresources import GPU_RESOURCE, RPCS, SERVICE, messages


class FakeKubelet:
    def __init__(self, socket: Path, gpus: list[str]) -> None:
        self.socket = socket
        self.gpus = gpus
        self.pods: dict[tuple[str, str], dict[str, list[str]]] = {}  # (namespace, pod) -> container -> uuids
        self.slow = threading.Event()
        self.refuse = False
        self.calls = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {rpc: grpc.unary_unary_rpc_method_handler(
            getattr(self, rpc), request_deserializer=messages()[request].FromString,
            response_serializer=messages()[response].SerializeToString) for rpc, (request, response) in RPCS.items()}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self._server.add_insecure_port(f"unix://{socket}")

    def __enter__(self) -> FakeKubelet:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.slow.clear()
        self._server.stop(grace=None)

    def _answer(self, context: grpc.ServicerContext) -> None:
        self.calls += 1
        if self.refuse:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
        if self.slow.is_set():
            context_done = threading.Event()
            context.add_callback(context_done.set)
            context_done.wait(timeout=30)  # past any client deadline; returns when the client gives up

    def List(self, request, context):
        self._answer(context)
        response = messages()["ListPodResourcesResponse"]()
        for (namespace, name), containers in self.pods.items():
            pod = response.pod_resources.add(name=name, namespace=namespace)
            for container, uuids in containers.items():
                pod.containers.add(name=container).devices.add(resource_name=GPU_RESOURCE, device_ids=uuids)
        return response

    def GetAllocatableResources(self, request, context):
        self._answer(context)
        response = messages()["AllocatableResourcesResponse"]()
        response.devices.add(resource_name=GPU_RESOURCE, device_ids=self.gpus)
        return response
