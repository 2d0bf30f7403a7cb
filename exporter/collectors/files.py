"""Small readers for the text files of procfs, sysfs and cgroupfs.

They return None (never a made-up 0) when a file is absent, so a collector omits the series.
"""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # absent, or EINVAL from a sysfs attribute the driver does not implement (a virtual NIC's speed)
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def read_key_values(path: Path) -> dict[str, int] | None:
    """`Key value [unit]` or `Key: value [kB]` lines (meminfo, vmstat, cgroup *.stat) into ints.

    A `kB` unit is converted to bytes.
    """
    text = read_text(path)
    if text is None:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) < 2:
            continue
        try:
            value = int(parts[1])
        except ValueError:
            continue
        if len(parts) > 2 and parts[2] == "kB":
            value *= 1024
        values[parts[0]] = value
    return values


def read_pressure(path: Path) -> dict[str, float] | None:
    """A PSI file (`some avg10=… total=<µs>` / `full …`) into {"some": seconds, "full": seconds}."""
    text = read_text(path)
    if text is None:
        return None
    totals: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for field in rest.split():
            key, _, value = field.partition("=")
            if key == "total":
                totals[kind] = int(value) / 1e6
    return totals


def read_table_rows(path: Path) -> dict[str, dict[str, int]] | None:
    """The paired header/value lines of /proc/net/snmp and /proc/net/netstat: {"Tcp": {"InSegs": n}}."""
    text = read_text(path)
    if text is None:
        return None
    tables: dict[str, dict[str, int]] = {}
    lines = text.splitlines()
    for header, values in zip(lines[::2], lines[1::2], strict=False):
        name, _, keys = header.partition(":")
        value_name, _, numbers = values.partition(":")
        if name != value_name:
            continue
        try:
            tables[name] = dict(zip(keys.split(), (int(v) for v in numbers.split()), strict=True))
        except ValueError:
            continue
    return tables
