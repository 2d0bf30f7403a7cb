"""Run ids and cluster names name directories under $RAYPULSE_HOME and nothing else (issue 29,
finding 2): a `../` id is refused before anything is read, sent or written, a link out of
$RAYPULSE_HOME is refused, and what `report` and `export` write never follows a planted link.
Without Ray: real `launcher` commands against a planted run record that points at a real HTTP server
on 127.0.0.1 standing in for an attacker's dashboard."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from pathlib import Path

import pytest
from aiohttp import web

from launcher import export, recording, report, state
from launcher.errors import BadInput
from launcher.state import AttemptRecord, RunRecord
from tests.conftest import free_port
from tests.launcher_support import launcher

VICTIM_TOKEN = "the-victims-ray-token"


class Listener:
    """An HTTP server that answers like a Ray dashboard and remembers every request's Authorization."""

    def __init__(self) -> None:
        self.port = free_port()
        self.seen: list[tuple[str, str | None]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Listener:
        ready = threading.Event()

        async def answer(request: web.Request) -> web.Response:
            self.seen.append((request.path, request.headers.get("Authorization")))
            return web.json_response({"ray_version": "2.60.0"} if request.path == "/api/version" else {})

        async def serve() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", answer)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            ready.set()
            await asyncio.Event().wait()

        threading.Thread(target=asyncio.run, args=(serve(),), daemon=True, name="listener").start()
        assert ready.wait(10)
        return self


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    (path / "runs").mkdir(parents=True)
    monkeypatch.setenv("RAYPULSE_HOME", str(path))
    return path


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Listener]:
    """/tmp/evil as the probe had it: a run record naming an attacker's address and the victim's token."""
    listener = Listener().start()
    token = tmp_path / "victim-token"
    token.write_text(VICTIM_TOKEN)
    evil = tmp_path / "evil"
    evil.mkdir()
    record = RunRecord(run_id="evil", name="evil", backend="existing", address=listener.url,
                       spec={"token_path": str(token)},
                       attempts=[AttemptRecord(attempt=1, submission_id="evil-a1", status="RUNNING")])
    (evil / "run.json").write_text(record.model_dump_json())
    return evil, listener


@pytest.mark.parametrize("command", [["status"], ["stop"], ["logs"], ["diagnose", "--live"]])
def test_a_path_as_run_id_is_refused_and_sends_no_token(home: Path, planted: tuple[Path, Listener],
                                                        command: list[str]):
    evil, listener = planted
    result = launcher(*command, "../../evil", home=home, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "no run '../../evil' is recorded here" in result.stderr
    assert listener.seen == []
    assert sorted(path.name for path in evil.iterdir()) == ["run.json"]  # `stop` wrote nothing there


def test_report_and_export_take_no_path_as_run_id(home: Path, planted: tuple[Path, Listener], tmp_path: Path):
    evil, _ = planted
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (evil / "report.html").symlink_to(victim)
    refused = launcher("report", str(evil), home=home, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert victim.read_text() == "precious"
    (evil / recording.FILE_NAME).write_bytes(b"")  # a recording to export (empty: nothing but # EOF)
    refused = launcher("export", "../evil", home=home, timeout=60)  # in $RAYPULSE_HOME: <id>.om would be ../evil.om
    assert refused.returncode == 2, refused.stderr
    assert not (tmp_path / "evil.om").exists()


def test_ids_and_names_are_checked_with_submit_s_rule(home: Path):
    for bad in ("../x", "a/b", "", ".", "UPPER", "x" * 48, "-x"):
        with pytest.raises(BadInput, match="run_id: "):
            state.run_dir(bad)
        with pytest.raises(BadInput, match="cluster: "):
            state.cluster_dir(bad)
        assert state.load_run(bad) is None  # no run of that name can be recorded here
        assert state.load_cluster(bad) is None
    assert state.run_dir("mnist-1a2b") == home / "runs" / "mnist-1a2b"


def test_a_link_out_of_raypulse_home_is_refused(home: Path, planted: tuple[Path, Listener]):
    evil, listener = planted
    (home / "runs" / "evil").symlink_to(evil)
    with pytest.raises(BadInput, match="outside"):
        state.load_run("evil")
    result = launcher("status", "evil", home=home, timeout=60)
    assert result.returncode == 2, result.stderr
    assert listener.seen == []
    assert state.list_runs() == []  # listed runs skip it too


def test_a_home_that_is_itself_a_link_still_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    real = tmp_path / "real-home"
    (real / "runs" / "r-1").mkdir(parents=True)
    (tmp_path / "home-link").symlink_to(real)
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path / "home-link"))
    assert state.run_dir("r-1") == tmp_path / "home-link" / "runs" / "r-1"


def _record(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "run.json").write_text(RunRecord(run_id=directory.name, name="toy", backend="local",
                                                  state="SUCCEEDED", exit_code=0).model_dump_json())


def test_the_report_replaces_a_planted_link_and_is_private(home: Path, tmp_path: Path):
    run = home / "runs" / "toy-1"
    _record(run)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (run / "report.html").symlink_to(victim)
    path = report.render("toy-1")
    assert path == run / "report.html"
    assert victim.read_text() == "precious"
    assert not path.is_symlink()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # like everything else under $RAYPULSE_HOME


def test_a_report_where_the_user_says_keeps_the_umask_and_follows_no_link(home: Path, tmp_path: Path):
    _record(home / "runs" / "toy-2")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    chosen = tmp_path / "out" / "report.html"
    chosen.parent.mkdir()
    chosen.symlink_to(victim)
    old = os.umask(0o022)
    try:
        report.render("toy-2", chosen)
    finally:
        os.umask(old)
    assert victim.read_text() == "precious"
    assert not chosen.is_symlink()
    assert stat.S_IMODE(chosen.stat().st_mode) == 0o644


def test_export_replaces_a_planted_link(home: Path, tmp_path: Path):
    run = home / "runs" / "toy-3"
    _record(run)
    (run / recording.FILE_NAME).write_bytes(b"")  # an empty recording: nothing but # EOF
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "toy-3.om"
    target.symlink_to(victim)
    export.export_run("toy-3", target)
    assert victim.read_text() == "precious"
    assert target.read_text().endswith("# EOF\n")


def test_a_run_directory_kept_elsewhere_is_read_with_run_dir_and_left_as_it_was(home: Path, tmp_path: Path):
    copied = tmp_path / "copied" / "toy-3"
    _record(copied)
    before = sorted(path.name for path in copied.iterdir())
    result = launcher("report", "--run-dir", str(copied), home=home, timeout=120)
    assert result.returncode == 0, result.stderr
    written = home / "toy-3-report.html"  # in the working directory (the test runs the command in home)
    assert (home / result.stdout.strip()).resolve() == written.resolve()
    assert "<html" in written.read_text()
    assert sorted(path.name for path in copied.iterdir()) == before  # only read
    neither = launcher("report", home=home, timeout=60)
    assert neither.returncode == 2
    assert "give a RUN_ID (see `launcher list`) or --run-dir DIR" in neither.stderr
