"""`ray job submit`'s flags on `launcher submit`: each lands in the spec (flags and a spec file alike),
in the Jobs API submission (local and existing clusters) and in the RayJob (KubeRay); what a backend
cannot honour, bad JSON and a reserved metadata key are one-line errors (exit 2) before anything
starts; --headers reach the dashboard and never the run's record. No Ray cluster: a fake dashboard
answers the Jobs API client (tests/test_submit_parity_ray.py carries them to a real cluster)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import jsonschema
import pytest
import yaml

from launcher.backends.kuberay.render import render
from launcher.cli import _reporter
from launcher.display import PlainReporter
from launcher.flags import spec_from_options
from launcher.jobs import JobsClient
from launcher.run import entrypoint_options, job_metadata, submission_id
from launcher.spec import JobSpec, SpecError, build_spec
from launcher.submission import run_id_of
from tests.launcher_support import launcher
from tests.schemas import strict

SCHEMA_FILE = Path(__file__).parent / "data" / "kuberay" / "rayjob-v1-openapi.json"
PARITY_FLAGS = {"submission_id": "raysubmit_Parity.1", "metadata_json": '{"a": "b", "team": "nlp"}',
                "entrypoint_num_cpus": 0.5, "entrypoint_num_gpus": 1.0, "entrypoint_resources": '{"accel": 2}'}


def test_flags_and_a_spec_file_set_the_same_fields(tmp_path: Path):
    from_flags = spec_from_options(None, {"command": ("python", "t.py"), **PARITY_FLAGS, "entrypoint_memory": 2**30,
                                          "log_style": "record", "log_color": "false"})
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump({
        "entrypoint": "python t.py", "submission_id": "raysubmit_Parity.1", "metadata": {"a": "b", "team": "nlp"},
        "entrypoint_num_cpus": 0.5, "entrypoint_num_gpus": 1, "entrypoint_resources": {"accel": 2},
        "entrypoint_memory": 2**30, "log_style": "record", "log_color": "false"}))
    from_file = spec_from_options(spec_file, {})
    assert from_flags.model_dump() == from_file.model_dump()
    assert (from_flags.entrypoint_num_gpus, from_flags.metadata, from_flags.entrypoint_resources) == \
        (1.0, {"a": "b", "team": "nlp"}, {"accel": 2.0})


def test_the_submission_carries_them_beside_the_launchers_metadata():
    spec = spec_from_options(None, {"command": ("true",), **PARITY_FLAGS, "entrypoint_memory": 1000}).with_run_id()
    assert entrypoint_options(spec) == {"entrypoint_num_cpus": 0.5, "entrypoint_num_gpus": 1.0,
                                        "entrypoint_memory": 1000, "entrypoint_resources": {"accel": 2.0}}
    metadata = job_metadata(spec, attempt=2)
    assert metadata["a"] == "b"
    assert metadata["raypulse.attempt"] == "2"
    assert metadata["raypulse.run_id"] == spec.run_id
    # Nothing set: Ray's own defaults (the keys are left out).
    assert entrypoint_options(build_spec({"entrypoint": "true"})) == {}


def test_the_submission_id_rule():
    """Attempt 1 is the user's id exactly, later ones <id>-a<N>; without --run-id the run id is derived
    from it, the same every time (a resubmit follows that run); --run-id alone keeps <run>-a<N>."""
    assert [submission_id("r", n, "raysubmit_X") for n in (1, 2, 3)] == ["raysubmit_X", "raysubmit_X-a2",
                                                                         "raysubmit_X-a3"]
    assert submission_id("r", 2) == "r-a2"
    spec = build_spec({"entrypoint": "true", "submission_id": "raysubmit_X"}).with_run_id()
    again = build_spec({"entrypoint": "true", "submission_id": "raysubmit_X"}).with_run_id()
    assert spec.run_id == run_id_of("raysubmit_X") == again.run_id
    assert build_spec({"entrypoint": "true", "submission_id": "my-job-7"}).with_run_id().run_id == "my-job-7"
    assert build_spec({"entrypoint": "true", "submission_id": "x", "run_id": "mine"}).with_run_id().run_id == "mine"
    assert run_id_of("raysubmit_X") != run_id_of("raysubmit_x")  # distinct ids stay distinct runs
    long_id = run_id_of("A" * 128)
    assert len(long_id) <= 47
    assert build_spec({"entrypoint": "true", "run_id": long_id})


def test_the_rayjob_has_them_and_validates_against_the_crd():
    spec = build_spec({"entrypoint": "true", "backend": "kuberay", "submission_id": "raysubmit_X",
                       "metadata": {"a": "b"}, "entrypoint_num_cpus": 1, "entrypoint_num_gpus": 1,
                       "entrypoint_resources": {"accel": 2}}).with_run_id()
    rayjob = next(item for item in render(spec) if item["kind"] == "RayJob")
    assert rayjob["spec"]["jobId"] == "raysubmit_X"
    assert (rayjob["spec"]["entrypointNumCpus"], rayjob["spec"]["entrypointNumGpus"]) == (1.0, 1.0)
    assert json.loads(rayjob["spec"]["entrypointResources"]) == {"accel": 2.0}
    assert rayjob["spec"]["metadata"]["a"] == "b"
    assert rayjob["spec"]["metadata"]["raypulse.run_id"] == spec.run_id
    validator = jsonschema.Draft7Validator(strict(json.loads(SCHEMA_FILE.read_text())))
    assert not [error.message for error in validator.iter_errors(rayjob)]
    plain = next(item for item in render(build_spec({"entrypoint": "true", "backend": "kuberay", "run_id": "p"}))
                 if item["kind"] == "RayJob")
    assert not {"jobId", "entrypointNumCpus", "entrypointNumGpus", "entrypointResources"} & set(plain["spec"])


@pytest.mark.parametrize(("data", "says"), [
    ({"backend": "kuberay", "entrypoint_memory": 1000}, "entrypoint_memory: applies to backend local or existing"),
    ({"headers": {"X-A": "1"}}, "headers: applies to backend existing only"),
    ({"cluster": "dev", "verify": False}, "headers: --headers and --verify are for a dashboard given by --address"),
    ({"metadata": {"raypulse.run_id": "x"}}, "metadata: key 'raypulse.run_id' is reserved"),
    ({"entrypoint_resources": {"GPU": 1}}, "entrypoint_resources: 'GPU' is not a custom resource"),
    ({"submission_id": "has space"}, "submission_id: 'has space' must be"),
    ({"address": "http://h:8265", "verify": "/no/such/ca.pem"}, "verify: '/no/such/ca.pem' is neither"),
])
def test_what_cannot_be_honoured_is_refused(data: dict, says: str):
    with pytest.raises(SpecError, match=says.replace("(", r"\(")):
        build_spec({"entrypoint": "true", **data})


@pytest.mark.parametrize(("flag", "value"), [("--metadata-json", "{nope"), ("--entrypoint-resources", "[1]"),
                                             ("--headers", '{"Authorization": "Bearer s3cr3t"')])
def test_bad_json_is_one_line_naming_the_flag_exit_2(tmp_path: Path, flag: str, value: str):
    result = launcher("submit", "--address", "http://127.0.0.1:9", flag, value, "--", "true", home=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"launcher: {flag}:"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "s3cr3t" not in result.stderr


def test_kuberay_refuses_entrypoint_memory_before_anything_is_applied(tmp_path: Path):
    result = launcher("submit", "--backend", "kuberay", "--entrypoint-memory", "1000", "--", "true", home=tmp_path)
    assert result.returncode == 2
    assert "entrypoint_memory: applies to backend local or existing only" in result.stderr
    assert "a RayJob has no field" in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


class _Dashboard(BaseHTTPRequestHandler):
    """Answers like a Ray dashboard's version and jobs endpoints; keeps every request's headers."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        self.seen.append(dict(self.headers))
        body = json.dumps({"ray_version": "2.40.0", "version": "4", "session_name": "s"} if self.path.startswith(
            "/api/version") else []).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def dashboard() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Dashboard.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_headers_reach_the_dashboard_and_the_token_wins(dashboard: str):
    client = JobsClient(dashboard, "tok", headers={"X-Proxy-Auth": "p", "Authorization": "mine"}, verify=False)
    client.list()  # through Ray's own client
    assert len(_Dashboard.seen) >= 3
    assert all(seen.get("X-Proxy-Auth") == "p" and seen.get("Authorization") == "Bearer tok"
               for seen in _Dashboard.seen)


def test_headers_stay_out_of_the_record_and_reprs():
    spec = build_spec({"entrypoint": "true", "address": "http://h:8265", "headers": {"X-Key": "s3cr3t"},
                       "verify": False})
    assert spec.headers == {"X-Key": "s3cr3t"}
    assert "s3cr3t" not in json.dumps(spec.model_dump(mode="json"))
    assert "s3cr3t" not in repr(spec)
    assert spec.model_dump(mode="json")["verify"] is False


def test_log_style_record_is_plain_lines():
    spec = JobSpec(entrypoint="true", log_style="record")
    assert type(_reporter(spec)) is PlainReporter
