"""Secrets at rest and in logs (issue 15, finding 7), and the launcher's own reads of exporters that
serve a web config (finding 6), without Ray: the redaction rules, the modes of what the launcher
writes under $RAYPULSE_HOME (through the state and audit APIs and real `launcher` commands), the
exporter a deploy's node actor runs (its log and web config in a private directory), and the
launcher's copy of a web config served by a real exporter process."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tempfile
import urllib.error
from pathlib import Path

import bcrypt
import psutil
import pytest
import trustme
import yaml

from exporter.config import ConfigError
from exporter.serving.webconfig import load_web_config
from launcher import audit, redact
from launcher.deploy import remote
from launcher.deploy.raypulse_agent.node import NodeExporter
from launcher.display import PlainReporter
from launcher.exporter_plan import LAUNCHER_USER, prepare_web_config
from launcher.spec import JobSpec
from launcher.state import (
    ExporterAccess,
    RunRecord,
    load_deployment_access,
    load_run,
    request_stop,
    run_dir,
    write_token,
)
from tests.conftest import REPO, free_port, http_get, wait_until

R = redact.REDACTED
PASSWORD = "user-scrape-password"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- what is redacted -----------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "shown"), [
    ("python train.py --password hunter2 --epochs 3", f"python train.py --password {R} --epochs 3"),
    ("python train.py --token=abc123 --lr 0.1", f"python train.py --token={R} --lr 0.1"),
    ("python t.py --api-key 'a b' --hf-token \"x y\"", f"python t.py --api-key {R} --hf-token {R}"),
    ("HF_TOKEN=abc CUDA_VISIBLE_DEVICES=0 python train.py", f"HF_TOKEN={R} CUDA_VISIBLE_DEVICES={R} python train.py"),
    ("cd /x && export WANDB_API_KEY='s e c' && python t.py", f"cd /x && export WANDB_API_KEY={R} && python t.py"),
    ("env A=1 B=2 python t.py; C=3 ./run", f"env A={R} B={R} python t.py; C={R} ./run"),
    ("git clone https://alice:pa55@git.example.com/x.git", f"git clone https://alice:{R}@git.example.com/x.git"),
    ("pip install git+https://ghp_abc@github.com/a/b", f"pip install git+https://{R}@github.com/a/b"),
    ("curl 'https://h/x?token=abc&page=1'", f"curl 'https://h/x?token={R}&page=1'"),
    ("python t.py password=p1 user=alice", f"python t.py password={R} user=alice"),
])
def test_credentials_in_a_command_line_are_redacted(line, shown):
    assert redact.command(line) == shown
    assert redact.command(shown) == shown  # redacting twice changes nothing


@pytest.mark.parametrize(("line", "shown"), [
    ('curl -H "Authorization: Bearer X" https://h/api', f'curl -H "Authorization: {R}" https://h/api'),
    ("curl --header 'X-Api-Key: abc' https://h/", f"curl --header 'X-Api-Key: {R}' https://h/"),
    ("python t.py --bearer X", f"python t.py --bearer {R}"),
    ("wget --header=Authorization:Bearer\\ X u", f"wget --header=Authorization:{R} u"),
    ("python t.py --extra 'Bearer X'", f"python t.py --extra 'Bearer {R}'"),
    ("bash -c 'DB_URL=X python t.py'", f"bash -c 'DB_URL={R} python t.py'"),
    ('sudo sh -lc "cd /x && DB_URL=X ./run"', f'sudo sh -lc "cd /x && DB_URL={R} ./run"'),
    ("python t.py --wandb-key X", f"python t.py --wandb-key {R}"),
    ("mysql -u root -pX db < dump.sql", f"mysql -u root -p{R} db < dump.sql"),
    ("redis-cli -h r -a X ping", f"redis-cli -h r -a {R} ping"),
    ("python -c \"import os; os.environ['HF_TOKEN']='X'; main()\"",
     f"python -c \"import os; os.environ['HF_TOKEN']={R}; main()\""),
    ("aws configure set aws_secret_access_key X && python t.py",
     f"aws configure set aws_secret_access_key {R} && python t.py"),
])
def test_common_forms_of_credentials_on_a_command_line_are_redacted(line, shown):
    """The second probe's forms (issue 29, finding 9); command-line redaction stays best effort."""
    assert redact.command(line) == shown
    assert redact.command(shown) == shown


@pytest.mark.parametrize("line", [
    "python train.py --epochs 3 --lr=0.1",
    "mkdir -p out && python -c 'x=1; print(x)'",
    "python t.py --sort-key name --primary-key id",
    "bash -c 'python t.py --epochs 3'",
    "python t.py --token-path /p/token --password-file /p/pw --auth-mode token --no-token --verbose",
    "echo 'import os\nprint(1)' > job.py && python job.py",
    "python -c 'x=1; print(x)' a=b",
    "ssh git@github.com:org/repo",
])
def test_what_is_not_a_credential_is_left_alone(line):
    assert redact.command(line) == line


def test_names_that_say_credential():
    for name in ("HF_TOKEN", "--api-key", "apiKey", "AWS_SECRET_ACCESS_KEY", "password", "db.passwd", "X-Auth"):
        assert redact.sensitive(name), name
    for name in ("token_path", "password_file", "author", "keep_cluster", "run_id", "max_attempts", "trace_id"):
        assert not redact.sensitive(name), name


def test_a_spec_keeps_names_and_hides_values():
    spec = JobSpec(entrypoint="WANDB_API_KEY=w python t.py --password p", address="http://u:pw@head:8265",
                   runtime_env={"env_vars": {"HF_TOKEN": "hf_secret", "NCCL_DEBUG": "WARN"},
                                "pip": ["git+https://ghp_x@github.com/a/b"]}).model_dump(mode="json")
    shown = redact.spec(spec)
    assert shown["runtime_env"]["env_vars"] == {"HF_TOKEN": R, "NCCL_DEBUG": R}
    assert shown["entrypoint"] == f"WANDB_API_KEY={R} python t.py --password {R}"
    assert shown["address"] == f"http://u:{R}@head:8265"
    assert shown["runtime_env"]["pip"] == [f"git+https://{R}@github.com/a/b"]
    assert spec["runtime_env"]["env_vars"]["HF_TOKEN"] == "hf_secret"  # the spec itself is left as it is


# --- $RAYPULSE_HOME: modes and what is kept ---------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "raypulse"
    monkeypatch.setenv("RAYPULSE_HOME", str(path))
    return path


def test_records_are_0600_in_0700_directories_and_loose_ones_are_tightened(home: Path):
    old = os.umask(0o022)
    try:
        # What an older launcher left: world-readable directories and records.
        (home / "runs" / "r1").mkdir(parents=True, mode=0o755)
        home.chmod(0o755)
        (home / "runs").chmod(0o755)
        (home / "runs" / "r1").chmod(0o755)
        (home / "runs" / "r1" / "run.json").write_text("{}")
        (home / "runs" / "r1" / "run.json").chmod(0o644)
        (home / "audit.log").write_text("")
        (home / "audit.log").chmod(0o644)

        RunRecord(run_id="r1", name="r", backend="local").save()
        RunRecord(run_id="r2", name="r", backend="local").save()
        request_stop("r2")
        token = write_token("c1", "t" * 64)
        audit.record("run.finish", "SUCCEEDED", run_id="r1")
    finally:
        os.umask(old)
    for directory in (home, home / "runs", run_dir("r1"), run_dir("r2"), token.parent, home / "clusters"):
        assert mode(directory) == 0o700, directory
    for file in (run_dir("r1") / "run.json", run_dir("r2") / "run.json", run_dir("r2") / "stop", token,
                 home / "audit.log"):
        assert mode(file) == 0o600, file
    assert not [path for path in home.rglob(".*.tmp")]


def test_run_json_keeps_env_names_but_not_their_values(home: Path):
    spec = JobSpec(entrypoint="HF_TOKEN=hf_inline python t.py --token=tok123",
                   runtime_env={"env_vars": {"WANDB_API_KEY": "wandb_secret"}})
    record = RunRecord(run_id="r1", name="r", backend="local", spec=spec.model_dump(mode="json"))
    record.save()
    text = (run_dir("r1") / "run.json").read_text()
    for secret in ("hf_inline", "tok123", "wandb_secret"):
        assert secret not in text
    saved = load_run("r1").spec
    assert saved["runtime_env"]["env_vars"] == {"WANDB_API_KEY": R}
    assert saved["entrypoint"] == f"HF_TOKEN={R} python t.py --token={R}"


def test_the_audit_log_redacts_the_entrypoint_and_error_urls(home: Path):
    audit.record("attempt.submit", "ok", run_id="r1", entrypoint="HF_TOKEN=abc python t.py --password=pw1",
                 error="cannot reach http://bob:pw2@collector:4318", env_vars={"SECRET_X": "v"})
    [line] = audit.read()
    assert line["entrypoint"] == f"HF_TOKEN={R} python t.py --password={R}"
    assert line["error"] == f"cannot reach http://bob:{R}@collector:4318"
    assert line["env_vars"] == {"SECRET_X": R}
    assert mode(audit.path()) == 0o600
    assert "abc" not in audit.path().read_text()


def test_the_audit_log_is_not_written_through_a_link(home: Path, tmp_path: Path):
    home.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("")
    (home / "audit.log").symlink_to(victim)
    audit.record("run.stop", "ok", run_id="r1")
    assert victim.read_text() == ""


def test_the_launchers_own_lines_are_redacted_and_the_jobs_output_is_not():
    err, out = io.StringIO(), io.StringIO()
    reporter = PlainReporter(err=err, out=out)
    reporter.info("tracing to http://u:pw@collector:4318")
    reporter.warn("retrying python t.py --api-key=k1")
    reporter.log("HF_TOKEN=printed-by-the-job\n")
    assert "pw" not in err.getvalue()
    assert "k1" not in err.getvalue()
    assert R in err.getvalue()
    assert out.getvalue() == "HF_TOKEN=printed-by-the-job\n"


def launcher(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "RAYPULSE_HOME": str(home)}, timeout=120)


def test_launcher_status_shows_no_password_from_a_saved_run(home: Path):
    record = RunRecord(run_id="r1", name="r", backend="existing", address="http://u:pw9@head:8265",
                       state="FAILED", exit_code=1, reason="lost http://u:pw9@head:8265 (--token=t0k)")
    record.save()
    for output in ("text", "json"):
        result = launcher("status", "r1", "-o", output, home=home)
        assert result.returncode == 0, result.stderr
        assert "pw9" not in result.stdout
        assert "t0k" not in result.stdout


def test_a_refused_submit_leaves_a_private_audit_log(home: Path, tmp_path: Path):
    """A real `launcher submit` path that needs no Ray: a refused web config, recorded in the audit log."""
    result = launcher("submit", "--exporter-web-config", str(tmp_path / "missing.yml"), "--env", "HF_TOKEN=x1",
                      "--", "python", "t.py", "--password", "pw3", home=home)
    assert result.returncode == 2
    assert mode(home) == 0o700
    assert mode(home / "audit.log") == 0o600
    assert "pw3" not in (home / "audit.log").read_text()


@pytest.mark.parametrize("headers", ['{"X-Api-Key": "SECRET\\r"}', '{"X-Api-Key": "SECRET\\nX-Other: 1"}',
                                     '{"X-Api-Key": "SECRET\\u2603"}', '{"X-Api-Key": "SECRET\\u0085"}',
                                     '{"X-Api-Key\\n": "SECRET"}'])
def test_a_header_an_http_client_would_refuse_is_refused_up_front_without_its_value(home: Path, headers: str):
    """Issue 41, finding 5: the HTTP client's own refusal quoted the value (`Invalid header value
    b'SECRET\\r'`) in a traceback, exit 1."""
    result = launcher("submit", "--address", "http://127.0.0.1:1", "--headers", headers, "--", "python t.py",
                      home=home)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert "headers" in line
    assert "--headers" in line
    assert "SECRET" not in result.stderr + result.stdout


@pytest.mark.parametrize("content", ["TOKEN\nSECOND-LINE\n", "TO\x1bKEN\n", "TOKEN and more\r\n\r\nX: y\n"])
def test_a_token_file_that_is_not_one_line_is_refused_naming_the_file_not_the_token(home: Path, tmp_path: Path,
                                                                                      content: str):
    """Issue 41, finding 5: a two-line token file went into the Authorization header, and the HTTP
    client's refusal printed the token; exit 1."""
    token = tmp_path / "token-file"
    token.write_text(content)
    for command in (["list"], ["submit", "--", "python t.py"]):
        result = launcher(*command[:1], "--address", "http://127.0.0.1:1", "--token-path", str(token),
                          *command[1:], home=home)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        line = result.stderr.splitlines()[-1]  # submit says which run it is first
        assert line.startswith("launcher: token_path: ")
        assert str(token) in line
        assert "one line" in line
        assert "TO" not in (result.stderr + result.stdout).replace(str(token), "").replace("token", "")


def test_a_ray_auth_token_that_is_not_one_line_is_refused_without_it(home: Path):
    result = subprocess.run([sys.executable, "-m", "launcher", "list", "--address", "http://127.0.0.1:1"],
                            capture_output=True, text=True, cwd=REPO, timeout=120,
                            env={**os.environ, "RAYPULSE_HOME": str(home), "RAY_AUTH_TOKEN": "SECRET\nTWO"})
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert "RAY_AUTH_TOKEN" in line
    assert "SECRET" not in line


# --- exporters the launcher starts under a web config ---------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def write_web_config(ca: trustme.CA, directory: Path, *, users: bool = True, tls: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    server = ca.issue_cert("127.0.0.1", "localhost", "raypulse-exporter")
    server.cert_chain_pems[0].write_to_path(str(directory / "server.crt"))
    server.private_key_pem.write_to_path(str(directory / "server.key"))
    data: dict = {}
    if tls:
        data["tls_server_config"] = {"cert_file": "server.crt", "key_file": "server.key"}  # relative
    if users:
        data["basic_auth_users"] = {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}
    path = directory / "web.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_launchers_copy_lets_it_read_what_others_cannot(ca, tmp_path: Path, home: Path, start_exporter):
    source = write_web_config(ca, tmp_path / "user")
    access = prepare_web_config(source, home / "clusters" / "c1")
    copy = Path(access.web_config)
    assert mode(copy) == 0o600
    assert mode(Path(access.password_file)) == 0o600
    assert mode(home / "clusters" / "c1") == 0o700
    data = yaml.safe_load(copy.read_text())
    assert Path(data["tls_server_config"]["cert_file"]).is_absolute()  # the copy lives elsewhere
    assert set(data["basic_auth_users"]) == {"prometheus", LAUNCHER_USER}
    users = data["basic_auth_users"]
    assert users[LAUNCHER_USER][4:6] == users["prometheus"][4:6]  # one bcrypt cost: login time tells no user apart
    assert yaml.safe_load(source.read_text())["basic_auth_users"].keys() == {"prometheus"}  # the user's file: as it was
    saved = ExporterAccess.model_validate_json(access.model_dump_json())  # as the cluster record keeps it

    exporter = start_exporter("--web-config", str(copy), ready=False, scheme="https")

    def read(path: str) -> int:
        with saved.urlopen(exporter.url + path, timeout=5) as reply:
            return reply.status

    wait_until(lambda: read("/readyz") == 200, 30, "the exporter to answer the launcher")
    assert read("/metrics") == 200
    pinned_elsewhere = saved.model_copy(update={"tls_trust_file": str(tmp_path / "other.crt")})
    trustme.CA().issue_cert("127.0.0.1").cert_chain_pems[0].write_to_path(str(tmp_path / "other.crt"))
    with pytest.raises(urllib.error.URLError):
        pinned_elsewhere.urlopen(exporter.url + "/metrics", timeout=5)
    status, _, _ = http_get(exporter.url + "/metrics", context=saved.ssl_context())  # no credentials
    assert status == 401


def test_a_web_config_without_basic_auth_gets_no_launcher_user(ca, tmp_path: Path, home: Path):
    access = prepare_web_config(write_web_config(ca, tmp_path / "user", users=False), home / "clusters" / "c1")
    assert access.username is None
    assert access.password_file is None
    assert access.scheme == "https"
    assert "basic_auth_users" not in yaml.safe_load(Path(access.web_config).read_text())


# --- `launcher exporters deploy`: the bundle and each node's private directory -------------------------------


def test_the_deploy_bundle_names_its_certificates_and_is_compared_by_digest(ca, tmp_path: Path):
    source = write_web_config(ca, tmp_path / "user")
    first, second = remote.web_config_bundle(source), remote.web_config_bundle(source)
    assert first.sha256 == second.sha256  # a second deploy with the same file changes nothing
    assert first.password != second.password
    assert set(first.files) == {"web-config.yml", "tls.crt", "tls.key"}
    data = yaml.safe_load(first.files["web-config.yml"])
    assert data["tls_server_config"] == {"cert_file": "tls.crt", "key_file": "tls.key"}
    assert first.username in data["basic_auth_users"]
    assert bcrypt.checkpw(first.password.encode(), data["basic_auth_users"][first.username].encode())
    (tmp_path / "bad.yml").write_text("basic_auth_users: {x: plain}\n")
    with pytest.raises(ConfigError):
        remote.web_config_bundle(tmp_path / "bad.yml")


def test_the_deploy_keeps_its_credentials_private_here(ca, tmp_path: Path, home: Path):
    bundle = remote.web_config_bundle(write_web_config(ca, tmp_path / "user"))
    remote.save_access("http://head:8265", bundle)
    access = load_deployment_access("http://head:8265")
    assert access is not None
    assert access.scheme == "https"
    for path in (access.password_file, access.tls_trust_file):
        assert mode(Path(path)) == 0o600
    assert mode(Path(access.password_file).parent) == 0o700


def node_exporter(node_id: str, port: int, web_files: dict[str, str] | None = None, **config) -> NodeExporter:
    """The deploy's node actor without Ray (what runs on each node)."""
    return NodeExporter(node_id, "127.0.0.1", port, "worker",
                        {"dashboard_url": "http://127.0.0.1:1", "cluster": "unit", "start_timeout_s": 30, **config},
                        web_files)


def test_a_node_actor_logs_privately_and_not_through_a_planted_link(tmp_path: Path):
    port = free_port()
    prefix = f"raypulse-exporter-{'cd' * 6}-{port}-"
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    old_path = Path(tempfile.gettempdir()) / f"raypulse-exporter-{'cd' * 6}-{port}.log"  # the old, predictable one
    old_path.unlink(missing_ok=True)
    old_path.symlink_to(victim)
    planted = Path(tempfile.gettempdir()) / f"{prefix}planted"  # someone else's link that looks like ours
    planted.symlink_to(tmp_path)
    crashed = Path(tempfile.mkdtemp(prefix=prefix))  # what a crashed actor of this node left
    node = node_exporter("cd" * 28, port)
    try:
        report = node.ensure()
        assert report["ok"], report
        assert mode(node.directory) == 0o700
        assert mode(node.log) == 0o600
        assert node.log.parent == node.directory
        assert victim.read_text() == "untouched"
        assert not crashed.exists()
        assert planted.is_symlink()  # someone else's: not followed, not removed
        assert tmp_path.is_dir()
    finally:
        node.stop()
        old_path.unlink(missing_ok=True)
        planted.unlink(missing_ok=True)
    assert not node.directory.exists()


def test_a_node_actor_serves_the_bundle_over_tls(ca, tmp_path: Path):
    bundle = remote.web_config_bundle(write_web_config(ca, tmp_path / "user"))
    port = free_port()
    node = node_exporter("ef" * 28, port, bundle.files, tls=True)
    try:
        report = node.ensure()  # /healthz answers 401 to the actor, which holds no password
        assert report["ok"], report
        assert report["url"] == f"https://127.0.0.1:{port}"
        web_config = Path(node.command[node.command.index("--web-config") + 1])
        assert web_config.parent == node.directory
        for name in bundle.files:
            assert mode(node.directory / name) == 0o600
        load_web_config(web_config)
        access = ExporterAccess(tls_trust_file=str(node.directory / "tls.crt"), username=bundle.username,
                                password_file=str(tmp_path / "pw"))
        (tmp_path / "pw").write_text(bundle.password)
        up, version, url = remote.probe(f"127.0.0.1:{port}", access)
        assert (up, url) == (True, f"https://127.0.0.1:{port}")
        assert version  # /metrics read with the launcher's credentials
        up, version, url = remote.probe(f"127.0.0.1:{port}")  # deployed from elsewhere: up, version unknown
        assert (up, version, url) == (True, None, f"https://127.0.0.1:{port}")
    finally:
        node.stop()
    assert not node.directory.exists()
    pid = report["pid"]
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10,
               "the exporter to stop")
