"""NVSwitch SXids: the kernel log lines nvidia-nvswitch writes, their judging, the check."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from nodecheck.checks.host.nvswitch_sxid import (
    REBOOT_REMEDY,
    REPEAT_REMEDY,
    RESET_REMEDY,
    THERMAL_REMEDY,
    judge_sxid,
)
from nodecheck.checks.node.sxid import SxidEvent, SxidKind, classify_sxid, parse_sxids
from nodecheck.checks.result import Status
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


def test_the_catalog() -> None:
    assert classify_sxid(12028).kind is SxidKind.NONFATAL
    assert classify_sxid(24007).kind is SxidKind.FATAL
    assert classify_sxid(22003).kind is SxidKind.ALWAYS_FATAL
    assert classify_sxid(10004).kind is SxidKind.THERMAL
    assert classify_sxid(99999).kind is SxidKind.UNKNOWN


def sxid(code: int, fatal: bool | None, ago: float | None) -> SxidEvent:
    return SxidEvent(SWITCH, code, fatal, None if ago is None else NOW - ago, "Link 4 x")


HOUR = 3600.0


@pytest.mark.parametrize(
    ("events", "status", "remedy", "says"),
    [
        # fatal (the line's word) from this boot: reset the partition's GPUs and NVSwitches
        ([sxid(24007, True, 60)], Status.FAIL, RESET_REMEDY, "(1 fatal)"),
        # the line says Fatal though the catalog calls the code non-fatal: the line wins
        ([sxid(12028, True, 60)], Status.FAIL, RESET_REMEDY, "(1 fatal)"),
        # always fatal: the whole fabric, the host restarts
        ([sxid(22003, True, 60)], Status.FAIL, REBOOT_REMEDY, "minion halt"),
        # no word on the line: the catalog's
        ([sxid(22003, None, 60)], Status.FAIL, REBOOT_REMEDY, "(1 fatal)"),
        # a time unknown may be of this boot: still a failure, said so
        ([sxid(24007, True, None)], Status.FAIL, RESET_REMEDY, "may be from this boot"),
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


def test_the_fatal_line_is_shown_over_later_non_fatal_ones() -> None:
    events = [
        SxidEvent(SWITCH, 12028, True, NOW - 600, "Link 2 the fatal one"),
        SxidEvent(SWITCH, 12028, False, NOW - 60, "Link 3 a later one"),
    ]
    judged = judge_sxid(12028, events, NOW, NOW - 86_400)
    assert judged.status is Status.FAIL and "Link 2 the fatal one" in judged.summary


# -- the nvswitch_sxid check on replicas: the DGX has four NVSwitches, the workstation none --

DGX_SWITCHES = ("0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "0000:05:00.0")


def test_a_fatal_sxid_fails_its_nvswitch_only(dgx: Node, tmp_path: Path) -> None:
    boot = time.time() - 2 * 86_400
    since_boot = time.time() - 60 - boot
    path = tmp_path / "kern.log"
    path.write_text(
        f"[{since_boot:12.6f}] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 44 "
        "sourcetrack timeout error\n"
        f"[{since_boot:12.6f}] nvidia-nvswitch2: SXid (PCI:0000:04:00.0): 12028, Non-fatal, "
        "Link 3 egress non-posted PRIV error (First)\n"
    )
    results = {r.subject: r for r in dgx.results("nvswitch_sxid", kernel_log=path)}
    assert set(results) == {f"nvswitch {bdf}" for bdf in DGX_SWITCHES}
    fatal = results["nvswitch 0000:05:00.0"]
    assert fatal.status is Status.FAIL and fatal.remedy == RESET_REMEDY, fatal
    assert re.match(
        r"SXid 24007 sourcetrack timeout error x1 \(1 fatal\), last 6\d s ago \(Link 44 ",
        fatal.summary,
    ), fatal.summary
    samples = {(s.metric.name, s.labels["sxid"]): s.value for s in fatal.samples}
    assert samples == {
        ("nodecheck_nvswitch_sxid_events", "24007"): 1,
        ("nodecheck_nvswitch_sxid_last_seen_timestamp_seconds", "24007"): pytest.approx(
            time.time() - 60, abs=5
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


def test_the_replicas_own_kernel_log_has_no_sxid(dgx: Node) -> None:
    results = dgx.results("nvswitch_sxid")
    assert [r.status for r in results] == [Status.OK] * 4
