"""Which pod holds which GPU, from the kubelet's pod-resources API, as dcgm-exporter reads it.

The kubelet serves gRPC `v1.PodResourcesLister` on a unix socket (KEP-606; the socket is mounted by
exporter/kustomize and launcher/deploy/manifests.py). `List` names, per pod and container, the device
ids each resource gave it; the NVIDIA device plugin's ids for `nvidia.com/gpu` are GPU UUIDs, the
same `uuid` NVML reports. `GetAllocatableResources` names every device the kubelet can hand out.

The messages are built here with protobuf's descriptor API from the public proto
k8s.io/kubelet/pkg/apis/podresources/v1/api.proto (Kubernetes v1.30): the messages and fields that
carry devices, with their field numbers and types, in a private pool; protobuf skips the fields left
out (cpu_ids, memory, topology, dynamic_resources), so this reads any kubelet that serves v1. No
generated stubs and no grpcio-tools: the two unary calls go through grpc's generic channel API.

Reads are bounded (a deadline and a largest message), made by the gpu collector in its worker
thread (never on the event loop), and cached for `refresh_seconds`. A socket that is missing, slow
or refuses leaves the GPUs without owners (their series lose the pod labels, never the samples);
the first failure after a success is logged once, and raypulse_gpu_pod_resources_up says it.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from exporter.contract import wire
from exporter.framework.shared import UNKNOWN_OWNERS, GpuOwners

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
SERVICE = "v1.PodResourcesLister"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # dcgm-exporter's bound for a List answer

# message -> (field, number, type, repeated, message type) as api.proto declares them
_MESSAGES: dict[str, tuple[tuple[str, int, str, bool, str], ...]] = {
    "ListPodResourcesRequest": (),
    "ListPodResourcesResponse": (("pod_resources", 1, "message", True, "PodResources"),),
    "PodResources": (("name", 1, "string", False, ""), ("namespace", 2, "string", False, ""),
                     ("containers", 3, "message", True, "ContainerResources")),
    "ContainerResources": (("name", 1, "string", False, ""), ("devices", 2, "message", True, "ContainerDevices")),
    "ContainerDevices": (("resource_name", 1, "string", False, ""), ("device_ids", 2, "string", True, "")),
    "AllocatableResourcesRequest": (),
    "AllocatableResourcesResponse": (("devices", 1, "message", True, "ContainerDevices"),),
}


@functools.cache
def messages() -> dict[str, Any]:
    """The message classes, built at the first read (protobuf and grpc are imported only on a node whose
    kubelet socket is there: most exporters never pay for them)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    kinds = descriptor_pb2.FieldDescriptorProto
    types = {"message": kinds.TYPE_MESSAGE, "string": kinds.TYPE_STRING}
    proto = descriptor_pb2.FileDescriptorProto(name="raypulse/kubelet/podresources/v1/api.proto", package="v1",
                                               syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field, number, kind, repeated, type_name in fields:
            added = message.field.add(name=field, number=number, type=types[kind],
                                      label=kinds.LABEL_REPEATED if repeated else kinds.LABEL_OPTIONAL)
            if type_name:
                added.type_name = f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}")) for name in _MESSAGES}


# rpc -> (request, response), as api.proto's service declares them
RPCS = {"List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse")}




def owners_from(response: Any, own_pod: tuple[str, str] | None) -> GpuOwners:
    """Owners of the GPUs a List answer names; a sidecar (its own pod holds GPUs) reports only those."""
    owners: dict[str, Mapping[str, str]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name == GPU_RESOURCE:
                    for uuid in devices.device_ids:
                        owners[uuid] = MappingProxyType({"pod": pod.name, "namespace": pod.namespace,
                                                         "container": container.name})
    mine = frozenset(uuid for uuid, o in owners.items() if own_pod == (o["namespace"], o["pod"]))
    return GpuOwners(MappingProxyType(owners), mine or None)


def own_pod(environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """This exporter's pod from the downward API variables the manifests set (None outside a pod)."""
    name, namespace = environ.get(wire.POD_NAME_ENV, ""), environ.get(wire.POD_NAMESPACE_ENV, "")
    return (namespace, name) if name and namespace else None


class PodResourcesReader:
    """The cached GPU owners; `read()` asks the kubelet again once `refresh_seconds` have passed."""

    def __init__(self, socket: Path | None, *, refresh_seconds: float, timeout_seconds: float,
                 own: tuple[str, str] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.socket = socket
        self.refresh_seconds, self.timeout_seconds = refresh_seconds, timeout_seconds
        self.own = own
        self._clock = clock
        self._channel: Any = None  # a grpc.Channel, once the socket was read
        self._due = -float("inf")
        self._owners = UNKNOWN_OWNERS
        self.up: bool | None = None  # None: not in use (no socket at the standard path, or turned off)
        self.allocatable: frozenset[str] = frozenset()  # every nvidia.com/gpu id the kubelet can hand out
        self._ids_said = False

    def read(self) -> GpuOwners:
        now = self._clock()
        if self.socket is None or now < self._due:
            return self._owners
        self._due = now + self.refresh_seconds
        if self.up is None and self.socket == Path(wire.POD_RESOURCES_SOCKET) and not self.socket.exists():
            return self._owners  # not on a Kubernetes node: off, nothing to say
        import grpc  # only where the kubelet's socket is

        try:
            response = self._call("List")
            self.allocatable = frozenset(uuid for devices in self._call("GetAllocatableResources").devices
                                         if devices.resource_name == GPU_RESOURCE for uuid in devices.device_ids)
        except grpc.RpcError as exc:
            self._fail(f"{exc.code().name}: {exc.details()}")  # type: ignore[attr-defined]
        except (OSError, ValueError) as exc:
            self._fail(str(exc))
        else:
            if self.up is not True:
                log.info("GPU owners read from the kubelet's pod-resources API at %s", self.socket)
            self.up = True
            self._owners = owners_from(response, self.own)
        return self._owners

    def check_ids(self, uuids: Iterable[str]) -> None:
        """Say once when the kubelet's GPU ids are not NVML's UUIDs (the device plugin's
        `--device-id-strategy=index`): then no GPU can be matched to its pod."""
        uuids = set(uuids)
        if self.allocatable and uuids and self.allocatable.isdisjoint(uuids) and not self._ids_said:
            self._ids_said = True
            log.warning("the kubelet's %s ids (%s) are not GPU UUIDs: GPU series go without pod labels; run the "
                        "NVIDIA device plugin with --device-id-strategy=uuid", GPU_RESOURCE,
                        ", ".join(sorted(self.allocatable)[:4]))

    def _call(self, rpc: str) -> Any:
        import grpc

        request, response = (messages()[name] for name in RPCS[rpc])
        if not self.socket.exists():  # type: ignore[union-attr]
            raise OSError(f"no socket at {self.socket}")
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket}", options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        call = self._channel.unary_unary(f"/{SERVICE}/{rpc}", request_serializer=request.SerializeToString,
                                         response_deserializer=response.FromString)
        return call(request(), timeout=self.timeout_seconds)

    def _fail(self, why: str) -> None:
        if self.up is not False:
            log.warning("kubelet pod-resources API at %s unusable (%s): GPU series go without pod labels "
                        "until it answers", self.socket, why)
        self.up = False
        self._owners = UNKNOWN_OWNERS

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
