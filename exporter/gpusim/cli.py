"""`exporter gpu-fault`: inject faults into simulated GPUs by editing their control file.

    exporter gpu-fault --control gpus.json --gpu 0 xid 79
    exporter gpu-fault --control gpus.json --gpu 1 --gpu 2 thermal-throttle
    exporter gpu-fault --control gpus.json hang nvmlDeviceGetPowerUsage
    exporter gpu-fault --control gpus.json --gpu 0 clear

The exporter picks the change up within a fraction of a second (it serves the same file given as
`--gpu-control`). Kept import-light: the `exporter` CLI imports this module at start-up.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from exporter.contract import wire

CONTROL_ENV = wire.ENV_GPU_CONTROL_FILE
_CLEARABLE = ("lost", "thermal-throttle", "power-brake", "row-remap-pending", "row-remap-failed", "nvlink-down",
              "recovery-action", "hang", "not-supported", "errors", "load", "mig", "processes", "init-error")


def _change(ctx: click.Context, describe: str, change: Callable[[Any], None], per_gpu: bool = True) -> None:
    from exporter.gpusim import control

    path: Path = ctx.obj["control"]
    gpus: tuple[int, ...] = ctx.obj["gpus"]
    if per_gpu and not gpus:
        raise click.UsageError("this fault is per GPU: give --gpu N (repeatable)")
    try:
        control.update(path, change)
    except control.ControlError as exc:
        click.echo(f"exporter gpu-fault: {exc}", err=True)
        sys.exit(2)
    where = ", ".join(f"gpu {g}" for g in gpus) if gpus else "all GPUs"
    click.echo(f"{path}: {where}: {describe}")


def _each_gpu(ctx: click.Context, change: Callable[[Any], None]) -> Callable[[Any], None]:
    from exporter.gpusim import control

    def apply(document: Any) -> None:
        for index in ctx.obj["gpus"]:
            change(control.gpu_entry(document, index))

    return apply


def _set_flag(name: str, attribute: str, help: str) -> click.Command:
    @click.pass_context
    def command(ctx: click.Context) -> None:
        _change(ctx, name, _each_gpu(ctx, lambda entry: setattr(entry, attribute, True)))

    return click.command(name, help=help)(command)


@click.group("gpu-fault")
@click.option("--control", "control_file", type=click.Path(path_type=Path), envvar=CONTROL_ENV, required=True,
              help=f"The simulated GPUs' control file (the exporter's --gpu-control) [env {CONTROL_ENV}].")
@click.option("--gpu", "gpus", type=click.IntRange(min=0), multiple=True, metavar="N",
              help="NVML index of the GPU to act on (repeatable).")
@click.pass_context
def gpu_fault(ctx: click.Context, control_file: Path, gpus: tuple[int, ...]) -> None:
    """Inject faults into simulated GPUs (exporter serve --simulate-gpus N --gpu-control FILE).

    See docs/gpu-simulation.md for what each fault does to the metrics."""
    ctx.obj = {"control": control_file, "gpus": gpus}


@gpu_fault.command()
@click.argument("code", type=click.IntRange(min=1))
@click.pass_context
def xid(ctx: click.Context, code: int) -> None:
    """An XID error event; 79 also loses the GPU, 48 and 94 also count a double-bit ECC error (94
    also leaves a row remap pending and asks for a GPU reset)."""
    from exporter.gpusim import control

    _change(ctx, f"xid {code}", _each_gpu(ctx, lambda entry: control.inject_xid(entry, code)))


def _ecc(kind: str, attribute: str, event: str) -> click.Command:
    @click.argument("count", type=click.IntRange(min=1), default=1)
    @click.pass_context
    def command(ctx: click.Context, count: int) -> None:
        from exporter.gpusim import control

        def add(entry: Any) -> None:
            setattr(entry, attribute, getattr(entry, attribute) + count)
            control.append_event(entry, event)

        _change(ctx, f"{count} {kind} ECC error(s)", _each_gpu(ctx, add))

    return click.command(f"ecc-{kind}", help=f"COUNT more {kind.upper()} ECC errors (default 1), with an event.")(
        command)


gpu_fault.add_command(_ecc("dbe", "ecc_dbe", "double_bit_ecc"))
gpu_fault.add_command(_ecc("sbe", "ecc_sbe", "single_bit_ecc"))
gpu_fault.add_command(_set_flag("lost", "lost", "The GPU falls off the bus: every call on it answers GPU_IS_LOST."))
gpu_fault.add_command(_set_flag("thermal-throttle", "thermal_throttle",
                                "The GPU runs hot: above its slowdown temperature, thermal clock events on."))
gpu_fault.add_command(_set_flag("power-brake", "power_brake",
                                "External power brake: clocks and power drop, hw_power_brake_slowdown on."))
gpu_fault.add_command(_set_flag("row-remap-pending", "row_remap_pending", "A row remap waits for a GPU reset."))
gpu_fault.add_command(_set_flag("row-remap-failed", "row_remap_failed", "A row could not be remapped."))


@gpu_fault.command("nvlink-down")
@click.argument("links", type=click.IntRange(min=0), nargs=-1, required=True)
@click.pass_context
def nvlink_down(ctx: click.Context, links: tuple[int, ...]) -> None:
    """These NVLink links go down."""
    _change(ctx, f"nvlink links {', '.join(map(str, links))} down",
            _each_gpu(ctx, lambda entry: entry.nvlink_down.extend(x for x in links if x not in entry.nvlink_down)))


@gpu_fault.command("recovery-action")
@click.argument("action", type=click.IntRange(0, 7))
@click.pass_context
def recovery_action(ctx: click.Context, action: int) -> None:
    """The driver asks for a recovery action (1 GPU reset, 2 node reboot, ...; 0 none)."""
    from exporter.gpusim import control

    def apply(entry: Any) -> None:
        entry.recovery_action = action
        control.append_event(entry, "recovery_action", action)

    _change(ctx, f"recovery action {action}", _each_gpu(ctx, apply))


def _calls(name: str, attribute: str, help: str) -> click.Command:
    @click.argument("calls", nargs=-1, required=True)
    @click.pass_context
    def command(ctx: click.Context, calls: tuple[str, ...]) -> None:
        def add(entry: Any) -> None:
            getattr(entry, attribute).extend(c for c in calls if c not in getattr(entry, attribute))

        change = _each_gpu(ctx, add) if ctx.obj["gpus"] else add
        _change(ctx, f"{name} {' '.join(calls)}", change, per_gpu=bool(ctx.obj["gpus"]))

    return click.command(name, help=help)(command)


gpu_fault.add_command(_calls("hang", "hang", "These NVML calls (pynvml names) block until cleared; without "
                             "--gpu, on every GPU and for system calls too."))
gpu_fault.add_command(_calls("not-supported", "not_supported", "These NVML calls or fields (NVML_FI_* names) "
                             "answer NOT_SUPPORTED; without --gpu, on every GPU."))


@gpu_fault.command()
@click.argument("call")
@click.argument("error")
@click.pass_context
def error(ctx: click.Context, call: str, error: str) -> None:
    """This NVML call fails with NVML_ERROR_<ERROR> (e.g. UNKNOWN); without --gpu, on every GPU."""

    def add(entry: Any) -> None:
        entry.errors = {**entry.errors, call: error}

    change = _each_gpu(ctx, add) if ctx.obj["gpus"] else add
    _change(ctx, f"{call} fails with {error.upper()}", change, per_gpu=bool(ctx.obj["gpus"]))


@gpu_fault.command("init-error")
@click.argument("error")
@click.pass_context
def init_error(ctx: click.Context, error: str) -> None:
    """nvmlInit fails with NVML_ERROR_<ERROR> (e.g. DRIVER_NOT_LOADED) until cleared."""
    _change(ctx, f"nvmlInit fails with {error.upper()}", lambda document: setattr(document, "init_error", error),
            per_gpu=False)


@gpu_fault.command()
@click.argument("ratio", type=click.FloatRange(0, 1))
@click.pass_context
def load(ctx: click.Context, ratio: float) -> None:
    """Target utilization (0..1); without --gpu, of every GPU without its own."""
    if ctx.obj["gpus"]:
        _change(ctx, f"load {ratio:g}", _each_gpu(ctx, lambda entry: setattr(entry, "load", ratio)))
    else:
        _change(ctx, f"load {ratio:g}", lambda document: setattr(document, "load", ratio), per_gpu=False)


@gpu_fault.command()
@click.argument("profiles", nargs=-1)
@click.pass_context
def mig(ctx: click.Context, profiles: tuple[str, ...]) -> None:
    """Turn MIG on with these instance profiles (e.g. 3g.40gb 3g.40gb); none turns it off."""
    _change(ctx, f"MIG {' '.join(profiles) or 'off'}", _each_gpu(ctx, lambda entry: setattr(entry, "mig",
                                                                                           list(profiles))))


@gpu_fault.command()
@click.argument("pid", type=click.IntRange(min=1))
@click.argument("memory_mib", type=click.IntRange(min=0))
@click.option("--sm", type=click.FloatRange(0, 1), help="The process's share of the SMs.")
@click.option("--name", default="python", show_default=True, help="Executable name NVML reports.")
@click.pass_context
def process(ctx: click.Context, pid: int, memory_mib: int, sm: float | None, name: str) -> None:
    """A process using the GPU (a real pid, e.g. a Ray worker's, for attribution)."""
    from exporter.gpusim import control

    def add(entry: Any) -> None:
        entry.processes = [p for p in entry.processes if p.pid != pid]
        entry.processes.append(control.Process(pid=pid, memory_bytes=memory_mib << 20, sm_utilization=sm, name=name))

    _change(ctx, f"process {pid} using {memory_mib} MiB", _each_gpu(ctx, add))


@gpu_fault.command()
@click.argument("fault", type=click.Choice(_CLEARABLE), required=False)
@click.pass_context
def clear(ctx: click.Context, fault: str | None) -> None:
    """Clear one fault, or all faults (ECC history and events are kept), of --gpu or of every GPU."""
    from exporter.gpusim import control

    def reset(entry: Any) -> None:
        fresh = control.GpuControl(ecc_sbe=entry.ecc_sbe, ecc_dbe=entry.ecc_dbe, events=entry.events)
        for name in _CLEARABLE if fault is None else (fault,):
            attribute = name.replace("-", "_")
            if hasattr(fresh, attribute):
                setattr(entry, attribute, getattr(fresh, attribute))

    def apply(document: Any) -> None:
        indices = ctx.obj["gpus"] or tuple(document.gpus)
        for index in indices:
            reset(control.gpu_entry(document, index))
        if not ctx.obj["gpus"]:
            top = control.Control()
            for name in ("hang", "not_supported", "errors", "load", "init_error"):
                if fault is None or fault.replace("-", "_") == name:
                    setattr(document, name, getattr(top, name))

    _change(ctx, f"cleared {fault or 'all faults'}", apply, per_gpu=False)


@gpu_fault.command()
@click.pass_context
def show(ctx: click.Context) -> None:
    """Print the control file as the simulator reads it."""
    import json

    from exporter.gpusim import control

    try:
        document = control.read(ctx.obj["control"])
    except control.ControlError as exc:
        click.echo(f"exporter gpu-fault: {exc}", err=True)
        sys.exit(2)
    click.echo(json.dumps(document.model_dump(mode="json", exclude_defaults=True), indent=2))
