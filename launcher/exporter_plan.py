"""The exporter of one node of a local cluster: where it listens, its `exporter serve` command line,
and the web config it serves under. (Exporters on an existing cluster are placed by Ray:
launcher/deploy/.)

With `exporter_web_config` (TLS and basic auth in the exporter-toolkit format), every exporter of the
cluster runs with a copy of the user's file made for the launcher (prepare_web_config): the file paths
in it made absolute, and, when it has basic auth, one more user, the launcher's own, with a random
password kept 0600 beside the cluster record. That is how the launcher (its health watcher) keeps
reading /metrics while nobody else can without the user's credentials: the user's file holds only
bcrypt hashes, which a client cannot log in with.
"""

from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from exporter.config import read_yaml_file
from launcher.state import ExporterAccess, write_private

WEB_CONFIG_FILE = "exporter-web-config.yml"
PASSWORD_FILE = "exporter-password"
LAUNCHER_USER = "raypulse-launcher"
PROGRESS_HOST = "127.0.0.1"  # the progress endpoint serves the node's own processes only


@dataclass(frozen=True)
class ExporterPlan:
    node: str  # "head", "workers-1", ...
    role: str  # "head" or "worker"
    port: int
    progress_port: int
    dashboard_url: str
    cluster: str
    simulate_gpus: int = 0  # 0: none
    gpu_control: str | None = None  # the simulated GPUs' fault-injection file (`exporter gpu-fault --control`)
    # Where /metrics listens: the node's IP as Ray reports it (Ray resolves even a loopback
    # --node-ip-address to the host's address), because the head exporter's /sd advertises
    # <node ip>:<raypulse.io/exporter-port> to Prometheus. The progress endpoint stays on loopback.
    host: str = "127.0.0.1"
    web_config: str | None = None  # --web-config: the launcher's copy (prepare_web_config)
    tls: bool = False  # the web config serves HTTPS

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def progress_url(self) -> str:
        """RAYPULSE_PROGRESS_URL for the node's processes."""
        return f"http://{PROGRESS_HOST}:{self.progress_port}"

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "exporter", "serve", "--listen", f"{self.host}:{self.port}",
                   "--ray-dashboard", self.dashboard_url, "--cluster", self.cluster, "--ray-role", self.role,
                   "--progress-listen", f"{PROGRESS_HOST}:{self.progress_port}"]
        if self.web_config:
            command += ["--web-config", self.web_config]
        if self.simulate_gpus:
            command += ["--simulate-gpus", str(self.simulate_gpus)]
            if self.gpu_control:
                command += ["--gpu-control", self.gpu_control]
        return command


def add_launcher_user(data: dict) -> tuple[str, str]:
    """Add the launcher's own user to a web config's basic_auth_users (a mapping as read from YAML),
    with a random password hashed at the users' own bcrypt cost (a login's time must not tell which
    user exists); returns the user name and the password."""
    import bcrypt  # only with a web config's users: not at every command's start

    users = data["basic_auth_users"]
    username = LAUNCHER_USER
    while username in users:
        username = f"{LAUNCHER_USER}-{secrets.token_hex(2)}"
    cost = max(int(str(hashed)[4:6]) for hashed in users.values())
    password = secrets.token_urlsafe(32)
    data["basic_auth_users"] = {**users, username: bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()}
    return username, password


def prepare_web_config(source: Path, directory: Path) -> ExporterAccess:
    """Write the launcher's copy of the user's web config into `directory` (0600) and say how to reach
    exporters serving it. The user's file was checked with the spec (JobSpec.exporter_web_config);
    raises exporter.config.ConfigError if it changed into something that cannot work since."""
    import yaml  # as exporter/userinput.py: PyYAML when YAML is written

    from exporter.serving.webconfig import load_web_config  # aiohttp's server side: only when a web config is given

    config = load_web_config(source)  # with its certificate paths resolved against its folder
    data = read_yaml_file(source, "web config file")
    tls = config.tls_server_config
    if tls is not None:
        data["tls_server_config"] = {
            **data["tls_server_config"],
            **{name: str(Path(value).absolute()) for name, value in (
                ("cert_file", tls.cert_file), ("key_file", tls.key_file), ("client_ca_file", tls.client_ca_file))
               if value is not None}}
    username = password_file = None
    if config.basic_auth_users:
        username, password = add_launcher_user(data)
        password_file = directory / PASSWORD_FILE
        write_private(password_file, password + "\n")
    target = directory / WEB_CONFIG_FILE
    write_private(target, yaml.safe_dump(data, sort_keys=False))
    load_web_config(target)  # what the exporters will read must load
    return ExporterAccess(web_config=str(target), tls_trust_file=str(tls.cert_file) if tls else None,
                          username=username, password_file=str(password_file) if password_file else None)
