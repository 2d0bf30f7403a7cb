"""The Ray and progress settings: flags, environment, and the refusals that protect the endpoint."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from exporter.config import ConfigError, load_config
from tests.conftest import REPO, exporter_command


def check_config(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(exporter_command("check-config", *args), capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**os.environ, **(env or {})})


def test_the_launchers_flags_land_in_the_configuration():
    result = check_config("--ray-dashboard", "http://10.0.0.1:8265", "--ray-role", "head", "--cluster", "prod-a",
                          "--progress-listen", "unix:/run/raypulse/progress.sock")
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    assert effective["ray"]["dashboard_url"] == "http://10.0.0.1:8265"
    assert effective["ray"]["role"] == "head"
    assert effective["cluster"] == "prod-a"
    assert effective["progress"]["listen"] == "unix:/run/raypulse/progress.sock"


def test_environment_variables_set_the_same_settings():
    config = load_config(environ={"RAYPULSE_EXPORTER_RAY__FINISHED_JOB_RETENTION_SECONDS": "600",
                                  "RAYPULSE_EXPORTER_PROGRESS__MAX_RANKS_PER_JOB": "16",
                                  "RAYPULSE_EXPORTER_CLUSTER": "c1"})
    assert (config.ray.finished_job_retention_seconds, config.progress.max_ranks_per_job, config.cluster) == \
        (600, 16, "c1")


@pytest.mark.parametrize(("flags", "message"), [
    ({"progress": {"listen": "0.0.0.0:9478"}}, "progress: listen: '0.0.0.0:9478' is not loopback"),
    ({"progress": {"listen": "unix:relative.sock"}}, "progress.listen: a Unix socket is unix:/absolute/path"),
    ({"ray": {"role": "leader"}}, "ray.role: String should match pattern"),
    ({"ray": {"dashboard_url": "10.0.0.1:8265"}}, "ray.dashboard_url: String should match pattern"),
    ({"cluster": "has spaces"}, "cluster: String should match pattern"),
])
def test_bad_settings_are_refused_naming_the_setting(flags, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_config(flags, environ={})


def test_a_remote_progress_endpoint_must_be_asked_for():
    config = load_config({"progress": {"listen": "0.0.0.0:9478", "allow_remote": True}}, environ={})
    assert config.progress.listen == "0.0.0.0:9478"
    assert load_config({"progress": {"listen": "off"}}, environ={}).progress.listen == "off"
