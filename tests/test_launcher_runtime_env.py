"""The job's runtime env in Ray's words (pip, uv, py_modules, excludes, env_vars, working_dir): what
the spec accepts and refuses (errors name the field), what goes to Ray, the `--runtime-env FILE` /
`--runtime-env-json` flags of `ray job submit` laid over a spec file (flags win), and what a backend
cannot do refused before anything starts. No Ray cluster is started here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from launcher.backends.kuberay.render import render
from launcher.errors import BadInput
from launcher.flags import spec_from_options
from launcher.run import runtime_env
from launcher.spec import SpecError, build_spec
from tests.test_launcher_spec import assert_nothing_started, launcher


def spec(runtime: dict, **fields) -> object:
    return build_spec({"entrypoint": "python train.py", "runtime_env": runtime, **fields})


def test_every_form_ray_takes_reaches_ray_as_given(tmp_path: Path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# pinned\ntorch==2.5.1\n\ndatasets\n")
    cases = [
        ({"pip": ["numpy"]}, {"pip": ["numpy"]}),
        ({"pip": str(requirements)}, {"pip": ["torch==2.5.1", "datasets"]}),
        ({"pip": {"packages": ["numpy"], "pip_install_options": ["--no-deps"]}},
         {"pip": {"packages": ["numpy"], "pip_install_options": ["--no-deps"]}}),
        ({"pip": {"packages": str(requirements), "pip_check": True}},
         {"pip": {"packages": ["torch==2.5.1", "datasets"], "pip_check": True}}),
        ({"uv": ["numpy"]}, {"uv": ["numpy"]}),
        ({"uv": {"packages": ["numpy"], "uv_pip_install_options": ["--index-url", "https://mirror/simple"]}},
         {"uv": {"packages": ["numpy"], "uv_pip_install_options": ["--index-url", "https://mirror/simple"]}}),
        ({"py_modules": ["s3://bucket/lib.zip", "https://host/pkg-1.0-py3-none-any.whl"]},
         {"py_modules": ["s3://bucket/lib.zip", "https://host/pkg-1.0-py3-none-any.whl"]}),
        ({"pip": []}, {}),  # Ray drops an empty list too
    ]
    for given, expected in cases:
        assert runtime_env(spec(given)) == expected, given


def test_a_working_dir_inside_the_runtime_env_is_the_specs_own_and_excludes_apply_to_uploads():
    local = spec({"working_dir": "src", "excludes": ["*.ckpt", "data/"], "env_vars": {"A": "1"}})
    assert local.working_dir == "src"
    assert runtime_env(local) == {"working_dir": "src", "excludes": ["*.ckpt", "data/"], "env_vars": {"A": "1"}}
    modules = spec({"py_modules": ["lib"], "excludes": ["*.ckpt"]}, working_dir="https://host/code.zip")
    assert runtime_env(modules)["excludes"] == ["*.ckpt"]  # the local py_modules are uploaded without them
    with pytest.raises(SpecError, match="excludes: leaves files out of a local working_dir or py_modules"):
        spec({"excludes": ["*.ckpt"]}, working_dir="https://host/code.zip")  # nothing is uploaded


@pytest.mark.parametrize(("runtime", "field", "words"), [
    ({"pip": 5}, "runtime_env.pip", "give a list of requirements, a requirements file, or a mapping"),
    ({"pip": "no-such-requirements.txt"}, "runtime_env.pip", "cannot read the requirements file"),
    ({"pip": {"packages": ["numpy"], "pip_install_options": "--no-deps"}}, "runtime_env.pip.pip_install_options",
     "valid list"),
    ({"pip": {"pakages": ["numpy"]}}, "runtime_env.pip.pakages", "unknown field"),
    ({"pip": ["numpy\ntorch"]}, "runtime_env.pip.packages[0]", "pattern"),
    ({"pip": ["numpy"], "uv": ["torch"]}, "runtime_env.uv", "give pip or uv, not both"),
    ({"uv": {"uv_version": "==0.4"}}, "runtime_env.uv.packages", "required"),
    ({"py_modules": ["https://host/lib.tar.gz"]}, "runtime_env.py_modules", "is an archive (.zip or .whl)"),
    ({"py_modules": ["ftp://host/lib.zip"]}, "runtime_env.py_modules", "not ftp://"),
    ({"excludes": ["*.ckpt"]}, "runtime_env.excludes", "this job uploads none"),
    ({"excludes": "*.ckpt", "working_dir": "."}, "runtime_env.excludes", "valid list"),
    ({"env_vars": {"OMP_NUM_THREADS": 4}}, "runtime_env.env_vars", "OMP_NUM_THREADS: 4 is not a string; quote it"),
    ({"env_vars": {"9LIVES": "x"}}, "runtime_env.env_vars", "not an environment variable name"),
    ({"conda": {"dependencies": ["numpy"]}}, "runtime_env.conda", "use pip or uv"),
    ({"image_uri": "rayproject/ray"}, "runtime_env.image_uri", "--image"),
])
def test_runtime_env_errors_name_the_field(runtime, field, words):
    with pytest.raises(SpecError) as error:
        spec(runtime)
    assert f"job spec: {field}: " in str(error.value)
    assert words in str(error.value)


@pytest.mark.parametrize(("fields", "words"), [
    ({"working_dir": "https://host/code.tar.gz"}, "working_dir: 'https://host/code.tar.gz': a remote working_dir "
                                                  "is an archive (.zip)"),
    ({"working_dir": "a", "runtime_env": {"working_dir": "b"}}, "working_dir: given twice"),
])
def test_working_dir_errors_name_the_field(fields, words):
    with pytest.raises(SpecError, match=re.escape(words)):
        build_spec({"entrypoint": "true", **fields})


def test_runtime_env_flags_lay_over_the_spec_file_and_the_narrow_flags_win(tmp_path: Path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump({
        "entrypoint": "python train.py", "working_dir": "https://host/old.zip",
        "runtime_env": {"pip": ["numpy"], "env_vars": {"A": "file", "B": "file"}, "py_modules": ["s3://b/m.zip"]}}))
    ray_env = tmp_path / "env.yaml"
    ray_env.write_text(yaml.safe_dump({"working_dir": "https://host/new.zip", "uv": ["torch"], "pip": None,
                                       "env_vars": {"B": "flag", "C": "flag"}}))
    merged = spec_from_options(spec_file, {"runtime_env": ray_env, "env": ("C=env-flag",)})
    assert merged.working_dir == "https://host/new.zip"  # the runtime env's working_dir replaces the file's
    assert runtime_env(merged) == {
        "working_dir": "https://host/new.zip", "uv": ["torch"], "py_modules": ["s3://b/m.zip"],
        "env_vars": {"A": "file", "B": "flag", "C": "env-flag"}}  # env_vars merge by name, --env last
    inline = spec_from_options(spec_file, {"runtime_env_json": json.dumps({"pip": {"packages": ["pandas"]}}),
                                           "pip": ("scipy",), "working_dir": "https://host/flag.zip"})
    assert runtime_env(inline)["pip"] == ["pandas", "scipy"]  # --pip adds to the runtime env's requirements
    assert inline.working_dir == "https://host/flag.zip"  # --working-dir wins over everything
    with pytest.raises(SpecError, match="give --runtime-env FILE or --runtime-env-json JSON, not both"):
        spec_from_options(spec_file, {"runtime_env": ray_env, "runtime_env_json": "{}"})


@pytest.mark.parametrize(("args", "words"), [
    (("--runtime-env-json", "{pip: [numpy]}"), "--runtime-env-json: not valid JSON"),
    (("--runtime-env-json", '["numpy"]'), "--runtime-env-json: a runtime env is a mapping of Ray's fields"),
    (("--runtime-env-json", '{"pip": ["numpy"], "conda": "env"}'), "job spec: runtime_env.conda: Ray's conda"),
    (("--runtime-env", "missing.yaml"), "--runtime-env: cannot read missing.yaml"),
])
def test_bad_runtime_env_flags_exit_2_before_anything_starts(tmp_path: Path, args, words):
    result = launcher("submit", *args, "--", "python train.py", home=tmp_path)
    assert words in result.stderr
    assert "Traceback" not in result.stderr
    assert_nothing_started(tmp_path, result)


@pytest.mark.parametrize(("content", "words"), [
    (b"pip: [\xff]\n", "not UTF-8 text (byte 6)"),
    (b"pip: [numpy\n", "not valid YAML"),
    (b"{a: " * 3000 + b"1" + b"}" * 3000, "nested too deeply"),
    (b"- numpy\n", "the top level must be a mapping of Ray's fields (pip, uv, py_modules"),
])
def test_a_runtime_env_file_that_cannot_be_read_is_named(tmp_path: Path, content, words):
    path = tmp_path / "env.yaml"
    path.write_bytes(content)
    with pytest.raises(BadInput) as error:
        spec_from_options(None, {"runtime_env": path, "command": ("true",)})
    assert f"--runtime-env: {path}: {words}" in str(error.value)


def test_local_py_modules_must_exist_here(tmp_path: Path):
    result = launcher("submit", "--runtime-env-json", json.dumps({"py_modules": [str(tmp_path / "nope")]}),
                      "--", "python train.py", home=tmp_path)
    assert f"runtime_env.py_modules[0]: {tmp_path / 'nope'} is not a directory, .py or .whl file here" in result.stderr
    assert_nothing_started(tmp_path, result)


def test_kuberay_takes_no_local_py_modules_and_keeps_the_runtime_env(tmp_path: Path):
    base = {"entrypoint": "python train.py", "backend": "kuberay", "run_id": "rt-1"}
    with pytest.raises(BadInput, match=r"runtime_env.py_modules\[0\]: lib is a local path; on Kubernetes"):
        render(build_spec({**base, "runtime_env": {"py_modules": ["lib"]}}))
    _, rayjob, _ = render(build_spec({**base, "working_dir": "s3://b/code.zip", "runtime_env": {
        "uv": {"packages": ["torch"], "uv_check": True}, "py_modules": ["s3://b/lib.whl"]}}))
    assert yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"]) == {
        "working_dir": "s3://b/code.zip", "uv": {"packages": ["torch"], "uv_check": True},
        "py_modules": ["s3://b/lib.whl"]}
