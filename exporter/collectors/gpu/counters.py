"""NVML counters made into Prometheus counters: never decreasing, across wraps and resets.

Some NVML counters are 32-bit and wrap (PCIe replay and byte counters); all restart when the driver
reloads or the GPU is reset. An `Unwrapped` counter adds up the increments it sees: a smaller
reading of a counter narrower than 64 bits is one wrap, a smaller reading after a resync (NVML was
re-initialized, the GPU came back) or of a 64-bit counter is a restart from zero.
"""

from __future__ import annotations


class Unwrapped:
    """One counter. `total` starts at the first reading, so it equals the raw value until a wrap."""

    __slots__ = ("last", "resync", "total")

    def __init__(self) -> None:
        self.last: int | None = None
        self.total = 0
        self.resync = False

    def update(self, raw: int, bits: int) -> int:
        if self.last is None:
            self.total = raw
        elif raw >= self.last:
            self.total += raw - self.last
        elif bits < 64 and not self.resync:
            self.total += raw + (1 << bits) - self.last  # wrapped once since the last reading
        else:
            self.total += raw  # restarted from zero
        self.last = raw
        self.resync = False
        return self.total


class CounterSet:
    """The unwrapped counters of one GPU, by key."""

    def __init__(self) -> None:
        self._counters: dict[object, Unwrapped] = {}

    def update(self, key: object, raw: int, bits: int) -> int:
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = Unwrapped()
        return counter.update(raw, bits)

    def resync(self) -> None:
        """The source may have restarted its counters (driver reload, GPU reset): the next smaller
        reading is a restart, not a wrap."""
        for counter in self._counters.values():
            counter.resync = True
