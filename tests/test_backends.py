"""Every place a run can live is one Backend (launcher/backends/): each implements the whole protocol
(with the part its capability `followed` says), the spec's `backend` takes exactly the registered ones,
no other module compares backend names (as strings or through a backend's `name`), and what a backend
does not take or honour is refused before anything starts."""

from __future__ import annotations

import ast
import inspect
import threading
from pathlib import Path

import pytest

from launcher import api
from launcher.backends import kinds
from launcher.backends.base import Backend, Followed, HandedOff
from launcher.backends.existing import ExistingBackend
from launcher.backends.kuberay.backend import KubeRayBackend
from launcher.backends.local.backend import LocalBackend
from launcher.backends.registry import BACKENDS, resolve
from launcher.errors import BadInput
from launcher.spec import SpecError, build_spec
from launcher.target import from_environment

REPO = Path(__file__).resolve().parent.parent


def protocol_members(protocol: type) -> set[str]:
    members = set()
    for layer in protocol.__mro__:
        if layer in (Backend, Followed, HandedOff):
            members |= {name for name in layer.__dict__ if not name.startswith("_")} | set(layer.__annotations__)
    return members


def methods_of(backend: type) -> dict[str, object]:
    return {name: getattr(backend, name) for name in dir(backend) if not name.startswith("_")}


@pytest.mark.parametrize("backend", list(BACKENDS.values()), ids=list(BACKENDS))
def test_each_backend_implements_the_whole_protocol(backend: type):
    protocol = Followed if backend.followed else HandedOff  # its capability says which part is its own
    members = protocol_members(protocol)
    missing = sorted(name for name in members if not hasattr(backend, name))
    assert missing == []
    for name in members - set(Backend.__annotations__):
        wanted = inspect.signature(getattr(protocol, name)).parameters.keys() - {"cls"}  # bound on the class
        assert inspect.signature(getattr(backend, name)).parameters.keys() == wanted, name


@pytest.mark.parametrize("backend", list(BACKENDS.values()), ids=list(BACKENDS))
def test_what_a_backend_cannot_do_is_a_capability_never_a_method_that_raises(backend: type):
    """No method of a backend (nor of the protocol) only raises NotImplementedError: `followed` says
    which part of the protocol it has."""
    for layer in (Backend, Followed, HandedOff, *backend.__mro__):
        module = inspect.getmodule(layer)
        if module is None or not module.__name__.startswith("launcher."):
            continue
        source = inspect.getsource(layer)
        assert "NotImplementedError" not in source, layer


def test_the_spec_takes_exactly_the_registered_backends_and_their_rules():
    assert set(BACKENDS) == set(kinds.KINDS)
    for name, backend in BACKENDS.items():
        assert issubclass(backend, kinds.KINDS[name])  # the rules the spec checks are the backend's own
        assert build_spec({"entrypoint": "true", "backend": name, "address": "http://head:8265"}
                          if name == ExistingBackend.name else {"entrypoint": "true", "backend": name}).backend == name
    with pytest.raises(SpecError, match="backend: Input should be 'local', 'existing' or 'kuberay' "
                                        r"\(the registered backends\)"):
        build_spec({"entrypoint": "true", "backend": "slurm"})


BACKEND_CLASSES = {backend.__name__ for backend in BACKENDS.values()} | {kind.__name__ for kind in kinds.KINDS.values()}


def names_a_backend(node: ast.AST) -> bool:
    """A backend's name as the code spells it: a string equal to one (`"kuberay"`), or a backend class's
    `name` (`KubeRayBackend.name`, `kinds.KubeRayKind.name`)."""
    if isinstance(node, ast.Constant):
        return node.value in BACKENDS
    if isinstance(node, ast.Attribute) and node.attr == "name":
        owner = node.value
        return (isinstance(owner, ast.Name) and owner.id in BACKEND_CLASSES) or \
            (isinstance(owner, ast.Attribute) and owner.attr in BACKEND_CLASSES)
    return False


def backend_name_uses(source: str) -> list[int]:
    """Lines where a backend's name stands (a string constant, outside an annotation) or is compared
    (`record.backend == KubeRayBackend.name`, `!=`, `in`)."""
    tree = ast.parse(source)
    annotations = {id(node) for parent in ast.walk(tree) if isinstance(parent, ast.Assign)
                   and isinstance(parent.value, ast.Subscript) for node in ast.walk(parent.value)}
    lines = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant)
             and node.value in BACKENDS and id(node) not in annotations]
    lines += [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Compare)
              and any(names_a_backend(side) for side in (node.left, *node.comparators))]
    return sorted(set(lines))


def test_no_module_outside_the_backends_compares_backend_names():
    found = {str(path.relative_to(REPO)): lines for path in sorted((REPO / "launcher").rglob("*.py"))
             if "backends" not in path.parts and (lines := backend_name_uses(path.read_text()))}
    assert found == {}, "ask the spec's backend (launcher.backends.registry.resolve) instead of comparing its name"


@pytest.mark.parametrize("source", [
    "if record.backend == KubeRayBackend.name:\n    pass\n",
    "ok = spec.backend != kinds.LocalKind.name\n",
    "ok = ExistingBackend.name in names\n",
    "if record.backend == 'kuberay':\n    pass\n",
])
def test_the_check_finds_a_backend_name_compared_either_way(source: str):
    assert backend_name_uses(source) == [1]


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
