"""Each class of CPU and NUMA quirk that real captures show, on a small tree of our own
(tests/fixtures/topology_quirks.py): what nodecheck reads, and what `cpu` and `numa` say.

The reading must take what the kernel means and say what it inferred; a healthy node is
never `error`; every online CPU is in at most one NUMA node (those in none are named in
`cpus_without_node`), and only online CPUs are."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nodecheck.checks.node.facts import LiveFacts, NodeSources, Unread, dumps, hostname_shown, loads
from nodecheck.checks.node.inventory import Inventory, read_hostname, read_inventory
from nodecheck.checks.result import Result, Status
from tests.conftest import CLEAN_ENVIRON, Node
from tests.fixtures.topology_quirks import QUIRKS, write_tree


def build(name: str, tmp_path: Path) -> Node:
    return Node(write_tree(QUIRKS[name](), tmp_path / name))


def inventory(node: Node) -> Inventory:
    return read_inventory(node.fs)


def statuses(results: list[Result]) -> set[Status]:
    return {result.status for result in results}


def text(results: list[Result]) -> str:
    return "\n".join(f"{r.status.value} {r.subject} {r.summary} {r.details}" for r in results)


def assert_partition(found: Inventory) -> None:
    """Every online CPU in one NUMA node or in cpus_without_node; nodes hold online CPUs
    only."""
    placed = [cpu for node in found.numa_nodes for cpu in node.cpus]
    placed += found.cpus_without_node
    assert sorted(placed) == sorted(found.cpu.online), found.numa_nodes
    assert set(found.cpu.cpus) <= found.cpu.online


# Trees with a file that cannot be read: `error` is their right verdict.
UNREADABLE = ("broken-siblings-everywhere", "meminfo-unreadable", "unreadable-cpu-online")
HEALTHY = [name for name in QUIRKS if name not in UNREADABLE]


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_quirk_is_never_an_error(name: str, tmp_path: Path) -> None:
    node = build(name, tmp_path)
    results = node.results("cpu", "numa")
    assert Status.ERROR not in statuses(results), text(results)
    assert_partition(inventory(node))


def test_padded_lists(tmp_path: Path) -> None:
    """arm64 on 5.15 ends list files with "\\n\\0": read as the list it is."""
    found = inventory(build("padded-lists", tmp_path))
    assert found.cpu.online == frozenset(range(8))
    assert len(found.cpu.packages) == 2 and len(found.cpu.cores) == 4
    assert [node.cpus for node in found.numa_nodes] == [{0, 1, 4, 5}, {2, 3, 6, 7}]


def test_no_online_file_reads_the_cpu_directories(tmp_path: Path) -> None:
    """No online/possible/present: cpu0 (no online file) and cpu1-2 ("1") are online,
    cpu3 ("0") is not; the note says where the CPUs came from."""
    node = build("no-online-file", tmp_path)
    found = inventory(node)
    assert found.cpu.online == {0, 1, 2}
    assert sorted(found.cpu.cpus) == [0, 1, 2]
    assert any("online missing" in note and "cpuN directories" in note for note in found.cpu.notes)
    [numa0] = found.numa_nodes
    assert numa0.cpus == {0, 1, 2}
    assert any("offline CPUs 3" in note for note in numa0.notes)
    results = node.results("cpu")
    assert any("online missing" in r.summary for r in results if r.status is Status.OK)


def test_no_node_directory_is_one_node_with_every_cpu(tmp_path: Path) -> None:
    node = build("no-node-directory", tmp_path)
    found = inventory(node)
    [only] = found.numa_nodes
    assert (only.number, only.cpus, only.memory_bytes) == (0, frozenset(range(8)), 32 << 30)
    results = node.results("numa")
    assert [r.status for r in results if r.subject == "numa 0"] == []  # nothing wrong with it
    assert any("CONFIG_NUMA" in r.summary for r in results if r.status is Status.OK)


def test_offline_cpus_are_in_no_node(tmp_path: Path) -> None:
    node = build("offline-cpus", tmp_path)
    found = inventory(node)
    assert [node.cpus for node in found.numa_nodes] == [{0, 1, 4, 5}, {2, 6}]
    assert found.numa_nodes[1].notes == ("offline CPUs 3,7 left out",)
    assert sorted(found.cpu.cores, key=min) == [{0, 4}, {1, 5}, {2, 6}]


def test_compute_units_are_cores(tmp_path: Path) -> None:
    """Bulldozer (AMD family 15h): 8 cores of one thread each, not 4 with SMT (hwloc
    counts the same)."""
    node = build("compute-units", tmp_path)
    found = inventory(node)
    assert len(found.cpu.cores) == 8 and found.cpu.threads_per_core == 1
    assert any("compute units" in note for note in found.cpu.notes)
    assert not any("inconsistent core_id" in note for note in found.cpu.notes)
    [smt] = [r for r in node.results("cpu") if r.summary.startswith("SMT")]
    assert "8 cores, 1 thread(s) per core" in smt.summary


def test_distinct_core_id_elsewhere_is_smt_with_a_note(tmp_path: Path) -> None:
    """The same tree on an Intel CPU: 4 cores of two threads, as the sibling masks say,
    and the inconsistent core_id noted once per CPU (not as compute units)."""
    found = inventory(build("inconsistent-core-id", tmp_path))
    assert sorted(found.cpu.cores, key=min) == [{0, 1}, {2, 3}, {4, 5}, {6, 7}]
    assert [n for n in found.cpu.notes if "core_id" in n] == [
        "CPUs of one thread_siblings mask with inconsistent core_id (distinct, missing or -1): "
        "one core, as the mask says (CPUs 0-7)"
    ]


def test_masks_without_ids(tmp_path: Path) -> None:
    """Hex masks only, no core_id, package id -1: two packages by their masks, each CPU
    a core; the notes say both."""
    found = inventory(build("masks-without-ids", tmp_path))
    assert len(found.cpu.packages) == 2
    assert len(found.cpu.cores) == 8
    assert {cpu.package for cpu in found.cpu.cpus.values() if cpu.number < 4} != {
        cpu.package for cpu in found.cpu.cpus.values() if cpu.number >= 4
    }
    assert any("physical_package_id missing or -1" in n for n in found.cpu.notes)
    assert any("nor core_id" in n for n in found.cpu.notes)
    assert [node.cpus for node in found.numa_nodes] == [{0, 1, 2, 3}, {4, 5, 6, 7}]


def test_shared_package_id_with_disjoint_lists(tmp_path: Path) -> None:
    """ia64: the lists say 4 packages, though two ids are shared."""
    found = inventory(build("shared-package-id", tmp_path))
    assert len(found.cpu.packages) == 4
    assert any("shared by CPUs" in note for note in found.cpu.notes)


def test_no_numa_balancing_still_gives_a_verdict(tmp_path: Path) -> None:
    results = build("no-numa-balancing", tmp_path).results("numa")
    [verdict] = [r for r in results if r.subject == "node"]
    assert verdict.status is Status.OK
    assert (
        "; no <procfs>/sys/kernel/numa_balancing: the kernel has no automatic NUMA balancing "
        "(CONFIG_NUMA_BALANCING)" in verdict.summary
    )
    assert str(tmp_path) not in verdict.summary


def test_captured_tree_without_hostname_is_not_named_after_this_machine(tmp_path: Path) -> None:
    node = build("no-hostname", tmp_path)
    assert read_hostname(node.fs) == "unknown"
    done = subprocess.run(
        [sys.executable, "-m", "nodecheck.agent", *node.cli_args, "check", "--only=cpu", "--json"],
        capture_output=True,
        text=True,
        env=dict(CLEAN_ENVIRON, PYTHONPATH=os.environ.get("PYTHONPATH", "")),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["hostname"] == "unknown" != socket.gethostname()
    # A capture records the name as not read, with why, never as the word "unknown".
    capture = LiveFacts(NodeSources(fs=node.fs, environ={}, uid=1000)).capture(["hostname"])
    unread = capture.parts["hostname"]
    assert isinstance(unread, Unread) and "kernel/hostname: missing" in unread.reason
    assert hostname_shown(loads(dumps(capture))) == "unknown"


def test_memory_only_nodes(tmp_path: Path) -> None:
    """A CPU-less node with memory is fine; one with neither too (one line for all)."""
    results = build("memory-only-nodes", tmp_path).results("numa")
    by_subject = {r.subject: r for r in results}
    assert by_subject["numa 2"].status is Status.OK
    assert "memory only" in by_subject["numa 2"].summary
    assert "numa 3" not in by_subject
    [empty] = [r for r in results if "empty NUMA node" in r.summary]
    assert empty.status is Status.OK and "1 empty NUMA node(s) (3)" in empty.summary


def test_grace_empty_nodes_are_one_ok_line(tmp_path: Path) -> None:
    """Grace: six empty nodes (GPU memory partitions) are normal: one OK line, no WARN."""
    results = build("empty-nodes", tmp_path).results("numa")
    assert Status.WARN not in statuses(results), text(results)
    [empty] = [r for r in results if "empty NUMA node" in r.summary]
    assert empty.status is Status.OK
    assert empty.summary.startswith("6 empty NUMA node(s) (2-7)")
    assert empty.details == {"empty_nodes": [2, 3, 4, 5, 6, 7]}


def test_offline_node_holds_its_online_cpus(tmp_path: Path) -> None:
    """Node 0 has no directory: its CPUs go to node 0 by their links, and numa warns."""
    node = build("offline-node", tmp_path)
    found = inventory(node)
    assert [(n.number, set(n.cpus), n.listed) for n in found.numa_nodes] == [
        (0, {0, 1}, False),
        (1, {2, 3}, True),
    ]
    [warning] = [r for r in node.results("numa") if r.subject == "numa 0"]
    assert warning.status is Status.WARN
    assert "sysfs contradicts itself" in warning.summary
    assert "no has_memory/has_cpu file says more" in warning.summary
    assert "remote" not in warning.summary and "DIMM" not in (warning.remedy or "")


def test_offline_node_with_memory_says_what_has_memory_says(tmp_path: Path) -> None:
    """has_memory names node 0 (as in offline-cpu0-node0): the warning says so and does
    not claim the memory is missing."""
    node = build("offline-node-with-memory", tmp_path)
    found = inventory(node)
    [node0] = [n for n in found.numa_nodes if n.number == 0]
    assert (node0.listed, node0.has_memory, node0.has_cpu) == (False, True, False)
    [warning] = [r for r in node.results("numa") if r.subject == "numa 0"]
    assert "has_memory names it; has_cpu does not name it" in warning.summary


def test_hybrid_cores(tmp_path: Path) -> None:
    node = build("hybrid-cores", tmp_path)
    found = inventory(node)
    assert sorted(len(core) for core in found.cpu.cores) == [1, 1, 1, 1, 2, 2]
    assert found.cpu.threads_per_core == 2
    [smt] = [r for r in node.results("cpu") if r.summary.startswith("SMT")]
    assert smt.summary.endswith("6 cores, 1-2 thread(s) per core"), smt.summary


def test_sparse_numbering(tmp_path: Path) -> None:
    found = inventory(build("sparse-numbering", tmp_path))
    assert found.cpu.online == {0, 1, 2, 3, 16, 17, 18, 19}
    assert found.cpu.packages == [0, 8]
    assert [(n.number, set(n.cpus)) for n in found.numa_nodes] == [
        (0, {0, 1, 2, 3}),
        (8, {16, 17, 18, 19}),
    ]


def test_disagreeing_sibling_lists_make_one_core(tmp_path: Path) -> None:
    found = inventory(build("disagreeing-siblings", tmp_path))
    cores = found.cpu.cores
    assert sum(len(core) for core in cores) == 8  # each CPU in exactly one core
    assert found.cpu.cpus[0].siblings == found.cpu.cpus[4].siblings == {0, 4}
    assert any("disagree" in note for note in found.cpu.notes)


def test_gpu_on_a_node_without_online_cpus_is_a_warning(tmp_path: Path) -> None:
    results = build("gpu-on-cpuless-node", tmp_path).results("numa")
    by_subject = {r.subject: r for r in results}
    cpuless = by_subject["gpu 0000:17:00.0"]
    assert cpuless.status is Status.WARN and "has no online CPU" in cpuless.summary
    assert by_subject["gpu 0000:18:00.0"].status is Status.OK


def test_one_broken_file_on_every_cpu_is_one_finding(tmp_path: Path) -> None:
    results = build("broken-siblings-everywhere", tmp_path).results("cpu")
    errors = [r for r in results if r.status is Status.ERROR]
    assert len(errors) == 1, text(results)
    assert "of 8 CPU(s) (cpu0, cpu1, cpu2, cpu3 and 4 more)" in errors[0].summary
    assert "thread_siblings_list" in errors[0].summary


def test_unreadable_governors_are_one_finding_and_spare_the_topology(tmp_path: Path) -> None:
    """scaling_governor a directory on every CPU: the cpu check says so once, with the
    count; the topology (which tune reads) does not depend on it."""
    node = build("padded-lists", tmp_path)
    for governor in (node.root / "sys" / "devices" / "system" / "cpu").glob(
        "cpu*/cpufreq/scaling_governor"
    ):
        governor.unlink()
        governor.mkdir()
    results = node.results("cpu")
    errors = [r for r in results if r.status is Status.ERROR]
    assert len(errors) == 1, text(results)
    assert "cannot read the cpufreq governor of 8 CPU(s) (cpu0, cpu1, cpu2, cpu3 and 4 more)" in (
        errors[0].summary
    )
    found = inventory(node)
    assert not found.cpu.problems and len(found.cpu.cpus) == 8


def test_unreadable_meminfo_keeps_the_cpus(tmp_path: Path) -> None:
    """Node 1's meminfo has no MemTotal: its CPUs stay, the problem is an error."""
    node = build("meminfo-unreadable", tmp_path)
    found = inventory(node)
    node1 = found.numa_nodes[1]
    assert node1.cpus == {2, 3, 6, 7} and node1.memory_bytes is None
    assert node1.problem is not None and "meminfo" in node1.problem
    assert_partition(found)
    [error] = [r for r in node.results("numa") if r.subject == "numa 1"]
    assert error.status is Status.ERROR


def test_cpu_in_no_list_is_placed_by_its_link(tmp_path: Path) -> None:
    found = inventory(build("cpu-linked-not-listed", tmp_path))
    assert [set(n.cpus) for n in found.numa_nodes] == [{0, 1, 2, 4, 5}, {3, 6, 7}]
    assert "CPU 2 is in no node's list: placed by its cpu2/node0 link" in found.numa_nodes[0].notes
    assert not found.cpus_without_node


def test_unreadable_cpulist_is_one_note_naming_its_cpus(tmp_path: Path) -> None:
    """A malformed node0/cpulist leaves each of its CPUs to its cpuN/node0 link: one note
    says so with the CPU list and why, not one identical note per CPU."""
    node = build("padded-lists", tmp_path)
    cpulist = node.root / "sys" / "devices" / "system" / "node" / "node0" / "cpulist"
    cpulist.write_text("0-1,x\n")
    for cpu in (0, 1, 4, 5):  # the links the kernel makes (register_cpu_under_node)
        link = node.root / "sys" / "devices" / "system" / "cpu" / f"cpu{cpu}" / "node0"
        link.symlink_to(cpulist.parent)
    node0 = inventory(node).numa_nodes[0]
    [note] = node0.notes
    assert note.startswith("its CPU list could not be read (")
    assert "expected a CPU list, got '0-1,x'" in note
    assert note.endswith("CPUs 0-1,4-5 are in no node's list: placed by their cpuN/node0 links")
    done = subprocess.run(
        [sys.executable, "-m", "nodecheck.agent", *node.cli_args, "inventory"],
        capture_output=True,
        text=True,
        env={**CLEAN_ENVIRON, **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    placed = [line for line in done.stdout.splitlines() if "placed by" in line]
    assert placed == [f"  note: node 0: {note}"]


def test_cpu_without_list_or_link_is_in_no_node(tmp_path: Path) -> None:
    """No node is invented: CPUs 3 and 7 are in none, and numa warns naming them."""
    node = build("cpu-without-node", tmp_path)
    found = inventory(node)
    assert [set(n.cpus) for n in found.numa_nodes] == [{0, 1, 4, 5}, {2, 6}]
    assert found.cpus_without_node == {3, 7}
    assert set(found.cpu.cpus) == set(range(8))  # still CPUs of the machine
    [warning] = [r for r in node.results("numa") if r.status is Status.WARN]
    assert warning.summary.startswith("online CPUs 3,7 are in no NUMA node")


def test_possible_shorter_than_online_is_noted_not_rejected(tmp_path: Path) -> None:
    node = build("possible-short", tmp_path)
    found = inventory(node)
    assert found.cpu.online == set(range(8)) and len(found.cpu.cores) == 4
    assert [set(n.cpus) for n in found.numa_nodes] == [{0, 1, 4, 5}, {2, 3, 6, 7}]
    assert any("possible reads 0-3 but CPUs 4-7 are online" in n for n in found.cpu.notes)
    assert Status.ERROR not in statuses(node.results("cpu", "numa"))


def test_unreadable_cpu_online_without_online_file_is_a_problem(tmp_path: Path) -> None:
    node = build("unreadable-cpu-online", tmp_path)
    found = inventory(node)
    assert 2 in found.cpu.online
    assert "cpu2 online" in found.cpu.problems
    [error] = [r for r in node.results("cpu") if r.status is Status.ERROR]
    assert "online state" in error.summary and "cpu2" in error.summary


def test_overlapping_package_lists_make_one_package(tmp_path: Path) -> None:
    found = inventory(build("overlapping-package-lists", tmp_path))
    assert found.cpu.packages == [0]
    assert any("package_cpus lists that disagree" in n for n in found.cpu.notes)
    assert not any("disjoint" in n for n in found.cpu.notes)


def test_one_node_vm_is_not_multi_node(tmp_path: Path) -> None:
    """Four one-core sockets on one NUMA node: no balancing or GPU -1 warning."""
    results = build("one-node-vm", tmp_path).results("numa")
    assert Status.WARN not in statuses(results), text(results)
    assert any("automatic NUMA balancing is on" in r.summary for r in results)
