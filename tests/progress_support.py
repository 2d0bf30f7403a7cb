"""Running a framework's real training code in a fresh interpreter where only raypulse's setup hook ran
(as Ray runs it in every worker of a job submitted with --framework-metrics), against a real exporter."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from tests.conftest import free_port
from tests.test_progress_client import job_config, run_client, series


def run_hooked(start_exporter: Any, tmp_path: Path, code: str, submission_id: str,
               *args: str) -> tuple[Any, dict[str, Any]]:
    """`code` (its sys.argv[1:] = args) reporting as `submission_id` to a new exporter: (exporter, the
    JSON line the code printed last)."""
    port = free_port()
    exporter = start_exporter(f"127.0.0.1:{port}")
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(code))
    stats = run_client(f"import runpy, sys; sys.argv = ['run', *{list(args)!r}]; "
                       f"runpy.run_path({str(script)!r}, run_name='__main__')",
                       {"RAYPULSE_PROGRESS_URL": f"http://127.0.0.1:{port}",
                        "RAY_JOB_CONFIG_JSON_ENV_VAR": job_config(submission_id), "HF_HUB_OFFLINE": "1"},
                       timeout=240)
    return exporter, stats


def one(exporter: Any, family: str, submission_id: str, **labels: str) -> float:
    """The one sample of `family` for the job, with `labels` among its labels."""
    found = [value for key, value in series(exporter, family).items()
             if dict(key).get("submission_id") == submission_id and labels.items() <= dict(key).items()]
    assert len(found) == 1, (family, labels, series(exporter, family))
    return found[0]
