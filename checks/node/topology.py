"""The PCIe relation between two devices, as `nvidia-smi topo -m` names it.

Legend (nvidia-smi): PIX = at most a single PCIe bridge; PXB = multiple
bridges without the host bridge; PHB = through a PCIe host bridge (the CPU);
NODE = between host bridges within a NUMA node; SYS = across the SMP
interconnect between NUMA nodes. nvidia-smi does not publish its rule; this
is the sysfs approximation of docs/hardware.md §2, the same walk NCCL does
(src/graph/xml.cc): each bus address in the resolved path is a bridge.
"""

from __future__ import annotations

import enum
from collections.abc import Collection

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


def effective_numa_node(device: PciDevice, cpu_nodes: Collection[int]) -> int | None:
    """The device's NUMA node. Firmware without ACPI _PXM leaves numa_node at -1
    (Documentation/ABI/testing/sysfs-bus-pci); where only one node has CPUs, that node is
    the only one the device can be near, whatever its number (node 1 when node 0 is
    offline, as hwloc's offline-cpu0-node0 capture shows). `cpu_nodes`: the numbers of
    the nodes with online CPUs; memory-only nodes (GPU memory on Grace Hopper, CXL) are
    near no device's CPUs and do not count."""
    if device.numa_node is not None and device.numa_node >= 0:
        return device.numa_node
    if len(cpu_nodes) == 1:
        [only] = cpu_nodes
        return only
    return None


def pcie_relation(a: PciDevice, b: PciDevice, cpu_nodes: Collection[int]) -> Relation:
    """`cpu_nodes` as for effective_numa_node."""
    if a.bdf == b.bdf:
        return Relation.SELF
    node_a = effective_numa_node(a, cpu_nodes)
    node_b = effective_numa_node(b, cpu_nodes)
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
