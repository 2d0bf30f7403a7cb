#!/usr/bin/env bash
# The GPU collector against this machine's real NVIDIA GPUs and driver (NVML), no simulation:
# every GPU seen, every family present or knowingly omitted as unsupported, values in sane
# ranges, the XID watcher listening, and the time one collection run takes per GPU.
#
#   scripts/gpu_check.sh            # from the repository root, after `make install`
#   PYTHON=/path/to/python scripts/gpu_check.sh -k cycle_time
#
# Exit status: 0 all checks passed, 1 a check failed, 2 there is no NVIDIA driver here.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

if ! command -v nvidia-smi >/dev/null 2>&1 && [ ! -e /dev/nvidiactl ]; then
    echo "gpu_check: no NVIDIA driver on this machine (no nvidia-smi, no /dev/nvidiactl);" \
         "this check needs a real GPU. On machines without one, the simulated GPUs are tested by" \
         "tests/test_gpu_*.py." >&2
    exit 2
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,uuid,driver_version,persistence_mode --format=csv || true
fi
RAYPULSE_GPU_CHECK=1 exec "$PYTHON" -m pytest -m gpu -p no:cacheprovider -s -v -rA tests/test_gpu_real.py "$@"
