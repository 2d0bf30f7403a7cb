"""Resolution that falls with age, for a recording's size budget (launcher/recording.py): the file is
rewritten so that rounds older than `full_s` become per-minute rollups and rounds older than `minute_s`
per-5-minute rollups (each series' min, max, mean and last over the span, as long-term stores downsample),
except rounds inside a protected window (a fault, restart or recovery, ten minutes either side), which keep
full resolution, and the first round after each recorder start. Rollups already made are merged again as
they age into the coarser step.

A rollup line: {"kind": "rollup", "t0": first round's time, "t": last round's time, "step": 60 | 300,
"n": rounds in it, "s": [[id, min, max, mean, last], ...]}. Every other line is kept as it is, in order.

The new file is written beside the old one and renamed over it: a crash leaves one or the other whole.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MINUTE_S = 60
FIVE_MINUTES_S = 300
MEMBER_LINES = 512  # lines per gzip member of the rewritten file (a reader holds one member's text at once)


@dataclass(frozen=True)
class Ages:
    """Up to which age a round keeps full resolution, then per-minute rollups; older: per-5-minute.
    `protect`: whether protected windows keep full resolution at this level."""

    full_s: float
    minute_s: float
    protect: bool = True


class _Writer:
    def __init__(self, path: Path, mode: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        self.handle = open(os.open(path, flags, mode), "wb")  # noqa: SIM115 - closed by close(), or by compact()
        self.pending: list[str] = []

    def line(self, line: dict[str, Any]) -> None:
        self.pending.append(json.dumps(line, separators=(",", ":")))
        if len(self.pending) >= MEMBER_LINES:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            text = ("\n".join(self.pending) + "\n").encode()
            self.handle.write(compressor.compress(text) + compressor.flush())
            self.pending = []

    def close(self) -> None:
        self.flush()
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


class _Bucket:
    """A rollup being gathered: per series id [min, max, sum, count, last]."""

    def __init__(self, step: int, start: float) -> None:
        self.step, self.start = step, start
        self.t0 = self.t = math.nan
        self.n = 0
        self.rows: dict[int, list[float]] = {}

    def add(self, t0: float, t: float, n: int, rows: Iterable[Sequence[float]]) -> None:
        self.t0 = t0 if self.n == 0 else self.t0
        self.t, self.n = t, self.n + n
        for ident, low, high, mean, last, count in rows:
            row = self.rows.get(int(ident))
            if row is None:
                self.rows[int(ident)] = [low, high, mean * count, count, last]
            else:
                row[0], row[1] = min(row[0], low), max(row[1], high)
                row[2] += mean * count
                row[3] += count
                row[4] = last

    def line(self) -> dict[str, Any]:
        return {"kind": "rollup", "t0": self.t0, "t": self.t, "step": self.step, "n": self.n,
                "s": [[ident, low, high, round(total / count, 12), last]
                      for ident, (low, high, total, count, last) in self.rows.items()]}


def compact(path: Path, lines: Iterable[dict[str, Any]], now: float, ages: Ages,
            protected: Sequence[tuple[float, float]]) -> int:
    """Rewrite the recording at `path` (read as `lines`) at `ages` as of `now`; `protected`: sorted,
    non-overlapping (start, end) windows kept whole. Returns the new file's size."""
    starts = [lo for lo, _ in protected]

    def step_of(t: float) -> int:
        if ages.protect:
            at = bisect.bisect_right(starts, t) - 1
            if at >= 0 and t <= protected[at][1]:
                return 0
        age = now - t
        return 0 if age <= ages.full_s else MINUTE_S if age <= ages.minute_s else FIVE_MINUTES_S

    temporary = path.with_name(path.name + ".compacting")
    writer = _Writer(temporary, path.stat().st_mode & 0o777)
    bucket: _Bucket | None = None

    def flush() -> None:
        nonlocal bucket
        if bucket is not None and bucket.n:
            writer.line(bucket.line())
        bucket = None

    def into(step: int, t: float) -> _Bucket:
        nonlocal bucket
        start = math.floor(t / step) * step
        if bucket is None or bucket.step != step or bucket.start != start:
            flush()
            bucket = _Bucket(step, start)
        return bucket

    first = False  # the next scrape is a recorder's first: kept whole (the record starts where the run did)
    try:
        for line in lines:
            kind = line.get("kind")
            if kind == "scrape":
                step = 0 if first else step_of(line["t"])
                first = False
                if step == 0:
                    flush()
                    writer.line(line)
                else:
                    into(step, line["t"]).add(line["t"], line["t"], 1,
                                              ((i, v, v, v, v, 1) for i, v in line["s"]))
            elif kind == "rollup":
                step = step_of(line["t"])
                if step <= line["step"]:  # as coarse as its age asks already
                    flush()
                    writer.line(line)
                else:
                    per = line["n"]
                    into(step, line["t"]).add(line["t0"], line["t"], per,
                                              ((i, lo, hi, mean, last, per) for i, lo, hi, mean, last in line["s"]))
            else:
                if kind in ("meta", "end"):
                    flush()  # ids start again after a meta line: no rollup spans it
                    first = kind == "meta"
                writer.line(line)
        flush()
        writer.close()
    except BaseException:
        writer.handle.close()
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)
    return path.stat().st_size
