"""What a read of the exporters means for an attempt (launcher/health/faults.py), on expositions written
the way the exporter writes them: hangs and silence by their thresholds, GPU faults by NVIDIA's action
per XID, lost nodes by Ray's view, non-finite losses; an exporter that does not answer is never a hang,
and never keeps the hang from being judged on the nodes that answered.
"""

from __future__ import annotations

import pytest

from launcher.health.exporters import NodeRead, Target, parse
from launcher.health.faults import Attempt, Baseline, find, progress, ranks_text
from launcher.health.policy import FaultClass, HealthPolicy

SID = "run-1-a2"
START = 1_000_000.0
POLICY = HealthPolicy(hang_after_seconds=60, silence_after_seconds=120, check_interval_seconds=5)


def node(name: str, text: str) -> NodeRead:
    return NodeRead(Target(name, f"http://10.0.0.{len(name)}:9477"), parse(text))


def ranks(*rows: tuple[int, float, int], sid: str = SID) -> str:
    """Progress lines of ranks (rank, last report time, step)."""
    lines = []
    for rank, at, step in rows:
        labels = f'job_id="02000000",submission_id="{sid}",rank="{rank}"'
        lines += [f"raypulse_train_last_progress_time_seconds{{{labels}}} {at}",
                  f"raypulse_train_step{{{labels}}} {step}"]
    return "\n".join(lines) + "\n"


def attempt(running: float | None = START + 5) -> Attempt:
    return Attempt(2, SID, started_at=START, running_at=running)


def test_the_reader_keeps_only_the_families_it_needs():
    text = ("# HELP raypulse_node_load1 x\n# TYPE raypulse_node_load1 gauge\nraypulse_node_load1 3\n"
            'raypulse_gpu_up{gpu="0",uuid="GPU-a"} 1\nraypulse_gpu_up_other 7\n'
            'raypulse_train_step{job_id="",submission_id="s",rank="0"} 41200\n')
    samples = parse(text)
    assert [(s.name, s.value) for s in samples] == [("raypulse_gpu_up", 1.0), ("raypulse_train_step", 41200.0)]


def test_no_progress_from_any_rank_past_the_threshold_is_a_hang_with_its_evidence():
    reads = [node("workers-1", ranks((0, START + 100, 41199), (1, START + 110, 41200))),
             node("workers-2", ranks((2, START + 105, 41200), (3, START + 108, 41200)))]
    assert find(POLICY, reads, attempt(), Baseline(), now=START + 169) == []  # 59 s: not yet
    [fault] = find(POLICY, reads, attempt(), Baseline(), now=START + 175)
    assert fault.kind is FaultClass.HANG
    assert fault.summary == "hang (ranks 0-3 made no progress for 65 s; last step 41200)"
    assert (fault.at, fault.last_step, fault.node_out) == (START + 110, 41200, False)


def test_an_rl_loop_that_reports_only_iterations_is_making_progress():
    labels = f'job_id="02000000",submission_id="{SID}",rank="0"'
    reads = [node("head", f"raypulse_rl_last_iteration_time_seconds{{{labels}}} {START + 100}\n"
                          f"raypulse_rl_iteration{{{labels}}} 12\n")]
    assert find(POLICY, reads, attempt(), Baseline(), now=START + 159) == []  # an iteration 59 s ago
    [fault] = find(POLICY, reads, attempt(), Baseline(), now=START + 165)  # none for 65 s: a hang
    assert fault.summary == "hang (rank 0 made no progress for 65 s; last step 12)"  # its iteration


def test_progress_of_another_attempt_does_not_count():
    reads = [node("workers-1", ranks((0, START + 500, 9), sid="run-1-a1"))]  # attempt 1's series linger
    # This attempt reported nothing: the output rule applies, from when it started running.
    assert find(POLICY, reads, attempt(), Baseline(), now=START + 120) == []
    [fault] = find(POLICY, reads, attempt(), Baseline(), now=START + 130)
    assert fault.summary.startswith("hang (no output from any of the job's processes for 125 s")


def test_a_job_that_reports_nothing_is_alive_while_any_process_writes_output():
    output = (f'raypulse_job_output_last_write_time_seconds{{job_id="02000000",submission_id="{SID}"}} '
              f"{START + 200}\n")
    driver = (f'raypulse_job_driver_log_last_write_time_seconds{{job_id="02000000",submission_id="{SID}"}} '
              f"{START + 50}\n")
    reads = [node("head", driver), node("workers-1", output)]
    assert find(POLICY, reads, attempt(), Baseline(), now=START + 300) == []  # a worker wrote 100 s ago
    [fault] = find(POLICY, reads, attempt(), Baseline(), now=START + 330)
    assert fault.kind is FaultClass.HANG
    assert fault.at == START + 200
    assert find(POLICY, reads, attempt(running=None), Baseline(), now=START + 9999) == []  # not running yet


def test_an_exporter_that_does_not_answer_is_never_a_hang_nor_keeps_one_from_being_judged_on_the_others():
    blind = NodeRead(Target("workers-2", "http://x"), error="refused")
    assert find(POLICY, [blind], attempt(), Baseline(), now=START + 10_000) == []  # nothing read: nothing judged
    reads = [node("workers-1", ranks((0, START + 100, 5))), blind]
    assert find(POLICY, reads, attempt(), Baseline(), now=START + 159) == []
    [fault] = find(POLICY, reads, attempt(), Baseline(), now=START + 165)  # the ranks read stopped for 65 s
    assert (fault.kind, fault.evidence["ranks"]) == (FaultClass.HANG, [0])
    # No rank reports progress: silence is judged only on a whole view (the unread node's logs may be the live ones)
    quiet = [node("workers-1", "raypulse_gpu_up{gpu=\"0\",uuid=\"GPU-a\"} 1\n"), blind]
    assert find(POLICY, quiet, attempt(), Baseline(), now=START + 10_000) == []


@pytest.mark.parametrize(("xid", "node_out"), [(79, True), (48, True), (64, True), (95, True), (94, False)])
def test_xids_that_need_a_reset_take_the_node_out_and_94_restarts_in_place(xid: int, node_out: bool):
    text = f'raypulse_gpu_xid_last_timestamp_seconds{{gpu="3",uuid="GPU-c",xid="{xid}"}} {START + 40}\n'
    [fault] = find(POLICY, [node("workers-1", text)], attempt(), Baseline(), now=START + 45)
    assert fault.kind is FaultClass.GPU_FAULT
    assert fault.node == "workers-1"
    assert fault.node_out is node_out
    assert fault.summary == f"GPU fault (XID {xid} on GPU 3 on workers-1)"


def test_xids_that_are_not_faults_or_older_than_the_attempt_are_left_alone():
    text = (f'raypulse_gpu_xid_last_timestamp_seconds{{gpu="0",uuid="GPU-a",xid="63"}} {START + 40}\n'  # remap recorded
            f'raypulse_gpu_xid_last_timestamp_seconds{{gpu="0",uuid="GPU-a",xid="79"}} {START - 40}\n'  # before it
            f'raypulse_gpu_xid_last_timestamp_seconds{{gpu="0",uuid="GPU-a",xid="13"}} {START + 40}\n')  # the app's
    assert find(POLICY, [node("workers-1", text)], attempt(), Baseline(), now=START + 45) == []


def test_a_lost_gpu_a_failed_remap_a_recovery_action_and_new_double_bit_errors_are_gpu_faults():
    before = node("workers-1", 'raypulse_gpu_ecc_errors_total{gpu="1",uuid="GPU-b",type="uncorrected"} 2\n')
    baseline = Baseline()
    baseline.take([before])
    text = ('raypulse_gpu_up{gpu="0",uuid="GPU-a"} 0\nraypulse_gpu_row_remap_failed{gpu="2",uuid="GPU-r"} 1\n'
            'raypulse_gpu_recovery_action{gpu="3",uuid="GPU-d"} 2\n'
            'raypulse_gpu_ecc_errors_total{gpu="1",uuid="GPU-b",type="uncorrected"} 5\n')
    faults = find(POLICY, [node("workers-1", text)], attempt(), baseline, now=START + 50)
    assert sorted(fault.summary for fault in faults) == [
        "GPU fault (3 double-bit ECC error(s) on GPU GPU-b on workers-1)",
        "GPU fault (GPU 0 lost on workers-1)",
        "GPU fault (row remapping failed on GPU 2 on workers-1)",
        "GPU fault (the driver asks for a node reboot of GPU 3 on workers-1)"]
    assert all(fault.node_out for fault in faults)
    unchanged = node("workers-1", 'raypulse_gpu_ecc_errors_total{gpu="1",uuid="GPU-b",type="uncorrected"} 2\n')
    assert find(POLICY, [unchanged], attempt(), baseline, now=START + 50) == []


def test_gpu_faults_count_only_on_the_nodes_running_the_job_once_they_are_known():
    job = f'raypulse_job_processes{{job_id="02000000",submission_id="{SID}",process_role="actor",actor_class="W"}} 1\n'
    xid = f'raypulse_gpu_xid_last_timestamp_seconds{{gpu="0",uuid="GPU-a",xid="79"}} {START + 40}\n'
    reads = [node("workers-1", job), node("workers-2", xid)]
    assert find(POLICY, reads, attempt(), Baseline(), now=START + 45) == []
    [fault] = find(POLICY, [node("workers-1", job + xid)], attempt(), Baseline(), now=START + 45)
    assert fault.node == "workers-1"


def test_a_node_ray_declares_dead_or_whose_process_exited_is_lost():
    info = 'raypulse_ray_node_info{cluster_name="c",node_id="bbbb",node_ip="10.0.0.2",node_role="worker"} 1\n'
    alive = ('raypulse_ray_node_alive{node_id="aaaa",node_ip="10.0.0.1",node_role="head"} 1\n'
             'raypulse_ray_node_alive{node_id="bbbb",node_ip="10.0.0.2",node_role="worker"} 1\n')
    baseline = Baseline()
    baseline.take([node("head", alive), node("workers-1", info)])
    dead = alive.replace('node_role="worker"} 1', 'node_role="worker"} 0')
    [fault] = find(POLICY, [node("head", dead)], attempt(), baseline, now=START + 60)
    assert (fault.kind, fault.node, fault.node_out) == (FaultClass.NODE_LOST, "workers-1", True)
    assert fault.summary == "node lost (workers-1: Ray declared node bbbb dead)"
    [fault] = find(POLICY, [node("head", alive)], attempt(), baseline, now=START + 60, dead_nodes=["workers-2"])
    assert fault.summary == "node lost (workers-2: its Ray node process exited)"


def test_a_nonfinite_loss_is_named_with_its_ranks_and_step():
    labels = f'job_id="02000000",submission_id="{SID}",rank="3"'
    text = ranks((3, START + 20, 17)) + f'raypulse_train_nonfinite_values_total{{{labels},field="loss"}} 1\n'
    [fault] = find(POLICY, [node("workers-1", text)], attempt(), Baseline(), now=START + 21)
    assert (fault.kind, fault.summary) == (FaultClass.NONFINITE_LOSS,
                                           "non-finite loss (rank 3 reported NaN or infinity at step 17)")


def test_progress_over_nodes_and_rank_ranges():
    seen = progress([node("a", ranks((0, START + 1, 4))), node("b", ranks((1, START + 3, 5)))], SID)
    assert (seen.newest_step, seen.last_report) == (5, {0: START + 1, 1: START + 3})
    assert ranks_text([0, 1, 2, 3, 5, 7, 8]) == "ranks 0-3, 5, 7-8"
    assert ranks_text([4]) == "rank 4"


def test_progress_carries_the_slowest_save_the_newest_save_and_the_most_saves_over_nodes():
    def saves(rank: int, seconds: float, at: float, count: int) -> str:
        labels = f'job_id="02000000",submission_id="{SID}",rank="{rank}"'
        return (f"raypulse_train_checkpoint_duration_seconds{{{labels}}} {seconds}\n"
                f"raypulse_train_last_checkpoint_time_seconds{{{labels}}} {at}\n"
                f"raypulse_train_checkpoints_total{{{labels}}} {count}\n")
    seen = progress([node("a", ranks((0, START + 1, 4)) + saves(0, 3.5, START, 2)),
                     node("b", ranks((1, START + 3, 5)) + saves(1, 5.0, START + 1, 2))], SID)
    assert (seen.checkpoint_seconds, seen.checkpoint_at, seen.checkpoints) == (5.0, START + 1, 2)
    assert progress([node("a", ranks((0, START + 1, 4)))], SID).checkpoint_seconds is None


def test_a_node_taken_out_is_not_lost_again_when_ray_declares_its_old_node_dead_in_the_next_attempt():
    """A node replaced after a fault: Ray declares its old node dead only some seconds later, while the
    next attempt (started at once) runs; that is the last attempt's news, not a fault of this one."""
    from launcher.health.watcher import Watcher
    from tests.broken_exporters import ExporterLike

    def alive(**states: int) -> str:
        return "".join(f'raypulse_ray_node_alive{{node_id="{node_id}",node_ip="192.0.2.2",node_role="worker"}} '
                       f"{state}\n" for node_id, state in states.items())

    def info(node_id: str) -> str:
        return f'raypulse_ray_node_info{{cluster_name="c",node_id="{node_id}",node_ip="192.0.2.2"}} 1\n'

    with ExporterLike(alive(bbbb=1)) as head, ExporterLike(info("bbbb")) as worker:
        watcher = Watcher(POLICY, lambda: [Target("head", head.url), Target("workers-1", worker.url)])
        watcher.watch(Attempt(1, "r-a1", started_at=START))
        assert watcher.check().faults == []  # the baseline: bbbb is workers-1
        watcher.retire("workers-1")  # replaced: a fresh node cccc with the same name and address
        head.text, worker.text = alive(bbbb=1, cccc=1), info("cccc")
        watcher.watch(Attempt(2, "r-a2", started_at=START))
        assert watcher.check().faults == []
        head.text = alive(bbbb=0, cccc=1)  # Ray declares the old node dead, during attempt 2
        assert watcher.check().faults == []
        head.text = alive(bbbb=0, cccc=0)  # the new one dies: that is attempt 2's
        [fault] = watcher.check().faults
        assert fault.summary == "node lost (workers-1: Ray declared node cccc dead)"
