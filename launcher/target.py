"""Where a submit goes when neither the spec nor the flags name a cluster: Ray's address variables,
read as `ray job submit` reads them (RAY_API_SERVER_ADDRESS, then RAY_ADDRESS). A dashboard URL
there means that existing cluster, and the launcher says so; an explicit address, cluster or backend
wins over both.

RAY_ADDRESS often holds what `ray.init` wants instead (a GCS address such as head:6379, `auto`, a
`ray://` client address; a Ray job's own driver gets one). The launcher talks to the Jobs API only,
so such a value is refused with the fix rather than looked up through Ray or ignored (ignoring it
would start a local cluster nobody asked for).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.contract import wire
from launcher.backends import kinds
from launcher.jobs import ADDRESS_VARIABLES
from launcher.spec import JobSpec, SpecError, build_spec


def environment_address(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, value) of the first address variable that is set, in Ray's order."""
    for variable in ADDRESS_VARIABLES:
        value = environ.get(variable, "").strip()
        if value:
            return variable, value
    return None


def _not_a_dashboard(variable: str, value: str) -> SpecError:
    kind = ("asks ray.init to find a cluster on this machine" if value == "auto" else
            "is a Ray Client address" if value.startswith("ray://") else
            "is a Ray (GCS) address" if "://" not in value else "is not an http(s) URL")
    return SpecError(f"{variable}: {value!r} {kind}, not a dashboard URL; the launcher submits through the Jobs "
                     f"API of the cluster's dashboard: give --address http://<head>:8265 (or set "
                     f"{wire.ENV_RAY_API_SERVER_ADDRESS} to it) to use that cluster, or pass --backend local or unset "
                     f"{variable} to start a local one")


@dataclass(frozen=True)
class Taken:
    """The address a submit took from the environment."""

    variable: str
    address: str

    @property
    def note(self) -> str:
        return (f"{self.variable} is {self.address}: submitting to that existing Ray cluster, as `ray job submit` "
                "does (--address or --backend local overrides it)")

    def source(self, source: str) -> str:
        """Where a spec error comes from: the spec, with this address in it."""
        return f"{source} (address from {self.variable})"


def from_environment(data: dict[str, Any], environ: Mapping[str, str] = os.environ) -> tuple[dict[str, Any],
                                                                                             Taken | None]:
    """A spec's fields with the address of the environment when they name no target (no address, no
    cluster, no backend but `existing`), and what was taken (None: nothing)."""
    if data.get("address") or data.get("cluster") or not kinds.takes(data.get("backend"), "address"):
        return data, None
    found = environment_address(environ)
    if found is None:
        return data, None
    variable, value = found
    if not value.startswith(("http://", "https://")):
        raise _not_a_dashboard(variable, value)
    return {**data, "address": value}, Taken(variable, value)


def resolve(spec: JobSpec | Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> tuple[JobSpec,
                                                                                                 Taken | None]:
    """The spec (validated) with the environment's address when it names no target (the Python API's
    way in; the command line does the same on its fields before it validates them)."""
    if isinstance(spec, JobSpec):
        if spec.address or spec.cluster or spec.backend is not None:
            return spec, None
        data = spec.model_dump(mode="json", exclude_unset=True)  # what was set stays set (no_wait reads it)
    else:
        data = dict(spec)
    data, taken = from_environment(data, environ)
    if taken is None:
        return (spec if isinstance(spec, JobSpec) else build_spec(data)), None
    return build_spec(data, taken.source("job spec")), taken
