"""Which NICs carry a training job's traffic, the way NCCL picks them.

NCCL gives each GPU the network devices with the best path to it: the highest path
bandwidth, then the shortest PCIe path type (PIX before PXB before PHB before SYS;
NVIDIA/nccl src/graph/search.cc ncclTopoGetLocalNet through ncclTopoGetLocal), and uses
GPUDirect RDMA only up to PXB by default (NCCL_NET_GDR_LEVEL). On an HGX node each GPU
has its own NIC behind its own PCIe switch: those rails are the compute NICs. So, per
GPU: its nearest RDMA NIC(s) are compute, and among equally near ones only those of the
fastest class. A slower-class port behind the same switch (the Dell XE9680's 100 GbE
ConnectX-6 Dx beside GPU 0 and its 400 GbE ConnectX-7) is there for storage (GPUDirect
Storage, NFS or Lustre over RDMA), as is an RDMA port that is no GPU's nearest. Where no
NIC is within PXB of a GPU (a GB200 tray: the NICs sit on Grace root ports), its nearest
(PHB, then NODE, then SYS) are still its compute NICs, not every RDMA NIC of the node;
where an InfiniBand and an Ethernet port are as near and as fast (a GB200 tray's CX-7 and
BlueField-3 on one Grace), the InfiniBand one, with a note.

A NIC's class is what its port can do, not the rate it trained at now: a rail whose cable
trained it at 200 Gb/s, or whose port is down, is still that GPU's rail (and a problem to
fix, `rail_problems`), not storage. sysfs has no maximum port rate (a port's `rate` is the
live one, drivers/infiniband/core/sysfs.c rate_show), so the class is the best rate any
NIC of the same model and link layer runs at on this node, bounded by what its PCIe link
can carry (max_link_speed x max_link_width: the device's own capability).

A NIC without RDMA carries collectives only on a node without any RDMA NIC (NCCL's
socket transport over the fastest interfaces); otherwise it is a management port (the
BMC's LOM, ssh, at most NCCL's bootstrap).

`classify_nics` and `rail_problems` are the rules, pure functions of the facts;
`nic_roles` and `node_rail_problems` apply them to an inventory.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from nodecheck.checks.node.inventory import Inventory, Nic
from nodecheck.checks.node.pci import PcieLink
from nodecheck.checks.node.topology import Relation
from nodecheck.checks.record import record

# The farthest PCIe path over which NCCL uses GPUDirect RDMA by default (NCCL docs,
# Environment Variables: NCCL_NET_GDR_LEVEL, default PXB).
GPUDIRECT_REACH = Relation.PXB


class NicRole(enum.Enum):
    COMPUTE = "compute"  # carries the collectives: a GPU's nearest RDMA NIC of the fastest class
    STORAGE = "storage"  # RDMA, but of a slower class than a GPU's rail or no GPU's nearest
    SOCKET = "socket"  # no RDMA NIC on the node: NCCL's sockets run over this interface
    MANAGEMENT = "management"  # no RDMA, beside NICs that carry the traffic (LOM, BMC)

    @property
    def carries_training_traffic(self) -> bool:
        """Whether a job's bandwidth depends on this NIC (its link is judged strictly)."""
        return self is not NicRole.MANAGEMENT


@record
class NicFacts:
    """What the rules need of one NIC.

    `rate_gbps`: its live rate (Gb/s) on an active port (the netdev's speed for a NIC
    without RDMA); None when no port is active or the rate is unknown. `model`: its PCI
    vendor:device ("15b3:1021"); NICs of one model and link layer are peers that can run
    at the same rate (None: a class of its own). `link_gbps`: what its PCIe link can
    carry at most. `port_state`: why no port is active ("DOWN, physical state Polling").
    """

    rdma: bool
    rate_gbps: float | None
    model: str | None = None
    link_layer: str | None = None  # InfiniBand, or Ethernet (RoCE)
    link_gbps: float | None = None
    active: bool = True
    port_state: str = ""

    def peer_key(self, name: str) -> str:
        return f"{self.model} {self.link_layer}" if self.model else name


def pcie_link_gbps(link: PcieLink | None) -> float | None:
    """The data rate a PCIe link can carry at its maximum speed and width, in Gb/s: line
    rate less its encoding (PCI Express Base Specification: 8b/10b up to 5 GT/s,
    128b/130b at 8 to 32 GT/s, 242B/256B FLITs at 64 GT/s)."""
    if link is None or link.max_speed is None or link.max_width is None:
        return None
    speed = link.max_speed
    efficiency = 0.8 if speed <= 5.0 else 128 / 130 if speed <= 32.0 else 242 / 256
    return speed * link.max_width * efficiency


def port_classes(nics: Mapping[str, NicFacts]) -> dict[str, float | None]:
    """Each RDMA NIC's class (Gb/s): the best live rate among its peers (itself included),
    no more than its PCIe link carries; its link's rate where no peer has an active port;
    None where neither is known."""
    best: dict[str, float] = {}
    for name, facts in nics.items():
        key = facts.peer_key(name)
        if facts.rdma and facts.rate_gbps:
            best[key] = max(best.get(key, 0.0), facts.rate_gbps)
    classes: dict[str, float | None] = {}
    for name, facts in nics.items():
        if not facts.rdma:
            continue
        peers_rate = best.get(facts.peer_key(name))
        if peers_rate is None:
            classes[name] = facts.link_gbps
        elif facts.link_gbps is None:
            classes[name] = peers_rate
        else:
            classes[name] = min(peers_rate, facts.link_gbps)
    return classes


def _fastest(
    names: list[str], nics: Mapping[str, NicFacts], classes: Mapping[str, float | None]
) -> tuple[set[str], str]:
    """Of equally near NICs, those of the best known class (all of them when no class is
    known); of those, where InfiniBand and Ethernet ports tie, the InfiniBand ones, and a
    note saying so: NVIDIA's reference designs run the compute fabric on InfiniBand and
    storage and north-south traffic on Ethernet (DGX GB200 User Guide, Networking:
    docs.nvidia.com/dgx/dgxgb200-user-guide/networking.html)."""
    known = [rate for name in names if (rate := classes[name]) is not None]
    best = {name for name in names if not known or classes[name] == max(known)}
    infiniband = {name for name in best if nics[name].link_layer == "InfiniBand"}
    if not infiniband or infiniband == best:
        return best, ""
    others = [name for name in names if name in best - infiniband]
    taken = [name for name in names if name in infiniband]
    note = (
        f"{', '.join(taken)} (InfiniBand) and {', '.join(others)} "
        f"({'/'.join(sorted({nics[n].link_layer or 'unknown' for n in others}))}) are "
        "equally near and fast: the InfiniBand ones are taken as the compute rails and the "
        "others as storage, as in NVIDIA's reference designs; set NCCL_IB_HCA if this node "
        "is built otherwise"
    )
    return infiniband, note


def compute_rails(
    nics: Mapping[str, NicFacts], relations: Mapping[str, Mapping[str, Relation]]
) -> tuple[dict[str, list[str]], list[str]]:
    """Compute NIC -> the GPUs (keys of `relations`) whose rail it is, and the notes on
    what was inferred: each GPU's nearest RDMA NIC(s) by PCIe relation, the fastest class
    among equally near ones (`_fastest`). A node where no GPU reaches an RDMA NIC (no GPU
    at all) has the fastest class as compute."""
    rdma = [name for name, facts in nics.items() if facts.rdma]
    classes = port_classes(nics)
    rails: dict[str, list[str]] = {}
    notes: list[str] = []
    for gpu, to_nic in relations.items():
        reachable = {name: to_nic[name] for name in rdma if name in to_nic}
        if not reachable:
            continue
        nearest = min(reachable.values())
        tied = [name for name, relation in reachable.items() if relation == nearest]
        chosen, note = _fastest(tied, nics, classes)
        for name in tied:
            if name in chosen:
                rails.setdefault(name, []).append(gpu)
        if note:
            notes.append(note)
    if not rails and rdma:
        chosen, note = _fastest(rdma, nics, classes)
        rails = {name: [] for name in rdma if name in chosen}
        notes += [note] if note else []
    return rails, list(dict.fromkeys(notes))


def classify_nics(
    nics: Mapping[str, NicFacts], relations: Mapping[str, Mapping[str, Relation]]
) -> dict[str, NicRole]:
    """The role of every NIC (by name). `relations` maps each GPU to its PCIe relation to
    every RDMA NIC.

    Compute: a GPU's nearest RDMA NIC, whatever rate it trained at now; of several equally
    near, those of the fastest class (`port_classes`), InfiniBand before Ethernet where
    both tie (`_fastest`). Where nothing is within PXB of a
    GPU, its nearest still (PHB, then NODE, then SYS): NCCL sends its collectives there,
    without GPUDirect RDMA. Every other RDMA NIC is storage. Without RDMA on the node, the
    fastest other NICs carry NCCL's sockets (an unknown speed counts as slowest); the
    rest, and every non-RDMA NIC beside RDMA ones, are management."""
    rails, _ = compute_rails(nics, relations)
    roles = {
        name: NicRole.COMPUTE if name in rails else NicRole.STORAGE
        for name, facts in nics.items()
        if facts.rdma
    }
    any_rdma = bool(roles)
    others = [name for name in nics if name not in roles]
    fastest_other = max((nics[name].rate_gbps or 0.0 for name in others), default=0.0)
    for name in others:
        sockets = not any_rdma and (nics[name].rate_gbps or 0.0) >= fastest_other
        roles[name] = NicRole.SOCKET if sockets else NicRole.MANAGEMENT
    return roles


# What a port's physical state says about a link that is not up (InfiniBand Architecture
# Specification vol. 1, PortPhysicalState; drivers/infiniband/core/sysfs.c phys_state_show).
PHYSICAL_STATE_MEANINGS = {
    "Polling": "no signal from the other end of the cable",
    "Disabled": "the port was turned off, on this host or from the switch",
    "PortConfigurationTraining": "the link is still training",
    "LinkErrorRecovery": "the link is recovering from errors",
}


# A port whose state (or whose list of ports) could not be read: not known to be down.
STATE_UNKNOWN = "state unknown"


@record
class RailProblem:
    """A compute NIC that runs below its class or carries nothing: the whole job's
    collectives then run at the slowest rail's pace, or crowd onto another GPU's rail."""

    nic: str
    gpus: tuple[str, ...]  # whose rail it is
    rate_gbps: float | None  # its live rate; None: no active port
    class_gbps: float | None  # what its peers run at
    peers: tuple[str, ...]  # the compute NICs of its model that run at that rate
    port_state: str = ""  # for a port that is not active: its state and physical state

    @property
    def down(self) -> bool:
        return self.rate_gbps is None

    @property
    def for_its_gpu(self) -> str:
        """The problem in a few words, for the rank whose GPU's rail it is."""
        if self.down and STATE_UNKNOWN in self.port_state:
            return f"the port state of its compute NIC {self.nic} could not be read"
        if self.down:
            return f"its compute NIC {self.nic} has no active port"
        return (
            f"its compute NIC {self.nic} runs at {self.rate_gbps:g} Gb/s, its peers at "
            f"{self.class_gbps:g} Gb/s"
        )

    def message(self) -> str:
        rail = f"the rail of GPU {', '.join(self.gpus)}" if self.gpus else "a compute NIC"
        fix = "reseat or replace its cable or transceiver and check the switch port"
        if self.down and STATE_UNKNOWN in self.port_state:
            return (
                f"the port state of compute NIC {self.nic} ({rail}) could not be read "
                f"({self.port_state}): whether it carries traffic is unknown (nodecheck check "
                "--only nccl_env names what could not be read)"
            )
        if self.down:
            state = self.port_state or "no active port"
            meaning = [
                what for word, what in PHYSICAL_STATE_MEANINGS.items() if word in self.port_state
            ]
            return (
                f"compute NIC {self.nic} ({rail}) has no active port ({state}"
                + "".join(f": {what}" for what in meaning[:1])
                + "): NCCL leaves it out and that GPU's traffic crowds onto another rail, so "
                f"every collective of a multi-node job slows; {fix}"
            )
        peers = ", ".join(self.peers)
        return (
            f"compute NIC {self.nic} ({rail}) runs at {self.rate_gbps:g} Gb/s while its peers "
            f"({peers}) run at {self.class_gbps:g} Gb/s: a degraded link (a bad cable or "
            "transceiver, or a switch port set slower), and every collective of a "
            f"multi-node job runs at the slowest rail's pace; {fix} (its configured speed "
            "and error counters)"
        )


def rail_problems(
    nics: Mapping[str, NicFacts], relations: Mapping[str, Mapping[str, Relation]]
) -> list[RailProblem]:
    """Compute NICs without an active port, and those whose live rate is below that of a
    compute NIC of the same model (a rate below the PCIe link's alone is no problem: a
    200 Gb/s NIC on a Gen5 link is normal). In the order of `nics`."""
    rails, _ = compute_rails(nics, relations)
    classes = port_classes(nics)
    problems = []
    in_order = [name for name in nics if name in rails]
    for name in in_order:
        facts = nics[name]
        gpus = tuple(rails[name])
        if not facts.active:
            problems.append(RailProblem(name, gpus, None, classes[name], (), facts.port_state))
            continue
        rate, best = facts.rate_gbps, classes[name]
        if rate is None or best is None or rate >= best:
            continue
        peers = tuple(
            other
            for other in in_order
            if other != name
            and nics[other].model is not None
            and nics[other].peer_key(other) == facts.peer_key(name)
            and nics[other].rate_gbps == best
        )
        if peers:
            problems.append(RailProblem(name, gpus, rate, best, peers))
    return problems


def nic_facts(nic: Nic) -> NicFacts:
    """The facts of one NIC of the inventory."""
    if not nic.is_rdma:
        return NicFacts(rdma=False, rate_gbps=nic.rate_gbps)
    ports = [port for rdma in nic.rdma for port in rdma.ports]
    live = [port.rate_gbps for port in ports if port.state == "ACTIVE" and port.rate_gbps]
    pci = nic.pci
    model = None
    if pci.vendor is not None and pci.device is not None:
        model = f"{pci.vendor:04x}:{pci.device:04x}"
    active = any(port.state == "ACTIVE" for port in ports)
    states = [
        (port.state or STATE_UNKNOWN)
        + (f", physical state {port.phys_state}" if port.phys_state else "")
        for port in ports
    ]
    return NicFacts(
        rdma=True,
        rate_gbps=max(live) if live else None,
        model=model,
        link_layer=nic.link_layer,
        link_gbps=pcie_link_gbps(pci.link),
        active=active,
        port_state="" if active else "; ".join(states) or STATE_UNKNOWN,
    )


def _inventory_facts(
    inventory: Inventory,
) -> tuple[dict[str, NicFacts], dict[str, dict[str, Relation]]]:
    facts = {nic.name: nic_facts(nic) for nic in inventory.nics}
    relations = {
        gpu.bdf: {
            nic.name: inventory.relation(gpu, nic.pci) for nic in inventory.nics if nic.is_rdma
        }
        for gpu in inventory.gpus
    }
    return facts, relations


def nic_roles(inventory: Inventory) -> dict[str, NicRole]:
    """classify_nics on the inventory's NICs and GPUs, by NIC name (Nic.name)."""
    return classify_nics(*_inventory_facts(inventory))


def node_rail_problems(inventory: Inventory) -> list[RailProblem]:
    """rail_problems on the inventory's NICs and GPUs."""
    return rail_problems(*_inventory_facts(inventory))


def node_role_notes(inventory: Inventory) -> list[str]:
    """What the roles rest on beyond the PCIe tree and the NICs' classes (compute_rails)."""
    return compute_rails(*_inventory_facts(inventory))[1]
