"""raypulse's Grafana dashboards: panel data (boards/), one builder to Grafana JSON (builder.py,
grafana-foundation-sdk), the generated JSON (json/) and file provisioning (provisioning/,
provisioner.py). `python -m dashboards.build` regenerates; `dashboards.provision(dir)` writes a
provisioning tree for a local Grafana. Importing this package does not import the SDK.
"""

from __future__ import annotations

from dashboards.provisioner import Provisioned, provision

__all__ = ["Provisioned", "provision"]
