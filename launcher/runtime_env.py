"""The job's runtime environment, in Ray's words: `pip` or `uv` requirements, `py_modules`, `excludes`
and `env_vars` (the working dir is the spec's own `working_dir`; one given inside a runtime env goes
there). `ray job submit --runtime-env FILE / --runtime-env-json JSON` take the same format, and so
does `launcher submit`: `layer()` lays such a runtime env over a spec's fields, the flag winning.

Checked here, with errors naming the field (`runtime_env.pip.packages[0]`): the shapes Ray accepts
and what Ray would only refuse at submission (a remote package that is not a .zip or .whl, pip and
uv together). What depends on where the job runs (a local path must exist; a Kubernetes pod cannot
see this machine) is checked by that backend, still before anything starts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from exporter import userinput
from exporter.config import YamlFileError, read_yaml_file
from exporter.contract.strict import Strict
from launcher.errors import BadInput

# Ray's remote package protocols (ray._common.runtime_env_uri) plus gcs://, where Ray's client
# uploads a local directory; remote packages must be archives Ray can unpack.
REMOTE_PROTOCOLS = ("http", "https", "s3", "gs", "azure", "abfss", "file", "gcs")
ARCHIVES = {"working_dir": (".zip",), "py_modules": (".zip", ".whl")}

# Ray runtime env fields the launcher does not pass on, and what to do instead.
NOT_TAKEN = {
    "conda": "Ray's conda environments are not supported by the launcher; use pip or uv, or an image (--image) "
             "that has the environment",
    "container": "not supported by the launcher; on Kubernetes give the image with --image",
    "image_uri": "not supported by the launcher; on Kubernetes give the image with --image",
    "py_executable": "not supported by the launcher; use pip or uv to add packages to the job's Python",
    "java_jars": "not supported by the launcher (Python jobs only)",
    "config": "not supported by the launcher (Ray's runtime env setup timeouts stay Ray's defaults)",
    "worker_process_setup_hook": "not supported by the launcher; call the hook from the entrypoint's code",
}


def is_remote(path_or_uri: str) -> bool:
    return "://" in path_or_uri


def check_remote_package(uri: str, field: str) -> str:
    """A remote working_dir / py_modules entry Ray can fetch: a known protocol and an archive."""
    protocol = uri.split("://", 1)[0].lower()
    if protocol not in REMOTE_PROTOCOLS:
        raise ValueError(f"{uri!r}: Ray fetches packages over {', '.join(REMOTE_PROTOCOLS)}, not {protocol}://")
    if not uri.split("?", 1)[0].lower().endswith(ARCHIVES[field]):
        raise ValueError(f"{uri!r}: a remote {field} is an archive ({' or '.join(ARCHIVES[field])}); pack the "
                         "directory into one, or give a local path")
    return uri


def read_requirements(path: str) -> list[str]:
    """The requirements in a requirements.txt, read on this machine as Ray's client does (comments and
    blank lines left out)."""
    try:
        lines = userinput.read_text(Path(path).expanduser()).splitlines()
    except userinput.InputError as exc:
        raise ValueError(f"cannot read the requirements file {path}: {exc.unreadable or exc.problem}") from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _packages(value: Any) -> Any:
    """Ray's three ways of giving requirements, as one: a list, a requirements file, or a mapping
    with `packages` (a list or a file) and the installer's options."""
    if isinstance(value, str):
        return {"packages": read_requirements(value)}
    if isinstance(value, list | tuple):
        return {"packages": list(value)}
    if isinstance(value, dict) and isinstance(value.get("packages"), str):
        return {**value, "packages": read_requirements(value["packages"])}
    if value is not None and not isinstance(value, dict | _Installer):
        raise ValueError(f"{value!r}: give a list of requirements, a requirements file, or a mapping with "
                         "packages (and the installer's options)")
    return value


def add_packages(value: Any, more: list[str]) -> dict[str, Any]:
    """`value` (any of Ray's forms, or None) with more requirements after its own (`--pip`)."""
    current = _packages(value) if value is not None else {}
    if not isinstance(current, dict):
        return current  # not a form Ray takes: validation says so, naming the field
    return {**current, "packages": [*current.get("packages", []), *more]}


Requirement = Annotated[str, Field(min_length=1, pattern=r"^[^\n\r]*$")]


class _Installer(Strict):
    model_config = ConfigDict(validate_assignment=True)

    packages: list[Requirement] = Field(description="requirements, one per entry as in requirements.txt")

    @model_serializer(mode="wrap")
    def _shortest(self, dump: SerializerFunctionWrapHandler) -> Any:
        """Kept and shown as given: a plain list unless options were given (Ray takes either)."""
        data = dump(self)
        options = {key: value for key, value in data.items()
                   if key != "packages" and value != type(self).model_fields[key].default}
        return {"packages": data["packages"], **options} if options else data["packages"]

    def for_ray(self) -> list[str] | dict[str, Any]:
        return self.model_dump(mode="json")


class PipOptions(_Installer):
    pip_check: bool = Field(False, description="run `pip check` after installing")
    pip_version: str | None = Field(None, description="the pip to install with, e.g. ==23.3.1")
    pip_install_options: list[str] | None = Field(None, description="options of `pip install`")


class UvOptions(_Installer):
    uv_check: bool = Field(False, description="run `pip check` after installing")
    uv_version: str | None = Field(None, description="the uv to install with, e.g. ==0.4.0")
    uv_pip_install_options: list[str] | None = Field(None, description="options of `uv pip install`")


class RuntimeEnv(Strict):
    """Ray's runtime environment of the job (fields as in Ray's `runtime_env`)."""

    model_config = ConfigDict(validate_assignment=True)

    pip: Annotated[PipOptions | None, BeforeValidator(_packages)] = Field(
        None, description="pip requirements: a list, a requirements file, or {packages, pip_install_options, ...}")
    uv: Annotated[UvOptions | None, BeforeValidator(_packages)] = Field(
        None, description="the same, installed with uv (instead of pip)")
    py_modules: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="Python packages for the job: local directories, .py or .whl files "
        "(uploaded), or remote .zip/.whl URIs")
    excludes: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="gitignore-style patterns left out of the local working_dir and "
        "py_modules uploaded with the job")
    env_vars: dict[str, str] = Field(default_factory=dict, description="environment variables of the job")

    @field_validator("env_vars", mode="before")
    @classmethod
    def _string_values(cls, value: Any) -> Any:
        for name, item in (value.items() if isinstance(value, dict) else ()):
            if not isinstance(item, str):
                raise ValueError(f"{name}: {item!r} is not a string; quote it (YAML reads 4 or true as a number "
                                 "or a boolean)")
        return value

    @field_validator("env_vars")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    @field_validator("py_modules")
    @classmethod
    def _remote_modules(cls, value: list[str]) -> list[str]:
        return [check_remote_package(item, "py_modules") if is_remote(item) else item for item in value]

    @field_validator("uv")
    @classmethod
    def _one_installer(cls, value: UvOptions | None, info: ValidationInfo) -> UvOptions | None:
        if value is not None and info.data.get("pip") is not None:
            raise ValueError("give pip or uv, not both: Ray installs the job's packages with one of them")
        return value

    def local_paths(self) -> list[str]:
        return [item for item in self.py_modules if not is_remote(item)]

    def for_ray(self) -> dict[str, Any]:
        """The fields Ray's Jobs API takes, without env_vars (the run adds its own to them)."""
        env: dict[str, Any] = {}
        for name in ("pip", "uv"):
            installer: _Installer | None = getattr(self, name)
            if installer is not None and installer.packages:  # Ray drops an empty list too
                env[name] = installer.for_ray()
        if self.py_modules:
            env["py_modules"] = list(self.py_modules)
        if self.excludes:
            env["excludes"] = list(self.excludes)
        return env


def layer(data: dict[str, Any], runtime_env: dict[str, Any]) -> dict[str, Any]:
    """A spec's fields with a Ray runtime env (from --runtime-env or --runtime-env-json) laid over
    them: each field it gives replaces the spec's, except env_vars, merged by name (its values win);
    its working_dir becomes the spec's working_dir."""
    runtime_env = dict(runtime_env)
    result = {**data, "runtime_env": mapping(data.get("runtime_env"))}
    current = result["runtime_env"]
    if "working_dir" in runtime_env:
        current.pop("working_dir", None)  # the spec's own, given inside its runtime_env
        result["working_dir"] = runtime_env.pop("working_dir")
    env_vars = runtime_env.pop("env_vars", None)
    current.update(runtime_env)
    if isinstance(env_vars, dict):
        current["env_vars"] = {**mapping(current.get("env_vars")), **env_vars}
    elif env_vars is not None:
        current["env_vars"] = env_vars  # not a mapping: validation names the field
    return result


def mapping(value: Any) -> dict[str, Any]:
    """A copy of a mapping from a spec, or an empty one in place of anything else (a flag replaces it)."""
    return dict(value) if isinstance(value, dict) else {}


RAY_FIELDS = "Ray's fields (pip, uv, py_modules, excludes, env_vars, working_dir)"


def from_file(path: Path) -> dict[str, Any]:
    """`--runtime-env FILE`: a Ray runtime env in YAML (or JSON, which YAML reads too)."""
    try:
        return read_yaml_file(path, "--runtime-env", holds=RAY_FIELDS)
    except YamlFileError as exc:
        if exc.unreadable:
            raise BadInput(f"--runtime-env: cannot read {path}: {exc.unreadable}") from None
        raise BadInput(f"--runtime-env: {path}: {exc.problem}") from None


def from_json(text: str) -> dict[str, Any]:
    """`--runtime-env-json JSON`: a Ray runtime env inline."""
    try:
        data = userinput.load_json(text)
    except userinput.InputError as exc:
        raise BadInput(f"--runtime-env-json: {exc.problem}; e.g. '{{\"pip\": [\"numpy\"]}}'") from None
    return _mapping(data, "--runtime-env-json")


def _mapping(data: Any, source: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise BadInput(f"{source}: a runtime env is a mapping of {RAY_FIELDS}")
    return data
