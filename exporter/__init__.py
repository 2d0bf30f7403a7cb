"""raypulse exporter: Prometheus metrics for Ray training clusters (jobs, nodes, pods, GPUs).

Kept import-light: training code imports `exporter.progress` from here.
"""

__version__ = "0.1.0"
