"""NUMA nodes from `<sysfs>/devices/system/node` (Documentation/ABI/stable/sysfs-devices-node).

The kernel puts every online CPU in one node. What a tree shows can say less, and the
reading takes what the kernel means, with a note, and invents nothing:

- no `devices/system/node` (a kernel built without CONFIG_NUMA): one node 0 with every
  online CPU and the memory of `/proc/meminfo`;
- a node's `cpulist` (and `cpumap`) prints cpumask_of_node (drivers/base/node.c), which
  on some architectures (powerpc) keeps offline CPUs: only online CPUs are kept;
- kernels before 2.6.2x have only the hexadecimal `cpumap`;
- a node whose `cpulist` reads but whose `meminfo` does not keeps its CPUs, and the
  problem is recorded;
- an online CPU in no node's list is placed only by its `cpuN/nodeM` link
  (drivers/base/node.c, register_cpu_under_node). A link to a node without a directory
  contradicts sysfs (only registered nodes get links): the node is kept as `listed=False`
  with what `has_memory`/`has_cpu` say of it. A CPU with neither list nor link is in no
  node (`NumaReading.cpus_without_node`), as the kernel and hwloc show it.

Memory-only and CPU-only nodes: firmware with an ACPI HMAT describes memory (HBM, CXL,
persistent memory, a GPU's coherent memory) as nodes without CPUs, and may put CPUs in
nodes without memory (MemTotal 0, left out of `has_memory`). The kernel names, for each
memory node, the initiator nodes with the best performance to it:
`nodeY/accessX/initiators/nodeN` links, and their read and write bandwidth and latency
(Documentation/ABI/stable/sysfs-devices-node, Documentation/admin-guide/mm/numaperf.rst).
Access class 0 counts any initiator, generic initiators (an accelerator's node, listed
in `has_generic_initiator`) included; access class 1 (Linux 5.10) counts CPUs only.
hwloc reads access1 where the node has it and access0 otherwise, and gives a memory-only
node the CPUs of those initiators (hwloc/topology-linux.c, read_node_initiators);
`read_numa` reads them the same way. A node without either directory (a kernel before
5.2, firmware without HMAT) has initiators None: unknown, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import field
from pathlib import Path

from nodecheck.checks.node.cpulist import (
    cpu_id_bound,
    format_cpulist,
    parse_cpulist,
    parse_cpumask,
)
from nodecheck.checks.node.fs import (
    NodeFS,
    ReadError,
    list_dir,
    parse_attr,
    read_optional_parsed,
    read_optional_text,
    read_parsed,
)
from nodecheck.checks.record import record


def parse_node_meminfo(text: str) -> int:
    """MemTotal in bytes from a node's meminfo ("Node 0 MemTotal:  3631308 kB")."""
    match = re.search(r"^Node \d+ MemTotal:\s+(\d+) kB$", text, re.MULTILINE)
    if not match:
        raise ValueError("no MemTotal line")
    return int(match.group(1)) * 1024


def parse_meminfo_total(text: str) -> int:
    """MemTotal in bytes from /proc/meminfo ("MemTotal:       16315988 kB")."""
    match = re.search(r"^MemTotal:\s+(\d+) kB$", text, re.MULTILINE)
    if not match:
        raise ValueError("no MemTotal line")
    return int(match.group(1)) * 1024


def parse_meminfo_available(text: str) -> int:
    """MemAvailable in bytes from /proc/meminfo ("MemAvailable:    9301232 kB"): what the
    kernel estimates can be allocated without swapping (Documentation/filesystems/proc.rst)."""
    match = re.search(r"^MemAvailable:\s+(\d+) kB$", text, re.MULTILINE)
    if not match:
        raise ValueError("no MemAvailable line")
    return int(match.group(1)) * 1024


def read_memory_available(fs: NodeFS) -> int | None:
    """MemAvailable of the node in bytes; None where it cannot be read."""
    try:
        return read_parsed(fs.proc("meminfo"), parse_meminfo_available, "a MemAvailable line")
    except ReadError:
        return None


@record
class NumaNode:
    """One node: its online CPUs, its memory, why it could not be read, what was inferred."""

    number: int
    cpus: frozenset[int]
    memory_bytes: int | None
    problem: str | None = None
    notes: tuple[str, ...] = ()
    # False for a node that the CPUs' `nodeM` links name but that has no directory.
    listed: bool = True
    # Whether devices/system/node/has_memory and has_cpu name the node (None: no such
    # file): for a node without a directory the only word on it; for the others, what
    # tells a CPU-only node where its MemTotal could not be read.
    has_memory: bool | None = None
    has_cpu: bool | None = None
    # The initiator nodes of its memory (accessN/initiators/nodeM links, the node itself
    # included where it is one), the access class they were read from (1: CPUs only,
    # where the kernel has it; else 0), and the read bandwidth (MB/s) and read latency
    # (ns) the kernel gives for access from them. None: no access class directory.
    initiators: frozenset[int] | None = None
    access_class: int | None = None
    read_bandwidth: int | None = None
    read_latency: int | None = None

    @property
    def holds_memory(self) -> bool | None:
        """Whether memory can be allocated on it: its MemTotal, else `has_memory`; None
        where neither was read."""
        if self.memory_bytes is not None:
            return self.memory_bytes > 0
        return self.has_memory

    @property
    def memory_only(self) -> bool:
        """Memory and no CPU (HBM, CXL, persistent or GPU memory onlined as a node)."""
        return not self.cpus and bool(self.holds_memory)

    @property
    def cpu_only(self) -> bool:
        """CPUs and, as read, no memory: never a target for memory binding."""
        return bool(self.cpus) and self.holds_memory is False


def served_cpus(nodes: list[NumaNode], node: NumaNode) -> frozenset[int] | None:
    """The CPUs a node's memory is nearest to: its own and those of its initiator nodes
    (as hwloc gives a node the cpusets of its initiators); None for a node without CPUs
    whose initiators are unknown."""
    if node.initiators is None:
        return node.cpus or None
    by_number = {other.number: other for other in nodes}
    cpus = set(node.cpus)
    for number in node.initiators:
        if number in by_number:
            cpus |= by_number[number].cpus
    return frozenset(cpus)


def memory_nodes_served(nodes: list[NumaNode], number: int) -> list[NumaNode]:
    """The other nodes with memory that name node `number` among their initiators: the
    memory its CPUs are nearest to, in node order."""
    return [
        node
        for node in nodes
        if node.number != number
        and node.holds_memory
        and node.initiators is not None
        and number in node.initiators
    ]


@record
class Initiators:
    """What one node's access class directory says (see NumaNode)."""

    nodes: frozenset[int] | None = None
    access_class: int | None = None
    read_bandwidth: int | None = None
    read_latency: int | None = None


def parse_initiator_entries(entries: list[str]) -> frozenset[int]:
    """The node numbers of an `accessX/initiators` directory's entries: its `nodeN`
    links, beside the read_/write_ bandwidth and latency files."""
    return frozenset(int(m.group(1)) for e in entries if (m := re.fullmatch(r"node(\d+)", e)))


def _performance(path: Path) -> int | None:
    """An accessX/initiators performance attribute; None when absent, unreadable or 0
    (the kernel writes 0 where firmware gave none: drivers/base/node.c)."""
    try:
        value = read_optional_parsed(path, int, "a number")
    except ReadError:
        return None
    return value or None


def read_initiators(fs: NodeFS, entry: str) -> Initiators:
    """A node's initiators: from access1 where the node has it, else access0, as hwloc
    reads them (hwloc/topology-linux.c, read_node_initiators). Initiators() where neither
    exists; ReadError when the directory exists but cannot be listed."""
    base = fs.sys("devices", "system", "node", entry)
    present = set(list_dir(base))
    for access in (1, 0):
        if f"access{access}" not in present:
            continue
        if "initiators" not in list_dir(base / f"access{access}"):
            continue
        folder = base / f"access{access}" / "initiators"
        entries = list_dir(folder)
        return Initiators(
            parse_initiator_entries(entries),
            access,
            _performance(folder / "read_bandwidth") if "read_bandwidth" in entries else None,
            _performance(folder / "read_latency") if "read_latency" in entries else None,
        )
    return Initiators()


@record(frozen=False)
class NumaReading:
    nodes: list[NumaNode]
    # What was inferred for the node as a whole (no node directory, CPUs in no node).
    notes: list[str] = field(default_factory=list)
    # Online CPUs that no node lists and no cpuN/nodeM link places: in no node.
    cpus_without_node: frozenset[int] = frozenset()


def _node_cpus(fs: NodeFS, entry: str, bound: int) -> frozenset[int]:
    base = fs.sys("devices", "system", "node", entry)
    cpus = read_optional_parsed(
        base / "cpulist", lambda text: parse_cpulist(text, bound), "a CPU list"
    )
    if cpus is None:
        # Kernels before 2.6.2x print only the mask.
        cpus = read_optional_parsed(
            base / "cpumap", lambda text: parse_cpumask(text, bound), "a CPU mask"
        )
    if cpus is None:
        raise ReadError(base / "cpulist", "missing (and no cpumap)")
    return cpus


def _linked_node(fs: NodeFS, cpu: int) -> int | None:
    """The node of `cpuN/nodeM`, None without one (or with several)."""
    try:
        entries = list_dir(fs.sys("devices", "system", "cpu", f"cpu{cpu}"))
    except ReadError:
        return None
    nodes = [int(m.group(1)) for e in entries if (m := re.fullmatch(r"node(\d+)", e))]
    return nodes[0] if len(nodes) == 1 else None


def _single_node(fs: NodeFS, online: frozenset[int]) -> NumaReading:
    path = fs.proc("meminfo")
    note = (
        "the kernel has no devices/system/node (built without CONFIG_NUMA): one node 0 "
        "with every online CPU and the memory of /proc/meminfo"
    )
    try:
        memory = read_parsed(path, parse_meminfo_total, "a MemTotal line")
    except ReadError as err:
        return NumaReading([NumaNode(0, online, None, str(err))], [note])
    return NumaReading([NumaNode(0, online, memory)], [note])


@record(frozen=False)
class _ListedNode:
    number: int
    listed: frozenset[int]  # the online CPUs its list names
    memory: int | None
    problem: str | None
    notes: list[str] = field(default_factory=list)
    cpus: set[int] = field(default_factory=set)
    list_problem: str = ""  # why its cpulist (and cpumap) could not be read
    initiators: Initiators = field(default_factory=Initiators)


def _node_state(fs: NodeFS, name: str) -> frozenset[int] | None:
    """A node state list (`has_memory`, `has_cpu`: Documentation/ABI/stable/
    sysfs-devices-node), None when missing or unreadable."""
    try:
        return read_optional_parsed(
            fs.sys("devices", "system", "node", name), parse_cpulist, "a node list"
        )
    except ReadError:
        return None


def read_numa(fs: NodeFS, online: frozenset[int] | None = None) -> NumaReading:
    """The NUMA nodes, each holding only `online` CPUs (every CPU its list names when
    None), every online CPU in at most one node. ReadError when the node directory cannot
    be listed."""
    base = fs.sys("devices", "system", "node")
    bound = cpu_id_bound(fs)
    entries = [(int(m.group(1)), e) for e in list_dir(base) if (m := re.fullmatch(r"node(\d+)", e))]
    if not entries:
        # One node needs CPUs to hold: a tree whose CPUs could not be read says nothing.
        return _single_node(fs, online) if online else NumaReading([])
    reading = NumaReading([])
    listed: list[_ListedNode] = []
    for number, entry in sorted(entries):
        node = _ListedNode(number, frozenset(), None, None)
        # The CPU list and the memory are read apart: one unreadable file keeps the other.
        try:
            cpus = _node_cpus(fs, entry, bound)
        except ReadError as err:
            node.problem = node.list_problem = str(err)
            cpus = frozenset()
        try:
            node.memory = read_parsed(
                base / entry / "meminfo", parse_node_meminfo, "a MemTotal line"
            )
        except ReadError as err:
            node.problem = "; ".join(filter(None, (node.problem, str(err))))
        try:
            node.initiators = read_initiators(fs, entry)
        except ReadError as err:
            node.problem = "; ".join(filter(None, (node.problem, str(err))))
        if online is not None and cpus - online:
            node.notes.append(f"offline CPUs {format_cpulist(cpus - online)} left out")
            cpus &= online
        node.listed = cpus
        listed.append(node)
    # The kernel lists each CPU in one node; lists that overlap (nested nodes in a made-up
    # tree) leave each CPU in the smallest list that holds it, its nearest memory.
    holders: dict[int, list[_ListedNode]] = {}
    for node in listed:
        for cpu in node.listed:
            holders.setdefault(cpu, []).append(node)
    for cpu, nodes in holders.items():
        min(nodes, key=lambda n: (len(n.listed), n.number)).cpus.add(cpu)
    for node in listed:
        shared = node.listed - node.cpus
        if shared:
            node.notes.append(
                f"CPUs {format_cpulist(shared)} of its list are also listed by a node with "
                "fewer CPUs: counted there"
            )
    by_number = {node.number: node for node in listed}
    linked_elsewhere: dict[int, set[int]] = {}
    linked_home: dict[int, set[int]] = {}
    without_node: set[int] = set()
    for cpu in sorted((online or frozenset()) - holders.keys()):
        home = _linked_node(fs, cpu)
        if home is None:
            without_node.add(cpu)
        elif home in by_number:
            by_number[home].cpus.add(cpu)
            linked_home.setdefault(home, set()).add(cpu)
        else:
            linked_elsewhere.setdefault(home, set()).add(cpu)
    # One note per node for the CPUs its links placed: an unreadable cpulist leaves every
    # CPU of the node to its link, and saying so once, with why, is what the user needs.
    for number, linked in sorted(linked_home.items()):
        node = by_number[number]
        if len(linked) == 1:
            [cpu] = linked
            placed = f"CPU {cpu} is in no node's list: placed by its cpu{cpu}/node{number} link"
        else:
            placed = (
                f"CPUs {format_cpulist(linked)} are in no node's list: placed by their "
                f"cpuN/node{number} links"
            )
        if node.list_problem:
            placed = f"its CPU list could not be read ({node.list_problem}); {placed}"
        node.notes.append(placed)
    has_memory, has_cpu = _node_state(fs, "has_memory"), _node_state(fs, "has_cpu")
    result = [
        NumaNode(
            n.number,
            frozenset(n.cpus),
            n.memory,
            n.problem,
            tuple(n.notes),
            has_memory=None if has_memory is None else n.number in has_memory,
            has_cpu=None if has_cpu is None else n.number in has_cpu,
            initiators=n.initiators.nodes,
            access_class=n.initiators.access_class,
            read_bandwidth=n.initiators.read_bandwidth,
            read_latency=n.initiators.read_latency,
        )
        for n in listed
    ]
    for number, linked in sorted(linked_elsewhere.items()):
        note = (
            f"CPUs {format_cpulist(linked)} link to node {number} (cpuN/node{number}) but "
            f"devices/system/node has no node{number}: sysfs contradicts itself, since the "
            "kernel links CPUs only under registered nodes (drivers/base/node.c, "
            "register_cpu_under_node)"
        )
        result.append(
            NumaNode(
                number,
                frozenset(linked),
                None,
                None,
                (note,),
                listed=False,
                has_memory=None if has_memory is None else number in has_memory,
                has_cpu=None if has_cpu is None else number in has_cpu,
            )
        )
        reading.notes.append(note)
    if without_node:
        reading.notes.append(
            f"CPUs {format_cpulist(without_node)} are online but in no node's list and have "
            "no cpuN/nodeM link: in no node"
        )
    reading.cpus_without_node = frozenset(without_node)
    reading.nodes = sorted(result, key=lambda node: node.number)
    return reading


def read_numa_nodes(fs: NodeFS, online: frozenset[int] | None = None) -> list[NumaNode]:
    """The nodes of read_numa."""
    return read_numa(fs, online).nodes


@record
class NumaBalancing:
    """kernel.numa_balancing as read from `path` (<procfs>/sys/kernel/numa_balancing).

    `mode` is the sysctl's value (0 off; 1 normal, 2 memory tiering, 3 both:
    Documentation/admin-guide/sysctl/kernel.rst, numa_balancing). When it is None,
    either `absent` is True (a kernel built without CONFIG_NUMA_BALANCING has no such
    sysctl: kernel/sched/fair.c registers it with the feature) or `problem` says why it
    could not be read or made no sense, naming the path.
    """

    path: Path
    mode: int | None = None
    absent: bool = False
    problem: str | None = None


def read_numa_balancing(fs: NodeFS) -> NumaBalancing:
    """kernel.numa_balancing: its mode, its absence, or why it could not be read."""
    path = fs.proc("sys", "kernel", "numa_balancing")
    try:
        text = read_optional_text(path)
    except ReadError as err:
        return NumaBalancing(path, problem=f"cannot read {err}")
    if text is None:
        return NumaBalancing(path, absent=True)
    try:
        return NumaBalancing(path, mode=parse_attr(path, text, int, "a number"))
    except ReadError as err:
        return NumaBalancing(path, problem=str(err))
