"""What every `launcher` command pays before it does anything: the command line's imports. A command loads
what it uses when it runs (a run's recording loads numpy, its watcher the /metrics parser, `render` the
KubeRay renderer), so `launcher status`, `logs`, `stop`, `list` start in a fraction of the time."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

_CLI_IMPORTS = """
import json, sys
import launcher.cli
print(json.dumps(sorted(sys.modules)))
"""
# Each of these is for some commands only (or for none: Ray is imported by the Jobs client's first use).
NOT_LOADED = [
    "numpy",  # a recording's rounds (launcher/recording.py)
    "ray",
    "rich",  # the live display of a submit on a terminal (launcher/display.py)
    "asyncio",  # following a job's log
    "prometheus_client",  # the exporters' /metrics parser (launcher/exposition.py)
    "exporter.contract.digest",  # the health watcher's node digest
    "launcher.recording",
    "launcher.healing",
    "launcher.health.exporters",
    "launcher.backends.kuberay.render",
    "launcher.deploy.manifests",
    "alerts.prometheus",
    "dashboards",
]


def test_the_command_line_loads_no_module_a_command_may_not_need():
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", _CLI_IMPORTS], cwd=REPO, capture_output=True,
                                           text=True, check=True, timeout=60).stdout))
    assert [name for name in NOT_LOADED if name in loaded] == []


def test_commands_whose_modules_load_late_still_answer():
    for command in (["--help"], ["render", "--help"], ["exporters", "manifests", "--help"],
                    ["prometheus-config", "--help"]):
        result = subprocess.run([sys.executable, "-m", "launcher", *command], cwd=REPO, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, (command, result.stderr)
        if command == ["--help"]:
            assert all(name in result.stdout for name in ("exporters", "render", "prometheus-config")), result.stdout
