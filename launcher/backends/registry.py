"""The backends by name, and the spec's backend bound to it (resolved once per command). `register` adds
one (a plugin's, a test's) beside the built-in ones; the spec's `backend` then takes its name."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from launcher.backends import kinds
from launcher.backends.base import Backend
from launcher.backends.existing import ExistingBackend, client_for
from launcher.backends.kinds import name_of
from launcher.backends.kuberay.backend import KubeRayBackend
from launcher.backends.local.backend import LocalBackend
from launcher.jobs import JobsClient

if TYPE_CHECKING:
    from launcher.spec import JobSpec

BACKENDS: dict[str, type[Backend]] = {backend.name: backend for backend in (LocalBackend, ExistingBackend,
                                                                             KubeRayBackend)}
TARGETED = kinds.TARGETED.name  # the backend of a cluster named by --address or --cluster
assert ExistingBackend.name == TARGETED


def register(backend: type[Backend]) -> None:
    """Add a backend: its rules (it is a kinds.Kind) and its implementation, under its name."""
    kinds.KINDS[backend.name] = backend  # type: ignore[assignment]
    BACKENDS[backend.name] = backend


def target_client(address: str | None, cluster: str | None, token_path: Path | None = None) -> JobsClient:
    """A Jobs API client for a cluster a command names (--address URL, --cluster NAME)."""
    return client_for(address, cluster, token_path)


def resolve(spec: JobSpec) -> Backend:
    """The spec's backend, bound to it."""
    return BACKENDS[name_of(spec)](spec)  # type: ignore[call-arg]
