"""The PCIe relation between two devices, as `nvidia-smi topo -m` names it.

Legend (nvidia-smi): PIX = at most a single PCIe bridge; PXB = multiple
bridges without the host bridge; PHB = through a PCIe host bridge (the CPU);
NODE = between host bridges within a NUMA node; SYS = across the SMP
interconnect between NUMA nodes. nvidia-smi does not publish its rule; this
is the sysfs approximation of hardware.md §2.5, the same walk NCCL does
(src/graph/xml.cc): each bus address in the resolved path is a bridge.
"""

from __future__ import annotations

import enum

from nodecheck.checks.node.pci import PciDevice


class Relation(enum.IntEnum):
    """Closest first, so min() picks the nearest and comparisons read naturally."""

    SELF = 0
    PIX = 1
    PXB = 2
    PHB = 3
    NODE = 4
    SYS = 5

    @property
    def label(self) -> str:
        return "X" if self is Relation.SELF else self.name


def effective_numa_node(device: PciDevice, numa_node_count: int) -> int | None:
    """The device's NUMA node; on a one-node machine -1 can only mean node 0."""
    if device.numa_node is not None and device.numa_node >= 0:
        return device.numa_node
    return 0 if numa_node_count <= 1 else None


def pcie_relation(a: PciDevice, b: PciDevice, numa_node_count: int) -> Relation:
    if a.bdf == b.bdf:
        return Relation.SELF
    node_a = effective_numa_node(a, numa_node_count)
    node_b = effective_numa_node(b, numa_node_count)
    if a.host_bridge != b.host_bridge or not a.host_bridge:
        # Different host bridges: NODE within a socket, SYS across. A device
        # whose node is unknown cannot be shown to share one: SYS.
        if node_a is None or node_b is None or node_a != node_b:
            return Relation.SYS
        return Relation.NODE
    common = 0
    for bridge_a, bridge_b in zip(a.parents, b.parents, strict=False):
        if bridge_a != bridge_b:
            break
        common += 1
    if common == 0:
        return Relation.PHB  # different root ports of one host bridge
    # Bridges strictly below the deepest common one, on each side.
    below_a = len(a.parents) - common
    below_b = len(b.parents) - common
    return Relation.PIX if below_a <= 1 and below_b <= 1 else Relation.PXB
