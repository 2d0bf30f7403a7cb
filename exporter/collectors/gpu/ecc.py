"""Memory health: ECC error counts, retired pages (before Ampere), row remapping (Ampere and newer)."""

from __future__ import annotations

import pynvml

from exporter.collectors.gpu.families import gpu_counter, gpu_gauge, unsupported_on
from exporter.collectors.gpu.reader import Area, DeviceReader

_TYPES = {"corrected": pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
          "uncorrected": pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED}
_LOCATIONS = {"l1_cache": pynvml.NVML_MEMORY_LOCATION_L1_CACHE, "l2_cache": pynvml.NVML_MEMORY_LOCATION_L2_CACHE,
              "device_memory": pynvml.NVML_MEMORY_LOCATION_DEVICE_MEMORY,
              "register_file": pynvml.NVML_MEMORY_LOCATION_REGISTER_FILE,
              "texture_memory": pynvml.NVML_MEMORY_LOCATION_TEXTURE_MEMORY,
              "texture_shm": pynvml.NVML_MEMORY_LOCATION_TEXTURE_SHM, "cbu": pynvml.NVML_MEMORY_LOCATION_CBU,
              "sram": pynvml.NVML_MEMORY_LOCATION_SRAM}
_CAUSES = {"single_bit_ecc": pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
           "double_bit_ecc": pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR}
_ECC = unsupported_on("GPUs with ECC memory and ECC on")
_REMAP = unsupported_on("Ampere and newer")
_RETIREMENT = unsupported_on("GPUs before Ampere")

ERRORS = gpu_counter("ecc_errors_total", "ECC errors since the driver was loaded (uncorrected: double-bit, data "
                     "was lost).", ("type",), only_when=_ECC)
LIFETIME_ERRORS = gpu_counter("ecc_lifetime_errors_total", "ECC errors over the GPU's lifetime (kept in its "
                              "infoROM).", ("type",), only_when=_ECC)
LOCATION_ERRORS = gpu_counter("ecc_location_errors_total", "ECC errors since the driver was loaded, by where they "
                              "happened.", ("type", "location"), only_when=_ECC)
RETIRED_PAGES = gpu_gauge("retired_pages", "Memory pages retired, by cause.", ("cause",), only_when=_RETIREMENT)
RETIRED_PAGES_PENDING = gpu_gauge("retired_pages_pending", "1 if pages are waiting to be retired at the next "
                                  "reboot or GPU reset.", only_when=_RETIREMENT)
REMAPPED_ROWS = gpu_gauge("remapped_rows", "Memory rows remapped to spares, by the kind of error that caused it.",
                          ("cause",), only_when=_REMAP)
ROW_REMAP_PENDING = gpu_gauge("row_remap_pending", "1 if a row remap waits for a GPU reset to take effect.",
                              only_when=_REMAP)
ROW_REMAP_FAILED = gpu_gauge("row_remap_failed", "1 if a row could not be remapped: the GPU should be replaced.",
                             only_when=_REMAP)
BANK_AVAILABILITY = gpu_gauge("row_remap_bank_availability", "Memory banks by how many spare rows they have left "
                              "(max: all, none: no spare left).", ("level",), only_when=_REMAP)


def _read(r: DeviceReader) -> None:
    for name, error_type in _TYPES.items():
        volatile = r.call("nvmlDeviceGetTotalEccErrors", error_type, pynvml.NVML_VOLATILE_ECC)
        r.add(ERRORS, r.counter(("ecc", name), volatile), type=name)
        lifetime = r.call("nvmlDeviceGetTotalEccErrors", error_type, pynvml.NVML_AGGREGATE_ECC)
        r.add(LIFETIME_ERRORS, r.counter(("ecc_lifetime", name), lifetime), type=name)
        for location, code in _LOCATIONS.items():
            count = r.call("nvmlDeviceGetMemoryErrorCounter", error_type, pynvml.NVML_VOLATILE_ECC, code)
            r.add(LOCATION_ERRORS, r.counter(("ecc_location", name, location), count), type=name, location=location)
    for cause, code in _CAUSES.items():
        pages = r.call("nvmlDeviceGetRetiredPages", code)
        r.add(RETIRED_PAGES, None if pages is None else len(pages), cause=cause)
    r.add(RETIRED_PAGES_PENDING, r.call("nvmlDeviceGetRetiredPagesPendingStatus"))
    rows = r.call("nvmlDeviceGetRemappedRows")
    if rows is not None:
        correctable, uncorrectable, pending, failed = rows
        r.add(REMAPPED_ROWS, correctable, cause="correctable")
        r.add(REMAPPED_ROWS, uncorrectable, cause="uncorrectable")
        r.add(ROW_REMAP_PENDING, bool(pending))
        r.add(ROW_REMAP_FAILED, bool(failed))
    histogram = r.call("nvmlDeviceGetRowRemapperHistogram")
    if histogram is not None:
        for level in ("max", "high", "partial", "low", "none"):
            r.add(BANK_AVAILABILITY, getattr(histogram, level), level=level)


AREA = Area("ecc", read=_read)
