"""Runs submitted with `--no-wait`: the launcher submits the first attempt, prints the run id and
leaves, as `ray job submit --no-wait` does. The cluster runs the job; no launcher process follows it.

Only where the cluster outlives the command: an existing cluster, a kept local one (--keep-cluster,
--cluster), KubeRay (which supervises its own RayJobs: backoffLimit, deadlines). A local cluster the
command would tear down is refused before anything starts.

What a supervisor does is then not done: retries, the health watcher, the launcher's deadlines. Asking
for one of them together with --no-wait is refused (nothing would apply it); otherwise the run is
recorded with one attempt and no watcher, as it will run. `launcher submit --run-id RUN_ID ...`
without --no-wait supervises it later from where it is: submission is idempotent, so it follows the
attempt it finds, then retries, watches and enforces deadlines as its spec asks.

A detached run has no process that owns its record, so the commands that read it keep it up to date
(`status`, and `logs`, `stop`, `down` through it): they copy the attempt's state from the cluster and,
once it has ended, finish the run (state, exit code, its log saved beside the record).
"""

from __future__ import annotations

from launcher.backends.base import Backend
from launcher.backends.registry import resolve
from launcher.errors import BadInput
from launcher.spec import JobSpec

SUPERVISED_LATER = ("`launcher submit --run-id RUN_ID ...` without --no-wait supervises a run submitted with it "
                    "(retries, health, deadlines) from where it is")


def _supervision_asked(spec: JobSpec) -> str | None:
    """The first setting given explicitly that only a launcher following the run applies."""
    if "max_retries" in spec.model_fields_set and spec.max_retries > 0:
        return "max_retries"
    for field in ("active_deadline_seconds", "pre_running_deadline_seconds"):
        if getattr(spec, field) is not None:
            return field
    asked = sorted(spec.health.model_fields_set - {"enabled"}) if spec.health.enabled else []
    return f"health.{asked[0]}" if asked else None


def spec_for_no_wait(spec: JobSpec, backend: Backend | None = None) -> JobSpec:
    """The spec of a run submitted with --no-wait, or BadInput saying why it cannot be (nothing has
    started yet). `backend`: the spec's, when the caller has resolved it already."""
    backend = backend or resolve(spec)
    if not backend.followed:
        return spec  # its platform supervises it (KubeRay: backoffLimit, activeDeadlineSeconds)
    refused = backend.no_wait_refusal()
    if refused:
        raise BadInput(f"--no-wait: {refused}")
    asked = _supervision_asked(spec)
    if asked is not None:
        raise BadInput(f"--no-wait: {asked} needs the launcher to follow the run, and with --no-wait none does "
                       f"(no retries, health watching or deadlines after submit returns); drop {asked}, or leave "
                       f"--no-wait out. {SUPERVISED_LATER}")
    return spec.model_copy(update={"max_retries": 0, "health": spec.health.model_copy(update={"enabled": False})})
