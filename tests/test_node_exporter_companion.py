"""Next to node_exporter: the collector profiles, node_exporter's targets in /sd, and node_exporter's
flag names on `exporter serve` / `check-config`. The dashboards' side runs live in
tests/test_dashboards_node_exporter.py."""

from __future__ import annotations

import json

import aiohttp
import pytest
import yaml
from click.testing import CliRunner

from exporter import profiles
from exporter.cli import main
from exporter.config import ConfigError
from exporter.contract import wire
from exporter.framework.collector import load_collectors
from exporter.framework.shared import ServiceDiscovery, Shared
from exporter.plugins import enabled_collectors, load
from exporter.serving.server import Exporter

NODE_COLLECTORS = {"cpu", "memory", "vmstat", "disk", "network", "pressure", "filesystem", "tcp", "processes",
                   "infiniband", "host"}


def running(flags: dict, environ: dict[str, str] | None = None) -> set[str]:
    """The collectors `exporter serve` would start with this configuration."""
    config = load(flags, environ=environ or {})
    collectors = enabled_collectors(config, Shared.for_config(config))
    for collector in collectors:
        collector.close()
    return {collector.name for collector in collectors}


def test_every_node_collector_is_either_left_to_node_exporter_or_kept_for_a_reason():
    left, kept = set(profiles.LEFT_TO_NODE_EXPORTER), set(profiles.KEPT_BESIDE_NODE_EXPORTER)
    assert left | kept == NODE_COLLECTORS
    assert not left & kept
    assert left | kept <= set(load_collectors())  # the profiles name registered collectors only


def test_the_companion_profile_leaves_to_node_exporter_what_it_reads_too():
    default = running({})
    companion = running({"profile": profiles.COMPANION})
    assert default - companion == set(profiles.LEFT_TO_NODE_EXPORTER)
    assert {"filesystem", "tcp", "pod", "gpu", "ray", "ray_head", "train", "self"} <= companion
    # The environment names the profile as well as the flag does.
    assert running({}, {"RAYPULSE_EXPORTER_PROFILE": profiles.COMPANION}) == companion


def test_a_collector_named_in_the_configuration_wins_over_the_profile():
    companion = running({"profile": profiles.COMPANION, "collectors": {"cpu": {"enabled": True},
                                                                       "tcp": {"enabled": False}}})
    assert "cpu" in companion
    assert "tcp" not in companion
    assert "memory" not in companion
    assert running({"profile": profiles.NONE}) == set()
    assert running({"profile": profiles.NONE, "collectors": {"gpu": {"enabled": True}}}) == {"gpu"}


def test_a_profile_that_does_not_exist_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"profile: .*default\|node-exporter-companion\|none"):
        load({"profile": "node-exporter"}, environ={})


# --- /sd -------------------------------------------------------------------------------------------

HEAD_GROUPS = (
    {"targets": ["10.0.0.4:9477"], "labels": {"cluster": "c1", "node": "head", "role": "head", "ray_node_id": "aa"}},
    {"targets": ["[fd00::5]:19477"], "labels": {"cluster": "c1", "node": "gpu-1", "role": "worker",
                                                "ray_node_id": "bb"}},
)


async def served_sd(flags: dict) -> list[dict]:
    """/sd of an exporter whose head collector published HEAD_GROUPS (what ray_head does on a head)."""
    config = load({"listen": "127.0.0.1:0", "progress": {"listen": "off"}, **flags}, environ={})
    exporter = Exporter(config, collectors=[])
    exporter.shared.service_discovery.publish(ServiceDiscovery("head", HEAD_GROUPS))
    await exporter.start()
    try:
        async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{exporter.port}{wire.SD_PATH}") as response:
            assert response.status == 200
            return json.loads(await response.text())
    finally:
        await exporter.stop()


async def test_sd_lists_each_nodes_node_exporter_with_the_nodes_labels_in_the_companion_profile():
    groups = await served_sd({"profile": profiles.COMPANION})
    assert groups[:2] == list(HEAD_GROUPS)
    assert groups[2:] == [
        {"targets": [f"10.0.0.4:{wire.NODE_EXPORTER_PORT}"], "labels": {**HEAD_GROUPS[0]["labels"], "job": "node"}},
        {"targets": [f"[fd00::5]:{wire.NODE_EXPORTER_PORT}"], "labels": {**HEAD_GROUPS[1]["labels"], "job": "node"}},
    ]


async def test_sd_lists_node_exporter_only_when_asked_with_its_port_and_job():
    assert await served_sd({}) == list(HEAD_GROUPS)
    assert await served_sd({"profile": profiles.COMPANION, "node_exporter": {"discover": False}}) == list(HEAD_GROUPS)
    groups = await served_sd({"node_exporter": {"discover": True, "port": 9200, "job": "node-exporter"}})
    assert [group["targets"] for group in groups[2:]] == [["10.0.0.4:9200"], ["[fd00::5]:9200"]]
    assert {group["labels"]["job"] for group in groups[2:]} == {"node-exporter"}


# --- node_exporter's flag names ----------------------------------------------------------------------

def check_config(*args: str) -> tuple[int, dict, str]:
    """`exporter check-config ARGS` in process: exit code, effective settings, stderr."""
    result = CliRunner().invoke(main, ["check-config", *args], env={})
    effective = yaml.safe_load(result.stdout) if result.exit_code == 0 else {}
    return result.exit_code, effective, result.stderr


def collectors(effective: dict) -> dict[str, bool | None]:
    return {name: settings["enabled"] for name, settings in effective["collectors"].items()}


def test_web_listen_address_is_listen():
    code, effective, _ = check_config("--web.listen-address", ":9100")
    assert (code, effective["listen"]) == (0, ":9100")
    assert check_config("--web.listen-address=127.0.0.1:9200")[1]["listen"] == "127.0.0.1:9200"


def test_web_config_file_is_web_config(tmp_path):
    web_config = tmp_path / "web.yml"
    web_config.write_text("{}\n")
    code, effective, _ = check_config("--web.config.file", str(web_config))
    assert (code, effective["web_config_file"]) == (0, str(web_config))


def test_collector_name_and_no_collector_name_turn_a_collector_on_and_off():
    code, effective, _ = check_config("--profile", profiles.COMPANION, "--collector.cpu", "--no-collector.tcp")
    assert code == 0
    assert effective["profile"] == profiles.COMPANION
    assert collectors(effective) == {"cpu": True, "tcp": False}


def test_collector_disable_defaults_is_profile_none():
    code, effective, _ = check_config("--collector.disable-defaults", "--collector.gpu", "--collector.ray")
    assert code == 0
    assert effective["profile"] == profiles.NONE
    assert collectors(effective) == {"gpu": True, "ray": True}
    assert check_config("--collector.disable-defaults", "--profile", profiles.NONE)[0] == 0
    code, _, stderr = check_config("--collector.disable-defaults", "--profile", profiles.COMPANION)
    assert code == 2
    assert f"--collector.disable-defaults is --profile none; it contradicts --profile {profiles.COMPANION}" in stderr


def test_an_unknown_collector_in_node_exporters_spelling_gets_the_usual_error():
    for flag in ("--collector.cpuu", "--no-collector.cpuu"):
        code, _, stderr = check_config(flag)
        assert code == 2
        assert "collectors: unknown collector(s) cpuu; known: cpu, disk" in stderr
    # node_exporter's per-collector settings have no counterpart here: refused by name, not misread.
    code, _, stderr = check_config("--collector.filesystem.mount-points-exclude=^/x")
    assert code == 2
    assert "No such option" in stderr
