"""Every place a run can live is one Backend (launcher/backends/): each implements the whole protocol,
the spec's `backend` names exactly the registered ones, no other module compares backend names, and
what a backend does not take or honour is refused before anything starts."""

from __future__ import annotations

import ast
import inspect
import threading
from pathlib import Path
from typing import get_args

import pytest

from launcher import api
from launcher.backends import kinds
from launcher.backends.base import Backend
from launcher.backends.existing import ExistingBackend
from launcher.backends.kuberay.backend import KubeRayBackend
from launcher.backends.local.backend import LocalBackend
from launcher.backends.registry import BACKENDS, resolve
from launcher.errors import BadInput
from launcher.spec import Backend as BackendName
from launcher.spec import SpecError, build_spec
from launcher.target import from_environment

REPO = Path(__file__).resolve().parent.parent


def protocol_members() -> set[str]:
    return {name for name in Backend.__dict__ if not name.startswith("_")} | set(Backend.__annotations__)


@pytest.mark.parametrize("backend", list(BACKENDS.values()), ids=list(BACKENDS))
def test_each_backend_implements_the_whole_protocol(backend: type):
    missing = sorted(name for name in protocol_members() if not hasattr(backend, name))
    assert missing == []
    for name in protocol_members() - set(Backend.__annotations__):
        wanted = inspect.signature(getattr(Backend, name)).parameters.keys() - {"cls"}  # bound on the class
        assert inspect.signature(getattr(backend, name)).parameters.keys() == wanted, name


def test_the_spec_names_exactly_the_registered_backends_and_their_rules():
    assert set(get_args(BackendName)) == set(BACKENDS) == set(kinds.KINDS)
    for name, backend in BACKENDS.items():
        assert issubclass(backend, kinds.KINDS[name])  # the rules the spec checks are the backend's own


def backend_name_literals(path: Path) -> list[int]:
    """Lines where a string constant equal to a backend's name stands, outside an annotation."""
    tree = ast.parse(path.read_text())
    annotations = {id(node) for parent in ast.walk(tree) if isinstance(parent, ast.Assign)
                   and isinstance(parent.value, ast.Subscript) for node in ast.walk(parent.value)}
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and node.value in BACKENDS and id(node) not in annotations]


def test_no_module_outside_the_backends_compares_backend_names():
    found = {str(path.relative_to(REPO)): lines for path in sorted((REPO / "launcher").rglob("*.py"))
             if "backends" not in path.parts and (lines := backend_name_literals(path))}
    assert found == {}, "ask the spec's backend (launcher.backends.registry.resolve) instead of comparing its name"


@pytest.mark.parametrize(("data", "backend"), [
    ({}, LocalBackend),
    ({"address": "http://head:8265"}, ExistingBackend),
    ({"backend": "kuberay"}, KubeRayBackend),
    ({"backend": "existing", "address": "http://head:8265"}, ExistingBackend),
])
def test_a_spec_resolves_to_its_backend(data: dict, backend: type):
    spec = build_spec({"entrypoint": "true", **data}).with_run_id()
    resolved = resolve(spec)
    assert type(resolved) is backend
    assert resolved.spec is spec


# A value for each field some backend takes (exporter_web_config is a file, read as the spec is checked:
# tests/test_launcher_spec.py has it).
FIELD_VALUES = {"address": "http://head:8265", "cluster": "dev", "token_path": "/t", "keep_cluster": True,
                "simulate_gpus": True, "queue": "q", "release": "kps", "exporter_image": "img",
                "otlp_endpoint": "http://c:4318", "checkpoint_dir": "/ckpt", "exporter_web_config_secret": "web",
                "context": "kind-dev", "pod_template": {"spec": {"priorityClassName": "high"}},
                "entrypoint_memory": 2**30, "headers": {"X-Team": "nlp"}, "verify": True}


def test_every_field_a_backend_takes_is_tried():
    taken = set().union(*(backend.takes for backend in BACKENDS.values()))
    assert taken - set(FIELD_VALUES) == {"exporter_web_config"}


@pytest.mark.parametrize(("field", "value"), sorted(FIELD_VALUES.items()))
def test_a_field_only_some_backends_take_is_refused_by_the_others_naming_them(field: str, value: object):
    taking = [name for name, backend in BACKENDS.items() if field in backend.takes]
    for name, backend in BACKENDS.items():
        if field in backend.takes:
            continue
        target = {"address": "http://head:8265"} if name == ExistingBackend.name and field != "address" else {}
        with pytest.raises(SpecError, match=f"{field}: applies to backend {' or '.join(taking)} only; this job's "
                                            f"backend is {name}"):
            build_spec({"entrypoint": "true", "backend": name, field: value, **target,
                        "worker_groups": [{"gpus": 1}]})


def test_the_environment_address_applies_only_where_an_address_is_taken():
    environ = {"RAY_ADDRESS": "http://head:8265"}
    assert from_environment({}, environ)[1] is not None
    assert from_environment({"backend": ExistingBackend.name}, environ)[1] is not None
    assert from_environment({"backend": LocalBackend.name}, environ)[1] is None
    assert from_environment({"backend": KubeRayBackend.name}, environ)[1] is None


def test_no_wait_asks_the_backend(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    from launcher.detach import spec_for_no_wait

    with pytest.raises(BadInput, match="--no-wait: the local cluster this submit starts is torn down"):
        spec_for_no_wait(build_spec({"entrypoint": "true"}).with_run_id())
    kuberay = build_spec({"entrypoint": "true", "backend": "kuberay", "max_retries": 2}).with_run_id()
    assert spec_for_no_wait(kuberay) is kuberay  # KubeRay supervises it: nothing is changed
    existing = spec_for_no_wait(build_spec({"entrypoint": "true", "address": "http://head:8265"}).with_run_id())
    assert existing.max_retries == 0
    assert not existing.health.enabled


def test_the_api_refuses_a_handed_off_backend_before_anything_is_recorded(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    with pytest.raises(BadInput, match="backend: kuberay runs are handed off, not followed"):
        api.submit({"entrypoint": "true", "backend": "kuberay", "run_id": "handed"}, cancel=threading.Event())
    assert not any(tmp_path.rglob("run.json"))


def test_a_local_run_that_ended_with_its_cluster_gone_is_not_continued(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    from launcher.state import RunRecord

    RunRecord(run_id="done", name="job", backend=LocalBackend.name, state="SUCCEEDED", exit_code=0).save()
    backend = resolve(build_spec({"entrypoint": "true", "run_id": "done"}))
    with pytest.raises(BadInput, match="run_id: run done already ended SUCCEEDED"):
        backend.run_record()
    fresh = resolve(build_spec({"entrypoint": "true", "run_id": "other"})).run_record()
    assert (fresh.run_id, fresh.backend, fresh.exit_code) == ("other", LocalBackend.name, None)


def test_a_recorded_run_is_reached_through_its_backend(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    from launcher.state import RunRecord

    gone = RunRecord(run_id="gone", name="job", backend=LocalBackend.name, cluster="gone")
    assert LocalBackend.reach(gone) is None  # its cluster is down: the saved record and logs answer
    assert KubeRayBackend.reach(gone) is None
