"""The container / Kubernetes pod the exporter measures, from its cgroup (families `raypulse_pod_*`)."""
