"""Frameworks' training loops reported with no change to their code: `setup()` is the Ray
worker_process_setup_hook that `launcher submit --framework-metrics` names (wire.FRAMEWORK_SETUP_HOOK),
run by Ray in every worker process of the job before its tasks and actors (Ray 2.60,
ray/_private/workers/default_worker.py; not in the driver: there, one line attaches the callback).

It gives every `transformers.Trainer` the process builds (TRL's trainers among them, under Ray Train
or in any actor) a `RaypulseCallback` (exporter/progress/trl.py). A process that never imports
transformers pays nothing: the patch is applied when `transformers.trainer` is imported (an import
hook that steps aside after that), or at once when it already was. Never raises into the worker: a
patch that cannot be applied leaves the trainer as it was.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

TRAINER_MODULE = "transformers.trainer"


def setup() -> None:
    """Ray's worker_process_setup_hook: patch transformers' Trainer now or when it is imported."""
    module = sys.modules.get(TRAINER_MODULE)
    if module is not None:
        _patch(module)
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def _patch(module: ModuleType) -> None:
    try:
        trainer = module.Trainer
        if getattr(trainer.__init__, "_raypulse", False):
            return
        from exporter.progress.trl import RaypulseCallback

        original = trainer.__init__

        @functools.wraps(original)
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if not any(isinstance(callback, RaypulseCallback) for callback in self.callback_handler.callbacks):
                self.add_callback(RaypulseCallback())

        init._raypulse = True  # type: ignore[attr-defined]
        trainer.__init__ = init
    except Exception:  # noqa: BLE001  (the job runs as it would without raypulse)
        return


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds transformers.trainer as the other finders do, and patches it once it has run."""

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != TRAINER_MODULE:
            return None
        sys.meta_path.remove(self)  # once: the module is found by the finders after this one
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
