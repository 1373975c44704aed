"""NVSwitch SXid errors in the kernel log, judged per NVSwitch.

The judging follows the Fabric Manager User Guide's "NVSwitch SXid Errors"
(docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/):

- a fatal SXid (the line says "Fatal", or the catalog does when the line says
  neither) fails the node until the next boot: the GPUs and NVSwitches of its
  partition need a reset, and an always-fatal one takes the whole fabric down,
  so the host must restart. Nothing in the kernel log confirms a reset short of
  a reboot, so the remedy is to drain and reboot, and the failure (with its
  alert) clears at the next boot;
- a non-fatal SXid (ECC corrected, a replay) needs no action; the same one
  coming 10 or more times in a day on one NVSwitch warns: a link or memory that
  keeps erring is failing;
- a thermal event warns for a day (cooling may be insufficient);
- anything logged before the current boot was cleared by that reboot, and never
  hides what this boot logged.

A node without NVSwitches has nothing to judge (`skip`); one with NVSwitches
whose kernel log cannot be read is `error`: no SXid seen is not no SXid.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.fs import PERMISSION_DENIED
from nodecheck.checks.node.kernel_log import line_age
from nodecheck.checks.node.kernel_log_facts import KernelLogFacts, KernelLogUnreadable
from nodecheck.checks.node.sxid import SxidAction, SxidEvent, SxidKind, classify_sxid
from nodecheck.checks.per_gpu import Verdict
from nodecheck.checks.record import record
from nodecheck.checks.registry import register
from nodecheck.checks.result import (
    NODE,
    UNPRIVILEGED,
    Action,
    FaultClass,
    MetricSpec,
    Result,
    Sample,
    Status,
)

SXID_LABELS = ("bus_id", "sxid")
EVENTS = MetricSpec(
    "nodecheck_nvswitch_sxid_events",
    "gauge",
    "SXids of this code on this NVSwitch in the kernel log (as far as it reaches)",
    SXID_LABELS,
)
LAST_SEEN = MetricSpec(
    "nodecheck_nvswitch_sxid_last_seen_timestamp_seconds",
    "gauge",
    "When this SXid was last seen on this NVSwitch, in seconds since the epoch",
    SXID_LABELS,
)
FATAL = MetricSpec(
    "nodecheck_nvswitch_sxid_fatal",
    "gauge",
    "1 while a fatal SXid of this code on this NVSwitch is from the current boot (or of "
    "unknown time), 0 otherwise",
    SXID_LABELS,
)

REPEAT_COUNT = 10
REPEAT_WINDOW_S = 86400.0

# The kernel log shows no reset of the GPUs and NVSwitches and no Fabric Manager restart
# (Fabric Manager logs to its own file, /var/log/fabricmanager.log): only the boot time
# tells that the fix was made. So the remedy is the reboot, and says the check clears then;
# a reset without one would leave the check (and its alert) failing.
AFTER_REBOOT = (
    "this check clears after the reboot (nothing in the kernel log shows a reset of the "
    "GPUs and NVSwitches short of one); then check that Fabric Manager runs (systemctl "
    "status nvidia-fabricmanager) and that every GPU's fabric state is Completed "
    "(nvidia-smi -q | grep -A3 Fabric)"
)
PARTITION_REBOOT_REMEDY = (
    "drain the node and reboot it: a fatal SXid leaves the GPUs and NVSwitches of its "
    f"partition needing a reset; {AFTER_REBOOT}"
)
REBOOT_REMEDY = (
    f"drain the node and reboot it: this SXid is fatal to the whole NVLink fabric; {AFTER_REBOOT}"
)
REPEAT_REMEDY = (
    "a link or memory that keeps erring is failing: watch nvidia-smi nvlink -e, plan a "
    "reset of the GPUs and NVSwitches at the next drain, and report it if it persists"
)
THERMAL_REMEDY = "check the node's cooling: fans, airflow, inlet temperature"
UNKNOWN_REMEDY = "look it up in the Fabric Manager user guide's SXid tables"
# What NVIDIA's NVSentinel mapping asks for beyond the reset (checks/node/sxid_catalog.py),
# by its action: said after the reboot, which clears the fatal state but not a bad cable.
FOLLOW_UP: dict[str, str] = {
    SxidAction.LINK_CABLES: "NVIDIA's mapping asks to check this link's cables "
    "and connectors (reseat them) before the node takes jobs again",
    SxidAction.LINK_SI: "NVIDIA's mapping asks to investigate this link's signal "
    "integrity (nvidia-smi nvlink -e counters, cables, connectors)",
    SxidAction.FIELDDIAG: "NVIDIA's mapping asks for NVIDIA's field diagnostics (fieldiag) "
    "on the node",
    SxidAction.UNEXPECTED: "NVIDIA's mapping calls this error unexpected: report "
    "it to NVIDIA with the output of nvidia-bug-report.sh",
    SxidAction.REPORT_ISSUE: "NVIDIA's mapping asks to report it to NVIDIA with the output of "
    "nvidia-bug-report.sh",
    SxidAction.FM_CONFIG: "NVIDIA's mapping points at Fabric Manager's configuration "
    "(/usr/share/nvidia/nvswitch/fabricmanager.cfg) and the partition it set up",
}


def nvswitch_subject(bdf: str) -> str:
    return f"nvswitch {bdf}"


def line_is_fatal(event: SxidEvent) -> bool:
    """Fatal by the line's own word, else by the catalog."""
    if event.fatal is not None:
        return event.fatal
    return classify_sxid(event.sxid).kind in (SxidKind.FATAL, SxidKind.ALWAYS_FATAL)


def _of_this_boot(at: float | None, boot_time: float | None) -> bool:
    """Not known to be before the current boot (a line without a time may be of it)."""
    return at is None or boot_time is None or at >= boot_time


@record
class SxidJudgement:
    status: Status
    summary: str
    remedy: str
    fatal_now: bool
    action: Action | None = None  # None: the check's (investigate)


def judge_sxid(
    code: int, seen: list[SxidEvent], now: float, boot_time: float | None
) -> SxidJudgement:
    """One SXid code on one NVSwitch: every line of it, judged as the worst says."""
    info = classify_sxid(code)
    fatal = [e for e in seen if line_is_fatal(e)]
    # Lines from before the current boot were cleared by it: a fatal one of them never
    # hides what this boot logged (a fatal line, or non-fatal ones that keep coming).
    current = [e for e in seen if _of_this_boot(e.at, boot_time)]
    fatal_now = [e for e in fatal if _of_this_boot(e.at, boot_time)]
    if fatal_now:
        # A line without a time may be of this boot, but one with a time is shown first.
        shown = max(fatal_now, key=lambda e: (e.at is not None, e.at or 0.0))
    else:
        shown = _latest(current or fatal or seen)
    when = "at an unknown time" if shown.at is None else f"{line_age(now - shown.at)} ago"
    said = f"{len(fatal)} fatal" if fatal else "non-fatal"
    text = f"SXid {code} {info.name} x{len(seen)} ({said}), last {when}"
    if shown.message:
        text += f" ({shown.message})"
    if fatal_now:
        always = info.kind is SxidKind.ALWAYS_FATAL
        remedy = REBOOT_REMEDY if always else PARTITION_REBOOT_REMEDY
        if follow_up := FOLLOW_UP.get(info.action):
            remedy = f"{remedy}; {follow_up}"
        if shown.at is None:
            text += ": the log gives no time, so it may be from this boot"
        summary = f"{text}: fails until the next boot"
        # A reboot either way: the partition's GPUs and NVSwitches need a reset that only
        # a reboot is seen to give here (this check clears on the next boot), so asking
        # for a GPU reset would leave the check, and its alert, failing after it.
        return SxidJudgement(Status.FAIL, summary, remedy, True, Action.REBOOT)
    if fatal:
        text += ": the fatal ones before the last boot"
        if not current:
            return SxidJudgement(Status.OK, text, "", False)
    recent = [e for e in current if e.at is None or now - e.at <= REPEAT_WINDOW_S]
    if info.kind is SxidKind.THERMAL and recent:
        return SxidJudgement(Status.WARN, text, THERMAL_REMEDY, False, Action.INSPECT_HARDWARE)
    if info.kind is SxidKind.UNKNOWN and shown.fatal is None and recent:
        return SxidJudgement(Status.WARN, f"{text}: not in the catalog", UNKNOWN_REMEDY, False)
    if len(recent) >= REPEAT_COUNT:
        summary = f"{text}: {len(recent)} in the last day"
        return SxidJudgement(Status.WARN, summary, REPEAT_REMEDY, False)
    return SxidJudgement(Status.OK, f"{text}: no action", "", False)


def judge_nvswitch(
    bus_id: str, events: list[SxidEvent], now: float, boot_time: float | None, source: str
) -> Verdict:
    codes: dict[int, list[SxidEvent]] = {}
    for event in events:
        codes.setdefault(event.sxid, []).append(event)
    verdict = Verdict(f"no SXid in {source}" if not codes else "no action needed")
    for code, seen in sorted(codes.items()):
        judged = judge_sxid(code, seen, now, boot_time)
        verdict.add(judged.status, judged.summary, judged.remedy, judged.action)
        labels = {"bus_id": bus_id, "sxid": str(code)}
        verdict.samples.append(Sample(EVENTS, len(seen), labels))
        times = [e.at for e in seen if e.at is not None]
        if times:
            verdict.samples.append(Sample(LAST_SEEN, max(times), labels))
        verdict.samples.append(Sample(FATAL, 1 if judged.fatal_now else 0, labels))
    verdict.details["sxids"] = {str(code): len(seen) for code, seen in sorted(codes.items())}
    clocks = sorted({e.clock for e in events if e.clock})
    if clocks:
        verdict.details["log_times"] = clocks  # how each time was read: inferred
    return verdict


def _latest(events: list[SxidEvent]) -> SxidEvent:
    """The latest line (one without a time only when none has one)."""
    return max(events, key=lambda e: e.at if e.at is not None else float("-inf"))


def _unreadable(err: KernelLogUnreadable) -> Result:
    if err.reason == PERMISSION_DENIED:
        # Closed to this process by design (the unprivileged DaemonSet's device cgroup
        # refuses /dev/kmsg; dmesg_restrict without CAP_SYSLOG): not judged here, for
        # ever, so a `skip` that says so; root reads it (the snapshot, the privileged
        # DaemonSet). NVLink and GPU faults still show in the NVML checks.
        return Result(
            Status.SKIP,
            NODE,
            f"NVSwitch SXids not watched: the kernel log is closed to this process ({err.message})",
            err.remedy,
            {"cause": UNPRIVILEGED},
        )
    return Result(
        Status.ERROR,
        NODE,
        f"cannot read the kernel log for NVSwitch SXids: {err.message}",
        err.remedy,
        {"cause": err.reason},
    )


@register(
    "nvswitch_sxid",
    fault_class=FaultClass.GPU_HARDWARE,
    action=Action.INVESTIGATE,
    interval_s=60,
    timeout_s=30,
    needs=("inventory", "kernel_log"),
    root=True,
)
def check_nvswitch_sxid(ctx: CheckContext) -> Iterator[Result]:
    """NVSwitch SXid errors per NVSwitch, judged as the Fabric Manager guide says."""
    inventory = ctx.inventory
    switches = {device.bdf for device in inventory.nvswitches}
    log: KernelLogFacts = ctx.part("kernel_log")
    if log.unreadable is not None:
        if not switches:
            yield Result(Status.SKIP, NODE, "no NVSwitch on the PCI bus")
        else:
            yield _unreadable(log.unreadable)
        return
    boot_time = log.boot_time
    now = ctx.now
    events = list(log.sxids)
    buses = switches | {event.bus_id for event in events}
    if not buses:
        yield Result(Status.SKIP, NODE, "no NVSwitch on the PCI bus, and no SXid in the kernel log")
        return
    cut = log.cut
    source = f"the kernel log ({log.source})"
    if cut:
        source = f"{cut} of {source}"
    for bus_id in sorted(buses):
        mine = [event for event in events if event.bus_id == bus_id]
        verdict = judge_nvswitch(bus_id, mine, now, boot_time, source)
        if log.notes:
            verdict.details["log_notes"] = list(log.notes)  # what reading the log inferred
        if bus_id in switches:
            yield verdict.result(nvswitch_subject(bus_id))
            continue
        verdict.details["on_pci_bus"] = False
        result = verdict.result(nvswitch_subject(bus_id))
        # Said whatever the verdict: a failure for a switch this node lacks is the one
        # an operator must not act on blindly (a log from another node).
        yield replace(result, summary=f"{result.summary}; {NOT_ON_THE_BUS}")


NOT_ON_THE_BUS = "not on the PCI bus (a log from another node, or it was lost)"
