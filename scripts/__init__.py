"""Harness, not product: the demo, the drills, and the real Prometheus/Alertmanager stack and webhook
receiver they and the tests start. Run as modules from the repository root (`python -m scripts.demo`);
nothing under exporter/, launcher/, alerts/ or dashboards/ imports them."""
