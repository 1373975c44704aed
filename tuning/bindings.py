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
    numa_node: int | None  # the node its CPUs and memory are bound to; None: not bound to one
    cpus: tuple[int, ...]  # the rank's cores (with their SMT siblings when asked for)
    note: str = ""  # why the binding is not the GPU's own NUMA node, when it is not

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
    CUDA_VISIBLE_DEVICES names by index. CUDA stops at the first entry it cannot
    use, so "" or "-1" hide every GPU; UUIDs cannot be matched from sysfs: all GPUs."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    picked = []
    for raw in visible.split(","):
        item = raw.strip()
        if item.startswith(("GPU-", "MIG-")):
            return gpus
        if not item.isdigit() or int(item) >= len(gpus):
            break
        picked.append(gpus[int(item)])
    return picked


def _cores_of(inventory: Inventory, cpus: frozenset[int]) -> list[tuple[int, ...]]:
    """The physical cores among `cpus`, each as its SMT threads (lowest first), in order."""
    cores = {tuple(sorted(core & cpus)) for core in inventory.cpu.cores if core & cpus}
    return sorted(cores)


def gpu_numa_node(inventory: Inventory, gpu: PciDevice) -> tuple[int | None, str]:
    """The GPU's NUMA node, and a note when it had to be inferred from its host bridge
    (firmware left numa_node at -1, Documentation/ABI/testing/sysfs-bus-pci)."""
    node = inventory.numa_node_of(gpu)
    if node is not None or not gpu.host_bridge:
        return node, ""
    neighbours = inventory.host_bridge_numa_nodes(gpu)
    if len(neighbours) != 1:
        return None, ""
    [inferred] = neighbours
    return inferred, (
        f"firmware gives GPU {gpu.bdf} no NUMA node (numa_node -1); the other devices under "
        f"its host bridge {gpu.host_bridge} are on node {inferred}, so it is bound there"
    )


def bind_ranks(
    inventory: Inventory,
    environ: Mapping[str, str],
    *,
    allowed: frozenset[int] | None = None,
    with_smt_siblings: bool = False,
) -> list[RankBinding]:
    """One binding per visible GPU (one rank per GPU), inside the CPUs `allowed`
    (this process's cpuset; None: every online CPU)."""
    gpus = visible_gpus(inventory.gpus, environ)
    usable = frozenset(inventory.cpu.online) or frozenset(inventory.cpu.cpus)
    if allowed is not None:
        usable &= allowed
    node_cpus = {node.number: node.cpus & usable for node in inventory.numa_nodes}
    located = [gpu_numa_node(inventory, gpu) for gpu in gpus]
    placed = [(gpu, node) for gpu, (node, _) in zip(gpus, located, strict=True)]
    groups: dict[int | None, list[int]] = {}
    for rank, (_, node) in enumerate(placed):
        groups.setdefault(node if node is not None and node_cpus.get(node) else None, []).append(
            rank
        )
    bindings = []
    for node, ranks in sorted(groups.items(), key=lambda item: (item[0] is None, item[0] or 0)):
        note = ""
        if node is not None:
            cpus = node_cpus[node]
        else:
            # No locality to follow: the GPU's node is unknown (firmware says -1, or
            # one node), or this cpuset holds none of its CPUs. Prefer CPUs no other
            # rank is bound to.
            taken = frozenset().union(*(node_cpus[n] for n in groups if n is not None))
            cpus = (usable - taken) or usable
            lost = sorted({n for r in ranks if (n := placed[r][1]) is not None})
            if lost:
                note = (
                    f"this process may not use any CPU of NUMA node(s) "
                    f"{', '.join(map(str, lost))} (cpuset {format_cpulist(usable)}): the rank "
                    "runs away from its GPU; ask the scheduler for CPUs on every GPU's socket"
                )
        cores = _cores_of(inventory, cpus)
        share = max(len(cores) // len(ranks), 1)
        for position, rank in enumerate(ranks):
            mine = cores[position * share : (position + 1) * share] or cores[-1:]
            threads = [cpu for core in mine for cpu in (core if with_smt_siblings else core[:1])]
            why = "; ".join(filter(None, (located[rank][1], note)))
            bindings.append(
                RankBinding(rank, placed[rank][0].bdf, node, tuple(sorted(threads)), why)
            )
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
