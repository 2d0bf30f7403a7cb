"""The job spec and the command line that fills it: validation that names the field, the one
command line rule for entrypoints, and bad input refused with exit 2 before anything starts.
No Ray cluster is started here."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from launcher import audit
from launcher.cli import main
from launcher.entrypoint import EntrypointError, validate_entrypoint
from launcher.flags import SPEC_OPTIONS, default, parse_worker_group, spec_from_options
from launcher.spec import JobSpec, SpecError, build_spec, format_memory, parse_memory
from tests.conftest import REPO, free_port

META_OPTIONS = {"file", "no_wait", "output"}  # submit's options that are not spec fields (how the command ends,
# what it prints)


def leaf_fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every field path of the spec, nested models (and lists of them) expanded."""
    paths = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        inner = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            paths |= leaf_fields(inner, f"{prefix}{name}{'[]' if inner is not annotation else ''}.")
        else:
            paths.add(prefix + name)
    return paths


def test_every_submit_option_is_a_spec_field_and_every_field_has_an_option():
    submit = main.commands["submit"]
    params = {param.name for param in submit.params} - META_OPTIONS
    assert params == set(SPEC_OPTIONS), "a submit option without a spec field, or a stale mapping entry"
    leaves = leaf_fields(JobSpec)
    covered = {leaf for leaf in leaves for path in SPEC_OPTIONS.values() if leaf == path or leaf.startswith(path)}
    assert covered == leaves, f"spec fields without a command-line option: {sorted(leaves - covered)}"
    for path in SPEC_OPTIONS.values():
        assert any(leaf == path or leaf.startswith(path) for leaf in leaves), f"{path} is not a spec field"


def test_flags_and_a_spec_file_give_the_same_spec(tmp_path: Path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump({
        "name": "mnist", "entrypoint": "python train.py --epochs 2", "max_retries": 2,
        "worker_groups": [{"count": 3, "cpus": 2, "gpus": 1, "memory": "4Gi", "resources": {"accel": 1}}],
        "runtime_env": {"pip": ["numpy"], "env_vars": {"A": "1"}}, "labels": {"team": "vision"},
    }))
    from_file = spec_from_options(spec_file, {})
    from_flags = spec_from_options(None, {
        "name": "mnist", "command": ("python", "train.py", "--epochs", "2"), "max_retries": 2, "workers": 3,
        "worker_cpus": 2.0, "worker_gpus": 1, "worker_memory": "4Gi", "worker_resource": ("accel=1",),
        "pip": ("numpy",), "env": ("A=1",), "label": ("team=vision",)})
    assert from_file == from_flags
    assert from_file.worker_groups[0].memory == 4 * 2**30
    # Flags win over the file's fields.
    assert spec_from_options(spec_file, {"workers": 5}).worker_groups[0].count == 5


def test_worker_group_flag_uses_pai_dlc_role_syntax():
    assert parse_worker_group("gpu:count=2,cpus=8,gpus=1,memory=32Gi,resource.accel=1") == {
        "name": "gpu", "count": "2", "cpus": "8", "gpus": "1", "memory": "32Gi", "resources": {"accel": "1"}}
    spec = spec_from_options(None, {"command": ("true",), "worker_group": ("cpu:count=2", "gpu:count=1,gpus=2")})
    assert [(group.name, group.count, group.gpus) for group in spec.worker_groups] == [("cpu", 2, 0), ("gpu", 1, 2)]
    with pytest.raises(SpecError, match="worker_groups: give either --worker-group or"):
        spec_from_options(None, {"command": ("true",), "worker_group": ("cpu:count=2",), "workers": 3})


def submit_spec(*args: str) -> JobSpec:
    """The spec `launcher submit ARGS` runs, from click's own parsing of the flags."""
    params = dict(main.commands["submit"].make_context("submit", list(args)).params)
    params.pop("no_wait")
    params.pop("output")
    return spec_from_options(params.pop("file"), params)


def test_a_flag_given_as_zero_sets_its_field_to_zero(tmp_path: Path):
    """`--max-retries 0` once fell through to the default: 0 is a value, only a flag not given is not."""
    spec = submit_spec("--max-retries", "0", "--retry-backoff", "0", "--retry-backoff-max", "0", "--workers", "0",
                       "--", "python", "train.py")
    assert (spec.max_retries, spec.retry_backoff_seconds, spec.retry_backoff_max_seconds) == (0, 0, 0)
    assert spec.worker_groups[0].count == 0
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump({"entrypoint": "python train.py", "max_retries": 2, "retry_backoff_seconds": 5,
                                         "worker_groups": [{"count": 2, "gpus": 1}]}))
    over_file = submit_spec("-f", str(spec_file), "--max-retries", "0", "--retry-backoff", "0", "--worker-gpus", "0")
    assert (over_file.max_retries, over_file.retry_backoff_seconds) == (0, 0)
    assert (over_file.worker_groups[0].count, over_file.worker_groups[0].gpus) == (2, 0)


def test_flags_not_given_leave_the_fields_default():
    assert submit_spec("--", "true") == build_spec({"entrypoint": "true", "user": JobSpec(entrypoint="true").user})


def test_a_run_with_its_own_prometheus_is_recorded_only_when_record_on_is_asked_for():
    base = {"name": "x", "entrypoint": "python train.py"}
    assert build_spec(base).recorded
    assert not build_spec({**base, "prometheus": "http://prom:9090"}).recorded  # reports read it: not twice
    assert build_spec({**base, "prometheus": "http://prom:9090", "record": "on"}).with_run_id().recorded
    assert not submit_spec("--prometheus", "http://prom:9090", "--", "true").recorded
    assert submit_spec("--prometheus", "http://prom:9090", "--record", "on", "--", "true").recorded
    assert not build_spec({**base, "record": "off"}).recorded


def test_the_help_shows_every_fixed_default_of_the_spec():
    """--help reads its defaults from the spec's fields; a default computed at run time is said in words."""
    helps = {param.name: param.help or "" for param in main.commands["submit"].params if param.name in SPEC_OPTIONS}
    for option, text in helps.items():
        try:
            value = default(option)
        except ValueError:  # None, or computed (the login name, the image)
            continue
        if value not in ("True", "False"):  # on/off flags say what they turn
            assert f"[{value}" in text, f"--{option.replace('_', '-')}: {text!r} does not show [{value}]"
    assert {default(option) for option in ("max_retries", "retry_backoff", "retry_backoff_max", "head_memory",
                                           "hang_after", "exporter_port", "on_hang")} == {
        "3", "10", "300", "2Gi", "900", "9477", "restart"}
    assert "[900, as the alert rule]" in helps["hang_after"]
    assert "[login name]" in helps["user"]


@pytest.mark.parametrize(("size", "expected"), [("512Mi", 512 * 2**20), ("4Gi", 4 * 2**30), ("2G", 2 * 10**9),
                                                ("1.5Gi", int(1.5 * 2**30)), (1024, 1024), ("100", 100)])
def test_memory_sizes(size, expected):
    assert parse_memory(size) == expected


def test_a_null_memory_means_unset():
    spec = build_spec({"entrypoint": "python a.py", "worker_groups": [{"memory": None}]})
    assert spec.worker_groups[0].memory is None


def test_memory_renders_as_kubernetes_quantity():
    assert format_memory(4 * 2**30) == "4Gi"
    assert format_memory(1536 * 2**20) == "1536Mi"
    assert format_memory(1000) == "1000"


@pytest.mark.parametrize(("data", "field", "words"), [
    ({"entrypoint": "python a.py", "worker_groups": [{"cpus": -1}]}, "worker_groups[0].cpus", "greater than 0"),
    ({"entrypoint": "python a.py", "worker_groups": [{"memry": "4Gi"}]}, "worker_groups[0].memry", "unknown field"),
    ({"entrypoint": "python a.py", "worker_groups": [{"memory": "lots"}]}, "worker_groups[0].memory",
     "not a memory size"),
    ({"entrypoint": "python a.py", "name": "My Job"}, "name", "start with a letter"),
    ({"entrypoint": "python a.py", "labels": {"Team": "x"}}, "labels", "snake_case"),
    ({"entrypoint": "python a.py", "labels": {"team": "a b"}}, "labels", "team='a b'"),
    ({"entrypoint": "python a.py", "head": {"resources": {"GPU": 1}}}, "head.resources", "own field"),
    ({"entrypoint": "python a.py", "address": "http://h:8265", "keep_cluster": True}, "keep_cluster",
     "applies to backend local or kuberay"),
    ({"entrypoint": "python a.py", "simulate_gpus": True}, "simulate_gpus", "no worker has GPUs"),
    ({"entrypoint": "python a.py", "backend": "kuberay", "queue": "q", "keep_cluster": True}, "queue", "Kueue"),
    ({"entrypoint": "python a.py", "active_deadline_seconds": 0}, "active_deadline_seconds", "greater than"),
    ({"entrypoint": "python a.py\npython b.py"}, "entrypoint", "line 2 (`python b.py`) starts another command"),
    ({}, "entrypoint", "required"),
    # health policies that cannot work
    ({"entrypoint": "python a.py", "max_retries": 0, "health": {"on_hang": "restart"}}, "health.on_hang",
     "restart needs retries to spend, and max_retries is 0"),
    ({"entrypoint": "python a.py", "health": {"silence_after_seconds": 20}}, "health.silence_after_seconds",
     "below 3 checks of health.check_interval_seconds (10s)"),
    ({"entrypoint": "python a.py", "health": {"check_interval_seconds": 0.1}}, "health.check_interval_seconds",
     "greater than or equal to 0.5"),
    ({"entrypoint": "python a.py", "health": {"on_hang": "reboot"}}, "health.on_hang", "'restart', 'stop' or 'report'"),
    ({"entrypoint": "python a.py", "address": "http://h:8265", "checkpoint_dir": "ckpt"}, "checkpoint_dir",
     "absolute path every node can reach, or a URI"),
    ({"entrypoint": "python a.py", "worker_groups": [{"memory": -5}]}, "worker_groups[0].memory",
     "greater than or equal to 0"),
])
def test_spec_errors_name_the_field(data, field, words):
    with pytest.raises(SpecError) as error:
        build_spec(data)
    assert f"job spec: {field}: " in str(error.value)
    assert words in str(error.value)


# --- the entrypoint: one shell command line --------------------------------------------------------

INLINE_SCRIPT = """echo 'import sys
total = sum(range(10))
print("total", total)
' > job.py && python job.py"""


@pytest.mark.parametrize("command", [
    "python train.py --lr 0.1",
    "pip install -r requirements.txt && python train.py; echo done",
    INLINE_SCRIPT,
    'python -c "import os\nprint(os.getcwd())"',
    "python train.py \\\n  --epochs 3",
    "python train.py\n# a comment line is not a command",
    "python train.py\n",  # YAML block scalars end with a newline
])
def test_one_command_line_is_accepted(command):
    assert validate_entrypoint(command) == command.strip()


@pytest.mark.parametrize(("command", "line"), [
    ("python a.py\npython b.py", 2),
    ("echo 'a\nb'\npython b.py", 3),
    ("cd src\n\n  python b.py", 3),
    ("python - <<EOF\nprint(1)\nEOF", 2),
])
def test_several_command_lines_are_refused_with_advice(command, line):
    with pytest.raises(EntrypointError, match=f"line {line} .* starts another command line.*join commands with"):
        validate_entrypoint(command)


def test_unterminated_quote_is_refused():
    with pytest.raises(EntrypointError, match="unterminated ' quote"):
        validate_entrypoint("echo 'oops")


arguments = st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                             min_size=1), min_size=1, max_size=5)


@given(arguments)
def test_any_quoted_command_is_one_line(args):
    """Whatever its arguments hold (newlines included), a properly quoted command is one line."""
    command = shlex.join(["python", *args])
    assert validate_entrypoint(command) == command.strip()


@given(st.lists(arguments, min_size=2, max_size=4))
def test_commands_on_separate_lines_are_refused(commands):
    lines = [shlex.join(["python", *args]) for args in commands]
    second = lines[0].count("\n") + 2  # physical line where the second command starts
    with pytest.raises(EntrypointError, match=f"line {second} "):
        validate_entrypoint("\n".join(lines))


# --- the command line refuses bad input before anything starts ------------------------------------


def launcher(*args: str, home: Path, **kwargs) -> subprocess.CompletedProcess:
    # Without Ray's address variables: with one set, `launcher submit` would go to that cluster.
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env = {**env, "RAYPULSE_HOME": str(home), **kwargs.pop("env", {})}
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60, **kwargs)


def assert_nothing_started(home: Path, result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 2, result.stderr
    assert not (home / "clusters").exists() or not any((home / "clusters").iterdir())
    last = json.loads((home / "audit.log").read_text().splitlines()[-1])
    assert last["result"] == "bad input"


def test_several_command_lines_exit_2_and_start_nothing(tmp_path: Path):
    result = launcher("submit", "--", "python prepare.py\npython train.py", home=tmp_path)
    assert "entrypoint: line 2 (`python train.py`) starts another command line" in result.stderr
    assert "join commands with `&&` or `;`" in result.stderr
    assert_nothing_started(tmp_path, result)


def test_broken_spec_file_exit_2_names_the_field(tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: mnist\nentrypoint: python train.py\nworker_groups:\n  - count: 2\n    cpus: -4\n")
    result = launcher("submit", "-f", str(spec), home=tmp_path)
    assert f"{spec}: worker_groups[0].cpus: Input should be greater than 0" in result.stderr
    assert_nothing_started(tmp_path, result)


@pytest.mark.parametrize(("flags", "field"), [
    (["--head-cpus", "inf"], "head.cpus"),  # OverflowError tracebacks before
    (["--worker-cpus", "1e309"], "worker_groups[0].cpus"),
    (["--entrypoint-num-gpus", "1e309"], "entrypoint_num_gpus"),  # rendered `.inf` into the RayJob before
    (["--head-resource", "x=nan"], "head.resources.x"),
    (["--hang-after", "inf"], "health.hang_after_seconds"),
])
@pytest.mark.parametrize("command", ["submit", "render"])
def test_a_number_that_is_not_finite_exit_2_names_the_field(tmp_path: Path, command, flags, field):
    result = launcher(command, *flags, "--", "python", "train.py", home=tmp_path)
    assert "Traceback" not in result.stderr
    assert f"job spec: {field}: Input should be a finite number" in result.stderr
    assert result.stdout == ""
    assert_nothing_started(tmp_path, result)


def test_a_spec_file_with_yaml_infinity_exit_2_names_the_field(tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text("entrypoint: python train.py\nhead: {cpus: .inf}\nretry_backoff_seconds: .nan\n")
    result = launcher("render", "-f", str(spec), home=tmp_path)
    assert f"{spec}: head.cpus: Input should be a finite number" in result.stderr
    assert f"{spec}: retry_backoff_seconds: Input should be a finite number" in result.stderr
    assert_nothing_started(tmp_path, result)


def test_not_yaml_exit_2(tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: [unclosed\n")
    result = launcher("submit", "-f", str(spec), home=tmp_path)
    assert "not valid YAML" in result.stderr
    assert_nothing_started(tmp_path, result)


@pytest.mark.parametrize(("content", "words"), [
    (None, "cannot read: No such file or directory"),
    (b"name: \xff\n", "not UTF-8 text (byte 6); save it as UTF-8"),
    (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
    (b"- python train.py\n", "the top level must be a mapping of fields (name, entrypoint, ...), got list"),
])
def test_a_spec_file_that_cannot_be_read_is_named_with_what_is_wrong(tmp_path: Path, content, words):
    spec = tmp_path / "job.yaml"
    if content is not None:
        spec.write_bytes(content)
    with pytest.raises(SpecError) as error:
        spec_from_options(spec, {"command": ("true",)})
    assert f"job spec {spec}: {words}" in str(error.value)


def test_an_empty_spec_file_is_an_empty_mapping(tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text("# nothing yet\n")
    assert spec_from_options(spec, {"command": ("true",)}).entrypoint == "true"


def test_a_taken_exporter_port_exit_2_before_any_node_starts(tmp_path: Path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = launcher("submit", "--exporter-port", str(port), "--progress-port", str(free_port()), "--", "true",
                          home=tmp_path)
    assert f"exporter_port: port {port} (head's exporter) is in use" in result.stderr
    assert_nothing_started(tmp_path, result)


def test_an_unreachable_cluster_exit_2(tmp_path: Path):
    address = f"http://127.0.0.1:{free_port()}"
    result = launcher("submit", "--address", address, "--", "true", home=tmp_path)
    assert f"address: cannot reach the Ray dashboard at {address}" in result.stderr
    assert_nothing_started(tmp_path, result)


def test_a_missing_working_dir_exit_2(tmp_path: Path):
    result = launcher("submit", "--working-dir", str(tmp_path / "nope"), "--", "python train.py", home=tmp_path)
    assert f"working_dir: {tmp_path / 'nope'} is not a directory" in result.stderr
    assert_nothing_started(tmp_path, result)


def test_a_checkpoint_dir_the_nodes_cannot_write_exit_2(tmp_path: Path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    result = launcher("submit", "--checkpoint-dir", str(blocked / "ckpt"), "--", "python train.py", home=tmp_path)
    assert f"checkpoint_dir: cannot write checkpoints to {blocked / 'ckpt'}" in result.stderr
    assert_nothing_started(tmp_path, result)


def web_config_files(directory: Path, client_auth: str | None = None) -> Path:
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(directory / "server.crt"))
    server.private_key_pem.write_to_path(str(directory / "server.key"))
    ca.cert_pem.write_to_path(str(directory / "ca.crt"))
    tls = {"cert_file": "server.crt", "key_file": "server.key"}
    if client_auth:
        tls.update(client_auth_type=client_auth, client_ca_file="ca.crt")
    path = directory / "web.yml"
    path.write_text(yaml.safe_dump({"tls_server_config": tls}))
    return path


@pytest.mark.parametrize(("content", "words"), [
    (None, "cannot read: No such file or directory"),
    ("basic_auth_users:\n  prometheus: not-a-hash\n", "bcrypt hash"),
    ("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n", "cannot load the certificate and key"),
    ("- a list\n", "web config file"),
])
@pytest.mark.parametrize("command", ["submit", "up"])
def test_a_web_config_that_cannot_work_exit_2_before_anything_starts(tmp_path: Path, content, words, command):
    path = tmp_path / "web.yml"
    if content is not None:
        path.write_text(content)
    result = launcher(command, "--exporter-web-config", str(path), "--", "python train.py", home=tmp_path)
    assert "job spec: exporter_web_config: " in result.stderr
    assert str(path) in result.stderr
    assert words in result.stderr
    assert "leave --exporter-web-config out" in result.stderr
    assert_nothing_started(tmp_path, result)


def test_a_web_config_the_watcher_cannot_read_through_is_refused_unless_it_is_off(tmp_path: Path):
    path = web_config_files(tmp_path, client_auth="RequireAndVerifyClientCert")
    with pytest.raises(SpecError, match=r"exporter_web_config: .*RequireAndVerifyClientCert.*--no-health"):
        build_spec({"entrypoint": "python train.py", "exporter_web_config": str(path)})
    assert build_spec({"entrypoint": "python train.py", "exporter_web_config": str(path),
                       "health": {"enabled": False}}).exporter_web_config == path
    optional = web_config_files(tmp_path, client_auth="VerifyClientCertIfGiven")
    assert build_spec({"entrypoint": "true", "exporter_web_config": str(optional)}).exporter_web_config == optional


def test_a_web_config_is_kept_as_an_absolute_path(tmp_path: Path, monkeypatch):
    web_config_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    spec = spec_from_options(None, {"command": ("true",), "exporter_web_config": Path("web.yml")})
    assert spec.exporter_web_config == tmp_path / "web.yml"


@pytest.mark.parametrize(("data", "words"), [
    ({"exporter_web_config": "/x.yml", "address": "http://h:8265"}, "exporters deploy --web-config"),
    ({"exporter_web_config_secret": "web"}, "applies to backend kuberay only"),
    ({"exporter_web_config_secret": "Not_A_Name", "backend": "kuberay"}, "is not a Kubernetes Secret name"),
])
def test_each_backend_takes_its_own_kind_of_web_config(data, words):
    with pytest.raises(SpecError, match=words):
        build_spec({"entrypoint": "true", **data})


def test_health_defaults_follow_the_alert_rules_and_keep_a_long_run_going():
    from alerts.config import DEFAULT

    spec = build_spec({"entrypoint": "python train.py"})
    assert spec.health.hang_after_seconds == DEFAULT.tune("RaypulseTrainingStalled").age.seconds
    assert spec.health.silence_after_seconds == DEFAULT.tune("RaypulseJobDriverLogSilent").age.seconds
    assert (spec.health.on_hang, spec.health.on_gpu_fault, spec.health.on_node_lost, spec.max_retries) == \
        ("restart", "restart", "restart", 3)
    # Turning retries off makes the default restarts stop the run instead (no refusal: nothing asked for them).
    assert build_spec({"entrypoint": "python train.py", "max_retries": 0}).health.on_hang == "restart"


def test_unknown_option_is_a_usage_error_not_part_of_the_command(tmp_path: Path):
    result = launcher("submit", "--wokers", "2", "--", "python train.py", home=tmp_path)
    assert result.returncode == 2
    assert "No such option '--wokers'" in result.stderr


def test_unknown_run_exit_2(tmp_path: Path):
    result = launcher("status", "no-such-run", home=tmp_path)
    assert result.returncode == 2
    assert "run_id: no run 'no-such-run' is recorded here" in result.stderr


def test_audit_lines_say_when_who_what_and_result(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    audit.record("submit", "bad input", error="entrypoint: empty")
    [line] = audit.read()
    assert {"time", "user", "host", "action", "result"} <= set(line)
    assert (line["action"], line["result"], line["error"]) == ("submit", "bad input", "entrypoint: empty")


@pytest.mark.parametrize("name", ["abc\n", "train\n"])
def test_name_with_a_trailing_newline_is_not_a_dns_label(name):
    # re.match with `$` lets "abc\n" through (issue 41, finding 9): the rule is a fullmatch.
    with pytest.raises(SpecError, match="must start with a letter"):
        build_spec({"name": name, "entrypoint": "python train.py"})
