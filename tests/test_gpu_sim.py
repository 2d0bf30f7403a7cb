"""The simulated GPUs look like pynvml to the code that calls them, and do what the control file says."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import threading
import time

import pynvml
import pytest

from exporter.gpusim import control
from exporter.gpusim.nvml import SimulatedNvml
from tests.conftest import REPO, exporter_command, wait_until


def simulated_functions() -> list[str]:
    return sorted(name for name, member in inspect.getmembers(SimulatedNvml) if name.startswith("nvml")
                  and inspect.isfunction(member))


@pytest.fixture
def nvml(tmp_path):
    simulated = SimulatedNvml(2, control_file=tmp_path / "gpus.json")
    simulated.nvmlInit()
    return simulated


def change(tmp_path, apply) -> None:
    control.update(tmp_path / "gpus.json", apply)
    time.sleep(0.1)  # the simulator re-reads the file at most every 50 ms


@pytest.mark.parametrize("name", simulated_functions())
def test_every_simulated_function_has_the_pynvml_name_and_parameters(name):
    real = inspect.signature(getattr(pynvml, name))
    fake = inspect.signature(getattr(SimulatedNvml, name))
    fake_parameters = list(fake.parameters.values())[1:]  # self
    assert [(p.name, p.default) for p in fake_parameters] == [(p.name, p.default) for p in real.parameters.values()]


def test_constants_errors_and_structs_are_pynvml_s_own(nvml):
    assert nvml.NVML_FI_DEV_MEMORY_TEMP == pynvml.NVML_FI_DEV_MEMORY_TEMP
    assert nvml.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert nvml.c_nvmlGpmMetricsGet_t is pynvml.c_nvmlGpmMetricsGet_t


def test_an_nvml_function_that_is_not_simulated_never_reaches_a_driver(nvml):
    with pytest.raises(AttributeError, match="not simulated"):
        nvml.nvmlDeviceGetBoardId  # noqa: B018


def test_calls_before_init_raise_uninitialized(tmp_path):
    simulated = SimulatedNvml(1)
    with pytest.raises(pynvml.NVMLError_Uninitialized) as error:
        simulated.nvmlDeviceGetCount()
    assert error.value.value == pynvml.NVML_ERROR_UNINITIALIZED


def test_return_values_have_pynvml_s_shapes(nvml):
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    assert isinstance(nvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2), pynvml.c_nvmlMemory_v2_t)
    assert isinstance(nvml.nvmlDeviceGetMemoryInfo(handle), pynvml.c_nvmlMemory_t)
    assert isinstance(nvml.nvmlDeviceGetUtilizationRates(handle), pynvml.c_nvmlUtilization_t)
    assert isinstance(nvml.nvmlDeviceGetPciInfo_v3(handle), pynvml.nvmlPciInfo_t)
    assert isinstance(nvml.nvmlDeviceGetUUID(handle), str)
    assert nvml.nvmlDeviceGetUUID(handle).startswith("GPU-")
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    assert isinstance(nvml.nvmlDeviceGetRemappedRows(handle), tuple)
    values = nvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP,
                                                    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF)])
    assert all(isinstance(v, pynvml.c_nvmlFieldValue_t) and v.nvmlReturn == pynvml.NVML_SUCCESS for v in values)
    assert 20 < values[0].value.uiVal < 110


def test_memory_v2_used_includes_reserved_as_nvml_documents(nvml):
    memory = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlMemory_v2)
    assert memory.used >= memory.reserved > 0
    assert memory.used + memory.free == memory.total


def test_unsupported_calls_answer_not_supported_per_model(tmp_path):
    v100 = SimulatedNvml(1, model="V100")
    v100.nvmlInit()
    handle = v100.nvmlDeviceGetHandleByIndex(0)
    assert v100.nvmlDeviceGetRetiredPagesPendingStatus(handle) == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        v100.nvmlDeviceGetRemappedRows(handle)
    (value,) = v100.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES])
    assert value.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_load_drives_power_temperature_clocks_and_energy(tmp_path):
    now = [1000.0]
    simulated = SimulatedNvml(2, control_file=tmp_path / "gpus.json", clock=lambda: now[0])
    simulated.nvmlInit()
    control.update(tmp_path / "gpus.json", lambda c: (setattr(control.gpu_entry(c, 0), "load", 0.0),
                                                       setattr(control.gpu_entry(c, 1), "load", 1.0)))
    time.sleep(0.1)
    idle, busy = (simulated.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    energy = [simulated.nvmlDeviceGetTotalEnergyConsumption(h) for h in (idle, busy)]
    now[0] += 120  # two minutes at that load
    assert simulated.nvmlDeviceGetPowerUsage(idle) < 100_000 < 600_000 < simulated.nvmlDeviceGetPowerUsage(busy)
    assert simulated.nvmlDeviceGetTemperatureV(idle, 0) + 20 < simulated.nvmlDeviceGetTemperatureV(busy, 0) < 87
    assert simulated.nvmlDeviceGetClockInfo(idle, pynvml.NVML_CLOCK_SM) < simulated.nvmlDeviceGetClockInfo(
        busy, pynvml.NVML_CLOCK_SM) == 1980
    assert simulated.nvmlDeviceGetUtilizationRates(busy).gpu >= 95
    assert simulated.nvmlDeviceGetCurrentClocksEventReasons(idle) & pynvml.nvmlClocksEventReasonGpuIdle
    gained = [simulated.nvmlDeviceGetTotalEnergyConsumption(h) - e for h, e in zip((idle, busy), energy, strict=True)]
    assert 0 < gained[0] < gained[1] <= 700 * 120 * 1000  # mJ: at most 700 W for 120 s


def test_a_lost_gpu_raises_gpu_is_lost_and_the_others_answer(nvml, tmp_path):
    change(tmp_path, lambda c: control.inject_xid(control.gpu_entry(c, 0), 79))
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(1)) > 0
    change(tmp_path, lambda c: setattr(control.gpu_entry(c, 0), "lost", False))
    assert nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(0)) > 0


def test_events_reach_registered_event_sets_once_and_in_order(nvml, tmp_path):
    event_set = nvml.nvmlEventSetCreate()
    for index in (0, 1):
        nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(index), pynvml.nvmlEventTypeXidCriticalError
                                      | pynvml.nvmlEventTypeDoubleBitEccError, event_set)
    change(tmp_path, lambda c: (control.inject_xid(control.gpu_entry(c, 1), 48),
                                control.inject_xid(control.gpu_entry(c, 1), 13)))
    received = [nvml.nvmlEventSetWait_v2(event_set, 1000) for _ in range(3)]
    assert [(e.eventType, e.eventData) for e in received] == [
        (pynvml.nvmlEventTypeXidCriticalError, 48), (pynvml.nvmlEventTypeDoubleBitEccError, 0),
        (pynvml.nvmlEventTypeXidCriticalError, 13)]
    assert {nvml.nvmlDeviceGetUUID(e.device) for e in received} == {nvml.gpus[1].uuid}
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(event_set, 100)


def test_events_written_before_anyone_listens_wait_for_a_listener(tmp_path):
    control.update(tmp_path / "gpus.json", lambda c: control.inject_xid(control.gpu_entry(c, 0), 94))
    simulated = SimulatedNvml(1, control_file=tmp_path / "gpus.json")
    simulated.nvmlInit()
    event_set = simulated.nvmlEventSetCreate()
    simulated.nvmlDeviceRegisterEvents(simulated.nvmlDeviceGetHandleByIndex(0),
                                       pynvml.nvmlEventTypeXidCriticalError, event_set)
    assert simulated.nvmlEventSetWait_v2(event_set, 1000).eventData == 94


def test_a_hung_call_blocks_until_the_fault_is_cleared(nvml, tmp_path):
    change(tmp_path, lambda c: control.gpu_entry(c, 0).hang.append("nvmlDeviceGetPowerUsage"))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    result: list[int] = []
    caller = threading.Thread(target=lambda: result.append(nvml.nvmlDeviceGetPowerUsage(handle)), daemon=True)
    caller.start()
    caller.join(0.5)
    assert caller.is_alive()
    assert not result
    assert nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(1)) > 0  # only GPU 0 hangs
    change(tmp_path, lambda c: control.gpu_entry(c, 0).hang.clear())
    caller.join(2)
    assert result
    assert result[0] > 0


def test_chosen_calls_and_fields_answer_not_supported_or_fail(nvml, tmp_path):
    change(tmp_path, lambda c: (control.gpu_entry(c, 0).not_supported.extend(
        ["nvmlDeviceGetPowerUsage", "NVML_FI_DEV_MEMORY_TEMP"]),
        setattr(c, "errors", {"nvmlDeviceGetEnforcedPowerLimit": "UNKNOWN"})))
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(handle)
    (value,) = nvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert value.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(pynvml.NVMLError_Unknown):
        nvml.nvmlDeviceGetEnforcedPowerLimit(nvml.nvmlDeviceGetHandleByIndex(1))


def test_init_error_fails_nvml_init(tmp_path):
    control.update(tmp_path / "gpus.json", lambda c: setattr(c, "init_error", "driver_not_loaded"))
    simulated = SimulatedNvml(1, control_file=tmp_path / "gpus.json")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        simulated.nvmlInit()


@pytest.mark.parametrize(("document", "message"), [
    ({"gpus": {"0": {"load": 1.5}}}, "gpus.0.load: Input should be less than or equal to 1"),
    ({"gpus": {"0": {"hang": ["nvmlGetPower"]}}}, "gpus.0.hang: unknown NVML call or field 'nvmlGetPower'"),
    ({"init_error": "BROKEN"}, "init_error: unknown NVML error 'BROKEN'"),
    ({"gpus": {"0": {"mig": ["3g"]}}}, "gpus.0.mig: MIG profile '3g' is not of the form"),
    ({"gpus": {"0": {"errors": {"nvmlDeviceGetPowerUsage": "OOPS"}}}}, "unknown NVML error 'OOPS'"),
    ({"gpus": {"0": {"lots": True}}}, "gpus.0.lots: unknown field (check the spelling)"),
    ({"gpus": {"0": {"events": [{"seq": 2, "type": "xid"}, {"seq": 1, "type": "xid"}]}}}, "unique and increasing"),
])
def test_control_file_errors_name_the_field(tmp_path, document, message):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(document))
    with pytest.raises(control.ControlError, match=str(path)) as error:
        control.read(path)
    assert message in str(error.value)


def test_an_invalid_control_file_keeps_the_last_good_one(tmp_path):
    path = tmp_path / "gpus.json"
    control.update(path, lambda c: setattr(control.gpu_entry(c, 0), "lost", True))
    reader = control.ControlReader(path, check_seconds=0)
    assert reader.current().gpu(0).lost
    path.write_text("{not json")
    assert reader.current().gpu(0).lost
    assert "not valid JSON" in reader.error


@pytest.mark.parametrize(("content", "message"), [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"gpus": {"0": {"lost": true}}, "x": "\xff\xfe"}', "not UTF-8 text"),
    (b"{" + b'"a": {' * 5000 + b"}" * 5001, "nested too deeply"),
])
def test_hostile_control_files_are_errors_the_reader_and_the_cli_survive(tmp_path, content, message):
    path = tmp_path / "gpus.json"
    control.update(path, lambda c: setattr(control.gpu_entry(c, 0), "lost", True))
    reader = control.ControlReader(path, check_seconds=0)
    assert reader.current().gpu(0).lost
    path.write_bytes(content)
    assert reader.current().gpu(0).lost  # the last good content, no exception into the XID watcher's thread
    assert message in reader.error
    refused = subprocess.run(exporter_command("gpu-fault", "--control", str(path), "--gpu", "0", "xid", "79"),
                             capture_output=True, text=True, timeout=60, cwd=REPO)
    assert refused.returncode == 2
    assert message in refused.stderr
    assert "Traceback" not in refused.stderr


def test_gpu_fault_cli_writes_what_the_simulator_reads(tmp_path):
    path = tmp_path / "gpus.json"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(exporter_command("gpu-fault", "--control", str(path), *args), capture_output=True,
                              text=True, timeout=60, cwd=REPO)

    assert cli("--gpu", "0", "xid", "79").returncode == 0
    assert cli("--gpu", "1", "--gpu", "2", "thermal-throttle").returncode == 0
    assert cli("--gpu", "3", "ecc-dbe", "2").returncode == 0
    assert cli("--gpu", "3", "nvlink-down", "4", "5").returncode == 0
    assert cli("hang", "nvmlDeviceGetPowerUsage").returncode == 0
    document = control.read(path)
    assert document.gpu(0).lost
    assert [(e.type, e.data) for e in document.gpu(0).events] == [("xid", 79)]
    assert document.gpu(1).thermal_throttle
    assert document.gpu(2).thermal_throttle
    assert document.gpu(3).ecc_dbe == 2
    assert document.gpu(3).nvlink_down == [4, 5]
    assert document.hang == ["nvmlDeviceGetPowerUsage"]

    refused = cli("xid", "79")
    assert refused.returncode == 2
    assert "give --gpu N" in refused.stderr
    refused = cli("--gpu", "0", "hang", "nvmlNoSuchCall")
    assert refused.returncode == 2
    assert "unknown NVML call or field 'nvmlNoSuchCall'" in refused.stderr

    assert cli("clear").returncode == 0
    cleared = control.read(path)
    assert not cleared.gpu(0).lost
    assert not cleared.hang
    assert cleared.gpu(3).ecc_dbe == 2


def test_a_fifo_as_control_file_is_refused_at_once(tmp_path):
    path = tmp_path / "n-gpus.json"
    os.mkfifo(path)  # nobody writes: a blocking open would wait for a writer forever
    done = threading.Event()
    outcome: list[BaseException | control.Control] = []

    def read() -> None:
        try:
            outcome.append(control.read(path))
        except control.ControlError as exc:
            outcome.append(exc)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5), "reading a FIFO hung"
    assert isinstance(outcome[0], control.ControlError)
    assert "not a regular file" in str(outcome[0])


def test_the_exporter_starts_with_a_fifo_as_control_file(tmp_path, start_exporter):
    path = tmp_path / "n-gpus.json"
    os.mkfifo(path)
    exporter = start_exporter("--simulate-gpus", "1", "--gpu-control", str(path))  # waits for /readyz
    wait_until(lambda: "raypulse_gpu_info{" in exporter.metrics_text(), 30, "the simulated GPU's series")
    wait_until(lambda: "not a regular file" in exporter.log.read_text(), 10, "the refusal in the log")


def test_a_symlink_or_another_user_s_file_is_not_a_control_file(tmp_path):
    real = tmp_path / "real.json"
    control.update(real, lambda c: setattr(control.gpu_entry(c, 0), "lost", True))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(control.ControlError, match="a symbolic link"):
        control.read(link)
    other = 65534 if os.geteuid() != 65534 else 65533
    if os.geteuid() == 0:  # only root can give a file away; as anyone else, another user's file is planted
        os.chown(real, other, -1)
        with pytest.raises(control.ControlError, match=f"owned by uid {other}"):
            control.read(real)
