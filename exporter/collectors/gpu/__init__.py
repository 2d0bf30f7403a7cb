"""NVIDIA GPUs through NVML (nvidia-ml-py): the `gpu` collector and the `gpu_events` XID watcher.

One module per area declares its families and reads them (inventory, utilization, gpm, memory,
clocks, thermal, power, pcie, nvlink, ecc, processes, mig); `reader` holds the NVML error policy,
`collector` the run (initialization with backoff, enumeration by UUID, lost GPUs), `events` the
XID watcher thread and `event_collector` the collector that publishes what it saw.
"""
