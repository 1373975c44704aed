"""Compare nodecheck's reading of hwloc's Linux captures with hwloc's own.

    python -m tools.compare_hwloc DIR [--unpacked-into FOLDER]

DIR holds the captures of open-mpi/hwloc's `tests/hwloc/linux/` (NAME.tar.bz2 and
NAME.test, whose `target:` names hwloc's expected reading, NAME.console or NAME.xml).
Each capture is unpacked (into a temporary folder unless --unpacked-into names one,
where an unpacked capture is reused), read with nodecheck's `read_inventory`, and its
packages, cores, PUs and each NUMA node's CPUs are printed beside hwloc's, with
"agree" or the differences. Each core's and package's PUs are compared, and every CPU
nodecheck reports must be in one of its nodes. Some differences are hwloc's by design,
each said with its reason computed from the data: hwloc shows only the CPUs and nodes
the capturing process was allowed (the capture's own cpuset, as nodecheck reads it, and
its cpuset.mems), hides the memory nodes of NVIDIA GPUs, shows CPUs of an offline node in
no node, gives a CPU-less node without initiators the CPUs of its locality (from the
distances, or the nesting of nodes), and leaves out objects whose CPU sets conflict.

A node's CPUs are hwloc's: its own and those of the initiators of its memory
(`accessN/initiators`, as checks.node.numa reads them and hwloc/topology-linux.c's
read_node_initiators does), so a memory-only node (HBM, CXL, persistent memory) shows the
CPUs it serves. hwloc has no NUMANode without memory: a node without memory (CPU-only,
or a generic initiator's) whose CPUs memory nodes serve is left out of nodecheck's side
too, each of its CPUs still counted in it for the check that every CPU is in one node.

A capture without hwloc's expected reading is "not compared" (it is still read, to catch
a crash). The last line sums up; the exit status is 0 only when nothing differs but
those.

hwloc's formats (hwloc's own documentation, "Exporting Topologies to XML" and lstopo's
console output):

- console: one object per line, indented two spaces per level ("Package L#0 (P#0 ...)",
  "Core L#1 (P#1)", "PU L#2 (P#2)": P# is the OS index). A NUMANode is a memory child
  of the object it is printed under: its CPUs are that object's PUs. "N processors not
  represented in topology: 0x..." names the CPUs hwloc was not allowed to use.
- XML: `<object type="PU" os_index="2" cpuset="0x00000004" ...>`; a cpuset is
  comma-separated 32-bit hexadecimal words, most significant first. The Machine's
  `complete_cpuset` holds the CPUs left out of its `cpuset`. hwloc 1.x says Socket for
  Package.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from nodecheck.checks.node.cgroup import (
    CpusetReading,
    parse_proc_cgroup,
    parse_proc_cpuset,
    read_cpuset,
)
from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.checks.node.fs import NodeFS, ReadError, list_dir, read_optional_text, read_text
from nodecheck.checks.node.inventory import Inventory, read_inventory
from nodecheck.checks.node.numa import NumaNode, served_cpus
from tools.hwloc_captures import Capture, list_captures, unpack


@dataclass
class HwlocView:
    """What hwloc's expected reading shows."""

    packages: int
    cores: int | None  # None: no Core objects (hwloc puts the PUs directly)
    pus: frozenset[int]
    numa: dict[int, frozenset[int]]  # node os_index -> the CPUs hwloc gives it
    hidden: frozenset[int] = frozenset()  # CPUs hwloc says it was not allowed to use
    pus_outside_packages: frozenset[int] = frozenset()
    pus_outside_numa: frozenset[int] = frozenset()
    package_sets: tuple[frozenset[int], ...] = ()  # each Package's PUs
    core_sets: tuple[frozenset[int], ...] = ()  # each Core's PUs


def parse_hwloc_bitmap(text: str) -> frozenset[int]:
    """hwloc's bitmap string ("0x00000f0f,0x00000001"): 32-bit hexadecimal words, most
    significant first. An infinite set ("0xf...f,...") is a ValueError."""
    text = text.strip()
    if not text:
        raise ValueError("an empty bitmap")
    if "..." in text:
        raise ValueError(f"an infinite bitmap: {text!r}")
    value = 0
    for word in text.split(","):
        digits = word.strip().removeprefix("0x").removeprefix("0X")
        if not re.fullmatch(r"[0-9a-fA-F]{1,8}", digits):
            raise ValueError(f"not a 32-bit hexadecimal word: {word!r}")
        value = (value << 32) | int(digits, 16)
    return frozenset(bit for bit in range(value.bit_length()) if value >> bit & 1)


# "  NUMANode(HBM) L#3 (P#4 local=512MiB ...)": indent, type, (subtype), logical index,
# attributes. Groups print their depth ("Group0"); OS devices a bracketed kind.
_CONSOLE_LINE = re.compile(
    r"^( *)([A-Za-z][A-Za-z0-9]*)(?:\[[^\]]*\])?(?:\([^)]*\))?(?: L#\d+)?(?: \((.*)\))?"
)
_MEMORY_KINDS = ("NUMANode", "MemCache")
_OS_INDEX = re.compile(r"(?:^| )P#(\d+)")
_HIDDEN = re.compile(r"^\d+ processors not represented in topology: (\S+)")


@dataclass
class _Object:
    kind: str
    os_index: int | None
    children: list[_Object] = field(default_factory=list)

    def pus(self) -> Iterator[int]:
        for child in self.children:
            if child.kind == "PU" and child.os_index is not None:
                yield child.os_index
            yield from child.pus()


def _view(root: _Object, hidden: frozenset[int]) -> HwlocView:
    packages = cores = 0
    pus: set[int] = set()
    in_package: set[int] = set()
    package_sets: list[frozenset[int]] = []
    core_sets: list[frozenset[int]] = []
    numa: dict[int, frozenset[int]] = {}

    def walk(obj: _Object, holder: _Object) -> None:
        """`holder`: the nearest object above that is not memory (a NUMANode, or a
        memory-side cache: MemCache): a memory child has its CPUs."""
        nonlocal packages, cores
        if obj.kind in ("Package", "Socket"):
            packages += 1
            package_sets.append(frozenset(obj.pus()))
            in_package.update(package_sets[-1])
        elif obj.kind == "Core":
            cores += 1
            core_sets.append(frozenset(obj.pus()))
        elif obj.kind == "PU" and obj.os_index is not None:
            pus.add(obj.os_index)
        if obj.kind not in _MEMORY_KINDS:
            holder = obj
        for child in obj.children:
            if child.kind == "NUMANode" and child.os_index is not None:
                numa[child.os_index] = frozenset(holder.pus())
            walk(child, holder)

    walk(root, root)
    in_numa = frozenset().union(*numa.values()) if numa else frozenset()
    return HwlocView(
        packages,
        cores or None,
        frozenset(pus),
        numa,
        hidden,
        frozenset(pus - in_package) if packages else frozenset(),
        frozenset(pus) - in_numa,
        tuple(package_sets),
        tuple(core_sets),
    )


def parse_console(text: str) -> HwlocView:
    """lstopo's console form: the tree (until the "depth" summary) and the hidden CPUs."""
    root = _Object("root", None)
    stack: list[tuple[int, _Object]] = [(-1, root)]
    hidden: frozenset[int] = frozenset()
    in_tree = True
    for line in text.splitlines():
        if not line.strip():
            continue
        found = _HIDDEN.match(line)
        if found:
            hidden = parse_hwloc_bitmap(found.group(1))
            continue
        if line.startswith(("depth ", "Special depth", "Topology", "Relative")):
            in_tree = False
        if not in_tree:
            continue
        match = _CONSOLE_LINE.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        index = _OS_INDEX.search(match.group(3) or "")
        kind = re.sub(r"^Group\d+$", "Group", match.group(2))
        obj = _Object(kind, int(index.group(1)) if index else None)
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(obj)
        stack.append((indent, obj))
    if not root.children:
        raise ValueError("no object tree in the console output")
    return _view(root, hidden)


def parse_xml(text: str) -> HwlocView:
    """hwloc's XML export: PUs by os_index, each NUMANode's cpuset, the Machine's
    complete_cpuset less its cpuset as the hidden CPUs."""
    document = ElementTree.fromstring(text)
    machine = document.find("object")
    if machine is None:
        raise ValueError("no object in the XML")

    def convert(element: ElementTree.Element) -> _Object:
        index = element.get("os_index")
        obj = _Object(element.get("type", ""), int(index) if index is not None else None)
        obj.children = [convert(child) for child in element.findall("object")]
        return obj

    view = _view(convert(machine), frozenset())
    # The XML says each node's cpuset itself (hwloc 1.x nests the objects under their
    # NUMANode instead of hanging the node beside them).
    for element in machine.iter("object"):
        index, cpuset = element.get("os_index"), element.get("cpuset")
        if element.get("type") == "NUMANode" and index is not None and cpuset:
            view.numa[int(index)] = parse_hwloc_bitmap(cpuset)
    in_numa = frozenset().union(*view.numa.values()) if view.numa else frozenset()
    view.pus_outside_numa = view.pus - in_numa
    complete, allowed = machine.get("complete_cpuset"), machine.get("cpuset")
    if complete and allowed:
        view.hidden = parse_hwloc_bitmap(complete) - parse_hwloc_bitmap(allowed)
    return view


def parse_expected(path: Path) -> HwlocView:
    text = path.read_text(errors="replace")
    return parse_xml(text) if path.suffix == ".xml" else parse_console(text)


def parse_numa_status(text: str) -> int | None:
    """The node of a GPU's coherent memory from /proc/driver/nvidia/gpus/BDF/numa_status
    ("Node: 255", "Status: online"), None when it has none (the NVIDIA driver prints
    -1, or no Node line)."""
    found = re.search(r"^Node:\s+(-?\d+)\s*$", text, re.MULTILINE)
    if not found or int(found.group(1)) < 0:
        return None
    return int(found.group(1))


def gpu_memory_nodes(fs: NodeFS) -> dict[int, str]:
    """NUMA node -> the NVIDIA GPU whose memory it is (POWER9 with NVLink V100s, Grace
    Hopper: the driver onlines GPU memory as a CPU-less node)."""
    folder = fs.proc("driver", "nvidia", "gpus")
    nodes: dict[int, str] = {}
    try:
        entries = list_dir(folder)
    except ReadError:
        return nodes
    for bdf in entries:
        try:
            node = parse_numa_status(read_text(folder / bdf / "numa_status"))
        except ReadError:
            continue
        if node is not None:
            nodes[node] = bdf
    return nodes


@dataclass
class NodecheckView:
    packages: dict[int, frozenset[int]]  # package -> its CPUs
    cores: list[frozenset[int]]
    pus: frozenset[int]
    numa: dict[int, frozenset[int]]  # node -> its CPUs and those its memory serves
    unlisted_nodes: frozenset[int]  # nodes known only from the CPUs' nodeM links
    gpu_nodes: dict[int, str]  # NUMA node -> the NVIDIA GPU whose memory it is
    notes: list[str]
    problems: list[str] = field(default_factory=list)  # what nodecheck could not read
    # The capture's own cpuset (checks.node.cgroup.read_cpuset) and its cpuset.mems:
    # None where the capture has none (nothing restricted the capturing process).
    cpuset: frozenset[int] | None = None
    cpuset_mems: frozenset[int] | None = None
    cpuset_source: str = ""
    # The cpuset is its hierarchy's root ("/" in /proc/self/cgroup or /proc/self/cpuset):
    # the kernel keeps every online CPU in it, so it restricts nothing.
    cpuset_is_root: bool = False
    # Each node's own CPUs (the node each CPU is in), CPU-only nodes included; empty:
    # those of `numa`.
    homes: dict[int, frozenset[int]] = field(default_factory=dict)
    # Nodes without CPUs whose initiators the kernel does not name (no accessN
    # directory, or an empty initiators list).
    without_initiators: frozenset[int] = frozenset()

    @classmethod
    def of(cls, inventory: Inventory, fs: NodeFS) -> NodecheckView:
        packages: dict[int, set[int]] = {}
        for cpu in inventory.cpu.cpus.values():
            packages.setdefault(cpu.package, set()).add(cpu.number)
        gpu_nodes = gpu_memory_nodes(fs)
        notes = list(inventory.cpu.notes) + list(inventory.numa_notes)
        notes += [
            f"node {node.number}: {note}"
            for node in inventory.numa_nodes
            if node.listed
            for note in node.notes
        ]
        problems = [*inventory.cpu.problems.values()]
        problems += [node.problem for node in inventory.numa_nodes if node.problem]
        cpuset = read_cpuset(fs)
        nodes = inventory.numa_nodes
        numa = {node.number: served_cpus(nodes, node) or frozenset() for node in nodes}
        for node in nodes:
            if _served_elsewhere(nodes, node, numa):
                del numa[node.number]
                held = f"CPUs {format_cpulist(node.cpus)}" if node.cpus else "no CPU"
                notes.append(
                    f"node {node.number} holds {held} and no memory: no NUMANode in hwloc's "
                    "view, its CPUs are those of the memory nodes that name it an initiator"
                )
        return cls(
            {number: frozenset(cpus) for number, cpus in packages.items()},
            inventory.cpu.cores,
            frozenset(inventory.cpu.cpus),
            numa,
            frozenset(node.number for node in nodes if not node.listed),
            gpu_nodes,
            sorted(set(notes)),
            problems,
            cpuset.cpus,
            cpuset_mems(cpuset),
            cpuset.source,
            cpuset_cgroup(fs) == "/",
            {node.number: node.cpus for node in nodes},
            frozenset(n.number for n in nodes if not n.cpus and not n.initiators),
        )

    def restricted(self, allowed: frozenset[int], nodes: set[int]) -> NodecheckView:
        """The view of a process allowed only the CPUs `allowed` and the memory of
        `nodes`, as hwloc shows it: a package stays while it holds either."""
        memory_cpus = frozenset().union(*(self.numa.get(n, frozenset()) for n in nodes))
        return NodecheckView(
            {
                n: cpus & allowed
                for n, cpus in self.packages.items()
                if cpus & (allowed | memory_cpus)
            },
            [core & allowed for core in self.cores if core & allowed],
            self.pus & allowed,
            {n: cpus & allowed for n, cpus in self.numa.items()},
            self.unlisted_nodes,
            self.gpu_nodes,
            self.notes,
            self.problems,
            self.cpuset,
            self.cpuset_mems,
            self.cpuset_source,
            self.cpuset_is_root,
            {n: cpus & allowed for n, cpus in self.homes.items()},
            self.without_initiators,
        )


def _served_elsewhere(
    nodes: list[NumaNode], node: NumaNode, numa: dict[int, frozenset[int]]
) -> bool:
    """A node without memory as read (CPU-only, or a generic initiator's) each of whose
    CPUs a memory node serves: hwloc shows its CPUs there, and no NUMANode for it."""
    if node.holds_memory is not False:
        return False
    memory = [numa[n.number] for n in nodes if n.number != node.number and n.holds_memory]
    return bool(memory) and node.cpus <= frozenset().union(*memory)


def cpuset_cgroup(fs: NodeFS) -> str | None:
    """The cpuset cgroup the capturing process was in: /proc/self/cgroup's cpuset (v1) or
    unified (v2) line, else /proc/self/cpuset; None where neither says."""
    try:
        memberships = parse_proc_cgroup(read_optional_text(fs.proc("self", "cgroup")) or "")
        cpuset_text = read_optional_text(fs.proc("self", "cpuset")) or ""
    except ReadError:
        return None
    for controller in ("cpuset", ""):
        if controller in memberships:
            return memberships[controller]
    return parse_proc_cpuset(cpuset_text)


def cpuset_mems(cpuset: CpusetReading) -> frozenset[int] | None:
    """The memory nodes of the cpuset (checks.node.cgroup reads them beside its CPUs);
    None when there is none or it says nothing."""
    return cpuset.mems or None


@dataclass
class Comparison:
    rows: list[tuple[str, str, str]]
    differences: list[str]
    by_design: list[str]

    @property
    def verdict(self) -> str:
        if self.differences:
            return "differ"
        return "differ by design" if self.by_design else "agree"


def _cpus(cpus: frozenset[int]) -> str:
    return f"{len(cpus)} ({format_cpulist(cpus)})" if cpus else "none"


def _sets(sets: Sequence[frozenset[int]]) -> str:
    return " ".join(sorted((format_cpulist(cpus) or "none" for cpus in sets), key=len)[:4])


def _set_difference(what: str, ours: list[frozenset[int]], theirs: list[frozenset[int]]) -> str:
    """Counts where they differ, else the first sets each has that the other lacks."""
    if len(ours) != len(theirs):
        return f"{what}: nodecheck {len(ours)}, hwloc {len(theirs)}"
    only_ours = [cpus for cpus in ours if cpus not in theirs]
    only_theirs = [cpus for cpus in theirs if cpus not in ours]
    return (
        f"{what}: {len(ours)} each, but their PUs differ: nodecheck {_sets(only_ours)}, "
        f"hwloc {_sets(only_theirs)}"
    )


def _cpuset_reason(ours: NodecheckView, hwloc: HwlocView) -> tuple[str, set[int]] | None:
    """Why hwloc shows fewer CPUs, from the capture's own cpuset: only when hwloc's PUs
    are exactly nodecheck's CPUs inside it. The reason, and the nodes outside its mems."""
    allowed = ours.cpuset
    if allowed is None or not ours.pus - allowed or hwloc.pus != ours.pus & allowed:
        return None
    if ours.cpuset_is_root:
        # The root cpuset holds every online CPU (Documentation/admin-guide/cgroup-v1/
        # cpusets.rst): nodecheck's CPUs outside it are not online, a misreading.
        return None
    reason = (
        f"hwloc shows the cpuset {format_cpulist(hwloc.pus)} of the {len(ours.pus)} "
        f"online CPUs {format_cpulist(ours.pus)} (the capture's cpuset, "
        f"{Path(ours.cpuset_source).name})"
    )
    hidden_nodes = set()
    if ours.cpuset_mems is not None:
        hidden_nodes = set(ours.numa) - ours.cpuset_mems
    if hidden_nodes:
        reason += (
            f" and not the nodes {format_cpulist(hidden_nodes)} outside its mems "
            f"{format_cpulist(ours.cpuset_mems or ())}"
        )
    return reason, hidden_nodes


def _locality_of_cpuless(number: int, theirs: frozenset[int], view: NodecheckView) -> str | None:
    """Why hwloc gives a node nodecheck reads without CPUs the CPUs `theirs`: hwloc
    attaches a CPU-less (memory) node to an object, its locality, and the node's cpuset
    is that object's. Said only when `theirs` is exactly the CPUs of whole nodecheck
    nodes, of a package, or of the machine, each of them in a nodecheck node."""
    with_cpus = {n: cpus for n, cpus in (view.homes or view.numa).items() if cpus and n != number}
    if not theirs <= frozenset().union(*with_cpus.values()):
        return None  # a locality's CPUs are in nodes of their own
    # Where the kernel names no initiator, hwloc takes the locality from the distances
    # (hwloc/topology-linux.c, fixup_cpuless_node_locality_from_distances).
    why = " and no initiator named by the kernel" if number in view.without_initiators else ""
    inside = [n for n, cpus in with_cpus.items() if cpus <= theirs]
    union = frozenset().union(*(with_cpus[n] for n in inside)) if inside else frozenset()
    if inside and union == theirs:
        return (
            f"node {number} has no CPU (memory only){why}; hwloc gives it the CPUs "
            f"{format_cpulist(theirs)} of node(s) {format_cpulist(inside)}, its locality"
        )
    for package, cpus in sorted(view.packages.items()):
        if cpus == theirs:
            return (
                f"node {number} has no CPU (memory only){why}; hwloc gives it the CPUs "
                f"{format_cpulist(theirs)} of package {package}, its locality"
            )
    if theirs == view.pus:
        return (
            f"node {number} has no CPU (memory only){why}; hwloc gives it every CPU "
            "(the machine is its locality)"
        )
    return None


def compare(ours: NodecheckView, hwloc: HwlocView) -> Comparison:
    by_design: list[str] = []
    differences: list[str] = []
    view = ours
    hidden_nodes: set[int] = set()
    cpuset = _cpuset_reason(ours, hwloc)
    if cpuset is not None:
        reason, hidden_nodes = cpuset
        by_design.append(reason)
        allowed = ours.cpuset or frozenset()
        view = ours.restricted(allowed, set(ours.numa) - hidden_nodes)
    hwloc_cores = hwloc.cores if hwloc.cores is not None else len(hwloc.pus)
    rows = [
        ("packages", str(len(view.packages)), str(hwloc.packages)),
        (
            "cores",
            str(len(view.cores)),
            str(hwloc_cores) + ("" if hwloc.cores is not None else " (no Core objects: PUs)"),
        ),
        ("PUs", _cpus(view.pus), _cpus(hwloc.pus)),
    ]
    differences += [f"nodecheck could not read: {problem}" for problem in ours.problems]
    if view.pus != hwloc.pus:
        differences.append(f"PUs: nodecheck {_cpus(view.pus)}, hwloc {_cpus(hwloc.pus)}")
    # Packages and cores by their PUs, not only by count.
    our_packages = sorted(view.packages.values(), key=sorted)
    their_packages = sorted(hwloc.package_sets, key=sorted)
    if our_packages != their_packages:
        dropped = [cpus for cpus in our_packages if cpus and cpus <= hwloc.pus_outside_packages]
        kept = [cpus for cpus in our_packages if cpus not in dropped]
        dropped_cpus = frozenset().union(*dropped) if dropped else frozenset()
        if dropped and dropped_cpus == hwloc.pus_outside_packages and kept == their_packages:
            by_design.append(
                f"hwloc leaves out {len(dropped)} package(s) whose CPU set conflicts with "
                f"others: their CPUs {format_cpulist(dropped_cpus)} are exactly those hwloc "
                "puts under no package; the other packages agree"
            )
        else:
            differences.append(_set_difference("packages", our_packages, their_packages))
    their_cores = (
        sorted(hwloc.core_sets, key=sorted)
        if hwloc.cores is not None
        else [frozenset({pu}) for pu in sorted(hwloc.pus)]
    )
    our_cores = sorted(view.cores, key=sorted)
    if our_cores != their_cores:
        differences.append(_set_difference("cores", our_cores, their_cores))
    in_hwloc_nodes: dict[int, set[int]] = {}
    for number, cpus in hwloc.numa.items():
        for cpu in cpus:
            in_hwloc_nodes.setdefault(cpu, set()).add(number)
    # Every CPU nodecheck reports is in exactly one of its nodes, or in none where hwloc
    # puts it in none too.
    our_nodes: dict[int, list[int]] = {}
    for number, cpus in (view.homes or view.numa).items():
        for cpu in cpus:
            our_nodes.setdefault(cpu, []).append(number)
    in_several = frozenset(cpu for cpu, nodes in our_nodes.items() if len(nodes) > 1)
    in_none = view.pus - our_nodes.keys()
    if in_several:
        differences.append(f"CPUs {format_cpulist(in_several)} are in several nodecheck nodes")
    if in_none or hwloc.pus_outside_numa:
        rows.append(
            (
                "no node",
                format_cpulist(in_none) or "-",
                format_cpulist(hwloc.pus_outside_numa) or "-",
            )
        )
    if in_none - hwloc.pus_outside_numa:
        differences.append(
            f"CPUs {format_cpulist(in_none - hwloc.pus_outside_numa)} are in no nodecheck node "
            "but in a node of hwloc's"
        )
    our_node = {cpu: nodes[0] for cpu, nodes in our_nodes.items()}
    nested = [n for n, cpus in hwloc.numa.items() if any(len(in_hwloc_nodes[c]) > 1 for c in cpus)]
    # hwloc may nest nodes (a node's cpuset is its locality) and leave CPUs in none; the
    # difference is by design when each CPU's node is one hwloc puts it in, or it has none.
    nesting_explains = (bool(nested) or bool(hwloc.pus_outside_numa)) and all(
        our_node.get(cpu)
        in in_hwloc_nodes.get(cpu, {our_node.get(cpu)} if cpu in hwloc.pus_outside_numa else set())
        for cpu in view.pus
    )
    for number in sorted(set(view.numa) | set(hwloc.numa)):
        ours_cpus, theirs = view.numa.get(number), hwloc.numa.get(number)
        rows.append(
            (
                f"node {number}",
                "absent" if ours_cpus is None else format_cpulist(ours_cpus) or "no CPU",
                "absent" if theirs is None else format_cpulist(theirs) or "no CPU",
            )
        )
        if ours_cpus is None:
            differences.append(f"node {number}: hwloc shows it, nodecheck does not")
        elif theirs is None:
            if number in hidden_nodes:
                continue  # outside the cpuset's mems: said with the cpuset
            if not ours_cpus and number in ours.gpu_nodes:
                by_design.append(
                    f"hwloc hides node {number}, the memory of NVIDIA GPU {ours.gpu_nodes[number]}"
                )
            elif number in ours.unlisted_nodes and ours_cpus <= hwloc.pus_outside_numa:
                by_design.append(
                    f"node {number} has no directory though CPUs link to it (a sysfs "
                    f"contradiction): hwloc shows its CPUs {format_cpulist(ours_cpus)} in no "
                    f"node, nodecheck in node {number} by their cpuN/node{number} links"
                )
            else:
                differences.append(f"node {number}: nodecheck shows it, hwloc does not")
        elif not ours_cpus and theirs:
            locality = _locality_of_cpuless(number, theirs, view)
            if locality is not None:
                by_design.append(locality)
            else:
                differences.append(
                    f"node {number}: nodecheck no CPU, hwloc {format_cpulist(theirs)}"
                )
        # Nesting explains a node's own CPUs, never what its initiators name.
        elif ours_cpus != theirs and nesting_explains and (view.homes or view.numa).get(number):
            by_design.append(
                f"node {number}: nodecheck CPUs {format_cpulist(ours_cpus)}, hwloc "
                f"{format_cpulist(theirs) or 'none'}: hwloc nests nodes "
                f"{format_cpulist(nested) or 'none'} and puts CPUs "
                f"{format_cpulist(hwloc.pus_outside_numa) or 'none'} in no node; nodecheck "
                "counts each CPU in one node, the smallest whose list holds it"
            )
        elif ours_cpus != theirs:
            differences.append(
                f"node {number}: nodecheck CPUs {format_cpulist(ours_cpus)}, "
                f"hwloc {format_cpulist(theirs) or 'none'}"
            )
    return Comparison(rows, differences, by_design)


@dataclass
class CaptureResult:
    name: str
    verdict: str
    lines: list[str]
    reasons: list[str]


def compare_capture(capture: Capture, into: Path) -> CaptureResult:
    target = capture.target if capture.description.is_file() else None
    if target is None or not target.is_file():
        # Nothing to compare with, but nodecheck still reads it: a crash is a finding.
        root = unpack(capture, into)
        fs = NodeFS(root / "sys", root / "proc", root)
        inventory = read_inventory(fs)
        reason = (
            f"hwloc gives no expected topology for {capture.name} (no target in its .test); "
            f"nodecheck read {len(inventory.cpu.cpus)} CPU(s), {len(inventory.numa_nodes)} "
            "node(s) without a crash"
        )
        return CaptureResult(capture.name, "not compared", [f"  {reason}"], [reason])
    try:
        hwloc = parse_expected(target)
    except (ValueError, ElementTree.ParseError) as err:
        return CaptureResult(
            capture.name, "differ", [f"  cannot parse {target.name}: {err}"], [str(err)]
        )
    root = unpack(capture, into)
    fs = NodeFS(root / "sys", root / "proc", root)
    ours = NodecheckView.of(read_inventory(fs), fs)
    result = compare(ours, hwloc)
    width = max([len("nodecheck"), *(len(row[1]) for row in result.rows)]) + 2
    lines = [f"  {'':10}{'nodecheck':{width}}hwloc ({target.name})"]
    lines += [f"  {label:10}{ours:{width}}{theirs}" for label, ours, theirs in result.rows]
    lines += [f"  by design: {reason}" for reason in result.by_design]
    lines += [f"  DIFFERS: {difference}" for difference in result.differences]
    lines += [f"  nodecheck noted: {note}" for note in ours.notes]
    return CaptureResult(
        capture.name, result.verdict, lines, result.differences or result.by_design
    )


def summary(results: Sequence[CaptureResult]) -> str:
    agree = sum(1 for r in results if r.verdict == "agree")
    by_design = [r for r in results if r.verdict == "differ by design"]
    not_compared = [r for r in results if r.verdict == "not compared"]
    differ = [r for r in results if r.verdict == "differ"]
    line = f"{len(results)} captures: {agree} agree, {len(by_design)} differ by design"
    if by_design:
        line += " (" + "; ".join(f"{r.name}: {r.reasons[0]}" for r in by_design) + ")"
    line += f", {len(not_compared)} not compared"
    if not_compared:
        line += " (" + "; ".join(f"{r.name}: {r.reasons[0]}" for r in not_compared) + ")"
    line += f", {len(differ)} differ"
    if differ:
        line += " (" + ", ".join(r.name for r in differ) + ")"
    return line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.compare_hwloc", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folder", type=Path, metavar="DIR", help="hwloc's captures")
    parser.add_argument(
        "--unpacked-into",
        type=Path,
        metavar="FOLDER",
        help="unpack there (and reuse what is there) instead of a temporary folder",
    )
    args = parser.parse_args(argv)
    captures = list_captures(args.folder) if args.folder.is_dir() else []
    if not captures:
        print(f"no NAME.tar.bz2 capture in {args.folder}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hwloc-") as temporary:
        into = args.unpacked_into or Path(temporary)
        results = []
        for capture in captures:
            result = compare_capture(capture, into)
            print(f"== {capture.name}: {result.verdict}")
            print("\n".join(result.lines))
            results.append(result)
    print(summary(results))
    return 1 if any(r.verdict == "differ" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
