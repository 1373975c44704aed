"""PCIe Advanced Error Reporting (AER): the kernel's per-device error counters in sysfs,
and the error groups it writes to the kernel log.

The counters (Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats, since Linux
4.19) are under every AER-capable device:

    aer_dev_correctable     aer_dev_fatal / aer_dev_nonfatal
      RxErr 2                 Undefined 0
      BadTLP 0                DLP 0
      ...                     SDES 1
      TOTAL_ERR_COR 2         ...
                              TOTAL_ERR_FATAL 1

one line per error the device's AER capability has a bit for ("<name> <count>", the
name the kernel's short one, drivers/pci/pcie/aer.c aer_correctable_error_string and
aer_uncorrectable_error_string, or the long one of the ABI's sample), then the number of
error messages of that kind (the errors of one message may be several). A root port (or
a root complex event collector) also has aer_rootport_total_err_cor, _fatal and
_nonfatal: the error messages reported to it by every device below it. The counters
are errors "as seen by" the device: an endpoint's bad link often counts at its link
partner (the switch or root port above it), which is why nodecheck reads every device
of a GPU's and an RDMA NIC's path, root port to endpoint. They count from boot.

The kernel log's groups (drivers/pci/pcie/aer.c aer_print_error and
aer_print_port_info; the words changed over the years, all of them are read):

    pcieport 0000:00:03.1: AER: Corrected error received: 0000:03:00.0
    pcieport 0000:00:03.1: AER: Correctable error message received from 0000:03:00.0
    pcieport 0000:00:1c.5: AER: Multiple Corrected error received: id=00e5
    nvidia 0000:03:00.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Transmitt...
    nvidia 0000:03:00.0:   device [10de:2330] error status/mask=00001000/0000e000
    nvidia 0000:03:00.0:    [12] Timeout
    pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:00:01.0
    pcieport 0000:00:01.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction
        Layer, (Receiver ID)                                       (one line)
    pcieport 0000:00:01.0:    [ 5] Surprise Down Error    (First)

(since 5.x each detail line may carry "AER: " after the device, and older kernels
print the long names). A group is one error seen by the device its "PCIe Bus Error"
line names; the "received" line before it names the port that reported it. Where the
decoded "[bit] Name" lines were lost (printk's rate limit), the status word, less its
masked bits, names them: the bits are the PCI Express Base Specification's
(Uncorrectable and Correctable Error Status registers, sections 7.8.4.2 and 7.8.4.5).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, TypeVar

from nodecheck.checks.node.fs import NodePath, ReadError, read_optional_text
from nodecheck.checks.node.kernel_log import LineClock, cut_message, every_line_counts
from nodecheck.checks.node.net import parse_counter
from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.record import record

if TYPE_CHECKING:
    from nodecheck.checks.node.inventory import Inventory
    from nodecheck.checks.node.pci import PciDevice

T = TypeVar("T")

CORRECTABLE = "correctable"
NONFATAL = "nonfatal"
FATAL = "fatal"
KINDS = (CORRECTABLE, NONFATAL, FATAL)

# Each kind's files: the device's own counters, and a root port's messages received.
DEVICE_FILES = {
    CORRECTABLE: "aer_dev_correctable",
    NONFATAL: "aer_dev_nonfatal",
    FATAL: "aer_dev_fatal",
}
ROOT_PORT_FILES = {
    CORRECTABLE: "aer_rootport_total_err_cor",
    NONFATAL: "aer_rootport_total_err_nonfatal",
    FATAL: "aer_rootport_total_err_fatal",
}

# Bit: (the kernel's short name, the long name older kernels print). PCI Express Base
# Specification, Correctable Error Status register.
CORRECTABLE_BITS = {
    0: ("RxErr", "Receiver Error"),
    6: ("BadTLP", "Bad TLP"),
    7: ("BadDLLP", "Bad DLLP"),
    8: ("Rollover", "REPLAY_NUM Rollover"),
    12: ("Timeout", "Replay Timer Timeout"),
    13: ("NonFatalErr", "Advisory Non-Fatal"),
    14: ("CorrIntErr", "Corrected Internal Error"),
    15: ("HeaderOF", "Header Log Overflow"),
}
# ... and the Uncorrectable Error Status register.
UNCORRECTABLE_BITS = {
    0: ("Undefined", "Undefined"),
    4: ("DLP", "Data Link Protocol"),
    5: ("SDES", "Surprise Down Error"),
    12: ("TLP", "Poisoned TLP"),
    13: ("FCP", "Flow Control Protocol"),
    14: ("CmpltTO", "Completion Timeout"),
    15: ("CmpltAbrt", "Completer Abort"),
    16: ("UnxCmplt", "Unexpected Completion"),
    17: ("RxOF", "Receiver Overflow"),
    18: ("MalfTLP", "Malformed TLP"),
    19: ("ECRC", "ECRC"),
    20: ("UnsupReq", "Unsupported Request"),
    21: ("ACSViol", "ACS Violation"),
    22: ("UncorrIntErr", "Uncorrectable Internal Error"),
    23: ("BlockedTLP", "MC Blocked TLP"),
    24: ("AtomicOpBlocked", "AtomicOp Egress Blocked"),
    25: ("TLPBlockedErr", "TLP Prefix Blocked Error"),
    26: ("PoisonTLPBlocked", "Poisoned TLP Egress Blocked"),
}
# The corrected errors of the link itself: a replay (Bad TLP, Bad DLLP, the replay timer,
# REPLAY_NUM rolling over) or the receiver error behind one.
LINK_ERRORS = frozenset({"RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout"})
# A long name (or the kernel's short one) -> the short one, so both eras compare alike.
SHORT_NAMES = {
    name.lower(): short
    for bits in (CORRECTABLE_BITS, UNCORRECTABLE_BITS)
    for short, long in bits.values()
    for name in (short, long)
}
# The ABI document's sample spells REPLAY_NUM so, as Linux 2.6's table did.
SHORT_NAMES["relay_num rollover"] = "Rollover"


def short_name(name: str) -> str:
    """ "Replay Timer Timeout" -> "Timeout"; a name the tables lack is kept as written."""
    return SHORT_NAMES.get(name.strip().lower(), name.strip())


def status_errors(status: int, mask: int, kind: str) -> tuple[str, ...]:
    """The errors a status word names, its masked bits left out, as the kernel prints
    them ("bit 9" for one the specification reserves)."""
    bits = CORRECTABLE_BITS if kind == CORRECTABLE else UNCORRECTABLE_BITS
    unmasked = status & ~mask
    return tuple(
        bits[bit][0] if bit in bits else f"bit {bit}" for bit in range(32) if unmasked >> bit & 1
    )


@record
class AerCounts:
    """One aer_dev_* file: the errors it counts by (short) name, those above 0, and its
    TOTAL_ERR_ line: the error messages of that kind, None when the file had none."""

    by_error: dict[str, int]
    total: int | None


def parse_aer_counts(text: str) -> AerCounts:
    """An aer_dev_* file's text; ValueError for a line that is no "<name> <count>"."""
    by_error: dict[str, int] = {}
    total = None
    for line in text.splitlines():
        name, _, count = line.rpartition(" ")
        if count == "0" and name.strip() and not name.startswith("TOTAL_ERR_"):
            continue  # most lines: an error of the kernel's table, at 0, named as it is
        if not line.strip():
            continue
        name, _, count = line.rstrip().rpartition(" ")
        if not name.strip() or not count.isdigit() or len(count) > 20:
            raise ValueError(f"not '<error> <count>': {line!r}")
        if name.startswith("TOTAL_ERR_"):
            total = int(count)
        elif int(count):  # the kernel lists every error its table names, most at 0
            by_error[short_name(name)] = int(count)
    return AerCounts(by_error, total)


@record
class DeviceAer:
    """One reading of a device's AER counters. `counts` has the kinds whose file was read
    (none: the device has no AER capability, or the kernel is older than 4.19); `received`
    a root port's messages received by kind; `problems` why a file could not be read."""

    bdf: str
    read_at: float
    counts: dict[str, AerCounts] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)

    def link_errors(self) -> int | None:
        """The corrected link errors the device saw (LINK_ERRORS: each a replay, or the
        receiver error behind one); its corrected total where the file names none of its
        errors; None when it was not read."""
        counts = self.counts.get(CORRECTABLE)
        if counts is None:
            return None
        if counts.total and not counts.by_error:
            return counts.total
        return sum(count for name, count in counts.by_error.items() if name in LINK_ERRORS)

    def total(self, kind: str) -> int | None:
        """The errors of `kind` the device saw: its TOTAL_ERR_ line, else the sum of its
        errors (a file without the line); None when the file was not read."""
        counts = self.counts.get(kind)
        if counts is None:
            return None
        return counts.total if counts.total is not None else sum(counts.by_error.values())


def read_device_aer(bdf: str, sysfs_dir: NodePath, root_port: bool = True) -> DeviceAer:
    """The AER counters of the device whose sysfs folder is `sysfs_dir`; a root port's
    messages received too, where `root_port` (only root ports and event collectors have
    those files: they are not looked for on the others)."""
    reading = DeviceAer(bdf, time.time())
    for kind, name in DEVICE_FILES.items():
        counts = _read_file(f"{sysfs_dir}/{name}", parse_aer_counts, name, reading.problems)
        if counts is not None:
            reading.counts[kind] = counts
    for kind, name in ROOT_PORT_FILES.items() if root_port else ():
        received = _read_file(f"{sysfs_dir}/{name}", parse_counter, name, reading.problems)
        if received is not None:
            reading.received[kind] = received
    return reading


def _read_file(
    path: str, parse: Callable[[str], T], name: str, problems: dict[str, str]
) -> T | None:
    """One counter file parsed; None when it is absent, or when it could not be read or
    parsed, which `problems[name]` then says."""
    try:
        text = read_optional_text(path)
        return None if text is None else parse(text)
    except ReadError as err:
        problems[name] = str(err)
    except ValueError as err:
        problems[name] = f"{path}: {err}"
    return None


def watched_endpoints(inventory: Inventory) -> list[PciDevice]:
    """The endpoints whose paths are read and judged: the GPUs and the RDMA NICs."""
    nics = [nic.pci for nic in inventory.nics if nic.is_rdma]
    return sorted([*inventory.gpus, *nics], key=lambda device: device.bdf)


@record
class AerReading:
    """The AER counters of every device on the paths of the node's GPUs and RDMA NICs."""

    devices: list[DeviceAer] = field(default_factory=list)


def read_aer(paths: Mapping[str, NodePath], root_ports: frozenset[str]) -> AerReading:
    """The counters of each device of `paths` (bus id -> its sysfs folder), by bus id;
    `root_ports` those whose messages received are read too."""
    return AerReading(
        [read_device_aer(bdf, folder, bdf in root_ports) for bdf, folder in sorted(paths.items())]
    )


class AerHistory:
    """The previous AER reading of each device, so the agent judges the counters by their
    rate (as PortCounterHistory does for the RDMA ports). A one-shot run starts empty.

    A baseline is kept until it is `min_age_s` old: the agent runs the check again at
    once after an XID, and runs seconds apart must not each start the window over (a
    link erring steadily would never show a rate) nor make a few errors one."""

    def __init__(self, min_age_s: float = 60.0) -> None:
        self.min_age_s = min_age_s
        self._previous: dict[str, DeviceAer] = {}
        self._lock = threading.Lock()

    def exchange(self, readings: list[DeviceAer]) -> dict[str, DeviceAer]:
        """The baselines of these readings' devices, by bus id; a reading becomes its
        device's baseline once the one kept is `min_age_s` old (or later than it: the
        clock was set back)."""
        with self._lock:
            previous = dict(self._previous)
            for reading in readings:
                kept = self._previous.get(reading.bdf)
                age = None if kept is None else reading.read_at - kept.read_at
                if reading.counts and (age is None or age >= self.min_age_s or age < 0):
                    self._previous[reading.bdf] = reading
            return previous


# --- the kernel log ---------------------------------------------------------------


@record
class AerEvent:
    """One error group of the kernel log: the device that saw the error (`bdf`, whose AER
    registers hold it), its kind (correctable, nonfatal, fatal), the layer, the errors by
    short name, when (`at`, wall-clock seconds, None when the line gives no time), the
    port whose "received" line came before it, and the "PCIe Bus Error" line's text."""

    bdf: str
    kind: str
    layer: str
    errors: tuple[str, ...]
    at: float | None
    message: str
    reported_by: str = ""
    clock: str = field(default="", compare=False)


# "<driver> <bus id>: " before each line of a group: pcieport, nvidia, mlx5_core, nvme...
_DEVICE = (
    r"(?<![\w.-])[\w.-]{1,40} ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): (?:AER: )?"
)
_SEVERITY = (
    r"(Corrected|Correctable|Uncorrected \((?:Non-)?Fatal\)|Uncorrectable \((?:Non-)?Fatal\))"
)
RECEIVED_LINE = LazyPattern(
    _DEVICE + r"(?:AER: )?(?:Multiple )?" + _SEVERITY + r" error (?:message )?received"
)
BUS_ERROR_LINE = LazyPattern(
    _DEVICE + r"PCIe Bus Error: severity=" + _SEVERITY + r",\s*type=([^,]{1,40})"
)
STATUS_LINE = LazyPattern(
    _DEVICE + r"\s*device \[[0-9a-fA-F]{4}:[0-9a-fA-F]{4}\] error status/mask="
    r"([0-9a-fA-F]{1,8})/([0-9a-fA-F]{1,8})"
)
# One `\s+` before "(First)", never two runs of optional blanks side by side: a line of
# thousands of blanks would make those try every split of them.
ERROR_LINE = LazyPattern(_DEVICE + r"\s*\[\s*(\d{1,2})\] ([^(]{1,60}?)(?:\s+\(First\))?\s*$")
# printk writes at most 1 KiB a line (LOG_LINE_MAX); the patterns see no more than this.
LINE_LIMIT = 4096


def severity_kind(severity: str) -> str:
    """ "Uncorrected (Non-Fatal)" or "Uncorrectable (Non-Fatal)" -> nonfatal, and so on."""
    if severity.startswith("Correct"):
        return CORRECTABLE
    return NONFATAL if "Non-Fatal" in severity else FATAL


def _device_bus_id(text: str) -> str:
    return text.lower()


class _Group:
    """A group being read: its "PCIe Bus Error" line's facts, its status and its errors."""

    def __init__(self, event: AerEvent) -> None:
        self.event = event
        self.named: list[str] = []
        self.from_status: tuple[str, ...] = ()

    def done(self) -> AerEvent:
        errors = tuple(dict.fromkeys(self.named)) or self.from_status
        return AerEvent(
            self.event.bdf,
            self.event.kind,
            self.event.layer,
            errors,
            self.event.at,
            self.event.message,
            self.event.reported_by,
            self.event.clock,
        )


def _same_moment(at: float | None, other: float | None) -> bool:
    """Within a second of each other (both unknown counts as the same)."""
    if at is None or other is None:
        return at is None and other is None
    return abs(at - other) <= 1.0


def parse_aer_events(text: str, boot_time: float | None, now: float) -> list[AerEvent]:
    """The AER error groups of kernel log text (kernel_log's forms), in the order logged.

    A group's status and "[bit]" lines follow its "PCIe Bus Error" line at the same moment
    (one interrupt's handling); a line of its device at another moment, or after another
    "received" line, belongs to no group still open."""
    clock = LineClock(boot_time, now)
    every_line = every_line_counts(text)
    groups: list[_Group] = []
    open_groups: dict[str, _Group] = {}  # by the device logging them: its latest group
    # The port of the latest "received" line and its time: the groups it announces follow
    # it at the same time, so a later group is not its.
    reporter, reported_at = "", None
    for whole in text.splitlines():
        line = whole[:LINE_LIMIT]
        # Cheap tests first: a kernel log is megabytes, and few of its lines are AER's.
        relevant = "AER" in line or "PCIe Bus Error" in line
        of_open = bool(open_groups) and "] " in line and _names_open(line, open_groups)
        if not relevant and not of_open:
            if every_line:
                clock.stamp(line)
            continue
        if match := BUS_ERROR_LINE.search(line):
            stamp = clock.stamp(line[: match.start()])
            event = AerEvent(
                _device_bus_id(match.group(1)),
                severity_kind(match.group(2)),
                match.group(3).strip(),
                (),
                stamp.at,
                cut_message(line[match.start() :].strip()),
                reporter if _same_moment(stamp.at, reported_at) else "",
                stamp.form,
            )
            open_groups[event.bdf] = _Group(event)
            groups.append(open_groups[event.bdf])
            continue
        if match := RECEIVED_LINE.search(line):
            reporter = _device_bus_id(match.group(1))
            reported_at = clock.stamp(line[: match.start()]).at
            open_groups.clear()  # a new interrupt: its own groups follow
            continue
        match = STATUS_LINE.search(line) or ERROR_LINE.search(line)
        if match is None:
            if every_line:
                clock.stamp(line)
            continue
        at = clock.stamp(line[: match.start()]).at
        group = open_groups.get(_device_bus_id(match.group(1)))
        if group is None:
            continue
        if not _same_moment(at, group.event.at):
            del open_groups[group.event.bdf]  # a line of a later moment: the group ended
            continue
        if match.re.pattern == STATUS_LINE.pattern:
            status, mask = int(match.group(2), 16), int(match.group(3), 16)
            group.from_status = status_errors(status, mask, group.event.kind)
        else:
            group.named.append(short_name(match.group(3)))
    return [group.done() for group in groups]


def _names_open(line: str, open_groups: dict[str, _Group]) -> bool:
    """Whether `line` names a device whose group is open (the kernel prints bus ids in
    lower case; a capital one is compared as such too)."""
    lowered = line.lower()
    return any(bdf in lowered for bdf in open_groups)
