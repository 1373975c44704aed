"""PCIe link width and speed of every GPU and NIC, and of the switch uplinks above them.

From `current_link_{speed,width}` and `max_link_{speed,width}` in sysfs. A
link trained narrower than it can be (x8 instead of x16: a bad riser, a
poorly seated card) halves its bandwidth for good. A slower *speed* is often
power saving: GPUs drop their link to 2.5 GT/s when idle (docs/hardware.md §3),
so a speed below the maximum is a warning that a look under load confirms or
clears. Under load is known: NVML's utilisation of the same GPU. The driver raises the
link to its full speed with the GPU's performance state, so a GPU busy (half its sample
period or more running kernels) on a link below its maximum speed has a link that
trained down (a marginal riser, slot or retimer): that warning asks for a look at the
hardware. Where NVML cannot answer, the idle reading stands.

Only NICs that carry training traffic are judged so (checks/node/nic_roles.py: the
GPUs' RDMA rails, storage RDMA ports, the interfaces NCCL's sockets use on a node
without RDMA). A management port (a server's LOM: the Dell XE9680's BCM5720 is wired
x1 of its x2, on every such node) carries none of a job's bandwidth: its link is
reported, never a warning.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.nic_roles import NicRole, nic_roles
from nodecheck.checks.node.pci import PciDevice
from nodecheck.checks.registry import register
from nodecheck.checks.result import (
    Action,
    FaultClass,
    MetricSpec,
    Result,
    Sample,
    Status,
    bridge_subject,
    gpu_subject,
    nic_subject,
)

LABELS = ("bus_id", "kind")
CURRENT_WIDTH = MetricSpec(
    "nodecheck_pcie_link_current_width",
    "gauge",
    "Negotiated PCIe link width in lanes (<sysfs>/bus/pci/devices/<bdf>/current_link_width)",
    LABELS,
)
MAX_WIDTH = MetricSpec(
    "nodecheck_pcie_link_max_width",
    "gauge",
    "Maximum PCIe link width in lanes (<sysfs>/bus/pci/devices/<bdf>/max_link_width)",
    LABELS,
)
CURRENT_SPEED = MetricSpec(
    "nodecheck_pcie_link_current_transfers_per_second",
    "gauge",
    "Negotiated PCIe link speed in transfers per second (current_link_speed)",
    LABELS,
)
MAX_SPEED = MetricSpec(
    "nodecheck_pcie_link_max_transfers_per_second",
    "gauge",
    "Maximum PCIe link speed in transfers per second (max_link_speed)",
    LABELS,
)

IDLE_NOTE = "GPUs lower their link speed when idle"
# At or above this utilisation a GPU runs in its full performance state, its link at full
# speed: a slower link then is no power saving.
BUSY_UTILIZATION_PCT = 50


def _speed(gts: float | None) -> str:
    return "unknown" if gts is None else f"{gts:g} GT/s"


def _width(lanes: int | None) -> str:
    return "down" if lanes is None else f"x{lanes}"


def judge_link(
    device: PciDevice,
    subject: str,
    kind: str,
    *,
    narrow: Status,
    upstream_max: float | None,
    busy_pct: int | None = None,
) -> Result:
    """Judge one device's link; `narrow` is the status for a link below its width;
    `busy_pct`: a GPU's utilisation when it is busy (BUSY_UTILIZATION_PCT or more)."""
    link = device.link
    assert link is not None
    labels = {"bus_id": device.bdf, "kind": kind}
    samples = tuple(
        Sample(spec, value, labels)
        for spec, value in (
            (CURRENT_WIDTH, link.current_width or 0),
            (MAX_WIDTH, link.max_width or 0),
            (CURRENT_SPEED, (link.current_speed or 0) * 1e9),
            (MAX_SPEED, (link.max_speed or 0) * 1e9),
        )
    )
    shown = (
        f"{_width(link.current_width)} {_speed(link.current_speed)} "
        f"(max {_width(link.max_width)} {_speed(link.max_speed)})"
    )
    details: dict[str, object] = {
        "current_width": link.current_width,
        "max_width": link.max_width,
        "current_speed_gts": link.current_speed,
        "max_speed_gts": link.max_speed,
    }
    reseat = "reseat the card or riser and check the slot; if it persists, RMA"
    if link.current_width is None or link.current_speed is None:
        return Result(
            narrow, subject, f"PCIe link is down or unknown: {shown}", reseat, details, samples
        )
    if link.max_width is not None and link.current_width < link.max_width:
        return Result(
            narrow,
            subject,
            f"PCIe link trained at {_width(link.current_width)} of {_width(link.max_width)}: "
            f"{shown}",
            reseat,
            details,
            samples,
        )
    if link.max_speed is not None and link.current_speed < link.max_speed:
        note = IDLE_NOTE if kind == "gpu" else "the link trained below its maximum speed"
        limited_above = upstream_max is not None and upstream_max <= link.current_speed
        if limited_above:
            note = f"the port above supports at most {_speed(upstream_max)}"
        elif busy_pct is not None:
            details["utilization_pct"] = busy_pct
            return Result(
                Status.WARN,
                subject,
                f"PCIe link at {_speed(link.current_speed)} of {_speed(link.max_speed)} while "
                f"the GPU is busy ({busy_pct} % utilisation): trained down, not power saving: "
                f"{shown}",
                "host copies run at a fraction of their rate: reseat the GPU or its riser at "
                "the next drain; if it persists, check the slot and RMA",
                details,
                samples,
            )
        return Result(
            Status.WARN,
            subject,
            f"PCIe link at {_speed(link.current_speed)} of {_speed(link.max_speed)} ({note}): "
            f"{shown}",
            "look again under load (a running job or a GPU benchmark); "
            "a link still slow then needs a reseat",
            details,
            samples,
            # A GPU's link slows down when it idles: nothing to do until a look under
            # load says otherwise (an alert on the action stays quiet for it).
            action=Action.NONE if kind == "gpu" else None,
        )
    return Result(Status.OK, subject, f"PCIe link {shown}", details=details, samples=samples)


def _judge_device(
    ctx: CheckContext,
    device: PciDevice,
    subject: str,
    kind: str,
    narrow: Status,
    busy_pct: int | None = None,
) -> Result:
    link_problems = [problem for name, problem in device.problems.items() if "link" in name]
    if link_problems:
        return Result(
            Status.ERROR, subject, "cannot read the PCIe link: " + "; ".join(link_problems)
        )
    if device.link is None:
        return Result(Status.SKIP, subject, "not a PCI Express device (no link attributes)")
    parent = ctx.inventory.pci.get(device.parents[-1]) if device.parents else None
    upstream_max = parent.link.max_speed if parent and parent.link else None
    return judge_link(
        device, subject, kind, narrow=narrow, upstream_max=upstream_max, busy_pct=busy_pct
    )


def _busy_gpus(ctx: CheckContext) -> dict[str, int]:
    """Utilisation by bus id of the GPUs NVML reads as busy; none where NVML cannot answer
    (a CPU node, a missing driver): each link is then judged as its idle reading."""
    snapshot = ctx.gpus.snapshot
    if not snapshot.usable:
        return {}
    return {
        gpu.bus_id: gpu.utilization_pct
        for gpu in snapshot.gpus
        if gpu.bus_id is not None
        and gpu.utilization_pct is not None
        and gpu.utilization_pct >= BUSY_UTILIZATION_PCT
    }


def as_information(result: Result, role: NicRole) -> Result:
    """A management NIC's link: what judge_link found, as a note that is never a warning."""
    details = {**result.details, "role": role.value}
    if result.status is not Status.WARN:
        return replace(result, details=details)
    return replace(
        result,
        status=Status.OK,
        summary=f"{result.summary} ({role.value} NIC: carries no training traffic, noted only)",
        remedy="",
        details=details | {"noted": "link below its maximum, not judged for a management NIC"},
    )


@register(
    "pcie_link",
    fault_class=FaultClass.GPU_PERFORMANCE,
    # A link trained below its width or speed: reseat the card or its riser.
    action=Action.INSPECT_HARDWARE,
    interval_s=300,
    timeout_s=10,
    needs=("inventory", "gpus"),
)
def check_pcie_link(ctx: CheckContext) -> Iterator[Result]:
    """PCIe link width and speed of GPUs, NICs and the switch uplinks above them."""
    inventory = ctx.inventory
    if "pci" in inventory.problems:
        yield Result(
            Status.ERROR, "node", f"cannot list the PCI devices: {inventory.problems['pci']}"
        )
    for device in inventory.unclassified:
        problems = "; ".join(device.problems.values())
        yield Result(
            Status.ERROR, f"pci {device.bdf}", f"cannot tell what device this is: {problems}"
        )
    subjects: list[tuple[PciDevice, str, str, Status]] = [
        (gpu, gpu_subject(gpu.bdf), "gpu", Status.FAIL) for gpu in inventory.gpus
    ]
    roles = nic_roles(inventory)
    subjects += [(nic.pci, nic_subject(nic.name), "nic", Status.WARN) for nic in inventory.nics]
    role_of = {nic_subject(nic.name): roles[nic.name] for nic in inventory.nics}
    if not subjects:
        yield Result(Status.SKIP, "node", "no GPU or NIC on the PCI bus")
        return
    busy = _busy_gpus(ctx)
    # Switch upstream ports sit at odd depths below the root port (root port,
    # upstream port, downstream port, ...). Their link is the uplink every
    # device below the switch shares: judged as strictly as the strictest one.
    uplinks: dict[str, Status] = {}
    for device, subject, kind, narrow in subjects:
        result = _judge_device(ctx, device, subject, kind, narrow, busy.get(device.bdf))
        role = role_of.get(subject)
        if role is not None and not role.carries_training_traffic:
            yield as_information(result, role)
        elif role is not None and result.status is not Status.SKIP:
            yield replace(result, details={**result.details, "role": role.value})
        else:
            yield result
        if "driver" in device.problems:
            yield Result(
                Status.ERROR, subject, f"cannot tell its driver: {device.problems['driver']}"
            )
        if role is not None and not role.carries_training_traffic:
            continue  # a switch serving only management ports is not judged for them
        for bridge in device.parents[1::2]:
            previous = uplinks.get(bridge, Status.WARN)
            uplinks[bridge] = max(previous, narrow, key=lambda status: status.severity)
    for bridge, narrow in sorted(uplinks.items()):
        uplink = inventory.pci.get(bridge)
        if uplink is not None:
            yield _judge_device(ctx, uplink, bridge_subject(bridge), "switch uplink", narrow)
