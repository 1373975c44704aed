"""tools/compare_hwloc.py: its parsers of hwloc's two formats on literal strings (these
run everywhere), then the tool and `nodecheck check` over the real captures (these skip
without them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import CLEAN_ENVIRON
from tests.fixtures.topology_quirks import QUIRKS, write_tree
from tools.compare_hwloc import (
    HwlocView,
    NodecheckView,
    compare,
    parse_console,
    parse_hwloc_bitmap,
    parse_numa_status,
    parse_xml,
)
from tools.hwloc_captures import list_captures

REPOSITORY = Path(__file__).resolve().parents[2]
ONLY = ("--only=numa", "--only=cpu")

# Shaped as lstopo prints (hwloc 2.x): a NUMANode hangs beside the objects whose CPUs
# it has, memory-side caches above it, subtypes in parentheses.
CONSOLE = """\
Machine (P#0 total=64GiB DMIBoardName="S4881 ")
  Package L#0 (P#0 total=32GiB CPUModel="Dual Core AMD Opteron(tm) Processor 865")
    NUMANode(DRAM) L#0 (P#0 local=32GiB total=32GiB)
    L2Cache L#0 (size=1024KiB linesize=64 ways=16)
      Core L#0 (P#0)
        PU L#0 (P#0)
        PU L#1 (P#4)
      Core L#1 (P#1)
        PU L#2 (P#1)
  Package L#1 (P#1 total=32GiB)
    Group0 L#0 (total=32GiB)
      MemCache L#0 (size=16GiB)
        NUMANode L#1 (P#2 local=32GiB total=32GiB)
      Core L#2 (P#0)
        PU L#3 (P#2)
    HostBridge L#0 (buses=0000:[00-07])
      PCI L#0 (busid=0000:00:01.0 id=10de:2330 class=0302(3D))
        OSDev[Memory](SPM) L#0 (Size=1GiB) "dax0.0"
depth 0:           1 Machine (type #0)
 depth 1:          2 Package (type #1)
Special depth -3:  2 NUMANode (type #14)
3 processors not represented in topology: 0x00000068
Topology infos: LinuxCgroup=/prout Backend=Linux
"""

XML = """\
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000003f" complete_cpuset="0x000000ff,0x000000ff">
    <object type="Package" os_index="0" cpuset="0x0000000f">
      <object type="NUMANode" os_index="0" cpuset="0x0000000f" local_memory="1"/>
      <object type="Core" os_index="0" cpuset="0x00000003">
        <object type="PU" os_index="0" cpuset="0x00000001"/>
        <object type="PU" os_index="1" cpuset="0x00000002"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x0000000c">
        <object type="PU" os_index="2" cpuset="0x00000004"/>
        <object type="PU" os_index="3" cpuset="0x00000008"/>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x00000030">
      <object type="NUMANode" os_index="1" cpuset="0x00000030" local_memory="1"/>
      <object type="NUMANode" os_index="7" cpuset="0x00000000,0x00000030" local_memory="1"/>
      <object type="Core" os_index="0" cpuset="0x00000030">
        <object type="PU" os_index="4" cpuset="0x00000010"/>
        <object type="PU" os_index="5" cpuset="0x00000020"/>
      </object>
    </object>
  </object>
</topology>
"""


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0x00000003", {0, 1}),
        ("0x00000f0f", {0, 1, 2, 3, 8, 9, 10, 11}),
        ("0x00000001,0x00000000", {32}),
        ("0x000000ff,0x00000000,0x00000001", {0, *range(64, 72)}),
        ("0x0", set()),
    ],
)
def test_hwloc_bitmap(text: str, cpus: set[int]) -> None:
    assert parse_hwloc_bitmap(text) == cpus


@pytest.mark.parametrize("text", ["", "0xf...f,0x00000001", "0x123456789", "0xzz"])
def test_hwloc_bitmap_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_hwloc_bitmap(text)


def test_console_form() -> None:
    view = parse_console(CONSOLE)
    assert (view.packages, view.cores, set(view.pus)) == (2, 3, {0, 1, 2, 4})
    assert [set(cpus) for cpus in view.package_sets] == [{0, 1, 4}, {2}]
    assert [set(cpus) for cpus in view.core_sets] == [{0, 4}, {1}, {2}]
    # Node 0 has its Package's PUs; node 2, below a memory-side cache, its Group's.
    assert view.numa == {0: {0, 1, 4}, 2: {2}}
    assert view.hidden == {3, 5, 6}
    assert not view.pus_outside_packages and not view.pus_outside_numa


def test_console_without_cores_or_tree() -> None:
    view = parse_console("Machine (P#0)\n  Package L#0 (P#0)\n    PU L#0 (P#0)\n")
    assert view.cores is None and view.pus == {0}
    with pytest.raises(ValueError, match="no object tree"):
        parse_console("depth 0: 1 Machine (type #0)\n")


def test_xml_form() -> None:
    view = parse_xml(XML)
    assert (view.packages, view.cores, set(view.pus)) == (2, 3, {0, 1, 2, 3, 4, 5})
    assert view.numa == {0: {0, 1, 2, 3}, 1: {4, 5}, 7: {4, 5}}
    assert [set(cpus) for cpus in view.package_sets] == [{0, 1, 2, 3}, {4, 5}]
    assert [set(cpus) for cpus in view.core_sets] == [{0, 1}, {2, 3}, {4, 5}]
    # complete_cpuset less cpuset: the CPUs hwloc was not allowed.
    assert view.hidden == {6, 7, *range(32, 40)}


def test_numa_status() -> None:
    assert parse_numa_status("Node:      255\nStatus:    online\n") == 255
    assert parse_numa_status("Node:      -1\n") is None
    assert parse_numa_status("garbage") is None


def ours(**changes: object) -> NodecheckView:
    """nodecheck's view of a two-package, eight-core machine without SMT."""
    view = NodecheckView(
        packages={0: frozenset({0, 1, 2, 3}), 1: frozenset({4, 5, 6, 7})},
        cores=[frozenset({n}) for n in range(8)],
        pus=frozenset(range(8)),
        numa={0: frozenset({0, 1, 2, 3}), 1: frozenset({4, 5, 6, 7})},
        unlisted_nodes=frozenset(),
        gpu_nodes={},
        notes=[],
    )
    for key, value in changes.items():
        setattr(view, key, value)
    return view


def theirs(**changes: object) -> HwlocView:
    """hwloc's view of the same machine."""
    view = HwlocView(
        2,
        8,
        frozenset(range(8)),
        {0: frozenset({0, 1, 2, 3}), 1: frozenset({4, 5, 6, 7})},
        package_sets=(frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7})),
        core_sets=tuple(frozenset({n}) for n in range(8)),
    )
    for key, value in changes.items():
        setattr(view, key, value)
    return view


def test_compare_agrees_and_differs() -> None:
    assert compare(ours(), theirs()).verdict == "agree"
    split = compare(ours(), theirs(numa={0: frozenset({0, 1}), 1: frozenset(range(2, 8))}))
    assert split.verdict == "differ"
    assert "node 0: nodecheck CPUs 0-3, hwloc 0-1" in split.differences
    pairs = tuple(frozenset({n, n + 1}) for n in range(0, 8, 2))
    assert compare(ours(), theirs(cores=4, core_sets=pairs)).differences == [
        "cores: nodecheck 8, hwloc 4"
    ]
    unread = compare(ours(problems=["cpu5/topology/core_id: binary content"]), theirs())
    assert unread.differences == ["nodecheck could not read: cpu5/topology/core_id: binary content"]


def test_cpus_in_no_node_and_empty_nodes_are_differences() -> None:
    """nodecheck loses CPUs 4-7 from every node (node 1 empty): not an agreement."""
    lost = compare(ours(numa={0: frozenset({0, 1, 2, 3}), 1: frozenset()}), theirs())
    assert lost.verdict == "differ"
    assert "CPUs 4-7 are in no nodecheck node but in a node of hwloc's" in lost.differences
    assert "node 1: nodecheck no CPU, hwloc 4-7" in lost.differences
    twice = compare(ours(numa={0: frozenset(range(5)), 1: frozenset({4, 5, 6, 7})}), theirs())
    assert "CPUs 4 are in several nodecheck nodes" in twice.differences
    # CPUs in no node where hwloc has them in none too: no difference for them.
    both = compare(
        ours(numa={0: frozenset({0, 1, 2, 3}), 1: frozenset({4, 5})}),
        theirs(
            numa={0: frozenset({0, 1, 2, 3}), 1: frozenset({4, 5})},
            pus_outside_numa=frozenset({6, 7}),
        ),
    )
    assert both.verdict == "agree", both


def test_cores_and_packages_are_compared_by_their_pus() -> None:
    """The same counts with other groupings differ."""
    pairs = [frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5}), frozenset({6, 7})]
    other_pairs = (frozenset({0, 4}), frozenset({1, 5}), frozenset({2, 6}), frozenset({3, 7}))
    cores = compare(ours(cores=pairs), theirs(cores=4, core_sets=other_pairs))
    assert cores.verdict == "differ"
    assert cores.differences[0].startswith("cores: 4 each, but their PUs differ")
    packages = compare(
        ours(packages={0: frozenset({0, 1, 4, 5}), 1: frozenset({2, 3, 6, 7})}), theirs()
    )
    assert packages.verdict == "differ"
    assert packages.differences[0].startswith("packages: 2 each, but their PUs differ")


def test_compare_by_design_cases() -> None:
    """Each by-design case is recognised from the data, with its reason."""
    restricted = {
        "pus": frozenset({0, 1}),
        "cores": 2,
        "core_sets": (frozenset({0}), frozenset({1})),
        "packages": 1,
        "package_sets": (frozenset({0, 1}),),
        "numa": {0: frozenset({0, 1})},
    }
    cpuset = compare(
        ours(cpuset=frozenset({0, 1}), cpuset_mems=frozenset({0}), cpuset_source="/x/cpus"),
        theirs(**restricted),
    )
    assert cpuset.verdict == "differ by design", cpuset
    assert cpuset.by_design == [
        "hwloc shows the cpuset 0-1 of the 8 online CPUs 0-7 (the capture's cpuset, cpus) "
        "and not the nodes 1 outside its mems 0"
    ]
    gpu = compare(
        ours(numa={**ours().numa, 255: frozenset()}, gpu_nodes={255: "0004:04:00.0"}),
        theirs(),
    )
    assert gpu.by_design == ["hwloc hides node 255, the memory of NVIDIA GPU 0004:04:00.0"]
    conflict = compare(
        ours(),
        theirs(
            packages=1,
            package_sets=(frozenset(range(4)),),
            pus_outside_packages=frozenset(range(4, 8)),
        ),
    )
    assert conflict.verdict == "differ by design", conflict
    assert conflict.by_design[0].startswith("hwloc leaves out 1 package(s)")
    offline = compare(
        ours(unlisted_nodes=frozenset({0})),
        theirs(numa={1: frozenset(range(4, 8))}, pus_outside_numa=frozenset(range(4))),
    )
    assert offline.verdict == "differ by design"
    assert offline.by_design[0].startswith("node 0 has no directory though CPUs link to it")
    in_none = compare(
        ours(),
        theirs(
            numa={0: frozenset({0, 1}), 1: frozenset(range(4, 8))},
            pus_outside_numa=frozenset({2, 3}),
        ),
    )
    assert in_none.verdict == "differ by design"
    assert "puts CPUs 2-3 in no node" in in_none.by_design[0]
    memory = compare(
        ours(numa={**ours().numa, 2: frozenset()}),
        theirs(numa={**theirs().numa, 2: frozenset({4, 5, 6, 7})}),
    )
    assert memory.by_design == [
        "node 2 has no CPU (memory only); hwloc gives it the CPUs 4-7 of node(s) 1, its locality"
    ]
    # Where the kernel names no initiator, hwloc's locality comes from elsewhere: said.
    unnamed = compare(
        ours(numa={**ours().numa, 2: frozenset()}, without_initiators=frozenset({2})),
        theirs(numa={**theirs().numa, 2: frozenset({4, 5, 6, 7})}),
    )
    assert unnamed.by_design == [
        "node 2 has no CPU (memory only) and no initiator named by the kernel; hwloc gives "
        "it the CPUs 4-7 of node(s) 1, its locality"
    ]


def test_memory_nodes_agree_through_their_initiators() -> None:
    """A memory-only node shows the CPUs of its initiators (as hwloc does): the same as
    hwloc's; the CPU-only node without memory is not shown, and each CPU is still in one
    node (its home)."""
    homes = {0: frozenset(range(4)), 1: frozenset(range(4, 8)), 2: frozenset()}
    served = compare(
        ours(numa={**ours().numa, 2: frozenset(range(4, 8))}, homes=homes),
        theirs(numa={**theirs().numa, 2: frozenset(range(4, 8))}),
    )
    assert served.verdict == "agree", served
    # Served CPUs that are not hwloc's are a difference.
    wrong = compare(
        ours(numa={**ours().numa, 2: frozenset(range(4))}, homes=homes),
        theirs(numa={**theirs().numa, 2: frozenset(range(4, 8))}),
    )
    assert wrong.differences == ["node 2: nodecheck CPUs 0-3, hwloc 4-7"]


def test_compare_by_design_reasons_need_their_data() -> None:
    """Each by-design reason, without the data it rests on, is a difference."""
    restricted = {
        "pus": frozenset({0, 1}),
        "cores": 2,
        "core_sets": (frozenset({0}), frozenset({1})),
        "packages": 1,
        "package_sets": (frozenset({0, 1}),),
        "numa": {0: frozenset({0, 1})},
    }
    # hwloc hid CPUs, but the capture has no cpuset: hwloc's "not represented" line
    # (which also holds offline CPUs) is no reason.
    no_cpuset = compare(ours(), theirs(**restricted, hidden=frozenset(range(2, 8))))
    assert no_cpuset.verdict == "differ"
    # A cpuset that allows more than hwloc shows.
    wider = compare(
        ours(cpuset=frozenset({0, 1, 2}), cpuset_source="/x/cpus"), theirs(**restricted)
    )
    assert wider.verdict == "differ"
    # The root cpuset holds every online CPU: CPUs outside it are a misreading
    # (offline-cpu0-node0's cpuset 4-20 is its online CPUs).
    root = compare(
        ours(cpuset=frozenset({0, 1}), cpuset_source="/x/cpus", cpuset_is_root=True),
        theirs(**restricted),
    )
    assert root.verdict == "differ"
    # A node hwloc does not show that the cpuset's mems allow.
    allowed_node = compare(
        ours(cpuset=frozenset({0, 1}), cpuset_mems=frozenset({0, 1}), cpuset_source="/x/cpus"),
        theirs(**restricted),
    )
    assert "node 1: nodecheck shows it, hwloc does not" in allowed_node.differences
    # A CPU-less node hwloc hides that is no GPU's memory.
    hidden = compare(ours(numa={**ours().numa, 255: frozenset()}), theirs())
    assert hidden.differences == ["node 255: nodecheck shows it, hwloc does not"]
    # The dropped package's CPUs are not exactly those under no package.
    conflict = compare(
        ours(),
        theirs(
            packages=1,
            package_sets=(frozenset(range(4)),),
            pus_outside_packages=frozenset(range(4, 7)),
        ),
    )
    assert conflict.verdict == "differ"
    # The kept package's CPUs are not hwloc's.
    kept = compare(
        ours(packages={0: frozenset({0, 1, 2}), 1: frozenset({3, 4, 5, 6, 7})}),
        theirs(
            packages=1,
            package_sets=(frozenset(range(4)),),
            pus_outside_packages=frozenset(range(4, 8)),
        ),
    )
    assert kept.verdict == "differ"
    # An offline node whose CPUs hwloc puts in a node after all.
    offline = compare(ours(unlisted_nodes=frozenset({0})), theirs(numa={1: frozenset(range(8))}))
    assert offline.verdict == "differ"
    # Nesting that does not explain the split: a CPU in a node hwloc does not put it in.
    nesting = compare(
        ours(numa={0: frozenset({0, 1, 2, 4}), 1: frozenset({3, 5, 6, 7})}),
        theirs(
            numa={0: frozenset({0, 1}), 1: frozenset(range(4, 8))},
            pus_outside_numa=frozenset({2, 3}),
        ),
    )
    assert nesting.verdict == "differ"
    # A CPU-less node given CPUs that are no node's, package's or the machine's.
    memory = compare(
        ours(numa={**ours().numa, 2: frozenset()}),
        theirs(numa={**theirs().numa, 2: frozenset({4, 5})}),
    )
    assert memory.differences == ["node 2: nodecheck no CPU, hwloc 4-5"]


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    environ = dict(CLEAN_ENVIRON, PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "tools.compare_hwloc", *args],
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
        env=environ,
        timeout=300,
        check=False,
    )


def unpacked_into(hwloc_captures: dict[str, Path]) -> Path:
    """The folder the session's captures were unpacked into (NAME/... under it)."""
    name, root = next(iter(hwloc_captures.items()))
    while root.name != name:
        root = root.parent
    return root.parent


def test_compare_tool_over_the_real_captures(
    real_data: Path, hwloc_captures: dict[str, Path]
) -> None:
    """Every capture agrees with hwloc, or differs only by design with its reason (the
    tool reuses the session's unpacked captures)."""
    into = unpacked_into(hwloc_captures)
    done = run_tool(str(real_data / "hwloc"), "--unpacked-into", str(into))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    count = len(list_captures(real_data / "hwloc"))
    assert summary.startswith(f"{count} captures: "), summary
    assert summary.endswith(", 0 differ"), summary
    agree = int(summary.split(": ", 1)[1].split(" agree")[0])
    assert agree >= 24, summary
    # Memory-only nodes read with their initiators (access1) agree with hwloc's.
    assert "== fakeheteromemtiers: agree" in done.stdout
    assert "  node 4    2-3        2-3" in done.stdout
    # fakeheterocpunuma's node 2 has no initiators: hwloc places it by other means.
    assert (
        "fakeheterocpunuma: node 2 has no CPU (memory only) and no initiator named by the "
        "kernel; hwloc gives it the CPUs 0-3,8-11 of node(s) 0-1, its locality" in summary
    )
    # GPU memory nodes stay hidden by hwloc, for the reason the data gives.
    assert "nvidiagpunumanodes: hwloc hides node 250, the memory of NVIDIA GPU" in summary
    # The cpuset captures are by design, for the reason the data gives.
    assert (
        "16em64t-4s2ca2c-cpusetreorder: hwloc shows the cpuset 2-11,13 of the 16 online CPUs "
        "0-15 (the capture's cpuset, cpus)" in summary
    )
    # offline-cpu0-node0's hidden CPUs are offline ones, not a cpuset: nothing by cpuset.
    assert "offline-cpu0-node0: hwloc shows the cpuset" not in summary
    assert ", 1 not compared (test1.fsroot: " in summary
    assert "Traceback" not in done.stderr


def test_capture_without_target_is_read_but_not_compared(tmp_path: Path) -> None:
    """A capture whose .test names no expected reading (as test1.fsroot) is its own
    bucket, not "differ by design", and nodecheck still reads it (runs without the real
    data: the capture is a quirk tree of our own)."""
    tree = write_tree(QUIRKS["padded-lists"](), tmp_path / "tree" / "quirk")
    folder = tmp_path / "captures"
    folder.mkdir()
    with tarfile.open(folder / "quirk.tar.bz2", "w:bz2") as archive:
        archive.add(tree, arcname="quirk")
    (folder / "quirk.test").write_text("# no target line\n")
    done = run_tool(str(folder))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "== quirk: not compared" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == (
        "1 captures: 0 agree, 0 differ by design, 1 not compared (quirk: hwloc gives no "
        "expected topology for quirk (no target in its .test); nodecheck read 8 CPU(s), "
        "2 node(s) without a crash), 0 differ"
    )


def test_compare_tool_refuses_a_folder_without_captures(tmp_path: Path) -> None:
    done = run_tool(str(tmp_path))
    assert done.returncode == 2 and "no NAME.tar.bz2 capture" in done.stderr


def test_no_capture_gets_an_error_from_cpu_or_numa(
    hwloc_captures: dict[str, Path], tmp_path: Path
) -> None:
    """`nodecheck check --only numa --only cpu --json` on each capture (one process each):
    a healthy node is never `error`. A capture without proc/ gets an empty one (it has
    none to give); test1.fsroot has no sys/ and is no node."""
    empty_proc = tmp_path / "proc"
    empty_proc.mkdir()
    seen = 0
    failures = []
    for name, root in sorted(hwloc_captures.items()):
        if not (root / "sys").is_dir():
            continue
        proc = root / "proc" if (root / "proc").is_dir() else empty_proc
        roots = [f"--sysfs-root={root / 'sys'}", f"--procfs-root={proc}"]
        done = subprocess.run(
            [sys.executable, "-m", "nodecheck.agent", *roots, "check", *ONLY, "--json"],
            capture_output=True,
            text=True,
            env=dict(CLEAN_ENVIRON, PYTHONPATH=os.environ.get("PYTHONPATH", "")),
            timeout=120,
            check=False,
        )
        seen += 1
        if done.returncode not in (0, 1):
            failures.append(f"{name}: exit {done.returncode} {done.stderr[-500:]}")
            continue
        errors = [r for r in json.loads(done.stdout)["results"] if r["status"] == "error"]
        if errors:
            failures.append(f"{name}: {errors}")
    assert seen >= 30
    assert not failures, "\n".join(failures)
