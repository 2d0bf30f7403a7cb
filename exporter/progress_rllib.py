"""The RLlib callback's first import path, kept for user code written against it:
`from exporter.progress_rllib import RaypulseCallback`. The callback lives in exporter/progress/rllib.py
(`from exporter.progress.rllib import RaypulseCallback`)."""

from __future__ import annotations

from exporter.progress.rllib import RaypulseCallback

__all__ = ["RaypulseCallback"]
