"""Packaging: every third-party import is declared (the exporter's in the base install, which is what
`raypulse[exporter]` and the image get; Ray only through `[launcher]`), the build-system floor fits
the metadata, the LICENSE is there, and the Dockerfile's install steps, run here as the image runs
them (no container engine can build images on this machine), give an exporter that imports every
module, answers its commands and serves, without Ray."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import launcher
from exporter.cli import MANIFESTS_MOVED
from exporter.contract import wire
from scripts.ports import free_port
from tests.conftest import REPO, http_get, wait_until

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
DOCKERFILE = REPO / "Dockerfile"
OWN = {"exporter", "launcher", "alerts", "dashboards"}
PROJECT_VERSION = __import__("exporter").__version__


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(*extras: str) -> set[str]:
    """Distribution names of the base dependencies and the extras (self-references expanded)."""
    names, todo = set(), [None, *extras]
    seen = set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]:
            requirement = Requirement(text)
            if normalize(requirement.name) == normalize(PROJECT["name"]):
                todo.extend(requirement.extras)
            else:
                names.add(normalize(requirement.name))
    return names


def third_party_imports(package: str) -> Iterator[tuple[str, str]]:
    """(top-level module, file) of every import of a module outside the standard library and our packages."""
    for path in sorted((REPO / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OWN:
                    yield top, str(path.relative_to(REPO))


# Imports of the framework a module serves, made only where that framework runs: the Ray Train helper, the
# RLlib callback and the task verl's rollout servers are told to the head by in Ray's workers, TRL's callback
# where transformers trains (exporter/progress/hooks.py imports it only once transformers is imported).
FRAMEWORK_IMPORTS = {("ray", "exporter/progress/client.py"), ("ray", "exporter/progress/rllib.py"),
                     ("ray", "exporter/progress/rollout.py"), ("transformers", "exporter/progress/trl.py")}


@pytest.mark.parametrize(("package", "extras"), [
    ("exporter", ()),  # the base install: `raypulse[exporter]` adds nothing to it
    ("alerts", ()),
    ("launcher", ("launcher", "kube")),
    ("dashboards", ("dev",)),  # dashboards/builder.py (grafana-foundation-sdk) runs only in `make dashboards`
])
def test_every_third_party_import_is_declared(package, extras):
    distributions = importlib.metadata.packages_distributions()
    allowed = declared(*extras)
    missing = []
    for module, where in third_party_imports(package):
        if (module, where) in FRAMEWORK_IMPORTS:
            continue
        candidates = {normalize(name) for name in distributions.get(module, [module])}
        if not candidates & allowed:
            missing.append(f"{where}: import {module} (distribution {sorted(candidates)})")
    assert missing == []


def test_the_launcher_knows_what_its_extra_brings():
    # launcher.EXTRA_MODULES names the extra in the message an exporter-only install gets
    brought = {normalize(Requirement(text).name) for text in PROJECT["optional-dependencies"]["launcher"]}
    assert brought == launcher.EXTRA_MODULES


def test_the_exporter_install_brings_no_ray():
    assert not any(name.startswith("ray") for name in declared("exporter"))
    assert "ray" in declared("launcher")
    assert PROJECT["optional-dependencies"]["exporter"] == []  # the base install is the exporter alone
    assert "raypulse[launcher]" in PROJECT["optional-dependencies"]["dev"]  # `make install` keeps Ray


def test_the_build_system_floor_supports_the_license_expression():
    assert isinstance(PROJECT["license"], str)  # PEP 639 SPDX expression: setuptools >= 77
    (setuptools,) = [Requirement(text) for text in PYPROJECT["build-system"]["requires"]
                     if Requirement(text).name == "setuptools"]
    assert not setuptools.specifier.contains("76.9")
    assert setuptools.specifier.contains("77.0")


def test_the_license_file_is_the_apache_license():
    text = (REPO / "LICENSE").read_text()
    assert PROJECT["license"] == "Apache-2.0"
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_dashboards_and_rule_files_are_package_data():
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    assert "json/*.json" in data["dashboards"]
    assert "rules/*.yaml" in data["alerts"]


# --- the Dockerfile -----------------------------------------------------------------------------

def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        if not current and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        lines.append(current + raw)
        current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip()) for line in lines]


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for keyword, args in instructions():
        if keyword == "FROM":
            found.append([])
        if found:
            found[-1].append((keyword, args))
    return found


def test_the_dockerfile_installs_the_exporter_extra_only_on_a_slim_base():
    arguments = dict(args.split("=", 1) for keyword, args in instructions() if keyword == "ARG" and "=" in args)
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", arguments["PYTHON_IMAGE"])
    assert arguments["VERSION"] == PROJECT_VERSION  # the image's version label
    build, final = stages()
    pip_steps = [args for keyword, args in build + final if keyword == "RUN" and " pip " in args]
    assert len(pip_steps) == 2
    assert "'.[exporter]'" in pip_steps[0]
    assert "'raypulse[exporter]'" in pip_steps[1]
    assert "--no-index" in pip_steps[1]  # the final stage installs exactly the wheels the build stage made
    assert not any("launcher]" in step or "[dev" in step for step in pip_steps)


def test_the_dockerfile_runs_unprivileged_and_names_the_wire_port_and_health_path():
    final = stages()[-1]
    settings = {keyword: args for keyword, args in final}
    assert settings["USER"].split(":")[0] not in ("0", "root")
    assert settings["EXPOSE"] == str(wire.EXPORTER_PORT)
    assert "wire.EXPORTER_PORT" in settings["HEALTHCHECK"]
    assert "wire.HEALTH_PATH" in settings["HEALTHCHECK"]
    assert settings["ENTRYPOINT"] == '["exporter"]'
    copied = {source for keyword, args in stages()[0] if keyword == "COPY" for source in args.split()[:-1]}
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {f"{pattern.rstrip('*')}/" for pattern in include} <= copied  # every package the wheel is made of
    assert {"pyproject.toml", "README.md", "LICENSE"} <= copied


# --- the image's install steps, run in a virtual environment ------------------------------------

def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, **kwargs)
    assert result.returncode == 0, f"{shlex.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _image_step(args: str, python: Path) -> list[str]:
    """A RUN step of the Dockerfile for this machine: the venv's python, a local wheel directory, and
    pip's cache kept (the image build does without it; here it saves the downloads)."""
    words = [word for word in shlex.split(args) if not word.startswith("--mount=") and word != "--no-cache-dir"]
    assert words[:3] == ["python", "-m", "pip"], args
    return [str(python), *words[1:]] if words[0] == "python" else words


@pytest.mark.slow
@pytest.mark.online  # pip downloads what is not in its cache
def test_the_image_install_steps_give_a_working_exporter_without_ray(tmp_path):
    build, final = stages()
    context, wheels, env_dir = tmp_path / "src", tmp_path / "wheels", tmp_path / "venv"
    context.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for keyword, args in build:  # the build stage's COPYs, into the build stage's WORKDIR
        if keyword == "COPY":
            *sources, destination = args.split()
            for source in sources:
                if source.endswith("/"):
                    shutil.copytree(REPO / source, context / destination, ignore=ignore)
                else:
                    shutil.copy2(REPO / source, context / Path(destination) / source)
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python, bin_dir = env_dir / "bin" / "python", env_dir / "bin"
    environment = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    environment.pop("PYTHONPATH", None)
    steps = [args.replace("/wheels", str(wheels)) for keyword, args in build + final
             if keyword == "RUN" and " pip " in args]
    _run(_image_step(steps[0], python), cwd=context, env=environment)  # pip wheel '.[exporter]'
    _run(_image_step(steps[1], python), cwd=tmp_path, env=environment)  # pip install --no-index ...

    installed = {normalize(dist.metadata["Name"]) for dist in importlib.metadata.distributions(
        path=[str(path) for path in (env_dir / "lib").glob("python*/site-packages")])}
    assert "raypulse" in installed
    assert not {name for name in installed if name == "ray" or name.startswith("ray-")}
    _run([str(python), "-m", "pip", "check"], env=environment, cwd=tmp_path)

    # Every exporter module imports with only what the install brought (and Ray is not there).
    probe = ("import importlib, pkgutil, exporter\n"
             "names = [m.name for m in pkgutil.walk_packages(exporter.__path__, 'exporter.')\n"
             "         if not m.name.endswith('__main__')  # that one runs the command line\n"
             "         and m.name not in ('exporter.progress.rllib', 'exporter.progress_rllib',"
             " 'exporter.progress.trl')]"
             "  # RLlib's callback (and its first path), TRL's: run where RLlib, transformers are\n"
             "for name in names: importlib.import_module(name)\n"
             "assert importlib.util.find_spec('ray') is None\n"
             "print(len(names), exporter.__file__)")
    imported = _run([str(python), "-c", probe], env=environment, cwd=tmp_path).stdout.split()
    assert int(imported[0]) > 40
    assert str(env_dir) in imported[1]

    exporter_bin = str(bin_dir / "exporter")
    assert "serve" in _run([exporter_bin, "--help"], env=environment, cwd=tmp_path).stdout
    assert "raypulse_gpu_" in _run([exporter_bin, "metrics"], env=environment, cwd=tmp_path).stdout
    _run([exporter_bin, "assets", "--dir", str(tmp_path / "assets")], env=environment, cwd=tmp_path)
    assert sorted(p.name for p in (tmp_path / "assets" / "dashboards").iterdir()) == sorted(
        p.name for p in (REPO / "dashboards" / "json").glob("*.json"))
    assert sorted(p.name for p in (tmp_path / "assets" / "opt-in").iterdir()) == ["dcgm-compat.yml", "watchdog.yml"]
    # The deployment is the launcher's to render now: one line naming its command, no traceback.
    moved = subprocess.run([exporter_bin, "manifests"], env=environment, cwd=tmp_path, capture_output=True, text=True,
                           timeout=60)
    assert moved.returncode == 2
    assert moved.stderr.splitlines() == [f"exporter: {MANIFESTS_MOVED}"]
    # The launcher script comes with the install; without its extra it says which to install.
    no_launcher = subprocess.run([str(bin_dir / "launcher"), "--help"], env=environment, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=60)
    assert no_launcher.returncode == 2
    assert "pip install 'raypulse[launcher]'" in no_launcher.stderr
    assert "Traceback" not in no_launcher.stderr

    # It serves, and the image's HEALTHCHECK command passes against it.
    port = free_port()
    server = subprocess.Popen([exporter_bin, "serve", "--listen", f"127.0.0.1:{port}", "--progress-listen", "off"],
                              env=environment, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}{wire.HEALTH_PATH}")[0] == 200, 30, "the exporter")
        healthcheck = dict(stages()[-1])["HEALTHCHECK"].split("CMD", 1)[1].strip()
        command = ast.literal_eval(healthcheck)
        assert command[:2] == ["python", "-c"]
        _run([str(python), "-c", f"from exporter.contract import wire; wire.EXPORTER_PORT = {port}\n{command[2]}"],
             env=environment, cwd=tmp_path)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)

