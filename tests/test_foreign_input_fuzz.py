"""The parsers of foreign input never let an exception escape but the one they document (issue 29):
progress reports (parse_batch, then the store: Rejected only), the head exporter's /sd answer
(fetch_sd, sd_targets: ReadError only) and an exporter's /metrics as the health watcher reads it
(read: never raises). The /sd and /metrics bodies come from a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.config import ProgressSettings
from exporter.progress.store import ProgressStore, Rejected, parse_batch
from launcher.health import exporters
from tests.conftest import free_port

_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=30)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
    st.text(max_size=12), inner, max_size=5), max_leaves=25)
_numbers = st.one_of(st.none(), st.integers(-(2**64), 2**64), st.floats(), st.booleans(),
                     st.sampled_from(["NaN", "Infinity", "-inf", "1", ""]))
_reports = st.fixed_dictionaries(
    {"kind": st.sampled_from(["progress", "checkpoint", "rl", "run", "x"])},
    optional={"job_id": st.one_of(st.none(), st.sampled_from(["02000000", "0b000000"]), st.text(max_size=70)),
              "submission_id": st.one_of(st.none(), st.sampled_from(["sub-1", "sub-2"]), st.text(max_size=140)),
              "run_id": st.one_of(st.none(), st.sampled_from(["run-1"]), st.text(max_size=50)),
              "rank": _numbers, "time": st.one_of(st.just("now"), _numbers), "step": _numbers, "loss": _numbers,
              "samples_total": _numbers, "dropped_total": _numbers, "iteration": _numbers, "kl": _numbers,
              "fault": st.one_of(st.sampled_from(["hang", "x"]), _numbers), "detect_seconds": _numbers,
              "effective_training_ratio": _numbers, "duration_seconds": _numbers,
              "phases": st.one_of(_json, st.dictionaries(st.text(max_size=20), st.fixed_dictionaries(
                  {"seconds_total": _numbers}, optional={"running_since": st.one_of(st.just("now"), _numbers)}),
                  max_size=4)),
              "rewards": st.one_of(_json, st.dictionaries(st.text(max_size=20), _numbers, max_size=4))})


def _raised(expected: type[Exception], call) -> Exception | None:
    """The `expected` exception the call raised, or None; any other exception fails the test."""
    try:
        call()
    except expected as exc:
        return exc
    return None


def _now(value):
    if isinstance(value, dict):
        return {key: (time.time() if item == "now" else _now(item)) for key, item in value.items()}
    if isinstance(value, list):
        return [_now(item) for item in value]
    return value


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(_json, st.lists(_reports, max_size=6).map(lambda reports: {"reports": reports}),
                      st.dictionaries(st.sampled_from(["reports", "extra"]), _json, max_size=2)))
def test_progress_reports_are_applied_or_rejected_and_nothing_else(data):
    store = ProgressStore(ProgressSettings(max_jobs=3, max_ranks_per_job=2, max_series=400))
    refused = _raised(Rejected, lambda: store.apply(parse_batch(_now(data))))
    if refused is not None:
        assert refused.status in (400, 429)
        assert str(refused)
    assert store.series <= 400
    store.view()


class Answers:
    """A server whose /sd and /metrics answer with whatever the test sets: status, headers, body."""

    def __init__(self) -> None:
        self.port = free_port()
        self.status, self.headers, self.body = 200, {}, b""

    def start(self) -> Answers:
        ready = threading.Event()

        async def answer(request: web.Request) -> web.Response:
            return web.Response(status=self.status, headers=self.headers, body=self.body)

        async def serve() -> None:
            app = web.Application()
            app.router.add_get("/{tail:.*}", answer)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            ready.set()
            await asyncio.Event().wait()

        threading.Thread(target=asyncio.run, args=(serve(),), daemon=True, name="answers").start()
        assert ready.wait(10)
        return self


ANSWERS = Answers().start()
_sd_groups = st.lists(st.fixed_dictionaries({}, optional={
    "targets": st.one_of(_json, st.lists(st.one_of(st.text(max_size=40), _scalars), max_size=4)),
    "labels": st.one_of(_json, st.dictionaries(st.text(max_size=20), _scalars, max_size=4))}), max_size=4)
_sd_bodies = st.one_of(_json.map(lambda value: json.dumps(value).encode()),
                       _sd_groups.map(lambda value: json.dumps(value).encode()),
                       st.binary(max_size=300),
                       st.integers(1, 5000).map(lambda depth: b"[" * depth + b"]" * depth),
                       st.just(b"[" + b"1" * 5000 + b"]"))  # an integer longer than Python converts
_exposition_lines = st.one_of(
    st.sampled_from(["raypulse_train_step{submission_id=\"a\",rank=\"0\"} 5", "raypulse_gpu_up 1",
                     "raypulse_gpu_up{gpu=\"0\"} NaN", "# TYPE raypulse_gpu_up gauge", "raypulse_gpu_up{",
                     "raypulse_gpu_up{gpu=\"0\"} x", 'raypulse_ray_node_info{node_id="\\"} 1',
                     "raypulse_train_step 1 2 3 4"]),
    st.text(max_size=60).map(lambda text: "raypulse_gpu_up" + text))
_metrics_bodies = st.one_of(st.lists(_exposition_lines, max_size=8).map(lambda lines: "\n".join(lines).encode()),
                            st.binary(max_size=300))
_answers = st.tuples(st.sampled_from([200, 200, 200, 404, 500]),
                     st.sampled_from([{}, {"Content-Encoding": "gzip"}, {"Content-Encoding": "br"}]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_sd_bodies, answer=_answers)
def test_an_sd_answer_gives_target_groups_or_a_read_error(body, answer):
    ANSWERS.status, ANSWERS.headers = answer
    ANSWERS.body = body
    url = f"http://127.0.0.1:{ANSWERS.port}/sd"
    found: dict[str, list] = {}
    failed = _raised(exporters.ReadError, lambda: found.update(groups=exporters.fetch_sd(url, None, timeout=5),
                                                               targets=exporters.sd_targets(url, timeout=5)))
    if failed is not None:
        assert str(failed)
        return
    groups, targets = found["groups"], found["targets"]
    for group in groups:
        assert all(isinstance(target, str) and target for target in group["targets"])
        assert all(isinstance(key, str) and isinstance(value, str) for key, value in group["labels"].items())
    assert all(target.url.startswith("http://") for target in targets)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_metrics_bodies, answer=_answers)
def test_an_exporters_metrics_read_never_raises(body, answer):
    ANSWERS.status, ANSWERS.headers = answer
    ANSWERS.body = body
    read = exporters.read(exporters.Target(node="n", url=f"http://127.0.0.1:{ANSWERS.port}"), timeout=5)
    assert read.ok or read.error
