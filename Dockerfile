# syntax=docker/dockerfile:1
# The raypulse exporter image: the `[exporter]` extra only (no Ray, no launcher dependencies).
#
#   docker build -t ghcr.io/raypulse/raypulse-exporter:0.1.0 .
#   docker run --rm --read-only --tmpfs /tmp -p 9477:9477 ghcr.io/raypulse/raypulse-exporter:0.1.0
#   (buildah/podman build: add --format docker, the OCI format drops HEALTHCHECK)
#
# Published as ghcr.io/raypulse/raypulse-exporter:<version> (the version of exporter/__init__.py);
# `launcher exporters manifests` uses that name by default. Build on another base with
# `--build-arg PYTHON_IMAGE=...` (any Debian-like image with python3 >= 3.11 as `python`).
#
# Privileges. The image runs as uid 1000, gid 100 (Ray's own user in rayproject/ray), with nothing
# written outside /tmp, so it runs with a read-only root file system. As that user it serves the
# node collectors, NVML (the GPU device files the NVIDIA runtime mounts are world-readable) and
# everything it reads about processes of its own uid: in a KubeRay pod with shareProcessNamespace,
# Ray's processes. What needs more, and only in the DaemonSet that watches a whole node:
# - hostPID: the host's process table, to see every pod's Ray processes and the GPU processes NVML
#   reports by host PID;
# - root with the SYS_PTRACE and DAC_READ_SEARCH capabilities (and no others): reading
#   /proc/<pid>/environ, io and fd of other users' processes (Ray process -> job attribution) and
#   statfs of mount points under directories only root may search. `launcher exporters manifests
#   --unprivileged` runs the DaemonSet as this image's user instead, without them.
# The host's /proc, /sys and / are mounted read-only and given as --procfs, --sysfs and --rootfs.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY exporter/ exporter/
COPY launcher/ launcher/
COPY alerts/ alerts/
COPY dashboards/ dashboards/
# Wheels of raypulse and of the exporter's dependencies only; the final stage installs them offline.
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels '.[exporter]'

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="raypulse-exporter" \
      org.opencontainers.image.description="Prometheus exporter for Ray training nodes: jobs, node/pod and GPU metrics" \
      org.opencontainers.image.source="https://github.com/raypulse/raypulse" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links /wheels 'raypulse[exporter]'
RUN useradd --uid 1000 --gid 100 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin raypulse
USER 1000:100
WORKDIR /tmp
EXPOSE 9477
# Kubernetes ignores HEALTHCHECK (the manifests' probes ask /healthz and /readyz); docker and podman
# use it. The port and path come from exporter/contract/wire.py; the default --listen serves on them.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; from exporter.contract import wire; urllib.request.urlopen(f'http://127.0.0.1:{wire.EXPORTER_PORT}{wire.HEALTH_PATH}', timeout=4)"]
ENTRYPOINT ["exporter"]
CMD ["serve"]
