"""Report training progress to this node's raypulse exporter, from any training loop.

    from exporter import progress

    for step, batch in enumerate(loader):
        loss = train_step(batch)
        progress.report(step, loss=loss, samples=len(batch), learning_rate=scheduler.get_last_lr()[0])
        if step % 1000 == 0:
            save_checkpoint(...)
            progress.checkpoint_saved(step)

In a Ray Train training function, `progress.ray_train_report(metrics, checkpoint=...)` replaces
`ray.train.report(...)` and reports the step, loss and checkpoint as well.

Guarantees: the standard library only; never raises into the caller; never blocks it (a bounded
queue and a background sender thread; when the queue is full the report is dropped and counted);
harmless when no exporter runs (reports are dropped and counted). The exporter is found at
RAYPULSE_PROGRESS_URL (http://HOST:PORT or unix:/path/to.sock; the launcher sets it per node),
else http://127.0.0.1:9478. The job is named from what Ray puts in the process: the Ray job id
from `ray.get_runtime_context()` once `ray` is initialized (or RAY_JOB_ID), the submission id
from the job config Ray gives a submitted job's driver (or RAYPULSE_SUBMISSION_ID, which the
launcher gives every process of an attempt). The exporter fills in the other one. Where the exporter
requires tokens (Ray token authentication on), each request carries its job's token: the one the
launcher gave the attempt (RAYPULSE_PROGRESS_TOKEN), else one derived from the Ray token if this
process can read it.
`samples` and `tokens` are per call; the client sends running totals, so a dropped report loses
nothing but its own point in time. See docs/progress.md for the wire format.

RL post-training loops time their phases and report each iteration:

    for iteration in range(iterations):
        with progress.phase("generate"):
            batch = generate(prompts)
        with progress.phase("train"):
            stats = train(batch)
        with progress.phase("weight_sync"):
            sync_weights()
        progress.report_iteration(iteration, rollouts=len(batch), generated_tokens=batch.tokens,
                                  reward_mean=stats.reward_mean, kl=stats.kl, truncated_ratio=stats.truncated)

A phase sends a report when it starts and when it ends (a phase that never ends is how an RL hang
shows); phase seconds, rollouts and tokens travel as running totals like samples.
"""

from __future__ import annotations

import atexit
import http.client
import json
import logging
import math
import os
import queue
import re
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from exporter.contract import wire

__all__ = ["checkpoint", "checkpoint_dir", "checkpoint_saved", "flush", "phase", "ray_train_report", "report",
           "report_iteration", "resume_from", "rollout_servers", "stats"]

ENV_URL = wire.ENV_PROGRESS_URL
DEFAULT_URL = f"http://127.0.0.1:{wire.PROGRESS_PORT}"
PATH = wire.PROGRESS_PATH
QUEUE_SIZE = 1000
BATCH_SIZE = 100  # reports per request (the endpoint takes up to 256)
MAX_REQUEST_BYTES = 48 * 1024  # a request's body at most (the endpoint's progress.max_body_bytes is 64 KiB)
TIMEOUT_SECONDS = 2.0
MAX_BACKOFF_SECONDS = 30.0
EXIT_FLUSH_SECONDS = 1.0
_NIL_JOB_ID = "ffffffff"  # what Ray puts in RAY_JOB_ID of a worker it started before knowing its job

log = logging.getLogger("raypulse.progress")


def _number(value: Any) -> float | None:
    """A float from an int, float, numpy or 0-d tensor; None if it is not a number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _json_number(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _connection(url: str) -> tuple[http.client.HTTPConnection, str]:
    if url.startswith("unix:"):
        return _UnixConnection(url.removeprefix("unix:"), TIMEOUT_SECONDS), PATH
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{ENV_URL} must be http://HOST:PORT or unix:/path, not {url!r}")
    path = parts.path.rstrip("/") + PATH if parts.path not in ("", "/") else PATH
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=TIMEOUT_SECONDS), path


class _Identity:
    """Who is reporting: Ray job id, submission id, rank; looked up until found, then kept."""

    def __init__(self) -> None:
        self.job_id: str | None = None
        self.submission_id = os.environ.get(wire.ENV_SUBMISSION_ID) or self._submission_from_job_config()
        self.rank: int | None = None

    @staticmethod
    def _submission_from_job_config() -> str | None:
        # Ray's JobSupervisor starts a submitted job's driver with its job config, metadata included.
        try:
            config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
            return str(config["metadata"]["job_submission_id"]) or None
        except (ValueError, KeyError, TypeError):
            return None

    def current(self) -> tuple[str | None, str | None]:
        if self.job_id is None:
            self.job_id = self._ray_job_id()
        return self.job_id, self.submission_id

    @staticmethod
    def _ray_job_id() -> str | None:
        ray = sys.modules.get("ray")  # never imported here: only asked if the training code uses it
        try:
            if ray is not None and ray.is_initialized():
                return ray.get_runtime_context().get_job_id() or None
        except Exception:  # noqa: BLE001  (any Ray version, any state)
            pass
        env = os.environ.get("RAY_JOB_ID", "")
        return env if env and env != _NIL_JOB_ID and ray is None else None

    def default_rank(self) -> int:
        if self.rank is None:
            self.rank = self._ray_train_rank()
        if self.rank is None:
            env = os.environ.get("RANK", "")
            return int(env) if env.isdigit() else 0
        return self.rank

    @staticmethod
    def _ray_train_rank() -> int | None:
        train = sys.modules.get("ray.train")
        try:
            if train is not None:
                return int(train.get_context().get_world_rank())
        except Exception:  # noqa: BLE001  (not inside a Ray Train worker)
            pass
        return None


class _PhaseClock:
    """One named RL phase of one rank: wall seconds in all, in the iteration under way and in the last one."""

    __slots__ = ("current", "last", "running", "since", "total")

    def __init__(self) -> None:
        self.total = self.current = 0.0
        self.last: float | None = None
        self.since: float | None = None  # unix time the phase started, while it runs
        self.running = 0  # runs of it under way (threads may overlap)

    def wire(self) -> dict[str, float]:
        entry = {"seconds_total": round(self.total, 6)}
        if self.last is not None:
            entry["iteration_seconds"] = round(self.last, 6)
        if self.since is not None:
            entry["running_since"] = self.since
        return entry


class _RL:
    """A rank's RL phases (at most wire.RL_MAX_PHASES) and its iteration count."""

    def __init__(self) -> None:
        self.phases: dict[str, _PhaseClock] = {}
        self.iterations = 0
        self.warned = False

    def clock(self, name: str) -> _PhaseClock | None:
        clock = self.phases.get(name)
        if clock is None and len(self.phases) < wire.RL_MAX_PHASES:
            clock = self.phases[name] = _PhaseClock()
        return clock

    def wire(self) -> dict[str, dict[str, float]]:
        return {name: clock.wire() for name, clock in self.phases.items()}


def _rl_name(name: Any) -> str | None:
    """A phase or reward-source name the endpoint accepts: other characters become _, cut to 40."""
    text = re.sub(r"[^A-Za-z0-9_.:-]", "_", str(name))[:wire.RL_NAME_MAX_LENGTH]
    return text or None


class _Client:
    """One per process (re-made after a fork): the queue, the totals, and the sender thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pid = os.getpid()
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue(QUEUE_SIZE)
        self.identity = _Identity()
        self.totals: dict[tuple[int, str], int] = {}  # (rank, "samples"/"tokens") -> running total
        self.rl: dict[int, _RL] = {}  # by rank
        # RL state; held from changing it to queueing the report, so reports queue in the order of the
        # states they carry (running totals never go back), whichever threads time phases
        self.rl_lock = threading.Lock()
        self.sent = self.dropped = self.rejected = 0
        self.last_ok = False
        self._lock = threading.Lock()  # counters and totals; held for microseconds
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def enqueue(self, entry: dict[str, Any]) -> None:
        if self._thread is None:
            self._start()
        try:
            self.queue.put_nowait(entry)
        except queue.Full:
            with self._lock:
                self.dropped += 1

    def running_total(self, rank: int, name: str, increment: Any) -> int | None:
        amount = _number(increment)
        if amount is None or amount < 0:
            return None
        with self._lock:
            total = self.totals.get((rank, name), 0) + int(amount)
            self.totals[(rank, name)] = total
            return total

    def rl_rank(self, rank: int) -> _RL:
        """The rank's RL state; call with rl_lock held."""
        state = self.rl.get(rank)
        if state is None:
            state = self.rl[rank] = _RL()
        return state

    def over_limit(self, state: _RL, what: str, name: str) -> None:
        """A phase or reward source past the bound: not reported; counted, and said once per rank."""
        with self._lock:
            self.dropped += 1
        if not state.warned:
            state.warned = True
            log.warning("raypulse progress: %s %r not reported: at most %d phases and %d reward sources per rank",
                        what, name, wire.RL_MAX_PHASES, wire.RL_MAX_SOURCES)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="raypulse-progress", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        connection: http.client.HTTPConnection | None = None
        path = PATH
        backoff = 0.0
        while True:
            batch = [self.queue.get()]
            while len(batch) < BATCH_SIZE:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            with self._lock:
                dropped = self.dropped
            for entry in batch:
                entry["dropped_total"] = dropped
            try:
                if connection is None:
                    connection, path = _connection(self.url)
                status = self._post(connection, path, batch)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if connection is not None:
                    connection.close()
                connection = None
                self._done(batch, ok=False, rejected=False)
                if not backoff:
                    log.debug("raypulse progress: cannot reach the exporter at %s: %s", self.url, exc)
                backoff = min(MAX_BACKOFF_SECONDS, max(0.5, backoff * 2))
                self._wake.wait(backoff)  # reports keep queueing (and dropping when full) meanwhile
                continue
            backoff = 0.0
            self._done(batch, ok=200 <= status < 300, rejected=status >= 400)

    @staticmethod
    def _post(connection: http.client.HTTPConnection, path: str, batch: list[dict[str, Any]]) -> int:
        """One request per owner (a token is for one job); the worst status."""
        owners: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for entry in batch:
            key = wire.progress_owner(entry["kind"], entry.get("run_id"), entry.get("submission_id"),
                                      entry.get("job_id"))
            owners.setdefault(key, []).append(entry)
        worst = 0
        for owner, entries in owners.items():
            headers = {"Content-Type": "application/json"}
            token = _token(owner)
            if token:
                headers["Authorization"] = f"Bearer {token}"
            for count, body in _bodies(entries):
                connection.request("POST", path, body, headers)
                response = connection.getresponse()
                detail = response.read(2048)
                if response.status >= 400:
                    log.warning("raypulse progress: the exporter refused %d report(s): %s %s", count,
                                response.status, detail.decode(errors="replace")[:500])
                worst = max(worst, response.status)
        return worst

    def _done(self, batch: list[dict[str, Any]], ok: bool, rejected: bool) -> None:
        with self._lock:
            if ok:
                self.sent += len(batch)
            else:
                self.dropped += len(batch)
                self.rejected += len(batch) if rejected else 0
            self.last_ok = ok
        for _ in batch:
            self.queue.task_done()

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self.queue.unfinished_tasks


def _bodies(entries: list[dict[str, Any]]) -> Iterator[tuple[int, bytes]]:
    """Request bodies of whole reports, each under MAX_REQUEST_BYTES (RL reports carry their phases)."""
    parts: list[bytes] = []
    size = 0
    for entry in entries:
        part = json.dumps(entry, allow_nan=False, separators=(",", ":")).encode()
        if parts and size + len(part) + 1 > MAX_REQUEST_BYTES - 16:
            yield len(parts), b'{"reports":[' + b",".join(parts) + b"]}"
            parts, size = [], 0
        parts.append(part)
        size += len(part) + 1
    if parts:
        yield len(parts), b'{"reports":[' + b",".join(parts) + b"]}"


def _token(owner: tuple[str, str]) -> str | None:
    """The launcher's token for this attempt, else one derived from a readable Ray token, else none."""
    given = os.environ.get(wire.ENV_PROGRESS_TOKEN)
    if given:
        return given
    try:
        key = wire.ray_auth_token()
    except OSError:
        return None
    return wire.progress_token(key, *owner) if key else None


_client: _Client | None = None
_client_lock = threading.Lock()


def _get_client() -> _Client:
    global _client
    client = _client
    if client is None or client.pid != os.getpid():  # first use, or a forked child: its own thread
        with _client_lock:
            if _client is None or _client.pid != os.getpid():
                _client = _Client(os.environ.get(ENV_URL) or DEFAULT_URL)
            client = _client
    return client


def _submit(kind: str, rank: int | None, fields: Mapping[str, Any]) -> None:
    client = _get_client()
    job_id, submission_id = client.identity.current()
    if rank is None:
        rank = client.identity.default_rank()
    entry = {"kind": kind, "job_id": job_id, "submission_id": submission_id, "rank": int(rank),
             "time": time.time(), **fields}
    client.enqueue(entry)


def report(step: int, *, loss: float | None = None, samples: int | None = None, tokens: int | None = None,
           grad_norm: float | None = None, learning_rate: float | None = None, rank: int | None = None) -> None:
    """Record one training step. `samples`/`tokens`: processed since the previous call (this rank).
    `rank` defaults to the Ray Train world rank, else $RANK, else 0. Never raises, never blocks."""
    try:
        client = _get_client()
        rank = client.identity.default_rank() if rank is None else int(rank)
        step_value = _number(step)
        fields = {"step": int(step_value) if step_value is not None and step_value >= 0 else None,
                  "loss": _json_number(_number(loss)), "grad_norm": _json_number(_number(grad_norm)),
                  "learning_rate": _json_number(_number(learning_rate)),
                  "samples_total": client.running_total(rank, "samples", samples) if samples is not None else None,
                  "tokens_total": client.running_total(rank, "tokens", tokens) if tokens is not None else None}
        _submit("progress", rank, fields)
    except Exception:  # noqa: BLE001  (a metrics helper must never break training)
        _count_internal_drop()


def checkpoint_saved(step: int | None = None, *, path: str | os.PathLike[str] | None = None,
                     seconds: float | None = None, rank: int | None = None) -> None:
    """Record that a checkpoint was just saved (at `step`, to `path`, taking `seconds`). With a path,
    the run's checkpoint dir ($RAYPULSE_CHECKPOINT_DIR) also gets a marker naming it, so the next
    attempt is told to resume from it ($RAYPULSE_RESUME_FROM). Never raises into the caller."""
    try:
        client = _get_client()
        rank = client.identity.default_rank() if rank is None else int(rank)
        step_value = _number(step)
        step_int = int(step_value) if step_value is not None and step_value >= 0 else None
        duration = _number(seconds)
        # The rank's saves so far, not one more: a report lost on the way (a full queue, an exporter that
        # did not answer) is made up by the next, so the interval between saves stays true.
        _submit("checkpoint", rank, {"step": step_int, "duration_seconds": duration if duration is not None and
                                     math.isfinite(duration) and duration >= 0 else None,
                                     "checkpoints_total": client.running_total(rank, "checkpoints", 1)})
        if path is not None:
            _write_marker(step_int, os.fspath(path))
    except Exception:  # noqa: BLE001
        _count_internal_drop()


@contextmanager
def checkpoint(step: int | None = None, *, path: str | os.PathLike[str] | None = None,
               rank: int | None = None) -> Iterator[None]:
    """Time a checkpoint save: `with progress.checkpoint(step, path=p): save(p)`; reported (with how
    long it took) only when the block succeeds."""
    started = time.monotonic()
    yield
    checkpoint_saved(step, path=path, seconds=time.monotonic() - started, rank=rank)


def _write_marker(step: int | None, path: str) -> None:
    """The latest checkpoint, for the launcher to resume the next attempt from (atomic: a reader
    never sees half of it)."""
    directory = os.environ.get(wire.ENV_CHECKPOINT_DIR)
    if not directory or "://" in directory:
        return
    marker = Path(directory) / wire.CHECKPOINT_MARKER
    temp = marker.with_name(f".{marker.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps({"step": step, "path": path, "time": time.time(),
                                "attempt": os.environ.get(wire.ENV_ATTEMPT)}))
    os.replace(temp, marker)


def checkpoint_dir() -> str | None:
    """Where this run keeps its checkpoints across attempts ($RAYPULSE_CHECKPOINT_DIR), if the
    launcher set one."""
    return os.environ.get(wire.ENV_CHECKPOINT_DIR) or None


def resume_from() -> dict[str, Any] | None:
    """The checkpoint an earlier attempt of this run saved last ({"step": 40, "path": "..."}, either
    may be missing), or None for a fresh start ($RAYPULSE_RESUME_FROM, set by the launcher)."""
    try:
        value = json.loads(os.environ.get(wire.ENV_RESUME_FROM) or "null")
    except ValueError:
        return None
    return value if isinstance(value, dict) and (value.get("step") is not None or value.get("path")) else None


def _finite(value: Any, low: float = 0.0, high: float = math.inf) -> float | None:
    """A finite number in [low, high], else None (the endpoint would refuse the whole batch for it)."""
    number = _number(value)
    return number if number is not None and math.isfinite(number) and low <= number <= high else None


_MAX_SECONDS = float(2**53)


@contextmanager
def phase(name: str, *, rank: int | None = None) -> Iterator[None]:
    """Time one phase of an RL iteration: `with progress.phase("generate"): ...`. A report goes out when
    the phase starts and when it ends; its wall seconds count toward the iteration under way (the next
    `report_iteration`), also when the block raises. Names are free-form (other characters than
    A-Za-z0-9_.:- become _, cut to 40); at most 16 per rank, more are not timed. Never raises its own
    errors into the block, never blocks."""
    started = _phase_start(name, rank)
    try:
        yield
    finally:
        _phase_end(started)


def _phase_start(name: str, rank: int | None) -> tuple[_Client, int, str, float] | None:
    try:
        client = _get_client()
        rank = client.identity.default_rank() if rank is None else int(rank)
        key = _rl_name(name)
        if key is None:
            raise ValueError("a phase needs a name")
        with client.rl_lock:
            state = client.rl_rank(rank)
            clock = state.clock(key)
            if clock is None:
                client.over_limit(state, "phase", key)
                return None
            clock.running += 1
            if clock.running == 1:
                clock.since = time.time()
            _submit("rl", rank, {"phases": state.wire()})
        return client, rank, key, time.monotonic()
    except Exception:  # noqa: BLE001
        _count_internal_drop()
        return None


def _phase_end(started: tuple[_Client, int, str, float] | None) -> None:
    if started is None:
        return
    try:
        client, rank, key, began = started
        elapsed = time.monotonic() - began
        with client.rl_lock:
            state = client.rl_rank(rank)
            clock = state.phases[key]
            clock.total += elapsed
            clock.current += elapsed
            clock.running = max(0, clock.running - 1)
            if clock.running == 0:
                clock.since = None
            _submit("rl", rank, {"phases": state.wire()})
    except Exception:  # noqa: BLE001
        _count_internal_drop()


def report_iteration(iteration: int, *, phases: Mapping[str, float] | None = None, rollouts: int | None = None,
                     generated_tokens: int | None = None, reward_mean: float | None = None,
                     reward_std: float | None = None, rewards: Mapping[str, float] | None = None,
                     kl: float | None = None, entropy: float | None = None,
                     response_length_mean: float | None = None, response_length_max: float | None = None,
                     response_length_limit: float | None = None, truncated_ratio: float | None = None,
                     weight_sync_seconds: float | None = None, weight_sync_bytes: int | None = None,
                     rank: int | None = None) -> None:
    """Record one finished RL iteration.

    `phases`: seconds spent in named phases that were not timed with `phase()` (added to those that
    were). `rollouts`, `generated_tokens`: in this iteration (the client sends running totals).
    `reward_mean`, `reward_std`, `rewards` (mean by reward source, at most 16), `kl`, `entropy`: of this
    iteration's batch. `response_length_*` in tokens; `truncated_ratio`: share of responses cut off at
    `response_length_limit`, 0..1. `weight_sync_seconds` defaults to this iteration's time in a phase
    named "weight_sync"; `weight_sync_bytes`: what the sync moved. Values out of range are left out (a
    NaN reward mean, KL or entropy is sent and counted). Never raises, never blocks."""
    try:
        client = _get_client()
        rank = client.identity.default_rank() if rank is None else int(rank)
        sources: dict[str, float] = {}
        with client.rl_lock:
            state = client.rl_rank(rank)
            for name, seconds in (phases or {}).items():
                key, value = _rl_name(name), _finite(seconds, high=_MAX_SECONDS)
                if key is None or value is None:
                    continue
                clock = state.clock(key)
                if clock is None:
                    client.over_limit(state, "phase", key)
                    continue
                clock.total += value
                clock.current += value
            for clock in state.phases.values():
                clock.last, clock.current = clock.current, 0.0
            state.iterations += 1
            iterations = state.iterations
            sync = state.phases.get(wire.RL_WEIGHT_SYNC_PHASE)
            for name, value in (rewards or {}).items():
                key, number = _rl_name(name), _finite(value, -math.inf)
                if key is None or number is None:
                    continue
                if len(sources) >= wire.RL_MAX_SOURCES and key not in sources:
                    client.over_limit(state, "reward source", key)
                    continue
                sources[key] = number
            wired = state.wire()
            if weight_sync_seconds is None and sync is not None and sync.last:
                weight_sync_seconds = sync.last
            step = _number(iteration)
            fields = {
                "iteration": int(step) if step is not None and 0 <= step < _MAX_SECONDS else None,
                "iterations_total": iterations, "phases": wired or None,
                "rollouts_total": client.running_total(rank, "rollouts", rollouts) if rollouts is not None else None,
                "generated_tokens_total": (client.running_total(rank, "generated_tokens", generated_tokens)
                                           if generated_tokens is not None else None),
                "reward_mean": _json_number(_number(reward_mean)), "reward_std": _finite(reward_std),
                "rewards": sources or None, "kl": _json_number(_number(kl)), "entropy": _json_number(_number(entropy)),
                "response_length_mean": _finite(response_length_mean),
                "response_length_max": _finite(response_length_max),
                "response_length_limit": _finite(response_length_limit),
                "truncated_ratio": _finite(truncated_ratio, high=1.0),
                "weight_sync_seconds": _finite(weight_sync_seconds, high=_MAX_SECONDS),
                "weight_sync_bytes": _finite(weight_sync_bytes)}
            _submit("rl", rank, {key: value for key, value in fields.items() if value is not None})
    except Exception:  # noqa: BLE001
        _count_internal_drop()


_TARGET = re.compile(wire.TARGET_PATTERN)


def rollout_servers(rollout: str, servers: Iterable[str]) -> None:
    """Tell the exporter where an RL run's rollout servers serve their engine's own /metrics: `servers` as
    host:port, `rollout` the engine (vllm, sglang). The head's exporter lists them at /sd/rollout with the job's
    labels, so this is sent to the head node's exporter (`launcher submit --framework-metrics` does it for verl:
    exporter/progress/rollout.py). A server that is not host:port is left out. Never raises, never blocks."""
    try:
        listed = list(dict.fromkeys(str(server) for server in servers if _TARGET.fullmatch(str(server))))
        for start in range(0, len(listed), wire.ROLLOUT_MAX_SERVERS_PER_REPORT):
            _submit("rollout", 0, {"rollout": str(rollout),
                                   "servers": listed[start:start + wire.ROLLOUT_MAX_SERVERS_PER_REPORT]})
    except Exception:  # noqa: BLE001
        _count_internal_drop()


_LOSS_KEYS = ("loss", "train_loss")
_LR_KEYS = ("learning_rate", "lr")
_steps_reported = 0


def ray_train_report(metrics: Mapping[str, Any], checkpoint: Any = None, **kwargs: Any) -> None:
    """`ray.train.report(metrics, checkpoint=checkpoint, **kwargs)`, plus a progress report of the step
    (metrics["step"], else a count of calls), loss, grad_norm, learning rate, samples and tokens found in
    `metrics`, and `checkpoint_saved` when a checkpoint is given. Ray Train's own errors propagate."""
    global _steps_reported
    import ray.train  # only called inside a Ray Train training function, where Ray is installed

    ray.train.report(metrics, checkpoint=checkpoint, **kwargs)
    try:
        _steps_reported += 1
        step = metrics.get("step", _steps_reported)
        report(step, loss=next((metrics[k] for k in _LOSS_KEYS if k in metrics), None),
               grad_norm=metrics.get("grad_norm"), samples=metrics.get("samples"), tokens=metrics.get("tokens"),
               learning_rate=next((metrics[k] for k in _LR_KEYS if k in metrics), None))
        if checkpoint is not None:
            checkpoint_saved(step)
    except Exception:  # noqa: BLE001
        _count_internal_drop()


def _count_internal_drop() -> None:
    try:
        client = _get_client()
        with client._lock:
            client.dropped += 1
    except Exception:  # noqa: BLE001
        pass


def flush(timeout: float = 2.0) -> bool:
    """Wait up to `timeout` seconds for queued reports to be sent (or dropped); True if none is left."""
    try:
        return _get_client().flush(timeout)
    except Exception:  # noqa: BLE001
        return False


def stats() -> dict[str, int]:
    """What this process's client did so far: sent, dropped (queue full, unreachable, refused), rejected."""
    client = _get_client()
    with client._lock:
        return {"sent": client.sent, "dropped": client.dropped, "rejected": client.rejected,
                "queued": client.queue.qsize()}


@atexit.register
def _flush_at_exit() -> None:
    # The last steps and checkpoint of a finished run are the ones people look at; wait briefly,
    # and only if an exporter has been answering (never stall the exit of a run without one).
    client = _client
    if client is not None and client.pid == os.getpid() and client.last_ok:
        client.flush(EXIT_FLUSH_SECONDS)
