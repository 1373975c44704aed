"""PCIe Access Control Services on the switch ports above GPUs and RDMA NICs.

With ACS P2P Request/Completion Redirect or Egress Control on, a switch sends
GPU-to-GPU and GPUDirect RDMA traffic up to the root complex instead of across
the switch: slower, or a hang (NCCL troubleshooting guide, "PCI Access Control
Services"). Inside a VM ACS is required and left alone.

Root ports are not judged: traffic between devices below different root ports
crosses the root complex whatever ACS says, and Linux turns ACS on at root
ports itself whenever an IOMMU driver is active (drivers/pci/pci.c
pci_std_enable_acs). The switch ports between a device and its root port are
where ACS costs bandwidth.

Only bridges with a GPU or an RDMA NIC below them are judged: ACS redirect matters for
GPU peer-to-peer and GPUDirect RDMA traffic only. An HGX baseboard's NVSwitches sit
behind a switch of their own (a Microchip Switchtec on the Dell XE9680) whose downstream
ports ship with ACS redirect on; the NVSwitches' PCIe links carry only management (the
GPUs talk over NVLink), so those ports are no subject here.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.pci_config import SwitchPortAcs, acs_bit_names
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
    bridge_subject,
    gpu_subject,
    nic_subject,
)

REDIRECT = MetricSpec(
    "nodecheck_pcie_acs_p2p_redirect",
    "gauge",
    "1 when ACS P2P Request/Completion Redirect or Egress Control is enabled on a PCIe "
    "switch port above a GPU or RDMA NIC (from <sysfs>/bus/pci/devices/<bdf>/config)",
    ("bridge",),
)


def setpci_remedy(bridge: str) -> str:
    return (
        f"sudo setpci -s {bridge} ECAP_ACS+0x6.w=0000 (lasts until reboot; to keep it off, "
        f"disable ACS or VT-d/IOMMU in the BIOS, or boot with pci=disable_acs_redir={bridge})"
    )


@register(
    "pcie_acs",
    fault_class=FaultClass.NODE_CONFIG,
    action=Action.FIX_NODE_CONFIG,
    interval_s=3600,
    timeout_s=10,
    needs=("inventory", "virtualization", "pcie_acs"),
    root=True,
)
def check_pcie_acs(ctx: CheckContext) -> Iterator[Result]:
    """PCIe ACS redirect on switch ports between GPUs or RDMA NICs and their root port."""
    inventory = ctx.inventory
    if "pci" in inventory.problems:
        yield Result(
            Status.ERROR, NODE, f"cannot list the PCI devices: {inventory.problems['pci']}"
        )
        return
    endpoints = [(gpu_subject(gpu.bdf), gpu) for gpu in inventory.gpus]
    endpoints += [(nic_subject(nic.name), nic.pci) for nic in inventory.nics if nic.is_rdma]
    if not endpoints:
        yield Result(Status.SKIP, NODE, "no GPU or RDMA NIC on this node")
        return
    # Switch ports: every bridge of the chain below the root port.
    served: dict[str, list[str]] = {}
    for subject, device in endpoints:
        for bridge in device.parents[1:]:
            served.setdefault(bridge, []).append(subject)
    if not served:
        yield Result(
            Status.SKIP,
            NODE,
            "no PCIe switch between the GPUs/RDMA NICs and their root ports: "
            "peer traffic crosses the root complex whatever ACS says",
        )
        return
    vm = ctx.virtualization
    truncated: list[str] = []
    results: list[Result] = []
    switch_ports: SwitchPortAcs = ctx.part("pcie_acs")
    for bridge in sorted(served):
        above = ", ".join(served[bridge])
        port = switch_ports.bridges.get(bridge)
        if port is None:
            # Facts put together from readings of different times (a snapshot's ACS with
            # a later inventory) can lack a port: unknown, never a pass.
            results.append(
                Result(
                    Status.ERROR,
                    bridge_subject(bridge),
                    f"cannot judge ACS on the switch port above {above}: the facts hold no "
                    "reading of its config space",
                )
            )
            continue
        if port.truncated:
            truncated.append(bridge)
            continue
        if port.problem is not None:
            results.append(Result(Status.ERROR, bridge_subject(bridge), port.problem))
            continue
        acs = port.acs
        details: dict[str, object] = {"above": served[bridge]}
        if acs is None:
            results.append(
                Result(
                    Status.OK,
                    bridge_subject(bridge),
                    f"no ACS capability on the switch port above {above}",
                    details=details,
                    samples=(Sample(REDIRECT, 0, {"bridge": bridge}),),
                )
            )
            continue
        enabled = acs_bit_names(acs.control)
        details |= {"acs_control": f"{acs.control:#06x}", "enabled": enabled}
        redirecting = " ".join(acs_bit_names(acs.redirecting))
        remedy = ""
        if not acs.redirecting:
            status = Status.OK
            summary = f"ACS leaves peer-to-peer traffic alone on the switch port above {above}"
        elif vm:
            status = Status.OK
            summary = (
                f"ACS {redirecting} on, as a VM requires ({vm}); "
                "enable ATS on the NICs for GPUDirect RDMA"
            )
            details["virtual_machine"] = vm
        else:
            status = Status.FAIL
            summary = (
                f"ACS {redirecting} on the switch port above {above}: peer-to-peer and "
                "GPUDirect traffic detours through the root complex"
            )
            remedy = setpci_remedy(bridge)
        sample = Sample(REDIRECT, 1 if acs.redirecting else 0, {"bridge": bridge})
        results.append(Result(status, bridge_subject(bridge), summary, remedy, details, (sample,)))
    if truncated:
        # Not judged, and said so: what this process may read, not what the node holds.
        # The kernel shows a process without CAP_SYS_ADMIN the first 64 bytes of config
        # space only (drivers/pci/pci-sysfs.c, pci_read_config), and ACS is an extended
        # capability past 256. A `skip`, not an `error`: the deployment cannot see it,
        # for ever (the unprivileged DaemonSet), so its class's verdict rests on the
        # checks that can; root reads it (the privileged DaemonSet, the snapshot, sudo).
        results.append(
            Result(
                Status.SKIP,
                NODE,
                f"ACS not read on {len(truncated)} PCIe switch port(s): without root "
                "(CAP_SYS_ADMIN) the kernel shows only 64 bytes of config space",
                remedy="run nodecheck as root (sudo nodecheck check --only pcie_acs)",
                details={"bridges": truncated, "cause": UNPRIVILEGED},
            )
        )
    yield from results
