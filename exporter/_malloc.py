"""glibc malloc settings for `exporter serve` (docs/benchmarks.md, "Footprint of a GPU node's exporter").

Imported by `exporter.cli` before its other imports: when the command line is `exporter serve ...` (or
`python -m exporter serve ...`), both settings apply from here on, before the imports fill the heap;
`serve()` applies them again for callers that run it in-process (no effect on a heap already grown).
An environment variable glibc reads itself wins over each; off glibc nothing happens.
"""

from __future__ import annotations

import contextlib
import os
import sys

M_ARENA_MAX = -8  # glibc's mallopt() parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value, which it raises as large blocks are freed unless set


def _mallopt(parameter: int, value: int) -> None:
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not glibc (musl has no such settings)
        ctypes.CDLL(None).mallopt(parameter, value)


def cap_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas before any thread starts. glibc gives threads that allocate at once
    arenas of their own, up to 8 per core, each holding freed memory; the exporter's threads mostly
    wait, and two arenas serve them (measured: 1 to 2 MB less RSS, CPU the same; docs/benchmarks.md).
    MALLOC_ARENA_MAX in the environment wins."""
    if "MALLOC_ARENA_MAX" not in os.environ:
        _mallopt(M_ARENA_MAX, arenas)


def pin_mmap_threshold() -> None:
    """Keep glibc's mmap threshold at its initial 128 KiB. glibc raises it (up to 32 MB) each time a
    mapped block is freed, from then on serving large blocks (the imports' transient buffers, the
    renderings' bodies) from the heap, which they leave fragmented and resident; pinned, large blocks
    are mapped and unmapped, and the trim threshold stays at 128 KiB too. Measured: ~0.9 MB less RSS
    after scrapes when set before the imports, nothing when set after them. MALLOC_MMAP_THRESHOLD_,
    MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_ or MALLOC_MMAP_MAX_ in the environment wins."""
    if not any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                               "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")):
        _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def serving(argv: list[str]) -> bool:
    """Whether this process was started to serve: `exporter serve ...` or `python -m exporter serve ...`."""
    return argv[1:2] == ["serve"]


if serving(sys.argv):
    cap_malloc_arenas()
    pin_mmap_threshold()
