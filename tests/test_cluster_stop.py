"""Stopping a local cluster's processes (launcher.backends.local.cluster.terminate): a node's process that goes on
SIGTERM may leave descendants behind (a job's entrypoint, a worker); they are asked to stop too, with
SIGTERM, not left to the SIGKILL at the end, and one that was stopped (SIGSTOP: a hang drill's rank)
is continued so that it can act on it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil

from launcher.backends.local.cluster import terminate
from tests.conftest import wait_until

# A child that says which signal ended it; its parent (the "node") exits on SIGTERM without it.
CHILD = ("import signal, sys, time\n"
         "def done(number, _):\n    open(sys.argv[1], 'w').write(signal.Signals(number).name)\n    sys.exit(0)\n"
         "signal.signal(signal.SIGTERM, done)\nopen(sys.argv[1] + '.ready', 'w').close()\ntime.sleep(600)\n")
NODE = ("import subprocess, sys, time\n"
        "children = [subprocess.Popen([sys.executable, '-c', sys.argv[1], path], start_new_session=True)\n"
        "            for path in sys.argv[2:]]\n"
        "time.sleep(600)\n")


def test_what_a_node_leaves_behind_gets_sigterm_and_a_stopped_one_is_continued_first(tmp_path: Path):
    running, frozen = tmp_path / "running", tmp_path / "frozen"
    node = subprocess.Popen([sys.executable, "-c", NODE, CHILD, str(running), str(frozen)])
    try:
        wait_until(lambda: (tmp_path / "running.ready").exists() and (tmp_path / "frozen.ready").exists(), 30,
                   "the node's children")
        parent = psutil.Process(node.pid)
        children = parent.children()
        assert len(children) == 2
        stopped = next(child for child in children if str(frozen) in child.cmdline())
        stopped.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped.status() == psutil.STATUS_STOPPED, 10, "the child to stop")
        left = terminate([parent], grace=30)
        node.wait(10)
        assert left == []
        assert running.read_text() == "SIGTERM"
        assert frozen.read_text() == "SIGTERM"
        assert not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children)
    finally:
        node.kill()
        for child in psutil.Process().children(recursive=True):
            child.kill()
