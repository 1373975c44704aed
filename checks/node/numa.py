"""NUMA nodes from `<sysfs>/devices/system/node` (Documentation/ABI/stable/sysfs-devices-node).

The kernel puts every online CPU in exactly one node. What a tree shows can say less, and
the reading takes what the kernel means, with a note:

- no `devices/system/node` (a kernel built without CONFIG_NUMA): one node 0 with every
  online CPU and the memory of `/proc/meminfo`;
- a node's `cpulist` (and `cpumap`) name its possible CPUs, offline ones included
  (drivers/base/node.c prints cpumask_of_node): only online CPUs are kept;
- kernels before 2.6.2x have only the hexadecimal `cpumap`;
- an online CPU in no node's list (its node is offline, or has no directory) is placed
  by its `cpuN/nodeM` link (drivers/base/cpu.c, register_cpu_under_node).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

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
    read_optional_parsed,
    read_parsed,
)


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


@dataclass(frozen=True)
class NumaNode:
    """One node: its online CPUs, its memory, why it could not be read, what was inferred."""

    number: int
    cpus: frozenset[int]
    memory_bytes: int | None
    problem: str | None = None
    notes: tuple[str, ...] = ()
    # False for a node that the CPUs' `nodeM` links name but that has no directory (an
    # offline node: its memory is not there).
    listed: bool = True


@dataclass
class NumaReading:
    nodes: list[NumaNode]
    # What was inferred for the node as a whole (no node directory, CPUs in no node).
    notes: list[str] = field(default_factory=list)


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


@dataclass
class _ListedNode:
    number: int
    listed: frozenset[int]  # the online CPUs its list names
    memory: int | None
    problem: str | None
    notes: list[str] = field(default_factory=list)
    cpus: set[int] = field(default_factory=set)


def _home_of_unlisted(
    fs: NodeFS, cpu: int, nodes: list[_ListedNode], packages: Mapping[int, int]
) -> tuple[int, str]:
    """The node of an online CPU that no node lists, and why: its cpuN/nodeM link, else
    the lowest node holding CPUs of its package, else the lowest node."""
    linked = _linked_node(fs, cpu)
    if linked is not None:
        return linked, f"placed by their cpuN/node{linked} links"
    package = packages.get(cpu)
    for node in nodes:
        if package is not None and any(packages.get(c) == package for c in node.listed):
            return node.number, "no nodeM link: placed with the other CPUs of their package"
    return nodes[0].number, "no nodeM link: counted in the lowest node"


def read_numa(
    fs: NodeFS, online: frozenset[int] | None = None, packages: Mapping[int, int] | None = None
) -> NumaReading:
    """The NUMA nodes, each holding only `online` CPUs (every CPU its list names when
    None), every online CPU in exactly one node; `packages` (CPU -> package) places a CPU
    no node lists. ReadError when the node directory cannot be listed."""
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
        try:
            cpus = _node_cpus(fs, entry, bound)
            node.memory = read_parsed(
                base / entry / "meminfo", parse_node_meminfo, "a MemTotal line"
            )
        except ReadError as err:
            node.problem = str(err)
            cpus = frozenset()
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
    unlisted: dict[int, set[int]] = {}
    reasons: dict[tuple[int, str], set[int]] = {}
    for cpu in sorted((online or frozenset()) - holders.keys()):
        home, why = _home_of_unlisted(fs, cpu, listed, packages or {})
        reasons.setdefault((home, why), set()).add(cpu)
        if home in by_number:
            by_number[home].cpus.add(cpu)
        else:
            unlisted.setdefault(home, set()).add(cpu)
    for (home, why), placed in reasons.items():
        if home in by_number:
            by_number[home].notes.append(f"CPUs {format_cpulist(placed)} in no node's list: {why}")
    result = [
        NumaNode(n.number, frozenset(n.cpus), n.memory, n.problem, tuple(n.notes)) for n in listed
    ]
    for number, linked in sorted(unlisted.items()):
        note = (
            f"node {number} has no directory in devices/system/node (offline): its CPUs "
            f"{format_cpulist(linked)} are known from their cpuN/node{number} links"
        )
        result.append(NumaNode(number, frozenset(linked), None, None, (note,), listed=False))
        reading.notes.append(note)
    reading.nodes = sorted(result, key=lambda node: node.number)
    return reading


def read_numa_nodes(fs: NodeFS, online: frozenset[int] | None = None) -> list[NumaNode]:
    """The nodes of read_numa."""
    return read_numa(fs, online).nodes
