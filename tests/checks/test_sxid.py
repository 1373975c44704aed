"""NVSwitch SXids: the kernel log lines nvidia-nvswitch writes, their judging, the check."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from nodecheck.checks.host.nvswitch_sxid import (
    PARTITION_REBOOT_REMEDY,
    REBOOT_REMEDY,
    REPEAT_REMEDY,
    THERMAL_REMEDY,
    check_nvswitch_sxid,
    judge_sxid,
)
from nodecheck.checks.node.fs import PERMISSION_DENIED
from nodecheck.checks.node.kernel_log import parse_boot_time
from nodecheck.checks.node.kernel_log_facts import KernelLogFacts, KernelLogUnreadable
from nodecheck.checks.node.sxid import (
    RECONCILED,
    SxidAction,
    SxidEvent,
    SxidKind,
    classify_sxid,
    guide_kind,
    parse_sxids,
    sxid_catalog,
)
from nodecheck.checks.node.sxid_catalog import NVSENTINEL_SXIDS
from nodecheck.checks.result import UNPRIVILEGED, Action, Status
from tests.checks.literal_facts import context
from tests.conftest import Node

BOOT = 1_790_000_000.0
NOW = BOOT + 86_400.0
SWITCH = "0000:05:00.0"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "[ 100.5] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 "
            "egress non-posted PRIV error (First)",
            SxidEvent(
                SWITCH,
                12028,
                False,
                BOOT + 100.5,
                "Link 32 egress non-posted PRIV error (First)",
                "nvswitch3",
            ),
        ),
        (
            "4,77,2000000,-;nvidia-nvswitch0: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 44 "
            "sourcetrack timeout error",
            SxidEvent(
                "0000:86:00.0",
                24007,
                True,
                BOOT + 2,
                "Link 44 sourcetrack timeout error",
                "nvswitch0",
            ),
        ),
        (
            # syslog, the bus in capitals, no "PCI:", no severity word
            "Sep 22 12:00:00 n7 kernel: nvidia-nvswitch1: SXid (0000:8A:00.0): 22003, Minion halt",
            SxidEvent(
                "0000:8a:00.0",
                22003,
                None,
                time.mktime((2026, 9, 22, 12, 0, 0, 0, 0, -1)),
                "Minion halt",
                "nvswitch1",
            ),
        ),
    ],
)
def test_sxid_lines(line: str, expected: SxidEvent) -> None:
    assert parse_sxids(line, BOOT, NOW) == [expected]


def test_a_message_of_megabytes_is_cut_and_says_so() -> None:
    """The message after the severity word reaches results as its first 200 characters and
    its length; the word itself is still read."""
    message = "Link 44 sourcetrack timeout error " + "B" * 3_000_000
    line = f"[ 1.0] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 24007, Fatal, {message}"
    [event] = parse_sxids(line, BOOT, NOW)
    assert event.fatal is True
    assert event.message == f"{message[:200]}… (cut: {len(message)} characters in all)"
    judged = judge_sxid(24007, [event], NOW, BOOT)
    assert judged.status is Status.FAIL and len(judged.summary) < 400, len(judged.summary)


@pytest.mark.parametrize(
    "line",
    [
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): " + "9" * 5000 + ", Fatal, Link 1",
        "nvidia-nvswitch" + "3" * 5000 + ": SXid (PCI:0000:05:00.0): 24007, Fatal, Link 1",
    ],
    ids=["code", "switch_number"],
)
def test_a_number_of_thousands_of_digits_is_no_sxid_and_no_crash(line: str) -> None:
    """An SXid code past a few digits is no line the driver wrote (and int() refuses more
    than 4300 digits); a switch name of thousands of digits is none either."""
    assert parse_sxids(f"[ 1.0] {line}", BOOT, NOW) == []


def test_detail_lines_are_not_errors_of_their_own() -> None:
    """The driver follows an SXid with its severity and data under the same code."""
    text = (
        "[ 1.0] nvidia-nvswitch1: SXid (PCI:0000:8a:00.0): 12028, Non-fatal, Link 16 egress "
        "non-posted PRIV error (First)\n"
        "[ 1.0] nvidia-nvswitch1: SXid (PCI:0000:8a:00.0): 12028, Severity 0 Engine instance 16 "
        "Sub-engine instance 00\n"
        "[ 1.0] nvidia-nvswitch1: SXid (PCI:0000:8a:00.0): 12028, Data {0x00000000, 0x00000000}\n"
        "[ 2.0] nvidia-nvswitch1: open (major=510)\n"
        "[ 3.0] NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.\n"
    )
    [event] = parse_sxids(text, BOOT, NOW)
    assert (event.sxid, event.fatal, event.at) == (12028, False, BOOT + 1)


def test_a_detail_line_whose_sxid_line_is_lost_stands_for_it() -> None:
    """Only the data line of a fatal 12028 on nvswitch1 is left (the ring buffer wrapped
    past its headline), after a complete non-fatal 11012 on the same NVSwitch: the 12028
    counts once, with no word of its own (the catalog's severity), and its second detail
    line is no second error. nvswitch2's detail line follows nothing: it counts too."""
    text = (
        "[ 1.0] nvidia-nvswitch1: SXid (PCI:0000:8a:00.0): 11012, Non-fatal, Link 3 ECC\n"
        "[ 1.0] nvidia-nvswitch1: SXid (PCI:0000:8a:00.0): 11012, Data {0x00000001}\n"
        "[ 2.0] nvidia-nvswitch1: SXid (PCI:0000:8a:00.0): 12028, Data {0x00000000, 0x1}\n"
        "[ 2.0] nvidia-nvswitch1: SXid (PCI:0000:8a:00.0): 12028, Severity 1 Engine instance 16 "
        "Sub-engine instance 00\n"
        "[ 3.0] nvidia-nvswitch2: SXid (PCI:0000:8b:00.0): 22003, Data {0x00000010}\n"
    )
    events = parse_sxids(text, BOOT, NOW)
    assert [(e.bus_id, e.sxid, e.fatal, e.at) for e in events] == [
        ("0000:8a:00.0", 11012, False, BOOT + 1),
        ("0000:8a:00.0", 12028, None, BOOT + 2),
        ("0000:8b:00.0", 22003, None, BOOT + 3),
    ]
    assert events[1].message.startswith("Data {")
    judged = judge_sxid(12028, [events[1]], NOW, BOOT)
    assert judged.status is Status.FAIL and judged.remedy == REBOOT_REMEDY


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        # One of each kind, agreed by the guide and NVSentinel.
        (11012, SxidKind.NONFATAL),  # single bit ECC: IGNORE, NONFATAL
        (24007, SxidKind.FATAL),  # sourcetrack timeout: RESET_GPU, FATAL
        (22003, SxidKind.ALWAYS_FATAL),  # minion halt: RESET_FABRIC
        (10004, SxidKind.THERMAL),
        (99999, SxidKind.UNKNOWN),
        # Where they disagree, NVSentinel's (checks/node/sxid.py RECONCILED says why).
        (10001, SxidKind.NONFATAL),  # host PRIV error: IGNORE, NONFATAL
        (11004, SxidKind.FATAL),  # ingress ACL: CHECK_FM_CONFIG, FATAL
        (12028, SxidKind.ALWAYS_FATAL),  # egress PRIV response: RESET_FABRIC
        (20012, SxidKind.FATAL),  # CRC counter: CHECK_LINK_MECHANICAL_CONNECTIONS
        (23009, SxidKind.FATAL),  # tile ingress parity: the NVLink workflow, the partition
        # Codes only NVSentinel lists: one of each of its actions.
        (11002, SxidKind.NONFATAL),  # IGNORE
        (26001, SxidKind.ALWAYS_FATAL),  # SOE reset: RESET_FABRIC
        (14001, SxidKind.FATAL),  # RESET_GPU
        (11007, SxidKind.FATAL),  # WORKFLOW_NVLINK_POTENTIALY_FATAL_ERR
        (18001, SxidKind.FATAL),  # INVESTIGATE_LINK_SI
        (19036, SxidKind.FATAL),  # RUN_FIELDDIAG
        (13001, SxidKind.FATAL),  # UNEXPECTED_ERR_REPORT_ISSUE
        (28006, SxidKind.FATAL),  # REPORT_ISSUE
        (27001, SxidKind.FATAL),  # CCI reset: CHECK_LINK_MECHANICAL_CONNECTIONS
        (28001, SxidKind.THERMAL),  # OSFP thermal warning: CHECK_THERMALS
        (28005, SxidKind.FATAL),  # OSFP heartbeat shutdown: CHECK_THERMALS, its links down
        (28002, SxidKind.THERMAL),  # ... and its end (IGNORE), as 10005 is 10004's
    ],
)
def test_the_catalog(code: int, kind: SxidKind) -> None:
    assert classify_sxid(code).kind is kind


def test_reconciled_lists_exactly_the_codes_where_the_guide_and_nvsentinel_part() -> None:
    parted = {
        code
        for code in sxid_catalog()
        if guide_kind(code) is not None and guide_kind(code) is not sxid_catalog()[code].kind
    }
    assert parted == set(RECONCILED)
    for code, said in RECONCILED.items():
        guide = guide_kind(code)
        assert guide is not None and said.startswith(f"{guide.value} in the guide"), (code, said)
        assert sxid_catalog()[code].action in said, (code, said)


def test_every_nvsentinel_code_keeps_its_severity() -> None:
    """Fatal in the catalog exactly where NVSentinel says FATAL, but for the thermal
    events, which warn (checks/node/sxid.py nvsentinel_kind says why)."""
    assert set(NVSENTINEL_SXIDS) <= set(sxid_catalog())
    for code, (_, action) in NVSENTINEL_SXIDS.items():
        kind = sxid_catalog()[code].kind
        if kind is SxidKind.THERMAL:
            assert action in (SxidAction.THERMALS, SxidAction.IGNORE), code
            continue
        assert (kind in (SxidKind.FATAL, SxidKind.ALWAYS_FATAL)) == action.fatal, code
        assert (kind is SxidKind.ALWAYS_FATAL) == (action is SxidAction.RESET_FABRIC), code


# Each thousand of SXid codes is one unit of the NVSwitch (the driver's NVSWITCH_ERR_HW_*
# groups), so a transcribed name under the wrong thousand is a typo in the table.
UNITS = {
    10: "HOST_",
    11: "NPORT_INGRESS_",
    12: "NPORT_EGRESS_",
    13: "NPORT_FSTATE_",
    14: "NPORT_TSTATE_",
    15: "NPORT_ROUTE_",
    16: "NPORT_",
    17: "NVLCTRL_",
    18: "NVLIPT_",
    19: "NVLTLC_",
    20: "DLPL_",
    21: "AFS_",
    22: "MINION_",
    23: "NXBAR_",
    24: "NPORT_SOURCETRACK_",
    25: "NVLIPT_LNK_",
    26: "SOE_",
    27: "CCI_",
    28: "OSFP_",
    29: "NPORT_MULTICASTTSTATE_",
    30: "NPORT_REDUCTIONTSTATE_",
}


def test_the_transcribed_names_sit_under_their_units() -> None:
    codes = sorted(NVSENTINEL_SXIDS)
    for code in codes:
        name = NVSENTINEL_SXIDS[code][0]
        assert name.startswith(UNITS[code // 1000]) or code == 28006, (code, name)
    # Each unit's codes run from 1 without a gap, as the driver numbers them.
    for unit in UNITS:
        numbers = [code % 1000 for code in codes if code // 1000 == unit]
        assert numbers == list(range(1, len(numbers) + 1)), unit


def sxid(code: int, fatal: bool | None, ago: float | None) -> SxidEvent:
    return SxidEvent(SWITCH, code, fatal, None if ago is None else NOW - ago, "Link 4 x")


HOUR = 3600.0


@pytest.mark.parametrize(
    ("events", "status", "remedy", "says"),
    [
        # fatal (the line's word) from this boot: reset the partition's GPUs and NVSwitches
        ([sxid(24007, True, 60)], Status.FAIL, PARTITION_REBOOT_REMEDY, "(1 fatal)"),
        # the line says Fatal though the catalog calls the code non-fatal: the line wins
        ([sxid(11012, True, 60)], Status.FAIL, PARTITION_REBOOT_REMEDY, "(1 fatal)"),
        # always fatal: the whole fabric, the host restarts
        ([sxid(22003, True, 60)], Status.FAIL, REBOOT_REMEDY, "minion halt"),
        # no word on the line: the catalog's
        ([sxid(22003, None, 60)], Status.FAIL, REBOOT_REMEDY, "(1 fatal)"),
        # a time unknown may be of this boot: still a failure, said so
        ([sxid(24007, True, None)], Status.FAIL, PARTITION_REBOOT_REMEDY, "may be from this boot"),
        # before the last boot: cleared by it
        ([sxid(24007, True, 2 * 86_400)], Status.OK, "", "before the last boot"),
        # non-fatal: counted, no action
        ([sxid(12028, False, 60)] * 9, Status.OK, "", "x9 (non-fatal)"),
        # the same non-fatal 10 times in a day on one NVSwitch: failing hardware
        ([sxid(12028, False, HOUR)] * 10, Status.WARN, REPEAT_REMEDY, "10 in the last day"),
        # ... but not when they are older than a day
        ([sxid(12028, False, 30 * HOUR)] * 10, Status.OK, "", "no action"),
        # a thermal event: cooling
        ([sxid(10004, None, 60)], Status.WARN, THERMAL_REMEDY, "thermal event start"),
        # only NVSentinel lists it (SOE timeout, RESET_FABRIC): the catalog's, no lookup
        ([sxid(26004, None, 60)], Status.FAIL, REBOOT_REMEDY, "SOE_TIMEOUT x1 (1 fatal)"),
        # not in the catalog and no word on the line: looked up
        ([sxid(99999, None, 60)], Status.WARN, "", "not in the catalog"),
    ],
)
def test_judge_sxid(events: list[SxidEvent], status: Status, remedy: str, says: str) -> None:
    judged = judge_sxid(events[0].sxid, events, NOW, NOW - 86_400)
    assert judged.status is status, judged
    assert says in judged.summary, judged.summary
    if remedy:
        assert judged.remedy == remedy
    assert bool(judged.remedy) == (status is not Status.OK)
    assert judged.fatal_now == (status is Status.FAIL)


@pytest.mark.parametrize(
    ("code", "asks"),
    [
        (20012, "cables and connectors"),  # CHECK_LINK_MECHANICAL_CONNECTIONS
        (18001, "signal integrity"),  # INVESTIGATE_LINK_SI
        (19036, "field diagnostics"),  # RUN_FIELDDIAG
        (13001, "nvidia-bug-report.sh"),  # UNEXPECTED_ERR_REPORT_ISSUE
        (11004, "fabricmanager.cfg"),  # CHECK_FM_CONFIG
    ],
)
def test_a_fatal_sxid_says_what_nvidia_asks_beyond_the_reboot(code: int, asks: str) -> None:
    judged = judge_sxid(code, [sxid(code, True, 60)], NOW, NOW - 86_400)
    assert judged.status is Status.FAIL and judged.action is Action.REBOOT
    assert judged.remedy.startswith(PARTITION_REBOOT_REMEDY) and asks in judged.remedy


def test_a_fatal_line_from_before_the_boot_hides_nothing_of_this_boot() -> None:
    """Fatal lines before the last boot were cleared by it: a fatal one of this boot is
    shown and fails, and non-fatal ones of this boot that keep coming still warn."""
    boot = NOW - HOUR
    old = SxidEvent(SWITCH, 12028, True, boot - 600, "Link 2 before the boot")
    current = SxidEvent(SWITCH, 12028, True, NOW - 60, "Link 5 this boot")
    judged = judge_sxid(12028, [current, old], NOW, boot)
    assert judged.status is Status.FAIL and "Link 5 this boot" in judged.summary, judged
    repeats = [SxidEvent(SWITCH, 12028, False, NOW - 60, "Link 3 again")] * 10
    judged = judge_sxid(12028, [old, *repeats], NOW, boot)
    assert judged.status is Status.WARN and judged.remedy == REPEAT_REMEDY, judged
    assert "10 in the last day" in judged.summary and "before the last boot" in judged.summary
    thermal = judge_sxid(10004, [old, SxidEvent(SWITCH, 10004, None, NOW - 60, "x")], NOW, boot)
    assert thermal.status is Status.WARN, thermal
    # a fatal line at an unknown time may be of this boot: it fails, and says so
    unknown = SxidEvent(SWITCH, 12028, True, None, "Link 6 no time")
    judged = judge_sxid(12028, [old, unknown], NOW, boot)
    assert judged.status is Status.FAIL and "may be from this boot" in judged.summary, judged


@pytest.mark.parametrize("remedy", [PARTITION_REBOOT_REMEDY, REBOOT_REMEDY])
def test_the_fatal_remedy_is_the_reboot_that_clears_the_check(remedy: str) -> None:
    """The check fails until the next boot (nothing in the kernel log shows a reset), so its
    remedy is a reboot and says the check clears then; a reset alone would leave it (and its
    alert) failing for ever."""
    assert remedy.startswith("drain the node and reboot it"), remedy
    assert "clears after the reboot" in remedy and "nvidia-smi -r" not in remedy
    judged = judge_sxid(24007, [sxid(24007, True, 60)], NOW, NOW - 86_400)
    assert judged.summary.endswith(": fails until the next boot"), judged.summary
    # Its action too: a reset-only fatal SXid asks for the reboot that clears it.
    always_fatal = judge_sxid(22003, [sxid(22003, True, 60)], NOW, NOW - 86_400)
    assert (judged.action, always_fatal.action) == (Action.REBOOT, Action.REBOOT)
    # The alert is the verdict's (monitoring/alerts.yml: by its action, pointing to this
    # remedy), not one of its own about nodecheck_nvswitch_sxid_fatal.
    alerts = (Path(__file__).parents[2] / "monitoring" / "alerts.yml").read_text()
    assert "nodecheck_nvswitch_sxid_fatal" not in alerts


def test_the_fatal_line_is_shown_over_later_non_fatal_ones() -> None:
    events = [
        SxidEvent(SWITCH, 12028, True, NOW - 600, "Link 2 the fatal one"),
        SxidEvent(SWITCH, 12028, False, NOW - 60, "Link 3 a later one"),
    ]
    judged = judge_sxid(12028, events, NOW, NOW - 86_400)
    assert judged.status is Status.FAIL and "Link 2 the fatal one" in judged.summary


# -- the nvswitch_sxid check on replicas: the DGX has four NVSwitches, the workstation none --

DGX_SWITCHES = ("0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "0000:05:00.0")


def boot_time_of(node: Node) -> float:
    """The btime the replica's /proc/stat says (written when the tree was built, which may be
    long before a test runs: never time.time() minus the uptime)."""
    boot = parse_boot_time((node.root / "proc" / "stat").read_text())
    assert boot is not None
    return boot


def printed_age(summary: str) -> tuple[float, float]:
    """The seconds a "last N s ago" (or min, h, d) could stand for, rounding allowed."""
    match = re.search(r"last (\d+) (s|min|h|d) ago", summary)
    assert match, summary
    unit = {"s": 1, "min": 60, "h": 3600, "d": 86_400}[match.group(2)]
    return (int(match.group(1)) - 0.5) * unit, (int(match.group(1)) + 0.5) * unit


def test_a_fatal_sxid_fails_its_nvswitch_only(dgx: Node, tmp_path: Path) -> None:
    """The age a summary prints is checked against the times measured around the check,
    never a guessed one: a loaded machine may take long between the write and the check."""
    boot = boot_time_of(dgx)
    written = time.time()
    logged = written - 60
    since_boot = logged - boot
    path = tmp_path / "kern.log"
    path.write_text(
        f"[{since_boot:12.6f}] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 44 "
        "sourcetrack timeout error\n"
        f"[{since_boot:12.6f}] nvidia-nvswitch2: SXid (PCI:0000:04:00.0): 12028, Non-fatal, "
        "Link 3 egress non-posted PRIV error (First)\n"
    )
    results = {r.subject: r for r in dgx.results("nvswitch_sxid", kernel_log=path)}
    checked = time.time()
    assert set(results) == {f"nvswitch {bdf}" for bdf in DGX_SWITCHES}
    fatal = results["nvswitch 0000:05:00.0"]
    assert fatal.status is Status.FAIL and fatal.remedy == PARTITION_REBOOT_REMEDY, fatal
    assert re.match(
        r"SXid 24007 sourcetrack timeout error x1 \(1 fatal\), last \d+ (s|min) ago \(Link 44 ",
        fatal.summary,
    ), fatal.summary
    # The check's clock read between `written` and `checked`: the age lies in that window.
    low, high = printed_age(fatal.summary)
    assert low <= checked - logged and written - logged <= high, (fatal.summary, checked - logged)
    samples = {(s.metric.name, s.labels["sxid"]): s.value for s in fatal.samples}
    assert samples == {
        ("nodecheck_nvswitch_sxid_events", "24007"): 1,
        # the line's own stamp, printed to the microsecond
        ("nodecheck_nvswitch_sxid_last_seen_timestamp_seconds", "24007"): pytest.approx(
            logged, abs=1e-3
        ),
        ("nodecheck_nvswitch_sxid_fatal", "24007"): 1,
    }
    counted = results["nvswitch 0000:04:00.0"]
    assert counted.status is Status.OK and counted.details["sxids"] == {"12028": 1}
    clean = results["nvswitch 0000:02:00.0"]
    assert clean.status is Status.OK
    assert clean.summary == f"no SXid in the kernel log ({path})"


def test_no_nvswitch_no_sxid_is_said_without_failing(workstation: Node) -> None:
    [result] = workstation.results("nvswitch_sxid")
    assert result.status is Status.SKIP
    assert result.summary == "no NVSwitch on the PCI bus, and no SXid in the kernel log"


def test_an_unreadable_log_is_an_error_only_where_there_are_nvswitches(
    dgx: Node, workstation: Node, tmp_path: Path
) -> None:
    missing = tmp_path / "missing"
    [blind] = dgx.results("nvswitch_sxid", kernel_log=missing)
    assert blind.status is Status.ERROR and blind.subject == "node"
    assert blind.summary == f"cannot read the kernel log for NVSwitch SXids: {missing}: missing"
    [nothing] = workstation.results("nvswitch_sxid", kernel_log=missing)
    assert nothing.status is Status.SKIP and nothing.summary == "no NVSwitch on the PCI bus"


def test_a_log_closed_to_this_process_is_a_skip_saying_so(dgx: Node) -> None:
    """Permission denied (the unprivileged DaemonSet's device cgroup, dmesg_restrict):
    not watched here for good, said as a `skip` with its cause, never `ok`; any other
    failure to read stays an `error` (above)."""
    closed = KernelLogFacts(
        "/dev/kmsg",
        None,
        unreadable=KernelLogUnreadable(
            "/dev/kmsg: permission denied", PERMISSION_DENIED, "run as root (or with CAP_SYSLOG)"
        ),
    )
    parts = {"inventory": dgx.context().inventory, "kernel_log": closed}
    [blind] = check_nvswitch_sxid(context(parts))
    assert blind.status is Status.SKIP and blind.subject == "node"
    assert blind.summary == (
        "NVSwitch SXids not watched: the kernel log is closed to this process "
        "(/dev/kmsg: permission denied)"
    )
    assert blind.details == {"cause": UNPRIVILEGED}


def test_a_switch_not_on_the_bus_is_said_even_when_it_fails(dgx: Node, tmp_path: Path) -> None:
    """A fatal SXid of an NVSwitch this node does not have (a log from another node): the
    failure says the switch is not on the PCI bus, where it matters most."""
    since_boot = time.time() - 60 - boot_time_of(dgx)
    path = tmp_path / "kern.log"
    path.write_text(
        f"[{since_boot:12.6f}] nvidia-nvswitch0: SXid (PCI:0000:99:00.0): 24007, Fatal, Link 4 "
        "sourcetrack timeout error\n"
    )
    results = {r.subject: r for r in dgx.results("nvswitch_sxid", kernel_log=path)}
    stranger = results["nvswitch 0000:99:00.0"]
    assert stranger.status is Status.FAIL, stranger
    assert stranger.summary.endswith(
        "; not on the PCI bus (a log from another node, or it was lost)"
    ), stranger.summary
    assert stranger.details["on_pci_bus"] is False
    assert all(results[f"nvswitch {bdf}"].status is Status.OK for bdf in DGX_SWITCHES)


def test_the_replicas_own_kernel_log_has_no_sxid(dgx: Node) -> None:
    results = dgx.results("nvswitch_sxid")
    assert [r.status for r in results] == [Status.OK] * 4
