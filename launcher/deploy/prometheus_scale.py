"""A Prometheus configuration for a large cluster (issue 26): sharding, remote_write and the cut, as
changes to a document of `alerts.prometheus.config`. `launcher prometheus-config` uses them.

    shard(document, shards=4, index=0)       # this server scrapes a quarter of the targets
    remote_write(document, "https://mimir/api/v1/push", password_file="/etc/prometheus/rw.pass", user="u")
    cut(document)                            # drop what no panel or rule needs (dashboards/cut.py)

Sharding is by target: `hashmod` of `__address__` over N, each server keeps its own remainder. A
node's series all land on one shard, so per-node and per-GPU alerts work on every shard; the head's
series (jobs, actors, /sd) on one. Each shard carries an external label (`SHARD_LABEL`) so that its
series and its recording rules' results stay apart in a shared store and in Alertmanager; a global
view sums the shards' `:sum` and `:count` records (alerts/groups/scale.py) `without` that label.
"""

from __future__ import annotations

from typing import Any

from dashboards import cut as cutting

SHARD_LABEL = "prometheus_shard"
_HASH_LABEL = "__tmp_raypulse_shard"  # a __tmp_ label: dropped by Prometheus after relabeling


class ScaleError(ValueError):
    """A setting that cannot make a valid configuration; the message names the option."""


def shard(document: dict[str, Any], shards: int, index: int) -> dict[str, Any]:
    if shards < 1:
        raise ScaleError(f"--shards {shards}: give 1 or more")
    if not 0 <= index < shards:
        raise ScaleError(f"--shard {index}: give 0 to {shards - 1} (this server's number among --shards {shards})")
    if shards == 1:
        return document
    for job in document["scrape_configs"]:
        job.setdefault("relabel_configs", []).extend([
            {"source_labels": ["__address__"], "modulus": shards, "target_label": _HASH_LABEL, "action": "hashmod"},
            {"source_labels": [_HASH_LABEL], "regex": str(index), "action": "keep"},
        ])
    document["global"].setdefault("external_labels", {})[SHARD_LABEL] = str(index)
    return document


def remote_write(document: dict[str, Any], url: str, *, user: str | None = None, password_file: str | None = None,
                 bearer_token_file: str | None = None) -> dict[str, Any]:
    """Send every sample on to a long-term store. Credentials are file paths that Prometheus reads;
    no secret is ever in the document (nor printed)."""
    if not url.startswith(("http://", "https://")):
        raise ScaleError(f"--remote-write {url!r}: give the store's push URL, http(s)://host/api/v1/push")
    if bool(user) != bool(password_file):
        raise ScaleError("--remote-write-user: give it with --remote-write-password-file (Prometheus reads the "
                         "password from that file)")
    if password_file and bearer_token_file:
        raise ScaleError("--remote-write-bearer-token-file: give it or basic auth (--remote-write-user), not both")
    target: dict[str, Any] = {"url": url}
    if user:
        target["basic_auth"] = {"username": user, "password_file": password_file}
    if bearer_token_file:
        target["authorization"] = {"type": "Bearer", "credentials_file": bearer_token_file}
    document.setdefault("remote_write", []).append(target)
    return document


def cut(document: dict[str, Any]) -> dict[str, Any]:
    """Drop the cut's families after each scrape, before storage (dashboards/cut.py says which and why)."""
    relabels = cutting.relabel_configs(cutting.derive())
    for job in document["scrape_configs"]:
        job.setdefault("metric_relabel_configs", []).extend(relabels)
    return document
