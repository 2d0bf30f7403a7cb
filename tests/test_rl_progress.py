"""RL post-training progress: `progress.phase` and `progress.report_iteration` in real processes, the
`rl` wire format and its bounds in the store, and the raypulse_rl_* series of a real exporter."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import ProgressSettings
from exporter.contract import wire
from exporter.progress import store
from exporter.progress.store import ProgressStore, Rejected, parse_batch
from tests.conftest import binary, free_port, wait_until
from tests.ray_testcluster import stop_process
from tests.test_progress_client import job_config, run_client
from tests.test_progress_endpoint import post, start_progress_exporter

# The client's reports, as it would send them, without a network: its sender's one request call is
# replaced by one that keeps the batch.
CAPTURE = """
    import json
    from exporter.progress import client as progress
    sent = []
    def keep(connection, path, batch):
        sent.extend(batch)
        return 204
    progress._Client._post = staticmethod(keep)
"""


def captured(code: str) -> str:
    return textwrap.dedent(CAPTURE) + textwrap.dedent(code)


def rl(**fields):
    return {"kind": "rl", "submission_id": "rl-a", "rank": 0, "time": time.time(), **fields}


def phases(*names: str, running: str | None = None) -> dict:
    return {name: {"seconds_total": 1.0, **({"running_since": time.time()} if name == running else {})}
            for name in names}


# -- the client ----------------------------------------------------------------------------------

def test_phases_and_iterations_travel_as_running_totals_the_endpoint_accepts():
    out = run_client(captured("""
        import time
        for iteration in range(3):
            with progress.phase("generate"):
                time.sleep(0.01)
            with progress.phase("weight sync/nccl"):  # a free-form name, made a label value
                pass
            try:
                with progress.phase("train"):
                    raise KeyError("the block's own error propagates")
            except KeyError:
                pass
            progress.report_iteration(iteration, phases={"reward": 0.5}, rollouts=8, generated_tokens=1000,
                                      reward_mean=float("nan"), rewards={"format": 1, "judge": float("inf")},
                                      kl=0.02, entropy=1.5, response_length_mean=300, response_length_max=512,
                                      response_length_limit=512, truncated_ratio=2.0, weight_sync_bytes=1e9)
        progress.flush(5)
        print(json.dumps({"sent": sent, "stats": progress.stats()}))
    """), {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{free_port()}",
          "RAY_JOB_CONFIG_JSON_ENV_VAR": job_config("rl-client")})
    sent = out["sent"]
    assert len(sent) == 3 * (2 * 3 + 1)  # each phase starts and ends; one report per iteration
    assert out["stats"]["dropped"] == 0
    for entry in sent:
        entry["time"] = time.time()
    assert len(parse_batch({"reports": sent})) == len(sent)  # every one of them valid
    last = sent[-1]
    assert (last["iteration"], last["iterations_total"]) == (2, 3)
    assert (last["rollouts_total"], last["generated_tokens_total"]) == (24, 3000)
    assert set(last["phases"]) == {"generate", "weight_sync_nccl", "train", "reward"}
    assert last["phases"]["reward"] == {"seconds_total": 1.5, "iteration_seconds": 0.5}
    assert last["phases"]["generate"]["seconds_total"] >= 0.03
    assert not any("running_since" in phase for phase in last["phases"].values())
    assert last["reward_mean"] == "NaN"  # sent and counted by the exporter, never hidden
    assert last["rewards"] == {"format": 1.0}  # an infinite source mean is left out
    assert "truncated_ratio" not in last  # out of range: left out, never a refused batch
    started = next(entry for entry in sent if "running_since" in entry["phases"].get("generate", {}))
    assert started["phases"]["generate"]["seconds_total"] == 0  # the first start: nothing done yet


def test_phases_and_sources_are_bounded_per_rank():
    out = run_client(captured("""
        for n in range(20):
            with progress.phase(f"phase-{n}"):
                pass
        progress.report_iteration(1, rewards={f"source-{n}": n for n in range(20)}, rank=1)
        progress.report_iteration(1, phases={"x" * 100: 1.0})
        progress.flush(5)
        print(json.dumps({"sent": sent, "stats": progress.stats()}))
    """), {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{free_port()}", "RAY_JOB_ID": "05000000"})
    rank0 = [entry for entry in out["sent"] if entry["rank"] == 0]
    assert max(len(entry["phases"]) for entry in rank0) == wire.RL_MAX_PHASES
    assert "x" * 100 not in rank0[-1]["phases"]  # a 17th phase, even cut to 40 characters, is not timed
    rank1 = [entry for entry in out["sent"] if entry["rank"] == 1]
    assert len(rank1[0]["rewards"]) == wire.RL_MAX_SOURCES
    assert out["stats"]["dropped"] == 4 + 4 + 1  # 4 phases, 4 sources and one more phase over the bounds


def test_without_an_exporter_phases_never_block_and_are_counted():
    stats = run_client("""
        import json, time
        from exporter import progress
        worst = 0.0
        for iteration in range(1500):
            started = time.perf_counter()
            with progress.phase("generate"):
                pass
            progress.report_iteration(iteration, rollouts=4, reward_mean=0.5, kl=0.1)
            worst = max(worst, time.perf_counter() - started)
        progress.flush(0.3)
        print(json.dumps({**progress.stats(), "worst": worst}))
    """, {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{free_port()}", "RAY_JOB_ID": "05000000"})
    assert stats["sent"] == 0
    assert 3 * 1500 - 100 <= stats["dropped"] + stats["queued"] <= 3 * 1500  # all but one batch in flight
    assert stats["worst"] < 1.5  # only enqueued: a network wait would take the sender's 2 s timeout


def test_a_large_rl_batch_is_split_under_the_request_limit():
    from exporter.progress import client as progress

    entry = rl(phases={f"phase-{n:02d}-{'x' * 30}": {"seconds_total": 1e9 + n, "iteration_seconds": 1.0 / 3}
                       for n in range(16)})
    bodies = list(progress._bodies([entry] * 100))
    assert sum(count for count, _ in bodies) == 100
    assert len(bodies) > 1
    assert all(len(body) <= progress.MAX_REQUEST_BYTES for _, body in bodies)
    assert all(json.loads(body)["reports"][0] == entry for _, body in bodies)


# -- the wire format and the store ----------------------------------------------------------------

@pytest.mark.parametrize(("fields", "message"), [
    ({"kind": "progress", "kl": 0.1}, "reports[0].kl: only in reports of kind rl"),
    ({"phases": {"a b": {"seconds_total": 1}}}, "reports[0].phases"),
    ({"phases": {"x" * 41: {"seconds_total": 1}}}, "reports[0].phases"),
    ({"phases": phases(*(f"p{n}" for n in range(17)))}, "reports[0].phases"),
    ({"phases": {"gen": {"seconds_total": -1}}}, "reports[0].phases.gen.seconds_total"),
    ({"phases": {"gen": {"seconds_total": 1, "extra": 1}}}, "reports[0].phases.gen.extra: unknown field"),
    ({"rewards": {f"s{n}": 1 for n in range(17)}}, "reports[0].rewards"),
    ({"rewards": {"judge": "NaN"}}, "reports[0].rewards.judge"),
    ({"truncated_ratio": 1.5}, "reports[0].truncated_ratio"),
    ({"weight_sync_seconds": "Infinity"}, "reports[0].weight_sync_seconds"),
    ({"iteration": -1}, "reports[0].iteration"),
])
def test_bad_rl_reports_are_refused_naming_the_field(fields, message):
    with pytest.raises(Rejected) as refused:
        parse_batch({"reports": [rl(**fields)]})
    assert refused.value.status == 400
    assert message in str(refused.value)


def test_rl_series_count_against_the_one_series_budget():
    filler = [{"kind": "progress", "submission_id": "other", "rank": rank, "time": time.time()} for rank in range(4)]
    # another job's 4 ranks, and this one
    base = 2 * store.SERIES_PER_JOB + 5 * store.SERIES_PER_RANK + store.SERIES_PER_RL_RANK
    # a job may hold the whole store here: only the one budget stops a batch
    progress = ProgressStore(ProgressSettings(max_series=base + 2 * store.SERIES_PER_PHASE + store.SERIES_PER_SOURCE,
                                              max_job_share=1))
    progress.apply(parse_batch({"reports": filler}))
    progress.apply(parse_batch({"reports": [rl(phases=phases("generate"), rewards={"format": 1.0})]}))
    assert progress.series == base + store.SERIES_PER_PHASE + store.SERIES_PER_SOURCE
    progress.apply(parse_batch({"reports": [rl(phases=phases("generate", "train", running="train"))]}))
    # the phases replace the ones before, the sources stay
    assert progress.series == base + 2 * store.SERIES_PER_PHASE + store.SERIES_PER_SOURCE
    with pytest.raises(Rejected) as refused:  # one more phase would pass max_series
        progress.apply(parse_batch({"reports": [rl(phases=phases("generate", "train", "sync"))]}))
    assert (refused.value.status, refused.value.reason) == (429, "too_many_series")
    assert progress.refused_series == store.SERIES_PER_PHASE
    assert set(progress.jobs[("", "rl-a")][0].rl.phases) == {"generate", "train"}  # nothing of it applied
    progress.apply(parse_batch({"reports": [rl(phases=phases("sync"), rewards={})]}))  # fewer: fits
    assert progress.series == base + store.SERIES_PER_PHASE


def test_nonfinite_rl_values_are_counted_and_keep_the_last_finite_value():
    progress = ProgressStore(ProgressSettings())
    progress.apply(parse_batch({"reports": [rl(iteration=1, kl=0.5, reward_mean=0.2),
                                            rl(iteration=2, kl="NaN", reward_mean="-Infinity")]}))
    state = progress.jobs[("", "rl-a")][0]
    assert state.rl.values == {"kl": 0.5, "reward_mean": 0.2}
    assert state.rl.iteration == 2
    assert (state.nonfinite["kl"], state.nonfinite["reward_mean"]) == (1, 1)
    assert (state.step, state.last_progress_time) == (None, None)  # RL reports are not training steps


# -- a real exporter ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    running = start_progress_exporter(tmp_path_factory.mktemp("rl"))
    yield running
    stop_process(running.process)


def rl_series(exporter) -> dict[str, dict[tuple, float]]:
    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(exporter.metrics_text()):
        for sample in family.samples:
            if sample.name.startswith("raypulse_rl_") or sample.name == "raypulse_train_nonfinite_values_total":
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("job_id", "rank")))
                found.setdefault(sample.name, {})[labels] = sample.value
    return found


def test_a_real_rl_loop_shows_up_in_metrics(exporter):
    stats = run_client("""
        import json, time
        from exporter import progress
        for iteration in range(5):
            for name in ("generate", "reward", "train"):
                with progress.phase(name):
                    time.sleep(0.002)
            with progress.phase("weight_sync"):
                time.sleep(0.01)
            progress.report_iteration(iteration, rollouts=16, generated_tokens=4096, reward_mean=0.1 * iteration,
                                      reward_std=0.3, rewards={"format": 0.9, "correctness": 0.05 * iteration},
                                      kl=0.01, entropy=1.2, response_length_mean=700, response_length_max=1024,
                                      response_length_limit=1024, truncated_ratio=0.25, weight_sync_bytes=2**33)
        # a phase left running: the exporter shows since when
        progress.client._phase_start("generate", None)
        assert progress.flush(5)
        print(json.dumps(progress.stats()))
    """, {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{exporter.progress_port}",
          "RAY_JOB_CONFIG_JSON_ENV_VAR": job_config("rl-live")})
    assert (stats["sent"], stats["dropped"]) == (5 * 9 + 1, 0)
    job = (("submission_id", "rl-live"),)
    wait_until(lambda: rl_series(exporter).get("raypulse_rl_iterations_total", {}).get(job) == 5
               and "raypulse_rl_phase_start_time_seconds" in rl_series(exporter), 10, "the last reports")
    series = rl_series(exporter)
    assert series["raypulse_rl_iteration"][job] == 4
    assert series["raypulse_rl_iterations_total"][job] == 5
    assert series["raypulse_rl_rollouts_total"][job] == 80
    assert series["raypulse_rl_generated_tokens_total"][job] == 5 * 4096
    assert series["raypulse_rl_reward_mean"][job] == pytest.approx(0.4)
    assert series["raypulse_rl_source_reward_mean"][(("source", "correctness"), *job)] == pytest.approx(0.2)
    assert series["raypulse_rl_kl"][job] == 0.01
    assert series["raypulse_rl_response_tokens_limit"][job] == 1024
    assert series["raypulse_rl_truncated_ratio"][job] == 0.25
    assert series["raypulse_rl_weight_sync_bytes"][job] == 2**33
    assert 0.01 <= series["raypulse_rl_weight_sync_seconds"][job] < 5  # from the weight_sync phase
    seconds = {dict(k)["phase"]: v for k, v in series["raypulse_rl_phase_seconds_total"].items()}
    assert set(seconds) == {"generate", "reward", "train", "weight_sync"}
    assert seconds["weight_sync"] >= 0.05
    assert list(series["raypulse_rl_phase_start_time_seconds"]) == [(("phase", "generate"), *job)]
    assert series["raypulse_train_nonfinite_values_total"][(("field", "kl"), *job)] == 0


def test_rl_reports_over_the_budget_get_429_and_metrics_stay_valid(exporter):
    many = [rl(submission_id=f"rl-many-{n}", rank=rank, phases=phases(*(f"p{i}" for i in range(16))),
               rewards={f"s{i}": 1.0 for i in range(16)}) for n in range(4) for rank in range(60)]
    statuses = [post(exporter.progress_port, json.dumps({"reports": many[i:i + 20]}).encode())[0]
                for i in range(0, len(many), 20)]
    assert statuses[0] == 204
    assert 429 in statuses  # 240 ranks of 98 series each pass the default 10,000
    text = exporter.metrics_text()
    result = subprocess.run([binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    assert families["raypulse_train_series"][0].value <= families["raypulse_train_series_limit"][0].value
