"""Ray submission ids of a run's attempts, and the run id a user's submission id stands for.

A run is one logical job across attempts; each attempt is its own Ray job. Without a user's
submission id, attempt N of run R is `R-a<N>`. With one (`--submission-id X`, as `ray job submit`),
attempt 1 is `X` exactly (what `ray job status X` finds) and attempt N>1 is `X-a<N>`. Where no run
id is given, X is also the idempotency key: the run id is derived from it, the same every time, so
submitting X again follows that run instead of starting another (as `--run-id` does).
"""

from __future__ import annotations

import hashlib
import re

MAX_LENGTH = 128
VALID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_LENGTH - 1}}}")
_RUN_ID = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_MAX_RUN_ID = 47  # launcher/spec.py MAX_RUN_ID (a run id names a RayJob, a cluster, a directory)


def attempt_id(run_id: str, attempt: int, first: str | None = None) -> str:
    """The Ray submission id of an attempt: `first` (the user's) for attempt 1, `<first>-a<N>` later;
    `<run_id>-a<N>` when the user named none."""
    if first:
        return first if attempt == 1 else f"{first}-a{attempt}"
    return f"{run_id}-a{attempt}"


def run_id_of(submission_id: str) -> str:
    """The run id of a user's submission id: itself when it is a run id (a lowercase DNS label of at
    most 47), else a DNS label made from it plus 8 hex of its hash (distinct ids stay distinct)."""
    if _RUN_ID.fullmatch(submission_id) and len(submission_id) <= _MAX_RUN_ID:
        return submission_id
    slug = re.sub(r"[^a-z0-9]+", "-", submission_id.lower()).strip("-")
    if not slug[:1].isalpha():
        slug = f"s-{slug}".rstrip("-")
    digest = hashlib.sha256(submission_id.encode()).hexdigest()[:8]
    return f"{slug[:_MAX_RUN_ID - 9].rstrip('-')}-{digest}"
