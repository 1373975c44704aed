"""Real kernel logs with NVIDIA XIDs (captured by leptonai/gpud on real machines, not written
for nodecheck): each is read and judged, and what its lines carry is asserted.

The classes they stand for are covered without them by tests/checks/test_xid.py and
tests/checks/test_sxid.py (literal lines of every form).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from nodecheck.checks.gpu.xid import group_events, judge_gpu
from nodecheck.checks.node.kernel_log import MESSAGE_LIMIT, read_kernel_log
from nodecheck.checks.node.sxid import parse_sxids
from nodecheck.checks.node.xid import parse_kernel_log
from nodecheck.checks.result import Action, Status, gpu_subject
from tests.conftest import Node

LABELS = {"gpu": "", "bus_id": "", "model": "unknown"}


def xid_log(real_data: Path, name: str) -> Path:
    path = real_data / "xid" / name
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    return path


def local(text: str) -> float:
    return time.mktime(time.strptime(text, "%a %b %d %H:%M:%S %Y"))


def test_dmesg_t_of_an_xe9680_with_xid_119(real_data: Path, dgx: Node) -> None:
    """`dmesg -T` of a Dell XE9680: XID 119 (GSP RPC timeout) five times on 0000:9b:00, at
    the local times its lines carry; a reset-class XID of this boot fails, one from before
    the last boot is history."""
    path = xid_log(real_data, "gpud_dmesg-T_xe9680_xid119.log")
    text = read_kernel_log(path).text
    events = parse_kernel_log(text, None, now=time.time())
    assert {(e.bus_id, e.xid) for e in events} == {("0000:9b:00.0", 119)}
    assert [e.at for e in events] == [
        local("Sun Feb 23 16:24:18 2025"),
        local("Sun Feb 23 16:24:24 2025"),
        local("Sun Feb 23 16:24:30 2025"),
        local("Sun Feb 23 16:27:12 2025"),
        local("Sun Feb 23 16:30:13 2025"),
    ]
    assert events[0].message.startswith("pid=2024380, name=nvidia-smi, Timeout after 6s")
    last = local("Sun Feb 23 16:30:13 2025")
    this_boot = judge_gpu(events, None, LABELS, last + 60, last - 86_400, "the log")
    result = this_boot.result("gpu")
    assert result.status is Status.FAIL and "XID 119 GSP_RPC_TIMEOUT x5" in result.summary
    assert result.remedy == "drain the node and reset the GPU"
    rebooted = judge_gpu(events, None, LABELS, last + 86_400, last + 3600, "the log")
    assert rebooted.result("gpu").status is Status.OK
    # through the check: on the replica, booted two days ago, February 2025 is history
    results = {r.subject: r for r in dgx.results("gpu_xid", kernel_log=path)}
    history = results[gpu_subject("0000:9b:00.0")]
    assert history.status is Status.OK and "before the last boot" in history.summary, history


def test_dmesg_decode_iso_with_xids_13_and_43(real_data: Path, dgx: Node) -> None:
    """`dmesg --decode --time-format iso` ("kern  :warn  : 2025-01-21T04:41:44,283302+00:00"):
    16 XID 13 and one XID 43 on 0000:38:00, with their real times; both application errors."""
    path = xid_log(real_data, "gpud_dmesg-decode-iso_xid13_43.log")
    events = parse_kernel_log(read_kernel_log(path).text, None, now=time.time())
    assert [(e.bus_id, e.xid) for e in events] == [("0000:38:00.0", 13)] * 16 + [
        ("0000:38:00.0", 43)
    ]
    first = datetime(2025, 1, 21, 4, 41, 44, 283302, timezone.utc).timestamp()
    assert events[0].at == pytest.approx(first)
    assert events[-1].at == pytest.approx(first + (287197 - 283302) / 1e6)
    results = {r.subject: r for r in dgx.results("gpu_xid", kernel_log=path)}
    app = results[gpu_subject("0000:38:00.0")]
    assert app.status is Status.OK and app.details["xids"] == {"13": 16, "43": 1}, app
    assert "application error" in app.summary and "unknown time" not in app.summary


def test_gb200_nvlink5_lines_fatal_and_nonfatal_as_each_says(real_data: Path) -> None:
    """19 GB200 lines of XIDs 145 and 149 (no time on them, as `dmesg -t` writes), each
    saying Fatal or Nonfatal: each is read as it says, the Nonfatal 145s need no action,
    and every GPU with a Fatal 149 fails with the catalog's reset, showing a Fatal line."""
    path = xid_log(real_data, "gb200_nvlink5_log1-19.txt")
    text = read_kernel_log(path).text  # a log without times is still a kernel log
    lines = text.splitlines()
    events = parse_kernel_log(text, None, now=time.time())
    assert len(events) == len(lines) == 19
    for line, event in zip(lines, events, strict=True):
        assert event.severity == ("fatal" if " Fatal XC" in line else "nonfatal"), line
        assert event.at is None
    counts: dict[tuple[str, int, str | None], int] = {}
    for event in events:
        key = (event.bus_id, event.xid, event.severity)
        counts[key] = counts.get(key, 0) + 1
    assert counts == {
        ("0008:01:00.0", 145, "nonfatal"): 3,
        ("0008:01:00.0", 149, "fatal"): 3,
        ("0008:01:00.0", 149, "nonfatal"): 1,
        ("0018:01:00.0", 145, "nonfatal"): 2,
        ("0018:01:00.0", 149, "fatal"): 5,
        ("0018:01:00.0", 149, "nonfatal"): 1,
        ("0019:01:00.0", 145, "nonfatal"): 2,
        ("0019:01:00.0", 149, "fatal"): 2,
    }
    for bus in ("0008:01:00.0", "0018:01:00.0", "0019:01:00.0"):
        mine = [e for e in events if e.bus_id == bus]
        nvlink, netir = group_events(mine)
        assert (nvlink.xid, nvlink.fatal, netir.xid) == (145, 0, 149)
        assert " Fatal XC" in netir.message, netir
        verdict = judge_gpu(mine, None, LABELS, time.time(), None, "the log")
        by_xid = {summary.split()[1]: status for status, summary, _, _ in verdict.findings}
        assert by_xid == {"145": Status.OK, "149": Status.FAIL}, verdict.findings
        result = verdict.result("gpu")
        assert result.remedy == "drain the node and reset the GPU"
        assert result.action is Action.RESET_GPU  # the failing XID 149's, not the 145's


def test_a_kmsg_dump_with_nvswitches_and_no_xid(real_data: Path, dgx: Node) -> None:
    """A /dev/kmsg dump of an NVSwitch node (nvidia-nvswitch0-3 opened), with no XID or
    SXid: it is a kernel log, and nothing is found in it."""
    path = xid_log(real_data, "gpud_kmsg1_no_xid.kmsg")
    text = read_kernel_log(path).text
    assert "nvidia-nvswitch3: open" in text
    assert parse_kernel_log(text, None, now=time.time()) == []
    assert parse_sxids(text, None, time.time()) == []
    results = dgx.results("nvswitch_sxid", kernel_log=path)
    assert [r.status for r in results] == [Status.OK] * 4
    assert all(r.summary == f"no SXid in the kernel log ({path})" for r in results)


@pytest.mark.parametrize(
    "name",
    [
        "gb200_nvlink5_log1-19.txt",
        "gpud_dmesg-T_xe9680_xid119.log",
        "gpud_dmesg-decode-iso_xid13_43.log",
    ],
)
def test_no_real_xid_message_is_cut(real_data: Path, name: str) -> None:
    """Results show a message's first MESSAGE_LIMIT characters (a line may be megabytes):
    the driver's real messages are shorter, and each reaches the results whole."""
    path = xid_log(real_data, name)
    text = read_kernel_log(path).text
    events = parse_kernel_log(text, None, now=time.time())
    assert events
    for event in events:
        assert len(event.message) <= MESSAGE_LIMIT and event.message in text, event.message
