"""Which NICs carry a training job's traffic, the way NCCL picks them.

NCCL gives each GPU the network devices with the best path to it: the highest path
bandwidth, then the shortest PCIe path type (PIX before PXB before PHB before SYS;
NVIDIA/nccl src/graph/search.cc ncclTopoGetLocalNet through ncclTopoGetLocal), and uses
GPUDirect RDMA only up to PXB by default (NCCL_NET_GDR_LEVEL). On an HGX node each GPU
has its own NIC of the fastest class behind its own PCIe switch: those rails are the
compute NICs. A slower RDMA port loses to them even when it sits behind the same switch
(the Dell XE9680's 100 GbE ConnectX-6 Dx beside GPU 0 and its 400 GbE ConnectX-7): it
is there for storage (GPUDirect Storage, NFS or Lustre over RDMA), as is an RDMA port
that is no GPU's nearest. A NIC without RDMA carries collectives only on a node without any RDMA NIC
(NCCL's socket transport over the fastest interfaces); otherwise it is a management
port (the BMC's LOM, ssh, at most NCCL's bootstrap).

`classify_nics` is the rule, a pure function of the facts; `nic_roles` applies it to an
inventory.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from nodecheck.checks.node.inventory import Inventory
from nodecheck.checks.node.topology import Relation

# The farthest PCIe path over which NCCL uses GPUDirect RDMA by default (NCCL docs,
# Environment Variables: NCCL_NET_GDR_LEVEL, default PXB).
GPUDIRECT_REACH = Relation.PXB


class NicRole(enum.Enum):
    COMPUTE = "compute"  # carries the collectives: a GPU's own RDMA NIC of the fastest class
    STORAGE = "storage"  # RDMA, but slower than the rails or no GPU's nearest
    SOCKET = "socket"  # no RDMA NIC on the node: NCCL's sockets run over this interface
    MANAGEMENT = "management"  # no RDMA, beside NICs that carry the traffic (LOM, BMC)

    @property
    def carries_training_traffic(self) -> bool:
        """Whether a job's bandwidth depends on this NIC (its link is judged strictly)."""
        return self is not NicRole.MANAGEMENT


@dataclass(frozen=True)
class NicFacts:
    """What the rule needs of one NIC: whether it does RDMA and its port rate (Gb/s)."""

    rdma: bool
    rate_gbps: float | None


def classify_nics(
    nics: Mapping[str, NicFacts], relations: Mapping[str, Mapping[str, Relation]]
) -> dict[str, NicRole]:
    """The role of every NIC (by name). `relations` maps each GPU to its PCIe relation to
    every RDMA NIC.

    Compute: an RDMA NIC that is some GPU's nearest, at PIX or PXB, and of the fastest
    rate among such NICs. Where no RDMA NIC is within PXB of any GPU (NICs on root ports
    of their own, a VM), the fastest RDMA NICs are still what NCCL uses: compute. Every
    other RDMA NIC is storage. Without RDMA on the node, the fastest other NICs carry
    NCCL's sockets; the rest, and every non-RDMA NIC beside RDMA ones, are management.
    An unknown rate counts as slowest."""
    rdma = [name for name, facts in nics.items() if facts.rdma]

    def rate(name: str) -> float:
        return nics[name].rate_gbps or 0.0

    near: set[str] = set()
    for to_nic in relations.values():
        reachable = {name: to_nic[name] for name in rdma if name in to_nic}
        if not reachable:
            continue
        nearest = min(reachable.values())
        if nearest <= GPUDIRECT_REACH:
            near |= {name for name, relation in reachable.items() if relation == nearest}
    pool = near or set(rdma)
    fastest = max((rate(name) for name in pool), default=0.0)
    roles = {
        name: NicRole.COMPUTE if name in pool and rate(name) >= fastest else NicRole.STORAGE
        for name in rdma
    }
    others = [name for name in nics if name not in roles]
    fastest_other = max((rate(name) for name in others), default=0.0)
    for name in others:
        sockets = not rdma and rate(name) >= fastest_other
        roles[name] = NicRole.SOCKET if sockets else NicRole.MANAGEMENT
    return roles


def nic_roles(inventory: Inventory) -> dict[str, NicRole]:
    """classify_nics on the inventory's NICs and GPUs, by NIC name (Nic.name)."""
    facts = {nic.name: NicFacts(nic.is_rdma, nic.rate_gbps) for nic in inventory.nics}
    relations = {
        gpu.bdf: {
            nic.name: inventory.relation(gpu, nic.pci) for nic in inventory.nics if nic.is_rdma
        }
        for gpu in inventory.gpus
    }
    return classify_nics(facts, relations)
