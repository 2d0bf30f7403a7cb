"""The two kinds of failure the launcher reports besides a job's own result (see exitcodes.py), and an
interrupted start (a run that ends STOPPED before its job was submitted)."""

from __future__ import annotations


class BadInput(ValueError):
    """The request cannot be carried out as given (spec, options, target cluster, token,
    kubeconfig). Raised before anything starts; the message names the field or setting."""


class InfraError(RuntimeError):
    """The cluster could not be started, or was lost while the job ran."""


class Cancelled(Exception):
    """A cluster's start-up was interrupted (Ctrl-C, SIGTERM, `launcher stop`): the run ends STOPPED."""
