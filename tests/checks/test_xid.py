"""XID parsing and judging, on literal kernel log lines and readings."""

from __future__ import annotations

import time

import pytest

from nodecheck.checks.gpu.xid import XidGroup, judge_group
from nodecheck.checks.node.gpu import (
    GpuReading,
    normalize_bus_id,
    parse_kernel_module_version,
)
from nodecheck.checks.node.xid import XidEvent, merge_sources, parse_boot_time, parse_kernel_log
from nodecheck.checks.result import Status

BOOT = 1_790_000_000.0  # 2026-09-21, wall-clock seconds
NOW = BOOT + 86_400.0
LOCAL_NOON = time.mktime((2026, 9, 22, 12, 0, 0, 0, 0, -1))
ISO_TEN = 1_789_984_800.0  # 2026-09-21T10:00:00Z


@pytest.mark.parametrize(
    ("line", "at"),
    [
        # /dev/kmsg: microseconds since boot
        ("4,1234,5000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, GPU has fallen off", BOOT + 5),
        # dmesg and dmesg -x: seconds since boot in brackets
        ("[  123.500000] NVRM: Xid (PCI:0000:1b:00): 79, pid=77", BOOT + 123.5),
        ("kern  :warn  : [  123.500000] NVRM: Xid (PCI:0000:1b:00): 79", BOOT + 123.5),
        ("<4>[  123.500000] NVRM: Xid (PCI:0000:1b:00): 79", BOOT + 123.5),
        # journalctl -o short-iso, rsyslog RFC 3339
        ("2026-09-21T10:00:00+00:00 dgx01 kernel: NVRM: Xid (PCI:0000:1b:00): 79", ISO_TEN),
        # kern.log: the syslog stamp wins over the since-boot one after it
        ("Sep 22 12:00:00 dgx01 kernel: [ 9.0] NVRM: Xid (PCI:0000:1b:00): 79", LOCAL_NOON),
        # dmesg -T
        ("[Tue Sep 22 12:00:00 2026] NVRM: Xid (PCI:0000:1b:00): 79", LOCAL_NOON),
        # no time at all
        ("NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.", None),
    ],
)
def test_line_times(line: str, at: float | None) -> None:
    [event] = parse_kernel_log(line, BOOT, now=NOW)
    assert (event.bus_id, event.xid) == ("0000:1b:00.0", 79)
    assert event.at == at


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
