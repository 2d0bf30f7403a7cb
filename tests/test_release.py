"""The release (.github/workflows/release.yml), the tests it waits for (ci.yml) and `make release-check`
(scripts/release_check.py): the workflows are valid against GitHub's schema, the release's tag filter,
image name and registry are the code's, nothing is published before `make test` passed on the tagged
commit, and in the slow lane the whole check runs (sdist and wheel built, `twine check`)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter import __version__
from launcher.deploy.manifests import DEFAULT_IMAGE
from scripts import release_check
from tests.conftest import REPO


def workflow() -> dict:
    return yaml.safe_load(release_check.RELEASE.read_text())


def ci() -> dict:
    return yaml.safe_load(release_check.CI.read_text())


def dockerfile() -> str:
    return (REPO / "Dockerfile").read_text()


def test_the_workflow_the_dockerfile_and_the_code_agree_on_the_version_and_the_image():
    assert release_check.name_problems(workflow(), dockerfile()) == []
    assert f"{workflow()['env']['IMAGE']}:{__version__}" == DEFAULT_IMAGE


def test_the_tag_must_equal_the_version_before_anything_is_published():
    jobs = workflow()["jobs"]
    step = next(step for step in jobs["dist"]["steps"] if step.get("id") == "version")
    assert '"$GITHUB_REF_NAME" != "$version"' in step["run"]
    assert "exit 1" in step["run"]
    assert jobs["pypi"]["needs"] == jobs["image"]["needs"] == "dist"
    assert jobs["pypi"]["permissions"] == {"id-token": "write"}  # trusted publishing, no token
    assert jobs["pypi"]["environment"]["name"] == "pypi"


def test_the_tests_run_on_every_change_and_before_anything_of_the_release():
    assert release_check.ci_problems(ci(), workflow()) == []
    jobs = workflow()["jobs"]
    assert jobs["ci"] == {"uses": "./.github/workflows/ci.yml"}
    assert jobs["dist"]["needs"] == "ci"  # and pypi and image need dist
    steps = ci()["jobs"]["test"]["steps"]
    assert [step["run"].split()[:2] for step in steps if "run" in step] == [["make", "test"]]


def test_a_release_that_could_start_without_the_tests_is_reported():
    release = copy.deepcopy(workflow())
    del release["jobs"]["dist"]["needs"]
    assert release_check.ci_problems(ci(), release) == [
        "release.yml: job dist can start before the tests (ci) pass",
        "release.yml: job pypi can start before the tests (ci) pass",
        "release.yml: job image can start before the tests (ci) pass"]
    del release["jobs"]["ci"]
    assert release_check.ci_problems(ci(), release) == ["release.yml: 0 jobs use ./.github/workflows/ci.yml, not one"]


def test_tests_that_cannot_be_called_have_no_time_limit_or_another_python_are_reported():
    drifted = copy.deepcopy(ci())
    del drifted[True]["workflow_call"]
    del drifted["jobs"]["test"]["timeout-minutes"]
    next(step for step in drifted["jobs"]["test"]["steps"] if "with" in step)["with"]["python-version"] = "3.12"
    assert release_check.ci_problems(drifted, workflow()) == [
        "ci.yml: not triggered by ['workflow_call']", "ci.yml: job test has no timeout-minutes",
        "ci.yml sets up Python ['3.12'], release.yml ['3.11']"]
    drifted["jobs"]["test"]["steps"][-1]["run"] = "make test-quick"
    assert "ci.yml: no job runs `make test`" in release_check.ci_problems(drifted, workflow())


@pytest.mark.parametrize(("pattern", "tag", "matches"), [
    ("[0-9]+.[0-9]+.[0-9]+*", "0.1.0", True),
    ("[0-9]+.[0-9]+.[0-9]+*", "10.2.3rc1", True),
    ("[0-9]+.[0-9]+.[0-9]+*", "v0.1.0", False),
    ("[0-9]+.[0-9]+.[0-9]+*", "0.1", False),
    ("v*", "v1.0", True),
    ("v*", "v1/0", False),
    ("release/**", "release/a/b", True),
])
def test_github_tag_filters_as_github_reads_them(pattern, tag, matches):
    assert bool(release_check.github_filter(pattern).fullmatch(tag)) is matches


def test_a_name_that_drifts_is_reported():
    drifted = copy.deepcopy(workflow())
    drifted["env"]["IMAGE"] = "docker.io/someone/raypulse-exporter"
    drifted[True]["push"]["tags"] = ["v*"]
    problems = release_check.name_problems(drifted, dockerfile().replace(f"ARG VERSION={__version__}",
                                                                        "ARG VERSION=9.9.9"))
    assert any("env IMAGE" in problem for problem in problems)
    assert any("tag filter" in problem for problem in problems)
    assert any("Dockerfile" in problem for problem in problems)


def test_check_jsonschema_refuses_a_broken_workflow(tmp_path: Path):
    assert release_check.workflow_problems() == []  # ci.yml and release.yml
    broken = copy.deepcopy(workflow())
    broken["jobs"]["dist"]["runs_on"] = broken["jobs"]["dist"].pop("runs-on")
    path = tmp_path / "release.yml"
    path.write_text(yaml.safe_dump({"on" if key is True else key: value for key, value in broken.items()}))
    checker = Path(sys.executable).parent / "check-jsonschema"
    result = subprocess.run([str(checker), "--builtin-schema", "vendor.github-workflows", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0, result.stdout


@pytest.mark.slow
@pytest.mark.online  # `python -m build` fetches its build backend
def test_make_release_check_passes():
    """What `make release-check` runs: the build, `twine check`, the workflow schema and the names."""
    result = subprocess.run([sys.executable, "-m", "scripts.release_check"], cwd=REPO, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
