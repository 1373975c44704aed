"""Everything the host checks need to know about the node, read once.

`read_inventory` never raises for a bad file: each device keeps the problems
its reads met, and checks turn those into `error` results naming the path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import TypeVar

from nodecheck.checks.node.cpu import CpuTopology, read_cpu_topology
from nodecheck.checks.node.facts import UNKNOWN_HOSTNAME
from nodecheck.checks.node.fs import NodeFS, ReadError, read_optional_text
from nodecheck.checks.node.net import (
    NetInterface,
    RdmaDevice,
    read_net_interfaces,
    read_rdma_devices,
)
from nodecheck.checks.node.numa import NumaNode, NumaReading, read_numa
from nodecheck.checks.node.pci import PciDevice, read_pci_devices
from nodecheck.checks.node.topology import Relation, effective_numa_node, pcie_relation
from nodecheck.checks.record import record

T = TypeVar("T")


@record(frozen=False)
class Nic:
    """A network PCI function with its RDMA devices and interfaces."""

    pci: PciDevice
    rdma: list[RdmaDevice] = field(default_factory=list)
    interfaces: list[NetInterface] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The RDMA name where there is one (mlx5_0), as NCCL and nvidia-smi use."""
        if self.rdma:
            return self.rdma[0].name
        if self.interfaces:
            return self.interfaces[0].name
        return self.pci.bdf

    @property
    def is_rdma(self) -> bool:
        return bool(self.rdma)

    @property
    def rate_gbps(self) -> float | None:
        rates = [port.rate_gbps for rdma in self.rdma for port in rdma.ports if port.rate_gbps]
        if rates:
            return max(rates)
        speeds = [i.speed_mbps for i in self.interfaces if i.speed_mbps]
        return max(speeds) / 1000 if speeds else None

    @property
    def state(self) -> str:
        if self.rdma:
            states = [port.state or "unknown" for rdma in self.rdma for port in rdma.ports]
            if "ACTIVE" in states:
                return "ACTIVE"
            return states[0] if states else "unknown"
        states = [i.operstate or "unknown" for i in self.interfaces]
        if "up" in states:
            return "up"
        return states[0] if states else "no interface"

    @property
    def link_layer(self) -> str | None:
        for rdma in self.rdma:
            for port in rdma.ports:
                if port.link_layer:
                    return port.link_layer
        return None


@record(frozen=False)
class Inventory:
    hostname: str
    pci: dict[str, PciDevice]
    nics: list[Nic]
    interfaces: list[NetInterface]
    rdma: list[RdmaDevice]
    # Each online CPU is in at most one node: the one whose list names it, or its
    # cpuN/nodeM link's; a CPU with neither is in none (cpus_without_node). Bindings may
    # use those only as spare CPUs, without a memory binding.
    numa_nodes: list[NumaNode]
    cpu: CpuTopology
    # A whole directory that could not be listed, by what it holds ("pci", "net",
    # "rdma", "numa"): the error names the path.
    problems: dict[str, str] = field(default_factory=dict)
    # What the NUMA reading inferred for the node as a whole (each node has its own notes).
    numa_notes: list[str] = field(default_factory=list)
    # Online CPUs in no NUMA node: no node lists them, no cpuN/nodeM link places them.
    cpus_without_node: frozenset[int] = frozenset()

    @property
    def gpus(self) -> list[PciDevice]:
        """NVIDIA GPUs in PCI bus order, the order CUDA_DEVICE_ORDER=PCI_BUS_ID gives."""
        return [device for device in self.pci.values() if device.is_gpu]

    @property
    def unclassified(self) -> list[PciDevice]:
        """Devices whose vendor or class could not be read: maybe GPUs, maybe not."""
        return [d for d in self.pci.values() if d.vendor is None or d.pci_class is None]

    @property
    def nvswitches(self) -> list[PciDevice]:
        return [device for device in self.pci.values() if device.is_nvswitch]

    @property
    def cpu_node_numbers(self) -> frozenset[int]:
        """The NUMA nodes a device can be near: those listed (online: a node without its
        directory has no memory to bind) that hold online CPUs. Memory-only nodes (GPU
        memory on Grace Hopper, CXL memory) are left out: a one-socket GH200 has one."""
        return frozenset(node.number for node in self.numa_nodes if node.listed and node.cpus)

    @property
    def multi_socket(self) -> bool:
        return len(self.cpu.packages) > 1 or len([n for n in self.numa_nodes if n.cpus]) > 1

    def bridges_above(self, device: PciDevice) -> list[PciDevice]:
        """The bridges between a device and its host bridge, root port first."""
        return [self.pci[bdf] for bdf in device.parents if bdf in self.pci]

    def numa_node_of(self, device: PciDevice) -> int | None:
        return effective_numa_node(device, self.cpu_node_numbers)

    def host_bridge_numa_nodes(self, device: PciDevice) -> set[int]:
        """NUMA nodes the other devices under this device's host bridge report. Every device
        under one host bridge sits on one socket, so a single node here is the device's too,
        whatever its own numa_node (firmware without ACPI _PXM leaves -1)."""
        return {
            other.numa_node
            for other in self.pci.values()
            if other.host_bridge == device.host_bridge
            and other.bdf != device.bdf
            and other.numa_node is not None
            and other.numa_node >= 0
        }

    def relation(self, a: PciDevice, b: PciDevice) -> Relation:
        return pcie_relation(a, b, self.cpu_node_numbers)


def nic_order(nic: Nic) -> tuple[bool, list[object]]:
    """RDMA NICs first, then by name in natural order (mlx5_2 before mlx5_10), as nvidia-smi."""
    parts: list[object] = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", nic.name)]
    return (not nic.is_rdma, parts)


def read_hostname(fs: NodeFS) -> str:
    """The node's name, or "unknown" (for showing: Inventory.hostname, the tables)."""
    try:
        return read_known_hostname(fs)
    except ReadError:
        return UNKNOWN_HOSTNAME


def read_known_hostname(fs: NodeFS) -> str:
    """The node's name from `<procfs>/sys/kernel/hostname`, so a captured tree names its node.

    Only the live /proc may fall back to this machine's name (uname(2) gives the same
    name the file does): for a captured tree without the file the name is not known
    (ReadError), never the name of the machine that reads it.
    """
    path = fs.proc("sys", "kernel", "hostname")
    try:
        name = read_optional_text(path)
        problem = ReadError(path, "missing") if not name else None
    except ReadError as err:
        name, problem = None, err
    if name:
        return name
    if not is_live_procfs(fs):
        assert problem is not None
        raise problem
    import socket  # only for the live node

    return socket.gethostname()


def is_live_procfs(fs: NodeFS) -> bool:
    """Whether the procfs root is this machine's /proc."""
    try:
        return fs.procfs.resolve() == Path("/proc")
    except OSError:
        return False


def _listed(problems: dict[str, str], area: str, read: Callable[[], list[T]]) -> list[T]:
    try:
        return read()
    except ReadError as err:
        problems[area] = str(err)
        return []


def read_inventory(fs: NodeFS) -> Inventory:
    problems: dict[str, str] = {}
    try:
        pci = read_pci_devices(fs)
    except ReadError as err:
        problems["pci"] = str(err)
        pci = {}
    interfaces = _listed(problems, "net", lambda: read_net_interfaces(fs))
    rdma = _listed(problems, "rdma", lambda: read_rdma_devices(fs))
    cpu = read_cpu_topology(fs)
    try:
        numa = read_numa(fs, cpu.online or None)
    except ReadError as err:
        problems["numa"] = str(err)
        numa = NumaReading([])
    nics = sorted(
        (
            Nic(
                pci=device,
                rdma=[r for r in rdma if r.pci_bdf == device.bdf],
                interfaces=[i for i in interfaces if i.pci_bdf == device.bdf],
            )
            for device in pci.values()
            if device.is_nic
        ),
        key=nic_order,
    )
    return Inventory(
        hostname=read_hostname(fs),
        pci=pci,
        nics=nics,
        interfaces=interfaces,
        rdma=rdma,
        numa_nodes=numa.nodes,
        cpu=cpu,
        problems=problems,
        numa_notes=numa.notes,
        cpus_without_node=numa.cpus_without_node,
    )
