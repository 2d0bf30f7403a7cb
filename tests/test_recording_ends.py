"""A run's recording (launcher/recording.py) has its ends, and only what it can write back faithfully:
stop() takes a last round, so the values of the run's last seconds are in it; record_soon() takes a round
at once (an attempt started) and record_once() one on the caller's thread (an attempt ended); and a
metric or label name that is not a Prometheus name is neither recorded nor exported (launcher/export.py),
since written out it could forge samples. Exporters here are HTTP servers on 127.0.0.1 in a thread.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as read_openmetrics

from exporter.contract import wire
from launcher import export, recording
from launcher.recording import Recording, Series
from tests.broken_exporters import ExporterLike
from tests.conftest import wait_until


def step_line(step: int) -> str:
    return f'raypulse_train_step{{job_id="",submission_id="s-a1",rank="0"}} {step}\n'


@pytest.fixture
def exporter() -> Iterator[ExporterLike]:
    with ExporterLike(step_line(1)) as server:
        server.list_target(server.address, "head")
        yield server


def started(run_dir: Path, server: ExporterLike, **options) -> recording.Recorder:
    """A recorder whose own loop takes one round at its start and then waits an hour."""
    rec = recording.Recorder(run_dir, server.url + wire.SD_PATH, interval=3600, **options).start()
    wait_until(lambda: rec.rounds >= 1, 10, "the recorder's first round")
    return rec


def steps(run_dir: Path) -> list[float]:
    [series] = recording.read(run_dir).select("raypulse_train_step")
    return series.values


# --- the ends of the record -----------------------------------------------------------------------------


def test_stop_records_the_last_value_even_right_after_it_changed(tmp_path: Path, exporter: ExporterLike):
    rec = started(tmp_path, exporter)
    exporter.text = step_line(24)  # the run's last step, seconds before its end
    rec.stop()
    assert steps(tmp_path) == [1.0, 24.0]
    assert recording.read(tmp_path).ends[-1]["reason"] == "stopped"


def test_record_soon_takes_a_round_at_once_on_the_recorders_thread(tmp_path: Path, exporter: ExporterLike):
    rec = started(tmp_path, exporter)
    exporter.text = step_line(2)  # a new attempt's first step
    rec.record_soon()
    wait_until(lambda: rec.rounds >= 2, 5, "the round asked for")  # not an hour later
    assert steps(tmp_path) == [1.0, 2.0]
    rec.stop()


def test_record_once_takes_a_round_before_it_returns(tmp_path: Path, exporter: ExporterLike):
    rec = started(tmp_path, exporter)
    exporter.text = step_line(3)  # an attempt's last step, before its exporters go away
    rec.record_once()
    assert steps(tmp_path) == [1.0, 3.0]
    rec.stop()


# --- no forged samples ----------------------------------------------------------------------------------

# A quoted UTF-8 label name, which prometheus_client's parser accepts, holding a quote and a newline: written
# back out verbatim it would end the sample early and start another one, with an `instance` of its own.
FORGING_NAME = 'z="1"} 5 1700000000.000\nraypulse_train_step{instance="forged",z'
FORGING_LINE = ('raypulse_train_step{"' + FORGING_NAME.replace('"', '\\"').replace("\n", "\\n")
                + '"="x",job_id="",submission_id="s-a2",rank="0"} 9\n')


def test_a_name_that_would_forge_samples_is_neither_recorded_nor_exported(tmp_path: Path, exporter: ExporterLike):
    exporter.text = step_line(1) + FORGING_LINE
    exporter.groups[0]["labels"]['rack"\nid'] = "r1"  # a label name in /sd that is no Prometheus name either
    said: list[tuple[str, dict]] = []
    rec = started(tmp_path, exporter, notify=lambda kind, details: said.append((kind, dict(details))))
    rec.stop()

    out = io.StringIO()
    written = export.write(recording.read(tmp_path), out)
    samples = [sample for family in read_openmetrics(out.getvalue()) for sample in family.samples]
    assert len(samples) == written  # every sample written reads back as one sample
    assert {sample.labels.get("instance") for sample in samples} == {exporter.address}
    assert {tuple(sorted(sample.labels)) for sample in samples if sample.name == "raypulse_train_step"} == {
        ("cluster", "instance", "job", "job_id", "node", "rank", "submission_id")}

    saved = recording.read(tmp_path)
    assert [series.labels["submission_id"] for series in saved.select("raypulse_train_step")] == ["s-a1"]
    assert rec.dropped == saved.rounds  # the forging sample, once per round
    assert saved.ends[-1]["dropped"] == rec.dropped
    [(_, details)] = [(kind, details) for kind, details in said if kind == "recording.samples_dropped"]
    assert "forged" in details["example"]
    assert "\n" not in details["example"]  # shown escaped


def test_export_leaves_out_series_whose_names_are_not_prometheus_names(tmp_path: Path):
    """A recording written before the recorder checked names (or edited by hand) cannot forge samples either."""
    rec = Recording(tmp_path / "metrics.jsonl.gz", families={"raypulse_train_step": {"type": "gauge", "help": ""}})
    good = Series(0, "raypulse_train_step", "raypulse_train_step", {"rank": "0"}, [1.0], [7.0])
    bad = [Series(1, "raypulse_train_step", "raypulse_train_step", {FORGING_NAME: "x", "rank": "1"}, [1.0], [9.0]),
           Series(2, "raypulse_train_step", "raypulse_train_step", {"__name__": "up"}, [1.0], [1.0]),
           Series(3, "raypulse_train_step", 'raypulse_train_step{a="b"}', {}, [1.0], [1.0]),
           Series(4, "raypulse train", "raypulse train", {}, [1.0], [1.0])]
    rec.series = {series.id: series for series in [good, *bad]}
    out, dropped = io.StringIO(), []
    assert export.write(rec, out, dropped) == 1
    assert dropped == bad
    [family] = read_openmetrics(out.getvalue())
    assert [(sample.labels, sample.value) for sample in family.samples] == [({"rank": "0"}, 7.0)]
