"""The backends by name, and the spec's backend bound to it (resolved once per command)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.backends.base import Backend
from launcher.backends.existing import ExistingBackend
from launcher.backends.kinds import name_of
from launcher.backends.kuberay.backend import KubeRayBackend
from launcher.backends.local.backend import LocalBackend

if TYPE_CHECKING:
    from launcher.spec import JobSpec

BACKENDS: dict[str, type[Backend]] = {backend.name: backend for backend in (LocalBackend, ExistingBackend,
                                                                             KubeRayBackend)}


def resolve(spec: JobSpec) -> Backend:
    """The spec's backend, bound to it."""
    return BACKENDS[name_of(spec)](spec)  # type: ignore[call-arg]
