"""Running a framework's real training code in a fresh interpreter where only raypulse's setup hook ran
(as Ray runs it in every worker of a job submitted with --framework-metrics), against a real exporter."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from tests.conftest import free_port, wait_until
from tests.test_progress_client import job_config, run_client, series


def run_hooked(start_exporter: Any, tmp_path: Path, code: str, submission_id: str, *args: str,
               last_step: int) -> tuple[Any, dict[str, Any]]:
    """`code` (its sys.argv[1:] = args) reporting as `submission_id` to a new exporter: (exporter, the
    JSON line the code printed last), once /metrics shows `last_step` as the job's training step and RL
    iteration (the exporter publishes what it was sent at its collector's next run)."""
    port = free_port()
    exporter = start_exporter(f"127.0.0.1:{port}")
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(code))
    stats = run_client(f"import runpy, sys; sys.argv = ['run', *{list(args)!r}]; "
                       f"runpy.run_path({str(script)!r}, run_name='__main__')",
                       {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{port}",
                        "RAY_JOB_CONFIG_JSON_ENV_VAR": job_config(submission_id), "HF_HUB_OFFLINE": "1"},
                       timeout=240)
    wait_until(lambda: all(_values(exporter, family, submission_id) == [last_step]
                           for family in ("raypulse_train_step", "raypulse_rl_iteration")),
               30, f"step {last_step} of {submission_id} on /metrics")
    return exporter, stats


def _values(exporter: Any, family: str, submission_id: str) -> list[float]:
    return [value for key, value in series(exporter, family).items() if dict(key).get("submission_id") == submission_id]


def one(exporter: Any, family: str, submission_id: str, **labels: str) -> float:
    """The one sample of `family` for the job, with `labels` among its labels."""
    found = [value for key, value in series(exporter, family).items()
             if dict(key).get("submission_id") == submission_id and labels.items() <= dict(key).items()]
    assert len(found) == 1, (family, labels, series(exporter, family))
    return found[0]
