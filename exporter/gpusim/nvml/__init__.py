"""A stand-in for the `pynvml` module (nvidia-ml-py) backed by simulated GPUs.

`SimulatedNvml(count, ...)` has the pynvml functions the GPU collector uses, with the same names,
parameters and return shapes (the same ctypes structs, filled in), and raises pynvml's own
`NVMLError` subclasses with NVML's codes. Every other attribute (constants, error classes, structs)
is pynvml's own, so code written against pynvml runs unchanged; an NVML function that is not
simulated raises AttributeError rather than reaching a real driver.

Faults come from the control file (`exporter.gpusim.control`), re-read when it changes: a lost GPU
raises GPU_IS_LOST on every call on its handle, a hung call blocks until the fault is removed, a
call or field marked not supported answers NOT_SUPPORTED, XIDs and ECC events are delivered to
event sets, and the state faults show in the values.

One module per NVML area, as exporter/collectors/gpu/ reads them, composed here: base.py (the GPUs,
the control file and what it does to every call), inventory.py (system, handles, identity, modes),
utilization.py, memory.py (memory, ECC, row remapping), clocks.py (clocks, thermal, power), pcie.py,
nvlink.py, fields.py (nvmlDeviceGetFieldValues), processes.py, mig.py, gpm.py, events.py (XIDs and
the other events).
"""

from __future__ import annotations

from exporter.gpusim.nvml.clocks import Clocks
from exporter.gpusim.nvml.events import Events
from exporter.gpusim.nvml.fields import Fields
from exporter.gpusim.nvml.gpm import Gpm
from exporter.gpusim.nvml.inventory import Inventory
from exporter.gpusim.nvml.memory import Memory
from exporter.gpusim.nvml.mig import Mig
from exporter.gpusim.nvml.nvlink import NvLink
from exporter.gpusim.nvml.pcie import Pcie
from exporter.gpusim.nvml.processes import Processes
from exporter.gpusim.nvml.utilization import Utilization

__all__ = ["SimulatedNvml"]


class SimulatedNvml(Inventory, Utilization, Memory, Clocks, Pcie, NvLink, Fields, Processes, Mig, Gpm, Events):
    """pynvml over `count` simulated GPUs of one model; see the module docstring."""

    SIMULATED = True  # how the collector knows to label its series simulated="true"
