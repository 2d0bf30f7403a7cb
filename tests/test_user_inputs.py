"""Every file and YAML/JSON input of both CLIs goes through one safe reader (exporter/userinput.py,
issue 41 finding 8): a FIFO, /dev/zero, a file over the cap and a YAML alias bomb are each refused
at once with exit 2 and one line naming the input and what to do, never a hang, a traceback or
gigabytes of output. Each CLI runs as a real process with a deadline, so a hang fails the test."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import userinput
from tests.conftest import REPO
from tests.launcher_support import env_for

DEADLINE_S = 60  # far above a refusal's cost; only a hang (the bug) reaches it


def alias_bomb() -> str:
    """The "billion laughs" YAML: nine levels of nine aliases each, 9^8 strings when expanded, 1 KB written."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Each hostile file, with what its refusal says."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * (userinput.MAX_FILE_BYTES // 10 + 1))
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    return {"fifo": (fifo, "a FIFO, not a regular file"),
            "dev-zero": (Path("/dev/zero"), "a device, not a regular file"),
            "over the cap": (big, "larger than 1 MiB"),
            "alias bomb": (bomb, "YAML aliases expand to more than 1 MiB")}


# (CLI, its arguments with FILE for the input, what the message names)
READERS = {
    "exporter --config": ("exporter", ["check-config", "--config", "FILE"], "config file"),
    "exporter --web-config": ("exporter", ["check-config", "--web-config", "FILE"], "web config file"),
    "launcher -f": ("launcher", ["render", "-f", "FILE"], "job spec"),
    "launcher --runtime-env": ("launcher", ["render", "--runtime-env", "FILE", "--", "python", "x.py"],
                               "--runtime-env"),
    "launcher --pod-template": ("launcher", ["render", "--pod-template", "FILE", "--", "python", "x.py"],
                                "pod template"),
    "launcher exporters manifests --affinity": ("launcher", ["exporters", "manifests", "--affinity", "@FILE"],
                                                "--affinity"),
}


def run(cli: str, args: list[str], home: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", cli, *args], capture_output=True, text=True, cwd=REPO,
                          env=env_for(home, PYTHONPATH=str(REPO), **env), timeout=DEADLINE_S)


def assert_refused(result: subprocess.CompletedProcess, *said: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""  # nothing half-done
    lines = [line for line in result.stderr.splitlines() if all(part in line for part in said)]
    assert len(lines) == 1, (said, result.stderr)


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("bad", ["fifo", "dev-zero", "over the cap", "alias bomb"])
def test_a_hostile_file_is_refused_at_once_naming_the_input(reader, bad, bad_files, tmp_path):
    cli, args, names = READERS[reader]
    path, problem = bad_files[bad]
    result = run(cli, [arg.replace("FILE", str(path)) for arg in args], tmp_path)
    assert_refused(result, names, str(path), problem)


def test_an_alias_bomb_inside_a_job_spec_is_refused(tmp_path):
    spec = tmp_path / "job.yaml"
    bomb = "".join(f"      {line}\n" for line in alias_bomb().splitlines())
    spec.write_text(f"name: job\nentrypoint: python x.py\npod_template:\n  metadata:\n    annotations:\n{bomb}")
    assert_refused(run("launcher", ["render", "-f", str(spec), "-o", "json"], tmp_path),
                   "job spec", "YAML aliases expand")


def test_an_inline_alias_bomb_flag_is_refused(tmp_path):
    assert_refused(run("launcher", ["exporters", "manifests", "--affinity", alias_bomb()], tmp_path),
                   "--affinity", "YAML aliases expand")


def test_deeply_nested_json_in_an_environment_variable_is_refused(tmp_path):
    deep = "[" * 20_000 + "]" * 20_000  # past json's recursion limit: a RecursionError before
    result = run("exporter", ["check-config"], tmp_path, RAYPULSE_EXPORTER_NODE__CHECKPOINT_PATHS=deep)
    assert_refused(result, "RAYPULSE_EXPORTER_NODE__CHECKPOINT_PATHS", "nested too deeply")


@pytest.mark.parametrize("flag", ["--runtime-env-json", "--headers"])
def test_deeply_nested_json_in_a_flag_is_refused(flag, tmp_path):
    result = run("launcher", ["render", flag, "[" * 20_000 + "]" * 20_000, "--", "python", "x.py"], tmp_path)
    assert_refused(result, flag, "nested too deeply")


@pytest.mark.parametrize(("text", "problem"), [
    ("a: &a [*a]", "refers to a node that holds it"),
    ("a: &a {b: *a}", "refers to a node that holds it"),
    ("[" * 200 + "]" * 200, "nested too deeply"),
    ("[" * 20_000 + "]" * 20_000, "nested too deeply"),
])
def test_yaml_that_cannot_be_used_is_an_input_error(text, problem):
    with pytest.raises(userinput.InputError, match=problem):
        userinput.load_yaml(text)


def test_anchors_and_merge_keys_within_bounds_still_work():
    text = "base: &base {cpus: 2, gpus: 1}\ngroups: [{<<: *base, name: a}, {<<: *base, name: b}]\n"
    assert userinput.load_yaml(text)["groups"] == [{"cpus": 2, "gpus": 1, "name": "a"},
                                                    {"cpus": 2, "gpus": 1, "name": "b"}]


def test_a_file_at_the_cap_is_read(tmp_path):
    path = tmp_path / "full.yaml"
    path.write_bytes(b"#" * (userinput.MAX_FILE_BYTES - 1) + b"\n")
    assert userinput.read_text(path).startswith("#")


@pytest.mark.parametrize("text", ["a: 2001-02-30", "a: !!int zz", "a: !!float x", "a: !!timestamp 2001-13-01",
                                  "!!int", "!!timestamp"])
def test_a_scalar_yaml_cannot_build_is_an_input_error(text):
    with pytest.raises(userinput.InputError, match="not valid YAML"):
        userinput.load_yaml(text)


_YAML_PIECES = st.sampled_from(["a: ", "- ", "&x ", "*x", "<<: *x", "!!int ", "!!binary ", "!!timestamp ",
                                "2001-02-30", "[", "]", "{", "}", ", ", ": ", "\n", "  ", "? ", "'", '"', "1e999",
                                ".inf", "~", "#", "---\n", "|\n", "x"])


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=60), st.lists(_YAML_PIECES, max_size=30).map("".join)))
def test_yaml_text_gives_a_value_or_an_input_error_and_nothing_else(text):
    with contextlib.suppress(userinput.InputError):
        userinput.load_yaml(text)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=60), st.lists(st.sampled_from(["[", "]", "{", "}", '"a"', ":", ",", "1e999",
                                                                  "NaN", "-", "0"]), max_size=40).map("".join)))
def test_json_text_gives_a_value_or_an_input_error_and_nothing_else(text):
    with contextlib.suppress(userinput.InputError):
        userinput.load_json(text)


@pytest.mark.parametrize("bad", ["fifo", "dev-zero", "over the cap"])
def test_a_web_config_naming_a_hostile_certificate_file_is_refused(bad, bad_files, tmp_path):
    path, problem = bad_files[bad]
    web_config = tmp_path / "web-config.yml"
    web_config.write_text(f"tls_server_config:\n  cert_file: {path}\n  key_file: {path}\n")
    result = run("exporter", ["check-config", "--web-config", str(web_config)], tmp_path)
    assert_refused(result, str(web_config), f"tls_server_config.cert_file ({path})", problem)
