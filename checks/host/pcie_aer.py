"""PCIe AER errors on the path of every GPU and RDMA NIC: root port, switch ports, endpoint.

Two sources (checks/node/aer.py): the kernel's per-device AER counters in sysfs, and
the AER error groups of the kernel log. An error counts where it was seen, often at the
link partner of the device at fault (Documentation/ABI/testing/
sysfs-bus-pci-devices-aer_stats), so each GPU or NIC is judged on every device of its
path, and a port's error is the GPU's or NIC's below it (every one below a switch port
that serves several).

- An uncorrectable error, fatal or non-fatal, fails the GPU or NIC until the next boot,
  but for a non-fatal one that is only a request refused or blocked (REQUEST_ERRORS),
  which warns.
  The PCI Express Base Specification (6.2.2, Error Classification): a non-fatal
  uncorrectable error lost a transaction while the link stayed up; a fatal one left the
  link unreliable, and the kernel resets it (Documentation/PCI/pcieaer-howto.rst) while
  the NVIDIA driver does not recover a GPU from it (it falls off the bus: XID 79). A lost
  DMA of a training job is a hang or a wrong result. The counters count from boot and
  nothing short of a reboot clears them (nor shows a repair), so the remedy is the
  reboot, and a reseat or replacement of the part when it comes back.
- Corrected link errors are the link's own recovery (a replay, a retrain): each costs
  link time, and a rising rate is a marginal link. They warn above 8 a minute, DCGM's limit
  for PCIe replays (DCGM_LIMIT_MAX_PCIREPLAY_RATE, "the maximum recommended by RM",
  dcgm_gpu_hardware_limits.h), which gpu_pcie applies to NVML's replay counter: the
  Replay Timer Timeout, REPLAY_NUM Rollover, Bad TLP and Bad DLLP errors are replays, and
  a Receiver Error is the physical-layer error behind one; these alone are rated (the
  other corrected kinds, an advisory non-fatal error or a header log overflow, are no
  replay). The rate is over the time
  since the agent's previous reading, and over at least a minute, so one burst read a
  few seconds apart is no rate; a one-shot run has no previous reading and takes the
  rate from the kernel log's corrected groups of the last 10 minutes instead.
- Where the kernel keeps no AER counters for the path (before Linux 4.19, no AER
  capability, or the firmware handles AER: APEI "firmware first") and the log shows
  nothing, the path is not watched: `skip`, said so, never a pass. An error the device's
  AER mask registers mask is never reported, so never counted: a real Dell XE9680's
  `lspci -vvv` shows every correctable error masked (CEMsk) on its GPUs' paths while
  their status bits (RxErr, BadTLP, Timeout) are set, so there the counters see no
  corrected error at all, and only uncorrectable ones are judged.

NVML's PCIe replay counter of a GPU (gpu_pcie's to judge) is shown beside.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.aer import (
    CORRECTABLE,
    FATAL,
    KINDS,
    LINK_ERRORS,
    NONFATAL,
    AerEvent,
    AerReading,
    DeviceAer,
)
from nodecheck.checks.node.facts import PartUnavailableError
from nodecheck.checks.node.kernel_log import line_age
from nodecheck.checks.node.kernel_log_facts import KernelLogFacts
from nodecheck.checks.node.pci import PciDevice
from nodecheck.checks.per_gpu import Verdict
from nodecheck.checks.registry import register
from nodecheck.checks.result import (
    Action,
    FaultClass,
    MetricSpec,
    Result,
    Sample,
    Status,
    gpu_subject,
    nic_subject,
)

LABELS = ("bus_id", "kind")
ERRORS = MetricSpec(
    "nodecheck_pcie_aer_errors_total",
    "counter",
    "AER error messages of this kind (correctable, nonfatal, fatal) the device saw since "
    "boot (<sysfs>/bus/pci/devices/<bdf>/aer_dev_*, TOTAL_ERR_ line)",
    LABELS,
)
RECEIVED = MetricSpec(
    "nodecheck_pcie_aer_rootport_messages_total",
    "counter",
    "AER error messages of this kind reported to the root port by the devices below it "
    "since boot (aer_rootport_total_err_*)",
    LABELS,
)

CORRECTED_PER_MINUTE_WARN = 8.0  # DCGM_LIMIT_MAX_PCIREPLAY_RATE
# The non-fatal uncorrectable errors that are a completer's or a switch's answer to a
# request (PCI Express Base Specification 6.2.3.2: Unsupported Request, Completer Abort,
# Unexpected Completion; an ACS violation, a blocked multicast, AtomicOp or TLP-prefix
# request): a config read of an absent function, peer-to-peer traffic ACS or the IOMMU
# blocks, a tool's probe cause them as well as a fault. They warn, for a person to look;
# the others (data link protocol, surprise down, poisoned or malformed TLPs, flow control,
# receiver overflow, ECRC, a completion timeout, an internal error) are the hardware's.
REQUEST_ERRORS = frozenset(
    {"UnsupReq", "CmpltAbrt", "UnxCmplt", "ACSViol", "BlockedTLP", "AtomicOpBlocked",
     "TLPBlockedErr"}
)  # fmt: skip
MIN_WINDOW_S = 60.0
LOG_WINDOW_S = 600.0

UNCORRECTABLE_REMEDY = (
    "drain the node and reboot it (the AER counters, and this check, clear at the boot); "
    "if uncorrectable errors come back on this path, reseat or replace the card, its riser "
    "or cable, or the switch it names"
)
REQUEST_REMEDY = (
    "find what sent the refused requests (the kernel log around the time, a tool probing "
    "config space, peer-to-peer traffic blocked by ACS or the IOMMU); if none explains them, "
    "treat them as a hardware fault: drain, reboot, and reseat the card"
)
CORRECTED_REMEDY = (
    "a marginal link: reseat the card (and its riser or cable) at the next drain; if the "
    "errors stay, replace the part the errors are counted at"
)
NOT_WATCHED = (
    "no AER counters on its path (a kernel before 4.19, no AER capability, or AER handled "
    "by the firmware, which logs its own CPER records, not read here) and no AER line in "
    "the kernel log: PCIe errors there are not watched"
)


def _where(bdf: str, endpoint: PciDevice) -> str:
    if bdf == endpoint.bdf:
        return "itself"
    if bdf == endpoint.chain[0]:
        return f"its root port {bdf}"
    return f"the switch port {bdf} above it"


def _errors_shown(reading: DeviceAer, kind: str) -> str:
    counts = reading.counts.get(kind)
    if counts is None:
        return ""
    named = [f"{name} x{count}" for name, count in counts.by_error.items() if count]
    return f" ({', '.join(named)})" if named else ""


def corrected_rate(
    path: list[DeviceAer], previous: dict[str, DeviceAer]
) -> tuple[float, float] | None:
    """(errors, seconds) of corrected errors on the path since the previous reading, or
    None without one (or with a counter gone down: cleared by a reset)."""
    errors = 0
    seconds = None
    for reading in path:
        before = previous.get(reading.bdf)
        now_total, before_total = reading.link_errors(), None
        if before is not None:
            before_total = before.link_errors()
        if now_total is None or before_total is None:
            continue
        if now_total < before_total:
            return None
        errors += now_total - before_total
        seconds = reading.read_at - before.read_at if before is not None else seconds
    if seconds is None or seconds <= 0:
        return None
    return errors, seconds


def judge_path(
    endpoint: PciDevice,
    path: list[DeviceAer],
    previous: dict[str, DeviceAer],
    events: list[AerEvent],
    now: float,
) -> Verdict:
    """One GPU's or NIC's path: its devices' counters and the log's groups on it."""
    watched = [reading for reading in path if reading.counts]
    verdict = Verdict("no AER error on its path")
    for reading in path:
        for name, problem in reading.problems.items():
            verdict.add(Status.ERROR, f"cannot read {name} of {reading.bdf}: {problem}")
        for kind in KINDS:
            total = reading.total(kind)
            if total is not None:
                verdict.samples.append(Sample(ERRORS, total, {"bus_id": reading.bdf, "kind": kind}))
            if kind in reading.received:
                labels = {"bus_id": reading.bdf, "kind": kind}
                verdict.samples.append(Sample(RECEIVED, reading.received[kind], labels))
    verdict.details["path"] = list(endpoint.chain)
    verdict.details["since_boot"] = {
        reading.bdf: {kind: reading.total(kind) for kind in KINDS if kind in reading.counts}
        for reading in watched
    }
    if not watched and not events:
        if not verdict.findings:
            verdict.ok_summary = NOT_WATCHED
            verdict.not_applicable = True
        return verdict
    judge_uncorrectable(verdict, endpoint, watched, events, previous, now)
    judge_corrected(verdict, endpoint, watched, events, previous, now)
    if events:
        verdict.details["logged"] = [
            {"bus_id": e.bdf, "kind": e.kind, "errors": list(e.errors), "logged": e.message}
            for e in events[-20:]
        ]
    return verdict


def _request_only(names: set[str]) -> bool:
    """Whether a non-fatal group's errors are all answers to requests (named, and each of
    REQUEST_ERRORS): no evidence of the hardware."""
    return bool(names) and names <= REQUEST_ERRORS


def judge_uncorrectable(
    verdict: Verdict,
    endpoint: PciDevice,
    watched: list[DeviceAer],
    events: list[AerEvent],
    previous: dict[str, DeviceAer],
    now: float,
) -> None:
    for kind, word in ((FATAL, "fatal"), (NONFATAL, "non-fatal")):
        seen = []
        names: set[str] = set()
        rose = False
        for reading in watched:
            total = reading.total(kind) or 0
            if total:
                seen.append(
                    f"{total} at {_where(reading.bdf, endpoint)}{_errors_shown(reading, kind)}"
                )
                counts = reading.counts.get(kind)
                named = {n for n, c in counts.by_error.items() if c} if counts else set()
                names |= named or {""}  # a total without names: not known to be a request's
                before = previous.get(reading.bdf)
                rose = rose or (before is not None and total > (before.total(kind) or 0))
        logged = [e for e in events if e.kind == kind]
        if not seen and not logged:
            continue
        for event in logged:
            names |= set(event.errors) or {""}
        text = f"{word} uncorrectable PCIe errors since boot: " + (
            "; ".join(seen) if seen else "none counted"
        )
        if rose:
            text += ", new since the last reading"
        if logged:
            last = logged[-1]
            when = "at an unknown time" if last.at is None else f"{line_age(now - last.at)} ago"
            shown = ", ".join(last.errors) or "errors not named"
            text += f"; the kernel log has {len(logged)}, the last {when} at {last.bdf} ({shown})"
        if kind == NONFATAL and _request_only(names):
            verdict.add(
                Status.WARN,
                f"{text}: each a request refused or blocked, which software causes as often "
                "as the hardware",
                REQUEST_REMEDY,
                Action.INVESTIGATE,
            )
            continue
        verdict.add(Status.FAIL, text, UNCORRECTABLE_REMEDY, Action.REBOOT)


def judge_corrected(
    verdict: Verdict,
    endpoint: PciDevice,
    watched: list[DeviceAer],
    events: list[AerEvent],
    previous: dict[str, DeviceAer],
    now: float,
) -> None:
    since_last = corrected_rate(watched, previous)
    if since_last is not None:
        errors, seconds = since_last
        source = f"over the {seconds:.0f} s since the last reading"
    else:
        recent = [
            e
            for e in events
            if e.kind == CORRECTABLE
            and e.at is not None
            and now - e.at <= LOG_WINDOW_S
            and (not e.errors or set(e.errors) & LINK_ERRORS)
        ]
        if not recent:
            return
        errors, seconds = len(recent), LOG_WINDOW_S
        source = f"in the kernel log's last {LOG_WINDOW_S / 60:.0f} minutes"
    per_minute = errors / max(seconds, MIN_WINDOW_S) * 60
    verdict.details["corrected_per_minute"] = per_minute
    if per_minute <= CORRECTED_PER_MINUTE_WARN:
        return
    at = [
        f"{_where(r.bdf, endpoint)}{_errors_shown(r, CORRECTABLE)}"
        for r in watched
        if r.total(CORRECTABLE)
    ]
    where = f" (counted at {'; '.join(at)})" if at else ""
    verdict.add(
        Status.WARN,
        f"{per_minute:.0f} corrected PCIe errors a minute {source}{where} (limit "
        f"{CORRECTED_PER_MINUTE_WARN:g}: DCGM's for PCIe replays)",
        CORRECTED_REMEDY,
        Action.INSPECT_HARDWARE,
    )


def _replays(ctx: CheckContext) -> dict[str, int]:
    """NVML's PCIe replay counter of each GPU, by bus id: evidence beside AER's (gpu_pcie
    judges it); empty where NVML cannot answer."""
    try:
        view = ctx.gpus
    except PartUnavailableError:
        return {}
    return {
        gpu.bus_id: gpu.pcie_replays
        for gpu in view.snapshot.gpus
        if gpu.bus_id is not None and gpu.pcie_replays is not None
    }


@register(
    "pcie_aer",
    fault_class=FaultClass.GPU_HARDWARE,
    action=Action.INSPECT_HARDWARE,
    interval_s=60,
    timeout_s=30,
    needs=("inventory", "pcie_aer", "kernel_log"),
)
def check_pcie_aer(ctx: CheckContext) -> Iterator[Result]:
    """PCIe AER errors on each GPU's and RDMA NIC's path: uncorrectable ones fail, corrected
    ones by their rate."""
    inventory = ctx.inventory
    # The endpoints the pcie_aer part read the paths of (aer.watched_endpoints), by subject.
    endpoints = [(gpu_subject(gpu.bdf), gpu) for gpu in inventory.gpus]
    endpoints += [(nic_subject(nic.name), nic.pci) for nic in inventory.nics if nic.is_rdma]
    endpoints.sort(key=lambda endpoint: endpoint[1].bdf)
    if not endpoints:
        yield Result(Status.SKIP, "node", "no GPU and no RDMA NIC on the PCI bus")
        return
    reading: AerReading = ctx.part("pcie_aer")
    readings = {device.bdf: device for device in reading.devices}
    previous = ctx.aer_history.exchange(reading.devices)
    log: KernelLogFacts | None
    try:
        log = ctx.part("kernel_log")
    except PartUnavailableError:
        log = None
    boot_time = log.boot_time if log is not None else None
    logged = [] if log is None or log.unreadable is not None else list(log.aer)
    this_boot = [e for e in logged if e.at is None or boot_time is None or e.at >= boot_time]
    problems = any(device.problems for device in reading.devices)
    if not problems and not this_boot and not any(d.counts for d in reading.devices):
        # Said once for the node: the kernel keeps no AER counters on any path.
        yield Result(
            Status.SKIP, "node", NOT_WATCHED.replace("its path", "the GPUs' and NICs' paths")
        )
        return
    replays = _replays(ctx)
    now = ctx.now
    for subject, endpoint in endpoints:
        path = [readings[bdf] for bdf in endpoint.chain if bdf in readings]
        events = [e for e in this_boot if e.bdf in endpoint.chain]
        verdict = judge_path(endpoint, path, previous, events, now)
        if endpoint.bdf in replays:
            verdict.details["nvml_pcie_replays"] = replays[endpoint.bdf]
        if log is not None and log.unreadable is not None:
            verdict.details["kernel_log"] = f"unreadable: {log.unreadable.message}"
        result = verdict.result(subject)
        if result.action is Action.INSPECT_HARDWARE and result.status is Status.WARN:
            # Corrected errors slow the link; nothing is lost.
            result = replace(result, fault_class=FaultClass.GPU_PERFORMANCE)
        yield result
