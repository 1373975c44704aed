"""Every RDMA port (InfiniBand or RoCE) that carries training traffic: up, at its rate,
and without errors.

A compute NIC (checks/node/nic_roles.py: a GPU's rail) must be ACTIVE with its
physical link LinkUp, at the node's expected rate: the fastest rate among the node's
rail NICs. A rail at a lower width or speed ("200 Gb/sec (2X NDR)" beside "400 Gb/sec
(4X NDR)") fails: every collective of a multi-node job runs at the slowest rail's pace.
GPUd expects at least 8 ports at 400 Gb/s on H100/H200 nodes from a table per GPU model
(leptonai/gpud components/accelerator/nvidia/infiniband/threshold_default.go, which
also asks 8 of a GB200 tray with four compute NICs); this check needs no table: it holds
each rail to the node's own fastest rail. An InfiniBand-class PCI function without an
RDMA device (mlx5_ib not loaded, or the device failed to initialise) fails: that port
cannot carry RDMA at all.
A storage RDMA port (GPUDirect Storage, NFS or Lustre over RDMA) that is down warns:
it carries no collective, but its traffic stops or fails over.

The error counters of each port (Documentation/ABI/stable/sysfs-class-infiniband:
ports/<n>/counters/link_downed, link_error_recovery, symbol_error, port_rcv_errors)
are exported and judged by their rate, which needs two readings: the agent keeps the
previous one (PortCounterHistory, as GpuHistory does for the GPUs' counters). Any
increase warns: infiniband-diags' ibqueryerrors reports every error counter above a
threshold of zero by default (linux-rdma/rdma-core infiniband-diags/man/
ibqueryerrors.8.in.rst). A one-shot run exports the counters and judges what one
reading can show: a counter at its all-ones maximum has saturated (PortCounters stop
there rather than wrap; checks/node/net.py PORT_ERROR_COUNTERS) and shows no rate until
cleared.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.net import (
    PORT_ERROR_COUNTERS,
    PortCounters,
    RdmaDevice,
    RdmaPort,
    RdmaPortCounterReading,
    port_key,
)
from nodecheck.checks.node.nic_roles import PHYSICAL_STATE_MEANINGS, NicRole, nic_roles
from nodecheck.checks.node.pci import CLASS_NETWORK_INFINIBAND
from nodecheck.checks.per_gpu import Verdict
from nodecheck.checks.registry import register
from nodecheck.checks.result import (
    Action,
    FaultClass,
    MetricSpec,
    Result,
    Sample,
    Status,
    nic_subject,
)

LABELS = ("device", "port", "link_layer", "role")
ACTIVE = MetricSpec(
    "nodecheck_rdma_port_active",
    "gauge",
    "1 if the RDMA port is ACTIVE (<sysfs>/class/infiniband/<dev>/ports/<n>/state), else 0",
    LABELS,
)
RATE = MetricSpec(
    "nodecheck_rdma_port_rate_bytes_per_second",
    "gauge",
    "Live rate of the RDMA port in bytes per second (ports/<n>/rate, in Gb/s, over 8)",
    LABELS,
)
EXPECTED_RATE = MetricSpec(
    "nodecheck_rdma_port_expected_rate_bytes_per_second",
    "gauge",
    "Rate a compute RDMA port should run at: the fastest among the node's rail NICs",
    LABELS,
)
WIDTH = MetricSpec(
    "nodecheck_rdma_port_width",
    "gauge",
    "Lanes of the RDMA port's live link (the NX of ports/<n>/rate)",
    LABELS,
)
COUNTER_SPECS = {
    "link_downed": MetricSpec(
        "nodecheck_rdma_port_link_downed_total",
        "counter",
        "Times the port's link went down and came back (counters/link_downed; saturates at 255)",
        LABELS,
    ),
    "link_error_recovery": MetricSpec(
        "nodecheck_rdma_port_link_error_recovery_total",
        "counter",
        "Link error recoveries of the port (counters/link_error_recovery; saturates at 255)",
        LABELS,
    ),
    "symbol_error": MetricSpec(
        "nodecheck_rdma_port_symbol_errors_total",
        "counter",
        "Minor link errors on the port's lanes (counters/symbol_error; saturates at 65535)",
        LABELS,
    ),
    "port_rcv_errors": MetricSpec(
        "nodecheck_rdma_port_receive_errors_total",
        "counter",
        "Packets received with errors (counters/port_rcv_errors; saturates at 65535)",
        LABELS,
    ),
}

# What an increase of each counter means, for the message.
COUNTER_MEANINGS = {
    "link_downed": "link flaps (down and up again: NCCL's connections on it may fail)",
    "link_error_recovery": "link error recoveries (the link retrained after errors)",
    "symbol_error": "symbol errors (minor errors on a lane)",
    "port_rcv_errors": "receive errors (packets dropped as bad)",
}
FIX = "reseat or replace the cable or transceiver and check the switch port"
CLEAR = "clear the port's counters (infiniband-diags: perfquery -R) so their rate shows again"


def port_subject(device: str, port: int) -> str:
    return f"rdma {device}/{port}"


def expected_rate_gbps(compute_ports: list[RdmaPort]) -> float | None:
    """The fastest live rate among the node's ACTIVE compute ports; None when none is."""
    rates = [p.rate_gbps for p in compute_ports if p.state == "ACTIVE" and p.rate_gbps]
    return max(rates) if rates else None


def _expected_width(compute_ports: list[RdmaPort], expected: float) -> int | None:
    widths = [p.width for p in compute_ports if p.rate_gbps == expected and p.width]
    return max(widths) if widths else None


def judge_link(
    verdict: Verdict,
    port: RdmaPort,
    role: NicRole | None,
    expected: float | None,
    expected_width: int | None,
) -> None:
    """The port's state and rate: strictly for a compute port, state only for storage."""
    compute = role is NicRole.COMPUTE
    if port.state != "ACTIVE":
        physical = f", physical state {port.phys_state}" if port.phys_state else ""
        meaning = next(
            (what for word, what in PHYSICAL_STATE_MEANINGS.items() if word in physical), ""
        )
        shown = f"{port.state}{physical}" + (f": {meaning}" if meaning else "")
        if compute:
            verdict.add(
                Status.FAIL,
                f"compute RDMA port is not ACTIVE ({shown}): NCCL leaves this rail out and "
                "its GPU's traffic crowds onto another, so every multi-node collective slows",
                FIX,
            )
        else:
            verdict.add(
                Status.WARN,
                f"{_role_name(role)} RDMA port is not ACTIVE ({shown}): the storage traffic on it "
                "stops or fails over",
                FIX,
            )
        return
    if port.phys_state is not None and port.phys_state != "LinkUp":
        verdict.add(Status.WARN, f"ACTIVE, yet its physical state is {port.phys_state}", FIX)
    if port.rate_gbps is None:
        verdict.add(Status.ERROR, "the port's rate could not be read")
        return
    if not compute or expected is None or port.rate_gbps >= expected:
        return
    lanes = ""
    if port.width is not None and expected_width is not None and port.width < expected_width:
        lanes = f" ({port.width} of {expected_width} lanes trained)"
    verdict.add(
        Status.FAIL,
        f"compute RDMA port runs at {port.rate_gbps:g} Gb/s{lanes}, below the node's fastest "
        f"rail at {expected:g} Gb/s: every collective of a multi-node job runs at the slowest "
        "rail's pace",
        f"{FIX} (its configured speed and width)",
    )


def judge_counters(verdict: Verdict, current: PortCounters, previous: PortCounters | None) -> None:
    """What one reading shows (unreadable or saturated counters) and, with the previous
    reading, each counter's increase per minute: any increase warns."""
    if current.missing:
        verdict.add(
            Status.ERROR,
            "the port has no counters folder: its errors cannot be judged",
            "load the driver's counter support (ib_core's PMA; mlx5_ib)",
        )
        return
    # In PORT_ERROR_COUNTERS' order, as they are read (a capture's dictionaries are sorted).
    for name in PORT_ERROR_COUNTERS:
        if name in current.problems:
            verdict.add(Status.ERROR, f"cannot read the {name} counter: {current.problems[name]}")
    saturated = [name for name in PORT_ERROR_COUNTERS if current.saturated(name)]
    if saturated:
        verdict.add(
            Status.WARN,
            f"{', '.join(saturated)} at {'its' if len(saturated) == 1 else 'their'} maximum "
            "(saturated: at least that many errors "
            "since the counters were last cleared, and no rate can show)",
            CLEAR + "; " + FIX,
        )
    if previous is None:
        return
    seconds = current.read_at - previous.read_at
    if seconds <= 0:
        return
    rates: dict[str, float] = {}
    for name in PORT_ERROR_COUNTERS:
        now, before = current.values.get(name), previous.values.get(name)
        if now is None or before is None or name in saturated:
            continue
        if now < before:
            verdict.add(Status.OK, f"{name} went down since the last reading (cleared)")
            continue
        rates[name] = (now - before) / seconds * 60
    verdict.details["per_minute"] = rates
    rising = {name: rate for name, rate in rates.items() if rate > 0}
    if rising:
        shown = ", ".join(
            f"{rate:.2g} {COUNTER_MEANINGS[name]} per minute" for name, rate in rising.items()
        )
        verdict.add(Status.WARN, f"errors rising over {seconds:.0f} s: {shown}", FIX)


def _role_name(role: NicRole | None) -> str:
    """A port on a NIC has its NIC's role; one on a PCI function of no network class
    (see _unlisted_note) is "unclassified"."""
    return role.value if role is not None else "unclassified"


def _labels(device: RdmaDevice, port: RdmaPort, role: NicRole | None) -> dict[str, str]:
    return {
        "device": device.name,
        "port": str(port.number),
        "link_layer": port.link_layer or "unknown",
        "role": _role_name(role),
    }


def judge_port(
    device: RdmaDevice,
    port: RdmaPort,
    role: NicRole | None,
    expected: float | None,
    expected_width: int | None,
    counters: PortCounters,
    previous: PortCounters | None,
) -> Result:
    """One port's Result: its link, its counters, and their samples."""
    rate = f"{port.rate_gbps:g} Gb/s" if port.rate_gbps is not None else "rate unknown"
    verdict = Verdict(f"{port.state} at {rate} ({_role_name(role)}, {port.link_layer})")
    labels = _labels(device, port, role)
    verdict.details.update(
        {
            "role": _role_name(role),
            "state": port.state,
            "phys_state": port.phys_state,
            "rate_gbps": port.rate_gbps,
            "width": port.width,
            "expected_rate_gbps": expected if role is NicRole.COMPUTE else None,
            "counters": {
                name: counters.values[name]
                for name in PORT_ERROR_COUNTERS
                if name in counters.values
            },
        }
    )
    verdict.samples.append(Sample(ACTIVE, 1 if port.state == "ACTIVE" else 0, labels))
    if port.rate_gbps is not None:
        verdict.samples.append(Sample(RATE, port.rate_gbps * 1e9 / 8, labels))
    if port.width is not None:
        verdict.samples.append(Sample(WIDTH, port.width, labels))
    if role is NicRole.COMPUTE and expected is not None:
        verdict.samples.append(Sample(EXPECTED_RATE, expected * 1e9 / 8, labels))
    verdict.samples += [
        Sample(COUNTER_SPECS[name], counters.values[name], labels)
        for name in PORT_ERROR_COUNTERS
        if name in counters.values
    ]
    if port.state is None:
        problems = "; ".join(device.problems.values()) or "unknown"
        verdict.add(Status.ERROR, f"cannot read the port's state: {problems}")
    else:
        judge_link(verdict, port, role, expected, expected_width)
    judge_counters(verdict, counters, previous)
    return verdict.result(port_subject(device.name, port.number))


def _unlisted_note(device: RdmaDevice) -> str:
    return (
        f"RDMA device on PCI function {device.pci_bdf}, whose PCI class is no network class "
        "(a QLogic TrueScale HCA is 0x0c0600, InfiniBand serial bus; a ConnectX-3 VPI is "
        "0x028000, other network): nodecheck's NIC roles do not cover it, so its rate is "
        "not compared with the rails'"
    )


@register(
    "rdma_ports",
    fault_class=FaultClass.GPU_PERFORMANCE,
    action=Action.INSPECT_HARDWARE,
    interval_s=60,
    timeout_s=15,
    needs=("inventory", "rdma_port_counters"),
)
def check_rdma_ports(ctx: CheckContext) -> Iterator[Result]:
    """RDMA ports of the compute NICs ACTIVE at the node's rail rate, and their error rates."""
    inventory = ctx.inventory
    if "rdma" in inventory.problems:
        yield Result(
            Status.ERROR, "node", f"cannot list the RDMA devices: {inventory.problems['rdma']}"
        )
        return
    without_rdma = [
        nic
        for nic in inventory.nics
        if nic.pci.pci_class == CLASS_NETWORK_INFINIBAND and not nic.is_rdma
    ]
    for nic in without_rdma:
        yield Result(
            Status.FAIL,
            nic_subject(nic.name),
            f"InfiniBand controller {nic.pci.bdf} has no RDMA device in <sysfs>/class/infiniband: "
            "its RDMA driver is not loaded or failed to bind, and no job can use the port",
            "load the RDMA driver (modprobe mlx5_ib for a ConnectX) and read the kernel log "
            "for its errors",
        )
    counters: RdmaPortCounterReading = ctx.part("rdma_port_counters")
    if not inventory.rdma:
        if not without_rdma:
            where = "is empty" if counters.class_present else "is absent"
            yield Result(Status.SKIP, "node", f"no RDMA device (<sysfs>/class/infiniband {where})")
        return
    roles = nic_roles(inventory)
    role_of: dict[str, NicRole | None] = {device.name: None for device in inventory.rdma}
    for nic in inventory.nics:
        for device in nic.rdma:
            role_of[device.name] = roles[nic.name]
    compute_ports = [
        port
        for device in inventory.rdma
        if role_of[device.name] is NicRole.COMPUTE
        for port in device.ports
    ]
    expected = expected_rate_gbps(compute_ports)
    expected_width = _expected_width(compute_ports, expected) if expected else None
    readings = {reading.key: reading for reading in counters.ports}
    previous = ctx.port_counter_history.exchange(list(readings.values()))
    for device in inventory.rdma:
        role = role_of[device.name]
        subject = f"rdma {device.name}"
        if device.pci_bdf is None:
            # A software RDMA device (rxe, siw; a Xeon Phi's SCIF): no PCI function, no
            # cable; a GPU's traffic does not go through it.
            yield Result(
                Status.SKIP,
                subject,
                "not on a PCI function (a software RDMA device such as rxe, siw or SCIF): "
                "no physical port to judge"
                + (f" ({'; '.join(device.problems.values())})" if device.problems else ""),
            )
            continue
        if "ports" in device.problems:
            yield Result(
                Status.ERROR, subject, f"cannot list the device's ports: {device.problems['ports']}"
            )
        elif not device.ports:
            yield Result(Status.ERROR, subject, "the device lists no port")
        for port in device.ports:
            reading = readings.get(port_key(device.name, port.number))
            if reading is None:
                # Facts put together from readings of different times can lack a port.
                yield Result(
                    Status.ERROR,
                    port_subject(device.name, port.number),
                    "cannot judge the port's error counters: the facts hold no reading of them",
                )
                continue
            result = judge_port(
                device, port, role, expected, expected_width, reading, previous.get(reading.key)
            )
            if role is None:
                result = replace(result, details={**result.details, "note": _unlisted_note(device)})
            yield result
