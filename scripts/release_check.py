"""`make release-check`: what the release workflow (.github/workflows/release.yml) does and can be done
here, without publishing anything:

- the sdist and the wheel built with `python -m build` into a temporary directory, and `twine check
  --strict` on them; both named for exporter.__version__, the wheel holding the packaged rule files and
  dashboards (what `exporter assets` and `launcher exporters manifests` read);
- every workflow under .github/workflows/ valid against the GitHub workflow schema (`check-jsonschema
  --builtin-schema vendor.github-workflows`: the schema ships inside check-jsonschema, no network);
- the names agreeing: the version matches the workflow's tag filter, the workflow pushes the image that
  launcher/deploy/manifests.py's DEFAULT_IMAGE names (registry, repository, tag = the version), logs in to that
  registry, and the Dockerfile's default VERSION is the version;
- the tests before the release: ci.yml runs README's test command (`make test`) under a time limit on
  every push and pull request and can be called; release.yml calls it, every other job of the release
  needs that one (directly or through another), and both set up the same Python.

    python -m scripts.release_check          # exit 1 with one line per problem
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import yaml

from exporter import __version__
from launcher.deploy.manifests import DEFAULT_IMAGE

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"
RELEASE = WORKFLOWS / "release.yml"
CI = WORKFLOWS / "ci.yml"
TEST_COMMAND = "make test"  # README's
DISTRIBUTION = "raypulse"  # pyproject.toml's [project] name: what `pip install raypulse` asks for


def github_filter(pattern: str) -> re.Pattern[str]:
    """A GitHub Actions branch/tag filter pattern as a regex: `*` any run without `/`, `**` anything,
    `?` and `+` the preceding character zero-or-one and one-or-more times, `[...]` a class; the rest literal."""
    out, index = "", 0
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**", index):
            out, index = out + ".*", index + 2
            continue
        if char == "*":
            out += "[^/]*"
        elif char in "?+":
            out += char
        elif char == "[":
            end = pattern.index("]", index)
            out, index = out + pattern[index:end + 1], end + 1
            continue
        else:
            out += re.escape(char)
        index += 1
    return re.compile(out)


def _steps(workflow: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])
            if str(step.get("uses", "")).split("@")[0] == action]


def _trigger(workflow: dict[str, Any]) -> dict[str, Any]:
    # PyYAML reads the key `on` as True (YAML 1.1): take either.
    return workflow.get("on", workflow.get(True)) or {}


def _pythons(workflow: dict[str, Any]) -> set[str]:
    return {str(step.get("with", {}).get("python-version")) for step in _steps(workflow, "actions/setup-python")}


def ci_problems(ci: dict[str, Any], release: dict[str, Any]) -> list[str]:
    """Where ci.yml does not run the tests on every change, or the release can start without them."""
    problems = []
    missing = {"push", "pull_request", "workflow_call"} - set(_trigger(ci))
    if missing:
        problems.append(f"{CI.name}: not triggered by {sorted(missing)}")
    testing = [name for name, job in ci.get("jobs", {}).items()
               if any(str(step.get("run", "")).split()[:2] == TEST_COMMAND.split() for step in job.get("steps", []))]
    if not testing:
        problems.append(f"{CI.name}: no job runs `{TEST_COMMAND}`")
    problems += [f"{CI.name}: job {name} has no timeout-minutes" for name in testing
                 if "timeout-minutes" not in ci["jobs"][name]]
    jobs = release.get("jobs", {})
    calls = [name for name, job in jobs.items() if job.get("uses") == f"./{CI.relative_to(REPO)}"]
    if len(calls) != 1:
        problems.append(f"{RELEASE.name}: {len(calls)} jobs use ./{CI.relative_to(REPO)}, not one")
        return problems

    def needed(name: str) -> set[str]:
        """Every job `name` waits for, directly or through another (a cycle, which GitHub refuses, ends)."""
        found: set[str] = set()
        waiting = [name]
        while waiting:
            needs = jobs.get(waiting.pop(), {}).get("needs", [])
            for other in {needs} if isinstance(needs, str) else set(needs):
                if other not in found:
                    found.add(other)
                    waiting.append(other)
        return found

    problems += [f"{RELEASE.name}: job {name} can start before the tests ({calls[0]}) pass" for name in jobs
                 if name != calls[0] and calls[0] not in needed(name)]
    if _pythons(ci) != _pythons(release):
        problems.append(f"{CI.name} sets up Python {sorted(_pythons(ci))}, {RELEASE.name} {sorted(_pythons(release))}")
    return problems


def name_problems(workflow: dict[str, Any], dockerfile: str) -> list[str]:
    """Where the workflow, the Dockerfile and the code disagree about the version or the image's name."""
    problems = []
    tags = (_trigger(workflow).get("push") or {}).get("tags", [])
    if not any(github_filter(tag).fullmatch(__version__) for tag in tags):
        problems.append(f"{RELEASE.name}: no push tag filter {tags} matches the version {__version__}")
    image, _, tag = DEFAULT_IMAGE.rpartition(":")
    if tag != __version__:
        problems.append(f"DEFAULT_IMAGE {DEFAULT_IMAGE} is not tagged with the version {__version__}")
    if workflow.get("env", {}).get("IMAGE") != image:
        problems.append(f"{RELEASE.name}: env IMAGE {workflow.get('env', {}).get('IMAGE')!r} is not DEFAULT_IMAGE's "
                        f"{image!r}")
    registry = image.split("/", 1)[0]
    logins = [step.get("with", {}).get("registry") for step in _steps(workflow, "docker/login-action")]
    if logins != [registry]:
        problems.append(f"{RELEASE.name}: logs in to {logins}, not once to DEFAULT_IMAGE's registry {registry}")
    pushes = _steps(workflow, "docker/build-push-action")
    if len(pushes) != 1:
        problems.append(f"{RELEASE.name}: {len(pushes)} docker/build-push-action steps, not one")
    else:
        settings = pushes[0].get("with", {})
        if not str(settings.get("tags", "")).startswith("${{ env.IMAGE }}:"):
            problems.append(f"{RELEASE.name}: the image is pushed as {settings.get('tags')!r}, not env.IMAGE")
        if set(str(settings.get("platforms", "")).split(",")) != {"linux/amd64", "linux/arm64"}:
            problems.append(f"{RELEASE.name}: platforms {settings.get('platforms')!r}, not linux/amd64,linux/arm64")
        labels = {line.split("=", 1)[0] for line in str(settings.get("labels", "")).splitlines() if line}
        missing = {f"org.opencontainers.image.{name}" for name in ("source", "revision", "version")} - labels
        if missing:
            problems.append(f"{RELEASE.name}: the image lacks the labels {sorted(missing)}")
    if not _steps(workflow, "pypa/gh-action-pypi-publish"):
        problems.append(f"{RELEASE.name}: nothing publishes to PyPI (pypa/gh-action-pypi-publish)")
    default_version = re.search(r"^ARG VERSION=(\S+)$", dockerfile, re.MULTILINE)
    if default_version is None or default_version[1] != __version__:
        problems.append(f"Dockerfile: ARG VERSION={default_version[1] if default_version else '(none)'} is not "
                        f"the version {__version__}")
    return problems


def _run(command: list[str]) -> str | None:
    """None when it succeeds, else what it said."""
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    return None if result.returncode == 0 else f"`{' '.join(command)}` failed:\n{result.stdout}{result.stderr}"


def dist_problems(outdir: Path) -> list[str]:
    """Build the sdist and wheel into `outdir` and check them as the workflow does before publishing."""
    failed = _run([sys.executable, "-m", "build", "--outdir", str(outdir), str(REPO)])
    if failed:
        return [failed]
    expected = {f"{DISTRIBUTION}-{__version__}.tar.gz", f"{DISTRIBUTION}-{__version__}-py3-none-any.whl"}
    built = {path.name for path in outdir.iterdir()}
    if built != expected:
        return [f"built {sorted(built)}, expected {sorted(expected)}"]
    problems = []
    failed = _run([sys.executable, "-m", "twine", "check", "--strict", *sorted(str(p) for p in outdir.iterdir())])
    if failed:
        problems.append(failed)
    with zipfile.ZipFile(outdir / f"{DISTRIBUTION}-{__version__}-py3-none-any.whl") as wheel:
        names = wheel.namelist()
    for wanted in ("alerts/rules/gpu.yaml", "dashboards/json/raypulse-gpu.json", "exporter/cli.py",
                   "launcher/__init__.py"):
        if wanted not in names:
            problems.append(f"the wheel lacks {wanted}")
    return problems


def workflow_problems() -> list[str]:
    workflows = sorted(WORKFLOWS.glob("*.y*ml"))
    missing = [f"{path.relative_to(REPO)} is missing" for path in (CI, RELEASE) if path not in workflows]
    if missing:
        return missing
    checker = Path(sys.executable).parent / "check-jsonschema"  # the venv's, beside this Python
    failed = _run([str(checker), "--builtin-schema", "vendor.github-workflows", *map(str, workflows)])
    return [failed] if failed else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.release_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-build", action="store_true", help="skip building and checking the sdist and wheel")
    args = parser.parse_args(argv)
    problems = workflow_problems()
    if RELEASE.exists():
        release = yaml.safe_load(RELEASE.read_text())
        problems += name_problems(release, (REPO / "Dockerfile").read_text())
        if CI.exists():
            problems += ci_problems(yaml.safe_load(CI.read_text()), release)
    if not args.no_build:
        with tempfile.TemporaryDirectory(prefix="raypulse-dist-") as outdir:
            problems += dist_problems(Path(outdir))
    for problem in problems:
        print(f"release-check: {problem}", file=sys.stderr)
    if not problems:
        print(f"release-check: {DISTRIBUTION} {__version__} and {DEFAULT_IMAGE}: the build, twine check, the "
              "workflow schema and the names agree, and the release waits for the tests")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
