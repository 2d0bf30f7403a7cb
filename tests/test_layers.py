"""The layering of the product, checked from its imports (every import statement, also those inside
functions): what may depend on what.

- the exporter never imports the launcher or Ray (it talks to Ray over HTTP and keeps serving when
  Ray dies);
- the exporter is the ground floor: it imports neither dashboards nor alerts (they read its catalog and
  label contract; what carries all three, the Kubernetes deployment, is rendered by the launcher);
- a collector imports neither the server nor another collector: what collectors share goes
  through exporter/framework/shared.py;
- exporter/config.py is a leaf: no collector, no simulator;
- exporter/userinput.py, the reader of every file and YAML/JSON value a user gives, imports only the
  standard library and PyYAML: the configuration, the simulator and the launcher all import it;
- the collectors read what NVML they are given: the simulator is chosen by exporter/plugins.py;
- alerts/ and dashboards/ never import the launcher, nor each other;
- the deploy agent, which runs on the nodes, imports only the standard library, Ray and the wire
  contract (exporter/contract/wire.py);
- the launcher's health package depends on the node-remedy protocol only, never on a backend (each
  backend's remedy lives with it in launcher/backends/);
- a backend (its folder or module under launcher/backends/) never imports another backend: what two
  share is in launcher/backends/ beside them (base.py, exporters.py, kept.py);
- product code never imports the tests, the drills or the demo.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("exporter", "launcher", "alerts", "dashboards")
HARNESS = ("tests", "scripts", "bench", "examples")
COLLECTORS = "exporter.collectors"
COLLECTOR_PROTOCOL = "exporter.framework.collector"  # what a collector is, and the registry
SERVER = "exporter.serving.server"
AGENT = "launcher.deploy.raypulse_agent"
USERINPUT = "exporter.userinput"  # every module may import it, so it imports none of ours
CONTRACT = "exporter.contract"  # its __init__ imports nothing: `from exporter.contract import wire` loads wire only
WIRE = "exporter.contract.wire"
# Run in the training processes: the client's Ray Train helper, the RLlib callback and the task that tells the
# head about the rollout servers may import ray.
TRAINING_CLIENT = ("exporter.progress.client", "exporter.progress.rllib", "exporter.progress.rollout")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PRODUCT for path in sorted((REPO / package).rglob("*.py"))}


def imports(name: str, path: Path) -> Iterator[str]:
    """Every module an import statement of the file names (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@functools.cache
def backend_homes() -> frozenset[str]:
    """Where each registered backend lives: `launcher.backends.kuberay` (a folder), `...existing` (a module)."""
    from launcher.backends.registry import BACKENDS

    return frozenset(".".join(backend.__module__.split(".")[:3]) for backend in BACKENDS.values())


def backend_home(name: str) -> str | None:
    """The backend a module belongs to (`launcher.backends.kuberay` for launcher.backends.kuberay.follow)."""
    return next((home for home in backend_homes() if within(name, home)), None)


def registers_a_collector(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.ClassDef) and any(
        (isinstance(d, ast.Name) and d.id == "register") or (isinstance(d, ast.Attribute) and d.attr == "register")
        for d in node.decorator_list) for node in ast.walk(tree))


def collector_area(name: str) -> str | None:
    """`exporter.collectors.gpu` for every module of the gpu package; a module directly under
    exporter/collectors is its own area; None for modules outside the collectors."""
    if not within(name, COLLECTORS) or name == COLLECTORS:
        return None
    return ".".join(name.split(".")[:3])


def violations(modules: dict[str, Path]) -> list[str]:
    collector_modules = {name for name, path in modules.items() if registers_a_collector(path)}
    shared_helpers = {name for name in modules if collector_area(name) is not None
                      and name.count(".") == 2 and modules[name].name != "__init__.py"
                      and name not in collector_modules}  # e.g. collectors/files.py
    stdlib = set(sys.stdlib_module_names)
    found = []
    for name, path in modules.items():
        for target in set(imports(name, path)):
            top = target.split(".")[0]
            where = f"{name} imports {target}"
            if top in HARNESS:
                found.append(f"{where}: product code never imports the tests, drills or demo")
            if within(name, "exporter") and (top == "launcher" or (top == "ray" and name not in TRAINING_CLIENT)):
                found.append(f"{where}: the exporter imports neither the launcher nor Ray")
            if within(name, "exporter") and top in ("dashboards", "alerts"):
                found.append(f"{where}: the exporter imports neither dashboards nor alerts (they are built on it)")
            if within(name, "launcher.health") and within(target, "launcher.backends"):
                found.append(f"{where}: the health package depends on the remedy protocol only, never on a backend")
            home, other = backend_home(name), backend_home(target)
            if home is not None and other is not None and other != home:
                found.append(f"{where}: a backend never imports another backend")
            if (within(name, "alerts") or within(name, "dashboards")) and top == "launcher":
                found.append(f"{where}: alerts and dashboards never import the launcher")
            if {top, name.split(".")[0]} == {"alerts", "dashboards"}:
                found.append(f"{where}: alerts and dashboards never import each other (what both read is in the "
                             f"exporter, e.g. {CONTRACT}.node_exporter)")
            if name == "exporter.config" and (within(target, COLLECTORS) or within(target, COLLECTOR_PROTOCOL)
                                              or within(target, "exporter.gpusim")):
                found.append(f"{where}: exporter/config.py is a leaf (no collector, no simulator)")
            if name == USERINPUT and top not in stdlib and top != "yaml":
                found.append(f"{where}: exporter/userinput.py imports only the standard library and PyYAML")
            area = collector_area(name)
            if area is not None:
                if within(target, SERVER):
                    found.append(f"{where}: a collector never imports the server")
                if within(target, "exporter.gpusim"):
                    found.append(f"{where}: a collector never imports the simulator (exporter/plugins.py chooses it)")
                other = collector_area(target)
                if other is not None and other != area and not any(within(target, h) for h in shared_helpers):
                    found.append(f"{where}: a collector never imports another collector's package")
                if name in collector_modules and target in collector_modules and target != name:
                    found.append(f"{where}: a collector never imports another collector")
            if within(name, AGENT) and top not in stdlib and top != "ray" and not within(target, WIRE) \
                    and target not in ("exporter", CONTRACT) and not within(target, AGENT):
                found.append(f"{where}: the deploy agent imports only the standard library, Ray and {WIRE}")
    return sorted(set(found))


def test_the_product_keeps_its_layers():
    assert violations(product_modules()) == []


@pytest.mark.parametrize(("module", "source", "rule"), [
    ("exporter.collectors.ray.bad", "from launcher import api\n", "the exporter imports neither"),
    ("exporter.collectors.ray.bad", "import ray\n", "the exporter imports neither"),
    ("exporter.bad", "def f():\n    from dashboards import cut\n", "imports neither dashboards nor alerts"),
    ("exporter.bad", "import alerts.prometheus\n", "imports neither dashboards nor alerts"),
    ("exporter.collectors.ray.bad", "from exporter.collectors.gpu import collector\n", "another collector's"),
    ("exporter.collectors.ray.bad", "from ..gpu.collector import GpuCollector\n", "another collector's"),
    ("exporter.collectors.ray.bad", "from exporter.serving import server\n", "never imports the server"),
    ("exporter.config", "from exporter.gpusim.models import model\n", "is a leaf"),
    ("exporter.config", "from exporter.framework.collector import REGISTRY\n", "is a leaf"),
    ("exporter.userinput", "from exporter.config import ConfigError\n", "imports only the standard library"),
    ("exporter.collectors.gpu.bad", "from exporter.gpusim.nvml import SimulatedNvml\n", "never imports the simulator"),
    ("alerts.bad", "def f():\n    from launcher.spec import JobSpec\n", "never import the launcher"),
    ("launcher.bad", "from scripts import stack\n", "never imports the tests"),
    ("launcher.health.bad", "from launcher.backends.local.cluster import LocalCluster\n", "never on a backend"),
    ("launcher.health.bad", "from launcher.backends.existing import DrainRemedy\n", "never on a backend"),
    ("launcher.deploy.raypulse_agent.bad", "import psutil\n", "the deploy agent imports only"),
    ("launcher.deploy.raypulse_agent.bad", "from exporter.contract import labels\n", "the deploy agent imports only"),
    ("dashboards.bad", "from alerts.config import Config\n", "never import each other"),
])
def test_the_check_finds_each_kind_of_violation(tmp_path: Path, module: str, source: str, rule: str):
    path = tmp_path / "bad.py"
    path.write_text(source)
    found = violations({**product_modules(), module: path})
    assert any(rule in line for line in found), found
