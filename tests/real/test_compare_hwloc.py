"""tools/compare_hwloc.py: its parsers of hwloc's two formats on literal strings (these
run everywhere), then the tool and `nodecheck check` over the real captures (these skip
without them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CLEAN_ENVIRON
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
    # complete_cpuset less cpuset: the CPUs hwloc was not allowed.
    assert view.hidden == {6, 7, *range(32, 40)}


def test_numa_status() -> None:
    assert parse_numa_status("Node:      255\nStatus:    online\n") == 255
    assert parse_numa_status("Node:      -1\n") is None
    assert parse_numa_status("garbage") is None


def ours(**changes: object) -> NodecheckView:
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
    view = HwlocView(
        2, 8, frozenset(range(8)), {0: frozenset({0, 1, 2, 3}), 1: frozenset({4, 5, 6, 7})}
    )
    for key, value in changes.items():
        setattr(view, key, value)
    return view


def test_compare_agrees_and_differs() -> None:
    assert compare(ours(), theirs()).verdict == "agree"
    split = compare(ours(), theirs(numa={0: frozenset({0, 1}), 1: frozenset(range(2, 8))}))
    assert split.verdict == "differ"
    assert "node 0: nodecheck CPUs 0-3, hwloc 0-1" in split.differences
    assert compare(ours(), theirs(cores=4)).differences == ["cores: nodecheck 8, hwloc 4"]
    unread = compare(ours(problems=["cpu5/topology/core_id: binary content"]), theirs())
    assert unread.differences == ["nodecheck could not read: cpu5/topology/core_id: binary content"]


def test_compare_by_design_cases() -> None:
    """Each by-design case is recognised from the data, with its reason."""
    cpuset = compare(
        ours(),
        theirs(
            pus=frozenset({0, 1}),
            cores=2,
            packages=1,
            numa={0: frozenset({0, 1})},
            hidden=frozenset(range(2, 8)),
        ),
    )
    assert cpuset.verdict == "differ by design", cpuset
    assert cpuset.by_design[0].startswith("hwloc shows the cpuset 0-1 of the 8 online CPUs 0-7")
    gpu = compare(
        ours(numa={**ours().numa, 255: frozenset()}, gpu_nodes={255: "0004:04:00.0"}),
        theirs(),
    )
    assert gpu.by_design == ["hwloc hides node 255, the memory of NVIDIA GPU 0004:04:00.0"]
    conflict = compare(ours(), theirs(packages=1, pus_outside_packages=frozenset(range(4, 8))))
    assert conflict.verdict == "differ by design"
    assert conflict.by_design[0].startswith("hwloc leaves out 1 package(s)")
    offline = compare(
        ours(unlisted_nodes=frozenset({0})),
        theirs(numa={1: frozenset(range(4, 8))}, pus_outside_numa=frozenset(range(4))),
    )
    assert offline.verdict == "differ by design"
    assert offline.by_design[0].startswith("node 0 is offline (no directory)")
    in_none = compare(
        ours(),
        theirs(
            numa={0: frozenset({0, 1}), 1: frozenset(range(4, 8))},
            pus_outside_numa=frozenset({2, 3}),
        ),
    )
    assert in_none.verdict == "differ by design"
    assert "puts CPUs 2-3 in no node" in in_none.by_design[0]
    # The same hidden CPUs without hwloc saying it hid them is a difference.
    unexplained = compare(ours(), theirs(pus=frozenset({0, 1}), cores=2, packages=1))
    assert unexplained.verdict == "differ"


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
    # The cpuset captures are by design, for the reason the data gives.
    assert "16em64t-4s2ca2c-cpusetreorder: hwloc shows the cpuset 2-11,13 of the 16" in summary
    assert "Traceback" not in done.stderr


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
