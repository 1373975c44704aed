"""Which CPUs, memory and NICs each local rank should use: the GPU's own NUMA node, split
fairly, and the RDMA NIC nearest its GPU.

Local rank N drives the Nth GPU in PCI bus order (what CUDA_DEVICE_ORDER=PCI_BUS_ID
gives), or the Nth GPU CUDA_VISIBLE_DEVICES names (by index, UUID or MIG device: read as
CUDA reads it in tuning/visible_devices.py), counting only
the GPUs meant for this host and container (checks/node/gpu_assignment.py), as CUDA
does: a GPU passed through to a VM or given to another container is not counted. Each
rank is bound to the NUMA node its GPU hangs off (docs/hardware.md §4), and the
physical cores of that node are split into disjoint, equal, contiguous sets
among the ranks that share it, so data loaders of two ranks never fight for a
core. SMT siblings go with their core when asked for (`tune` and `exec` ask by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.checks.node.gpu_assignment import GpuAssignment
from nodecheck.checks.node.gpu_identities import GpuIdentities
from nodecheck.checks.node.inventory import Inventory, Nic
from nodecheck.checks.node.nic_roles import (
    GPUDIRECT_REACH,
    NicRole,
    nic_roles,
    node_rail_problems,
)
from nodecheck.checks.node.numa import memory_nodes_served
from nodecheck.checks.node.pci import PciDevice
from nodecheck.checks.node.topology import Relation
from nodecheck.checks.node.variables import parse_count
from nodecheck.checks.record import record
from nodecheck.tuning.visible_devices import VisibleDevices, resolve_visible_devices


@record
class RankBinding:
    local_rank: int
    gpu: str  # PCI bus id
    numa_node: int | None  # the node its CPUs and memory are bound to; None: not bound to one
    cpus: tuple[int, ...]  # the rank's cores (with their SMT siblings when asked for)
    note: str = ""  # why the binding is not the GPU's own NUMA node, when it is not
    # Why the rank has no CPU to run on (then `cpus` is empty): it must not be launched.
    error: str = ""
    # Why the binding is not what it should be though it can run: ranks share CPUs.
    warning: str = ""
    # Where its memory is bound when not on `numa_node`: the memory-only node (HBM, CXL)
    # that serves a CPU-only node's CPUs. None: on `numa_node`, or (with
    # `memory_unbound`) nowhere, the note saying why.
    memory_node: int | None = None
    memory_unbound: bool = False

    @property
    def membind(self) -> int | None:
        """The node numactl's --membind names; None: memory is not bound."""
        if self.memory_unbound:
            return None
        return self.memory_node if self.memory_node is not None else self.numa_node

    def numactl(self) -> list[str]:
        """The numactl command line that applies this binding (before the command). A
        binding without CPUs has none: `--physcpubind=` with nothing after it is refused by
        numactl, and an empty affinity by sched_setaffinity(2) (EINVAL)."""
        if not self.cpus:
            raise ValueError(f"local rank {self.local_rank} has no CPU to bind to: {self.error}")
        if self.membind is None:
            return ["numactl", f"--physcpubind={format_cpulist(set(self.cpus))}"]
        return [
            "numactl",
            f"--physcpubind={format_cpulist(set(self.cpus))}",
            f"--membind={self.membind}",
        ]


def parse_gpu_indices(text: str) -> list[int] | None:
    """Slurm's GPU index list ("0,1,4" in SLURM_STEP_GPUS / SLURM_JOB_GPUS); None if it
    is not one."""
    indices = [parse_count(item) for item in text.split(",")] if text.strip() else []
    if not indices or any(index is None for index in indices):
        return None
    return [index for index in indices if index is not None]


def slurm_gpus(gpus: list[PciDevice], environ: Mapping[str, str], *names: str) -> list[PciDevice]:
    """The GPUs the first of these Slurm variables lists, by index in bus order."""
    for name in names:
        indices = parse_gpu_indices(environ.get(name, ""))
        if indices is not None:
            return [gpus[index] for index in sorted(set(indices)) if index < len(gpus)]
    return []


def visible_gpus(
    gpus: list[PciDevice],
    environ: Mapping[str, str],
    host: list[PciDevice] | None = None,
    identities: GpuIdentities | None = None,
) -> list[PciDevice]:
    """The GPUs local ranks count, in order: every GPU of `gpus` (those CUDA enumerates
    here, in PCI bus order), or those CUDA_VISIBLE_DEVICES names among them, by index,
    UUID or MIG device, as CUDA reads it (tuning/visible_devices.py: it stops at the first
    entry it cannot use, so "" or "-1" hide every GPU, and a GPU named twice leaves none).
    `identities`: the nvidia driver's GPU UUIDs and MIG instances (None: not read, so an
    entry naming a GPU by UUID cannot be mapped).

    Slurm's SLURM_STEP_GPUS and SLURM_JOB_GPUS index the host's GPUs (`host`, default
    `gpus`: inside a container it also holds the GPUs given to others). Slurm with
    ConstrainDevices=yes numbers CUDA_VISIBLE_DEVICES from 0 among the job's GPUs (the
    device cgroup hides the others from CUDA, not from sysfs). When indices name GPUs
    outside those Slurm lists but fit its length, they are read as positions in it.
    """
    return visible_devices(gpus, environ, host, identities).gpus


def visible_devices(
    gpus: list[PciDevice],
    environ: Mapping[str, str],
    host: list[PciDevice] | None = None,
    identities: GpuIdentities | None = None,
) -> VisibleDevices:
    """visible_gpus with how it was read: the notes, the warnings every visible rank
    carries, and why CUDA sees no GPU past them."""
    allocated = slurm_gpus(
        gpus if host is None else host, environ, "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"
    )
    return resolve_visible_devices(gpus, environ, identities, allocated)


def _cores_of(inventory: Inventory, cpus: frozenset[int]) -> list[tuple[int, ...]]:
    """The physical cores among `cpus`, each as its SMT threads (lowest first), in order.
    A CPU whose topology could not be read counts as a core of its own."""
    cores = {tuple(sorted(core & cpus)) for core in inventory.cpu.cores if core & cpus}
    known = {cpu for core in cores for cpu in core}
    cores |= {(cpu,) for cpu in cpus - known}
    return sorted(cores)


def _split(
    cores: list[tuple[int, ...]], ranks: int, with_smt_siblings: bool
) -> list[tuple[int, ...]]:
    """`ranks` CPU sets out of `cores`: disjoint, equal and contiguous shares of whole
    cores while there are enough cores; else of hardware threads (the SMT siblings of one
    core go to different ranks); else one CPU each, in turn (ranks share CPUs: the caller
    says so)."""
    if len(cores) >= ranks:
        share = len(cores) // ranks
        return [
            tuple(
                sorted(
                    cpu
                    for core in cores[position * share : (position + 1) * share]
                    for cpu in (core if with_smt_siblings else core[:1])
                )
            )
            for position in range(ranks)
        ]
    threads = [cpu for core in cores for cpu in core]
    if len(threads) >= ranks:
        share = len(threads) // ranks
        return [
            tuple(sorted(threads[position * share : (position + 1) * share]))
            for position in range(ranks)
        ]
    return [(threads[position % len(threads)],) for position in range(ranks)]


def _no_cpu_reason(
    inventory: Inventory, online: frozenset[int], allowed: frozenset[int] | None
) -> str:
    """Why no CPU is left to bind any rank to, as the reading found it."""
    refused = "; a binding needs one at least (numactl and sched_setaffinity refuse an empty one)"
    if not online:
        problem = inventory.cpu.problems.get("online")
        if problem is None:
            return (
                "no CPU to bind it to: devices/system/cpu/online was read and names no CPU, "
                "which no running kernel prints (the tree is incomplete)" + refused
            )
        found = "" if "no cpuN directory" in problem else ", and no cpuN directory shows one"
        return f"no CPU to bind it to: no online CPU could be read ({problem}{found})" + refused
    if not allowed:
        return (
            "no CPU to bind it to: this process's cpuset holds no CPU; ask the scheduler for "
            "CPUs of this node"
        )
    # The online CPUs as they were read: from `online`, or inferred without it.
    inferred = [n for n in inventory.cpu.notes if n.startswith("devices/system/cpu/online")]
    return (
        f"no CPU to bind it to: this process's cpuset ({format_cpulist(allowed)}) holds "
        f"none of the online CPUs ({'; '.join([format_cpulist(online), *inferred])}); ask the "
        "scheduler for CPUs of this node"
    )


def _unplaced_note(inventory: Inventory, gpu: str, node: int | None, usable: frozenset[int]) -> str:
    """Why a GPU's rank cannot be bound next to it, and what it gets instead."""
    instead = (
        "it gets CPUs no other rank needs (free ones, or cores a node holds beyond its own "
        "ranks' share; else it shares a rank's, warned) and its memory is not bound"
    )
    if node is None:
        return (
            f"firmware gives GPU {gpu} no NUMA node (numa_node -1) and no other device under "
            f"its host bridge tells which: {instead}"
        )
    known = {n.number: n for n in inventory.numa_nodes if n.listed}
    if node not in known:
        return (
            f"GPU {gpu} is on NUMA node {node}, which devices/system/node does not list "
            f"(offline, or not described: no memory to bind to): {instead}"
        )
    if not (known[node].cpus & (frozenset(inventory.cpu.online) or known[node].cpus)):
        return (
            f"GPU {gpu} is on NUMA node {node}, which has no online CPU (a memory-only node, "
            f"such as GPU or CXL memory, or one whose CPUs are offline): {instead}"
        )
    return (
        f"this process may not use any CPU of NUMA node {node} "
        f"(cpuset {format_cpulist(usable)}): the rank runs away from its GPU; ask "
        "the scheduler for CPUs on every GPU's socket"
    )


def _has_online_cpus(inventory: Inventory, node: int) -> bool:
    """Whether a listed node holds online CPUs (not a memory-only one)."""
    cpus = next((n.cpus for n in inventory.numa_nodes if n.number == node and n.listed), None)
    return bool(cpus and cpus & (frozenset(inventory.cpu.online) or cpus))


def _away_warning(inventory: Inventory, gpu: str, node: int, usable: frozenset[int]) -> str:
    """The warning of a rank whose GPU's node has online CPUs, none of them in this
    process's cpuset: it runs, but every copy between its memory and its GPU crosses the
    link between sockets (docs/hardware.md §4)."""
    theirs = next(n.cpus for n in inventory.numa_nodes if n.number == node)
    return (
        f"its GPU {gpu} is on NUMA node {node} (CPUs {format_cpulist(theirs)}), but this "
        f"process's cpuset ({format_cpulist(usable)}) holds none of them: the rank runs on "
        "another node's CPUs and its host-device copies cross the socket link; ask the "
        "scheduler for CPUs of each GPU's node (Slurm: --gres-flags=enforce-binding with "
        "gres.conf Cores=, or --gpu-bind=closest)"
    )


def _sharing_warnings(
    inventory: Inventory, slices: dict[str, tuple[int | None, tuple[int, ...]]]
) -> dict[str, str]:
    """For each GPU whose rank shares CPUs, or physical cores (one SMT thread each), with
    another GPU's rank, the warning that says so: they slow each other down."""
    siblings = {number: cpu.siblings for number, cpu in inventory.cpu.cpus.items()}

    def cores(cpus: tuple[int, ...]) -> set[frozenset[int]]:
        return {siblings.get(cpu, frozenset({cpu})) for cpu in cpus}

    warnings = {}
    for bdf, (_, cpus) in slices.items():
        same_cpus: dict[str, set[int]] = {}
        same_cores: list[str] = []
        for other, (_, theirs) in slices.items():
            if other == bdf:
                continue
            if set(cpus) & set(theirs):
                same_cpus[other] = set(cpus) & set(theirs)
            elif cores(cpus) & cores(theirs):
                same_cores.append(other)
        parts = []
        if same_cpus:
            common = set().union(*same_cpus.values())
            parts.append(
                f"fewer CPUs than ranks: this rank shares CPU(s) {format_cpulist(common)} with "
                f"the rank(s) of GPU {', '.join(sorted(same_cpus))}"
            )
        if same_cores:
            parts.append(
                "fewer physical cores than ranks: this rank shares a core (one SMT thread "
                f"each) with the rank(s) of GPU {', '.join(sorted(same_cores))}"
            )
        if parts:
            warnings[bdf] = (
                "; ".join(parts) + ", and they slow each other down; run fewer ranks here, "
                "or ask the scheduler for more CPUs"
            )
    return warnings


def gpu_numa_node(inventory: Inventory, gpu: PciDevice) -> tuple[int | None, str]:
    """The GPU's NUMA node, and a note when it had to be inferred from its host bridge
    (firmware left numa_node at -1, Documentation/ABI/testing/sysfs-bus-pci)."""
    node = inventory.numa_node_of(gpu)
    if node is not None and gpu.numa_node is not None and gpu.numa_node >= 0:
        return node, ""
    if node is not None:
        others = len(inventory.numa_nodes) - 1
        read = "no numa_node file" if gpu.numa_node is None else f"numa_node {gpu.numa_node}"
        return node, (
            f"firmware gives GPU {gpu.bdf} no NUMA node ({read}); node "
            f"{node} is the only node with online CPUs"
            + (f" (the {others} other(s) are offline or hold only memory)" if others else "")
            + ", so it is bound there"
        )
    if not gpu.host_bridge:
        return None, ""
    neighbours = inventory.host_bridge_numa_nodes(gpu)
    if len(neighbours) != 1:
        return None, ""
    [inferred] = neighbours
    return inferred, (
        f"firmware gives GPU {gpu.bdf} no NUMA node (numa_node -1); the other devices under "
        f"its host bridge {gpu.host_bridge} are on node {inferred}, so it is bound there"
    )


def sharing_gpus(
    gpus: list[PciDevice],
    environ: Mapping[str, str],
    host: list[PciDevice] | None = None,
    identities: GpuIdentities | None = None,
) -> list[PciDevice] | None:
    """Every GPU of this job step on the node, when the launcher shows that this process
    sees only some of them: `srun --gpus-per-task` or `--gpu-bind` give each task its own
    CUDA_VISIBLE_DEVICES, while SLURM_STEP_GPUS lists the step's GPUs by index. Sibling
    tasks then share the node's cores, and each must take only its GPU's share. None
    when there is nothing to share with (SLURM_JOB_GPUS alone does not say so: a batch
    script may run one process on one of its GPUs). `gpus`, `host` and `identities` as
    for visible_gpus."""
    visible = visible_gpus(gpus, environ, host, identities)
    step = slurm_gpus(gpus if host is None else host, environ, "SLURM_STEP_GPUS")
    if len(step) > len(visible) and all(gpu in step for gpu in visible):
        return step
    return None


def _shared_cpus(bindings: list[RankBinding]) -> int:
    """How many (rank, CPU) bindings hold a CPU another rank holds too."""
    holders: dict[int, int] = {}
    for binding in bindings:
        for cpu in binding.cpus:
            holders[cpu] = holders.get(cpu, 0) + 1
    return sum(count for count in holders.values() if count > 1)


def bind_ranks(
    inventory: Inventory,
    environ: Mapping[str, str],
    *,
    allowed: frozenset[int] | None = None,
    with_smt_siblings: bool = False,
    assignment: GpuAssignment | None = None,
    allowed_nodes: frozenset[int] | None = None,
    identities: GpuIdentities | None = None,
) -> list[RankBinding]:
    """As _bind_ranks. SMT siblings are given with their cores only where that leaves no
    rank sharing more CPUs than without them: with fewer cores than ranks, the siblings
    of the ranks' cores go to the ranks that would otherwise share a CPU (sharing a core,
    one thread each, is warned, and costs less than two ranks on one thread)."""
    bind = partial(
        _bind_ranks,
        inventory,
        environ,
        allowed=allowed,
        assignment=assignment,
        allowed_nodes=allowed_nodes,
        identities=identities,
    )
    if not with_smt_siblings:
        return bind(with_smt_siblings=False)
    full = bind(with_smt_siblings=True)
    shared = _shared_cpus(full)
    if not shared:
        return full
    lean = bind(with_smt_siblings=False)
    return lean if _shared_cpus(lean) < shared else full


def _bind_ranks(
    inventory: Inventory,
    environ: Mapping[str, str],
    *,
    allowed: frozenset[int] | None,
    with_smt_siblings: bool,
    assignment: GpuAssignment | None,
    allowed_nodes: frozenset[int] | None,
    identities: GpuIdentities | None,
) -> list[RankBinding]:
    """One binding per visible GPU (one rank per GPU), inside the CPUs `allowed`
    (this process's cpuset; None: every online CPU), its memory bound only to a node of
    `allowed_nodes` (the cpuset's memory nodes; None: any). The cores of each NUMA node are
    split among the GPUs on it that this job uses: the visible ones, or the whole
    step's when each task sees only its own (sharing_gpus). `assignment`: which GPUs
    are meant for this host and container (None: every GPU of the inventory);
    `identities`: the driver's GPU UUIDs, for a CUDA_VISIBLE_DEVICES naming GPUs by UUID."""
    here = inventory.gpus if assignment is None else assignment.here
    host = inventory.gpus if assignment is None else assignment.host
    gpus = visible_gpus(here, environ, host, identities)
    sharers = sharing_gpus(here, environ, host, identities) or gpus
    online = frozenset(inventory.cpu.online)
    usable = online if allowed is None else online & allowed
    if not usable:
        why = _no_cpu_reason(inventory, online, allowed)
        return [RankBinding(rank, gpu.bdf, None, (), error=why) for rank, gpu in enumerate(gpus)]
    # Only listed nodes: one known only from its CPUs' cpuN/nodeM links has no directory
    # (offline: no memory to bind to); its CPUs are free for the ranks placed nowhere.
    node_cpus = {n.number: n.cpus & usable for n in inventory.numa_nodes if n.listed}
    located = {gpu.bdf: gpu_numa_node(inventory, gpu) for gpu in sharers}
    notes: dict[str, str] = {bdf: note for bdf, (_, note) in located.items() if note}
    groups: dict[int | None, list[str]] = {}
    unplaced: list[str] = []
    away: dict[str, str] = {}  # GPUs whose node's CPUs the cpuset leaves out: why
    for gpu in sharers:
        node = located[gpu.bdf][0]
        if node is not None and node_cpus.get(node):
            groups.setdefault(node, []).append(gpu.bdf)
        else:
            unplaced.append(gpu.bdf)
            if node is not None and node in node_cpus and _has_online_cpus(inventory, node):
                away[gpu.bdf] = _away_warning(inventory, gpu.bdf, node, usable)
            inferred = notes.get(gpu.bdf, "")
            unplaced_note = _unplaced_note(inventory, gpu.bdf, node, usable)
            notes[gpu.bdf] = f"{inferred}; {unplaced_note}" if inferred else unplaced_note
    pools: dict[int | None, frozenset[int]] = {n: node_cpus[n] for n in groups if n is not None}
    # A node with fewer CPUs in reach than GPUs on it: the ranks beyond one CPU each run
    # elsewhere rather than share (a rank of its own on a remote CPU beats two on one).
    for node in list(groups):
        members, room = groups[node], len(pools[node])
        if len(members) > room:
            groups[node] = members[:room]
            for bdf in members[room:]:
                unplaced.append(bdf)
                notes[bdf] = (
                    f"NUMA node {node} has {room} CPU(s) in reach for the ranks of its "
                    f"{len(members)} GPUs: this one runs on CPUs no other rank uses, elsewhere, "
                    "and its memory is not bound"
                )
    extras: dict[int | None, list[str]] = {}  # unplaced GPUs taking a group's spare cores
    shared_with: dict[str, str] = {}  # unplaced GPU -> the placed rank's GPU it shares with
    spare: dict[int | None, int] = {}  # a group's cores beyond its own ranks' peer share
    if unplaced:
        # No locality to follow: CPUs no other rank is bound to, one at least each.
        free = usable - frozenset().union(*pools.values())
        if free:
            groups[None], pools[None] = unplaced[: len(free)], free
        cores = {n: len(_cores_of(inventory, pool)) for n, pool in pools.items()}
        located_groups = [n for n in groups if n is not None]

        def peer_share(node: int | None) -> int | None:
            """The fewest cores a rank bound next to its GPU gets in another group: a
            group may give a rank placed nowhere only what it holds beyond that for its
            own ranks. None: no other such rank to keep level with."""
            shares = [cores[m] // len(groups[m]) for m in located_groups if m != node]
            return min(shares) if shares and node is not None else None

        def room_in(node: int | None) -> int:
            """The cores each rank placed nowhere would get here, one more included."""
            peer = peer_share(node)
            if peer is None:  # an equal split among all its ranks
                return cores[node] // (len(groups[node]) + 1)
            return (cores[node] - peer * len(groups[node])) // (len(extras.get(node, [])) + 1)

        for bdf in unplaced[len(free) :]:
            roomiest = max(groups, key=room_in)
            if room_in(roomiest) >= 1:
                peer = peer_share(roomiest)
                if peer is None:
                    groups[roomiest] = groups[roomiest] + [bdf]
                else:
                    extras.setdefault(roomiest, []).append(bdf)
                    spare[roomiest] = cores[roomiest] - peer * len(groups[roomiest])
                continue
            # Every core is needed: share the CPUs of a rank, the least shared one first
            # and then the one with the most cores, which both ranks' warnings then say
            # (a shared binding still runs; a shrunken local one slows its GPU for good).
            shared = list(shared_with.values())
            shared_with[bdf] = min(
                (member for n in groups for member in groups[n]),
                key=lambda member: (
                    shared.count(member),
                    -min(cores[n] / len(groups[n]) for n in groups if member in groups[n]),
                ),
            )
    slices: dict[str, tuple[int | None, tuple[int, ...]]] = {}
    memory: dict[str, tuple[int | None, str]] = {}  # bound elsewhere than its node: where
    for node, members in groups.items():
        group_cores = _cores_of(inventory, pools[node])
        taking = extras.get(node, [])
        if taking:
            kept = len(group_cores) - spare[node]
            for bdf, cpus in zip(
                taking,
                _split(group_cores[kept:], len(taking), with_smt_siblings),
                strict=True,
            ):
                slices[bdf] = (None, cpus)
            group_cores = group_cores[:kept]
        shares = _split(group_cores, len(members), with_smt_siblings)
        target, why = memory_target(inventory, node) if node is not None else (None, "")
        memory_allowed = allowed_nodes is None or target is None or target in allowed_nodes
        for bdf, cpus in zip(members, shares, strict=True):
            if bdf in unplaced:
                slices[bdf] = (None, cpus)
                continue
            said = [why] if why else []
            if memory_allowed:
                slices[bdf] = (node, cpus)
                if target != node:
                    memory[bdf] = (target, why)
            else:
                slices[bdf] = (None, cpus)
                whose = f"GPU {bdf}'s" if target == node else f"the memory of GPU {bdf}'s node"
                said.append(
                    f"the cpuset's memory nodes ({format_cpulist(allowed_nodes or ())}) leave "
                    f"out NUMA node {target}, {whose}: the rank runs on that node's CPUs and "
                    f"its memory is not bound (the kernel refuses --membind={target} here)"
                )
            if said:
                notes[bdf] = "; ".join([notes[bdf], *said] if notes.get(bdf) else said)
    # Threads no rank is bound to (the SMT siblings of the ranks' cores, without
    # --with-smt-siblings) come before another rank's own CPUs: sharing a core, warned,
    # beats sharing a CPU.
    bound = frozenset(cpu for _, cpus in slices.values() for cpu in cpus)
    unbound = sorted(usable - bound)
    sharing = list(shared_with)
    if unbound and sharing:
        taking = sharing[: len(unbound)]
        share = len(unbound) // len(taking)
        for position, bdf in enumerate(taking):
            slices[bdf] = (None, tuple(unbound[position * share : (position + 1) * share]))
        sharing = sharing[len(taking) :]
    for bdf in sharing:
        slices[bdf] = (None, slices[shared_with[bdf]][1])
    warnings = _sharing_warnings(inventory, slices)
    return [
        RankBinding(
            rank,
            gpu.bdf,
            *slices[gpu.bdf],
            note=_with_local_cpus_problem(gpu, slices[gpu.bdf][0], notes.get(gpu.bdf, "")),
            warning="; ".join(w for w in (away.get(gpu.bdf), warnings.get(gpu.bdf)) if w),
            memory_node=memory.get(gpu.bdf, (None, ""))[0],
            memory_unbound=gpu.bdf in memory and memory[gpu.bdf][0] is None,
        )
        for rank, gpu in enumerate(gpus)
    ]


def memory_target(inventory: Inventory, node: int) -> tuple[int | None, str]:
    """Where the memory of a rank whose CPUs are on `node` goes, and why when not there.
    A node with memory (or whose memory was not read) is its own target. A CPU-only node
    (MemTotal 0, or not in has_memory: Documentation/ABI/stable/sysfs-devices-node) can
    hold none: the kernel refuses a --membind that names only such nodes (set_mempolicy(2),
    EINVAL). Its memory is then that of the memory-only nodes naming it an initiator
    (accessN/initiators: Documentation/admin-guide/mm/numaperf.rst): the only one, or of
    several (HBM beside persistent memory) the one with the highest read bandwidth from
    it, where the kernel gives each one's. Anything else is not guessed: memory is not
    bound, and the note says why."""
    nodes = inventory.numa_nodes
    own = next((n for n in nodes if n.number == node), None)
    if own is None or own.holds_memory is not False:
        return node, ""
    served = memory_nodes_served(nodes, node)
    names = ", ".join(str(n.number) for n in served)
    if len(served) == 1:
        [target] = served
        return target.number, (
            f"NUMA node {node} has CPUs and no memory; its memory is node {target.number}'s, "
            f"which names it an initiator (access{target.access_class}/initiators): memory "
            f"is bound there (--membind={target.number})"
        )
    bandwidths = [n.read_bandwidth for n in served]
    if served and all(bandwidths):
        best = max(bandwidths, key=lambda b: b or 0)
        fastest = [n for n in served if n.read_bandwidth == best]
        if len(fastest) == 1:
            [target] = fastest
            return target.number, (
                f"NUMA node {node} has CPUs and no memory; the memory nodes {names} name it "
                f"an initiator, node {target.number} with the highest read bandwidth from it "
                f"({best} MB/s): memory is bound there (--membind={target.number}); the "
                "others are for what the application places there itself"
            )
    if served:
        return None, (
            f"NUMA node {node} has CPUs and no memory; the memory nodes {names} name it an "
            "initiator, and the kernel gives no read bandwidth that tells one from the "
            "others: memory is not bound (numactl --preferred or --interleave over them "
            "is the application's choice)"
        )
    return None, (
        f"NUMA node {node} has CPUs and no memory, and no memory node names it an "
        "initiator (no accessN/initiators: firmware without an HMAT, or a kernel before "
        "5.2): which memory is nearest could not be determined, so memory is not bound"
    )


def _with_local_cpus_problem(gpu: PciDevice, node: int | None, note: str) -> str:
    """`note`, led by why the GPU's `local_cpulist` could not be used (unreadable, or
    naming CPUs no kernel has, such as 0-2147483647), where it could not: the rank is then
    placed by the GPU's NUMA node alone, unconfirmed by the list the kernel derives from
    that node (drivers/pci/pci-sysfs.c local_cpulist_show: cpumask_of_pcibus)."""
    problem = gpu.problems.get("local_cpulist")
    if problem is None:
        return note
    said = f"GPU {gpu.bdf}'s local CPUs cannot be used ({problem})"
    if node is not None:
        said += f": its rank gets the CPUs of its NUMA node {node} instead"
    return f"{said}; {note}" if note else said


@record
class NicPairing:
    gpu: str  # PCI bus id
    nics: tuple[str, ...]  # compute RDMA device names (mlx5_0), nearest first
    relation: str | None  # PIX, PXB, PHB, NODE or SYS; None without an RDMA NIC
    note: str
    # Storage RDMA NICs as near this GPU as its own, named apart: "mlx5_1 (storage,
    # 100 Gb/s, PIX)". NCCL's collectives stay on the compute NICs.
    also_near: tuple[str, ...] = ()
    # Its own compute NIC runs below its peers' rate or has no active port
    # (nic_roles.rail_problems): the rank runs, slower; the node's notes say what to fix.
    warning: str = ""
    # The GPU hangs off its CPU by NVLink-C2C and its nearest NIC is on that CPU's PCIe
    # (nvidia-smi's PHB or NODE): NCCL's P2C path, where it uses GPUDirect RDMA over C2C.
    over_c2c: bool = False


def _also_near(
    inventory: Inventory, gpu: PciDevice, storage: list[Nic], nearest: Relation
) -> tuple[str, ...]:
    described = []
    for nic in storage:
        relation = inventory.relation(gpu, nic.pci)
        if relation <= max(nearest, GPUDIRECT_REACH):
            rate = f"{nic.rate_gbps:g} Gb/s" if nic.rate_gbps else "rate unknown"
            described.append(f"{nic.name} ({NicRole.STORAGE.value}, {rate}, {relation.name})")
    return tuple(described)


# NCCL counts a GPU attached to its CPU by C2C and a NIC on that CPU's PCIe (what
# nvidia-smi shows as PHB or NODE: NCCL has no NODE) as the path P2C, and uses GPUDirect
# RDMA up to P2C when NCCL_NET_GDR_C2C is 1: the default since NCCL 2.27, 0 in 2.26 where
# it appeared, absent before (NVIDIA/nccl, src/graph/paths.cc: mergePathType and
# ncclTopoCheckGdr; docs/userguide/source/env.rst, NCCL_NET_GDR_C2C).
C2C_NOTE = (
    "GPU {gpu} hangs off its Grace CPU by NVLink-C2C (the driver's numa_status) and the "
    "nearest RDMA NIC is on that CPU's PCIe ({relation}): NCCL 2.27 and later count that "
    "path as P2C and use GPUDirect RDMA over C2C by default (NCCL_NET_GDR_C2C=1, "
    "src/graph/paths.cc); NCCL 2.26 needs NCCL_NET_GDR_C2C=1 for it, and older versions "
    "stage through host memory"
)


def pair_nics(
    inventory: Inventory, gpus: list[PciDevice], c2c_gpus: frozenset[str] = frozenset()
) -> list[NicPairing]:
    """Each GPU's nearest compute NIC(s) by PCIe relation (PIX before PXB before PHB
    before NODE before SYS, as NCCL ranks them). Compute NICs are each GPU's nearest RDMA
    NICs of the fastest class (checks/node/nic_roles.py); a slower storage port beside a GPU (the
    XE9680's ConnectX-6 Dx behind GPU 0's switch) is named apart in `also_near`, never
    dealt out as an equal. GPUs with the same nearest NICs (two GPUs and two NICs behind
    one switch) get them dealt out in bus order, one each, so no NIC carries two GPUs'
    traffic while another idles. A GPU whose own compute NIC is degraded or down gets a
    `warning` naming it (the node's notes carry the fix). `c2c_gpus`: the bus ids of
    GPUs attached to their CPU by NVLink-C2C (checks/node/coherent_gpus.py)."""
    roles = nic_roles(inventory)
    rail_problems = node_rail_problems(inventory)
    # A NIC without an ACTIVE port carries nothing (NCCL skips it).
    active = [nic for nic in inventory.nics if nic.is_rdma and nic.state == "ACTIVE"]
    compute = [nic for nic in active if roles[nic.name] is NicRole.COMPUTE]
    # With every compute port down, NCCL falls back on whatever RDMA port is active.
    rdma = compute or active
    storage = [nic for nic in active if nic not in rdma]
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
            note = "no RDMA NIC with an active port: NCCL uses sockets between nodes"
            warning = "; ".join(p.for_its_gpu for p in rail_problems if gpu.bdf in p.gpus)
            warning += " (the node's notes say how to fix it)" if warning else ""
            pairings.append(NicPairing(gpu.bdf, (), None, note, warning=warning))
            continue
        relation, names = best[gpu.bdf]
        turn = shares.get(tuple(names), 0)
        shares[tuple(names)] = turn + 1
        ordered = tuple(names[turn % len(names) :] + names[: turn % len(names)])
        notes = []
        over_c2c = gpu.bdf in c2c_gpus and relation in (Relation.PHB, Relation.NODE)
        if over_c2c:
            notes.append(C2C_NOTE.format(gpu=gpu.bdf, relation=relation.name))
        # A NIC at PHB or farther without C2C: said once for all such GPUs (far_nic_notes).
        also = _also_near(inventory, gpu, storage, relation)
        if also:
            own_rate = next((n.rate_gbps for n in rdma if n.name == ordered[0]), None) or 0.0
            slower = all(
                (n.rate_gbps or 0.0) < own_rate
                for n in storage
                if inventory.relation(gpu, n.pci) <= max(relation, GPUDIRECT_REACH)
            )
            why = (
                f"slower than its compute NIC {ordered[0]}, so NCCL keeps the collectives on "
                f"{ordered[0]}"
                if slower
                else f"storage ports beside its compute NIC {ordered[0]} (not its rail: see "
                "the NIC roles note); NCCL_IB_HCA keeps the collectives off them"
            )
            notes.append(f"GPU {gpu.bdf} is also near {', '.join(also)}: {why}")
        own = [problem for problem in rail_problems if gpu.bdf in problem.gpus]
        warning = "; ".join(problem.for_its_gpu for problem in own)
        if any(problem.down for problem in own):
            warning += f": NCCL sends its traffic over {ordered[0]} ({relation.name})"
        if warning:
            warning += " (the node's notes say how to fix it)"
        pairings.append(
            NicPairing(gpu.bdf, ordered, relation.name, "; ".join(notes), also, warning, over_c2c)
        )
    return pairings


def far_nic_notes(pairings: list[NicPairing]) -> list[str]:
    """One note per PCIe relation (PHB, NODE, SYS) at which GPUs' nearest RDMA NIC sits,
    naming each GPU and its NIC: NCCL uses GPUDirect RDMA only up to PXB by default
    (NCCL docs: NCCL_NET_GDR_LEVEL), so those GPUs' traffic is staged through host
    memory. A GPU on NVLink-C2C has its own note (C2C_NOTE): NCCL's P2C path."""
    far: dict[str, list[str]] = {}
    for pairing in pairings:
        if pairing.nics and not pairing.over_c2c and pairing.relation in ("PHB", "NODE", "SYS"):
            far.setdefault(pairing.relation, []).append(f"{pairing.gpu} ({pairing.nics[0]})")
    return [
        f"the nearest RDMA NIC of GPU {', '.join(gpus)} is {relation} from it: NCCL does not "
        "use GPUDirect RDMA that far by default (NCCL_NET_GDR_LEVEL)"
        for relation, gpus in far.items()
    ]
