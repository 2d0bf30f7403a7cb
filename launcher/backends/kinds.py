"""What each backend takes and refuses in a job spec, as plain rules the spec's validation reads: its
name, the backend-specific fields it honours, whether the launcher follows its runs, and what else it
cannot honour. A leaf (nothing of the launcher is imported at run time), so that the spec can check a
backend's rules without depending on the backends, which build on the spec."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from launcher.health.policy import HealthPolicy


class SpecFields(Protocol):
    """The job spec as the rules read it (launcher/spec.py JobSpec)."""

    model_fields: ClassVar[dict[str, Any]]
    backend: str | None
    address: str | None
    cluster: str | None
    queue: str | None
    keep_cluster: bool
    health: HealthPolicy


class Kind:
    """A backend's rules; its implementation (launcher/backends/<name>/) inherits them."""

    name: ClassVar[str]
    takes: ClassVar[frozenset[str]] = frozenset()  # backend-specific spec fields it honours
    followed: ClassVar[bool] = True  # False: its platform supervises the run, the launcher hands it off

    @classmethod
    def refusal(cls, spec: SpecFields) -> str | None:
        """What in the spec this backend cannot honour, past the fields it does not take (None: nothing)."""
        return None


class LocalKind(Kind):
    name = "local"
    takes = frozenset({"keep_cluster", "simulate_gpus", "otlp_endpoint", "checkpoint_dir", "exporter_web_config",
                       "entrypoint_memory"})


class ExistingKind(Kind):
    name = "existing"
    takes = frozenset({"address", "cluster", "token_path", "otlp_endpoint", "checkpoint_dir", "entrypoint_memory",
                       "headers", "verify"})

    @classmethod
    def refusal(cls, spec: SpecFields) -> str | None:
        if not (spec.address or spec.cluster):
            return f"address: backend '{cls.name}' needs address (a dashboard URL) or cluster (a kept one)"
        if spec.cluster and (getattr(spec, "headers", None) or getattr(spec, "verify", None) is not None):
            return ("headers: --headers and --verify are for a dashboard given by --address; a kept local "
                    "cluster (--cluster) is reached without them")
        return None


class KubeRayKind(Kind):
    name = "kuberay"
    takes = frozenset({"keep_cluster", "queue", "release", "exporter_image", "exporter_web_config_secret", "context",
                       "pod_template"})
    followed = False  # KubeRay retries (backoffLimit) and enforces deadlines itself

    @classmethod
    def refusal(cls, spec: SpecFields) -> str | None:
        if spec.queue and spec.keep_cluster:
            return "queue: Kueue admits a RayJob only when its cluster shuts down after the job"
        return None


KINDS: dict[str, type[Kind]] = {kind.name: kind for kind in (LocalKind, ExistingKind, KubeRayKind)}
DEFAULT = LocalKind  # where a spec that names no cluster runs
TARGETED = ExistingKind  # where a spec that names an address or a kept cluster runs

# What a field that only other backends take says about how to get the same here.
_INSTEAD = {
    "exporter_web_config": " (KubeRay: exporter_web_config_secret names a Secret holding it; existing clusters: "
                           "`launcher exporters deploy --web-config FILE`)",
    "exporter_web_config_secret": " (local clusters: exporter_web_config is the file itself)",
    "entrypoint_memory": " (a RayJob has no field for the entrypoint's memory; leave --entrypoint-memory out, or "
                         "reserve a custom resource with --entrypoint-resources)",
    "headers": " (the launcher talks to a cluster it started without them)",
    "verify": " (the launcher talks to a cluster it started over plain HTTP)",
}


def name_of(spec: SpecFields) -> str:
    """The spec's backend: the one it names, else existing when it names an address or a kept
    cluster, else local."""
    if spec.backend is not None:
        return spec.backend
    return (TARGETED if spec.address or spec.cluster else DEFAULT).name


def takes(name: str | None, field: str) -> bool:
    """Whether the backend called `name` (None: the one a spec naming no backend but a target gets)
    takes `field`; an unknown name takes nothing (the spec's validation names it)."""
    kind = KINDS.get(name) if name is not None else TARGETED
    return kind is not None and field in kind.takes


def refusal(spec: SpecFields) -> str | None:
    """What the spec's backend cannot honour: a field only other backends take, or its own refusal."""
    kind = KINDS[name_of(spec)]
    for field in type(spec).model_fields:
        if getattr(spec, field) in (None, False) or field in kind.takes:
            continue
        others = [other.name for other in KINDS.values() if field in other.takes]
        if others:
            return (f"{field}: applies to backend {' or '.join(others)} only; this job's backend is {kind.name}"
                    + _INSTEAD.get(field, ""))
    return kind.refusal(spec)
