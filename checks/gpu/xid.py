"""XID errors per GPU, from the kernel log and the agent's NVML event listener.

Each XID is judged by NVIDIA's action for it (docs/hardware.md §8):

- application errors and informational XIDs are reported but pass;
- "restart the app" XIDs warn for an hour; XIDs the catalog does not settle
  (uncatalogued, "contact support") warn for a day, or fail while the driver's
  recovery action asks for something;
- XIDs that need a GPU reset or a reboot fail until the GPU shows it has
  recovered: it answers NVML again and the driver's recovery-action field reads
  NONE (five minutes after the XID, so the field has caught up), or, for XID 79,
  the GPU answers at all (a GPU off the bus cannot). Where the driver has no
  recovery-action field, nothing can confirm a reset: after a day without the
  XID recurring the failure becomes a warning ("recovery not confirmed"),
  never a silent pass;
- an NVLink5 XID (144-150) whose line the driver writes as Nonfatal needs no
  action (it is counted); a Fatal one takes the catalog's action (a reset); one
  without the driver's word (an NVML event) follows the GPU's recovery action;
- anything logged before the current boot was cleared by that reboot.

Of all the lines of one XID on one GPU, the one shown and judged is the worst
of those not known to be from before the current boot: the most severe action,
then the latest. Only when every line is older than the boot is the worst of
them shown, as cleared by the reboot.

That is the fix for dcgm-exporter #500 and k8s-device-plugin #234: a GPU is
never "unhealthy forever" for an error that was dealt with, yet never healthy
while the driver still asks for the action.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.gpu.state import recovery_action
from nodecheck.checks.node.gpu import GpuReading
from nodecheck.checks.node.kernel_log import line_age
from nodecheck.checks.node.kernel_log_facts import KernelLogFacts, KernelLogUnreadable
from nodecheck.checks.node.xid import (
    NVLINK5_XIDS,
    KernelLogXids,
    XidAction,
    XidEvent,
    XidLog,
    classify,
    merge_sources,
)
from nodecheck.checks.per_gpu import GPU_LABELS, Verdict
from nodecheck.checks.record import record
from nodecheck.checks.registry import register
from nodecheck.checks.result import (
    NODE,
    Action,
    FaultClass,
    MetricSpec,
    Result,
    Sample,
    Status,
    gpu_subject,
)

XID_LABELS = (*GPU_LABELS, "xid")
# A gauge, not a counter: it is what the kernel log still holds, and it drops
# when the ring buffer wraps, which a counter must never do.
EVENTS = MetricSpec(
    "nodecheck_gpu_xid_events",
    "gauge",
    "XIDs of this code on this GPU in the kernel log (this boot, as far as the ring buffer "
    "reaches) and in the agent's NVML events",
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


# How far each action goes, to show the worst line of a group: a reboot beats a reset,
# which beats what the driver asks for, an unexpected XID, a restart, and no action.
ACTION_RANK = {
    XidAction.NONE: 0,
    XidAction.APP_ERROR: 1,
    XidAction.RESTART_APP: 2,
    XidAction.UPDATE_SOFTWARE: 3,
    XidAction.CONTACT_SUPPORT: 3,
    XidAction.UNKNOWN: 3,
    XidAction.FOLLOW_RECOVERY_ACTION: 4,
    XidAction.CHECK_MECHANICALS: 5,
    XidAction.RESET_GPU: 5,
    XidAction.RESTART_VM: 6,
    XidAction.REBOOT: 6,
}
# Judged by a window: warn while recent, then pass ("restart the app" for an hour,
# the rest for a day).
WINDOWED_ACTIONS = (
    XidAction.RESTART_APP,
    XidAction.UNKNOWN,
    XidAction.CONTACT_SUPPORT,
    XidAction.UPDATE_SOFTWARE,
)
NO_ACTION = (XidAction.NONE, XidAction.APP_ERROR)
# What the catalog does not settle (uncatalogued, unexpected, a driver to update): the
# driver's recovery action decides whether it needs the node drained.
UNSETTLED_ACTIONS = (XidAction.UNKNOWN, XidAction.CONTACT_SUPPORT, XidAction.UPDATE_SOFTWARE)


# Each catalog resolution as the action a finding carries (checks/result.py's Action).
ACTION_OF_XID_ACTION: dict[XidAction, Action] = {
    XidAction.NONE: Action.NONE,
    XidAction.APP_ERROR: Action.RESTART_APP,
    XidAction.RESTART_APP: Action.RESTART_APP,
    XidAction.RESET_GPU: Action.RESET_GPU,
    XidAction.REBOOT: Action.REBOOT,
    # A VM's restart is a reboot of the machine the GPU is in.
    XidAction.RESTART_VM: Action.REBOOT,
    XidAction.CHECK_MECHANICALS: Action.INSPECT_HARDWARE,
    XidAction.UPDATE_SOFTWARE: Action.FIX_NODE_CONFIG,
    XidAction.CONTACT_SUPPORT: Action.CONTACT_SUPPORT,
    XidAction.FOLLOW_RECOVERY_ACTION: Action.RESET_GPU,
    XidAction.UNKNOWN: Action.INVESTIGATE,
}


def xid_finding_action(group: XidGroup, gpu: GpuReading | None) -> Action:
    """The action of one XID's finding: its catalog resolution's; for one the catalog
    does not settle or leaves to the driver, the driver's recovery action where it asks
    for one; a reboot where the driver asks for a reboot."""
    pending = gpu.recovery_action if gpu is not None and gpu.readable else None
    driver = recovery_action(pending)
    action = group.judged_action
    if driver is not None and (
        action in UNSETTLED_ACTIONS
        or action is XidAction.FOLLOW_RECOVERY_ACTION
        or driver is Action.REBOOT
    ):
        return driver
    return ACTION_OF_XID_ACTION[action]


def event_action(event: XidEvent) -> XidAction:
    """What this one line asks for: the catalog's action, unless the driver called it
    Nonfatal (NVLink5 XIDs 144-150 say so on the line): then nothing.

    An NVLink5 XID without the driver's word (an NVML event carries only the number,
    and the agent may have no kernel log) may be either: the GPU's recovery action
    decides, as the driver sets it for a fatal one (NVIDIA's XID catalog, XID 154)."""
    if event.severity == "nonfatal" and event.xid in NVLINK5_XIDS:
        return XidAction.NONE
    if event.severity is None and event.xid in NVLINK5_XIDS:
        return XidAction.FOLLOW_RECOVERY_ACTION
    return classify(event.xid).action


@record
class XidGroup:
    """Every occurrence of one XID on one GPU.

    `action` is the most severe any of its lines asks for, and `message` and
    `acted_at` are those of the latest line asking for it: the line shown and
    judged. `fatal` and `nonfatal` count the lines that said so themselves.
    """

    xid: int
    count: int
    last_seen: float | None
    message: str
    action: XidAction | None = None  # None: the catalog's
    acted_at: float | None = None  # None: last_seen
    fatal: int = 0
    nonfatal: int = 0

    @property
    def judged_action(self) -> XidAction:
        return self.action if self.action is not None else classify(self.xid).action

    @property
    def judged_at(self) -> float | None:
        return self.acted_at if self.action is not None else self.last_seen


def _before_boot(event: XidEvent, boot_time: float | None) -> bool:
    """Known to be from before the current boot (a line without a time may be of it)."""
    return boot_time is not None and event.at is not None and event.at < boot_time


def group_events(events: list[XidEvent], boot_time: float | None = None) -> list[XidGroup]:
    """The XIDs of one GPU, one group per code, each with the line to show and judge.

    That line is the worst of those not known to be from before the current boot
    (`boot_time`): a reboot cleared those, so an older Fatal line never hides a
    current one. Only when every line is from before the boot is the worst of them
    shown (and judged as cleared by the reboot)."""
    groups: dict[int, list[tuple[int, XidEvent]]] = {}
    for order, event in enumerate(events):
        groups.setdefault(event.xid, []).append((order, event))
    result = []
    for xid, seen in sorted(groups.items()):
        times = [e.at for _, e in seen if e.at is not None]
        current = [item for item in seen if not _before_boot(item[1], boot_time)]
        # The worst line: the most severe action, then the latest (a line without a
        # time counts by its place in the log).
        _, worst = max(
            current or seen,
            key=lambda item: (
                ACTION_RANK[event_action(item[1])],
                item[1].at if item[1].at is not None else float("-inf"),
                item[0],
            ),
        )
        action = event_action(worst)
        result.append(
            XidGroup(
                xid,
                len(seen),
                max(times) if times else None,
                worst.message,
                action,
                worst.at,
                sum(1 for _, e in seen if e.severity == "fatal"),
                sum(1 for _, e in seen if e.severity == "nonfatal"),
            )
        )
    return result


def judge_group(
    group: XidGroup, gpu: GpuReading | None, now: float, boot_time: float | None
) -> tuple[Status, str, str]:
    """(status, summary, remedy) for one XID on one GPU."""
    info = classify(group.xid)
    action = group.judged_action
    judged_at = group.judged_at
    age = None if judged_at is None else now - judged_at
    text = f"XID {group.xid} {info.mnemonic} x{group.count}, last {_when(group.last_seen, now)}"
    if judged_at != group.last_seen:
        text += f", the worst {_when(judged_at, now)}"
    if group.fatal and group.nonfatal:
        text += f" ({group.fatal} Fatal, {group.nonfatal} Nonfatal, as the driver's lines say)"
    if group.message:
        text += f" ({group.message})"
    if action in NO_ACTION:
        if group.nonfatal and action is XidAction.NONE and info.action not in NO_ACTION:
            return Status.OK, f"{text}: Nonfatal, as the driver says: no action", ""
        return Status.OK, f"{text}: {action.value}", ""
    if boot_time is not None and judged_at is not None and judged_at < boot_time:
        return Status.OK, f"{text}: before the last boot", ""
    pending = gpu.recovery_action if gpu is not None and gpu.readable else None
    if action in UNSETTLED_ACTIONS and pending not in (None, RECOVERY_ACTION_NONE):
        # An XID the catalog does not settle, while the driver asks for recovery: the
        # driver's word decides (NVIDIA's XID catalog, XID 154), as the alert pages.
        return (
            Status.FAIL,
            f"{text}: the driver asks for recovery action {pending}",
            "drain the node and follow the GPU's recovery action "
            "(nodecheck check --only gpu_state)",
        )
    if action in WINDOWED_ACTIONS:
        window = RESTART_APP_WINDOW_S if action is XidAction.RESTART_APP else FORGET_AFTER_S
        if age is None or age < window:
            return Status.WARN, text, action.value
        return Status.OK, f"{text}: {line_age(window)} without recurrence", ""
    return _judge_recovery(text, action, age, gpu)


def _judge_recovery(
    text: str, action: XidAction, age: float | None, gpu: GpuReading | None
) -> tuple[Status, str, str]:
    """An XID whose fix is a reset or a reboot (or whatever the driver asks for)."""
    if gpu is None or not gpu.readable:
        return Status.FAIL, text, action.value
    pending = gpu.recovery_action
    if pending not in (None, RECOVERY_ACTION_NONE):
        return Status.FAIL, f"{text}: the driver still asks for recovery", action.value
    if action is XidAction.REBOOT:
        # XID 79: the GPU was off the bus; answering NVML again means it was reset.
        return Status.OK, f"{text}: the GPU answers again", ""
    if action is XidAction.FOLLOW_RECOVERY_ACTION and pending == RECOVERY_ACTION_NONE:
        # XID 154 announces a change of the field: the field itself is the answer.
        return Status.OK, f"{text}: the driver reports no recovery action pending", ""
    if pending == RECOVERY_ACTION_NONE:
        if age is not None and age <= RECOVERY_SETTLE_S:
            return Status.FAIL, text, action.value
        return Status.OK, f"{text}: the driver reports no recovery action pending", ""
    if action is XidAction.FOLLOW_RECOVERY_ACTION:
        return Status.WARN, text, "read the GPU's recovery action and follow it"
    unconfirmed = "reset the GPU (or reboot) if that has not been done since"
    if age is None:
        return Status.WARN, f"{text}: time unknown, recovery not confirmed", unconfirmed
    if age > FORGET_AFTER_S:
        return Status.WARN, f"{text}: recovery not confirmed", unconfirmed
    return Status.FAIL, text, action.value


def _when(at: float | None, now: float) -> str:
    return "at an unknown time" if at is None else f"{line_age(now - at)} ago"


def judge_gpu(
    events: list[XidEvent],
    gpu: GpuReading | None,
    labels: dict[str, str],
    now: float,
    boot_time: float | None,
    source: str,
) -> Verdict:
    groups = group_events(events, boot_time)
    verdict = Verdict(f"no XID in {source}" if not groups else "no action needed")
    for group in groups:
        status, summary, remedy = judge_group(group, gpu, now, boot_time)
        verdict.add(status, summary, remedy, xid_finding_action(group, gpu))
        xid_labels = {**labels, "xid": str(group.xid)}
        verdict.samples.append(Sample(EVENTS, group.count, xid_labels))
        if group.last_seen is not None:
            verdict.samples.append(Sample(LAST_SEEN, group.last_seen, xid_labels))
        action = group.judged_action
        pending = status in (Status.WARN, Status.FAIL) and action not in NO_ACTION
        action_labels = {**xid_labels, "action": action.name.lower()}
        verdict.samples.append(Sample(ACTIVE, 1 if pending else 0, action_labels))
    verdict.details["xids"] = {str(g.xid): g.count for g in groups}
    clocks = sorted({e.clock for e in events if e.clock})
    if clocks:
        # How each time was read (local time, a year inferred, none on the line): inferred.
        verdict.details["log_times"] = clocks
    return verdict


def _unreadable(err: KernelLogUnreadable) -> Result:
    return Result(
        Status.ERROR,
        NODE,
        f"cannot read the kernel log for XIDs: {err.message}",
        err.remedy,
        {"cause": err.reason},
    )


def _listener_note(ctx: CheckContext) -> str | None:
    """Why the agent's NVML event listener is not listening; None when it is, or in a
    one-shot run (which has no listener)."""
    if ctx.xid_log is None or ctx.xid_log.listening:
        return None
    return ctx.xid_log.source_error or XidLog.NOT_STARTED


def _since(xid_log: XidLog | None) -> str:
    """When the listener began listening, as the operator's clock shows it."""
    since = xid_log.listening_since if xid_log is not None else None
    if since is None:
        return "it started"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))


def _unregistered(bus_id: str, gpu: GpuReading | None, unwatched: dict[str, str]) -> str | None:
    """Why the listener does not listen to the GPU at `bus_id`, None when it does.

    A GPU whose registration failed before NVML told its bus id is filed as
    "GPU <index>": it is the reading of that index, and while NVML names no GPU at
    `bus_id`, any such GPU may be this one (never assumed watched).
    """
    if bus_id in unwatched:
        return unwatched[bus_id]
    nameless = {name: why for name, why in unwatched.items() if name.startswith("GPU ")}
    if gpu is not None:
        return nameless.get(f"GPU {gpu.index}")
    if not nameless:
        return None
    named = "; ".join(f"{name}: {why}" for name, why in sorted(nameless.items()))
    return f"NVML names no GPU at this bus id, and could not register {named}"


@register(
    "gpu_xid",
    fault_class=FaultClass.GPU_HARDWARE,
    # Each XID's own action comes from its code (ACTION_OF_XID_ACTION).
    action=Action.RESET_GPU,
    gate=True,
    interval_s=60,
    timeout_s=30,
    needs=("kernel_log", "gpus", "pci_gpus"),
)
def check_gpu_xid(ctx: CheckContext) -> Iterator[Result]:
    """XID errors per GPU, judged by NVIDIA's recommended action.

    Each result names the sources it rests on. With neither the kernel log nor
    the agent's NVML event listener usable, the node is `error`: no XID seen is
    not no XID. With only the listener (the shipped unit sets ProtectKernelLogs=,
    so /dev/kmsg is closed to the agent by design) each GPU says that XIDs from
    before the listener started are not seen: a note, not a warning every node
    would carry for ever.
    """
    log: KernelLogFacts = ctx.part("kernel_log")
    path = log.source
    kernel = KernelLogXids(list(log.xids), log.boot_time, log.cut, log.notes)
    unreadable = log.unreadable
    view = ctx.gpus
    readings = view.snapshot.by_bus_id()
    known = {gpu.bdf for gpu in ctx.pci_gpus} | set(readings)
    listened = ctx.xid_log.events() if ctx.xid_log is not None else []
    not_listening = _listener_note(ctx)
    listening = ctx.xid_log is not None and not_listening is None
    events = merge_sources(kernel.events, listened)
    if not known and not events:
        yield Result(Status.SKIP, NODE, "no GPU on the PCI bus or in NVML")
        return
    if unreadable is not None and not listening:
        blind = _unreadable(unreadable)
        if not_listening is not None:
            blind = Result(
                Status.ERROR,
                NODE,
                f"{blind.summary}; and NVML XID events are not listened to: {not_listening}",
                blind.remedy,
                {**blind.details, "listener": not_listening},
            )
        yield blind
        # XIDs recorded while the listener still listened are not forgotten.
        known = set()
    log_source = None
    if unreadable is None:
        log_name = f"the kernel log ({path})"
        log_source = f"{kernel.cut} of {log_name}" if kernel.cut else log_name
    unwatched = ctx.xid_log.unwatched if ctx.xid_log is not None else {}
    now = ctx.now
    for bus_id in sorted(known | {e.bus_id for e in events}):
        gpu = readings.get(bus_id)
        # A GPU that stopped answering keeps the labels of its last good
        # reading, so its XID series do not split when it falls off the bus.
        named = gpu if gpu is not None and gpu.name else view.previous.get(bus_id) or gpu
        labels = named.labels() if named else {"gpu": "", "bus_id": bus_id, "model": "unknown"}
        mine = [event for event in events if event.bus_id == bus_id]
        unregistered = _unregistered(bus_id, gpu, unwatched) if listening else None
        sources = [] if log_source is None else [log_source]
        if listening and unregistered is None:
            sources.append(
                "NVML events" if log_source else f"NVML events since {_since(ctx.xid_log)}"
            )
        source = " or ".join(sources) or "the NVML events recorded earlier"
        verdict = judge_gpu(mine, gpu, labels, now, kernel.boot_time, source)
        if not_listening is not None and unreadable is None:
            verdict.add(Status.OK, f"NVML XID events are not listened to: {not_listening}")
        elif unreadable is not None and listening and unregistered is None:
            verdict.add(
                Status.OK,
                f"the kernel log is unreadable ({unreadable.message}): "
                "XIDs from before then are not seen",
            )
        elif unregistered is not None:
            if unreadable is None:
                verdict.add(Status.OK, f"NVML XID events not registered for it: {unregistered}")
            else:
                verdict.add(
                    Status.ERROR,
                    f"no XID source for this GPU: the kernel log is unreadable and NVML XID "
                    f"events are not registered for it ({unregistered})",
                )
        verdict.details["sources"] = sources
        if kernel.notes:
            verdict.details["log_notes"] = list(kernel.notes)  # what reading the log inferred
        yield verdict.result(gpu_subject(bus_id))
