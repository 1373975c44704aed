"""The initiators of each NUMA node's memory (accessN/initiators), read as hwloc reads them,
on literal trees shaped as the kernel writes them (Documentation/ABI/stable/
sysfs-devices-node): CPU-only nodes, memory-only nodes, a generic initiator's node."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.numa import (
    memory_nodes_served,
    parse_initiator_entries,
    read_numa,
    served_cpus,
)


def node(base: Path, number: int, cpus: str, kib: int) -> Path:
    directory = base / f"node{number}"
    directory.mkdir(parents=True)
    (directory / "cpulist").write_text(cpus + "\n")
    (directory / "meminfo").write_text(f"Node {number} MemTotal:       {kib} kB\n")
    return directory


def access(directory: Path, cls: int, initiators: list[int], bandwidth: int = 0) -> None:
    folder = directory / f"access{cls}" / "initiators"
    folder.mkdir(parents=True)
    (directory / f"access{cls}" / "targets").mkdir()
    for number in initiators:
        (folder / f"node{number}").symlink_to(f"../../../node{number}")
    (folder / "read_bandwidth").write_text(f"{bandwidth}\n")
    (folder / "read_latency").write_text("0\n")


@pytest.fixture
def tree(tmp_path: Path) -> tuple[NodeFS, Path]:
    """CPU-only node 0 (CPUs 0-3), a generic initiator's node 1 (no CPU, no memory),
    memory-only node 2 whose fastest initiator is the generic one (access0) but whose
    fastest CPUs are node 0's (access1)."""
    base = tmp_path / "sys" / "devices" / "system" / "node"
    node(base, 0, "0-3", 0)
    node(base, 1, "", 0)
    memory = node(base, 2, "", 1048576)
    access(memory, 0, [1], 200000)
    access(memory, 1, [0], 100000)
    (base / "has_memory").write_text("2\n")
    (base / "has_cpu").write_text("0\n")
    (base / "has_generic_initiator").write_text("1\n")
    cpu = tmp_path / "sys" / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-3\n")
    return NodeFS(tmp_path / "sys", tmp_path / "proc", tmp_path), base


def test_initiator_entries() -> None:
    entries = ["node0", "node12", "read_bandwidth", "read_latency", "nodes", "write_latency"]
    assert parse_initiator_entries(entries) == {0, 12}
    assert parse_initiator_entries([]) == frozenset()


def test_access1_is_read_before_access0(tree: tuple[NodeFS, Path]) -> None:
    """hwloc prefers the CPU initiators (access1) to a closer generic initiator (access0)."""
    fs, _ = tree
    nodes = read_numa(fs).nodes
    memory = nodes[2]
    assert memory.initiators == frozenset({0}) and memory.access_class == 1
    assert (memory.read_bandwidth, memory.read_latency) == (100000, None)  # 0: not given
    assert memory.memory_only and not memory.cpu_only
    assert nodes[0].cpu_only and nodes[0].has_memory is False and nodes[0].has_cpu is True
    assert served_cpus(nodes, memory) == frozenset({0, 1, 2, 3})
    assert [n.number for n in memory_nodes_served(nodes, 0)] == [2]
    assert memory_nodes_served(nodes, 1) == []


def test_access0_without_access1(tree: tuple[NodeFS, Path]) -> None:
    """A kernel before 5.10 has only access0: its initiators, the generic one included."""
    fs, base = tree
    for link in (base / "node2" / "access1" / "initiators").iterdir():
        link.unlink()
    (base / "node2" / "access1" / "initiators").rmdir()
    memory = read_numa(fs).nodes[2]
    assert memory.initiators == frozenset({1})
    assert (memory.access_class, memory.read_bandwidth) == (0, 200000)
    # The generic initiator has no CPU: the memory serves none that are known.
    assert served_cpus(read_numa(fs).nodes, memory) == frozenset()


def test_no_access_directory_is_unknown(tree: tuple[NodeFS, Path]) -> None:
    """Without HMAT (or before Linux 5.2) nothing names the initiators: None, never a
    guess, and no memory is said to serve node 0."""
    fs, base = tree
    for cls in (0, 1):
        folder = base / "node2" / f"access{cls}"
        for link in (folder / "initiators").iterdir():
            link.unlink()
        (folder / "initiators").rmdir()
        (folder / "targets").rmdir()
        folder.rmdir()
    nodes = read_numa(fs).nodes
    assert nodes[2].initiators is None and nodes[2].access_class is None
    assert served_cpus(nodes, nodes[2]) is None
    assert memory_nodes_served(nodes, 0) == []


def test_an_unlistable_access_directory_is_a_problem(tree: tuple[NodeFS, Path]) -> None:
    fs, base = tree
    folder = base / "node2" / "access1"
    for link in (folder / "initiators").iterdir():
        link.unlink()
    (folder / "initiators").rmdir()
    (folder / "initiators").write_text("")  # a file where the directory should be
    memory = read_numa(fs).nodes[2]
    assert memory.problem is not None and "not a directory" in memory.problem
    assert memory.initiators is None
