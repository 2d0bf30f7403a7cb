"""The launcher's side of `launcher exporters`: it never connects to Ray's GCS. Placing and
removing run as a short Ray job (the `raypulse_agent` driver, shipped with the exporter package
through the job's runtime env `py_modules`), so only the dashboard URL and the Ray token are
needed, as for `launcher submit --address`; status reads Ray's State API over HTTP and asks each
exporter itself.
"""

from __future__ import annotations

import http.client
import importlib.metadata
import json
import logging
import re
import secrets
import shlex
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import exporter
from exporter import wire
from launcher.deploy import raypulse_agent
from launcher.errors import InfraError
from launcher.jobs import TERMINAL, JobsClient
from launcher.raydash import Filter

AGENT_DIR = Path(raypulse_agent.__file__).parent
EXPORTER_DIR = Path(exporter.__file__).parent
_VERSION_RE = re.compile(r'^raypulse_exporter_build_info\{[^}]*\bversion="([^"]*)"', re.MULTILINE)


@dataclass
class AgentRun:
    submission_id: str
    status: str
    result: dict[str, Any] | None
    logs: str


# What `exporter serve` imports that `ray[default]` does not install (Ray brings aiohttp, pydantic,
# prometheus-client, pyyaml, click, opentelemetry-sdk). tests/test_launcher_deploy_requirements.py keeps
# this list complete against what the exporter really imports.
NOT_WITH_RAY = ("pydantic-settings", "bcrypt", "psutil", "nvidia-ml-py")


def exporter_requirements() -> tuple[str, ...]:
    """NOT_WITH_RAY pinned to the versions installed beside this launcher (the ones it was tested with)."""
    return tuple(f"{dist}=={importlib.metadata.version(dist)}" for dist in NOT_WITH_RAY)


def runtime_env(pip: tuple[str, ...] = ()) -> dict[str, Any]:
    """What every raypulse actor runs with: the exporter and the agent as py_modules (+ pip)."""
    env: dict[str, Any] = {"py_modules": [str(EXPORTER_DIR), str(AGENT_DIR)], "excludes": ["__pycache__"]}
    if pip:
        env["pip"] = list(pip)
    return env


def run_agent(client: JobsClient, args: list[str], pip: tuple[str, ...] = (), timeout: float = 600) -> AgentRun:
    """Run `python -m raypulse_agent ARGS` as a Ray job; its result line, status and log."""
    # Ray's SDK logs each package upload at INFO on stderr; the result lines are what matter.
    logging.getLogger("ray.dashboard.modules.dashboard_sdk").setLevel(logging.WARNING)
    submission_id = f"raypulse-exporters-{args[0]}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    client.submit(submission_id, "python -m raypulse_agent " + shlex.join(args), runtime_env(pip),
                  {wire.META_TOOL: "exporters", wire.META_TOOL_ACTION: args[0]})
    deadline = time.monotonic() + timeout
    while True:
        details = client.details(submission_id)
        status = str(getattr(details, "status", "PENDING"))
        status = status.split(".")[-1]  # JobStatus.SUCCEEDED -> SUCCEEDED
        if status in TERMINAL:
            break
        if time.monotonic() > deadline:
            client.stop(submission_id)
            raise InfraError(f"the Ray job {submission_id} ({args[0]}) did not finish within {timeout:.0f}s; "
                             f"see `ray job logs {submission_id}`")
        time.sleep(0.5)
    logs = client.logs(submission_id)
    result = None
    for line in logs.splitlines():
        if line.startswith(wire.DEPLOY_RESULT_MARKER):
            result = json.loads(line.removeprefix(wire.DEPLOY_RESULT_MARKER))
    if result is None and details is not None and getattr(details, "message", None):
        logs += f"\n{details.message}"
    return AgentRun(submission_id, status, result, logs)


def state_list(client: JobsClient, resource: str, filters: Sequence[Filter] = ()) -> list[dict[str, Any]]:
    try:
        return client.dashboard.state_list(resource, filters)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # DashboardHttpError is an OSError
        raise InfraError(f"the Ray State API ({resource}) failed: {exc}") from None


def deployed_actors(client: JobsClient) -> list[dict[str, Any]]:
    return state_list(client, "actors", [("ray_namespace", "=", wire.DEPLOY_NAMESPACE), ("state", "=", "ALIVE")])


def probe(url: str, timeout: float = 5) -> tuple[bool, str | None]:
    """(answers /metrics, the exporter's version from raypulse_exporter_build_info)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=timeout) as reply:
            text = reply.read().decode(errors="replace")
    except (OSError, http.client.HTTPException):  # URLError is an OSError
        return False, None
    match = _VERSION_RE.search(text)
    return True, match.group(1) if match else None


def exporters_status(client: JobsClient) -> dict[str, Any]:
    """Every alive node with its deployed exporter (or none), and whether it answers."""
    nodes = [n for n in state_list(client, "nodes") if n.get("state") == "ALIVE"]
    actors = deployed_actors(client)
    ports = {parsed[0]: parsed[1] for a in actors if (parsed := wire.parse_node_actor_name(a.get("name") or ""))}
    rows = []
    for node in sorted(nodes, key=lambda n: (not n.get("is_head_node"), n["node_id"])):
        ip, port = node.get("node_ip", ""), ports.get(node["node_id"])
        url = f"http://{f'[{ip}]' if ':' in ip else ip}:{port}" if port else None
        up, version = probe(url) if url else (False, None)
        rows.append({"node_id": node["node_id"], "address": ip, "role": "head" if node.get("is_head_node") else
                     "worker", "exporter_url": url, "up": up, "version": version})
    return {"supervisor": any(a.get("name") == wire.DEPLOY_SUPERVISOR for a in actors), "nodes": rows,
            "complete": bool(rows) and all(row["up"] for row in rows)}
