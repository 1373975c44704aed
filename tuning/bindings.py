"""Which CPUs, memory and NICs each local rank should use: the GPU's own NUMA node, split
fairly, and the RDMA NIC nearest its GPU.

Local rank N drives the Nth GPU in PCI bus order (what CUDA_DEVICE_ORDER=PCI_BUS_ID
gives), or the Nth of CUDA_VISIBLE_DEVICES when that names GPUs by index. Each
rank is bound to the NUMA node its GPU hangs off (hardware.md §2), and the
physical cores of that node are split into disjoint, equal, contiguous sets
among the ranks that share it, so data loaders of two ranks never fight for a
core. SMT siblings go with their core when asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.checks.node.inventory import Inventory
from nodecheck.checks.node.pci import PciDevice
from nodecheck.checks.node.topology import Relation


@dataclass(frozen=True)
class RankBinding:
    local_rank: int
    gpu: str  # PCI bus id
    numa_node: int | None  # None: the node cannot be told (no NUMA, or firmware says -1)
    cpus: tuple[int, ...]  # the rank's cores (with their SMT siblings when asked for)

    def numactl(self) -> list[str]:
        """The numactl command line that applies this binding (before the command)."""
        if self.numa_node is None:
            return ["numactl", f"--physcpubind={format_cpulist(set(self.cpus))}"]
        return [
            "numactl",
            f"--physcpubind={format_cpulist(set(self.cpus))}",
            f"--membind={self.numa_node}",
        ]


def visible_gpus(gpus: list[PciDevice], environ: Mapping[str, str]) -> list[PciDevice]:
    """The GPUs local ranks count, in order: every GPU in PCI bus order, or those
    CUDA_VISIBLE_DEVICES names by index (UUIDs cannot be matched from sysfs: all GPUs)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    picked = []
    for raw in visible.split(","):
        item = raw.strip()
        if not item.isdigit():
            return gpus
        if int(item) < len(gpus):
            picked.append(gpus[int(item)])
    return picked


def _cores_of(inventory: Inventory, cpus: frozenset[int]) -> list[tuple[int, ...]]:
    """The physical cores among `cpus`, each as its SMT threads (lowest first), in order."""
    cores = {tuple(sorted(core & cpus)) for core in inventory.cpu.cores if core & cpus}
    return sorted(cores)


def bind_ranks(
    inventory: Inventory,
    environ: Mapping[str, str],
    *,
    with_smt_siblings: bool = False,
) -> list[RankBinding]:
    """One binding per visible GPU (one rank per GPU)."""
    gpus = visible_gpus(inventory.gpus, environ)
    node_cpus = {node.number: node.cpus for node in inventory.numa_nodes if node.cpus}
    placed = [(gpu, inventory.numa_node_of(gpu)) for gpu in gpus]
    bindings = []
    for node in sorted({n for _, n in placed}, key=lambda n: (n is None, n or 0)):
        ranks = [rank for rank, (_, n) in enumerate(placed) if n == node]
        cpus = node_cpus.get(node) if node is not None else None
        if cpus is None:  # no NUMA locality: share every CPU of the machine
            cpus = frozenset(inventory.cpu.online) or frozenset(inventory.cpu.cpus)
        cores = _cores_of(inventory, cpus)
        share = max(len(cores) // len(ranks), 1)
        for position, rank in enumerate(ranks):
            mine = cores[position * share : (position + 1) * share] or cores[-1:]
            threads = [cpu for core in mine for cpu in (core if with_smt_siblings else core[:1])]
            bindings.append(RankBinding(rank, placed[rank][0].bdf, node, tuple(sorted(threads))))
    return sorted(bindings, key=lambda binding: binding.local_rank)


@dataclass(frozen=True)
class NicPairing:
    gpu: str  # PCI bus id
    nics: tuple[str, ...]  # RDMA device names (mlx5_0), nearest first
    relation: str | None  # PIX, PXB, PHB, NODE or SYS; None without an RDMA NIC
    note: str


def pair_nics(inventory: Inventory, gpus: list[PciDevice]) -> list[NicPairing]:
    """Each GPU's nearest RDMA NIC(s) by PCIe relation (PIX before PXB before PHB
    before NODE before SYS, as NCCL ranks them). GPUs with the same nearest NICs (two
    GPUs and two NICs behind one switch) get them dealt out in bus order, one each,
    so no NIC carries two GPUs' traffic while another idles."""
    rdma = [nic for nic in inventory.nics if nic.is_rdma]
    best: dict[str, tuple[Relation, list[str]]] = {}
    for gpu in gpus:
        if not rdma:
            continue
        relations = [(inventory.relation(gpu, nic.pci), nic.name) for nic in rdma]
        nearest = min(relation for relation, _ in relations)
        best[gpu.bdf] = (nearest, [name for relation, name in relations if relation == nearest])
    shares: dict[tuple[str, ...], int] = {}
    pairings = []
    for gpu in gpus:
        if gpu.bdf not in best:
            note = "no RDMA NIC on this node: NCCL uses sockets between nodes"
            pairings.append(NicPairing(gpu.bdf, (), None, note))
            continue
        relation, names = best[gpu.bdf]
        turn = shares.get(tuple(names), 0)
        shares[tuple(names)] = turn + 1
        ordered = tuple(names[turn % len(names) :] + names[: turn % len(names)])
        note = ""
        if relation >= Relation.PHB:
            note = (
                f"the nearest RDMA NIC is {relation.name} from this GPU: NCCL does not use "
                "GPUDirect RDMA that far by default (NCCL_NET_GDR_LEVEL)"
            )
        pairings.append(NicPairing(gpu.bdf, ordered, relation.name, note))
    return pairings
