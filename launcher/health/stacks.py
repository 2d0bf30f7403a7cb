"""Evidence before acting on a hang: the Python stack of every process of the job (the entrypoint's
process tree, the driver, actors, Ray Train workers), taken in parallel through Ray's own dashboard
(its py-spy traceback endpoint, `/worker/traceback`), saved with the run and grouped: in a hung
collective most ranks wait in the same frame, and the few elsewhere are the suspects.

The entrypoint's tree matters for the most common hang: a job that never calls `ray.init()` (a plain
script, or `torchrun --nproc_per_node=N train.py` whose ranks are children of the entrypoint) has no
driver, actor or task in Ray's view. Its processes are the descendants of the job's supervisor actor
on the head: on this machine they are listed and dumped one by one; on a remote cluster the
supervisor is dumped with its subprocesses (py-spy's `--subprocesses`, which stops at the first
descendant that is not Python: what it could not reach is said).

Recent Ray answers 403 there unless RAY_DASHBOARD_ENABLE_PROFILING=1 on the head (the launcher sets
it on the clusters it starts); what could not be taken is said, never guessed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from launcher.raydash import DashboardHttpError, RayDashboard
from launcher.state import private_dir, write_private

TRACEBACK_PATH = "/worker/traceback"
PROFILING_ENV = "RAY_DASHBOARD_ENABLE_PROFILING"  # "1" on the head: its dashboard takes stack dumps
TIMEOUT_S = 30.0  # py-spy attaches to each process; a busy node answers in seconds
MAX_PROCESSES = 256  # a bound on the evidence of one hang (the suspects show in any sample)
_FRAME = re.compile(r"^\s{4}(\S.*?) \((.+?):(\d+)\)\s*$")
_PROCESS_HEADER = re.compile(r"^Process (\d+): (.*)$", re.MULTILINE)  # py-spy's line before each process's stacks
SUPERVISOR_NAME = "_ray_internal_job_actor_{}"  # Ray's JobSupervisor actor of a submission (job/common.py)


@dataclass(frozen=True)
class Process:
    pid: int
    node_id: str
    ip: str
    role: str  # driver, actor <class>, task <name>, entrypoint <program>
    tree: bool = False  # the job's supervisor: what is wanted is its descendants (py-spy --subprocesses)


@dataclass
class Stack:
    process: Process
    text: str | None = None
    error: str | None = None

    @property
    def frame(self) -> str:
        """Where the process's main thread is: its innermost frame (`function (file:line)`)."""
        if not self.text:
            return "(no stack)"
        main = self.text.split('"MainThread"', 1)[-1] if '"MainThread"' in self.text else self.text
        for line in main.splitlines():
            match = _FRAME.match(line)
            if match:
                return f"{match[1]} ({Path(match[2]).name}:{match[3]})"
        return "(no Python frame)"


@dataclass
class Evidence:
    """The stacks of one hang, grouped by frame; `summary` is the line the journal shows."""

    taken: int
    failed: int
    groups: list[tuple[str, list[str]]] = field(default_factory=list)  # frame -> processes, largest first
    directory: str = ""
    error: str | None = None  # why none could be taken
    first_error: str | None = None  # why some could not

    @property
    def summary(self) -> str:
        if self.error:
            return f"no stacks: {self.error}"
        if not self.groups:
            return f"no stacks ({self.failed} process(es) did not answer)"
        (frame, common), *others = self.groups
        text = f"{self.taken} stack(s): {len(common)} in {frame}"
        if others:
            suspects = "; ".join(f"{', '.join(names[:4])}{' ...' if len(names) > 4 else ''} in {where}"
                                 for where, names in others[:3])
            text += f"; suspects: {suspects}"
        if self.failed:
            text += f"; {self.failed} could not be taken" + (f" ({self.first_error})" if self.first_error else "")
        return text


def job_processes(dashboard: RayDashboard, job_id: str | None, driver: dict[str, Any] | None,
                  submission_id: str | None = None, local: bool = False) -> list[Process]:
    """The job's processes: its driver, the entrypoint's process tree, its alive actors and the workers
    running its tasks (State API, filtered by job: a bounded ask, made only when a hang is found).
    `local`: the cluster runs on this machine, where the entrypoint's tree is listed process by process."""
    found: dict[int, Process] = {}
    if driver and driver.get("pid"):
        found[int(driver["pid"])] = Process(int(driver["pid"]), "", str(driver.get("node_ip_address") or ""),
                                            "driver")
    if submission_id:
        for row in dashboard.state_list("actors", [("name", "=", SUPERVISOR_NAME.format(submission_id)),
                                                   ("state", "=", "ALIVE")]):
            pid, node_id = int(row.get("pid") or 0), str(row.get("node_id") or "")
            if not pid:
                continue
            if not local:
                found.setdefault(pid, Process(pid, node_id, "", "entrypoint tree", tree=True))
                continue
            for child in entrypoint_tree(pid):
                found.setdefault(child.pid, Process(child.pid, node_id, "", f"entrypoint {child.role}"))
    if job_id:
        for row in dashboard.state_list("actors", [("job_id", "=", job_id), ("state", "=", "ALIVE")]):
            pid = int(row.get("pid") or 0)
            if pid and pid not in found:
                found[pid] = Process(pid, str(row.get("node_id") or ""), "", f"actor {row.get('class_name') or ''}"
                                     .strip())
        for row in dashboard.state_list("tasks", [("job_id", "=", job_id), ("state", "=", "RUNNING"),
                                                  ("type", "=", "NORMAL_TASK")]):
            pid = int(row.get("worker_pid") or 0)
            if pid and pid not in found:
                found[pid] = Process(pid, str(row.get("node_id") or ""), "", f"task {row.get('name') or ''}".strip())
    return list(found.values())[:MAX_PROCESSES]


@dataclass(frozen=True)
class Program:
    pid: int
    role: str  # the program's name


def program_name(argv: list[str]) -> str:
    """What a Python command line runs: `train.py`, `-m torch.distributed.run`, `-c`."""
    args = argv[1:]
    for index, arg in enumerate(args):
        if arg == "-m" and index + 1 < len(args):
            return f"-m {args[index + 1]}"
        if arg == "-c" or not arg.startswith("-"):
            return Path(arg).name
    return Path(argv[0]).name if argv else "?"


def entrypoint_tree(supervisor: int) -> list[Program]:
    """The Python processes below a job's supervisor on this machine (the entrypoint, and torchrun's or a
    launcher script's children): a shell or another program in between has no Python stack to take."""
    try:
        children = psutil.Process(supervisor).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for child in children:
        try:
            if Path(child.exe()).name.startswith("python"):
                found.append(Program(child.pid, program_name(child.cmdline())))
        except (psutil.Error, OSError):
            continue  # gone, or not ours to read
    return found


def take(dashboard: RayDashboard, process: Process) -> list[Stack]:
    query = {"pid": str(process.pid), "native": "0", "subprocesses": "1" if process.tree else "0"}
    query.update({"node_id": process.node_id} if process.node_id else {"ip": process.ip})
    status, body = dashboard.get(f"{TRACEBACK_PATH}?{urllib.parse.urlencode(query)}", timeout=TIMEOUT_S)
    text = body.decode(errors="replace")
    if status != 200:
        if status == 403:
            return [Stack(process, error=f"the dashboard refuses stack dumps ({PROFILING_ENV}=1 is "
                                         "not set on the head)")]
        return [Stack(process, error=f"HTTP {status}: {text[:200]}")]
    return split_tree(process, text) if process.tree else [Stack(process, text=text)]


def split_tree(supervisor: Process, text: str) -> list[Stack]:
    """py-spy's dump of a supervisor and its subprocesses as one stack per descendant; where py-spy
    stopped (a descendant that is not Python), one stack that says so."""
    headers = list(_PROCESS_HEADER.finditer(text))
    stacks = []
    for header, following in zip(headers, [*headers[1:], None], strict=True):
        pid = int(header[1])
        if pid == supervisor.pid:
            continue  # the supervisor only waits for the entrypoint
        body = text[header.start():following.start() if following else len(text)]
        role = program_name(header[2].split())
        stacks.append(Stack(Process(pid, supervisor.node_id, supervisor.ip, f"entrypoint {role}"),
                            text=body.split("\nError:", 1)[0]))
    stopped = text.find("\nError:")
    if stopped >= 0 or not headers:
        reason = text[stopped + 1:].splitlines()[0] if stopped >= 0 else text.strip()[:200]
        stacks.append(Stack(supervisor, error=f"py-spy could not follow every subprocess: {reason}"))
    return stacks


def take_here(process: Process) -> Stack:
    """py-spy on this machine, without pausing the process: for a local cluster's processes that the
    dashboard's py-spy could not dump (it pauses its target first, which fails on a stopped process)."""
    py_spy = Path(sys.executable).with_name("py-spy")
    try:
        done = subprocess.run([str(py_spy if py_spy.exists() else "py-spy"), "dump", "--nonblocking", "--pid",
                               str(process.pid)], capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Stack(process, error=f"py-spy: {exc}")
    if done.returncode != 0:
        return Stack(process, error=f"py-spy: {(done.stderr or done.stdout).strip().splitlines()[:3]}")
    return Stack(process, text=done.stdout)


def collect(dashboard: RayDashboard, processes: list[Process], directory: Path, local: bool = False) -> Evidence:
    """Every process's stack, in parallel; saved one file each under `directory` with a summary.
    `local`: the processes run on this machine (a local cluster), where what the dashboard could not
    dump is dumped directly."""
    if not processes:
        return Evidence(0, 0, error="the job has no alive process to take a stack of")

    def one(process: Process) -> list[Stack]:
        taken = _safe_take(dashboard, process)
        return [take_here(process)] if local and not process.tree and taken[0].text is None else taken

    with ThreadPoolExecutor(max_workers=min(32, len(processes)), thread_name_prefix="stacks") as pool:
        stacks = [stack for taken in pool.map(one, processes) for stack in taken]
    private_dir(directory)
    for stack in stacks:
        role = stack.process.role.split()[0]
        name = f"{stack.process.ip or stack.process.node_id[:12]}-{stack.process.pid}-{role}.txt"
        write_private(directory / name, stack.text if stack.text is not None else f"# not taken: {stack.error}\n")
    taken = [stack for stack in stacks if stack.text is not None]
    members: dict[str, list[str]] = {}
    for stack in taken:
        members.setdefault(stack.frame, []).append(f"{stack.process.role} {stack.process.pid}@"
                                                   f"{stack.process.ip or stack.process.node_id[:8]}")
    counts = Counter({frame: len(names) for frame, names in members.items()})
    groups = [(frame, members[frame]) for frame, _ in counts.most_common()]
    errors = sorted({stack.error for stack in stacks if stack.error})
    evidence = Evidence(len(taken), len(stacks) - len(taken), groups, str(directory),
                        error=errors[0] if not taken and errors else None,
                        first_error=errors[0][:160] if errors else None)
    write_private(directory / "summary.json", json.dumps(
        {"summary": evidence.summary, "groups": evidence.groups, "taken": evidence.taken, "failed": evidence.failed,
         "errors": errors, "processes": [asdict(stack.process) for stack in stacks]}, indent=2))
    return evidence


def load(directory: Path) -> Evidence:
    """Evidence saved by `collect`, with its stacks' files."""
    summary = json.loads((directory / "summary.json").read_text())
    return Evidence(summary["taken"], summary["failed"], [(frame, names) for frame, names in summary["groups"]],
                    str(directory), first_error=(summary.get("errors") or [None])[0])


def _safe_take(dashboard: RayDashboard, process: Process) -> list[Stack]:
    try:
        return take(dashboard, process)
    except (OSError, DashboardHttpError, ValueError) as exc:
        return [Stack(process, error=str(exc))]
