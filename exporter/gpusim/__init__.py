"""Simulated NVIDIA GPUs for CI and demos: a stand-in for `pynvml` with injectable faults.

`exporter.gpusim.nvml.SimulatedNvml` is the stand-in (one module per NVML area under nvml/, as
exporter/collectors/gpu/ reads them), `exporter.gpusim.control` the control file that injects faults
at run time, `exporter.gpusim.cli` the `exporter gpu-fault` command that writes it. Turned on only
explicitly (`exporter serve --simulate-gpus N`), by exporter/plugins.py; see docs/gpu-simulation.md.
"""
