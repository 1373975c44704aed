"""NVSwitch SXids: the NVSwitch driver's error reports in the kernel log, and their catalog.

nvidia-nvswitch writes each error as (NVIDIA/open-gpu-kernel-modules,
src/common/nvswitch/kernel/inc/common_nvswitch.h, NVSWITCH_PRINT_SXID):

    nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted
        PRIV error (First)                                 (one line)
    nvidia-nvswitch0: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 44 sourcetrack timeout error

and may follow one with lines of detail under the same SXid, which are not
errors of their own ("..., 12028, Severity 0 Engine instance 32 Sub-engine
instance 00", "..., 12028, Data {0x00000000, ...}"). A detail line whose headline is not
in the log (the ring buffer wrapped past it, or printk's rate limit dropped it) still
tells that the SXid happened: it counts as that SXid, its severity the catalog's.

The catalog holds every code of NVIDIA's NVSentinel mapping (NVIDIA/NVSentinel,
distros/kubernetes/nvsentinel/charts/nvswitch-health-monitor/sxiderrorsmapping.csv:
each code's NVSWITCH_ERR_* name, its action and FATAL or NONFATAL; checks/node/
sxid_catalog.py), with the words of the Fabric Manager User Guide (docs.nvidia.com/
datacenter/tesla/fabric-manager-user-guide/, "NVSwitch SXid Errors": non-fatal, fatal,
always fatal and other notable SXids; DU-09883-001, as leptonai/gpud transcribes it in
components/accelerator/nvidia/sxid/sxid.go) where the guide names the code. Where the
two disagree on a code's kind NVSentinel wins: it is NVIDIA's newer and machine-read
source, keyed by the driver's own error names, where the guide's tables are prose of an
older driver; its RESET_FABRIC is the guide's "always fatal" (the whole fabric resets, so
the host restarts), its other FATAL actions (a GPU reset, the NVLink workflow, the
link's signal) are fatal to the partition. The codes that moved are listed under
RECONCILED. A fatal SXid is fatal to the partition using that port: its
GPUs and NVSwitches need a reset (the guide: restart the guest VM, or reset the GPUs and
NVSwitches); an always-fatal one is fatal to the whole fabric: the host must restart.
The severity the line writes ("Fatal", "Non-fatal") comes first, as the running driver's
own word; the catalog's is used when the line says none (an older driver, or a detail
line whose headline was lost).
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import field

from nodecheck.checks.node.kernel_log import LineClock, cut_message, every_line_counts
from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.record import record


class SxidAction(str, enum.Enum):
    """NVSentinel's action for an SXid, in its own words."""

    IGNORE = "IGNORE"
    RESET_FABRIC = "RESET_FABRIC"  # the whole NVLink fabric: the host restarts
    RESET_GPU = "RESET_GPU"
    NVLINK_WORKFLOW = "WORKFLOW_NVLINK_POTENTIALY_FATAL_ERR"  # NVSentinel's spelling
    LINK_SI = "INVESTIGATE_LINK_SI"  # the link's signal integrity
    FIELDDIAG = "RUN_FIELDDIAG"
    UNEXPECTED = "UNEXPECTED_ERR_REPORT_ISSUE"
    REPORT_ISSUE = "REPORT_ISSUE"
    LINK_CABLES = "CHECK_LINK_MECHANICAL_CONNECTIONS"
    FM_CONFIG = "CHECK_FM_CONFIG"
    THERMALS = "CHECK_THERMALS"

    @property
    def fatal(self) -> bool:
        return self is not SxidAction.IGNORE


class SxidKind(str, enum.Enum):
    NONFATAL = "non-fatal"
    FATAL = "fatal"
    ALWAYS_FATAL = "always fatal"
    THERMAL = "thermal event"
    UNKNOWN = "not in the catalog"


@record
class SxidInfo:
    """An SXid code as the catalog knows it: the guide's words for it where the guide
    has some, else the driver's error name; NVSentinel's action ("" where NVSentinel
    does not list the code)."""

    name: str
    kind: SxidKind
    action: str = ""


# The Fabric Manager guide's tables as gpud transcribes them: each code's words and the
# guide's kind. Where NVSentinel's mapping gives another kind, NVSentinel's is the
# catalog's (RECONCILED); this is the guide's, kept to say where the two part.
_GUIDE: dict[int, tuple[str, SxidKind]] = {
    **{
        code: (name, SxidKind.NONFATAL)
        for code, name in {
            11004: "ingress invalid ACL",
            11012: "single bit ECC error",
            11021: "single bit ECC error",
            11022: "single bit ECC error",
            11023: "single bit ECC error",
            12021: "single bit ECC error",
            12023: "single bit ECC error",
            12028: "egress non-posted PRIV error",
            15008: "single bit ECC error",
            15011: "single bit ECC error",
            19049: "single bit ECC error",
            19055: "single bit ECC error",
            19057: "single bit ECC error",
            19059: "single bit ECC error",
            19062: "single bit ECC error",
            19065: "single bit ECC error",
            19068: "single bit ECC error",
            19071: "single bit ECC error",
            19084: "AN1 heartbeat timeout",
            20001: "TX replay error",
            20009: "RX short error rate",
            20012: "broken or inconsistent connection",
            22013: "minion link DLREQ interrupt",
            24001: "single bit ECC error",
            24002: "single bit ECC error",
            24003: "single bit ECC error",
        }.items()
    },
    **{
        code: (name, SxidKind.FATAL)
        for code, name in {
            10001: "host PRIV error",
            10002: "host PRIV timeout",
            11001: "ingress invalid command",
            11009: "ingress invalid VCSet",
            11013: "ingress header DBE",
            11018: "ingress RID DBE",
            11019: "ingress RLAN DBE",
            11020: "ingress control parity",
            12001: "egress crossbar overflow",
            12002: "egress packet route",
            12022: "egress input ECC DBE error",
            12024: "egress output ECC DBE error",
            12025: "egress credit overflow",
            12026: "egress destination request ID error",
            12027: "egress destination response ID error",
            12030: "egress control parity error",
            12031: "egress credit parity error",
            12032: "egress flit type mismatch",
            14017: "TS ATO timeout",
            15001: "route buffer over/underflow",
            15006: "route transdone over/underflow",
            15009: "route GLT DBE",
            15010: "route parity",
            15012: "route incoming DBE",
            15013: "route credit parity",
            19047: "NCISOC HDR ECC DBE error",
            19048: "NCISOC DAT ECC DBE error",
            19054: "HDR RAM ECC DBE error",
            19056: "DAT0 RAM ECC DBE error",
            19058: "DAT1 RAM ECC DBE error",
            19060: "CREQ RAM HDR ECC DBE error",
            19061: "CREQ RAM DAT ECC DBE error",
            19063: "response RAM HDR ECC DBE error",
            19064: "response RAM DAT ECC DBE error",
            19066: "COM RAM HDR ECC DBE error",
            19067: "COM RAM DAT ECC DBE error",
            19069: "RSP1 RAM HDR ECC DBE error",
            19070: "RSP1 RAM DAT ECC DBE error",
            20034: "LTSSM fault up",
            22012: "minion link NA interrupt",
            24004: "sourcetrack TCEN0 crumbstore DBE",
            24005: "sourcetrack TCEN0 TD crumbstore DBE",
            24006: "sourcetrack TCEN1 crumbstore DBE",
            24007: "sourcetrack timeout error",
        }.items()
    },
    **{
        code: (name, SxidKind.ALWAYS_FATAL)
        for code, name in {
            10003: "host unhandled interrupt",
            12020: "egress sequence ID error",
            22003: "minion halt",
            22011: "minion exterror",
            23001: "ingress SRC-VC buffer overflow",
            23002: "ingress SRC-VC buffer underflow",
            23003: "egress DST-VC credit overflow",
            23004: "egress DST-VC credit underflow",
            23005: "ingress packet burst error",
            23006: "ingress packet sticky error",
            23007: "possible bubbles at ingress",
            23008: "ingress packet invalid dst error",
            23009: "ingress packet parity error",
            23010: "ingress SRC-VC buffer overflow",
            23011: "ingress SRC-VC buffer underflow",
            23012: "egress DST-VC credit overflow",
            23013: "egress DST-VC credit underflow",
            23014: "ingress packet burst error",
            23015: "ingress packet sticky error",
            23016: "possible bubbles at ingress",
            23017: "ingress credit parity error",
        }.items()
    },
    # Not fatal to the fabric, but "system cooling might be insufficient" (the guide).
    10004: ("thermal event start", SxidKind.THERMAL),
    10005: ("thermal event end", SxidKind.THERMAL),
}

# A thermal event's end (NVSentinel: IGNORE) is a thermal event of the day all the same:
# the guide counts 10005 with 10004, and the OSFP transceivers' warning and over-temperature
# ends are their starts' pairs.
_THERMAL_ENDS = frozenset({10005, 28002, 28004})
# CHECK_THERMALS codes where the transceiver shut down (over-temperature, its heartbeat):
# its NVLinks went down with it, fatal to the partition, not a warning.
_THERMAL_SHUTDOWNS = frozenset({28003, 28005})


def nvsentinel_kind(code: int, action: SxidAction) -> SxidKind:
    """The catalog's kind of a code from NVSentinel's action: RESET_FABRIC is the guide's
    "always fatal" (the whole fabric resets, so the host restarts); CHECK_THERMALS a
    thermal event (one that starts and ends by itself, as the guide's 10004 and 10005),
    but for an OSFP transceiver's shutdown, fatal; IGNORE non-fatal; every other action
    (a GPU reset, the NVLink workflow, the link's signal or cables, field diagnostics, a
    report to NVIDIA, Fabric Manager's configuration) is FATAL in the mapping, fatal to
    the partition using that port."""
    if action is SxidAction.RESET_FABRIC:
        return SxidKind.ALWAYS_FATAL
    if code in _THERMAL_SHUTDOWNS:
        return SxidKind.FATAL
    if action is SxidAction.THERMALS or code in _THERMAL_ENDS:
        return SxidKind.THERMAL
    if action is SxidAction.IGNORE:
        return SxidKind.NONFATAL
    return SxidKind.FATAL


# Where the guide (as gpud transcribes it) and NVSentinel's mapping part: the guide's kind,
# then NVSentinel's row. NVSentinel's is the catalog's (see the module's docstring);
# tests/checks/test_sxid.py holds this list to exactly the codes where the two differ.
RECONCILED: dict[int, str] = {
    10001: "fatal in the guide; NVSentinel: HOST_PRIV_ERROR, IGNORE, NONFATAL",
    10002: "fatal in the guide; NVSentinel: HOST_PRIV_TIMEOUT, IGNORE, NONFATAL",
    11004: "non-fatal in the guide; NVSentinel: INGRESS_ACLFAIL, CHECK_FM_CONFIG, FATAL",
    12028: "non-fatal in the guide; NVSentinel: EGRESS_PRIVRSPERR, RESET_FABRIC, FATAL",
    12032: "fatal in the guide; NVSentinel: NXBAR_FLITTYPE_MISMATCH_ERR, RESET_FABRIC",
    14017: "fatal in the guide; NVSentinel: TSTATE_ATO_ERR, RESET_FABRIC",
    19084: "non-fatal in the guide; NVSentinel: AN1_HEARTBEAT_TIMEOUT_ERR, RESET_FABRIC",
    20009: "non-fatal in the guide; NVSentinel: RX_SHORT_ERROR_RATE, "
    "CHECK_LINK_MECHANICAL_CONNECTIONS, FATAL",
    20012: "non-fatal in the guide; NVSentinel: RX_CRC_COUNTER, "
    "CHECK_LINK_MECHANICAL_CONNECTIONS, FATAL",
    23009: "always fatal in the guide; NVSentinel: TILE_INGRESS_PKT_PARITY_ERROR, "
    "WORKFLOW_NVLINK_POTENTIALY_FATAL_ERR (the partition's)",
    23017: "always fatal in the guide; NVSentinel: TILEOUT_EGRESS_CDT_PARITY_ERROR, "
    "WORKFLOW_NVLINK_POTENTIALY_FATAL_ERR (the partition's)",
}


def guide_kind(code: int) -> SxidKind | None:
    """The Fabric Manager guide's kind of `code`; None where the guide does not list it."""
    listed = _GUIDE.get(code)
    return None if listed is None else listed[1]


@functools.cache
def sxid_catalog() -> dict[int, SxidInfo]:
    """Every code the guide or NVSentinel names, with its kind: made on first use (a
    kernel log read without an SXid never pays for its 400 entries)."""
    from nodecheck.checks.node.sxid_catalog import NVSENTINEL_SXIDS

    catalog = {code: SxidInfo(name, kind) for code, (name, kind) in _GUIDE.items()}
    for code, (driver_name, action) in NVSENTINEL_SXIDS.items():
        guide = _GUIDE.get(code)
        name = guide[0] if guide else driver_name or "unnamed"
        catalog[code] = SxidInfo(name, nvsentinel_kind(code, action), action.value)
    return catalog


def classify_sxid(sxid: int) -> SxidInfo:
    return sxid_catalog().get(sxid, SxidInfo("unknown", SxidKind.UNKNOWN))


@record
class SxidEvent:
    """One SXid on one NVSwitch. `fatal` is the line's own word (None: it says neither);
    `at` wall-clock seconds or None; `clock` how `at` was read."""

    bus_id: str
    sxid: int
    fatal: bool | None
    at: float | None
    message: str
    switch: str = ""  # the driver's name for it: "nvswitch3"
    clock: str = field(default="", compare=False)


# "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 ..." (the
# driver prints the domain, bus, device and function; older ones may omit "PCI:"). The
# switch's number and the SXid are a few digits: longer is no line the driver wrote.
SXID_LINE = re.compile(
    r"nvidia-(nvswitch\d{0,4}): SXid \((?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):"
    r"([0-9a-fA-F]{2})(?:\.([0-7]))?\)\s*:\s*(\d{1,9})(?!\d)\s*,?\s*"
)
SEVERITY_WORD = LazyPattern(r"^(Non-fatal|Nonfatal|Fatal)\b,?\s*", re.IGNORECASE)
# The detail lines under an SXid: not errors of their own.
DETAIL_LINE = LazyPattern(r"^(?:Severity \d+ Engine instance|Data \{)")


def sxid_bus_id(domain: str, bus: str, device: str, function: str | None) -> str:
    """The NVSwitch's bus id as sysfs names it (0000:05:00.0); ValueError if none can be."""
    number = int(device, 16)
    if number > 0x1F:
        raise ValueError(f"device number {device} past 0x1f")
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function or '0'}"


def parse_sxids(text: str, boot_time: float | None, now: float) -> list[SxidEvent]:
    """SXid errors in kernel log text (kernel_log's forms). A detail line under the SXid
    line it follows is no error of its own; one whose SXid line is not there (the last
    line of that NVSwitch was of another code, or there was none) stands for it, with no
    severity word (the catalog's)."""
    clock = LineClock(boot_time, now)
    every_line = every_line_counts(text)
    events = []
    last_code: dict[str, int] = {}  # by NVSwitch: the code of its latest SXid line
    for line in text.splitlines():
        match = SXID_LINE.search(line)
        if match is None:
            if every_line:
                clock.stamp(line)
            continue
        switch, domain, bus, device, function, code = match.groups()
        rest = line[match.end() :].strip()
        stamp = clock.stamp(line[: match.start()])
        try:
            bus_id = sxid_bus_id(domain, bus, device, function)
        except ValueError:
            continue
        seen_before, last_code[bus_id] = last_code.get(bus_id), int(code)
        if DETAIL_LINE.match(rest) and seen_before == int(code):
            continue
        fatal = None
        if said := SEVERITY_WORD.match(rest):
            fatal = said.group(1).lower() == "fatal"
            rest = rest[said.end() :]
        shown = cut_message(rest)  # a line may be megabytes long: results show its start
        events.append(SxidEvent(bus_id, int(code), fatal, stamp.at, shown, switch, stamp.form))
    return events
