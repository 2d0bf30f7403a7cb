"""`-o/--output` is the output format on every command that prints; files are `--out FILE`, directories
`--dir DIR`. The old `-o PATH` of report, export, config-reference, metrics, assets and exporters manifests still
works for one release, with one deprecation line naming the new flag. No cluster: a recorded run on
disk serves the launcher's read-side commands."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from exporter.cli import main as exporter_main
from launcher.cli import main as launcher_main
from launcher.state import AttemptRecord, RunRecord

RUN_ID = "toy-1"
# Commands that print nothing a script would parse: serve runs a server; gpu-fault changes a simulated
# GPU and says so in one line; exporter manifests only names the command that replaced it.
WITHOUT_FORMAT = {"exporter serve", "exporter gpu-fault", "exporter manifests"}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$RAYPULSE_HOME with one ended run: its record, an empty recording and attempt 1's saved log."""
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "home" / "runs" / RUN_ID
    run.mkdir(parents=True)
    (run / "run.json").write_text(RunRecord(
        run_id=RUN_ID, name="toy", backend="local", state="SUCCEEDED", exit_code=0,
        attempts=[AttemptRecord(attempt=1, submission_id=f"{RUN_ID}-a1", status="SUCCEEDED")]).model_dump_json())
    (run / "attempt-1.log").write_text("hello\n")
    from launcher import recording

    (run / recording.FILE_NAME).write_bytes(b"")
    return tmp_path


def commands(group: click.Group, prefix: str) -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    for name in group.list_commands(click.Context(group)):
        command = group.get_command(click.Context(group), name)
        assert command is not None
        if isinstance(command, click.Group):
            found |= commands(command, f"{prefix} {name}")
        else:
            found[f"{prefix} {name}"] = command
    return found


def test_every_command_that_prints_takes_o_as_its_format():
    every = commands(launcher_main, "launcher") | commands(exporter_main, "exporter")
    for name, command in sorted(every.items()):
        if name in WITHOUT_FORMAT or name.startswith("exporter gpu-fault "):
            continue
        options = {opt: param for param in command.params for opt in getattr(param, "opts", [])}
        assert "-o" in options, f"{name} has no -o/--output format"
        assert "--output" in options, name
        assert options["-o"].name == "output", name
        assert "json" in (options["-o"].metavar or "") or "json" in getattr(options["-o"].type, "choices", ()), name


def _json(result) -> object:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(("group", "args", "check"), [
    ("launcher", ["status", RUN_ID], lambda data: data["run_id"] == RUN_ID),
    ("launcher", ["list"], lambda data: [run["run_id"] for run in data["runs"]] == [RUN_ID]),
    ("launcher", ["logs", RUN_ID], lambda data: data["log"] == "hello\n"),
    ("launcher", ["report", RUN_ID], lambda data: data["path"].endswith("report.html")),
    ("launcher", ["export", RUN_ID], lambda data: data["path"] == f"{RUN_ID}.om" and data["samples"] == 0),
    ("launcher", ["render", "--", "true"], lambda data: data["kind"] == "List"),
    ("exporter", ["check-config"], lambda data: "listen" in data),
    ("exporter", ["config-reference"], lambda data: "properties" in data),
    ("exporter", ["metrics"], lambda data: isinstance(data, list) and data),
    ("exporter", ["assets", "--dir", "assets"], lambda data: any(p.endswith(".json") for p in data["wrote"])),
    ("launcher", ["exporters", "manifests"], lambda data: data["kind"] == "List"),
    ("launcher", ["exporters", "manifests", "--dir", "k8s"],
     lambda data: all(p.startswith("k8s/") for p in data["wrote"])),
])
def test_o_json_prints_json(home: Path, group: str, args: list[str], check):
    main = launcher_main if group == "launcher" else exporter_main
    options = args[:args.index("--")] if "--" in args else args
    result = CliRunner().invoke(main, [*options, "-o", "json", *args[len(options):]])  # before a `--`
    assert check(_json(result)), result.stdout


@pytest.mark.parametrize(("group", "args", "new", "written"), [
    ("launcher", ["report", RUN_ID], "--out", "r.html"),
    ("launcher", ["export", RUN_ID], "--out", "run.om"),
    ("exporter", ["config-reference"], "--out", "configuration.md"),
    ("exporter", ["metrics"], "--out", "metrics.md"),
    ("exporter", ["assets"], "--dir", "assets"),
    ("launcher", ["exporters", "manifests"], "--dir", "k8s"),
])
@pytest.mark.parametrize("old", ["-o", "--output"])
def test_the_old_path_spelling_warns_once_and_still_writes(home: Path, group: str, args: list[str], new: str,
                                                          written: str, old: str):
    main = launcher_main if group == "launcher" else exporter_main
    result = CliRunner().invoke(main, [*args, old, written])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if "deprecated" in line]
    assert len(warnings) == 1, result.stderr
    assert f"use {new} {written}" in warnings[0]
    assert (home / written).exists()
    # The new spelling: the same file, no warning.
    again = CliRunner().invoke(main, [*args, new, written])
    assert again.exit_code == 0, again.output
    assert "deprecated" not in again.stderr


def test_both_spellings_at_once_is_a_usage_error(home: Path):
    result = CliRunner().invoke(exporter_main, ["assets", "-o", "a", "--dir", "b"])
    assert result.exit_code == 2
    assert "give the path once, with --dir" in result.stderr
