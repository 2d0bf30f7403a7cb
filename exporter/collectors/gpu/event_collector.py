"""The `gpu_events` collector: publishes what the XID watcher has counted.

A collector of its own so that XIDs stay on /metrics while the `gpu` collector fails or is stuck
in a hung NVML call (exactly when they matter most). It only copies the watcher's counts, so it
runs on the event loop and never touches NVML.
"""

from __future__ import annotations

from exporter.collectors.gpu.families import GPU_LABELS
from exporter.framework.catalog import counter, gauge
from exporter.framework.collector import AsyncCollector, register
from exporter.framework.shared import UNKNOWN_OWNERS
from exporter.framework.snapshot import SampleSink

NAME = "gpu_events"
_AFTER_EVENT = "after the GPU reported such an event since the exporter started"

XID_ERRORS = counter("raypulse_gpu_xid_errors_total", "XID errors the driver reported, by XID code (79: fallen "
                     "off the bus, 48: double-bit ECC, 94/95: contained/uncontained ECC error, 119/120: GSP "
                     "errors).", collector=NAME, labels=(*GPU_LABELS, "xid"), only_when=_AFTER_EVENT)
XID_LAST = gauge("raypulse_gpu_xid_last_timestamp_seconds", "Unix time of the last XID error with this code.",
                 collector=NAME, labels=(*GPU_LABELS, "xid"), unit="seconds", only_when=_AFTER_EVENT)
EVENTS = counter("raypulse_gpu_events_total", "NVML events by type: xid, single_bit_ecc, double_bit_ecc, "
                 "gpu_unavailable, recovery_action.", collector=NAME, labels=(*GPU_LABELS, "type"),
                 only_when=_AFTER_EVENT)
WATCHER_UP = gauge("raypulse_gpu_event_watcher_up", "1 while the XID watcher thread is listening for NVML "
                   "events.", collector=NAME)
WATCHER_ERRORS = counter("raypulse_gpu_event_watcher_errors_total", "NVML errors of the XID watcher, by error.",
                         collector=NAME, labels=("error",), only_when="after the watcher hit an NVML error")


@register
class GpuEventsCollector(AsyncCollector):
    name = NAME
    description = ("XID errors and other NVML events (double-bit ECC, GPU unavailable, recovery action) counted "
                   "by the gpu collector's watcher thread; kept apart so they stay visible while GPU collection "
                   "fails.")
    default_interval = 5.0

    async def collect(self, out: SampleSink) -> None:
        read = self.shared.gpu_events.get()  # published by the gpu collector, which owns the watcher
        state = read() if read is not None else None
        out.add(WATCHER_UP, state is not None and state.up)
        if state is None:
            return
        owners = self.shared.gpu_owners.get() or UNKNOWN_OWNERS
        for (index, uuid, xid), (count, last) in state.xids.items():
            if owners.reports(uuid):
                out.add(XID_ERRORS, count, gpu=index, uuid=uuid, **owners.labels(uuid), xid=xid)
                out.add(XID_LAST, last, gpu=index, uuid=uuid, **owners.labels(uuid), xid=xid)
        for (index, uuid, kind), count in state.events.items():
            if owners.reports(uuid):
                out.add(EVENTS, count, gpu=index, uuid=uuid, **owners.labels(uuid), type=kind)
        for error, count in state.errors.items():
            out.add(WATCHER_ERRORS, count, error=error)
