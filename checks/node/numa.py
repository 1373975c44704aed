"""NUMA nodes from `<sysfs>/devices/system/node` (Documentation/ABI/stable/sysfs-devices-node)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodecheck.checks.node.cpulist import cpu_id_bound, parse_cpulist
from nodecheck.checks.node.fs import NodeFS, ReadError, list_dir, read_parsed


def parse_node_meminfo(text: str) -> int:
    """MemTotal in bytes from a node's meminfo ("Node 0 MemTotal:  3631308 kB")."""
    match = re.search(r"^Node \d+ MemTotal:\s+(\d+) kB$", text, re.MULTILINE)
    if not match:
        raise ValueError("no MemTotal line")
    return int(match.group(1)) * 1024


@dataclass(frozen=True)
class NumaNode:
    number: int
    cpus: frozenset[int]
    memory_bytes: int | None
    problem: str | None = None


def read_numa_nodes(fs: NodeFS) -> list[NumaNode]:
    """Every node directory; [] when the kernel has no NUMA support."""
    base = fs.sys("devices", "system", "node")
    bound = cpu_id_bound(fs)
    nodes = []
    for entry in list_dir(base):
        match = re.fullmatch(r"node(\d+)", entry)
        if not match:
            continue
        number = int(match.group(1))
        try:
            cpus = read_parsed(
                base / entry / "cpulist", lambda text: parse_cpulist(text, bound), "a CPU list"
            )
            memory = read_parsed(base / entry / "meminfo", parse_node_meminfo, "a MemTotal line")
        except ReadError as err:
            nodes.append(NumaNode(number, frozenset(), None, str(err)))
            continue
        nodes.append(NumaNode(number, cpus, memory))
    return sorted(nodes, key=lambda node: node.number)
