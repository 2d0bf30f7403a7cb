"""The stacks of a job whose entrypoint never calls ray.init(): its processes are the Python
descendants of the job's supervisor, taken one by one on this machine (real processes, real py-spy),
or split out of py-spy's dump of the supervisor with its subprocesses on a remote cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from launcher.health import stacks
from launcher.raydash import RayDashboard
from tests.conftest import wait_until

PY_SPY = Path(sys.executable).with_name("py-spy")
# A rank says it is ready (a directory named after its pid) on the line where it then sleeps, so once both
# are ready both stacks are in all_reduce at line 3, however slowly the interpreters started.
RANK = ("import os, time\ndef all_reduce():\n"
        "    os.mkdir(os.environ[\"RANKS_READY\"] + \"/\" + str(os.getpid())); time.sleep(600)\nall_reduce()\n")
# A stand-in for Ray's job supervisor: it runs the entrypoint through a shell, which starts two ranks,
# as `torchrun --nproc_per_node=2 train.py` would.
SUPERVISOR = textwrap.dedent(f"""
    import subprocess, sys, time
    rank = {RANK!r}
    subprocess.Popen(["/bin/sh", "-c", f"{{sys.executable}} -c '{{rank}}' & {{sys.executable}} -c '{{rank}}'; wait"])
    time.sleep(600)
""")


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[psutil.Process]:
    ready = tmp_path / "ranks-ready"
    ready.mkdir()
    process = subprocess.Popen([sys.executable, "-c", SUPERVISOR], env={**os.environ, "RANKS_READY": str(ready)})
    parent = psutil.Process(process.pid)
    try:
        wait_until(lambda: len(list(ready.iterdir())) == 2, 60, "the two ranks in all_reduce")
        yield parent
    finally:
        for child in parent.children(recursive=True):
            child.kill()
        process.kill()
        process.wait()


def test_the_entrypoint_tree_is_its_python_descendants(supervisor: psutil.Process):
    ranks = {child.pid for child in supervisor.children(recursive=True) if child.name().startswith("python")}
    tree = stacks.entrypoint_tree(supervisor.pid)
    assert {program.pid for program in tree} == ranks  # the shell in between has no Python stack
    assert {program.role for program in tree} == {"-c"}


def test_a_local_entrypoint_tree_is_dumped_rank_by_rank(supervisor: psutil.Process, tmp_path: Path):
    unreachable = RayDashboard("http://127.0.0.1:9", "token")  # the dashboard's py-spy is not there: py-spy here
    processes = [stacks.Process(program.pid, "node", "", f"entrypoint {program.role}")
                 for program in stacks.entrypoint_tree(supervisor.pid)]
    evidence = stacks.collect(unreachable, processes, tmp_path / "stacks", local=True)
    assert (evidence.taken, evidence.failed) == (2, 0), evidence.summary
    [(frame, members)] = evidence.groups
    assert frame == "all_reduce (<string>:3)"
    assert len(members) == 2


def test_a_remote_supervisors_dump_is_split_per_process(supervisor: psutil.Process):
    dump = subprocess.run([str(PY_SPY), "dump", "--nonblocking", "--subprocesses", "--pid", str(supervisor.pid)],
                          capture_output=True, text=True, timeout=60)
    tree = stacks.Process(supervisor.pid, "node", "10.0.0.1", "entrypoint tree", tree=True)
    split = stacks.split_tree(tree, dump.stdout + dump.stderr)
    taken = [stack for stack in split if stack.text is not None]
    assert all(stack.process.pid != supervisor.pid for stack in taken)  # it only waits for the entrypoint
    assert all(stack.frame == "all_reduce (<string>:3)" for stack in taken)
    # py-spy stops at the shell between the supervisor and the ranks: that is said, not hidden.
    assert [stack.error for stack in split if stack.text is None] == [
        "py-spy could not follow every subprocess: Error: Failed to find python version from target process"]


@pytest.mark.parametrize(("argv", "name"), [
    (["/usr/bin/python3", "train.py", "--epochs", "3"], "train.py"),
    (["python", "-u", "-m", "torch.distributed.run", "--nproc_per_node=8", "train.py"], "-m torch.distributed.run"),
    (["python3", "-c", "print(1)"], "-c"),
    (["python3"], "python3"),
])
def test_a_program_is_named_by_what_it_runs(argv: list[str], name: str):
    assert stacks.program_name(argv) == name
