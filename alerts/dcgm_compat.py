"""Coming from dcgm-exporter: one table (FIELDS) mapping each DCGM field a dcgm-exporter user meets to
raypulse's series, and the two files generated from it (`python -m alerts.build` writes both):

- docs/migrating-from-dcgm-exporter.md: per field, the raypulse family and the labels that select it,
  the PromQL that gives the same value in dcgm-exporter's unit, or why there is none;
- alerts/rules/dcgm-compat.yml: OPT-IN recording rules that record dcgm-exporter's metric names, with
  its labels (`gpu`, `UUID`, `device`, `modelName`, `pci_bus_id`, `Hostname`, `DCGM_FI_DRIVER_VERSION`)
  and its units, from raypulse series, so dashboards and alerts written for dcgm-exporter keep working.
  Prometheus loads it only when told to: the default rule files are alerts/rules/*.yaml, this one
  ends in `.yml` on purpose.

    python -m alerts.dcgm_compat            # write those two files only
    python -m alerts.dcgm_compat --check    # exit 1 if the committed ones differ

Facts about dcgm-exporter (fields, units, labels) are from its etc/default-counters.csv and
internal/pkg/collector, and from DCGM's dcgmlib/src/DcgmCacheManager.cpp.
tests/test_dcgm_compat.py holds every family named here against the exporter's catalog.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from textwrap import indent

import yaml

from alerts.prometheus import RULES_DIR

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "migrating-from-dcgm-exporter.md"
RULES = RULES_DIR / "dcgm-compat.yml"

# The labels that identify one GPU of one scrape target: what the identity join matches on.
GPU_KEY = "job, instance, gpu, uuid"
# dcgm-exporter before 4.8.3 writes `Hostname`, later ones `hostname` (its PR #655): change it here.
HOSTNAME_LABEL = "Hostname"
# dcgm-exporter's identity labels, copied onto every compat series from the helper below.
DCGM_LABELS = ("UUID", "device", "modelName", "pci_bus_id", HOSTNAME_LABEL, "DCGM_FI_DRIVER_VERSION")
# The GPU's UUID: dcgm-exporter's label (`uuid` with its --use-old-namespace) and raypulse's.
DCGM_UUID, RAYPULSE_UUID = "UUID", "uuid"
IDENTITY = "gpu:raypulse_gpu_info:dcgm_labels"  # recorded first; every other rule joins it
# A rate over raypulse counters where dcgm-exporter reports a rate: four samples at the default 15 s scrape.
RATE_WINDOW = "1m"

SETS = {  # key -> the doc's section heading
    "default": "Exported by default (`etc/default-counters.csv`)",
    "optional": "Commented out in `default-counters.csv` (users turn them on)",
    "other": "Not in `default-counters.csv`",
    "older": "In older dcgm-exporter releases' `default-counters.csv`",
    "exporter": "dcgm-exporter's own families (`DCGM_EXP_*`)",
}


@dataclass(frozen=True)
class Field:
    """One DCGM field as dcgm-exporter exports it, and where raypulse has the same quantity.

    `family{select} scale` is the value in dcgm-exporter's unit; `expr` replaces it when it takes more
    than that. No family: there is no equivalent, and `note` says why. `record` is False where the
    PromQL answers the same question but cannot give dcgm-exporter's exact series."""

    name: str  # the DCGM field name, which dcgm-exporter uses as the metric name
    type: str  # as dcgm-exporter declares it: gauge, counter, label
    unit: str  # dcgm-exporter's unit
    set: str  # a key of SETS
    family: str | None = None
    select: Mapping[str, str] = field(default_factory=dict)
    scale: str = ""  # PromQL arithmetic to dcgm-exporter's unit, e.g. "/ 1e6"
    expr: str | None = None
    shown: str | None = None  # what the doc shows instead of a long `expr`
    record: bool = True
    note: str = ""

    @property
    def selector(self) -> str:
        matchers = ", ".join(f'{key}="{value}"' for key, value in self.select.items())
        return f"{self.family}{{{matchers}}}" if matchers else str(self.family)

    @property
    def promql(self) -> str | None:
        """The per-GPU value in dcgm-exporter's unit, with raypulse's labels (before the identity join)."""
        if self.expr is not None:
            return self.expr
        if self.family is None:
            return None
        # dcgm-exporter has one series per GPU: drop the label that picked the variant (clock="sm", ...).
        value = f"sum without ({', '.join(self.select)}) ({self.selector})" if self.select else self.family
        return f"{value} {self.scale}".strip()

    @property
    def doc_promql(self) -> str | None:
        if self.shown is not None:
            return self.shown
        if self.expr is not None:
            return " ".join(self.expr.split())
        return None if self.family is None else f"{self.selector} {self.scale}".strip()


def _xid_code(series: str) -> str:
    """The `xid` label of each series as its value. PromQL has no label-to-number function, so the
    code is read digit by digit (NVIDIA's XIDs have at most three digits)."""
    def digit(pattern: str, weight: int) -> str:
        terms = [f'{series}{{xid=~"{pattern.format(d)}"}} * 0 + {d * weight}' for d in range(1, 10)]
        return "(\n    " + "\n  or ".join([*terms, f"{series} * 0"]) + "\n)"
    return "\n+\n".join([digit(".*{}", 1), digit(".*{}.", 10), digit(".*{}..", 100)])


def _last_xid() -> str:
    """The code of the GPU's newest XID, labelled err_code; 0 (err_code="0") for a GPU without XIDs,
    as dcgm-exporter reports it."""
    last = "raypulse_gpu_xid_last_timestamp_seconds"
    newest = f"{last}\n  == on ({GPU_KEY}) group_left ()\nmax by ({GPU_KEY}) ({last})"
    code = f"(\n{indent(_xid_code(last), '  ')}\n)\nand (\n{indent(newest, '  ')}\n)"
    return (f"max without (xid) (\n  label_replace(\n{indent(code, '    ')},\n"
            f'    "err_code", "$1", "xid", "(.*)"\n  )\n)\n'
            f'or on ({GPU_KEY})\nlabel_replace(raypulse_gpu_up * 0, "err_code", "0", "", "")')


_GPM = "NVML GPM: Hopper and newer only (no SYS_ADMIN, no clash with Nsight); absent on older GPUs."
_NS = "dcgm-exporter's help text said \"in us\" until late 2025; the value is NVML's ns."

FIELDS: tuple[Field, ...] = (
    # etc/default-counters.csv, active rows
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "MHz", "default", "raypulse_gpu_clock_hertz", {"clock": "sm"}, "/ 1e6"),
    Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "MHz", "default", "raypulse_gpu_clock_hertz", {"clock": "memory"},
          "/ 1e6"),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "°C", "default", "raypulse_gpu_temperature_celsius",
          {"sensor": "memory"}, note="HBM GPUs only; omitted elsewhere (dcgm-exporter drops it too)."),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "°C", "default", "raypulse_gpu_temperature_celsius", {"sensor": "gpu"}),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "W", "default", "raypulse_gpu_power_usage_watts",
          note="The same NVML call (nvmlDeviceGetPowerUsage): a 1 s average on Ampere and newer."),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "mJ", "default", "raypulse_gpu_energy_joules_total",
          scale="* 1000", note="Since the driver was loaded (not since boot, as DCGM's help says)."),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "count", "default", "raypulse_gpu_pcie_replays_total"),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "%", "default", "raypulse_gpu_utilization_ratio", scale="* 100",
          note="Not with MIG enabled (in neither exporter)."),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "%", "default", "raypulse_gpu_memory_bandwidth_utilization_ratio",
          scale="* 100", note="Memory bandwidth busy time, not capacity."),
    Field("DCGM_FI_DEV_ENC_UTIL", "gauge", "%", "default", "raypulse_gpu_encoder_utilization_ratio", scale="* 100"),
    Field("DCGM_FI_DEV_DEC_UTIL", "gauge", "%", "default", "raypulse_gpu_decoder_utilization_ratio", scale="* 100"),
    Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "XID code", "default", "raypulse_gpu_xid_last_timestamp_seconds",
          expr=_last_xid(),
          shown="the `xid` label of the newest `raypulse_gpu_xid_last_timestamp_seconds` series of the GPU, "
                "as a number (the rule spells it digit by digit); 0 while the GPU has reported none",
          note="A latched gauge in both: it keeps the last XID until the exporter restarts. Labelled "
               "`err_code` like dcgm-exporter's, without `err_msg`. To alert, prefer "
               "`raypulse_gpu_xid_errors_total{xid}` (a real counter per code) or "
               "`time() - raypulse_gpu_xid_last_timestamp_seconds < 600`."),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "MiB", "default", "raypulse_gpu_memory_free_bytes", scale="/ 1048576"),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "MiB", "default", "raypulse_gpu_memory_used_bytes", scale="/ 1048576",
          note="Both read nvmlMemory_v2: used includes the driver's reserved part. DCGM rounds down to whole "
               "MiB; the rule does not."),
    Field("DCGM_FI_DEV_FB_RESERVED", "gauge", "MiB", "default", "raypulse_gpu_memory_reserved_bytes",
          scale="/ 1048576", note="Drivers R510 and newer."),
    Field("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "MB/s", "default", "raypulse_gpu_nvlink_bytes_total",
          expr=f"sum without (direction) (rate(raypulse_gpu_nvlink_bytes_total[{RATE_WINDOW}])) / 1024000",
          note="Declared a counter, but DCGM reports a rate: RX + TX payload over all links, in KiB/s divided "
               f"by 1000 (DcgmCacheManager.cpp). The rule rates over {RATE_WINDOW}; DCGM over its 30 s interval."),
    Field("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "enum", "default",
          note="None: only meaningful inside vGPU guests, which training nodes are not; raypulse does not read "
               "vGPU licensing."),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "rows", "default", "raypulse_gpu_remapped_rows",
          {"cause": "uncorrectable"}, note="Ampere and newer (both exporters)."),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "rows", "default", "raypulse_gpu_remapped_rows",
          {"cause": "correctable"}),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "0/1", "default", "raypulse_gpu_row_remap_failed"),
    Field("DCGM_FI_DRIVER_VERSION", "label", "string", "default", "raypulse_gpu_info", record=False,
          shown="the `driver_version` label of `raypulse_gpu_info`",
          note="A label on every dcgm-exporter series; the compat rules copy it onto theirs."),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "ratio", "default", "raypulse_gpu_graphics_engine_active_ratio",
          note=_GPM),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "ratio", "default", "raypulse_gpu_tensor_active_ratio",
          note="Any tensor pipe; per pipe: `raypulse_gpu_tensor_pipe_active_ratio{pipe}`. " + _GPM),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "ratio", "default", "raypulse_gpu_dram_active_ratio", note=_GPM),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "bytes/s", "default", "raypulse_gpu_pcie_throughput_bytes_per_second",
          {"direction": "tx"}, note="Headers included, like DCGM's. " + _GPM),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "bytes/s", "default", "raypulse_gpu_pcie_throughput_bytes_per_second",
          {"direction": "rx"}, note=_GPM),
    # commented out in default-counters.csv (users turn them on)
    Field("DCGM_FI_DEV_POWER_VIOLATION", "counter", "ns", "optional", "raypulse_gpu_clock_event_seconds_total",
          {"reason": "sw_power_cap"}, "* 1e9", note="The same NVML field (74). " + _NS),
    Field("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "ns", "optional", "raypulse_gpu_violation_seconds_total",
          {"policy": "thermal"}, "* 1e9",
          note="Time throttled: alert on `rate(...) > 0.1`, never on the raw counter. " + _NS),
    Field("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "counter", "ns", "optional", "raypulse_gpu_clock_event_seconds_total",
          {"reason": "sync_boost"}, "* 1e9", note=_NS),
    Field("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "counter", "ns", "optional", "raypulse_gpu_violation_seconds_total",
          {"policy": "board_limit"}, "* 1e9", note=_NS),
    Field("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "counter", "ns", "optional", "raypulse_gpu_violation_seconds_total",
          {"policy": "low_utilization"}, "* 1e9", note=_NS),
    Field("DCGM_FI_DEV_RELIABILITY_VIOLATION", "counter", "ns", "optional", "raypulse_gpu_violation_seconds_total",
          {"policy": "reliability"}, "* 1e9", note=_NS),
    Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "errors", "optional", "raypulse_gpu_ecc_errors_total",
          {"type": "corrected"}, note="Since the driver was loaded. ECC on only. By location: "
                                      "`raypulse_gpu_ecc_location_errors_total`."),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "errors", "optional", "raypulse_gpu_ecc_errors_total",
          {"type": "uncorrected"}),
    Field("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "errors", "optional", "raypulse_gpu_ecc_lifetime_errors_total",
          {"type": "corrected"}, note="The GPU's lifetime (infoROM)."),
    Field("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "errors", "optional", "raypulse_gpu_ecc_lifetime_errors_total",
          {"type": "uncorrected"}),
    Field("DCGM_FI_DEV_RETIRED_SBE", "counter", "pages", "optional", "raypulse_gpu_retired_pages",
          {"cause": "single_bit_ecc"}, note="GPUs before Ampere; Ampere and newer remap rows instead."),
    Field("DCGM_FI_DEV_RETIRED_DBE", "counter", "pages", "optional", "raypulse_gpu_retired_pages",
          {"cause": "double_bit_ecc"}),
    Field("DCGM_FI_DEV_RETIRED_PENDING", "counter", "0/1", "optional", "raypulse_gpu_retired_pages_pending"),
    Field("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "errors", "optional",
          "raypulse_gpu_nvlink_errors_total", {"type": "crc_flit"},
          note="Over all links; per link: `raypulse_gpu_nvlink_link_errors_total{link}` (Hopper and newer)."),
    Field("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "errors", "optional",
          "raypulse_gpu_nvlink_errors_total", {"type": "crc_data"}),
    Field("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "errors", "optional",
          "raypulse_gpu_nvlink_errors_total", {"type": "replay"}),
    Field("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "errors", "optional",
          "raypulse_gpu_nvlink_errors_total", {"type": "recovery"}),
    Field("DCGM_FI_PROF_SM_ACTIVE", "gauge", "ratio", "optional", "raypulse_gpu_sm_active_ratio", note=_GPM),
    Field("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "ratio", "optional", "raypulse_gpu_sm_occupancy_ratio", note=_GPM),
    Field("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "ratio", "optional", "raypulse_gpu_fp_pipe_active_ratio",
          {"precision": "fp64"}, note=_GPM),
    Field("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "ratio", "optional", "raypulse_gpu_fp_pipe_active_ratio",
          {"precision": "fp32"}, note=_GPM),
    Field("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "ratio", "optional", "raypulse_gpu_fp_pipe_active_ratio",
          {"precision": "fp16"}, note=_GPM),
    # not in the CSV, but in most GPU health rules
    Field("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "0/1", "other", "raypulse_gpu_row_remap_pending",
          note="Users add it to the CSV by hand: a pending remap needs a GPU reset."),
    # older dcgm-exporter defaults
    Field("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "counter", "KB/s", "older", "raypulse_gpu_pcie_throughput_bytes_per_second",
          {"direction": "tx"}, record=False,
          note="No rule: DCGM deprecated the field (use DCGM_FI_PROF_PCIE_TX_BYTES) and DCGM 4 answers "
               "NOT_SUPPORTED, so current dcgm-exporter never exports it. The PromQL is in bytes/s."),
    Field("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "counter", "KB/s", "older", "raypulse_gpu_pcie_throughput_bytes_per_second",
          {"direction": "rx"}, record=False, note="As DCGM_FI_DEV_PCIE_TX_THROUGHPUT."),
    # dcgm-exporter's own families: windows and health checks of its own, not one DCGM field each
    Field("DCGM_EXP_XID_ERRORS_COUNT", "gauge", "XIDs in 5 min", "exporter", "raypulse_gpu_xid_errors_total",
          expr="increase(raypulse_gpu_xid_errors_total[5m])", record=False,
          note="No rule: increase() misses the first XID of a code (the counter is born at 1). For \"an XID "
               "in the last 5 min\" use `time() - raypulse_gpu_xid_last_timestamp_seconds < 300`."),
    Field("DCGM_EXP_CLOCK_EVENTS_COUNT", "gauge", "events in 5 min", "exporter", "raypulse_gpu_clock_event_active",
          record=False, note="No rule: raypulse reports which reasons hold the clocks now (`{reason}`, 0/1) and for "
                             "how long (`raypulse_gpu_clock_event_seconds_total{reason}`), not how often they began."),
    Field("DCGM_EXP_GPU_HEALTH_STATUS", "gauge", "0/10/20", "exporter",
          note="None: DCGM's health watches are DCGM's own. raypulse's GPU alerts cover the same faults from "
               "`raypulse_gpu_up`, XIDs, ECC, row remapping, NVLink, PCIe and `raypulse_gpu_recovery_action` "
               "(docs/alerts.md)."),
    Field("DCGM_EXP_P2P_STATUS", "gauge", "enum", "exporter",
          note="None: raypulse does not probe peer-to-peer support; NVLink state is "
               "`raypulse_gpu_nvlink_link_up{link}`."),
)


def recorded() -> list[Field]:
    return [f for f in FIELDS if f.record and f.promql is not None]


def _identity() -> str:
    """One series per GPU with dcgm-exporter's identity labels, from raypulse_gpu_info."""
    replacements = (
        ("UUID", "$1", "uuid", "(.*)"),
        ("device", "nvidia$1", "gpu", "(.*)"),  # dcgm-exporter: fmt.Sprintf("nvidia%d", gpu)
        ("modelName", "$1", "name", "(.*)"),
        ("DCGM_FI_DRIVER_VERSION", "$1", "driver_version", "(.*)"),
        (HOSTNAME_LABEL, "$1", "instance", "(.*):[0-9]+"),  # the target's host ...
        (HOSTNAME_LABEL, "$1", "node", "(.+)"),  # ... unless /sd (or the config) names the node
    )
    args = ",".join(f'\n    "{target}", "{replacement}", "{source}", "{regex}")'
                    for target, replacement, source, regex in replacements)
    return (f"max by ({GPU_KEY}, {', '.join(DCGM_LABELS)}) (\n  {'label_replace(' * len(replacements)}\n"
            f"    raypulse_gpu_info,{args}\n)")


def _join(promql: str) -> str:
    value = f"(\n{indent(promql, '  ')}\n)" if re.search(r"\b(or|and|unless)\b", promql) else promql
    return f"{value}\n* on ({GPU_KEY}) group_left ({', '.join(DCGM_LABELS)})\n  {IDENTITY}"


def _unless_dcgm_exporter(name: str, promql: str) -> str:
    """`promql` without the GPUs a dcgm-exporter already reports under `name`: never two series of one
    name for one GPU. A GPU is its UUID (NVML's, the same string in both exporters); dcgm-exporter's
    `Hostname` (renamed, or dropped with -n) and `gpu` (DCGM's id, not always NVML's index) are not
    stable enough to join on. dcgm-exporter's series are the ones without raypulse's `uuid` beside
    `UUID` (ours carry both), or, with its --use-old-namespace, with `uuid` and no `UUID`."""
    return (f"(\n{indent(promql, '  ')}\n)\n"
            f"unless on ({DCGM_UUID}) {name}{{{RAYPULSE_UUID}=\"\"}}\n"
            f"unless on ({RAYPULSE_UUID}) {name}{{{DCGM_UUID}=\"\"}}")


HEADER = ("# Generated by `make alerts` (python -m alerts.build) from alerts/dcgm_compat.py; do not edit.\n"
          "# OPT-IN: dcgm-exporter's metric names, labels and units recorded from raypulse series, so dashboards\n"
          "# and alerts built on dcgm-exporter keep working. Not among the default rule files (alerts/rules/*.yaml);\n"
          "# add this file to rule_files to use it. See docs/migrating-from-dcgm-exporter.md.\n")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def render_rules() -> str:
    rules = [{"record": IDENTITY, "expr": _identity()}]
    rules += [{"record": f.name, "expr": _unless_dcgm_exporter(f.name, _join(str(f.promql)))} for f in recorded()]
    body = yaml.dump({"groups": [{"name": "raypulse-dcgm-compat", "rules": rules}]}, Dumper=_Dumper,
                     sort_keys=False, width=4096, allow_unicode=True)
    return HEADER + body


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code(text: str | None) -> str:
    if text is None:
        return "—"
    return _cell(text) if "`" in text else f"`{_cell(text)}`"


def render_doc() -> str:
    lines = [
        "# Migrating from dcgm-exporter", "",
        "<!-- Generated by `make alerts` (python -m alerts.build) from alerts/dcgm_compat.py; do not edit by hand. "
        "-->", "",
        "raypulse reads NVIDIA GPUs through NVML itself (no DCGM host engine) and exports them under its own "
        "names, in Prometheus base units. This page maps every DCGM field you meet in dcgm-exporter (its default "
        "set, the rows its `default-counters.csv` ships commented out, and its own `DCGM_EXP_*` families) to "
        "raypulse's series, with the PromQL that gives the same value in dcgm-exporter's unit. To keep existing "
        "dashboards and alerts working unchanged, load the opt-in rule file described "
        "[at the end](#keeping-dcgm-exporter-dashboards-and-alerts-working-opt-in).", "",
        "## What changes", "",
        "- **Names**: `raypulse_gpu_*`, one family per quantity, with a label for the variant (`clock`, `sensor`, "
        "`type`, `cause`, `direction`) where DCGM has one field each. Every family is in [metrics.md](metrics.md).",
        "- **Units**: ratios 0–1 instead of %, bytes instead of MiB, hertz instead of MHz, joules instead of mJ, "
        "seconds instead of ns; counters end in `_total`. (dcgm-exporter 4.9 moves to base units too.)",
        "- **Labels**: a per-GPU series carries `gpu` (the NVML index), `uuid`, and the `pod`, `namespace` and "
        "`container` holding the GPU (from the kubelet's pod-resources API, as dcgm-exporter's `--kubernetes`; "
        "empty where no pod holds it); the model, PCI bus id and driver are labels of `raypulse_gpu_info`, "
        "joined when needed (below).",
        "- **Profiling fields** (`DCGM_FI_PROF_*`) come from NVML's GPM on Hopper and newer, without SYS_ADMIN and "
        "without clashing with Nsight; older GPUs do not have them.",
        "- **Unsupported values are omitted**, never reported as 0, as dcgm-exporter drops DCGM's blank values.",
        "- **XIDs** are a counter per code (`raypulse_gpu_xid_errors_total{xid}`) and the time of the last one "
        "(`raypulse_gpu_xid_last_timestamp_seconds{xid}`), not a latched \"last XID\" gauge.", "",
        "## Labels", "",
        "| dcgm-exporter | raypulse |", "|---|---|",
        "| `gpu` | `gpu` (NVML index) |",
        "| `UUID` (`uuid` with `--use-old-namespace`) | `uuid` |",
        "| `device` (`nvidia<gpu>`) | none: `\"nvidia\"` + `gpu` |",
        "| `modelName` | `name` of `raypulse_gpu_info` |",
        "| `pci_bus_id` | `pci_bus_id` of `raypulse_gpu_info` |",
        "| `DCGM_FI_DRIVER_VERSION` | `driver_version` of `raypulse_gpu_info` |",
        "| `Hostname` (`hostname` from 4.8.3) | `node`, the target label the head exporter's `/sd` sets |",
        "| `GPU_I_PROFILE`, `GPU_I_ID` (MIG) | `profile`, `gpu_instance_id` of the `raypulse_gpu_mig_*` families |",
        "| `pod`, `namespace`, `container` (`-k`) | the target labels your PodMonitor adds; GPU use per Ray job: "
        "`raypulse_job_gpu_memory_used_bytes`, `raypulse_job_gpu_sm_utilization_ratio` |", "",
        "A model name next to a value:", "",
        "```promql",
        f"raypulse_gpu_utilization_ratio * on ({GPU_KEY}) group_left (name) raypulse_gpu_info",
        "```", "",
    ]
    for key, title in SETS.items():
        rows = [f for f in FIELDS if f.set == key]
        lines += [f"## {title}", "",
                  "| DCGM field | dcgm-exporter | raypulse | PromQL in dcgm-exporter's unit | rule | notes |",
                  "|---|---|---|---|---|---|"]
        for f in rows:
            source = "—" if f.family is None else f"`{_cell(f.selector)}`"
            rule = "yes" if f in recorded() else "—"
            lines.append(f"| `{f.name}` | {f.type}, {f.unit} | {source} | {_code(f.doc_promql)} | {rule} "
                         f"| {_cell(f.note)} |")
        lines.append("")
    names = ", ".join(f"`{f.name}`" for f in recorded())
    lines += [
        "## Keeping dcgm-exporter dashboards and alerts working (opt-in)", "",
        "`alerts/rules/dcgm-compat.yml` records dcgm-exporter's metric names from raypulse series, in "
        "dcgm-exporter's units (the fields with \"yes\" in the rule column above): " + names + ".", "",
        f"Each carries dcgm-exporter's labels {', '.join(f'`{label}`' for label in DCGM_LABELS)} (copied from "
        f"`{IDENTITY}`, a helper the file records first), `gpu`, and raypulse's own `uuid` and target labels "
        "(`cluster`, `node`, `instance`, `job`). NVIDIA's dashboard 12239 (every panel reads a recorded name) and "
        "alerts on the recorded names work unchanged; the dashboard's `instance` variable lists raypulse "
        "exporters.", "",
        "**Next to a dcgm-exporter** (the GPU Operator runs one on every GPU node) no name is ever doubled: "
        "each rule skips the GPUs for which a dcgm-exporter series of the same name exists, matched by the GPU's "
        f"UUID (dcgm-exporter's `{DCGM_UUID}`, or `{RAYPULSE_UUID}` with its `--use-old-namespace`; "
        f"raypulse's `{RAYPULSE_UUID}`: the same NVML string). So each GPU has one series per name: "
        "dcgm-exporter's where it reports that field, the recorded one for the fields (or the GPUs) it does not. "
        "The UUID, not `Hostname` and `gpu`: dcgm-exporter renames or drops `Hostname` (`hostname` from 4.8.3, "
        "none with `-n`), and its `gpu` is DCGM's id, not always NVML's index.", "",
        "It is not loaded by default: the default rule files are `alerts/rules/*.yaml` and this one ends in "
        "`.yml`. Add it to Prometheus:", "",
        "```yaml",
        "rule_files:",
        "  - /path/to/raypulse/alerts/rules/*.yaml",
        "  - /path/to/raypulse/alerts/rules/dcgm-compat.yml   # dcgm-exporter names, opt-in",
        "```", "",
        "or, from Python, `alerts.prometheus.config(..., rules=[*rule_files(), RULES_DIR / \"dcgm-compat.yml\"])`. "
        "From an installed package, `exporter assets --dir DIR` writes it to `DIR/opt-in/`.",
        "", "Limits:", "",
        f"- It adds {len(recorded())} series per GPU. Prefer raypulse's names for new dashboards and alerts; the "
        "rules are a bridge.",
        f"- The label is `{HOSTNAME_LABEL}` (dcgm-exporter before 4.8.3). For `hostname`, set `HOSTNAME_LABEL` in "
        "`alerts/dcgm_compat.py` and run `make alerts`.",
        "- Whole GPUs only: no series per MIG instance (`GPU_I_*`), and no `pod`/`namespace` attribution beyond "
        "the target's labels.",
        f"- `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` is a rate over {RATE_WINDOW}: it needs a scrape interval of "
        "30 s or less.",
        "- Not in dcgm-exporter but worth a look in raypulse: throttle reasons now and over time, per-process and "
        "per-Ray-job GPU use, NVLink per link, PCIe link width and generation, row-remap bank availability, "
        "fabric state and the driver's recovery action ([metrics.md](metrics.md)).", "",
    ]
    return "\n".join(lines)


def outputs() -> dict[Path, str]:
    return {RULES: render_rules(), DOC: render_doc()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alerts.dcgm_compat", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if the committed files are out of date")
    args = parser.parse_args(argv)
    stale = 0
    for path, text in outputs().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                print(f"{path.relative_to(REPO)} is out of date: run `make alerts`", file=sys.stderr)
                stale += 1
            continue
        path.write_text(text)
        print(path.relative_to(REPO))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
