"""PCIe relations as nvidia-smi topo -m names them, on the replica nodes."""

from __future__ import annotations

from pathlib import Path

from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.pci import PciDevice
from nodecheck.checks.node.topology import Relation, pcie_relation
from tests.conftest import Node


def device(
    bdf: str, chain: tuple[str, ...], host_bridge: str = "pci0000:15", numa: int = 0
) -> PciDevice:
    return PciDevice(bdf, Path("/"), (*chain, bdf), host_bridge, numa_node=numa)


def test_dgx_relations(dgx: Node) -> None:
    inventory = read_inventory(dgx.fs)
    gpus = inventory.gpus
    nic = {n.name: n.pci for n in inventory.nics}
    assert inventory.relation(gpus[0], gpus[0]) is Relation.SELF
    assert inventory.relation(gpus[0], gpus[1]) is Relation.PIX  # same switch
    assert inventory.relation(gpus[0], nic["mlx5_0"]) is Relation.PIX
    assert inventory.relation(gpus[0], gpus[2]) is Relation.NODE  # other host bridge, same socket
    assert inventory.relation(gpus[0], gpus[4]) is Relation.SYS  # other socket
    assert inventory.relation(gpus[4], nic["mlx5_8"]) is Relation.NODE


def test_workstation_relation_is_host_bridge(workstation: Node) -> None:
    inventory = read_inventory(workstation.fs)
    (gpu,) = inventory.gpus
    (nic,) = inventory.nics
    # numa_node is -1 everywhere, but one node means node 0: same host bridge, different root ports.
    assert inventory.relation(gpu, nic.pci) is Relation.PHB


def test_nested_switches_are_pxb() -> None:
    root, up1, down1 = "0000:15:01.0", "0000:16:00.0", "0000:17:00.0"
    a = device("0000:1a:00.0", (root, up1, down1, "0000:18:00.0", "0000:19:00.0"))
    b = device("0000:1c:00.0", (root, up1, "0000:17:01.0"))
    assert pcie_relation(a, b, {0, 1}) is Relation.PXB


def test_unknown_numa_on_two_sockets_is_sys() -> None:
    a = device("0000:18:00.0", ("0000:15:01.0",), "pci0000:15", numa=-1)
    b = device("0000:3a:00.0", ("0000:37:01.0",), "pci0000:37", numa=0)
    assert pcie_relation(a, b, {0, 1}) is Relation.SYS
    assert pcie_relation(a, b, {0}) is Relation.NODE
