"""Configuration: precedence of flags, environment and file, and errors that name the field."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from exporter.config import ConfigError, load_config, parse_listen
from exporter.plugins import load
from tests.conftest import REPO, exporter_command


def test_flags_beat_environment_which_beats_the_file(tmp_path):
    config_file = tmp_path / "exporter.yml"
    config_file.write_text("listen: 127.0.0.1:1111\nlog_level: debug\nstale_after_intervals: 5\n"
                           "node:\n  checkpoint_paths: [/from/file]\n")
    environ = {"RAYPULSE_EXPORTER_LISTEN": "127.0.0.1:2222", "RAYPULSE_EXPORTER_LOG_LEVEL": "warning",
               "RAYPULSE_EXPORTER_NODE__RAY_TEMP_DIR": "/scratch/ray"}
    config = load_config({"listen": "127.0.0.1:3333"}, config_file, environ)
    assert config.listen == "127.0.0.1:3333"  # flag
    assert config.log_level == "warning"  # environment over file
    assert config.stale_after_intervals == 5  # file
    assert config.node.checkpoint_paths == (Path("/from/file"),)  # file, nested
    assert config.node.ray_temp_dir == Path("/scratch/ray")  # environment, nested


def test_per_collector_settings_from_the_environment():
    config = load_config(environ={"RAYPULSE_EXPORTER_COLLECTORS__TCP__ENABLED": "false",
                                  "RAYPULSE_EXPORTER_COLLECTORS__CPU__INTERVAL_SECONDS": "2.5"})
    assert config.collector_settings("tcp").enabled is False
    assert config.collector_settings("cpu").interval_seconds == 2.5
    assert config.collector_settings("memory").interval_seconds is None


def test_the_environment_nests_as_the_file_does_lists_and_mappings_in_json():
    config = load_config(environ={
        "raypulse_exporter_log_level": "debug",  # names in any case
        "RAYPULSE_EXPORTER_NODE__CHECKPOINT_PATHS": '["/ckpt", "/scratch"]',
        "RAYPULSE_EXPORTER_OTLP__HEADERS": '{"x-api-key": "k"}',
        "RAYPULSE_EXPORTER_GPU": '{"simulate": 2, "simulate_model": "A100"}',  # a whole section in JSON ...
        "RAYPULSE_EXPORTER_GPU__SIMULATE_MODEL": "H100",  # ... and one of its fields, which wins
        "RAYPULSE_EXPORTER_COLLECTORS": '{"cpu": {"enabled": false}}',
        "RAYPULSE_EXPORTER_COLLECTORS__TCP__ENABLED": "true",
        "RAYPULSE_EXPORTER_CLUSTER": "c1",
        "OTHER_VARIABLE": "ignored"})
    assert config.log_level == "debug"
    assert config.node.checkpoint_paths == (Path("/ckpt"), Path("/scratch"))
    assert config.otlp.headers == {"x-api-key": "k"}
    assert (config.gpu.simulate, config.gpu.simulate_model) == (2, "H100")
    assert config.collector_settings("cpu").enabled is False
    assert config.collector_settings("tcp").enabled is True
    assert config.cluster == "c1"


@pytest.mark.parametrize(("environ", "expected"), [
    ({"RAYPULSE_EXPORTER_GPU__SIMULATE": "many"}, "gpu.simulate: Input should be a valid integer"),
    ({"RAYPULSE_EXPORTER_GPU__NOPE": "1"}, "gpu.nope: unknown setting"),
    ({"RAYPULSE_EXPORTER_OTLP__HEADERS": "k=v"}, "RAYPULSE_EXPORTER_OTLP__HEADERS (otlp.headers) is not valid JSON"),
    ({"RAYPULSE_EXPORTER_GPU": "{"}, "RAYPULSE_EXPORTER_GPU (gpu) is not valid JSON"),
])
def test_a_bad_environment_variable_names_the_field(environ, expected):
    with pytest.raises(ConfigError) as error:
        load_config(environ=environ)
    assert expected in str(error.value)
    if "JSON" not in expected:
        assert "(from environment (RAYPULSE_EXPORTER_*))" in str(error.value)


@pytest.mark.parametrize(("flags", "environ", "expected"), [
    ({"listen": "localhost"}, {}, "listen: expected HOST:PORT"),
    ({"listen": "127.0.0.1:70000"}, {}, "listen: expected HOST:PORT"),
    ({}, {"RAYPULSE_EXPORTER_STALE_AFTER_INTERVALS": "0"}, "stale_after_intervals: Input should be greater than or "
     "equal to 1 (from environment (RAYPULSE_EXPORTER_*))"),
    ({"collectors": {"gpus": {"enabled": True}}}, {}, "collectors: unknown collector(s) gpus; known: cpu"),
    ({"collectors": {"cpu": {"interval_seconds": -1}}}, {}, "collectors.cpu.interval_seconds: Input should be "
     "greater than or equal to 0.5 (from command-line flag)"),
    ({}, {"RAYPULSE_EXPORTER_COLLECTORS__CPU__INTERVAL_SECONDS": "1e-9"}, "collectors.cpu.interval_seconds: Input "
     "should be greater than or equal to 0.5 (from environment (RAYPULSE_EXPORTER_*))"),  # a core and more, busy
    ({}, {"RAYPULSE_EXPORTER_OTLP__INTERVAL_SECONDS": "0.001"}, "otlp.interval_seconds: Input should be greater "
     "than or equal to 1"),
    ({"node": {"disk_exclude_devices": "(["}}, {}, "node.disk_exclude_devices: not a valid regular expression"),
    ({"nodes": {}}, {}, "nodes: unknown setting"),
    ({}, {"RAYPULSE_EXPORTER_NODE__CHECKPOINT_PATHS": "/not/json"}, "lists and mappings are JSON"),
])
def test_bad_values_name_the_field_and_where_it_came_from(flags, environ, expected):
    with pytest.raises(ConfigError) as error:
        load(flags, environ=environ)
    assert expected in str(error.value)


def test_a_bad_config_file_is_named(tmp_path):
    config_file = tmp_path / "exporter.yml"
    config_file.write_text("node:\n  procfs: [1, 2]\n")
    with pytest.raises(ConfigError, match=rf"node.procfs: .* \(from config file {config_file}\)"):
        load_config(config_file=config_file, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(config_file=tmp_path / "missing.yml", environ={})


@pytest.mark.parametrize(("text", "expected"), [("127.0.0.1:9477", ("127.0.0.1", 9477)), (":80", ("0.0.0.0", 80)),
                                                ("[::1]:9477", ("::1", 9477)), ("host.example:0", ("host.example", 0))])
def test_listen_addresses(text, expected):
    assert parse_listen(text) == expected


def test_check_config_prints_the_effective_settings_and_fails_on_errors(tmp_path):
    config_file = tmp_path / "exporter.yml"
    config_file.write_text("collectors:\n  tcp:\n    enabled: false\n")
    result = subprocess.run(exporter_command("check-config", "--config", str(config_file), "--checkpoint-path",
                                             "/ckpt", "--disable-collector", "infiniband"),
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    assert effective["collectors"] == {"tcp": {"enabled": False, "interval_seconds": None, "deadline_seconds": None},
                                       "infiniband": {"enabled": False, "interval_seconds": None,
                                                      "deadline_seconds": None}}
    assert effective["node"]["checkpoint_paths"] == ["/ckpt"]

    config_file.write_text("collectors:\n  tcpp: {}\n")
    result = subprocess.run(exporter_command("check-config", "--config", str(config_file)), capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2
    assert "collectors: unknown collector(s) tcpp" in result.stderr
    assert result.stdout == ""


def test_a_taken_port_fails_with_a_clear_message(start_exporter):
    running = start_exporter()
    port = running.url.rsplit(":", 1)[1]
    result = subprocess.run(exporter_command("serve", "--listen", f"127.0.0.1:{port}"), capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def check_config(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(exporter_command("check-config", *args), capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("content", "message"), [
    (b"listen: ':9477'\nnode: {name: \"\xff\xfe\"}\n", "not UTF-8 text (byte 30); save it as UTF-8"),
    (b"[" * 100_000, "config file"),
])
def test_a_config_file_that_is_not_text_or_too_deep_is_a_clear_exit_2(tmp_path, content, message):
    config_file = tmp_path / "exporter.yml"
    config_file.write_bytes(content)
    result = check_config("--config", str(config_file))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_exporter_variables_are_warned_about_by_name():
    result = check_config(env={"RAYPULSE_EXPORTER_LISTN": ":1", "RAYPULSE_EXPORTER_PROGRESS__MAX_SERIES": "500",
                               "RAYPULSE_EXPORTER_PROGRES__MAX_SERIES": "5"})
    assert result.returncode == 0, result.stderr
    assert "RAYPULSE_EXPORTER_LISTN names no setting" in result.stderr
    assert "RAYPULSE_EXPORTER_PROGRES__MAX_SERIES names no setting" in result.stderr
    assert "RAYPULSE_EXPORTER_PROGRESS__MAX_SERIES" not in result.stderr
    assert "max_series: 500" in result.stdout


def test_check_config_never_prints_otlp_secrets():
    result = check_config("--otlp-endpoint", "https://user:hunter2@otlp.example:4318/?api_key=s3cret",
                          env={"RAYPULSE_EXPORTER_OTLP__HEADERS": '{"x-api-key": "s3cret-header"}'})
    assert result.returncode == 0, result.stderr
    for secret in ("hunter2", "s3cret", "s3cret-header"):
        assert secret not in result.stdout
    assert "x-api-key: <redacted>" in result.stdout
    assert "otlp.example:4318" in result.stdout
