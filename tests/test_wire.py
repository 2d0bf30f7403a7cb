"""The wire contract (exporter/contract/wire.py): names that round-trip, and the one Ray token lookup that the
launcher and the exporter share."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.collectors.ray.dashboard import ray_token
from exporter.contract import wire
from launcher.errors import BadInput
from launcher.jobs import read_token


def test_a_node_actor_name_carries_its_node_and_port():
    assert wire.parse_node_actor_name(wire.node_actor_name("ab12", 9501)) == ("ab12", 9501)
    assert wire.parse_node_actor_name(wire.DEPLOY_SUPERVISOR) is None
    assert wire.parse_node_actor_name(wire.DEPLOY_NODE_ACTOR_PREFIX + "ab12-notaport") is None
    assert wire.parse_node_actor_name(wire.DEPLOY_NODE_ACTOR_PREFIX + "ab12-70000") is None


def test_the_ray_token_is_found_where_ray_looks(tmp_path: Path):
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("from-home\n")
    (tmp_path / "token").write_text("  from-path\n")
    (tmp_path / "flag").write_text("from-flag\n")
    both = {"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "token")}
    assert wire.ray_auth_token(both, tmp_path) == "from-env"
    assert wire.ray_auth_token(both, tmp_path, token_path=tmp_path / "flag") == "from-flag"
    assert wire.ray_auth_token({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "token")}, tmp_path) == "from-path"
    assert wire.ray_auth_token({}, tmp_path) == "from-home"
    assert wire.ray_auth_token({"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "x"}, tmp_path) is None
    assert wire.ray_auth_token({}, tmp_path / "elsewhere") is None  # no ~/.ray/auth_token: no token
    with pytest.raises(wire.RayTokenUnreadable, match="RAY_AUTH_TOKEN_PATH"):
        wire.ray_auth_token({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")}, tmp_path)
    # What an Authorization header cannot carry is no token (issue 41, finding 5); the error does not show it.
    (tmp_path / "two-lines").write_text("tok1\ntok2\n")
    with pytest.raises(wire.RayTokenUnreadable, match="one line") as refused:
        wire.ray_auth_token({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "two-lines")}, tmp_path)
    assert "tok1" not in str(refused.value)
    with pytest.raises(wire.RayTokenUnreadable, match=r"RAY_AUTH_TOKEN: .*one line"):
        wire.ray_auth_token({"RAY_AUTH_TOKEN": "tok\x1b]0;x\x07"}, tmp_path)


def test_a_changed_token_file_is_read_again(tmp_path: Path):
    token = tmp_path / "token"
    token.write_text("first\n")
    environ = {"RAY_AUTH_TOKEN_PATH": str(token)}
    assert wire.ray_auth_token(environ) == "first"
    token.write_text("second\n")
    os.utime(token, (1, 1))  # a different mtime even on a coarse clock
    assert wire.ray_auth_token(environ) == "second"


def test_both_sides_use_the_one_lookup(tmp_path: Path, monkeypatch, caplog):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    # The launcher refuses, naming the setting; the exporter warns once and sends no token.
    with pytest.raises(BadInput, match=r"RAY_AUTH_TOKEN_PATH: cannot read the token file .*missing"):
        read_token(None)
    with caplog.at_level(logging.WARNING):
        assert ray_token() is None
        assert ray_token() is None
    assert sum("cannot read the Ray auth token file" in r.message for r in caplog.records) == 1
    # Both fall back to ~/.ray/auth_token as Ray does (the launcher used to skip it).
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("home-token\n")
    assert read_token(None) == "home-token" == ray_token()


# The wire contract (the deploy agent imports it on the nodes) and the progress client (training code
# imports it): the progress package's endpoint and store (aiohttp, pydantic) stay out of it.
@pytest.mark.parametrize("module", ["exporter.contract.wire", "exporter.progress"])
def test_the_contract_needs_nothing_but_the_standard_library(module):
    code = (f"import sys\nbefore = set(sys.modules)\nimport {module}\n"
            "third = {m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)\n"
            "assert third == {'exporter'}, third\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
