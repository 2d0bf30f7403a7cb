"""How the Ray collectors read their sources, on replies recorded from a real Ray 2.60 cluster
(tests/data/ray, recorded by a test cluster: a launcher-style run that failed once and was
resubmitted, a plain `ray job submit`, an unplaceable placement group, a killed worker node)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ray.dashboard.utils import to_camel_case as rays_to_camel_case

from exporter.collectors.ray import cluster, job_workload, jobs
from exporter.collectors.ray.localray import Raylet, parse_raylet, watched
from exporter.collectors.ray.process_info import Proc
from exporter.collectors.ray.process_owners import Identity, parse_node_view, title_identity
from exporter.collectors.ray.sd import deployed_ports, target_groups
from exporter.contract import wire
from exporter.framework.snapshot import SampleSink
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "ray"


def recorded(name: str):
    return json.loads((DATA / name).read_text())


def state_rows(name: str) -> list[dict]:
    return recorded(name)["data"]["result"]["result"]


def values(sink: SampleSink, spec) -> dict[tuple[tuple[str, str], ...], float]:
    snapshot = sink.freeze(0.0)
    return {tuple(zip(spec.labels, labels, strict=True)): value for labels, value in snapshot.families.get(spec, ())}


def one(sink: SampleSink, spec, **labels) -> float | None:
    return sink.freeze(0.0).value(spec, **labels)


# -- the raylets on this host -------------------------------------------------------------------

HEAD_ARGV = ["/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet",
             "--raylet_socket_name=/tmp/rp/session_1/sockets/raylet", "--node_manager_port=48001",
             "--node_id=84c0dd9b203b755540e849326adad3d159cf344aed2a525ce3ca691b", "--node_ip_address=10.0.0.5",
             "--python_worker_command=/venv/bin/python3 setup_worker.py default_worker.py --node-ip-address=10.0.0.5 "
             "--temp-dir=/tmp/rp --webui=10.0.0.5:8265 --cluster-id=55104c RAY_WORKER_DYNAMIC_OPTION_PLACEHOLDER",
             "--session_dir=/tmp/rp/session_1", '--labels={"raypulse.io/exporter-port": "9477"}', "--head",
             "--num_prestart_python_workers=1"]


def test_a_raylet_is_read_from_its_command_line():
    raylet = parse_raylet(100, HEAD_ARGV)
    assert raylet == Raylet(pid=100, node_id="84c0dd9b203b755540e849326adad3d159cf344aed2a525ce3ca691b",
                            is_head=True, node_ip="10.0.0.5", labels={"raypulse.io/exporter-port": "9477"},
                            dashboard="10.0.0.5:8265", session_dir=Path("/tmp/rp/session_1"))
    assert raylet.exporter_port == 9477
    assert parse_raylet(101, ["/usr/bin/raylet", "--help"]) is None


def test_an_exporter_watches_the_raylets_labelled_with_its_port_else_the_unlabelled_ones():
    mine = Raylet(1, "a", False, "", {"raypulse.io/exporter-port": "9477"})
    other = Raylet(2, "b", False, "", {"raypulse.io/exporter-port": "9478"})
    by_hand = Raylet(3, "c", False, "", {})
    assert watched([mine, other, by_hand], 9477) == [mine]
    assert watched([other, by_hand], 9477) == [by_hand]
    assert watched([other], 9477) == []
    # Told its node (`launcher exporters deploy` does), an exporter watches that raylet only.
    assert watched([mine, other, by_hand], 9477, node_id=by_hand.node_id) == [by_hand]


# -- jobs ---------------------------------------------------------------------------------------

def recorded_jobs() -> dict[str, jobs.Job]:
    parsed = [jobs.parse_job(raw) for raw in recorded("jobs.json")]
    return {job.key: job for job in parsed if job is not None}


def test_jobs_carry_the_launchers_metadata_and_plain_jobs_are_kept():
    found = recorded_jobs()
    assert set(found) == {"run-a-1", "run-a-2", "plain-1", "pg-1"}
    failed = found["run-a-1"]
    assert (failed.job_id, failed.status, failed.error_type, failed.driver_exit_code) == \
        ("02000000", "FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR", 1)
    assert (failed.meta(wire.META_JOB_NAME), failed.meta(wire.META_RUN_ID), failed.meta_int(wire.META_ATTEMPT),
            failed.meta(wire.META_USER)) == \
        ("demo", "run-a", 1, "alice")
    assert failed.user_labels() == [("team", "ml")]
    assert failed.end_time > failed.submit_time > 1.7e9  # seconds, not Ray's milliseconds
    plain = found["plain-1"]  # never called ray.init: no Ray job id, still a job
    assert (plain.job_id, plain.submission_id, plain.meta(wire.META_JOB_NAME), plain.meta_int(wire.META_ATTEMPT)) == \
        ("", "plain-1", "", None)


def test_job_series_from_recorded_jobs():
    found = recorded_jobs()
    now = found["run-a-2"].submit_time + 30
    starts = jobs.StartTimes()
    starts.update(found.values(), now, lambda job: found["run-a-2"].submit_time + 2 if job.key == "run-a-2" else None)
    out = SampleSink(jobs.NAME)
    jobs.emit(out, found.values(), starts, [], now)
    attempt2 = {"job_id": "03000000", "submission_id": "run-a-2"}
    assert one(out, jobs.INFO, **attempt2, type="SUBMISSION", job_name="demo", run_id="run-a", workspace="",
               user="") == 1
    assert one(out, jobs.STATE, **attempt2, state="RUNNING") == 1
    assert one(out, jobs.STATE, **attempt2, state="FAILED") == 0
    assert one(out, jobs.ATTEMPT, **attempt2) == 2
    assert one(out, jobs.MAX_ATTEMPTS, **attempt2) == 3
    assert one(out, jobs.PENDING, **attempt2) == pytest.approx(2)
    assert one(out, jobs.DURATION, **attempt2) == pytest.approx(30)
    assert one(out, jobs.END_TIME, **attempt2) is None
    failed = {"job_id": "02000000", "submission_id": "run-a-1"}
    assert one(out, jobs.ERROR, **failed, error_type="JOB_ENTRYPOINT_COMMAND_ERROR") == 1
    assert one(out, jobs.EXIT_CODE, **failed) == 1
    assert one(out, jobs.LABEL_INFO, **failed, label_key="team", label_value="ml") == 1
    assert one(out, jobs.START_TIME, **failed) is None  # ended before the exporter saw it run
    assert one(out, jobs.INFO, job_id="", submission_id="plain-1", type="SUBMISSION", job_name="", run_id="",
               workspace="", user="") == 1


def test_a_start_time_is_observed_when_the_driver_is_elsewhere():
    pending = jobs.parse_job({"submission_id": "s", "status": "PENDING", "start_time": 1_000_000})
    running = jobs.parse_job({"submission_id": "s", "job_id": "05000000", "status": "RUNNING",
                              "start_time": 1_000_000})
    starts = jobs.StartTimes()
    starts.update([pending], 1005.0, lambda job: None)
    assert starts.get(pending) is None
    starts.update([running], 1012.0, lambda job: None)
    assert starts.get(running) == 1012.0
    starts.update([], 1013.0, lambda job: None)  # the job left Ray's list: forgotten
    assert starts.get(running) is None


def test_finished_jobs_stay_for_the_retention_window_and_up_to_the_cap():
    def job(key: str, status: str, end: float | None) -> jobs.Job:
        return jobs.parse_job({"submission_id": key, "status": status, "start_time": 1000,
                               "end_time": end * 1000 if end else None})
    listed = [job("running", "RUNNING", None), job("new", "SUCCEEDED", 990), job("newer", "FAILED", 995),
              job("old", "SUCCEEDED", 100)]
    assert [j.key for j in jobs.select_jobs(listed, 1000, retention_seconds=60, max_finished=10)] == \
        ["running", "newer", "new"]
    assert [j.key for j in jobs.select_jobs(listed, 1000, retention_seconds=60, max_finished=1)] == \
        ["running", "newer"]


def test_the_driver_log_is_found_in_the_session_of_this_host(tmp_path):
    log = tmp_path / "session_1" / "logs" / "job-driver-run-a-2.log"
    log.parent.mkdir(parents=True)
    log.write_text("step 1\n")
    assert jobs.driver_log_mtime([tmp_path / "nowhere", tmp_path / "session_1"], "run-a-2") == log.stat().st_mtime
    assert jobs.driver_log_mtime([tmp_path / "session_1"], "../../etc/passwd") is None


# -- workload of a job --------------------------------------------------------------------------

def test_actor_deaths_are_classified_by_cause():
    assert job_workload.death_reason({"actor_died_error_context": {"reason": "NODE_DIED", "error_message": "..."}}) == \
        "NODE_DIED"
    assert job_workload.death_reason({"oom_context": {"error_message": "killed"}}) == "OUT_OF_MEMORY"
    assert job_workload.death_reason({"creation_task_failure_context": {}}) == "CREATION_TASK_ERROR"
    assert job_workload.death_reason({"actor_died_error_context": {"reason": "free text!"}}) == "UNKNOWN"
    assert job_workload.death_reason(None) == "UNKNOWN"


def test_the_recorded_task_failures_are_infrastructure_and_user_errors_by_type():
    failed = state_rows("failed_tasks_of_job.json")
    assert {jobs.enum_value(task["error_type"]) for task in failed} <= {"TASK_EXECUTION_EXCEPTION", "WORKER_DIED",
                                                                        "NODE_DIED", "ACTOR_DIED", "OWNER_DIED"}
    summary = recorded("task_summary_of_job.json")["data"]["result"]["result"]["node_id_to_summary"]["cluster"]
    assert "Trainer.train" in summary["summary"]


# -- the cluster --------------------------------------------------------------------------------

def test_dead_nodes_and_their_cause():
    nodes = [cluster.parse_node(row) for row in state_rows("nodes.json")]
    dead = [n for n in nodes if not n.alive]
    assert [n.death_reason for n in dead] == ["UNEXPECTED_TERMINATION"]
    out = SampleSink(jobs.NAME)
    cluster.emit_nodes(out, nodes, now=dead[0].end_time + 10, retention_seconds=60)
    assert values(out, cluster.NODES) == {(("state", "ALIVE"),): 2, (("state", "DEAD"),): 1}
    assert one(out, cluster.NODE_DEATH, node_id=dead[0].node_id, reason="UNEXPECTED_TERMINATION") == 1
    out = SampleSink(jobs.NAME)
    cluster.emit_nodes(out, nodes, now=dead[0].end_time + 600, retention_seconds=60)
    assert one(out, cluster.NODE_ALIVE, node_id=dead[0].node_id, node_ip=dead[0].node_ip, node_role="worker") is None
    assert values(out, cluster.NODE_DEATHS) == {(("reason", "UNEXPECTED_TERMINATION"),): 1}


@pytest.mark.parametrize("name", ["object_store_memory", "CPU", "node:__internal_head__", "my_custom_res", "GPU",
                                  "accelerator_type:A100"])
def test_resource_names_are_camel_cased_as_ray_does(name):
    assert cluster.to_camel_case(name) == rays_to_camel_case(name)


def test_resources_and_pending_demand_from_the_load_report():
    nodes = [cluster.parse_node(row) for row in state_rows("nodes.json")]
    out = SampleSink(jobs.NAME)
    cluster.emit_resources(out, recorded("cluster_status.json")["data"], nodes)
    capacity = {dict(k)["resource"]: v for k, v in values(out, cluster.CAPACITY).items()}
    assert capacity["CPU"] == 3
    assert capacity["object_store_memory"] == 3 * 83886080  # mapped back from objectStoreMemory
    assert not any(name.startswith("node:") for name in capacity)
    assert one(out, cluster.USED, resource="CPU") == 2
    assert one(out, cluster.DEMAND, resource="CPU") == 64  # the placement group that does not fit
    head = next(n for n in nodes if n.is_head)
    assert one(out, cluster.NODE_CAPACITY, node_id=head.node_id, resource="memory") > 0


def test_placement_groups_by_state_and_the_oldest_pending_one():
    groups = state_rows("placement_groups.json")
    received = int(groups[0]["stats"]["creation_request_received_ns"]) / 1e9
    out = SampleSink(jobs.NAME)
    cluster.emit_placement_groups(out, groups, now=received + 42)
    assert one(out, cluster.PLACEMENT_GROUPS, state="PENDING") == 1
    assert one(out, cluster.PLACEMENT_GROUPS, state="CREATED") == 0
    assert one(out, cluster.OLDEST_PENDING_PG) == pytest.approx(42)
    assert cluster.placement_groups_by_job(groups) == {"04000000": {"PENDING": 1}}


def test_service_discovery_lists_alive_nodes_with_their_exporter_ports():
    nodes = [cluster.parse_node(row) for row in state_rows("nodes.json")]
    groups = target_groups(nodes, "demo", fallback_port=9477)
    assert [g["labels"]["role"] for g in groups] == ["head", "worker"]
    for group, node in zip(groups, sorted((n for n in nodes if n.alive), key=lambda n: not n.is_head), strict=True):
        assert group["targets"] == [f"{node.node_ip}:{node.labels['raypulse.io/exporter-port']}"]
        assert group["labels"] == {"cluster": "demo", "node": node.node_name, "role": group["labels"]["role"],
                                   "ray_node_id": node.node_id}
    unlabelled = cluster.Node("n1", "fd00::1", "n1", False, True, "", None, None)
    assert target_groups([unlabelled], "", 9477)[0]["targets"] == ["[fd00::1]:9477"]


def test_service_discovery_takes_the_port_of_an_exporter_deployed_by_ray_actors():
    # `launcher exporters deploy` names each node's actor exporter-<node id>-<port>; labels still win.
    actors = [{"name": "exporter-n1-9501"}, {"name": "supervisor"}, {"name": "exporter-n2-x"}, {"name": None}]
    assert deployed_ports(actors) == {"n1": 9501}
    unlabelled = cluster.Node("n1", "10.0.0.7", "n1", False, True, "", None, None)
    other = cluster.Node("n3", "10.0.0.8", "n3", False, True, "", None, None)
    groups = target_groups([unlabelled, other], "demo", 9477, deployed_ports(actors))
    assert [g["targets"] for g in groups] == [["10.0.0.7:9501"], ["10.0.0.8:9477"]]
    labelled = [cluster.parse_node(row) for row in state_rows("nodes.json")]
    ports = {node.node_id: 1 for node in labelled}
    assert target_groups(labelled, "demo", 9477, ports) == target_groups(labelled, "demo", 9477)


# -- processes ----------------------------------------------------------------------------------

def test_a_nodes_actors_map_their_processes_to_job_and_class():
    view = parse_node_view(recorded("node_detail.json")["data"]["detail"])
    assert list(view.workers.values()) == [Identity("03000000", "", "actor", "Trainer")]  # not the dead actor
    assert int(view.store["objectStoreBytesAvail"]) == 83886080


def test_workers_the_dashboard_does_not_name_are_idle_or_unknown():
    proc = Proc(pid=1, ppid=0, start_ticks=0, cpu_seconds=0, resident_bytes=0, shared_bytes=0, title="ray::IDLE")
    assert title_identity(proc) == Identity("", "", "idle")
    assert title_identity(Proc(1, 0, 0, 0, 0, 0, "ray::train_step")) == Identity("", "", "worker")


def test_ray_series_never_carry_the_labels_sd_puts_on_targets():
    """Prometheus would rename a series label that a target also has (exported_role), so series say
    node_id / node_role / process_role / cluster_name where /sd says ray_node_id / role / cluster."""
    from exporter.framework.catalog import CATALOG
    from exporter.framework.collector import load_collectors

    load_collectors()
    ours = [s for s in CATALOG if s.collector in ("ray", "ray_head", "ray_processes", "train")]
    assert len(ours) >= 50
    assert [s.name for s in ours if set(s.labels) & {"cluster", "node", "role", "ray_node_id"}] == []


def test_the_exporter_never_imports_ray():
    code = ("import sys\nfrom exporter.serving.server import Exporter\nfrom exporter.config import load_config\n"
            "Exporter(load_config({}, environ={}))\nimport exporter.progress\n"
            "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if m.startswith('ray'))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr



class JobsApi:
    """The one Jobs API call the directory makes, answering from a list the test changes."""

    def __init__(self) -> None:
        self.jobs: list[dict] = []
        self.calls = 0

    async def json(self, path: str):
        assert path == "/api/jobs/"
        self.calls += 1
        return self.jobs


async def test_the_job_directory_asks_at_once_for_a_new_id_then_backs_off():
    from exporter.collectors.ray.job_ids import JobDirectory

    now = [0.0]
    directory, api = JobDirectory(clock=lambda: now[0]), JobsApi()
    api.jobs = [{"submission_id": "sub-1", "job_id": None}]  # submitted; the driver has not connected yet
    pairs = [("", "sub-1")]
    asked_at = []
    for second in range(40):
        now[0] = float(second)
        if directory.due(pairs):
            asked_at.append(second)
            await directory.refresh(api)
        if second == 9:
            api.jobs = [{"submission_id": "sub-1", "job_id": "02000000"}]
    assert asked_at == [0, 2, 6, 14]  # then known: no more reads
    assert directory.resolve("", "sub-1") == ("02000000", "sub-1")
    assert directory.resolve("02000000", "") == ("02000000", "sub-1")
    now[0] = 41.0
    assert directory.due([("03000000", "")])  # a new id is looked up at once


def test_process_cpu_counters_keep_what_exited_processes_used_and_end_with_the_group():
    from exporter.collectors.ray.process_collector import CPU, PROCESSES, RayProcessesCollector
    from exporter.config import load_config

    collector = RayProcessesCollector(load_config({}, environ={}))
    actor = Identity("02000000", "run-1", "actor", "Trainer")
    labels = {"job_id": "02000000", "submission_id": "run-1", "process_role": "actor", "actor_class": "Trainer",
              "actor_role": "trainer"}

    def run(*procs: Proc) -> SampleSink:
        out = SampleSink("ray_processes")
        collector._emit_processes(out, {(p.pid, p.start_ticks): (p, actor) for p in procs})
        return out

    first = run(Proc(10, 1, 500, 4.0, 1 << 20, 0, "ray::Trainer"), Proc(11, 1, 600, 1.0, 1 << 20, 0, "ray::Trainer"))
    assert one(first, CPU, **labels) == 5.0
    second = run(Proc(10, 1, 500, 6.0, 1 << 20, 0, "ray::Trainer"))  # pid 11 exited
    assert one(second, CPU, **labels) == 7.0  # its second stays counted
    assert one(second, PROCESSES, **labels) == 1
    third = run(Proc(10, 1, 500, 6.5, 1 << 20, 0, "ray::Trainer"), Proc(11, 1, 900, 0.2, 1 << 20, 0, "ray::X"))
    assert one(third, CPU, **labels) == 7.7  # a reused pid is a new process (new start time)
    assert one(run(), CPU, **labels) is None  # no process left: the series ends


def test_actors_get_their_role_from_their_class_and_the_roles_gpus_are_averaged():
    from exporter.collectors.ray.process_collector import PROCESSES, ROLE_GPU_SM, ROLE_GPUS, RayProcessesCollector
    from exporter.config import load_config
    from exporter.framework.shared import GpuProcessUsage, Shared

    config = load_config({}, environ={})
    shared = Shared.for_config(config)
    collector = RayProcessesCollector(config, shared)
    job = {"job_id": "02000000", "submission_id": "rl-1"}
    members = {}
    for pid, actor_class in ((10, "Generator"), (11, "Generator"), (12, "SingleAgentEnvRunner"), (13, "Trainer"),
                             (14, "RayTrainWorker"), (15, "Scorer")):
        proc = Proc(pid, 1, 100 + pid, 1.0, 1 << 20, 0, f"ray::{actor_class}")
        members[(pid, proc.start_ticks)] = (proc, Identity(job["job_id"], job["submission_id"], "actor", actor_class))

    def use(pid: int, gpu: int, sm: float | None) -> GpuProcessUsage:
        return GpuProcessUsage(pid, gpu, f"GPU-{gpu}", 1 << 30, sm, None, "python")

    shared.gpu_processes.publish({10: (use(10, 0, 0.25),), 11: (use(11, 0, 0.25),), 12: (use(12, 1, 0.1),),
                                  13: (use(13, 2, 0.9),), 14: (use(14, 3, None),), 15: (use(15, 4, 0.5),)})
    out = SampleSink("ray_processes")
    collector._emit_processes(out, members)
    frozen = out.freeze(0.0)
    roles = {values[PROCESSES.labels.index("actor_class")]: values[PROCESSES.labels.index("actor_role")]
             for values, _ in frozen.families[PROCESSES]}
    assert roles == {"Generator": "generator", "SingleAgentEnvRunner": "generator", "Trainer": "trainer",
                     "RayTrainWorker": "trainer", "Scorer": ""}
    assert one(out, ROLE_GPUS, **job, actor_role="generator") == 2  # GPU 0 (two generators) and GPU 1
    assert one(out, ROLE_GPU_SM, **job, actor_role="generator") == pytest.approx((0.5 + 0.1) / 2)
    assert one(out, ROLE_GPUS, **job, actor_role="trainer") == 2
    assert one(out, ROLE_GPU_SM, **job, actor_role="trainer") == pytest.approx(0.9)  # GPU 3 gave no sample
    assert one(out, ROLE_GPUS, **job, actor_role="") is None  # an actor without a role is in no role series


# The class names Ray gives the RL frameworks' actors (the last part of the qualified name: checked on Ray
# 2.60, where a class made inside a function, like verl's WorkerDict, runs tasks named "WorkerDict.ping"),
# read from each framework's source at the version exporter/config.py's DEFAULT_ACTOR_ROLES names.
FRAMEWORK_ACTORS = {
    "verl": {"ActorRolloutRefWorker": "trainer", "AsyncActorRolloutRefWorker": "trainer", "WorkerDict": "trainer",
             "FusedWorker": "trainer", "TrainingWorker": "trainer", "CriticWorker": "critic",
             "RewardModelWorker": "reward", "RewardLoopWorker": "reward", "vLLMHttpServer": "generator",
             "SGLangHttpServer": "generator", "TRTLLMHttpServer": "generator", "AgentLoopWorker": "generator",
             "FullyAsyncRollouter": "generator", "FullyAsyncTrainer": "trainer", "TaskRunner": ""},
    "OpenRLHF": {"PolicyModelActor": "trainer", "ReferenceModelActor": "reference", "RewardModelActor": "reward",
                 "CriticModelActor": "critic", "RolloutRayActor": "generator", "LLMRayActor": "generator",
                 "GenerateSamplesActor": "generator", "TrainingActor": "trainer"},
    "Ray": {"RayTrainWorker": "trainer", "SingleAgentEnvRunner": "generator", "MultiAgentEnvRunner": "generator",
            "_WrappedExecutable": "trainer"},
}


@pytest.mark.parametrize("framework", sorted(FRAMEWORK_ACTORS))
def test_the_default_roles_name_each_rl_frameworks_actors(framework: str):
    from exporter.collectors.ray.actor_roles import ActorRoles
    from exporter.config import load_config

    roles = ActorRoles(load_config({}, environ={}).ray.actor_roles)
    expected = FRAMEWORK_ACTORS[framework]
    assert {actor_class: roles.of(actor_class) for actor_class in expected} == expected


def test_actor_roles_are_configurable_and_checked():
    from exporter.collectors.ray.actor_roles import ActorRoles
    from exporter.config import ConfigError, load_config

    config = load_config({}, environ={"RAYPULSE_EXPORTER_RAY__ACTOR_ROLES": '{"judge": "(?i)reward|judge"}'})
    assert ActorRoles(config.ray.actor_roles).of("RewardModel") == "judge"
    assert ActorRoles(config.ray.actor_roles).of("Generator") == ""  # the defaults are replaced, not extended
    for roles, said in (('{"Gen": "x"}', "lower case"), ('{"gen": "(unclosed"}', "not a regular expression"),
                        (str({f"r{i}": "x" for i in range(9)}).replace("'", '"'), "at most 8 roles")):
        with pytest.raises(ConfigError, match="actor_roles") as raised:
            load_config({}, environ={"RAYPULSE_EXPORTER_RAY__ACTOR_ROLES": roles})
        assert said in str(raised.value)


# -- who gets the Ray token ---------------------------------------------------------------------

def fake_proc(procfs: Path, pid: int, *, uid: int, exe: Path) -> None:
    """A /proc/<pid> with what check_raylet reads: the owner, the executable, the process's root."""
    base = procfs / str(pid)
    base.mkdir(parents=True)
    (base / "status").write_text(f"Name:\traylet\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (base / "exe").symlink_to(exe)
    (base / "root").symlink_to("/")


def test_a_raylet_is_trusted_only_as_rays_own_binary_run_by_this_user_or_root(tmp_path):
    import os

    from exporter.collectors.ray.localray import check_raylet

    package = tmp_path / "site-packages" / "ray"
    binary = package / "core" / "src" / "ray" / "raylet" / "raylet"
    binary.parent.mkdir(parents=True)
    binary.touch()
    (package / "__init__.py").touch()
    copy = tmp_path / "ray" / "core" / "src" / "ray" / "raylet" / "raylet"  # the same path outside any package
    copy.parent.mkdir(parents=True)
    copy.touch()
    procfs = tmp_path / "proc"
    fake_proc(procfs, 10, uid=os.geteuid(), exe=binary)
    fake_proc(procfs, 11, uid=0, exe=binary)
    fake_proc(procfs, 12, uid=os.geteuid(), exe=Path(sys.executable).resolve())  # a process named raylet
    fake_proc(procfs, 13, uid=54321, exe=binary)  # another user's
    fake_proc(procfs, 14, uid=os.geteuid(), exe=copy)
    assert check_raylet(procfs, 10) == ""
    assert check_raylet(procfs, 11) == ""
    assert "not the raylet of an installed ray package" in check_raylet(procfs, 12)
    assert "runs as uid 54321" in check_raylet(procfs, 13)
    assert "not the raylet of an installed ray package" in check_raylet(procfs, 14)
    assert check_raylet(procfs, 15) == "its owner cannot be read"  # gone, or hidden from us


def test_this_hosts_addresses_and_who_listens_come_from_its_network_namespace(tmp_path):
    from exporter.collectors.ray.localray import is_local_address, listener_uids, read_local_addresses

    net = tmp_path / "net"
    net.mkdir()
    (net / "fib_trie").write_text("Local:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.9.0.2\n        /32 host LOCAL\n"
                                  "     |-- 10.9.0.255\n        /32 link BROADCAST\n")
    (net / "if_inet6").write_text("fd000000000000000000000000000002 04 40 00 82     eth0\n")
    addresses = read_local_addresses(net)
    assert addresses == {"10.9.0.2", "fd00::2"}
    assert is_local_address("10.9.0.2", addresses)
    assert is_local_address("127.0.0.1", addresses)
    assert not is_local_address("10.9.0.3", addresses)
    assert not is_local_address("0.0.0.0", addresses)
    assert is_local_address("[fd00::2]", addresses)
    assert not is_local_address("head.example", addresses)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (net / "tcp").write_text(header + "   0: 0100007F:2049 00000000:0000 0A 00000000:00000000 00:00000000 "
                             "00000000  1000        0 1 1\n"  # 127.0.0.1:8265, uid 1000
                             "   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 "
                             "00000000     0        0 2 1\n"  # 0.0.0.0:8080, root
                             "   2: 0100007F:1F91 0100007F:2049 01 00000000:00000000 00:00000000 "
                             "00000000    7        0 3 1\n")  # a connection, not a listener
    (net / "tcp6").write_text(header + "   0: 00000000000000000000000001000000:1F91 "
                              "00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 "
                              "00000000    33        0 4 1\n")  # [::1]:8081, uid 33
    assert listener_uids("127.0.0.1", 8265, net) == {1000}
    assert listener_uids("10.9.0.2", 8080, net) == {0}  # the wildcard listener takes it
    assert listener_uids("::1", 8081, net) == {33}
    assert listener_uids("127.0.0.1", 8081, net) == set()
    assert listener_uids("localhost", 8265, net) == {1000}


def test_without_a_raylet_that_names_it_the_default_dashboard_gets_no_token(tmp_path):
    from exporter.collectors.ray.localray import DEFAULT_DASHBOARD, LocalRay
    from exporter.config import load_config

    local = LocalRay(load_config({"node": {"procfs": str(tmp_path)}}, environ={}))
    assert local.dashboard().url == DEFAULT_DASHBOARD
    assert not local.dashboard().token
    configured = LocalRay(load_config({"node": {"procfs": str(tmp_path)},
                                       "ray": {"dashboard_url": "http://10.0.0.9:8265/"}}, environ={}))
    assert configured.dashboard().url == "http://10.0.0.9:8265"
    assert configured.dashboard().token


class RecordingDashboard:
    """An HTTP server on loopback that answers everything and records each request's Authorization."""

    def __init__(self, status: int = 200, location: str = "") -> None:
        self.status, self.location = status, location
        self.requests: list[tuple[str, str | None]] = []  # (path, Authorization)
        self.port = 0

    async def start(self):
        from aiohttp import web

        async def handle(request: web.Request) -> web.StreamResponse:
            self.requests.append((request.path, request.headers.get("Authorization")))
            if self.status in (301, 302, 307, 308):
                raise web.HTTPTemporaryRedirect(self.location + request.path_qs)
            if request.path == "/api/gcs_healthz":
                return web.Response(text="success")
            return web.json_response({"ray_version": "2.60.0", "data": {}} if request.path == "/api/version" else {})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        await self.runner.cleanup()


async def test_a_process_named_raylet_gets_no_token_and_makes_no_head(tmp_path, monkeypatch, caplog):
    """Anyone can start a process named `raylet` that claims to be the head and names a dashboard
    it listens on: the exporter talks to it without the token and stays a worker."""
    import asyncio
    import os

    from exporter.collectors.ray import localray
    from exporter.collectors.ray.head import RayHeadCollector
    from exporter.collectors.ray.health import UP, RayHealthCollector
    from exporter.collectors.ray.process_collector import RayProcessesCollector
    from exporter.config import load_config
    from scripts.ports import free_port

    monkeypatch.setenv("RAY_AUTH_TOKEN", "the-clusters-secret")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    thief = await RecordingDashboard().start()
    exporter_port = free_port()
    fake = tmp_path / "raylet"
    fake.symlink_to(os.path.realpath(sys.executable))  # comm is "raylet"; the executable is Python
    node_id = "ab" * 28
    process = await asyncio.create_subprocess_exec(
        str(fake), "-c", "import time; time.sleep(120)", f"--node_id={node_id}", "--node_ip_address=127.0.0.1",
        f"--python_worker_command=python default_worker.py --webui=127.0.0.1:{thief.port} --x=1",
        f'--labels={{"{wire.NODE_LABEL_EXPORTER_PORT}": "{exporter_port}"}}', "--head")
    try:
        config = load_config({"listen": f"127.0.0.1:{exporter_port}"}, environ={})
        localray._cache.clear()
        [seen] = localray.LocalRay(config).raylets()
        assert seen.pid == process.pid
        assert seen.is_head
        assert "not the raylet of an installed ray" in seen.distrust
        health, head, processes = (RayHealthCollector(config), RayHeadCollector(config), RayProcessesCollector(config))
        with caplog.at_level("WARNING"):
            for collector in (health, head, processes):
                await collector.collect(SampleSink(collector.name))
        out = SampleSink(health.name)
        await health.collect(out)
        assert one(out, UP) == 1  # it was asked (without the token), so the test is not vacuous
        assert thief.requests
        assert all(auth is None for _, auth in thief.requests), thief.requests
        assert health.local.role() == "worker"
        assert head.shared.service_discovery.get().role == "worker"
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert any("not sending the Ray token" in m and str(thief.port) in m for m in warnings), warnings
        assert any("not taking the Ray head role" in m for m in warnings), warnings
    finally:
        process.kill()
        await process.wait()
        await thief.stop()


async def test_a_redirect_never_carries_the_token_on():
    from exporter.collectors.ray.dashboard import DashboardError, DashboardSession

    elsewhere = await RecordingDashboard().start()
    redirecting = await RecordingDashboard(307, f"http://127.0.0.1:{elsewhere.port}").start()
    try:
        async with DashboardSession(f"http://127.0.0.1:{redirecting.port}", 5, token="the-clusters-secret") as api:
            with pytest.raises(DashboardError) as error:
                await api.json("/api/version")
        assert error.value.kind == "http"
        assert "redirect" in str(error.value)
        assert redirecting.requests == [("/api/version", "Bearer the-clusters-secret")]  # configured: it may
        assert elsewhere.requests == []
    finally:
        await redirecting.stop()
        await elsewhere.stop()
