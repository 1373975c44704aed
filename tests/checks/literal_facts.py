"""A small node written as literal facts, no tree: for tests that judge a check on a
NodeFacts built by hand (`CheckContext(facts=NodeFacts(...))`).

Two sockets (CPUs 0-3 on NUMA node 0, 4-7 on node 1, no SMT) and one PCIe switch under
the root port 0000:00:01.0: its upstream port 0000:01:00.0 and two downstream ports,
0000:02:00.0 above an H100 (0000:03:00.0) and 0000:02:01.0 above a ConnectX-7
(0000:04:00.0, RDMA device mlx5_0, one InfiniBand port at 400 Gb/s): the GPU's rail.
The context's roots point at a directory that does not exist, so a check that read the
node instead of its facts would see nothing there and say something else.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.cpu import Cpu, CpuTopology
from nodecheck.checks.node.facts import NodeFacts
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.inventory import Inventory, Nic
from nodecheck.checks.node.net import RdmaDevice, RdmaPort
from nodecheck.checks.node.numa import NumaNode
from nodecheck.checks.node.pci import (
    CLASS_BRIDGE_PCI,
    CLASS_DISPLAY_3D,
    CLASS_NETWORK_INFINIBAND,
    VENDOR_NVIDIA,
    PciDevice,
    PcieLink,
)

TAKEN_AT = 1_764_600_000.0
NOWHERE = Path("/nonexistent/nodecheck-literal-facts")

ROOT_PORT = "0000:00:01.0"
UPSTREAM_PORT = "0000:01:00.0"
GPU_PORT = "0000:02:00.0"
NIC_PORT = "0000:02:01.0"
GPU = "0000:03:00.0"
NIC = "0000:04:00.0"
SWITCH_PORTS = (UPSTREAM_PORT, GPU_PORT, NIC_PORT)
MELLANOX = 0x15B3
GEN5_X16 = PcieLink(32.0, 16, 32.0, 16)


def pci_device(
    chain: tuple[str, ...],
    vendor: int,
    device: int,
    pci_class: int,
    *,
    numa_node: int | None = 0,
    link: PcieLink | None = GEN5_X16,
    driver: str | None = None,
) -> PciDevice:
    """The PCI function at the end of `chain` (root port first), on socket 0."""
    return PciDevice(
        bdf=chain[-1],
        sysfs_dir=Path("/sys/devices/pci0000:00", *chain),
        chain=chain,
        host_bridge="pci0000:00",
        vendor=vendor,
        device=device,
        pci_class=pci_class,
        numa_node=numa_node,
        local_cpus=frozenset(range(4)),
        link=link,
        driver=driver,
    )


def inventory(*, gpu: PciDevice | None = None, nic_rdma: bool = True) -> Inventory:
    """The node's inventory: `gpu` replaces the H100; with `nic_rdma` False the ConnectX-7
    has no RDMA device (mlx5_ib not loaded)."""
    bridges = {
        chain[-1]: pci_device(chain, 0x1000, 0xC030, CLASS_BRIDGE_PCI, driver="pcieport")
        for chain in (
            (ROOT_PORT,),
            (ROOT_PORT, UPSTREAM_PORT),
            (ROOT_PORT, UPSTREAM_PORT, GPU_PORT),
            (ROOT_PORT, UPSTREAM_PORT, NIC_PORT),
        )
    }
    the_gpu = gpu or pci_device(
        (ROOT_PORT, UPSTREAM_PORT, GPU_PORT, GPU),
        VENDOR_NVIDIA,
        0x2330,
        CLASS_DISPLAY_3D,
        driver="nvidia",
    )
    nic_pci = pci_device(
        (ROOT_PORT, UPSTREAM_PORT, NIC_PORT, NIC),
        MELLANOX,
        0x1021,
        CLASS_NETWORK_INFINIBAND,
        driver="mlx5_core",
    )
    # mlx5_0's port 1: ACTIVE at 400 Gb/s (4X NDR), LinkUp.
    rail_port = RdmaPort(1, "ACTIVE", 400.0, "InfiniBand", "LinkUp", 4)
    rdma = [RdmaDevice("mlx5_0", NIC, [rail_port])] if nic_rdma else []
    cpus = {n: Cpu(n, n // 4, n % 4, frozenset({n})) for n in range(8)}
    return Inventory(
        hostname="literal",
        pci={**bridges, the_gpu.bdf: the_gpu, NIC: nic_pci},
        nics=[Nic(nic_pci, list(rdma))],
        interfaces=[],
        rdma=rdma,
        numa_nodes=[
            NumaNode(0, frozenset(range(4)), 64 << 30),
            NumaNode(1, frozenset(range(4, 8)), 64 << 30),
        ],
        cpu=CpuTopology(frozenset(range(8)), cpus, "notsupported", False),
    )


def context(parts: Mapping[str, object], **options: object) -> CheckContext:
    """A check's context over these literal parts (the roots pointing nowhere)."""
    return CheckContext(
        fs=NodeFS(sysfs=NOWHERE / "sys", procfs=NOWHERE / "proc", rootfs=NOWHERE),
        facts=NodeFacts(taken_at=TAKEN_AT, parts=dict(parts)),
        **options,  # type: ignore[arg-type]
    )
