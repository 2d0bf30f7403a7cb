"""The launcher's side of `launcher exporters`: it never connects to Ray's GCS. Placing and
removing run as a short Ray job (the `raypulse_agent` driver, shipped with the exporter package
through the job's runtime env `py_modules`), so only the dashboard URL and the Ray token are
needed, as for `launcher submit --address`; status reads Ray's State API over HTTP and asks each
exporter itself.

`deploy --web-config FILE`: the file is checked here, then it and the certificates it names travel
to the nodes as one bundle, a py_module of the deploy job (uploaded to the cluster like the code,
never on a command line or in the job's metadata); the supervisor hands it to each node's actor,
which writes it into a private directory. When the file has basic auth, the bundle carries one
more user, the launcher's, whose password stays on this machine (state.deployment_dir) for
`exporters status` and the health watcher.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib.metadata
import json
import logging
import re
import secrets
import shlex
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import exporter
from exporter import userinput
from exporter.config import ConfigError, read_yaml_file
from exporter.contract import wire
from launcher.deploy import raypulse_agent
from launcher.deploy.raypulse_agent import WEB_CONFIG_FILE, WEB_DIR
from launcher.errors import InfraError
from launcher.exporter_plan import add_launcher_user
from launcher.jobs import TERMINAL, JobsClient
from launcher.raydash import Filter
from launcher.state import ExporterAccess, deployment_dir, save_deployment_access, write_private

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
NOT_WITH_RAY = ("bcrypt", "nvidia-ml-py")


def exporter_requirements() -> tuple[str, ...]:
    """NOT_WITH_RAY pinned to the versions installed beside this launcher (the ones it was tested with)."""
    return tuple(f"{dist}=={importlib.metadata.version(dist)}" for dist in NOT_WITH_RAY)


def runtime_env(pip: tuple[str, ...] = ()) -> dict[str, Any]:
    """What every raypulse actor runs with: the exporter and the agent as py_modules (+ pip)."""
    env: dict[str, Any] = {"py_modules": [str(EXPORTER_DIR), str(AGENT_DIR)], "excludes": ["__pycache__"]}
    if pip:
        env["pip"] = list(pip)
    return env


TLS_NAMES = {"cert_file": "tls.crt", "key_file": "tls.key", "client_ca_file": "client-ca.crt"}


@dataclass
class WebBundle:
    """A web config as it travels to the nodes: web-config.yml naming its certificates by file name."""

    files: dict[str, str]
    sha256: str  # of the user's file and certificates: a second deploy with the same ones changes nothing
    tls: bool
    basic_auth: bool
    username: str | None = None  # the launcher's own user, with basic auth
    password: str | None = field(default=None, repr=False)


def web_config_bundle(path: Path) -> WebBundle:
    """Check the user's web config and bundle it with its certificates; with basic auth, add the
    launcher's own user. Raises ConfigError (naming the file) for one that cannot work."""
    import yaml  # as exporter/userinput.py: PyYAML when YAML is written, not at every command's start

    from exporter.serving.webconfig import load_web_config  # aiohttp's server side: only when a web config is given

    config = load_web_config(path)
    data = read_yaml_file(path, "web config file")
    files: dict[str, str] = {}
    tls = config.tls_server_config
    if tls is not None:
        section = dict(data["tls_server_config"])
        for name, bundled in TLS_NAMES.items():
            source = getattr(tls, name)
            if source is not None:
                try:
                    files[bundled] = userinput.read_text(Path(source), encoding="ascii")
                except userinput.InputError as exc:
                    raise ConfigError(f"web config file {path}: tls_server_config.{name} ({source}): cannot read "
                                      f"it as PEM text: {exc.problem}") from None
                section[name] = bundled  # relative: resolved against web-config.yml on the node
        data["tls_server_config"] = section
    files[WEB_CONFIG_FILE] = yaml.safe_dump(data, sort_keys=False)
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    bundle = WebBundle(files, digest, tls is not None, bool(config.basic_auth_users))
    if bundle.basic_auth:
        bundle.username, bundle.password = add_launcher_user(data)
        files[WEB_CONFIG_FILE] = yaml.safe_dump(data, sort_keys=False)
    return bundle


def save_access(address: str, bundle: WebBundle) -> ExporterAccess:
    """Keep, 0600 under $RAYPULSE_HOME, what this launcher needs to reach the deployed exporters."""
    directory = deployment_dir(address)
    access = ExporterAccess(tls_trust_file=str(directory / "exporters.crt") if bundle.tls else None,
                            username=bundle.username,
                            password_file=str(directory / "password") if bundle.password else None)
    if bundle.tls:
        write_private(directory / "exporters.crt", bundle.files[TLS_NAMES["cert_file"]])
    if bundle.password:
        write_private(directory / "password", bundle.password + "\n")
    save_deployment_access(address, access)
    return access


def run_agent(client: JobsClient, args: list[str], pip: tuple[str, ...] = (), timeout: float = 600,
              files: dict[str, str] | None = None) -> AgentRun:
    """Run `python -m raypulse_agent ARGS` as a Ray job; its result line, status and log. `files` go
    with the job as one more py_module, raypulse_agent.WEB_DIR (uploaded like the code, 0600 here)."""
    # Ray's SDK logs each package upload at INFO on stderr; the result lines are what matter.
    logging.getLogger("ray.dashboard.modules.dashboard_sdk").setLevel(logging.WARNING)
    submission_id = f"raypulse-exporters-{args[0]}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    env = runtime_env(pip)
    upload = Path(tempfile.mkdtemp(prefix="raypulse-deploy-")) if files else None
    try:
        if upload is not None:
            for name, content in {**(files or {}), "__init__.py": ""}.items():
                write_private(upload / WEB_DIR / name, content)
            env["py_modules"].append(str(upload / WEB_DIR))
        client.submit(submission_id, "python -m raypulse_agent " + shlex.join(args), env,
                      {wire.META_TOOL: "exporters", wire.META_TOOL_ACTION: args[0]})
    finally:
        if upload is not None:
            shutil.rmtree(upload, ignore_errors=True)
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


def deploy_runs(client: JobsClient) -> list[str]:
    """Ray job ids of the `launcher exporters deploy` runs (their metadata says so)."""
    try:
        jobs = client.dashboard.get_json("/api/jobs/")
    except (OSError, ValueError) as exc:  # DashboardHttpError is an OSError
        raise InfraError(f"the Ray Jobs API failed: {exc}") from None
    return [str(job["job_id"]) for job in jobs if isinstance(job, dict) and job.get("job_id")
            and (job.get("metadata") or {}).get(wire.META_TOOL) == "exporters"
            and (job.get("metadata") or {}).get(wire.META_TOOL_ACTION) == "deploy"]


def deployed_actors(client: JobsClient) -> list[dict[str, Any]]:
    """The alive actors of wire.DEPLOY_NAMESPACE, found by the job of the deploy run that made them: the GCS
    filters by job and state itself, while a namespace filter is applied only to the 10,000 actors it
    returns (exporter/collectors/ray/sd.py), so they are found whatever else runs."""
    found = []
    for job_id in deploy_runs(client):
        rows = state_list(client, "actors", [("job_id", "=", job_id), ("state", "=", "ALIVE")])
        found += [row for row in rows if row.get("ray_namespace") == wire.DEPLOY_NAMESPACE]
    return found


def _get(url: str, access: ExporterAccess | None, timeout: float) -> tuple[int, str]:
    """(HTTP status, body) of a GET; with access, its trust and credentials, else over HTTPS no
    certificate check (nothing is sent that needs one)."""
    try:
        if access is not None:
            reply = access.urlopen(url, timeout)
        else:
            context = None
            if url.startswith("https:"):
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            reply = urllib.request.urlopen(url, timeout=timeout, context=context)
        with reply:
            return reply.status, reply.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def probe(address: str, access: ExporterAccess | None = None, timeout: float = 5) -> tuple[bool, str | None, str]:
    """(answers, the exporter's version from raypulse_exporter_build_info, its URL) of the exporter at
    host:port. Answering is /healthz saying 200, or 401 under basic auth; the version needs /metrics,
    which basic auth keeps from a launcher without the deploy's credentials. Without access (deployed
    from elsewhere), HTTP is tried, then HTTPS."""
    schemes = [access.scheme] if access is not None else ["http", "https"]
    for scheme in schemes:
        url = f"{scheme}://{address}"
        try:
            status, _ = _get(url + wire.HEALTH_PATH, access, timeout)
            if status not in (200, 401):
                continue
            status, text = _get(url + wire.METRICS_PATH, access, timeout)
        except (OSError, http.client.HTTPException, ssl.SSLError):  # URLError is an OSError
            continue
        match = _VERSION_RE.search(text) if status == 200 else None
        return True, match.group(1) if match else None, url
    return False, None, f"{schemes[0]}://{address}"


def exporters_status(client: JobsClient, access: ExporterAccess | None = None) -> dict[str, Any]:
    """Every alive node with its deployed exporter (or none), and whether it answers; `access`: how to
    reach exporters deployed with a web config (state.load_deployment_access)."""
    nodes = [n for n in state_list(client, "nodes") if n.get("state") == "ALIVE"]
    actors = deployed_actors(client)
    ports = {parsed[0]: parsed[1] for a in actors if (parsed := wire.parse_node_actor_name(a.get("name") or ""))}
    rows = []
    for node in sorted(nodes, key=lambda n: (not n.get("is_head_node"), n["node_id"])):
        ip, port = node.get("node_ip", ""), ports.get(node["node_id"])
        up, version, url = probe(f"{f'[{ip}]' if ':' in ip else ip}:{port}", access) if port else (False, None, None)
        rows.append({"node_id": node["node_id"], "address": ip, "role": "head" if node.get("is_head_node") else
                     "worker", "exporter_url": url, "up": up, "version": version})
    return {"supervisor": any(a.get("name") == wire.DEPLOY_SUPERVISOR for a in actors), "nodes": rows,
            "complete": bool(rows) and all(row["up"] for row in rows)}
