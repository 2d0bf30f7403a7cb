"""Frameworks' training loops reported with no change to their code: `setup()` is the Ray
worker_process_setup_hook that `launcher submit --framework-metrics` names (wire.FRAMEWORK_SETUP_HOOK),
run by Ray in every worker process of the job before its tasks and actors (Ray 2.60,
ray/_private/workers/default_worker.py; not in the driver: there, one line attaches the callback).

- transformers: every `Trainer` the process builds (TRL's trainers among them, under Ray Train or in
  any actor) gets a `RaypulseCallback` (exporter/progress/trl.py);
- verl: every `Tracking.log` of its trainer is also reported (exporter/progress/verl.py), and the rollout servers
  its `LLMServerManager` starts are told to the head's exporter for /sd/rollout (exporter/progress/rollout.py);
- OpenRLHF: every `BasePPOTrainer.save_logs_and_checkpoints` of its PPO trainer (exporter/progress/openrlhf.py).

A process that never imports them pays nothing: a module is patched when it is imported (an import
hook that steps aside once each is done), or at once when it already was. Never raises into the
worker: a patch that cannot be applied leaves the framework as it was.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

TRAINER_MODULE = "transformers.trainer"
TRACKING_MODULE = "verl.utils.tracking"
LLM_SERVER_MODULE = "verl.workers.rollout.llm_server"
OPENRLHF_MODULE = "openrlhf.trainer.ppo_trainer"
_PATCHED = "_raypulse"  # set on a wrapped function: never wrapped twice


def setup() -> None:
    """Ray's worker_process_setup_hook: patch each framework now or when it is imported."""
    waiting = {}
    for name, patch in PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
        else:
            waiting[name] = patch
    if waiting and not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(waiting))


def _wrap(owner: type, name: str, after: Callable[..., None]) -> None:
    """owner.name runs as before, then `after(self, *args, **kwargs)` (once awaited, for a coroutine method)."""
    original = getattr(owner, name)
    if getattr(original, _PATCHED, False):
        return

    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = await original(self, *args, **kwargs)
            after(self, *args, **kwargs)
            return result
    else:
        @functools.wraps(original)
        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            after(self, *args, **kwargs)
            return result

    setattr(wrapped, _PATCHED, True)
    setattr(owner, name, wrapped)


def _patch_transformers(module: ModuleType) -> None:
    try:
        from exporter.progress.trl import RaypulseCallback

        def attach(trainer: Any, *args: Any, **kwargs: Any) -> None:
            if not any(isinstance(callback, RaypulseCallback) for callback in trainer.callback_handler.callbacks):
                trainer.add_callback(RaypulseCallback())

        _wrap(module.Trainer, "__init__", attach)
    except Exception:  # noqa: BLE001  (the job runs as it would without raypulse)
        return


def _patch_verl(module: ModuleType) -> None:
    try:
        from exporter.progress.verl import report_step

        def report(tracking: Any, data: Any = None, step: Any = None, *args: Any, **kwargs: Any) -> None:
            report_step(data, step)  # Tracking.log(data, step, backend=None), by position or by name

        _wrap(module.Tracking, "log", report)
    except Exception:  # noqa: BLE001
        return


def _patch_verl_rollout(module: ModuleType) -> None:
    try:
        from exporter.progress import rollout

        def report(manager: Any, *args: Any, **kwargs: Any) -> None:
            # verl sets both in the method: its rollout config's `name` (vllm, sglang) and one host:port a replica
            rollout.report_servers(manager.rollout_config.name, manager.server_addresses)

        _wrap(module.LLMServerManager, "_initialize_llm_servers", report)
    except Exception:  # noqa: BLE001
        return


def _patch_openrlhf(module: ModuleType) -> None:
    try:
        from exporter.progress.openrlhf import report_step

        def report(trainer: Any, global_step: Any = None, logs_dict: Any = None, *args: Any, **kwargs: Any) -> None:
            report_step(logs_dict, global_step)  # (global_step, logs_dict=None, client_states=None)

        _wrap(module.BasePPOTrainer, "save_logs_and_checkpoints", report)
    except Exception:  # noqa: BLE001
        return


PATCHES: dict[str, Callable[[ModuleType], None]] = {TRAINER_MODULE: _patch_transformers,
                                                    TRACKING_MODULE: _patch_verl,
                                                    LLM_SERVER_MODULE: _patch_verl_rollout,
                                                    OPENRLHF_MODULE: _patch_openrlhf}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds a module to patch as the other finders do, and patches it once it has run. A module is
    crossed off when it was patched, not when it was looked for: `importlib.util.find_spec(name)` looks
    without importing, and an import that fails may be tried again."""

    def __init__(self, waiting: dict[str, Callable[[ModuleType], None]]) -> None:
        self.waiting = waiting

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        patch = self.waiting.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            patch(module)
            self.waiting.pop(name, None)
            if not self.waiting and self in sys.meta_path:
                sys.meta_path.remove(self)  # every module patched: out of the way of every later import

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
