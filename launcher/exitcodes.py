"""Exit codes of `launcher`, which scripts can trust (README's launcher section lists them).

Ray's own `ray job submit` exits 0 for a stopped job; we keep every final state apart.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    SUCCEEDED = 0  # the job succeeded (or a read command worked)
    FAILED = 1  # the job failed on its last attempt
    BAD_INPUT = 2  # invalid spec or options, unknown run, unusable cluster/token/kubeconfig; nothing started
    STOPPED = 3  # stopped: `launcher stop`, Ctrl-C or SIGTERM
    DEADLINE_EXCEEDED = 4  # active_deadline_seconds or pre_running_deadline_seconds passed; the job was stopped
    INFRA_ERROR = 5  # the cluster could not be started or was lost while the job ran
    REPEATED_FAILURE = 6  # retries were left, but two attempts in a row failed the same way: retrying won't help
    UNHEALTHY = 7  # stopped by its health policy (hang, GPU fault, lost node, non-finite loss), or healing ran out


# Final run states (ours, one level above Ray's job status; named as the exit codes) and codes.
FINAL_STATES: dict[str, ExitCode] = {code.name: code for code in ExitCode if code != ExitCode.BAD_INPUT}
