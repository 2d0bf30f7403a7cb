"""A run's recording (launcher/recording.py) as OpenMetrics text that a Prometheus backfills:

    launcher export RUN_ID --format openmetrics -o run.om
    promtool tsdb create-blocks-from openmetrics run.om DATA_DIR   # then start Prometheus on DATA_DIR

What promtool's OpenMetrics parser wants, and so what is written: every sample with its timestamp
(seconds), a family's lines together under one `# TYPE` (families in name order), each series'
points together and in time order, a counter's samples named `<family>_total`, label values and
help escaped as OpenMetrics escapes them, and `# EOF` last. No `# UNIT` lines (the parser would
then insist the name ends in the unit, which Prometheus-format names need not). Only Prometheus
names go out (metric `[a-zA-Z_:][a-zA-Z0-9_:]*`, label `[a-zA-Z_][a-zA-Z0-9_]*`): a quoted UTF-8 name
with a quote and a newline in it would otherwise be read back as samples nobody recorded.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import TextIO

from launcher import recording
from launcher.errors import BadInput
from launcher.recording import Recording, Series
from launcher.state import replacing, run_dir

OM_TYPES = {"counter", "gauge"}  # anything else (untyped, an info written as a gauge) goes out as a gauge


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(labels.items())) + "}"


def write(rec: Recording, out: TextIO, dropped: list[Series] | None = None) -> int:
    """Write the recording as OpenMetrics; returns the number of samples written. A series whose
    family, metric or label names are not Prometheus names (a recording from before the recorder
    checked them, or edited) is left out, and added to `dropped`: written out, such a name could
    forge samples."""
    by_family: dict[str, list[Series]] = defaultdict(list)
    for series in rec.series.values():
        if not series.times:
            continue
        if not (recording.valid_names(series.name, series.labels) and recording.METRIC_NAME.fullmatch(series.family)):
            if dropped is not None:
                dropped.append(series)
            continue
        by_family[series.family].append(series)
    written = 0
    for family in sorted(by_family):
        meta = rec.families.get(family, {})
        kind = meta.get("type") if meta.get("type") in OM_TYPES else "gauge"
        if kind == "counter" and any(not s.name.endswith("_total") for s in by_family[family]):
            kind = "gauge"  # not a counter OpenMetrics would accept: kept as the numbers it is
        if meta.get("help"):
            out.write(f"# HELP {family} {_escape(meta['help'])}\n")
        out.write(f"# TYPE {family} {kind}\n")
        for series in sorted(by_family[family], key=lambda s: (s.name, sorted(s.labels.items()))):
            prefix = series.name + _labels(series.labels)
            last = -math.inf
            for at, value in zip(series.times, series.values, strict=True):
                if at <= last:
                    continue  # a recorder restarted on the same file may repeat an instant
                last = at
                out.write(f"{prefix} {_number(value)} {at:.3f}\n")
                written += 1
    out.write("# EOF\n")
    return written


def export(source: Path, output: Path, dropped: list[Series] | None = None) -> int:
    """Write the recording of the run dir (or recording file) `source` to `output`; returns the
    number of samples (series left out for their names go to `dropped`, as in write()). Raises
    FileNotFoundError when the run has no recording."""
    rec = recording.read(source)
    with replacing(output) as out:  # a link planted at output is replaced, not followed
        return write(rec, out, dropped)


def export_run(run: str | Path, output: Path, dropped: list[Series] | None = None) -> int:
    """`launcher export RUN_ID`: the run's recording (a run id under $RAYPULSE_HOME, or a run dir)
    to `output`; `dropped` as in write(). BadInput (exit 2) for an unknown run or one without a recording."""
    directory = run if isinstance(run, Path) else run_dir(run)  # a str is a run id, never a path
    if not recording.path_of(directory).exists():
        if not (directory / "run.json").exists():
            raise BadInput(f"run_id: no run {str(run)!r} is recorded here (`launcher list` shows the runs)")
        raise BadInput(f"run_id: run {str(run)!r} has no recording (it ran with --record off or --prometheus, on "
                       "KubeRay with --no-sidecar, or before runs were recorded); nothing to export")
    try:
        return export(directory, output, dropped)
    except OSError as exc:
        raise BadInput(f"output: cannot write {output}: {exc.strerror or exc}") from None
