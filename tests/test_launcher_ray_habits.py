"""`ray job` habits of `launcher submit` that need no cluster: Ray's address variables (a dashboard
URL means that existing cluster; a GCS address is refused with the fix), `--no-wait` refused where
the cluster would not outlive the command or where it would drop retries asked for, and shell
completion. The Ray-backed halves are in test_launcher_existing.py and test_launcher_local.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.contract import wire
from launcher.detach import spec_for_no_wait
from launcher.errors import BadInput
from launcher.spec import SpecError, build_spec
from launcher.target import from_environment
from tests.conftest import REPO, free_port
from tests.test_launcher_spec import assert_nothing_started, launcher

DASHBOARD = "http://head:8265"


@pytest.mark.parametrize(("data", "environ", "address"), [
    ({}, {wire.ENV_RAY_ADDRESS: DASHBOARD}, DASHBOARD),
    ({}, {wire.ENV_RAY_API_SERVER_ADDRESS: DASHBOARD, wire.ENV_RAY_ADDRESS: "head:6379"}, DASHBOARD),  # Ray's order
    ({}, {wire.ENV_RAY_API_SERVER_ADDRESS: " ", wire.ENV_RAY_ADDRESS: DASHBOARD}, DASHBOARD),  # empty is unset
    ({"backend": "existing"}, {wire.ENV_RAY_ADDRESS: DASHBOARD}, DASHBOARD),
    ({"address": "http://mine:8265"}, {wire.ENV_RAY_ADDRESS: DASHBOARD}, "http://mine:8265"),  # explicit wins
    ({"backend": "local"}, {wire.ENV_RAY_ADDRESS: "head:6379"}, None),
    ({"backend": "kuberay"}, {wire.ENV_RAY_ADDRESS: DASHBOARD}, None),
    ({"cluster": "dev"}, {wire.ENV_RAY_ADDRESS: DASHBOARD}, None),
    ({}, {}, None),
])
def test_the_address_variables_name_a_cluster_only_when_the_spec_names_none(data, environ, address):
    resolved, taken = from_environment({"entrypoint": "true", **data}, environ)
    assert resolved.get("address") == address
    assert (taken is not None) == (address is not None and "address" not in data)


@pytest.mark.parametrize(("variable", "value", "kind"), [
    (wire.ENV_RAY_ADDRESS, "127.0.0.1:6379", "is a Ray (GCS) address"),
    (wire.ENV_RAY_ADDRESS, "auto", "asks ray.init to find a cluster on this machine"),
    (wire.ENV_RAY_ADDRESS, "ray://head:10001", "is a Ray Client address"),
    (wire.ENV_RAY_API_SERVER_ADDRESS, "head:8265", "is a Ray (GCS) address"),
])
def test_an_address_variable_that_is_no_dashboard_exit_2_with_the_fix(tmp_path: Path, variable, value, kind):
    result = launcher("submit", "--", "python train.py", home=tmp_path, env={variable: value})
    assert f"launcher: {variable}: {value!r} {kind}, not a dashboard URL" in result.stderr
    assert "give --address http://<head>:8265" in result.stderr
    assert "--backend local" in result.stderr
    assert "Traceback" not in result.stderr
    assert_nothing_started(tmp_path, result)


def test_a_dashboard_in_ray_address_is_the_existing_cluster_not_a_local_one(tmp_path: Path):
    address = f"http://127.0.0.1:{free_port()}"  # nothing listens: the check before submitting says so
    result = launcher("submit", "--", "python train.py", home=tmp_path, env={wire.ENV_RAY_ADDRESS: address})
    assert f"{wire.ENV_RAY_ADDRESS} is {address}: submitting to that existing Ray cluster" in result.stderr
    assert f"address: cannot reach the Ray dashboard at {address}" in result.stderr
    assert_nothing_started(tmp_path, result)
    # A field that only a local cluster takes says where the address came from.
    result = launcher("submit", "--keep-cluster", "--", "true", home=tmp_path, env={wire.ENV_RAY_ADDRESS: address})
    assert f"job spec (address from {wire.ENV_RAY_ADDRESS}): keep_cluster: applies to backend local" in result.stderr
    assert result.returncode == 2


@pytest.mark.parametrize(("args", "words"), [
    ((), "--no-wait: the local cluster this submit starts is torn down when the command returns"),
    (("--address", "http://127.0.0.1:1", "--max-retries", "2"), "--no-wait: max_retries needs the launcher"),
    (("--address", "http://127.0.0.1:1", "--active-deadline-seconds", "60"), "--no-wait: active_deadline_seconds"),
    (("--address", "http://127.0.0.1:1", "--hang-after", "600"), "--no-wait: health.hang_after_seconds"),
])
def test_no_wait_is_refused_where_nothing_would_keep_its_promises(tmp_path: Path, args, words):
    result = launcher("submit", "--no-wait", *args, "--", "sleep 60", home=tmp_path)
    assert words in result.stderr
    assert result.stdout == ""
    assert_nothing_started(tmp_path, result)


def test_a_no_wait_run_is_recorded_as_it_will_run():
    job = spec_for_no_wait(build_spec({"entrypoint": "true", "address": DASHBOARD}))
    assert (job.max_attempts, job.health.enabled) == (1, False)  # one attempt, no watcher: nothing follows it
    assert spec_for_no_wait(job) == job
    kept = build_spec({"entrypoint": "true", "keep_cluster": True, "max_retries": 0, "health": {"enabled": False}})
    assert spec_for_no_wait(kept).keep_cluster
    assert spec_for_no_wait(build_spec({"entrypoint": "true", "backend": "kuberay", "max_retries": 2})).max_retries \
        == 2  # KubeRay retries by itself (backoffLimit)
    with pytest.raises(BadInput, match="--no-wait: the local cluster"):
        spec_for_no_wait(build_spec({"entrypoint": "true"}))
    with pytest.raises(SpecError):
        build_spec({"entrypoint": "true", "address": "head:6379"})


def test_shell_completion_script_and_answers():
    env = {**os.environ, "_LAUNCHER_COMPLETE": "bash_source"}
    script = subprocess.run([sys.executable, "-m", "launcher"], env=env, capture_output=True, text=True, cwd=REPO,
                            timeout=60)
    assert script.returncode == 0, script.stderr
    assert "_launcher_completion()" in script.stdout
    assert "complete -o nosort -F _launcher_completion launcher" in script.stdout
    # What the script asks the launcher for as a person types `launcher sub<TAB>` and `launcher submit --no-w<TAB>`.
    for words, word in (("launcher sub", "submit"), ("launcher submit --no-w", "--no-wait")):
        answer = subprocess.run([sys.executable, "-m", "launcher"], capture_output=True, text=True, cwd=REPO,
                                timeout=60, env={**os.environ, "_LAUNCHER_COMPLETE": "bash_complete",
                                                 "COMP_WORDS": words, "COMP_CWORD": "1" if words.count(" ") == 1
                                                 else "2"})
        assert f"plain,{word}" in answer.stdout.splitlines(), answer.stdout
