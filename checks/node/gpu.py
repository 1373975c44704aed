"""What NVML says about each GPU, read in one pass (docs/hardware.md §7).

`read_gpus` returns a `GpuSnapshot`: one `GpuReading` per GPU NVML enumerates,
each read on its own thread under the session's deadline. A query a GPU or
driver does not have is recorded in `unsupported` (never an error); a GPU that
NVML reports lost stops being read and says so in `lost`; a GPU whose reads did
not come back in time says so in `hung`. Judging happens in the checks.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import field
from typing import Any, TypeVar

from nodecheck.checks.node.fs import NodeFS, list_dir, read_optional_text
from nodecheck.checks.node.nvml import (
    ABSENT_CODES,
    LOST_CODES,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_INVALID_ARGUMENT,
    NvmlHungError,
    NvmlSession,
    NvmlUnavailableError,
    describe_error,
    error_code,
)
from nodecheck.checks.node.pci import PCIE_WIDTHS
from nodecheck.checks.record import record

T = TypeVar("T")
N = TypeVar("N", int, float)

# Field ids (nvml.h, NVML_FI_*), read in one nvmlDeviceGetFieldValues call.
FIELD_PCIE_REPLAY = 94  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
# Nanoseconds each clock event reason held the clocks down, since driver load.
THROTTLE_FIELDS = {
    "sw_power_cap": 74,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
    "sync_boost": 76,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST
    "sw_thermal": 269,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
    "hw_thermal": 270,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
    "hw_power_brake": 271,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
}
# NVLink error counters summed over all links (NVML_FI_DEV_NVLINK_*_TOTAL).
NVLINK_ERROR_FIELDS = {
    "crc_flit": 38,
    "crc_data": 45,
    "replay": 52,
    "recovery": 59,
    "ecc_data": 160,
}
NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in the 13.x header
# The query name (GpuReading.errors key) a field's failure is filed under.
FIELD_QUERIES = {
    FIELD_PCIE_REPLAY: "pcie_replays",
    FIELD_RECOVERY_ACTION: "recovery_action",
    **dict.fromkeys(THROTTLE_FIELDS.values(), "throttle_time"),
    **dict.fromkeys(NVLINK_ERROR_FIELDS.values(), "nvlink_errors"),
}

# nvmlFieldValue_t.valueType -> the union member that holds it.
_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}

# Enum values from nvml.h, so this module does not import pynvml.
MEMORY_ERROR_CORRECTED, MEMORY_ERROR_UNCORRECTED = 0, 1
VOLATILE_ECC, AGGREGATE_ECC = 0, 1
PAGE_RETIREMENT_SBE, PAGE_RETIREMENT_DBE = 0, 1
TEMPERATURE_GPU = 0
THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN = 0, 1
# NVML_GPU_FABRIC_STATE_* (nvml.h): a GPU's registration with the NVLink fabric.
FABRIC_NOT_SUPPORTED, FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED = 0, 1, 2, 3


# domain:bus:device.function; NVML writes an 8-digit domain, sysfs a 4-digit one.
_BUS_ID = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([01][0-9a-f])\.([0-7])")
# No node holds more: the largest sold carry 16 SXM or 20 PCIe GPUs. A count far
# beyond is a broken driver answer, not GPUs to open one by one.
MAX_PLAUSIBLE_GPUS = 256


@record
class Plausible:
    """The values NVML can answer for one quantity, `low` to `high` inclusive. One
    definition for both sides: live, an answer outside is an error on that GPU (the
    reading keeps None and says why in `errors`); so a capture, which holds what the
    live reading kept, holding one outside was edited, and is refused."""

    low: float
    high: float
    unit: str = ""

    def admits(self, value: float) -> bool:
        return self.low <= value <= self.high  # no range admits NaN

    def refusal(self, value: float) -> str:
        span = f"{self.low:g} to {self.high:g}{self.unit}"
        return f"{value}{self.unit} is implausible (NVML answers {span})"


# A powered GPU reads above the air around it, and no machine room is below
# freezing (ASHRAE's widest class, A4, allows 5 °C inlet); GPUs shut themselves down
# near 100 °C, so 150 °C covers any sensor still working. Outside that NVML answered
# nonsense, such as -1 for a failed sensor read (4294967295 through the unsigned call).
TEMPERATURE_C = Plausible(1, 150, " °C")
# The largest GPU modules draw about 1.2 kW (B200) and superchip boards 2.7 kW.
POWER_W = Plausible(0.0, 5000.0, " W")
# A limit of 0 W would stop the GPU: no driver enforces one.
POWER_LIMIT_W = Plausible(1.0, 5000.0, " W")
UTILIZATION_PCT = Plausible(0, 100, " %")
# PCIe 1.0 to 7.0 (PCI-SIG).
PCIE_GENERATIONS = range(1, 8)


def negative_count(owner: object, names: tuple[str, ...]) -> tuple[str, str] | None:
    """The first of `owner`'s count fields (an int, or a dict of ints) below zero, and
    why that is impossible: NVML returns counts, clocks, sizes and pids as unsigned
    integers (nvml.h), so only an edited capture holds a negative one."""
    for name in names:
        value = getattr(owner, name)
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for key, count in items:
            if count is not None and count < 0:
                place = name if key is None else f"{name}[{key!r}]"
                return place, f"{count} is negative: NVML counts in unsigned integers"
    return None


def memory_problem(total: int, used: int) -> str | None:
    """Why NVML's memory figures cannot both be true, or None."""
    if used > total:
        return f"memory {used} bytes used of {total}: implausible"
    return None


def normalize_bus_id(raw: str | bytes) -> str:
    """NVML's "00000000:1B:00.0" as sysfs writes it: "0000:1b:00.0".

    ValueError naming the text when it is not a PCI bus id (a driver bug, a
    corrupted answer): such a GPU cannot be joined with sysfs.
    """
    text = raw.decode("ascii", errors="replace") if isinstance(raw, bytes) else str(raw)
    match = _BUS_ID.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"{text!r} is not a PCI bus id")
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus}:{device}.{function}"


def device_count(nvml: Any) -> int:
    """nvmlDeviceGetCount, or ValueError when the answer cannot be a number of GPUs."""
    count = nvml.nvmlDeviceGetCount()
    if not isinstance(count, int) or not 0 <= count <= MAX_PLAUSIBLE_GPUS:
        raise ValueError(
            f"NVML reported {count!r} GPUs (nvmlDeviceGetCount): implausible "
            f"(at most {MAX_PLAUSIBLE_GPUS})"
        )
    return count


@record
class EccCounts:
    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None

    def implausible(self) -> tuple[str, str] | None:
        return negative_count(self, tuple(vars(self)))


@record
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool

    def implausible(self) -> tuple[str, str] | None:
        return negative_count(self, ("correctable", "uncorrectable"))


@record
class RetiredPages:
    single_bit: int
    double_bit: int
    pending: bool | None

    def implausible(self) -> tuple[str, str] | None:
        return negative_count(self, ("single_bit", "double_bit"))


@record
class PcieState:
    generation: int | None
    max_generation: int | None
    width: int | None
    max_width: int | None

    def implausible(self) -> tuple[str, str] | None:
        problems = link_problems(self)
        if not problems:
            return None
        place, what = problems[0]
        return place, f"PCIe {what} is implausible"


@record
class GpuFabric:
    """The GPU's registration with the NVLink fabric (nvmlDeviceGetGpuFabricInfoV): its
    `state` (NVML_GPU_FABRIC_STATE_*), its `status` (an nvmlReturn_t, 0 for success, which
    nvml.h says to read only once the state is COMPLETED), the clique and cluster it joined
    (both zero on an NVSwitch node, set by the NVLink domain on GB200), and the health mask
    (NVML_GPU_FABRIC_HEALTH_MASK_*) where the driver gives one (not the unversioned call)."""

    state: int
    status: int
    clique_id: int
    cluster_uuid: str
    health_mask: int | None = None

    def implausible(self) -> tuple[str, str] | None:
        # nvmlGpuFabricState_t is an unsigned char; the others unsigned ints or an enum.
        if not 0 <= self.state <= 0xFF:
            return "state", f"{self.state} is not an unsigned char (nvmlGpuFabricState_t)"
        for name in ("status", "clique_id", "health_mask"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 0xFFFFFFFF:
                return name, f"{value} is not an unsigned 32-bit value"
        try:
            uuid.UUID(self.cluster_uuid)
        except ValueError:
            return "cluster_uuid", f"{self.cluster_uuid!r} is not a UUID"
        return None


@record
class GpuProcess:
    pid: int
    used_memory_bytes: int | None

    def implausible(self) -> tuple[str, str] | None:
        return negative_count(self, ("pid", "used_memory_bytes"))


@record(frozen=False)
class GpuReading:
    """One GPU as NVML saw it. Every value is None where it could not be read."""

    index: int
    bus_id: str | None = None
    name: str | None = None
    uuid: str | None = None
    vbios: str | None = None
    lost: str | None = None
    hung: str | None = None
    # Set when this GPU could not be read at all for another reason (no permission).
    error: str | None = None
    # query -> why it failed (not "unsupported": that is in `unsupported`)
    errors: dict[str, str] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)
    memory_total: int | None = None
    memory_used: int | None = None
    ecc_mode: tuple[bool, bool] | None = None  # (current, pending)
    ecc: EccCounts = field(default_factory=EccCounts)
    remapped_rows: RemappedRows | None = None
    retired_pages: RetiredPages | None = None
    clock_event_reasons: int | None = None
    sm_clock_mhz: int | None = None  # nvmlDeviceGetClockInfo(NVML_CLOCK_SM)
    max_sm_clock_mhz: int | None = None  # nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM)
    throttle_ns: dict[str, int] = field(default_factory=dict)
    pcie: PcieState | None = None
    pcie_replays: int | None = None
    nvlink_active: list[bool] | None = None  # None: no NVLink on this GPU
    nvlink_errors: dict[str, int] = field(default_factory=dict)
    fabric: GpuFabric | None = None  # None: no NVLink fabric support, or unread
    temperature_c: int | None = None
    slowdown_c: int | None = None
    shutdown_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    default_power_limit_w: float | None = None
    persistence_mode: bool | None = None
    recovery_action: int | None = None
    utilization_pct: int | None = None
    processes: list[GpuProcess] | None = None
    read_at: float = 0.0  # time.monotonic() when the counters were read

    @property
    def readable(self) -> bool:
        return self.lost is None and self.hung is None and self.error is None

    @property
    def model(self) -> str:
        return self.name or "unknown"

    def labels(self) -> dict[str, str]:
        """The labels every per-GPU metric sample carries."""
        return {"gpu": str(self.index), "bus_id": self.bus_id or "", "model": self.model}

    def implausible(self) -> tuple[str, str] | None:
        """The field holding what NVML cannot answer, and why: the live reading keeps None
        there (and the answer in `errors`), so only an edited capture holds one."""
        for name, bounds in READING_BOUNDS.items():
            value = getattr(self, name)
            if value is not None and not bounds.admits(value):
                return name, bounds.refusal(value)
        if self.memory_total is not None and self.memory_used is not None:
            problem = memory_problem(self.memory_total, self.memory_used)
            if problem:
                return "memory_used", problem
        return negative_count(self, READING_COUNTS)


# The bounds each field of a reading was read under (_read_state), and its counts.
READING_BOUNDS = {
    "temperature_c": TEMPERATURE_C,
    "slowdown_c": TEMPERATURE_C,
    "shutdown_c": TEMPERATURE_C,
    "power_w": POWER_W,
    "power_limit_w": POWER_LIMIT_W,
    "default_power_limit_w": POWER_LIMIT_W,
    "utilization_pct": UTILIZATION_PCT,
}
READING_COUNTS = (
    "index",
    "memory_total",
    "memory_used",
    "clock_event_reasons",
    "sm_clock_mhz",
    "max_sm_clock_mhz",
    "throttle_ns",
    "pcie_replays",
    "nvlink_errors",
    "recovery_action",
)


@record
class NvmlFailure:
    """Why NVML could not be used: the NvmlUnavailableError kind ("library_missing", ...)
    or "hung", and its message. Data, not the exception, so a capture carries it."""

    kind: str
    message: str

    @classmethod
    def of(cls, err: NvmlUnavailableError | NvmlHungError) -> NvmlFailure:
        if isinstance(err, NvmlHungError):
            return cls("hung", str(err))
        return cls(err.kind, err.message)

    def __str__(self) -> str:
        return self.message


@record(frozen=False)
class GpuSnapshot:
    """Every GPU NVML enumerates, or why NVML could not be used."""

    gpus: list[GpuReading] = field(default_factory=list)
    unavailable: NvmlFailure | None = None
    hung: NvmlFailure | None = None
    driver_version: str | None = None
    cuda_driver_version: int | None = None

    @property
    def usable(self) -> bool:
        return self.unavailable is None and self.hung is None

    def by_bus_id(self) -> dict[str, GpuReading]:
        return {gpu.bus_id: gpu for gpu in self.gpus if gpu.bus_id}


class _GpuLostError(Exception):
    pass


class _Reader:
    """Reads one GPU, query by query, sorting each failure into its kind."""

    def __init__(self, nvml: Any, reading: GpuReading) -> None:
        self.nvml = nvml
        self.reading = reading

    def query(self, name: str, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except UnicodeDecodeError as err:
            # pynvml decodes strings as UTF-8; a corrupted InfoROM can hold other bytes.
            self.reading.errors[name] = f"NVML reported a {name} that is not UTF-8: {err.object!r}"
            return None
        except (ValueError, TypeError, OverflowError, AttributeError) as err:
            self.reading.errors[name] = f"NVML gave an unusable answer: {err}"
            return None
        except self.nvml.NVMLError as err:
            code = error_code(err)
            if code in LOST_CODES:
                self.reading.lost = describe_error(err)
                raise _GpuLostError from err
            if code in ABSENT_CODES:
                self.reading.unsupported.add(name)
            else:
                self.reading.errors[name] = describe_error(err)
            return None

    def plausible(self, name: str, value: N | None, bounds: Plausible) -> N | None:
        """`value` when `bounds` admit it, else None and an error naming query and value.

        An impossible number (4294967295 °C, a PCIe width of 0) is a broken
        reading, never a fact to judge: judged, it would pass or fail falsely.
        """
        if value is None or bounds.admits(value):
            return value
        self.reading.errors[name] = f"NVML reported {name} {value}{bounds.unit}: implausible"
        return None


def _field_values(
    nvml: Any, handle: object, ids: list[int]
) -> tuple[dict[int, int | float | None], dict[int, str]]:
    """Field id -> value (None for a field this GPU or driver does not report), and
    field id -> why it failed, for fields that failed for another reason.

    One call for all fields. A driver older than a field id may refuse the
    whole batch rather than that field, so on a refusal each field is asked
    on its own and only the unknown ones come back None.
    """
    try:
        items = list(nvml.nvmlDeviceGetFieldValues(handle, ids))
    except nvml.NVMLError as err:
        if error_code(err) in LOST_CODES or len(ids) == 1:
            raise
        values: dict[int, int | float | None] = {}
        failures: dict[int, str] = {}
        for field_id in ids:
            try:
                one, failed = _field_values(nvml, handle, [field_id])
            except nvml.NVMLError as single:
                if error_code(single) in LOST_CODES:
                    raise
                one, failed = {field_id: None}, {}
            values.update(one)
            failures.update(failed)
        if all(value is None for value in values.values()):
            raise  # not one field answers: the call itself is broken
        return values, failures
    values = {}
    failures = {}
    for item in items:
        code = int(item.nvmlReturn)
        if code in LOST_CODES:
            raise nvml.NVMLError(code)
        member = _VALUE_MEMBERS.get(item.valueType)
        if code == 0 and member is not None:
            values[item.fieldId] = getattr(item.value, member)
            continue
        values[item.fieldId] = None
        # A driver older than a field id may answer INVALID_ARGUMENT for it:
        # that field does not exist there, like NOT_SUPPORTED.
        if code not in ABSENT_CODES and code != NVML_ERROR_INVALID_ARGUMENT:
            failures[item.fieldId] = describe_error(nvml.NVMLError(code))
    return values, failures


def _read_gpu(nvml: Any, handle: object, reading: GpuReading) -> GpuReading:
    """Fill `reading` from NVML; stops at the first sign the GPU is lost."""
    r = _Reader(nvml, reading)
    try:
        _read_identity(nvml, handle, r)
        _read_memory(nvml, handle, r)
        _read_clocks_and_links(nvml, handle, r)
        _read_state(nvml, handle, r)
    except _GpuLostError:
        pass
    reading.read_at = time.monotonic()
    return reading


def _read_identity(nvml: Any, h: object, r: _Reader) -> None:
    reading = r.reading
    reading.name = r.query("name", lambda: nvml.nvmlDeviceGetName(h))
    reading.uuid = r.query("uuid", lambda: nvml.nvmlDeviceGetUUID(h))
    reading.vbios = r.query("vbios", lambda: nvml.nvmlDeviceGetVbiosVersion(h))
    memory = r.query("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
    if memory is not None:
        total, used = int(memory.total), int(memory.used)
        problem = memory_problem(total, used)
        if problem:
            reading.errors["memory"] = f"NVML reported {problem}"
        else:
            reading.memory_total, reading.memory_used = total, used


def _read_memory(nvml: Any, h: object, r: _Reader) -> None:
    reading = r.reading
    mode = r.query("ecc_mode", lambda: nvml.nvmlDeviceGetEccMode(h))
    if mode is not None:
        reading.ecc_mode = (bool(mode[0]), bool(mode[1]))
    if reading.ecc_mode is not None and reading.ecc_mode[0]:

        def count(kind: int, counter: int) -> int | None:
            return r.query("ecc", lambda: int(nvml.nvmlDeviceGetTotalEccErrors(h, kind, counter)))

        reading.ecc = EccCounts(
            volatile_corrected=count(MEMORY_ERROR_CORRECTED, VOLATILE_ECC),
            volatile_uncorrected=count(MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC),
            aggregate_corrected=count(MEMORY_ERROR_CORRECTED, AGGREGATE_ECC),
            aggregate_uncorrected=count(MEMORY_ERROR_UNCORRECTED, AGGREGATE_ECC),
        )
    rows = r.query("remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(h))
    if rows is not None:
        reading.remapped_rows = RemappedRows(
            int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3])
        )
    # Page retirement is the pre-Ampere mechanism; Ampere and later answer
    # NOT_SUPPORTED and use row remapping instead (docs/hardware.md §9).
    sbe = r.query("retired_pages", lambda: nvml.nvmlDeviceGetRetiredPages(h, PAGE_RETIREMENT_SBE))
    if sbe is not None:
        dbe = r.query(
            "retired_pages", lambda: nvml.nvmlDeviceGetRetiredPages(h, PAGE_RETIREMENT_DBE)
        )
        pending = r.query(
            "retired_pages_pending", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h)
        )
        reading.retired_pages = RetiredPages(
            len(sbe), len(dbe or []), None if pending is None else bool(pending)
        )


def _read_clocks_and_links(nvml: Any, h: object, r: _Reader) -> None:
    reading = r.reading
    reading.clock_event_reasons = r.query("clock_event_reasons", lambda: _event_reasons(nvml, h))
    reading.sm_clock_mhz = r.query(
        "clocks", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)
    )
    reading.max_sm_clock_mhz = r.query(
        "clocks", lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM)
    )
    pcie = _plausible_link(
        r,
        PcieState(
            r.query("pcie", lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
            r.query("pcie", lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
            r.query("pcie", lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
            r.query("pcie", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(h)),
        ),
    )
    if any(value is not None for value in vars(pcie).values()):
        reading.pcie = pcie
    reading.nvlink_active = _nvlink_states(nvml, h, r)
    reading.fabric = r.query("fabric", lambda: _fabric(nvml, h))
    ids = [FIELD_PCIE_REPLAY, FIELD_RECOVERY_ACTION, *THROTTLE_FIELDS.values()]
    if reading.nvlink_active is not None:
        ids += NVLINK_ERROR_FIELDS.values()
    answer = r.query("field_values", lambda: _field_values(nvml, h, ids))
    if answer is None:
        return
    fields, failures = answer
    for field_id, why in failures.items():
        reading.errors.setdefault(FIELD_QUERIES[field_id], why)
    replays = fields.get(FIELD_PCIE_REPLAY)
    reading.pcie_replays = None if replays is None else int(replays)
    action = fields.get(FIELD_RECOVERY_ACTION)
    reading.recovery_action = None if action is None else int(action)
    for name, field_id in THROTTLE_FIELDS.items():
        if (value := fields.get(field_id)) is not None:
            reading.throttle_ns[name] = int(value)
    for name, field_id in NVLINK_ERROR_FIELDS.items():
        if (value := fields.get(field_id)) is not None:
            reading.nvlink_errors[name] = int(value)


def link_problems(link: PcieState) -> list[tuple[str, str]]:
    """(field, what) for each value no PCIe link has (a width of 0 or 255, Gen99, widths
    the PCIe Base Specification does not define) or, when each is possible, a current
    width or generation above the maximum."""
    problems = [
        (name, f"{what} {value}")
        for name, what, value, allowed in (
            ("generation", "generation", link.generation, PCIE_GENERATIONS),
            ("max_generation", "max generation", link.max_generation, PCIE_GENERATIONS),
            ("width", "width", link.width, PCIE_WIDTHS),
            ("max_width", "max width", link.max_width, PCIE_WIDTHS),
        )
        if value is not None and value not in allowed
    ]
    if problems:
        return problems
    if link.width and link.max_width and link.width > link.max_width:
        problems.append(("width", f"width x{link.width} above its maximum x{link.max_width}"))
    if link.generation and link.max_generation and link.generation > link.max_generation:
        above = f"generation {link.generation} above its maximum {link.max_generation}"
        problems.append(("generation", above))
    return problems


def _plausible_link(r: _Reader, link: PcieState) -> PcieState:
    """The link with impossible values dropped and reported (link_problems)."""
    problems = link_problems(link)
    if not problems:
        return link
    shown = ", ".join(what for _, what in problems)
    r.reading.errors["pcie"] = f"NVML reported PCIe {shown}: implausible"
    return PcieState(None, None, None, None)


def _event_reasons(nvml: Any, h: object) -> int:
    """Current clock event reasons; the older "throttle reasons" call where the binding
    or the driver lacks the new name (same bits, docs/hardware.md §10)."""
    getter = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if getter is not None:
        try:
            return int(getter(h))
        except nvml.NVMLError as err:
            if error_code(err) != NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
    return int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))


def _temperature(nvml: Any, h: object) -> int:
    """GPU temperature; the deprecated call where the binding or driver lacks the new one."""
    getter = getattr(nvml, "nvmlDeviceGetTemperatureV", None)
    if getter is not None:
        try:
            return int(getter(h, TEMPERATURE_GPU))
        except nvml.NVMLError as err:
            if error_code(err) != NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
    return int(nvml.nvmlDeviceGetTemperature(h, TEMPERATURE_GPU))


class _FabricInfo(ctypes.Structure):
    """nvml.h's nvmlGpuFabricInfo_t (the unversioned call's)."""

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * 16),  # NVML_GPU_FABRIC_UUID_LEN
        ("status", ctypes.c_int),  # nvmlReturn_t
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),  # nvmlGpuFabricState_t: an unsigned char
    ]


class _FabricInfoV2(ctypes.Structure):
    """nvml.h's nvmlGpuFabricInfo_v2_t: a version first, the health mask last."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
        ("healthMask", ctypes.c_uint),
    ]


# nvml.h: NVML_STRUCT_VERSION(GpuFabricInfo, 2), the struct's size and the version << 24.
FABRIC_INFO_V2 = ctypes.sizeof(_FabricInfoV2) | 2 << 24


def fabric_of(info: Any, health_mask: int | None) -> GpuFabric:
    """A GpuFabric from an nvmlGpuFabricInfo_t or _v2_t."""
    return GpuFabric(
        state=int(info.state) & 0xFF,
        status=int(info.status),
        clique_id=int(info.cliqueId),
        cluster_uuid=str(uuid.UUID(bytes=bytes(info.clusterUuid))),
        health_mask=health_mask,
    )


def _fabric(nvml: Any, h: object) -> GpuFabric:
    """The fabric info through nvmlDeviceGetGpuFabricInfoV (v2), else the unversioned call
    where the driver lacks it or refuses that version.

    The structs are nodecheck's own, from nvml.h, called through the binding's loader
    (_nvmlGetFunctionPointer, _nvmlCheckReturn, in every nvidia-ml-py): the binding's own
    classes differ by release (12.535's c_nvmlGpuFabricInfo_t has no cliqueId and no
    versioned call at all), and its wrappers hand the struct on by value where the
    library writes into it."""
    try:
        versioned = nvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuFabricInfoV")
    except nvml.NVMLError as err:
        if error_code(err) != NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
        versioned = None
    if versioned is not None:
        info = _FabricInfoV2(version=FABRIC_INFO_V2)
        returned = versioned(h, ctypes.byref(info))
        if returned == 0:  # NVML_SUCCESS
            return fabric_of(info, int(info.healthMask))
        if returned != NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
            nvml._nvmlCheckReturn(returned)
    plain = _FabricInfo()
    nvml._nvmlCheckReturn(
        nvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuFabricInfo")(h, ctypes.byref(plain))
    )
    return fabric_of(plain, None)


def _nvlink_states(nvml: Any, h: object, r: _Reader) -> list[bool] | None:
    """Active flag per NVLink; None on a GPU without NVLink."""
    states: list[bool] = []
    for link in range(NVLINK_MAX_LINKS):
        try:
            states.append(bool(nvml.nvmlDeviceGetNvLinkState(h, link)))
        except nvml.NVMLError as err:
            code = error_code(err)
            if code in LOST_CODES:
                r.reading.lost = describe_error(err)
                raise _GpuLostError from err
            # Past the last link NVML answers INVALID_ARGUMENT (or NOT_SUPPORTED
            # for every link on a GPU with none).
            if code in ABSENT_CODES or code == NVML_ERROR_INVALID_ARGUMENT:
                break
            r.reading.errors["nvlink"] = describe_error(err)
            break
    return states or None


def _read_state(nvml: Any, h: object, r: _Reader) -> None:
    reading = r.reading
    reading.temperature_c = r.plausible(
        "temperature",
        r.query("temperature", lambda: _temperature(nvml, h)),
        READING_BOUNDS["temperature_c"],
    )

    def threshold(kind: int) -> int | None:
        value = r.query(
            "temperature_threshold",
            lambda: int(nvml.nvmlDeviceGetTemperatureThreshold(h, kind)),
        )
        return r.plausible("temperature_threshold", value, READING_BOUNDS["slowdown_c"])

    reading.slowdown_c = threshold(THRESHOLD_SLOWDOWN)
    reading.shutdown_c = threshold(THRESHOLD_SHUTDOWN)

    def watts(name: str, call: Callable[[], int], field_name: str) -> float | None:
        milliwatts = r.query(name, call)
        if milliwatts is None:
            return None
        return r.plausible(name, milliwatts / 1000, READING_BOUNDS[field_name])

    reading.power_w = watts("power", lambda: nvml.nvmlDeviceGetPowerUsage(h), "power_w")
    reading.power_limit_w = watts(
        "power_limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h), "power_limit_w"
    )
    reading.default_power_limit_w = watts(
        "power_limit_default",
        lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(h),
        "default_power_limit_w",
    )
    mode = r.query("persistence_mode", lambda: nvml.nvmlDeviceGetPersistenceMode(h))
    reading.persistence_mode = None if mode is None else bool(mode)
    utilization = r.query("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
    reading.utilization_pct = r.plausible(
        "utilization",
        None if utilization is None else int(utilization.gpu),
        READING_BOUNDS["utilization_pct"],
    )
    processes = r.query("processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h))
    if processes is not None:
        reading.processes = [
            GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
            for p in processes
        ]


def _open_gpu(nvml: Any, index: int) -> tuple[object, GpuReading]:
    """Handle and bus id of GPU `index` (handle None where it cannot be opened)."""
    reading = GpuReading(index)
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        raw = nvml.nvmlDeviceGetPciInfo(handle).busId
    except nvml.NVMLError as err:
        # A lost GPU still counts: it is exactly what the checks must report.
        if error_code(err) in LOST_CODES:
            reading.lost = describe_error(err)
        else:
            reading.error = f"NVML cannot open it: {describe_error(err)}"
        return None, reading
    except UnicodeDecodeError as err:
        raw = err.object
    try:
        reading.bus_id = normalize_bus_id(raw)
    except ValueError:
        # Unjoinable with sysfs, and a sign the driver's answers are garbage.
        reading.error = f"NVML reported bus id {raw!r}: not a PCI bus id"
        return None, reading
    return handle, reading


def _list_gpus(session: NvmlSession, nvml: Any, count: int) -> list[tuple[object, GpuReading]]:
    """Handle and bus id of each of the `count` GPUs, each GPU its own job under its own key
    (handle None where it cannot be opened).

    Opening a GPU that fell off the bus can hang as any of its reads can: it costs
    that GPU (`hung`, named by the bus id it had earlier in the session), never the
    listing of the others; while its call is stuck it is answered at once.
    """
    jobs = {gpu_key(index): functools.partial(_open_gpu, nvml, index) for index in range(count)}
    labels = {gpu_key(index): f"GPU {index}, opening it" for index in range(count)}
    outcomes = session.run_many(jobs, labels=labels)
    found: list[tuple[object, GpuReading]] = []
    for index in range(count):
        outcome = outcomes[gpu_key(index)]
        if isinstance(outcome, BaseException):
            reading = GpuReading(index, bus_id=session.known_bus_id(index))
            if isinstance(outcome, NvmlHungError):
                reading.hung = str(outcome)
            else:
                reading.error = f"opening it failed: {type(outcome).__name__}: {outcome}"
            found.append((None, reading))
            continue
        handle, reading = outcome
        if reading.bus_id is not None:
            session.remember_bus_id(index, reading.bus_id)
        found.append((handle, reading))
    return found


def _system(nvml: Any) -> tuple[int, str | None, int | None]:
    """How many GPUs NVML counts, and the driver versions. ValueError when the count
    itself is nonsense."""
    try:
        driver: str | None = str(nvml.nvmlSystemGetDriverVersion())
    except (nvml.NVMLError, UnicodeDecodeError):
        driver = None
    try:
        cuda: int | None = int(nvml.nvmlSystemGetCudaDriverVersion())
    except nvml.NVMLError:
        cuda = None
    return device_count(nvml), driver, cuda


ENUMERATION_JOB = "listing the GPUs"


def gpu_key(index: int) -> str:
    """The session key of every call for GPU `index` (opening it, reading it): the same
    every pass, so a GPU whose call is still stuck is answered at once, whichever read
    (checks, benchmark gate, XID listener) asks, and costs only itself."""
    return f"GPU {index}"


def gpu_label(reading: GpuReading) -> str:
    """How errors name this GPU's reads: "GPU 2 at 0000:3a:00.0"."""
    where = f" at {reading.bus_id}" if reading.bus_id else ""
    return f"GPU {reading.index}{where}"


def read_gpus(session: NvmlSession) -> GpuSnapshot:
    """Read every GPU, in parallel, each under the session's deadline. Never raises for
    anything NVML does: each failure lands in the snapshot or in a reading."""
    snapshot = GpuSnapshot()
    try:
        nvml = session.module()
    except NvmlUnavailableError as err:
        snapshot.unavailable = NvmlFailure.of(err)
        return snapshot
    except NvmlHungError as err:
        snapshot.hung = NvmlFailure.of(err)
        return snapshot
    try:
        count, snapshot.driver_version, snapshot.cuda_driver_version = session.run(
            lambda: _system(nvml), ENUMERATION_JOB
        )
    except NvmlHungError as err:
        snapshot.hung = NvmlFailure.of(err)
        return snapshot
    except (nvml.NVMLError, ValueError) as err:
        snapshot.unavailable = NvmlFailure(
            NvmlUnavailableError.QUERY_FAILED,
            f"NVML could not list the GPUs: {describe_error(err)}",
        )
        return snapshot
    found = _list_gpus(session, nvml, count)
    jobs: dict[str, Callable[[], GpuReading]] = {}
    labels: dict[str, str] = {}
    for handle, reading in found:
        if handle is not None:
            jobs[gpu_key(reading.index)] = functools.partial(_read_gpu, nvml, handle, reading)
            labels[gpu_key(reading.index)] = gpu_label(reading)
    outcomes = session.run_many(jobs, labels=labels)
    for handle, reading in found:
        outcome = outcomes.get(gpu_key(reading.index)) if handle is not None else None
        if isinstance(outcome, NvmlHungError):
            # The reading thread may still be writing into `reading`: report a
            # fresh one that holds only what enumeration found.
            hung = GpuReading(reading.index, bus_id=reading.bus_id, hung=str(outcome))
            snapshot.gpus.append(hung)
            continue
        if isinstance(outcome, BaseException):
            reading.error = f"reading it failed: {type(outcome).__name__}: {outcome}"
        snapshot.gpus.append(reading)
    return snapshot


def resolve_lost_bus_ids(session: NvmlSession, snapshot: GpuSnapshot, bus_ids: list[str]) -> None:
    """Give lost GPUs that NVML could not name their bus id.

    A GPU lost before this run answers GPU_IS_LOST to every call, its PCI info
    included. Asking NVML for each sysfs GPU it did not list, by bus id, tells
    lost (GPU_IS_LOST) from absent (NOT_FOUND). NVML numbers GPUs in PCI bus
    order, so the lost readings and the lost bus ids pair up in that order, up to
    the first bus id whose lookup did not answer (hung): beyond it the order is unknown.
    """
    nameless = [gpu for gpu in snapshot.gpus if gpu.bus_id is None and gpu.lost is not None]
    listed = {gpu.bus_id for gpu in snapshot.gpus}
    unlisted = [bus for bus in sorted(bus_ids) if bus not in listed]
    if not nameless or not unlisted or not snapshot.usable:
        return

    try:
        nvml = session.module()
    except (NvmlHungError, NvmlUnavailableError):
        return

    def is_lost(bus: str) -> bool:
        try:
            nvml.nvmlDeviceGetHandleByPciBusId(bus)
        except nvml.NVMLError as err:
            return error_code(err) in LOST_CODES
        return False

    # One job per bus id: a lookup stuck on one GPU leaves the GPUs before it named.
    outcomes = session.run_many(
        {f"looking up the GPU at {bus}": functools.partial(is_lost, bus) for bus in unlisted}
    )
    lost = []
    for bus in unlisted:
        outcome = outcomes[f"looking up the GPU at {bus}"]
        if not isinstance(outcome, bool):
            break
        if outcome:
            lost.append(bus)
    for gpu, bus in zip(sorted(nameless, key=lambda g: g.index), lost, strict=False):
        gpu.bus_id = bus


class GpuHistory:
    """The previous reading of each GPU, so checks can judge counters by their rate.

    A one-shot `nodecheck check` starts with an empty history; the agent keeps
    one for its lifetime. Keyed by bus id, the key everything else joins on.
    """

    def __init__(self) -> None:
        self._previous: dict[str, GpuReading] = {}
        self._lock = threading.Lock()

    def exchange(self, snapshot: GpuSnapshot) -> dict[str, GpuReading]:
        """The readings before `snapshot`, by bus id; `snapshot` becomes the new previous.

        A GPU lost since the last pass may no longer tell NVML its bus id;
        within one NVML session its index is stable, so the id is taken from
        the previous reading of that index.
        """
        with self._lock:
            previous = dict(self._previous)
            by_index = {gpu.index: gpu for gpu in previous.values()}
            for gpu in snapshot.gpus:
                if gpu.bus_id is None and gpu.index in by_index:
                    gpu.bus_id = by_index[gpu.index].bus_id
                if gpu.bus_id and gpu.readable:
                    self._previous[gpu.bus_id] = gpu
            return previous


def counter_rate(current: int | None, previous: int | None, seconds: float) -> float | None:
    """Increase per second between two readings of a counter.

    None when either reading is missing, no time passed, or the counter went
    down: volatile counters restart at zero when the driver reloads or the GPU
    is reset, and a rate across that would be meaningless.
    """
    if current is None or previous is None or seconds <= 0 or current < previous:
        return None
    return (current - previous) / seconds


# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build ..."
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 ..."
_MODULE_VERSION = re.compile(r"^NVRM version:.*?Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


def parse_kernel_module_version(text: str) -> str | None:
    """The loaded nvidia.ko version from /proc/driver/nvidia/version."""
    for line in text.splitlines():
        if match := _MODULE_VERSION.match(line):
            return match.group(1)
    return None


def driver_gpu_folders(fs: NodeFS) -> dict[str, str]:
    """The folders of /proc/driver/nvidia/gpus, by the bus id each is named for (the
    folder's name as the driver wrote it); {} without the folder. ReadError when it
    cannot be listed."""
    folders = {}
    for name in list_dir(fs.proc("driver", "nvidia", "gpus")):
        # Anything else in the folder is not a GPU the driver exposes.
        with contextlib.suppress(ValueError):
            folders[normalize_bus_id(name)] = name
    return folders


def read_driver_gpus(fs: NodeFS) -> set[str] | None:
    """Bus ids in /proc/driver/nvidia/gpus: the GPUs the nvidia driver exposes here.

    In a container, libnvidia-container mounts only the assigned GPUs' folders
    there (mount_procfs_gpu), while sysfs shows every GPU of the host. None
    when the folder is absent (no driver loaded).
    """
    if not fs.proc("driver", "nvidia", "gpus").is_dir():
        return None
    return set(driver_gpu_folders(fs))


def read_kernel_module_version(fs: NodeFS) -> str | None:
    """None when the file is absent (no driver, or a container without it)."""
    text = read_optional_text(fs.proc("driver", "nvidia", "version"))
    return None if text is None else parse_kernel_module_version(text)


@record
class GpuActivity:
    """What the benchmark gate needs of a GPU, read quickly and often."""

    index: int
    bus_id: str | None
    utilization_pct: int | None
    processes: tuple[GpuProcess, ...]
    memory_free: int | None
    problem: str | None  # why this GPU could not be read (lost, no permission)


def read_gpu_activity(session: NvmlSession) -> list[GpuActivity]:
    """Utilization, compute processes and free memory of every GPU, each GPU its own job.

    A GPU that does not answer (or whose earlier call is still stuck) costs only
    that GPU: its GpuActivity names the problem. NvmlUnavailableError or
    NvmlHungError when NVML cannot answer at all (init, enumeration).
    """
    nvml = session.module()
    try:
        count = session.run(lambda: device_count(nvml), ENUMERATION_JOB)
    except (nvml.NVMLError, ValueError) as err:
        raise NvmlUnavailableError(
            NvmlUnavailableError.QUERY_FAILED,
            f"NVML could not list the GPUs: {describe_error(err)}",
        ) from err
    found = _list_gpus(session, nvml, count)

    def read(handle: object, reading: GpuReading) -> GpuActivity:
        utilization = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        processes = tuple(
            GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
            for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        )
        free = int(nvml.nvmlDeviceGetMemoryInfo(handle).free)
        return GpuActivity(reading.index, reading.bus_id, utilization, processes, free, None)

    opened = [(handle, reading) for handle, reading in found if handle is not None]
    jobs: dict[str, Callable[[], GpuActivity]] = {
        gpu_key(reading.index): functools.partial(read, handle, reading)
        for handle, reading in opened
    }
    labels = {gpu_key(reading.index): gpu_label(reading) for _, reading in opened}
    outcomes = session.run_many(jobs, labels=labels)
    activity = []
    for handle, reading in found:
        outcome = outcomes.get(gpu_key(reading.index)) if handle is not None else None
        if isinstance(outcome, GpuActivity):
            activity.append(outcome)
            continue
        if outcome is None:
            problem = reading.lost or reading.hung or reading.error or "cannot be opened"
        elif isinstance(outcome, nvml.NVMLError | NvmlHungError):
            problem = describe_error(outcome)
        else:
            problem = f"{type(outcome).__name__}: {outcome}"
        activity.append(GpuActivity(reading.index, reading.bus_id, None, (), None, problem))
    return activity
