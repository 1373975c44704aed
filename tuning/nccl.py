"""NCCL settings for this node: the bootstrap interface (and gloo's beside it), the HCAs,
the fabric knobs the job's size calls for, what to leave to NCCL, and the node's network
against the one published rule of thumb.

Rules: NCCL's environment documentation (2.30, env.rst) and source (NVIDIA/nccl);
PyTorch's gloo backend (torch/csrc/distributed/c10d); Stas Bekman's "Machine Learning
Engineering" open book (github.com/stas00/ml-engineering): network/benchmarks/README.md,
"Performance-Oriented NCCL Environment Variables" (NCCL_IB_QPS_PER_CONNECTION=4 as a
starting point for large clusters, to confirm with the provider; NCCL_CROSS_NIC=1 when
every NIC hangs off one switch) and its network-throughput bands, the tl;dr of the math in
deepspeedai/DeepSpeed#2928 for a node's inter-node traffic under ZeRO-3 (quoted with their
unit, Gbps, for a node); network/README.md, "Out-Of-Band networking" (the bootstrap
network).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from nodecheck.checks.node.inventory import Inventory
from nodecheck.checks.node.nccl_library import GID_DISCOVERY, NcclLibraries
from nodecheck.checks.node.net import (
    ARPHRD_LOOPBACK,
    AddressedInterfaces,
    GlooIfnameOutcome,
    GlooSocketIfname,
    MasterAddrOutcome,
    MasterAddrRoute,
    NetInterface,
)
from nodecheck.checks.node.nic_roles import RailProblem, node_rail_problems, node_role_notes
from nodecheck.checks.node.variables import parse_count
from nodecheck.checks.record import record
from nodecheck.checks.result import Status
from nodecheck.checks.rules.job_versions import VersionEvidence
from nodecheck.checks.rules.nccl_settings import (
    nccl_facts,
    rule_ib_hca,
    rule_socket_ifname,
    selected_names,
)
from nodecheck.checks.settings_audit import SettingJudgement
from nodecheck.tuning.bindings import NicPairing, far_nic_notes
from nodecheck.tuning.recommendation import LeftUnset, Recommendation, plain

NCCL_DOCS = "NCCL docs, Environment Variables"
ML_ENGINEERING_NETWORK = (
    'Stas Bekman, "Machine Learning Engineering" open book (github.com/stas00/ml-engineering), '
    "network benchmarks chapter"
)
ML_ENGINEERING_THROUGHPUT = (
    'Stas Bekman, "Machine Learning Engineering" open book (github.com/stas00/ml-engineering), '
    "network/benchmarks/README.md, from deepspeedai/DeepSpeed#2928"
)
ML_ENGINEERING_OOB = (
    'Stas Bekman, "Machine Learning Engineering" open book (github.com/stas00/ml-engineering), '
    "network/README.md, Out-Of-Band networking"
)
# The book's bands (network/benchmarks/README.md), in its words and unit: "To get
# reasonable GPU throughput when training at scale (64+GPUs) with DeepSpeed ZeRO Stage 3
# with V100s 1. 100Gbps is not enough 2. 200-400Gbps is ok 3. 800-1000Gbps is ideal",
# linked to deepspeedai/DeepSpeed#2928, whose answer gives them as the tl;dr of its math for
# the traffic between nodes (G GPUs per node, N nodes): a node's inter-node bandwidth, a
# derivation, not a figure per GPU. The book adds: "the requirements are higher for A100
# gpu nodes and even higher for H100s".
BOOK_JOB_GPUS = 64
BOOK_NOT_ENOUGH_GBPS = 100  # "100Gbps is not enough"
BOOK_OK_GBPS = (200, 400)  # "200-400Gbps is ok"
BOOK_IDEAL_GBPS = (800, 1000)  # "800-1000Gbps is ideal"
BOOK_BANDS = (
    f'"To get reasonable GPU throughput when training at scale ({BOOK_JOB_GPUS}+GPUs) with '
    f'DeepSpeed ZeRO Stage 3 with V100s": "{BOOK_NOT_ENOUGH_GBPS}Gbps is not enough", '
    f'"{BOOK_OK_GBPS[0]}-{BOOK_OK_GBPS[1]}Gbps is ok", '
    f'"{BOOK_IDEAL_GBPS[0]}-{BOOK_IDEAL_GBPS[1]}Gbps is ideal"'
)
NCCL_DEBUG_LEVEL = "WARN"


# Interfaces of container runtimes and overlays, by the names they give them; NCCL itself
# skips docker* by default (NCCL docs: NCCL_SOCKET_IFNAME).
CONTAINER_INTERFACES = ("docker", "veth", "virbr", "cni", "flannel", "cali", "vxlan", "kube")


@record
class JobShape:
    """What the user tells about the job: nodes it spans and whether one switch joins them."""

    nodes: int | None = None
    single_switch: bool = False


@record
class NcclAdvice:
    env: list[Recommendation]
    left_unset: list[LeftUnset]
    notes: list[str]


def fails(finding: SettingJudgement | None) -> bool:
    """Whether the checks fail a value (a warning leaves it the user's to decide)."""
    return finding is not None and finding.status is Status.FAIL


JOB_SIZE_VARIABLES = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def unreadable_job_sizes(environ: Mapping[str, str]) -> list[str]:
    """The launcher's job-size variables that are set but hold no count. Only their names
    may be shown: they are not audited variables, so their values never leave nodecheck."""
    return [
        name
        for name in JOB_SIZE_VARIABLES
        if name in environ and parse_count(environ[name]) is None
    ]


def job_nodes(environ: Mapping[str, str]) -> tuple[int | None, str]:
    """Nodes the job spans as its launcher tells it (Slurm, or torchrun's world sizes),
    and the variable it came from; (None, "") outside a job."""
    for name in JOB_SIZE_VARIABLES[:2]:
        nodes = parse_count(environ.get(name, ""))
        if nodes:
            return nodes, name
    world = parse_count(environ.get("WORLD_SIZE", ""))
    local = parse_count(environ.get("LOCAL_WORLD_SIZE", ""))
    if world and local and local <= world:
        return -(-world // local), "WORLD_SIZE / LOCAL_WORLD_SIZE"
    return None, ""


def socket_candidates(
    interfaces: list[NetInterface], addressed: set[str] | None
) -> list[NetInterface]:
    """Interfaces NCCL may bootstrap over: up, with an address other nodes can reach,
    and on the host's own network: never lo, a bridge (docker0, virbr0, cni0), tun/tap,
    veth or an overlay (flannel, calico, vxlan). A bond, VLAN or macvlan is as real as
    the ports under it. Fastest first."""
    usable = [
        interface
        for interface in interfaces
        if interface.arp_type != ARPHRD_LOOPBACK
        and interface.name != "lo"
        and not interface.name.startswith(CONTAINER_INTERFACES)
        and (not interface.virtual or interface.kind in ("bond", "stacked"))
        and interface.operstate == "up"
        and (addressed is None or interface.name in addressed)
    ]
    return sorted(usable, key=lambda i: (-(i.speed_mbps or 0), i.name))


def ifname_value(chosen: list[str], every_interface: list[str]) -> str:
    """An NCCL_SOCKET_IFNAME naming exactly `chosen`: their common alphabetic stem ("ibp",
    not "ibp2", which would also take ibp2s0 elsewhere) where it selects nothing else here,
    as it then does on every node of a homogeneous cluster; else exact names."""
    if len(chosen) == 1 and selected_names(chosen[0], every_interface) == chosen:
        return chosen[0]
    # A character prefix is meant: NCCL matches interface names by string prefix.
    prefix = os.path.commonprefix(chosen).rstrip("0123456789")  # noqa: RUF071
    if len(prefix) >= 2 and sorted(selected_names(prefix, every_interface)) == sorted(chosen):
        return prefix
    return "=" + ",".join(chosen)


NCCL_SOCKET_SOURCE = (
    "NVIDIA/nccl src/misc/socket.cc (ncclFindInterfaces) and src/bootstrap.cc "
    f"(bootstrapNetInit); {NCCL_DOCS}: NCCL_SOCKET_IFNAME; /sys/class/net, /proc/net/route"
)
GLOO_SOURCE = (
    "PyTorch torch/csrc/distributed/c10d/init.cpp (ProcessGroupGloo: GLOO_SOCKET_IFNAME "
    "split at commas, a device each) and ProcessGroupGloo.cpp (createDefaultDevice); "
    "pytorch/gloo gloo/transport/tcp/device.cc (lookupAddrForIface: the exact name)"
)
NCCL_OWN_CHOICE = (
    "NCCL on its own takes the first ib* interface (IPoIB), else the first one other than "
    "docker*, lo and virbr* (src/misc/socket.cc ncclFindInterfaces)"
)


@record
class SocketChoice:
    """The interfaces NCCL's sockets should use on this node, and why."""

    interfaces: list[NetInterface]
    why: str

    @property
    def names(self) -> list[str]:
        return [interface.name for interface in self.interfaces]


# Why MASTER_ADDR did not decide the bootstrap interface; its value is never shown (it is
# not a variable nodecheck audits).
MASTER_ADDR_NOT_MATCHED = {
    MasterAddrOutcome.NOT_AN_ADDRESS: (
        "MASTER_ADDR is a host name (not shown), which nodecheck does not resolve (a DNS "
        "lookup has no time bound): the interface that leads to rank 0 could not be matched"
    ),
    MasterAddrOutcome.NO_SUBNET: (
        "MASTER_ADDR (not shown) is in no subnet of this node's interfaces: it is reached "
        "through a gateway, which does not tell the interface the nodes share"
    ),
    MasterAddrOutcome.LOOPBACK: (
        "MASTER_ADDR is a loopback address: only the ranks of this node can rendezvous there"
    ),
    MasterAddrOutcome.ROUTES_UNREAD: (
        "MASTER_ADDR (not shown) could not be matched to an interface: the node's routes "
        "could not be read"
    ),
}


def bootstrap_choice(
    candidates: list[NetInterface], addressed: AddressedInterfaces, master: MasterAddrRoute
) -> tuple[SocketChoice | None, list[str]]:
    """With RDMA rails NCCL's sockets only bootstrap the job, so the interface that
    matters is the one every node reaches the others on: the one whose subnet holds
    MASTER_ADDR (rank 0 is reached there), else the one holding the default route; None
    when neither tells. The notes say why MASTER_ADDR did not decide, where it is set."""
    usable = {interface.name: interface for interface in candidates}
    notes: list[str] = []
    if master.outcome is MasterAddrOutcome.IN_SUBNET and master.interface is not None:
        if master.interface in usable:
            why = (
                f"MASTER_ADDR (not shown) is in {master.interface}'s subnet: rank 0 is "
                "reached over it"
            )
            return SocketChoice([usable[master.interface]], why), notes
        notes.append(
            f"MASTER_ADDR (not shown) is in the subnet of {master.interface}, which cannot "
            "carry it (down, without an address, or a virtual bridge)"
        )
    elif master.outcome in MASTER_ADDR_NOT_MATCHED:
        notes.append(MASTER_ADDR_NOT_MATCHED[master.outcome])
    defaults = [name for name in addressed.default_route or () if name in usable]
    if defaults:
        return SocketChoice([usable[defaults[0]]], f"{defaults[0]} holds the default route"), notes
    return None, notes


def fastest_choice(candidates: list[NetInterface]) -> SocketChoice:
    """Without RDMA NCCL's sockets carry the collectives: the fastest usable interfaces."""
    best = candidates[0].speed_mbps or 0
    fastest = [i for i in candidates if (i.speed_mbps or 0) == best]
    speed = f"{best / 1000:g} Gb/s" if best else "speed unknown"
    names = ", ".join(i.name for i in fastest)
    return SocketChoice(fastest, f"{names} the fastest up with an address ({speed})")


def _kept_reason(picked: list[str], choice: SocketChoice | None) -> str:
    reason = f"set, and it works: it selects {', '.join(picked)} (the nccl_env check passes it)"
    if choice is not None and sorted(picked) != sorted(choice.names):
        reason += f"; nodecheck would have named {', '.join(choice.names)}: {choice.why}"
    return reason


def _kept_choice(
    inventory: Inventory, addressed: AddressedInterfaces, current: str, choice: SocketChoice | None
) -> tuple[SocketChoice | None, list[NetInterface]]:
    """Beside an NCCL_SOCKET_IFNAME the user set and nodecheck keeps: what gloo should use
    (nodecheck's own choice where the value selects it, else the one usable interface the
    value selects; None where it selects several, as NCCL bootstraps over the first it
    finds, src/misc/socket.cc, which a node's files cannot tell), and the usable interfaces
    the value selects, which NCCL's sockets use."""
    picked = selected_names(current, [i.name for i in inventory.interfaces])
    candidates = socket_candidates(
        inventory.interfaces, None if addressed.names is None else set(addressed.names)
    )
    usable = [interface for interface in candidates if interface.name in picked]
    if choice is not None and set(choice.names) <= set(picked):
        return choice, usable
    if len(usable) == 1:
        return SocketChoice(usable, "the interface the NCCL_SOCKET_IFNAME set selects"), usable
    return None, usable


def _socket_ifname(
    inventory: Inventory,
    addressed: AddressedInterfaces,
    master: MasterAddrRoute,
    environ: Mapping[str, str],
    rails: list[str],
) -> tuple[list[Recommendation], list[LeftUnset], list[str], SocketChoice | None]:
    """NCCL_SOCKET_IFNAME: with RDMA rails the interface the nodes reach each other on,
    without them the fastest; a value the user set that works is kept as it is (the
    nccl_env check's judgement, so tune never says "change" where check passes)."""
    names = [i.name for i in inventory.interfaces]
    candidates = socket_candidates(
        inventory.interfaces, None if addressed.names is None else set(addressed.names)
    )
    if not candidates:
        note = (
            "no network interface is up with an address other nodes can reach "
            "(lo and virtual bridges do not count): a multi-node job cannot bootstrap NCCL"
        )
        return [], [], [note], None
    notes: list[str] = []
    if addressed.names is None:
        notes.append(
            "/proc/net/route and /proc/net/if_inet6 could not be read: NCCL_SOCKET_IFNAME is "
            "chosen without knowing which interfaces have addresses"
        )
    if rails:
        choice, master_notes = bootstrap_choice(candidates, addressed, master)
        notes += master_notes
        role = (
            f"with RDMA rails ({', '.join(rails)}) NCCL's sockets only bootstrap the job (one "
            "interface, src/bootstrap.cc) and the IB transport's out-of-band exchange: the "
            "book's out-of-band network, which \"typically uses a single slow 1Gbps ethernet "
            'connection"; what matters is that every node reaches the others on it'
        )
        source = f"{NCCL_SOCKET_SOURCE}; {ML_ENGINEERING_OOB}"
    else:
        choice = fastest_choice(candidates)
        role = "without RDMA NCCL's sockets carry the collectives too"
        source = NCCL_SOCKET_SOURCE
    current = environ.get("NCCL_SOCKET_IFNAME")
    works = current is not None and not fails(
        rule_socket_ifname("", current, nccl_facts(inventory))
    )
    if current is not None and works and plain(current):
        picked = selected_names(current, names)
        reason = _kept_reason(picked, choice)
        kept = [Recommendation("NCCL_SOCKET_IFNAME", current, reason, source)]
        return kept, [], notes, choice
    if choice is None:
        route = (
            "the IPv4 default route unknown"
            if addressed.default_route is None
            else "no IPv4 default route"
        )
        left = LeftUnset(
            ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"),
            f"{role}, and which interface that is could not be told here ({route}, "
            f"MASTER_ADDR unset or not matched): {NCCL_OWN_CHOICE}, and gloo binds to "
            "the address this host's name resolves to; set both to the interface the nodes "
            "share if the job cannot bootstrap",
            f"{source}; {GLOO_SOURCE}",
        )
        return [], [left], notes, None
    reason = f"{role}: {choice.why}; {NCCL_OWN_CHOICE}, which need not be it"
    recommendation = Recommendation(
        "NCCL_SOCKET_IFNAME",
        ifname_value(choice.names, names),
        reason,
        source,
        advisory=works,
    )
    return [recommendation], [], notes, choice


def gloo_value_works(value: str, inventory: Inventory, addressed: AddressedInterfaces) -> bool:
    """Whether gloo can make a device of every entry: torch splits the value at commas
    and gloo looks each name up exactly (no prefix, no '^' or '='), on an interface
    that is up with an address; torch ignores a value of one character or none."""
    states = {i.name: i.operstate for i in inventory.interfaces}
    entries = value.split(",")
    return len(value) > 1 and all(
        states.get(entry) in ("up", "unknown")
        and (addressed.names is None or entry in addressed.names)
        for entry in entries
    )


def gloo_current(gloo: GlooSocketIfname | None) -> str | None:
    """GLOO_SOCKET_IFNAME as far as the gloo_socket_ifname part tells it (its value is
    never kept otherwise): the interfaces it names, comma-separated as set, where they
    are all this node's; "" where it is set to anything else ("" works nowhere and is
    never a choice); None where it is unset, or the part was not read."""
    if gloo is None or gloo.outcome is GlooIfnameOutcome.UNSET:
        return None
    return ",".join(gloo.interfaces)


def gloo_ifname(
    choice: SocketChoice | None,
    inventory: Inventory,
    addressed: AddressedInterfaces,
    gloo: GlooSocketIfname | None,
    nccl_kept: bool = False,
) -> tuple[list[Recommendation], list[str]]:
    """GLOO_SOCKET_IFNAME beside NCCL_SOCKET_IFNAME, with its own reason: without it gloo
    binds to the address this host's name resolves to (falling back to loopback), where
    other nodes may not reach it. Its value is not audited: one the user set that works
    is kept and never shown; one that cannot work is replaced, without showing it.
    `nccl_kept`: the user's NCCL_SOCKET_IFNAME is kept (`choice` None: it selects several
    interfaces, or none usable)."""
    current = gloo_current(gloo)
    value = None if choice is None else ",".join(choice.names)
    if current is not None and current != value and gloo_value_works(current, inventory, addressed):
        note = (
            "GLOO_SOCKET_IFNAME is set (its value is not shown: nodecheck does not audit it) "
            "and names only interfaces that are up with an address: kept"
        )
        return [], [note]
    if value is None:
        if current is not None:
            return [], [
                "warning: GLOO_SOCKET_IFNAME is set (its value is not shown: nodecheck does "
                "not audit it) but names an interface that is not here, is down or has no "
                "address, so gloo cannot make its device; set it to the interface the nodes "
                f"reach each other on, by its exact name ({GLOO_SOURCE})"
            ]
        if nccl_kept:
            return [], [
                "GLOO_SOCKET_IFNAME: the NCCL_SOCKET_IFNAME set selects several usable "
                "interfaces (or none), and NCCL bootstraps over the first it finds; set "
                "GLOO_SOCKET_IFNAME to the one of them the nodes reach each other on, by its "
                f"exact name, or gloo binds to the address this host's name resolves to "
                f"({GLOO_SOURCE})"
            ]
        return [], []
    reason = (
        "torch.distributed's gloo backend (CPU collectives, and the helper group "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL adds) binds to the address this host's name "
        "resolves to unless told, falling back to loopback, which other nodes cannot "
        f"reach: {value}, as for NCCL; gloo takes exact names, comma-separated, one device "
        "each, and every process must list as many"
    )
    if current is not None and current != value:
        reason += (
            "; the value set (not shown) names an interface that is not here, is down or "
            "has no address, so gloo cannot make its device"
        )
    return [Recommendation("GLOO_SOCKET_IFNAME", value, reason, GLOO_SOURCE)], []


def _gbps(rate: float | None) -> str:
    return "rate unknown" if rate is None else f"{rate:g} Gb/s"


def _storage_reasons(
    inventory: Inventory,
    pairings: list[NicPairing],
    used: list[str],
    extra: list[str],
    layers: Mapping[str, str],
) -> dict[str, str]:
    """What made each HCA outside the compute rails storage (checks/node/nic_roles.py),
    as the facts decided it: its rate below the compute NICs', no GPU's nearest, or an
    Ethernet port as near and fast as InfiniBand rails."""
    by_name = {rdma.name: nic for nic in inventory.nics for rdma in nic.rdma}
    gpus = {gpu.bdf: gpu for gpu in inventory.gpus}
    compute_rates = [rate for name in used if (rate := by_name[name].rate_gbps) is not None]
    compute = max(compute_rates, default=None)
    reasons = {}
    for name in extra:
        nic = by_name[name]
        rate = nic.rate_gbps
        nearest = any(
            p.relation is not None
            and p.gpu in gpus
            and inventory.relation(gpus[p.gpu], nic.pci).name == p.relation
            for p in pairings
        )
        if compute is not None and rate is not None and rate < compute:
            why = f"{_gbps(rate)}, slower than the compute NICs' {_gbps(compute)}"
        elif not nearest:
            why = f"{_gbps(rate)}, no GPU's nearest"
        elif layers[name] != "InfiniBand" and "InfiniBand" in {layers[n] for n in used}:
            why = f"{_gbps(rate)}, as near and fast as the InfiniBand rails"
        else:
            why = _gbps(rate)
        reasons[name] = why
    return reasons


def _ib_hca(
    inventory: Inventory, pairings: list[NicPairing], environ: Mapping[str, str]
) -> tuple[list[Recommendation], list[LeftUnset], list[str]]:
    """Restrict NCCL to the GPUs' own NICs only when another active HCA could draw traffic."""
    active = {r.name: r for r in inventory.rdma if r.active}
    used = list(dict.fromkeys(name for p in pairings for name in p.nics if name in active))
    extra = [name for name in active if name not in used]
    if not used:
        return [], [], []
    source = f"{NCCL_DOCS}: NCCL_IB_HCA; /sys/class/infiniband"
    if not extra:
        reason = (
            "NCCL finds each GPU's nearest NIC itself, and every active HCA here is one "
            "(the per-rank pairing shows which)"
        )
        return [], [LeftUnset(("NCCL_IB_HCA",), reason, source)], used
    layers = {
        name: next((p.link_layer for p in active[name].ports if p.link_layer), "?")
        for name in active
    }
    used_layers = {layers[name] for name in used}
    described = [
        f"{name} ({layers[name]}"
        + (", another fabric" if layers[name] not in used_layers else "")
        + f": {why}"
        + ")"
        for name, why in _storage_reasons(inventory, pairings, used, extra, layers).items()
    ]
    current = environ.get("NCCL_IB_HCA")
    chosen = selected_names(current, list(active)) if current is not None else []
    if current is not None and plain(current) and sorted(chosen) == sorted(used):
        value = current
    else:
        ports = [
            f"{name}:{port.number}"
            for name in used
            for port in active[name].ports
            if port.state == "ACTIVE"
        ]
        value = "=" + ",".join(ports)
    reason = (
        f"keeps collectives on the {len(used)} compute NIC(s), the GPUs' own; "
        f"{', '.join(described)}: storage, and NCCL would otherwise weigh every "
        "active HCA ('=' makes the names exact: mlx5_1 alone also selects mlx5_10-19)"
    )
    works = current is not None and not fails(rule_ib_hca("", current, nccl_facts(inventory)))
    return [Recommendation("NCCL_IB_HCA", value, reason, source, advisory=works)], [], used


QPS_ADVICE = (
    "the book gives 4 as a starting point for large clusters, to confirm with the "
    "fabric's provider; each queue pair costs some memory"
)


def _qps_advice(gpus: int | None, link_layers: set[str]) -> str:
    """Why NCCL_IB_QPS_PER_CONNECTION is advice, never set by nodecheck: how many paths a
    flow needs depends on the fabric (its switches, its routing), which a node cannot
    see. GPUs are not switch ports either: 16 DGX nodes take 16 ports of each rail's leaf."""
    size = "" if gpus is None else f"{gpus} GPUs: "
    if link_layers == {"InfiniBand"}:
        return (
            f"{size}NCCL turns InfiniBand adaptive routing on by default "
            "(NCCL_IB_ADAPTIVE_ROUTING=1 on IB), so the switches spread each connection "
            f"themselves; {QPS_ADVICE}"
        )
    return (
        f"{size}on RoCE NCCL leaves adaptive routing off (NCCL_IB_ADAPTIVE_ROUTING=0 on "
        "RoCE), so each connection's one queue pair is one ECMP hash: more queue pairs "
        f"spread a flow over more paths; {QPS_ADVICE}"
    )


# NCCL's limit on queue pairs per connection (NVIDIA/nccl src/transport/net_ib/common.h,
# NCCL_IB_MAX_QPS).
MAX_QUEUE_PAIRS = 128
# NCCL_IB_SPLIT_DATA_ON_QPS, added in 2.18 with the default 1 (split every message over
# the connection's queue pairs, as NCCL always had), default 0 from 2.20 (round-robin:
# each message on one queue pair per NIC, the next on the next): NCCL_PARAM
# (IbSplitDataOnQps, "IB_SPLIT_DATA_ON_QPS", ...) in NVIDIA/nccl src/transport/net_ib.cc
# (2.18-2.28) and src/transport/net_ib/common.cc (2.29 on), whose
# ncclIbCommBaseGetQpForRequest picks the queue pairs of a request.
SPLIT_DATA_SINCE = (2, 18)
ROUND_ROBIN_SINCE = (2, 20)
SPLIT_SOURCE = (
    "NVIDIA/nccl src/transport/net_ib.cc (2.18-2.28), src/transport/net_ib/common.cc "
    f"(2.29 on): IB_SPLIT_DATA_ON_QPS; {NCCL_DOCS}: NCCL_IB_SPLIT_DATA_ON_QPS"
)


def nccl_versions(nccl: VersionEvidence) -> list[tuple[int, int]]:
    """The job's NCCL as (major, minor), in a list; [] when the job's is not known (the
    NCCL installed on the node is not taken for it: checks/rules/job_versions.py)."""
    known = nccl.known
    return [] if known is None or len(known) < 2 else [(known[0], known[1])]


def _split_advice(count: int, nccl: VersionEvidence) -> str:
    """How the job's NCCL uses `count` queue pairs, and what NCCL_IB_SPLIT_DATA_ON_QPS
    changes there; every release's way where the job's NCCL is not known."""
    versions = nccl_versions(nccl)
    named = nccl.describe()
    in_turn = "each message on one of them in turn (NCCL_IB_SPLIT_DATA_ON_QPS=0, round-robin)"
    split = (
        f"NCCL_IB_SPLIT_DATA_ON_QPS=1 splits every message over all {count}, so that even "
        f"one large transfer takes {count} paths, at {count} work requests and completions "
        "a message: measure both with the job's message sizes"
    )
    if versions and all(version >= ROUND_ROBIN_SINCE for version in versions):
        return f"{named} sends {in_turn}; {split}"
    if versions and all(SPLIT_DATA_SINCE <= version < ROUND_ROBIN_SINCE for version in versions):
        return f"{named} splits every message over all {count} (its default, =1)"
    if versions and all(version < SPLIT_DATA_SINCE for version in versions):
        return (
            f"{named} splits every message over all {count} (it has no NCCL_IB_SPLIT_DATA_ON_QPS)"
        )
    return (
        f"{nccl.account()}: NCCL 2.20 and later send {in_turn}, 2.18-2.19 split every "
        f"message over all {count} (=1), as NCCL always did before; with 2.20 and later, "
        f"{split}"
    )


def queue_pairs_verdict(value: str, nccl: VersionEvidence, environ: Mapping[str, str]) -> str:
    """What a NCCL_IB_QPS_PER_CONNECTION someone set means, with the split-data advice
    where there is more than one queue pair to split over."""
    count = parse_count(value)
    if count is None or not 1 <= count <= MAX_QUEUE_PAIRS:
        return f"not a count NCCL takes (1-{MAX_QUEUE_PAIRS})"
    if count == 1:
        return "NCCL's default"
    split = environ.get("NCCL_IB_SPLIT_DATA_ON_QPS")
    chosen = (
        f" (NCCL_IB_SPLIT_DATA_ON_QPS={split.strip()} in this environment)"
        if split is not None and plain(split)
        else ""
    )
    return (
        f"kept: {count} queue pairs, {count} paths through the fabric for each connection; "
        f"{_split_advice(count, nccl)}{chosen}"
    )


def _fabric(
    shape: JobShape, ranks: int, link_layers: set[str], rdma_nics: int
) -> tuple[list[Recommendation], list[LeftUnset]]:
    """NCCL_IB_QPS_PER_CONNECTION (advice only) and NCCL_CROSS_NIC by the ML Engineering
    book's rules and NCCL's defaults."""
    names_qps = ("NCCL_IB_QPS_PER_CONNECTION",)
    names_cross = ("NCCL_CROSS_NIC",)
    qps_source = (
        f"{ML_ENGINEERING_NETWORK}: NCCL_IB_QPS_PER_CONNECTION; "
        f"{NCCL_DOCS}: NCCL_IB_QPS_PER_CONNECTION, NCCL_IB_ADAPTIVE_ROUTING; {SPLIT_SOURCE}"
    )
    cross_source = f"{ML_ENGINEERING_NETWORK}: NCCL_CROSS_NIC; {NCCL_DOCS}: NCCL_CROSS_NIC"
    if rdma_nics == 0:
        reason = "no active RDMA NIC: these InfiniBand/RoCE settings do nothing"
        return [], [LeftUnset(names_qps + names_cross, reason, NCCL_DOCS)]
    if shape.nodes is None:
        return [], [
            LeftUnset(names_qps, _qps_advice(None, link_layers), qps_source),
            LeftUnset(
                names_cross,
                "depends on the fabric: NCCL's default (2) keeps a ring on one rail when it can, "
                "right for rail-optimized fabrics; give --single-switch if every NIC hangs off "
                "one switch",
                cross_source,
            ),
        ]
    if shape.nodes == 1:
        reason = "a one-node job sends nothing over the network"
        return [], [LeftUnset(names_qps + names_cross, reason, NCCL_DOCS)]
    env: list[Recommendation] = []
    gpus = shape.nodes * ranks
    left = [LeftUnset(names_qps, _qps_advice(gpus, link_layers), qps_source)]
    if rdma_nics < 2:
        left.append(LeftUnset(names_cross, "one RDMA NIC: nothing to cross to", cross_source))
    elif shape.single_switch:
        env.append(
            Recommendation(
                "NCCL_CROSS_NIC",
                "1",
                "every NIC reaches every other through one switch, so a ring may leave on one "
                "NIC and arrive on another at no cost",
                cross_source,
            )
        )
    else:
        left.append(
            LeftUnset(
                names_cross,
                "NCCL's default (2) keeps a ring on one rail when it can, right for "
                "rail-optimized fabrics; set 1 only when every NIC hangs off one switch "
                "(--single-switch)",
                cross_source,
            )
        )
    return env, left


# NCCL_IB_TIMEOUT's default by release: 20 since 2.23, 18 since 2.14, 14 before (NCCL docs,
# Environment Variables: NCCL_IB_TIMEOUT, "Values accepted"; NVIDIA/nccl
# src/transport/net_ib.cc `NCCL_PARAM(IbTimeout, "IB_TIMEOUT", ...)` at v2.13.4-1: 14,
# v2.14.3-1 to v2.22.3-1: 18, v2.23.4-1: 20). One try waits 4.096 us x 2^value; NCCL
# retries NCCL_IB_RETRY_CNT (7) times.
IB_TIMEOUT_DEFAULTS = (((2, 23), 20), ((2, 14), 18), ((0, 0), 14))
IB_RETRIES = 7


def ib_timeout_default(version: tuple[int, ...]) -> int:
    return next(value for since, value in IB_TIMEOUT_DEFAULTS if version[:2] >= since)


def _ib_wait(value: int) -> str:
    """ "4.3 s a try, about 30 s with retries" for 20."""
    seconds = 4.096e-6 * 2**value
    return f"{seconds:.2g} s a try, about {seconds * IB_RETRIES:.2g} s with {IB_RETRIES} retries"


def ib_timeout_default_text(nccl: VersionEvidence) -> str:
    """NCCL_IB_TIMEOUT's default for the job's NCCL, or every default where it is not known."""
    if nccl.known is not None:
        value = ib_timeout_default(nccl.known)
        return f"the default of {nccl.describe()} is {value} ({_ib_wait(value)})"
    return (
        f"{nccl.account()}: NCCL's default is 20 since 2.23 ({_ib_wait(20)}), 18 from 2.14 "
        f"to 2.22 ({_ib_wait(18)}), 14 before"
    )


def roce_rails(inventory: Inventory, rails: list[str]) -> list[str]:
    """The compute rails among `rails` that run RoCE (link layer Ethernet): where a GID
    index matters to NCCL. A storage RoCE port carries none of its collectives."""
    ethernet = {
        rdma.name
        for rdma in inventory.rdma
        if any(port.link_layer == "Ethernet" for port in rdma.ports)
    }
    return [name for name in rails if name in ethernet]


def _left_to_nccl(
    inventory: Inventory,
    pairings: list[NicPairing],
    libraries: NcclLibraries | None,
    nccl: VersionEvidence,
    rails: list[str],
) -> list[LeftUnset]:
    far = sorted(
        {p.relation for p in pairings if p.relation in ("PHB", "NODE", "SYS") and not p.over_c2c}
    )
    gdr = (
        "NCCL reads the PCIe and NVLink topology and uses peer-to-peer and GPUDirect RDMA "
        "wherever the path allows (up to PXB by default)"
    )
    if far:
        gdr += (
            f"; here a GPU's nearest NIC is {'/'.join(far)}, so GPUDirect RDMA stays off: "
            "raising NCCL_NET_GDR_LEVEL is a trade to measure, not a default"
        )
    left = [
        LeftUnset(
            ("NCCL_ALGO", "NCCL_PROTO"),
            "NCCL models each algorithm's and protocol's latency and bandwidth per message size "
            "and topology and takes the fastest; forcing one is a debugging step",
            f"{NCCL_DOCS}: Debugging",
        ),
        LeftUnset(("NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL"), gdr, f"{NCCL_DOCS}: Debugging"),
        LeftUnset(
            ("NCCL_MIN_CTAS", "NCCL_MAX_CTAS", "NCCL_BUFFSIZE", "NCCL_NTHREADS"),
            "NCCL sizes channels, buffers and threads for the GPU and topology it finds",
            f"{NCCL_DOCS}: Debugging",
        ),
    ]
    if any(r.active for r in inventory.rdma):
        left.append(
            LeftUnset(
                ("NCCL_IB_TIMEOUT",),
                f"{ib_timeout_default_text(nccl)}; the default suits most fabrics: raise it "
                "to 22-23 only on a large fabric that reports IBV_WC_RETRY_EXC_ERR",
                f"{NCCL_DOCS}: NCCL_IB_TIMEOUT (Values accepted); NVIDIA/nccl "
                "src/transport/net_ib (NCCL_PARAM IbTimeout)",
            )
        )
    roce = roce_rails(inventory, rails)
    if roce:
        left.append(
            LeftUnset(
                ("NCCL_IB_GID_INDEX",),
                f"on the RoCE rails ({', '.join(roce)}) NCCL 2.21 and later find the RoCE v2 "
                "GID themselves"
                + (
                    f"; the job's: {nccl.describe()}"
                    if nccl.known is not None
                    else _installed_versions(libraries)
                ),
                f"{NCCL_DOCS}: NCCL_IB_GID_INDEX; NCCL 2.21 release notes",
            )
        )
    return left


def _installed_versions(libraries: NcclLibraries | None) -> str:
    if libraries is None:
        return ""
    if not libraries.found:
        return (
            "; no NCCL found under the root filesystem (libnccl.so.X.Y.Z) or in this "
            "Python's packages (nvidia-nccl-cuXX): make sure the job's own is 2.21 or later"
        )
    return "; installed: " + ", ".join(library.text for library in libraries.found)


def gid_discovery_warning(
    inventory: Inventory,
    libraries: NcclLibraries | None,
    rails: list[str],
    nccl: VersionEvidence | None = None,
) -> str | None:
    """An NCCL older than 2.21 on RoCE rails takes GID index 0 unless told, which on most
    RoCE ports is a RoCE v1 or link-local GID that does not route (NCCL docs:
    NCCL_IB_GID_INDEX; NCCL 2.21 release notes: RoCE GID detection). Only the compute
    rails count: the plan keeps NCCL off a storage port (NCCL_IB_HCA)."""
    if nccl is not None and nccl.known is not None:
        # The job's own NCCL decides, whatever else is installed.
        old = "" if nccl.known[:2] >= GID_DISCOVERY else nccl.describe()
    elif libraries is not None:
        old = ", ".join(library.text for library in libraries.without_gid_discovery)
    else:
        old = ""
    roce = roce_rails(inventory, rails)
    if not old or not roce:
        return None
    return (
        f"warning: {old} is older than 2.21 and does not find the RoCE v2 GID itself: on "
        f"{', '.join(roce)} it uses NCCL_IB_GID_INDEX's default 0 unless told; set "
        "NCCL_IB_GID_INDEX to the index whose /sys/class/infiniband/<hca>/ports/<port>/"
        'gid_attrs/types/<index> reads "RoCE v2" (the nccl_env check verifies it), or '
        f"use NCCL 2.21 or later ({NCCL_DOCS}: NCCL_IB_GID_INDEX)"
    )


def network_note(
    inventory: Inventory,
    used_hcas: list[str],
    sockets: list[NetInterface],
    shape: JobShape,
    ranks: int,
    rail_problems: list[RailProblem] | None = None,
) -> str:
    """The node's inter-node bandwidth, for the node and per GPU, against the ML
    Engineering book's bands, which are for the node. A compute NIC without an active
    port carries nothing and is not counted, but named."""
    if shape.nodes == 1:
        return "one-node job: the network carries no collective traffic"
    if used_hcas:
        rates = {
            r.name: max((p.rate_gbps or 0 for p in r.ports if p.state == "ACTIVE"), default=0)
            for r in inventory.rdma
            if r.active
        }
        # Only the compute NICs carry collectives; storage ports are named, not counted.
        compute = {name: rate for name, rate in rates.items() if name in used_hcas}
        total = sum(compute.values())
        speeds = "/".join(f"{rate:g}" for rate in sorted(set(compute.values())))
        what = f"{len(compute)} compute RDMA NIC(s) at {speeds} Gb/s"
        storage = [n.name for n in inventory.nics if n.name in rates and n.name not in compute]
        if storage:
            storage_speeds = "/".join(f"{r:g}" for r in sorted({rates[n] for n in storage}))
            what += f"; not counted: storage {', '.join(storage)} at {storage_speeds} Gb/s"
        down = [problem.nic for problem in rail_problems or [] if problem.down]
        degraded = [problem.nic for problem in rail_problems or [] if not problem.down]
        if degraded:
            what += f"; degraded: {', '.join(degraded)} (see the warning)"
        if down:
            what += f"; not counted: compute {', '.join(down)}, no active port (see the warning)"
    elif sockets:
        total = sum((i.speed_mbps or 0) / 1000 for i in sockets)
        what = f"no RDMA; TCP sockets over {', '.join(i.name for i in sockets)}"
    else:
        return "no usable network interface: this node cannot join a multi-node job"
    per_gpu = f", {total / ranks:g} Gb/s per GPU over {ranks} GPU(s)" if ranks else ""
    return (
        f"network: {total:g} Gb/s between nodes ({what}){per_gpu}; "
        f"{throughput_verdict(total, ranks, shape)}"
    )


def throughput_verdict(node_gbps: float, ranks: int, shape: JobShape) -> str:
    """The node's inter-node bandwidth against the book's bands, quoted in its words and
    unit (Gbps, for a node: the math of deepspeedai/DeepSpeed#2928 they come from counts the
    traffic between nodes of G GPUs each), said to be a derivation for ZeRO-3 on V100s.
    Nothing is called a need, and no band is applied per GPU (the book gives none)."""
    low, high = BOOK_OK_GBPS
    ideal_low, ideal_high = BOOK_IDEAL_GBPS
    not_enough = f'"{BOOK_NOT_ENOUGH_GBPS}Gbps is not enough"'
    ok = f'"{low}-{high}Gbps is ok"'
    ideal = f'"{ideal_low}-{ideal_high}Gbps is ideal"'
    if node_gbps > ideal_high:
        band = f"above the book's {ideal}"
    elif node_gbps >= ideal_low:
        band = f"in the book's {ideal}"
    elif node_gbps > high:
        band = f"between the book's {ok} and {ideal}"
    elif node_gbps >= low:
        band = f"in the book's {ok}"
    elif node_gbps > BOOK_NOT_ENOUGH_GBPS:
        band = f"between the book's {not_enough} and {ok}"
    else:
        band = f"at or below the book's {not_enough}"
    gpus = shape.nodes * ranks if shape.nodes is not None else None
    scale = (
        f"; this job has {gpus} GPUs, fewer than the {BOOK_JOB_GPUS}+ the bands are for"
        if gpus is not None and gpus < BOOK_JOB_GPUS
        else ""
    )
    return (
        f"{node_gbps:g} Gb/s for the node is {band}: {BOOK_BANDS}, for a node's bandwidth to "
        "the others (the tl;dr of the math in deepspeedai/DeepSpeed#2928 for ZeRO-3's traffic "
        'between nodes: a derivation, for V100s, with no figure per GPU; the book adds that "the '
        'requirements are higher for A100 gpu nodes and even higher for H100s")'
        f"{scale} ({ML_ENGINEERING_THROUGHPUT})"
    )


def debug_level(environ: Mapping[str, str]) -> Recommendation:
    """NCCL_DEBUG=WARN: unset, NCCL logs nothing, so the lines that explain a failure are
    lost; a level the user chose (INFO while debugging) is theirs to keep."""
    return Recommendation(
        "NCCL_DEBUG",
        NCCL_DEBUG_LEVEL,
        "unset, NCCL logs nothing at all (the level defaults to NONE), so the WARN lines "
        "that name a failed IB or socket connection are lost; WARN logs only those, as in "
        "NCCL's own nccl.conf example",
        f"NVIDIA/nccl src/debug.cc (ncclDebugInit); {NCCL_DOCS}: NCCL_DEBUG",
        advisory="NCCL_DEBUG" in environ,
    )


def roce_traffic_class_note(inventory: Inventory, used_hcas: list[str]) -> str | None:
    """On RoCE, NCCL marks its packets with traffic class 0 and service level 0 unless told
    (NVIDIA/nccl src/transport/net_ib: NCCL_IB_TC, NCCL_IB_SL), which on a fabric with
    one lossless (PFC/ECN) class is the lossy one. The class is the switches' setting, so
    it is said where to find it, never guessed."""
    roce = [
        rdma.name
        for rdma in inventory.rdma
        if rdma.name in used_hcas and any(p.link_layer == "Ethernet" for p in rdma.ports)
    ]
    if not roce:
        return None
    return (
        f"RoCE ({', '.join(roce)}): NCCL sends with traffic class 0 and service level 0 "
        "unless NCCL_IB_TC / NCCL_IB_SL are set (NVIDIA/nccl src/transport/net_ib; an "
        "mlx5 port's default in /sys/class/infiniband/<hca>/tc/<port>/traffic_class, "
        "where an administrator set one, replaces that 0), and "
        "the fabric's lossless class (PFC/ECN) is a setting of its switches, not of this "
        "node: take it from the network team or the switch QoS configuration (on the "
        "host, `mlnx_qos -i <netdev>` shows the trust mode and which priority has PFC on; "
        "NCCL_IB_TC is the DSCP value times 4) and set NCCL_IB_TC to it on every node "
        "(NCCL_IB_SL, the VLAN priority, matters only where the switches trust PCP "
        "rather than DSCP); nodecheck does not guess a value "
        f"({NCCL_DOCS}: NCCL_IB_TC, NCCL_IB_SL)"
    )


def nccl_advice(
    inventory: Inventory,
    pairings: list[NicPairing],
    addressed: AddressedInterfaces,
    environ: Mapping[str, str],
    shape: JobShape,
    ranks: int,
    libraries: NcclLibraries | None = None,
    nccl: VersionEvidence | None = None,
    master: MasterAddrRoute | None = None,
    gloo: GlooSocketIfname | None = None,
) -> NcclAdvice:
    """`addressed`: the interfaces with addresses and the default route's; `master`: the
    interface MASTER_ADDR's subnet is on (None: not read, as if unset); `gloo`: what
    GLOO_SOCKET_IFNAME names (None: not read, as if unset); `libraries`: the
    NCCL versions read on the node (checks/node/nccl_library.py), None when not read, and
    the advice then names no version; `nccl`: the job's NCCL (checks/rules/job_versions.py),
    for the defaults that depend on its version."""
    nccl = VersionEvidence("NCCL") if nccl is None else nccl
    hca_env, hca_left, used = _ib_hca(inventory, pairings, environ)
    env, socket_left, notes, choice = _socket_ifname(
        inventory, addressed, master or MasterAddrRoute(MasterAddrOutcome.UNSET), environ, used
    )
    current = environ.get("NCCL_SOCKET_IFNAME")
    nccl_kept = current is not None and any(
        r.name == "NCCL_SOCKET_IFNAME" and r.value == current for r in env
    )
    sockets = [] if choice is None else choice.interfaces
    gloo_choice = choice
    if current is not None and nccl_kept:
        gloo_choice, selected = _kept_choice(inventory, addressed, current, choice)
        sockets = selected or sockets
    gloo_env, gloo_notes = gloo_ifname(gloo_choice, inventory, addressed, gloo, nccl_kept)
    notes += gloo_notes
    layers = {
        port.link_layer
        for rdma in inventory.rdma
        if rdma.name in used
        for port in rdma.ports
        if port.link_layer
    }
    fabric_env, fabric_left = _fabric(shape, ranks, layers, len(used))
    left = socket_left + hca_left + fabric_left
    left += _left_to_nccl(inventory, pairings, libraries, nccl, used)
    notes += list(dict.fromkeys(p.note for p in pairings if p.note))
    notes += far_nic_notes(pairings)
    # A degraded or down rail slows every collective of a multi-node job: said as a
    # warning, with the fix (the ranks whose GPU it serves carry it too).
    rail_problems = node_rail_problems(inventory)
    notes += [f"warning: {problem.message()}" for problem in rail_problems]
    notes += [f"NIC roles: {note}" for note in node_role_notes(inventory)]
    notes.append(
        network_note(inventory, used, [] if used else sockets, shape, ranks, rail_problems)
    )
    traffic_class = roce_traffic_class_note(inventory, used)
    if traffic_class is not None:
        notes.append(traffic_class)
    gid = gid_discovery_warning(inventory, libraries, used, nccl)
    if gid is not None:
        notes.append(gid)
    return NcclAdvice([*env, *gloo_env, *hca_env, *fabric_env, debug_level(environ)], left, notes)
