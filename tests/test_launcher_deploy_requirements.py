"""`launcher exporters deploy --with-deps` installs what the exporter imports and Ray does not bring:
the list must follow the exporter's real imports, or a Ray-only host fails at start-up."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys

from launcher.deploy import remote

# Everything `exporter serve` imports to start with its default collectors (pynvml is imported by the
# GPU collector's first run, so it is asked for explicitly).
IMPORTS = """
import json, sys
before = set(sys.modules)
import exporter.cli, exporter.serving.server, exporter.framework.collector, exporter.serving.webconfig
from exporter.framework.collector import load_collectors
load_collectors()
import pynvml
import bcrypt  # exporter.serving.webconfig imports it where a web config has users
print(json.dumps(sorted({name.split(".")[0] for name in set(sys.modules) - before})))
"""


def _names(requirement: str) -> str:
    return re.split(r"[<>=!~; \\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _requires(dist: str, extra: str | None = None) -> set[str]:
    try:
        requirements = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return set()
    return {_names(r) for r in requirements if "extra" not in r or (extra and f'extra == "{extra}"' in r)}


def _installed_with(roots: set[str], extra: str | None = None) -> set[str]:
    """What pip installs for these distributions: them, their requirements and theirs (two levels)."""
    first = roots | {name for root in roots for name in _requires(root, extra)}
    return first | {name for dist in first for name in _requires(dist)}


def test_every_third_party_import_of_the_exporter_comes_with_ray_or_with_deps():
    modules = json.loads(subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True,
                                        check=True).stdout)
    owners = importlib.metadata.packages_distributions()
    # `backports` is a parent package several distributions share (backports.tarfile, which twine's keyring
    # brings on Python < 3.12, backports.zstd): urllib3 and aiohttp try `from backports import zstd`, which
    # leaves the bare parent imported even when zstd is absent, and names no distribution the exporter needs.
    shared_parents = {"backports"}
    third_party = {owners[m][0].lower().replace("_", "-") for m in modules
                   if m in owners and m != "exporter" and m not in shared_parents}
    third_party.discard("raypulse")
    covered = _installed_with({"ray"}, extra="default") | _installed_with(set(remote.NOT_WITH_RAY))
    assert third_party - covered == set(), "add these to launcher/deploy/remote.py NOT_WITH_RAY"
    assert set(remote.NOT_WITH_RAY) <= third_party, "NOT_WITH_RAY lists something the exporter no longer imports"


def test_with_deps_pins_the_launchers_versions():
    pins = dict(requirement.split("==") for requirement in remote.exporter_requirements())
    assert pins == {dist: importlib.metadata.version(dist) for dist in remote.NOT_WITH_RAY}
    assert remote.runtime_env(remote.exporter_requirements())["pip"] == list(remote.exporter_requirements())
