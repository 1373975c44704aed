"""XID errors per GPU, from the kernel log and the agent's NVML event listener.

Each XID is judged by NVIDIA's action for it (hardware.md §5.3): application
errors and informational XIDs are reported but pass; "restart the app" XIDs
warn for an hour; XIDs that need a GPU reset or a reboot fail until the GPU
has recovered. Recovered means the GPU answers NVML normally again and either
the driver's recovery-action field reads NONE (five minutes after the XID) or a
day has passed without the XID recurring. That is the fix for dcgm-exporter
#500 and k8s-device-plugin #234: a GPU is never "unhealthy forever" for an
error that was dealt with, yet never healthy while it still needs the action.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.fs import ReadError
from nodecheck.checks.node.gpu import GpuReading
from nodecheck.checks.node.xid import XidAction, XidEvent, classify, kernel_log_xids, merge_sources
from nodecheck.checks.per_gpu import GPU_LABELS, Verdict
from nodecheck.checks.registry import register
from nodecheck.checks.result import NODE, MetricSpec, Result, Sample, Status, gpu_subject

XID_LABELS = (*GPU_LABELS, "xid")
ERRORS = MetricSpec(
    "nodecheck_gpu_xid_errors_total",
    "counter",
    "XID errors seen since boot (kernel log NVRM: Xid lines, NVML XID events)",
    XID_LABELS,
)
LAST_SEEN = MetricSpec(
    "nodecheck_gpu_xid_last_seen_timestamp_seconds",
    "gauge",
    "When this XID was last seen on this GPU, in seconds since the epoch",
    XID_LABELS,
)
ACTIVE = MetricSpec(
    "nodecheck_gpu_xid_action_pending",
    "gauge",
    "1 while this XID's action (restart, reset, reboot) is not yet done, 0 once recovered",
    (*XID_LABELS, "action"),
)

RESTART_APP_WINDOW_S = 3600.0
RECOVERY_SETTLE_S = 300.0
FORGET_AFTER_S = 86400.0
RECOVERY_ACTION_NONE = 0


@dataclass(frozen=True)
class XidGroup:
    """Every occurrence of one XID on one GPU."""

    xid: int
    count: int
    last_seen: float | None
    message: str


def group_events(events: list[XidEvent]) -> list[XidGroup]:
    groups: dict[int, list[XidEvent]] = {}
    for event in events:
        groups.setdefault(event.xid, []).append(event)
    result = []
    for xid, seen in sorted(groups.items()):
        times = [e.at for e in seen if e.at is not None]
        latest = max(seen, key=lambda e: e.at or 0.0)
        result.append(XidGroup(xid, len(seen), max(times) if times else None, latest.message))
    return result


def _recovered(group: XidGroup, gpu: GpuReading | None, now: float) -> bool:
    if gpu is None or not gpu.readable or group.last_seen is None:
        return False
    age = now - group.last_seen
    if gpu.recovery_action == RECOVERY_ACTION_NONE and age > RECOVERY_SETTLE_S:
        return True
    return age > FORGET_AFTER_S


def judge_group(group: XidGroup, gpu: GpuReading | None, now: float) -> tuple[Status, str, str]:
    """(status, summary, remedy) for one XID on one GPU."""
    info = classify(group.xid)
    age = None if group.last_seen is None else now - group.last_seen
    when = "at an unknown time" if age is None else f"{_ago(age)} ago"
    text = f"XID {group.xid} {info.mnemonic} x{group.count}, last {when}"
    if group.message:
        text += f" ({group.message})"
    action = info.action
    if action in (XidAction.NONE, XidAction.APP_ERROR):
        return Status.OK, f"{text}: {action.value}", ""
    if action is XidAction.RESTART_APP:
        recent = age is None or age < RESTART_APP_WINDOW_S
        return (Status.WARN if recent else Status.OK), text, action.value
    if action is XidAction.FOLLOW_RECOVERY_ACTION:
        if gpu is not None and gpu.recovery_action == RECOVERY_ACTION_NONE:
            return Status.OK, f"{text}: the driver reports no recovery action pending", ""
        return Status.WARN, text, "read the GPU's recovery action (gpu_state) and follow it"
    if action is XidAction.UNKNOWN:
        recent = age is None or age < FORGET_AFTER_S
        return (Status.WARN if recent else Status.OK), text, action.value
    if _recovered(group, gpu, now):
        return Status.OK, f"{text}: recovered since", ""
    return Status.FAIL, text, action.value


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def judge_gpu(
    events: list[XidEvent], gpu: GpuReading | None, labels: dict[str, str], now: float, source: str
) -> Verdict:
    verdict = Verdict(f"no XID in {source}")
    for group in group_events(events):
        status, summary, remedy = judge_group(group, gpu, now)
        verdict.add(status, summary, remedy)
        xid_labels = {**labels, "xid": str(group.xid)}
        verdict.samples.append(Sample(ERRORS, group.count, xid_labels))
        if group.last_seen is not None:
            verdict.samples.append(Sample(LAST_SEEN, group.last_seen, xid_labels))
        pending = status in (Status.WARN, Status.FAIL) and classify(group.xid).action not in (
            XidAction.NONE,
            XidAction.APP_ERROR,
        )
        action = {**xid_labels, "action": classify(group.xid).action.name.lower()}
        verdict.samples.append(Sample(ACTIVE, 1 if pending else 0, action))
    verdict.details["xids"] = {str(g.xid): g.count for g in group_events(events)}
    return verdict


@register("gpu_xid", interval_s=60, timeout_s=15)
def check_gpu_xid(ctx: CheckContext) -> Iterator[Result]:
    """XID errors per GPU, judged by NVIDIA's recommended action."""
    path = ctx.kernel_log_path
    snapshot = ctx.gpus.snapshot
    readings = snapshot.by_bus_id()
    known = {gpu.bdf for gpu in ctx.inventory.gpus} | set(readings)
    kernel: list[XidEvent] = []
    sources = []
    try:
        kernel = kernel_log_xids(ctx.fs, path)
        sources.append(f"the kernel log ({path})")
    except ReadError as err:
        if not known:
            yield Result(Status.SKIP, NODE, "no GPU on the PCI bus or in NVML")
            return
        if ctx.xid_log is None:
            yield Result(
                Status.ERROR,
                NODE,
                f"cannot read the kernel log for XIDs: {err}",
                "run as root (or with CAP_SYSLOG), set kernel.dmesg_restrict=0, or point "
                "--kernel-log at a readable copy of the kernel log",
                {"cause": err.reason},
            )
            return
    listened = ctx.xid_log.events() if ctx.xid_log is not None else []
    if ctx.xid_log is not None:
        sources.append("NVML events")
    events = merge_sources(kernel, listened)

    buses = known | {e.bus_id for e in events}
    now = time.time()
    source = " or ".join(sources)
    for bus_id in sorted(buses):
        gpu = readings.get(bus_id)
        labels = gpu.labels() if gpu else {"gpu": "", "bus_id": bus_id, "model": "unknown"}
        mine = [event for event in events if event.bus_id == bus_id]
        yield judge_gpu(mine, gpu, labels, now, source).result(gpu_subject(bus_id))
    if not buses:
        yield Result(Status.SKIP, NODE, "no GPU on the PCI bus or in NVML")
