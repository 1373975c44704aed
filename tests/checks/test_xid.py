"""XID parsing and judging, on literal kernel log lines and readings."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest

from nodecheck.checks.context import CheckContext, SharedReads
from nodecheck.checks.gpu.xid import XidGroup, event_action, group_events, judge_gpu, judge_group
from nodecheck.checks.node import kernel_log as kernel_log_module
from nodecheck.checks.node.fs import ReadError
from nodecheck.checks.node.gpu import (
    GpuReading,
    normalize_bus_id,
    parse_kernel_module_version,
)
from nodecheck.checks.node.kernel_log import KERNEL_LOG_LIMIT, KernelLogText, LineClock
from nodecheck.checks.node.xid import (
    XID_CATALOG,
    XidAction,
    XidEvent,
    XidInfo,
    classify,
    merge_sources,
    parse_boot_time,
    parse_kernel_log,
    read_kernel_log,
)
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Result, Status, gpu_subject
from nodecheck.checks.runner import run_checks
from tests.conftest import Node

BOOT = 1_790_000_000.0  # 2026-09-21, wall-clock seconds
NOW = BOOT + 86_400.0
LOCAL_NOON = time.mktime((2026, 9, 22, 12, 0, 0, 0, 0, -1))
ISO_TEN = 1_789_984_800.0  # 2026-09-21T10:00:00Z


XID = "NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python, GPU has fallen off the bus."
# 2026-09-21 10:00:00.283302 UTC, and the same wall-clock reading in local time.
UTC_TEN = ISO_TEN + 0.283302
LOCAL_TEN = time.mktime((2026, 9, 21, 10, 0, 0, 0, 0, -1))


@pytest.mark.parametrize(
    ("line", "at"),
    [
        # /dev/kmsg: microseconds since boot
        (f"4,1234,5000000,-;{XID}", BOOT + 5),
        # dmesg (raw, -r, -x, -d): seconds since boot in brackets; journalctl short-monotonic
        (f"[  123.500000] {XID}", BOOT + 123.5),
        (f"<4>[  123.500000] {XID}", BOOT + 123.5),
        (f"kern  :warn  : [  123.500000] {XID}", BOOT + 123.5),
        (f"[  123.500000 <    0.000040>] {XID}", BOOT + 123.5),
        (f"[  123.500000] dgx01 kernel: {XID}", BOOT + 123.5),
        # dmesg --time-format iso: a comma before the microseconds; with --decode too
        (f"2026-09-21T10:00:00,283302+00:00 {XID}", UTC_TEN),
        (f"kern  :warn  : 2026-09-21T10:00:00,283302+00:00 {XID}", UTC_TEN),
        (f"kern  :err   : 2026-09-21T12:00:00,283302+02:00 {XID}", UTC_TEN),
        # dmesg -T and --time-format ctime: local time; with --decode too
        (f"[Mon Sep 21 10:00:00 2026] {XID}", LOCAL_TEN),
        (f"kern  :warn  : [Mon Sep 21 10:00:00 2026] {XID}", LOCAL_TEN),
        # journalctl -o short-iso, short-iso-precise; rsyslog RFC 3339
        (f"2026-09-21T10:00:00+0000 dgx01 kernel: {XID}", ISO_TEN),
        (f"2026-09-21T10:00:00.283302+0000 dgx01 kernel: {XID}", UTC_TEN),
        (f"2026-09-21T10:00:00.283302+00:00 dgx01 kernel: {XID}", UTC_TEN),
        (f"2026-09-21T10:00:00.283302Z dgx01 kernel: {XID}", UTC_TEN),
        # journalctl -o short-full, in UTC and in local time
        (f"Mon 2026-09-21 10:00:00 UTC dgx01 kernel: {XID}", ISO_TEN),
        (f"Mon 2026-09-21 10:00:00.283302 UTC dgx01 kernel: {XID}", UTC_TEN),
        # journalctl -o short-unix
        (f"{UTC_TEN:.6f} dgx01 kernel: {XID}", UTC_TEN),
        # RFC 5424 (rsyslog's RSYSLOG_SyslogProtocol23Format)
        (f"<4>1 2026-09-21T10:00:00.283302+00:00 dgx01 kernel - - - {XID}", UTC_TEN),
        ("<4>1 - dgx01 kernel - - - " + XID, None),
        # syslog RFC 3164, journalctl -o short and short-precise: local time, no year;
        # the syslog stamp wins over a since-boot one after it
        (f"Sep 22 12:00:00 dgx01 kernel: [ 9.0] {XID}", LOCAL_NOON),
        (f"Sep 22 12:00:00.250000 dgx01 kernel: {XID}", LOCAL_NOON + 0.25),
        (f"<4>Sep 22 12:00:00 dgx01 kernel: {XID}", LOCAL_NOON),
        # dmesg --time-format delta: gaps only, no time; notime (dmesg -t): none
        (f"[<    0.000040>] {XID}", None),
        (XID, None),
    ],
)
def test_line_times(line: str, at: float | None) -> None:
    [event] = parse_kernel_log(line, BOOT, now=NOW)
    assert (event.bus_id, event.xid) == ("0000:1b:00.0", 79)
    assert event.at == pytest.approx(at) if at is not None else event.at is None
    assert event.clock  # how the time was read (or that it could not be) is said


@pytest.mark.parametrize(
    "stamp",
    [
        "0001-01-01T00:00:00 ",
        "9999-12-31T23:59:59,999999-23:59 ",
        "2026-02-30T10:00:00+00:00 ",
        "2026-09-21T10:00:00+99:99 ",
        "Tue 0000-00-00 00:00:00 UTC n7 kernel: ",
        "Tue 9999-12-31 23:59:59 CEST n7 kernel: ",
        "[Mon Feb 30 25:61:61 2026] ",
        "[Feb30 25:61] ",
        "Feb 30 25:61:61 n7 kernel: ",
        "<4>1 2026-13-01T00:00:00Z n7 kernel - - - ",
        "[99999999999999999999.5] ",
        "99999999999.999999999 n7 kernel: ",
    ],
)
def test_an_impossible_stamp_is_no_time_and_no_crash(stamp: str) -> None:
    [event] = parse_kernel_log(f"{stamp}{XID}", BOOT, now=NOW)
    assert event.xid == 79  # the line is still read; its time is whatever the stamp allows


def test_reltime_counts_from_the_minute_line_before() -> None:
    """dmesg --time-format reltime: "[Sep22 12:00]" on the first line of a minute (local
    time, no year, to the minute), then "[  +0.5]" from the line before, XID or not."""
    text = (
        "[Sep22 12:00] nvidia-nvlink: Nvlink Core is being initialized\n"
        "[  +1.500000] eth0: link up\n"
        f"[  +0.250000] {XID}\n"
        f"kern  :warn  : [Sep22 12:07] {XID}\n"
    )
    first, second = parse_kernel_log(text, BOOT, now=NOW)
    assert first.at == pytest.approx(LOCAL_NOON + 1.75)
    assert second.at == LOCAL_NOON + 7 * 60
    assert "to the minute" in first.clock


def test_a_step_with_no_full_time_before_it_has_no_time() -> None:
    [event] = parse_kernel_log(f"[  +0.250000] {XID}", BOOT, now=NOW)
    assert event.at is None and "before any full time" in event.clock


def test_since_boot_without_a_boot_time_is_unknown_and_said() -> None:
    [event] = parse_kernel_log(f"[  123.500000] {XID}", None, now=NOW)
    assert event.at is None and "boot time is unknown" in event.clock


@pytest.mark.parametrize(
    ("line", "bus_id", "xid"),
    [
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off", "0000:3b:00.0", 79),
        # older drivers: no "PCI:", no pid
        ("NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00.0", 14),
        # the PCI function written out, the bus in capitals, an 8-digit domain
        ("NVRM: Xid (PCI:0000:3B:00.0): 48, DBE", "0000:3b:00.0", 48),
        ("NVRM: Xid (PCI:00000000:3b:00): 63, Row Remapper", "0000:3b:00.0", 63),
        # GB200's other PCI domains
        (
            "NVRM: Xid (PCI:0019:01:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 4 (0x1)",
            "0019:01:00.0",
            145,
        ),
        # no domain at all
        ("NVRM: Xid (PCI:3b:00): 31, pid=2, MMU Fault", "0000:3b:00.0", 31),
    ],
)
def test_xid_line_forms(line: str, bus_id: str, xid: int) -> None:
    [event] = parse_kernel_log(f"[  1.0] {line}", BOOT, now=NOW)
    assert (event.bus_id, event.xid) == (bus_id, xid)


@pytest.mark.parametrize(
    ("message", "severity"),
    [
        ("NETIR_LINK_EVT Fatal XC0 i0 Link 05 (0x004505c6 0x00000000)", "fatal"),
        ("pid=12, name=python3, RLW_RXPIPE Nonfatal XC0 i0 Link 07 (0x0409a0c2 0x8)", "nonfatal"),
        ("NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000)", "fatal"),
        ("TLW_RX/TLW_RX_PIPE1 Nonfatal XC1 i0 Link 2 (0x1 0x2)", "nonfatal"),
        # free text that merely contains the word is no severity
        ("pid=12, Fatal error seen on the link", None),
    ],
)
def test_the_drivers_own_severity_word(message: str, severity: str | None) -> None:
    [event] = parse_kernel_log(f"NVRM: Xid (PCI:0008:01:00): 149, {message}", BOOT, now=NOW)
    assert event.severity == severity


@pytest.mark.parametrize("xid", [48, 74, 79, 119, 143, 151])
def test_the_severity_word_is_read_only_on_nvlink5_xids(xid: int) -> None:
    """NVIDIA documents "Fatal"/"Nonfatal" on the line for XIDs 144-150 only: on another
    XID such text is part of the message, and the catalog's action stands."""
    line = f"NVRM: Xid (PCI:0000:1b:00): {xid}, pid=9, RLW_RXPIPE Nonfatal XC0 i0 Link 7 (0x1)"
    [event] = parse_kernel_log(line, BOOT, now=NOW)
    assert event.severity is None
    assert event_action(event) is classify(xid).action
    # even an event built with the word (from elsewhere) keeps the catalog's action
    worded = XidEvent("0000:1b:00.0", xid, NOW - 60, "kernel log", "x", "nonfatal")
    assert event_action(worded) is classify(xid).action
    [nvlink5] = parse_kernel_log(line.replace(f": {xid},", ": 145,"), BOOT, now=NOW)
    assert nvlink5.severity == "nonfatal" and event_action(nvlink5) is XidAction.NONE


def test_a_message_of_megabytes_is_cut_and_says_so() -> None:
    """A line is whatever the log holds: its message reaches results as its first 200
    characters and its length; the driver's severity word at its start is still read."""
    message = "NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6) " + "A" * 3_000_000
    [event] = parse_kernel_log(f"[ 1.0] NVRM: Xid (PCI:0008:01:00): 149, {message}", BOOT, NOW)
    assert event.message == f"{message[:200]}… (cut: {len(message)} characters in all)"
    assert event.severity == "fatal"
    group = XidGroup(149, 1, BOOT + 1, event.message)
    _, summary, _ = judge_group(group, None, NOW, BOOT)
    assert len(summary) < 400, len(summary)
    [short] = parse_kernel_log(f"[ 1.0] {XID}", BOOT, NOW)  # a message of 200 or fewer: whole
    assert short.message == "pid=77, name=python, GPU has fallen off the bus."


def test_control_characters_of_a_message_are_shown_escaped() -> None:
    """An ESC in a line would drive the terminal a summary is printed on (ECMA-48): the
    message carries it as text, and a tab too (it would shift the table's columns)."""
    line = "[ 1.0] NVRM: Xid (PCI:0000:1b:00): 13, pid=1, \x1b[2J\x1b]0;owned\x07 Graphics\tSM"
    [event] = parse_kernel_log(line, BOOT, NOW)
    assert event.message == "pid=1, \\x1b[2J\\x1b]0;owned\\x07 Graphics\\tSM"


@pytest.mark.parametrize(
    "line",
    [
        "[ 1.0] NVRM: Xid (PCI:0000:18:00): " + "9" * 5000 + ", a number of 5000 digits",
        "4,1," + "9" * 5000 + ",-;" + XID,
    ],
    ids=["xid", "kmsg_time"],
)
def test_a_number_of_thousands_of_digits_is_no_crash(line: str) -> None:
    """int() refuses more than 4300 digits (Python 3.11): such an XID is no line the driver
    wrote, and such a kmsg stamp is no time."""
    events = parse_kernel_log(line, BOOT, NOW)
    assert [(e.xid, e.at) for e in events] == ([] if "Xid (PCI:0000:18" in line else [(79, None)])


def test_a_zone_name_of_megabytes_is_cut_in_the_form() -> None:
    """journalctl short-full writes the zone's name: the form naming it reaches the results'
    details, so a name that is not one is cut there."""
    stamp = LineClock(BOOT, NOW).stamp("Tue 2026-09-22 12:00:00 " + "Z" * 100_000 + " n7 kernel: ")
    assert stamp.at == LOCAL_NOON
    assert len(stamp.form) < 200 and "(cut: 100000 characters in all)" in stamp.form


def test_a_line_from_this_boot_is_judged_over_an_older_fatal_one() -> None:
    """A Fatal XID 149 line from before the last boot (cleared by it) and an XID 149 NVML
    event a minute ago on an unreadable GPU: the current one is judged (a failure), never
    hidden behind the older line as "before the last boot"."""
    boot = NOW - HOUR
    bus = "0000:1b:00.0"
    fatal = "NETIR_LINK_EVT Fatal XC0 i0 Link 8"
    old = XidEvent(bus, 149, boot - 100, "kernel log", fatal, "fatal")
    current = XidEvent(bus, 149, NOW - 60, "nvml event")
    [group] = group_events([old, current], boot)
    assert group.judged_at == NOW - 60 and group.count == 2
    status, summary, remedy = judge_group(group, None, NOW, boot)
    assert status is Status.FAIL and "before the last boot" not in summary, summary
    assert remedy == XidAction.FOLLOW_RECOVERY_ACTION.value
    verdict = judge_gpu([old, current], None, {}, NOW, boot, "the log")
    assert verdict.result("gpu").status is Status.FAIL
    # a Fatal line before the boot and a Nonfatal one of this boot: the Nonfatal decides
    nonfatal = XidEvent(bus, 149, NOW - 60, "kernel log", "NETIR_BER Nonfatal XC0", "nonfatal")
    status, summary, _ = judge_group(group_events([old, nonfatal], boot)[0], None, NOW, boot)
    assert status is Status.OK and "Nonfatal, as the driver says" in summary, summary
    # only when every line is older than the boot is the group history
    [history] = group_events([old], boot)
    status, summary, _ = judge_group(history, None, NOW, boot)
    assert status is Status.OK and summary.endswith("before the last boot"), summary


def test_the_worst_line_of_a_group_is_shown_and_judged() -> None:
    """XID 149 on one GPU: a Fatal line an hour ago, then two Nonfatal ones a minute ago.
    The Fatal one is shown (the most severe action), and it is judged: a fail, an hour old;
    of two lines asking for the same, the latest is shown."""
    bus = "0000:1b:00.0"
    events = [
        XidEvent(bus, 149, NOW - 3600, "kernel log", "NETIR Fatal XC0 i0 Link -1", "fatal"),
        XidEvent(bus, 149, NOW - 60, "kernel log", "NETIR_BER_EVENT Nonfatal XC0", "nonfatal"),
        XidEvent(bus, 149, NOW - 50, "kernel log", "RLW_RXPIPE Nonfatal XC0", "nonfatal"),
        XidEvent(bus, 48, NOW - 900, "kernel log", "an early DBE"),
        XidEvent(bus, 48, NOW - 600, "kernel log", "a later DBE"),
    ]
    dbe, nvlink = group_events(events)
    assert (nvlink.count, nvlink.fatal, nvlink.nonfatal) == (3, 1, 2)
    assert nvlink.message == "NETIR Fatal XC0 i0 Link -1" and nvlink.last_seen == NOW - 50
    status, summary, remedy = judge_group(nvlink, reading(), NOW, NOW - 86_400)
    assert status is Status.FAIL and "x3, last 50 s ago, the worst 60 min ago" in summary
    assert "1 Fatal, 2 Nonfatal" in summary and remedy == "drain the node and reset the GPU"
    assert dbe.message == "a later DBE"


def test_nonfatal_nvlink5_lines_need_no_action() -> None:
    bus = "0000:1b:00.0"
    events = [XidEvent(bus, 145, NOW - 60, "kernel log", "RLW_SRC_TRACK Nonfatal XC1", "nonfatal")]
    [group] = group_events(events)
    status, summary, remedy = judge_group(group, reading(), NOW, NOW - 86_400)
    assert (status, remedy) == (Status.OK, "")
    assert summary.endswith(": Nonfatal, as the driver says: no action"), summary
    # the same XID as an NVML event (no word from the driver): the GPU's recovery action
    # decides: none pending passes, one pending fails, no such field warns
    [plain] = group_events([XidEvent(bus, 145, NOW - 60, "nvml event")])
    assert judge_group(plain, reading(recovery_action=0), NOW, NOW - 86_400)[0] is Status.OK
    assert judge_group(plain, reading(recovery_action=1), NOW, NOW - 86_400)[0] is Status.FAIL
    assert judge_group(plain, reading(), NOW, NOW - 86_400)[0] is Status.WARN
    assert judge_group(plain, None, NOW, NOW - 86_400)[0] is Status.FAIL


def test_the_catalog_covers_every_code_nvidia_documents() -> None:
    """Codes 1-172 of NVIDIA's catalog, each with its mnemonic and an action."""
    assert set(XID_CATALOG) == set(range(1, 173))
    assert classify(119) == XidInfo("GSP_RPC_TIMEOUT", XidAction.RESET_GPU)
    assert classify(79).action is XidAction.REBOOT
    assert classify(151).action is XidAction.RESTART_VM
    assert classify(54).action is XidAction.CHECK_MECHANICALS
    assert classify(44).action is XidAction.NONE  # IGNORE
    assert classify(2).action is XidAction.CONTACT_SUPPORT  # unused on current GPUs
    assert classify(173).action is XidAction.UNKNOWN


def test_line_parts() -> None:
    text = (
        "4,1,100,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.124.06\n"
        "4,2,200,-;NVRM: Xid (PCI:0000:BC:00.1): 48, pid=4242, name=python3, An uncorrectable "
        "double bit error (DBE) has been detected\n"
        "4,3,300,-;nvidia 0000:bc:00.0: GPU has fallen off the bus\n"
    )
    [event] = parse_kernel_log(text, None)
    assert event == XidEvent(
        "0000:bc:00.1",
        48,
        None,
        "kernel log",
        "pid=4242, name=python3, An uncorrectable double bit error (DBE) has been detected",
    )


def test_syslog_year_is_the_one_in_the_past() -> None:
    """A December line read in January is from last year."""
    january = time.mktime((2027, 1, 2, 12, 0, 0, 0, 0, -1))
    [event] = parse_kernel_log(
        "Dec 31 23:00:00 n kernel: NVRM: Xid (PCI:0000:1b:00): 8", None, now=january
    )
    assert event.at == time.mktime((2026, 12, 31, 23, 0, 0, 0, 0, -1))


@pytest.mark.parametrize(
    ("now", "stamp", "year"),
    [
        # neither this year nor last has a Feb 29: the latest leap year's
        ((2027, 3, 10), "Feb 29 10:00:00 n kernel: ", 2024),
        ((2027, 3, 10), "[Feb29 10:00] ", 2024),
        # 2100 is no leap year: eight years back
        ((2101, 3, 1), "Feb 29 10:00:00 n kernel: ", 2096),
        ((2028, 3, 1), "Feb 29 10:00:00 n kernel: ", 2028),
        # a line is never from the future: "Dec 2" read on Dec 1 is last year's
        ((2026, 12, 1), "Dec  2 10:00:00 n kernel: ", 2025),
        ((2026, 12, 1), "[Dec 2 10:00] ", 2025),
        ((2026, 12, 1), "Dec  1 11:59:00 n kernel: ", 2026),
    ],
)
def test_a_stamp_without_a_year_takes_the_latest_year_in_the_past(
    now: tuple[int, int, int], stamp: str, year: int
) -> None:
    at_noon = time.mktime((*now, 12, 0, 0, 0, 0, -1))
    [event] = parse_kernel_log(f"{stamp}NVRM: Xid (PCI:0000:1b:00): 8", None, now=at_noon)
    assert event.at is not None, event.clock
    assert time.localtime(event.at).tm_year == year, event.clock
    said = "this year" if year == now[0] else str(year)
    assert f"the year inferred: {said}" in event.clock, event.clock


def test_a_stamp_a_few_minutes_ahead_is_clock_skew_not_last_year() -> None:
    """The writer's clock may run a little ahead: 3 minutes in the future is this year;
    an hour in the future is not."""
    now = time.mktime((2026, 12, 1, 12, 0, 0, 0, 0, -1))
    text = (
        "Dec  1 12:03:00 n kernel: NVRM: Xid (PCI:0000:1b:00): 8\n"
        "Dec  1 13:00:00 n kernel: NVRM: Xid (PCI:0000:1b:00): 8\n"
    )
    skewed, ahead = parse_kernel_log(text, None, now=now)
    assert skewed.at == now + 180
    assert ahead.at == time.mktime((2025, 12, 1, 13, 0, 0, 0, 0, -1))


LOST = "NVRM: GPU 0000:bc:00.0: GPU has fallen off the bus."
XID_79_BC = "NVRM: Xid (PCI:0000:bc:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off"


@pytest.mark.parametrize(
    ("text", "count"),
    [
        # the driver's lost-GPU line alone: XID 79
        (f"[ 10.0] {LOST}\n", 1),
        # after its XID 79 line (the driver writes both): one error
        (f"[ 10.0] {XID_79_BC}\n[ 10.0] {LOST}\n", 1),
        (f"[ 10.0] {LOST}\n[ 14.0] {XID_79_BC}\n", 1),
        # no times (dmesg -t): the lines next to each other are one error
        (f"{XID_79_BC}\n{LOST}\n", 1),
        # a minute apart: two losses
        (f"[ 10.0] {XID_79_BC}\n[ 70.0] {LOST}\n", 2),
        # another GPU's XID 79 does not stand for this one
        (f"[ 10.0] {XID_79_BC.replace('bc:00', '1b:00')}\n[ 10.0] {LOST}\n", 2),
    ],
)
def test_the_drivers_lost_gpu_line_is_xid_79_counted_once(text: str, count: int) -> None:
    events = parse_kernel_log(text, BOOT, now=NOW)
    lost = [e for e in events if e.bus_id == "0000:bc:00.0" and e.xid == 79]
    assert len(events) == count and len(lost) >= 1, events
    alone = [e for e in lost if "without an Xid 79 line" in e.message]
    assert len(alone) == (1 if count == 2 or "Xid" not in text else 0), events


def test_the_lost_gpu_line_alone_fails_the_gpu_as_xid_79() -> None:
    events = parse_kernel_log(f"4,7,{int(50 * 1e6)},-;{LOST}\n", BOOT, now=BOOT + 60)
    verdict = judge_gpu(events, None, {}, BOOT + 60, BOOT, "the log")
    result = verdict.result("gpu")
    assert result.status is Status.FAIL and "XID 79" in result.summary, result
    assert "without an Xid 79 line" in result.summary
    assert result.remedy == "drain the node and reboot it"


def test_small_parsers() -> None:
    assert parse_boot_time("cpu  1 2 3\nbtime 1790000000\nprocesses 9\n") == BOOT
    assert parse_boot_time("cpu  1 2 3\n") is None
    open_module = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build  "
        "(dvs-builder@U16-I3-B13-4-1)  Wed Feb 26 01:06:37 UTC 2025\nGCC version:  gcc 12.3.0\n"
    )
    assert parse_kernel_module_version(open_module) == "570.124.06"
    closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC"
    assert parse_kernel_module_version(closed) == "535.129.03"
    assert parse_kernel_module_version("garbage") is None
    assert normalize_bus_id(b"00000000:1B:00.0") == "0000:1b:00.0"
    assert normalize_bus_id("0000:1b:00.0") == "0000:1b:00.0"


def test_merge_counts_an_error_seen_twice_once() -> None:
    kernel = [XidEvent("0000:1b:00.0", 79, 100.0, "kernel log")]
    nvml = [
        XidEvent("0000:1b:00.0", 79, 101.5, "nvml event"),
        XidEvent("0000:1b:00.0", 79, 500.0, "nvml event"),
    ]
    assert [e.at for e in merge_sources(kernel, nvml)] == [100.0, 500.0]


def reading(**values: object) -> GpuReading:
    gpu = GpuReading(0, bus_id="0000:1b:00.0", name="NVIDIA H100 80GB HBM3")
    for name, value in values.items():
        setattr(gpu, name, value)
    return gpu


def group(xid: int, ago: float | None) -> XidGroup:
    return XidGroup(xid, 1, None if ago is None else NOW - ago, "")


HOUR = 3600.0


@pytest.mark.parametrize(
    ("xid", "ago", "gpu", "status", "says"),
    [
        (13, 60, reading(), Status.OK, "application error"),
        (63, 60, reading(), Status.OK, ": none"),
        (8, 60, reading(), Status.WARN, ""),
        (8, 2 * HOUR, reading(), Status.OK, ""),
        (8, None, reading(), Status.WARN, ""),
        # reset class: fails until the GPU shows it recovered
        (48, 60, None, Status.FAIL, ""),
        (48, 2 * HOUR, reading(lost="GPU is lost"), Status.FAIL, ""),
        (48, 2 * HOUR, reading(recovery_action=1), Status.FAIL, "still asks"),
        (48, 60, reading(recovery_action=0), Status.FAIL, ""),  # the field may lag: settle
        (48, 10 * 60, reading(recovery_action=0), Status.OK, "no recovery action pending"),
        (48, None, reading(recovery_action=0), Status.OK, "no recovery action pending"),
        (48, HOUR, reading(), Status.FAIL, ""),  # no field: nothing confirms the reset
        (48, 2 * 86_400, reading(), Status.WARN, "recovery not confirmed"),
        (48, None, reading(), Status.WARN, "time unknown, recovery not confirmed"),
        (48, 2 * 86_400 + 1, reading(), Status.OK, "before the last boot"),
        # XID 79: a GPU off the bus cannot answer; answering again means it was reset
        (79, 60, None, Status.FAIL, ""),
        (79, 60, reading(), Status.OK, "the GPU answers again"),
        (79, 60, reading(recovery_action=2), Status.FAIL, "still asks"),
        (154, 60, reading(recovery_action=0), Status.OK, "no recovery action pending"),
        (154, 60, reading(), Status.WARN, ""),
        (999, 60, reading(), Status.WARN, "unknown"),
        # an XID the catalog does not settle: the driver's recovery action decides
        (999, 60, reading(recovery_action=2), Status.FAIL, "asks for recovery action 2"),
        (2, 2 * HOUR, reading(recovery_action=4), Status.FAIL, "asks for recovery action 4"),
        (999, 60, reading(recovery_action=0), Status.WARN, "unknown"),
        (2, 60, reading(recovery_action=1, lost="GPU is lost"), Status.WARN, ""),
        (999, 3 * 86_400, reading(), Status.OK, "before the last boot"),
    ],
)
def test_judge_group(
    xid: int, ago: float | None, gpu: GpuReading | None, status: Status, says: str
) -> None:
    boot = NOW - 2 * 86_400  # the node booted two days ago
    found, summary, remedy = judge_group(group(xid, ago), gpu, NOW, boot)
    assert found is status, summary
    assert says in summary
    assert bool(remedy) == (status is not Status.OK)


GPU_A, GPU_B = "0000:1b:00.0", "0000:3a:00.0"


def kernel_event(bus: str, xid: int, at: float | None) -> XidEvent:
    return XidEvent(bus, xid, at, "kernel log")


def nvml_event(bus: str, xid: int, at: float | None) -> XidEvent:
    return XidEvent(bus, xid, at, "nvml event")


def test_merge_keeps_exactly_the_events_not_seen_within_5_s_of_the_same_gpu_and_xid() -> None:
    """Same GPU and XID less than 5 s apart (either way) is one error; 5 s apart, another
    GPU or XID, or an unknown time is another. NVML events duplicate each other too.
    Kernel events come first, in their order, then the NVML events kept, in theirs."""
    kernel = [
        kernel_event(GPU_A, 79, 100.0),
        kernel_event(GPU_A, 48, 100.0),
        kernel_event(GPU_B, 79, 300.0),
        kernel_event(GPU_A, 79, None),
        kernel_event(GPU_A, 79, 90.0),  # out of order: not sorted by the caller
    ]
    nvml = [
        nvml_event(GPU_A, 79, 104.999),  # 4.999 s after 100: the same
        nvml_event(GPU_A, 79, 95.5),  # between 90 and 100: the same
        nvml_event(GPU_A, 79, 85.001),  # 4.999 s before 90: the same
        nvml_event(GPU_A, 79, 105.0),  # exactly 5 s after 100: another
        nvml_event(GPU_A, 79, 109.0),  # 4 s after the NVML one kept at 105: the same
        nvml_event(GPU_A, 79, 85.0),  # exactly 5 s before 90: another
        nvml_event(GPU_B, 48, 300.0),  # another XID on GPU B
        nvml_event(GPU_A, 31, 100.0),  # an XID the kernel log lacks
        nvml_event(GPU_B, 79, None),  # no time: never taken for another
        nvml_event(GPU_B, 79, None),
        nvml_event(GPU_A, 48, 96.0),  # 4 s before GPU A's 48: the same
    ]
    merged = merge_sources(kernel, nvml)
    assert merged[: len(kernel)] == kernel
    kept = [(e.bus_id, e.xid, e.at) for e in merged[len(kernel) :]]
    assert kept == [
        (GPU_A, 79, 105.0),
        (GPU_A, 79, 85.0),
        (GPU_B, 48, 300.0),
        (GPU_A, 31, 100.0),
        (GPU_B, 79, None),
        (GPU_B, 79, None),
    ]


# -- the gpu_xid check on the healthy DGX replica (booted two days ago), each log form ----

OLD_GPU, NEW_GPU = "0000:1a:00.0", "0000:3a:00.0"


def _utc(at: float) -> datetime:
    return datetime.fromtimestamp(at, timezone.utc)


def _local(at: float) -> time.struct_time:
    return time.localtime(at)


def _stamp(form: str, at: float) -> str:
    """The text a log of `form` writes before a kernel message logged at `at`."""
    utc, local = _utc(at), _local(at)
    if form == "dmesg --decode --time-format iso":
        return f"kern  :warn  : {utc:%Y-%m-%dT%H:%M:%S},{utc.microsecond:06d}+00:00 "
    if form == "dmesg -T":
        return (
            f"[{time.strftime('%a %b', local)} {local.tm_mday:2d} {time.strftime('%T %Y', local)}] "
        )
    if form == "dmesg --time-format reltime":
        return f"[{time.strftime('%b', local)}{local.tm_mday:2d} {time.strftime('%H:%M', local)}] "
    if form == "journalctl -o short":
        day = f"{time.strftime('%b', local)} {local.tm_mday:2d}"
        return f"{day} {time.strftime('%T', local)} n7 kernel: "
    if form == "journalctl -o short-precise":
        return f"{time.strftime('%b %d %T', local)}.{utc.microsecond:06d} n7 kernel: "
    if form == "journalctl -o short-iso":
        return f"{utc:%Y-%m-%dT%H:%M:%S}+0000 n7 kernel: "
    if form == "journalctl -o short-iso-precise":
        return f"{utc:%Y-%m-%dT%H:%M:%S.%f}+0000 n7 kernel: "
    if form == "journalctl -o short-full":
        return f"{utc:%a %Y-%m-%d %H:%M:%S} UTC n7 kernel: "
    if form == "rsyslog RFC 3339":
        return f"{utc:%Y-%m-%dT%H:%M:%S.%f}+00:00 n7 kernel: "
    if form == "RFC 5424":
        return f"<4>1 {utc:%Y-%m-%dT%H:%M:%S.%f}Z n7 kernel - - - "
    raise AssertionError(form)


def boot_time_of(node: Node) -> float:
    """The btime the replica's /proc/stat says (written when the tree was built, which may be
    long before a test runs: never time.time() minus the uptime)."""
    boot = parse_boot_time((node.root / "proc" / "stat").read_text())
    assert boot is not None
    return boot


ABSOLUTE_FORMS = (
    "dmesg --decode --time-format iso",
    "dmesg -T",
    "dmesg --time-format reltime",
    "journalctl -o short",
    "journalctl -o short-precise",
    "journalctl -o short-iso",
    "journalctl -o short-iso-precise",
    "journalctl -o short-full",
    "rsyslog RFC 3339",
    "RFC 5424",
)


@pytest.mark.parametrize("form", ABSOLUTE_FORMS)
def test_an_absolute_time_places_a_reset_xid_before_or_after_this_boot(
    dgx: Node, tmp_path: Path, form: str
) -> None:
    """XID 48 (reset the GPU) three days ago, before the replica booted, is history; the
    same two minutes ago on another GPU fails (its recovery action may still lag). Read as
    "unknown" the time could place neither."""
    now = time.time()
    old, new = now - 3 * 86_400, now - 120
    path = tmp_path / "kern.log"
    path.write_text(
        f"{_stamp(form, old)}NVRM: Xid (PCI:{OLD_GPU[:-2]}): 48, pid=1, name=a, DBE\n"
        f"{_stamp(form, new - 30)}nvidia 0000:3a:00.0: a line between\n"
        f"{_stamp(form, new)}NVRM: Xid (PCI:{NEW_GPU[:-2]}): 48, pid=2, name=b, DBE\n"
    )
    results = {r.subject: r for r in dgx.results("gpu_xid", kernel_log=path)}
    before, after = results[gpu_subject(OLD_GPU)], results[gpu_subject(NEW_GPU)]
    assert before.status is Status.OK and "before the last boot" in before.summary, before
    assert after.status is Status.FAIL and "XID 48 GPU_ECC_DBE x1, last" in after.summary, after
    assert "unknown time" not in after.summary
    assert after.details["log_times"], after.details


def test_a_log_without_times_is_read_and_says_so(dgx: Node, tmp_path: Path) -> None:
    """dmesg -t (notime): a file of bare messages is a kernel log when the driver's lines
    are in it; each XID is at an unknown time, and the result says so and how."""
    path = tmp_path / "dmesg-t.txt"
    path.write_text(
        "nvidia-nvlink: Nvlink Core is being initialized, major device number 509\n"
        f"NVRM: Xid (PCI:{NEW_GPU[:-2]}): 8, pid=5, name=python, Channel 00000010\n"
    )
    results = {r.subject: r for r in dgx.results("gpu_xid", kernel_log=path)}
    result = results[gpu_subject(NEW_GPU)]
    assert result.status is Status.WARN and "last at an unknown time" in result.summary, result
    assert result.details["log_times"] == ["no time on the line"]


def test_nvlink5_lines_are_judged_by_the_drivers_word(dgx: Node, tmp_path: Path) -> None:
    """GB200-style XID 149 lines: Nonfatal on one GPU passes (counted), Fatal on another
    fails with the catalog's reset; the Fatal one is shown though a Nonfatal came later."""
    boot = boot_time_of(dgx)

    def kmsg(ago: float, text: str) -> str:
        return f"4,1,{int((time.time() - ago - boot) * 1e6)},-;{text}\n"

    path = tmp_path / "kmsg.txt"
    path.write_text(
        kmsg(
            300,
            f"NVRM: Xid (PCI:{OLD_GPU[:-2]}): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 3 (0x1)",
        )
        + kmsg(
            200, f"NVRM: Xid (PCI:{OLD_GPU[:-2]}): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 2 (0x2)"
        )
        + kmsg(60, f"NVRM: Xid (PCI:{NEW_GPU[:-2]}): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 8 (0x3)")
        + kmsg(
            30, f"NVRM: Xid (PCI:{NEW_GPU[:-2]}): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 1 (0x4)"
        )
    )
    results = {r.subject: r for r in dgx.results("gpu_xid", kernel_log=path)}
    calm, broken = results[gpu_subject(OLD_GPU)], results[gpu_subject(NEW_GPU)]
    assert calm.status is Status.OK and calm.details["xids"] == {"145": 1, "149": 1}, calm
    assert "Nonfatal, as the driver says: no action" in calm.summary
    assert broken.status is Status.FAIL and "NETIR_LINK_EVT Fatal" in broken.summary, broken
    assert broken.remedy == "drain the node and reset the GPU"
    pending = {
        s.labels["action"]: s.value for s in broken.samples if s.metric.name.endswith("pending")
    }
    assert pending == {"reset_gpu": 1}


def test_a_file_of_bare_messages_is_a_kernel_log_only_with_the_drivers_lines(
    tmp_path: Path,
) -> None:
    """Without stamps (dmesg -t) only the NVIDIA driver's own prefixes tell a kernel log
    from any text: notes that mention the driver are still refused."""
    bare = tmp_path / "dmesg-t.txt"
    bare.write_text("eth0: link up\nNVRM: Xid (PCI:0000:1b:00): 13, Graphics Exception\n")
    assert "NVRM: Xid" in read_kernel_log(bare).text
    notes = tmp_path / "notes.txt"
    notes.write_text("nvidia is the vendor\n- NVRM is the driver\nnvidia-smi: fine\n")
    with pytest.raises(ReadError, match="not a kernel log"):
        read_kernel_log(notes)


def test_nul_bytes_end_lines_and_are_said(tmp_path: Path) -> None:
    """A log file whose start a crash left as zeros (an unclean shutdown), its one line after
    them: read, not refused as binary, the line's time kept; and a run of NULs in a line's
    middle ends it there."""
    path = tmp_path / "kern.log"
    path.write_bytes(b"\0" * 100 + f"[ 2.0] {XID}\n".encode())
    read = read_kernel_log(path)
    assert read.text == f"\n[ 2.0] {XID}\n"
    assert read.notes == (
        "1 run of NUL bytes (100 bytes) read as line breaks (what a crash leaves in a log "
        "file that was being written)",
    )
    [event] = parse_kernel_log(read.text, BOOT, NOW)
    assert event.at == BOOT + 2
    path.write_bytes(f"[ 1.0] eth0: link u\0\0\0[ 3.0] {XID}\n".encode())
    read = read_kernel_log(path)
    assert read.text.splitlines() == ["[ 1.0] eth0: link u", f"[ 3.0] {XID}"]
    [event] = parse_kernel_log(read.text, BOOT, NOW)
    assert event.at == BOOT + 3
    clean = tmp_path / "clean.log"
    clean.write_text(f"[ 3.0] {XID}\n")
    assert read_kernel_log(clean).notes == ()


def test_a_tail_read_whose_first_line_ended_keeps_what_follows(tmp_path: Path) -> None:
    """A log larger than the 16 MiB read: what the tail holds after its first line's end
    is read, however long that first line."""
    path = tmp_path / "kern.log"
    path.write_bytes(b"x" * KERNEL_LOG_LIMIT + f"\n[ 4.0] {XID}\n".encode())
    read = read_kernel_log(path)
    assert read.cut and read.text == f"[ 4.0] {XID}\n"


def test_one_run_reads_the_kernel_log_once_for_both_checks(
    dgx: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpu_xid and nvswitch_sxid in one run share one read of the log (up to 16 MiB each
    before); a log that changed is read again, and a failed read is not kept."""
    reads: list[Path] = []
    real_read = kernel_log_module.read_kernel_log

    def counting_read(path: Path) -> KernelLogText:
        reads.append(path)
        return real_read(path)

    monkeypatch.setattr(kernel_log_module, "read_kernel_log", counting_read)
    since_boot = time.time() - 60 - boot_time_of(dgx)
    path = tmp_path / "kern.log"
    path.write_text(
        f"[{since_boot:12.6f}] NVRM: Xid (PCI:{NEW_GPU[:-2]}): 48, pid=2, name=b, DBE\n"
        f"[{since_boot:12.6f}] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 44 "
        "sourcetrack timeout error\n"
    )
    context = dgx.context(kernel_log=path)
    runs = run_checks([load_checks()[name] for name in ("gpu_xid", "nvswitch_sxid")], context)
    results = {r.subject: r for run in runs for r in run.results}
    assert results[gpu_subject(NEW_GPU)].status is Status.FAIL
    assert results["nvswitch 0000:05:00.0"].status is Status.FAIL
    assert reads == [path]
    with path.open("a") as log_file:  # the log grew: read afresh
        log_file.write(f"[{since_boot + 1:12.6f}] NVRM: Xid (PCI:{NEW_GPU[:-2]}): 13, pid=3\n")
    assert [e.xid for e in context.part("kernel_log").xids] == [48, 13] and len(reads) == 2
    missing = tmp_path / "later.log"
    later = dgx.context(kernel_log=missing)
    unreadable = later.part("kernel_log").unreadable
    assert unreadable is not None and unreadable.reason == "missing"
    missing.write_text(f"[ 1.0] NVRM: Xid (PCI:{NEW_GPU[:-2]}): 13, pid=4\n")
    assert [e.message for e in later.part("kernel_log").xids] == ["pid=4"]


def test_the_faulty_replica_counts_its_lost_gpu_once_with_or_without_the_xid_line(
    dgx_faulty: Node, copy_node: Callable[[Node], Node]
) -> None:
    """The faulty DGX's log has XID 79 and, a second later, the driver's own lost-GPU line:
    one XID 79. With the Xid line gone (a log filtered on something else), the lost-GPU line
    alone still fails the GPU as XID 79, and says where it came from."""

    def lost_gpu(node: Node) -> Result:
        [result] = [r for r in node.results("gpu_xid") if r.subject == gpu_subject("0000:bc:00.0")]
        return result

    both = lost_gpu(dgx_faulty)
    assert both.status is Status.FAIL and both.details["xids"] == {"79": 1}, both
    node = copy_node(dgx_faulty)
    kmsg = node.root / "dev" / "kmsg"
    lines = kmsg.read_text().splitlines(keepends=True)
    kmsg.write_text("".join(line for line in lines if "Xid (PCI:0000:bc:00)" not in line))
    alone = lost_gpu(node)
    assert alone.status is Status.FAIL and alone.details["xids"] == {"79": 1}, alone
    assert "without an Xid 79 line" in alone.summary
    assert alone.remedy == "drain the node and reboot it"


def test_the_agents_checks_share_one_read_until_the_log_changes(
    dgx: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the agent each check has its own context; checks run close together share the
    read through SharedReads, one entry per path, read again when the file changed."""
    reads: list[Path] = []
    real_read = kernel_log_module.read_kernel_log

    def counting_read(path: Path) -> KernelLogText:
        reads.append(path)
        return real_read(path)

    monkeypatch.setattr(kernel_log_module, "read_kernel_log", counting_read)
    path = tmp_path / "kern.log"
    path.write_text(f"[ 1.0] NVRM: Xid (PCI:{NEW_GPU[:-2]}): 13, pid=1\n")
    shared = SharedReads(ttl_s=3600)
    first, second = (CheckContext(fs=dgx.fs, kernel_log=path, shared=shared) for _ in "ab")
    assert first.part("kernel_log") is second.part("kernel_log")
    assert reads == [path]
    with path.open("a") as log_file:
        log_file.write(f"[ 2.0] NVRM: Xid (PCI:{NEW_GPU[:-2]}): 13, pid=2\n")
    assert "pid=2" in [e.message for e in second.part("kernel_log").xids] and len(reads) == 2
    assert first.part("kernel_log") is second.part("kernel_log") and len(reads) == 2
