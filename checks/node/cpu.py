"""CPUs, cores, sockets and SMT from `<sysfs>/devices/system/cpu`, and /proc/cpuinfo.

Attributes: Documentation/ABI/stable/sysfs-devices-system-cpu and
Documentation/admin-guide/cputopology.rst.

Real machines' trees say less than those documents, or contradict themselves. The
reading takes what the kernel means, as hwloc's Linux backend does (hwloc/topology-linux.c,
look_sysfscpu, in open-mpi/hwloc), and says what it inferred in `CpuTopology.notes`:

- no `online` file (kernels before 2.6.2x): `present`/`possible` and the cpuN
  directories, each online unless its `cpuN/online` reads 0 (one that cannot be read is
  a problem, counted online);
- an `online` that goes past `possible`: lists are read up to the cpuN directories, and
  the contradiction is noted;
- sibling lists as `_list` files, else as hexadecimal masks;
- a core is the CPUs of one thread siblings list, except that on AMD compute-unit CPUs
  (/proc/cpuinfo: AuthenticAMD, family 15h, Bulldozer to Excavator) CPUs of one list with
  distinct core_id are cores of their own, as hwloc decides once per machine
  (is_amd_with_CU); elsewhere such a list stays one core and the core_id is noted as
  inconsistent; without the list, the CPUs of one package and core_id; without either,
  each CPU;
- a package is the CPUs of one package list (core_siblings), lists that overlap joined,
  numbered by physical_package_id where it has one (not -1) and no other package took it;
- siblings and packages hold online CPUs only, and each CPU is in one core.

An online CPU without a topology directory, or with a file that exists but makes no
sense, is a problem (`error` in the cpu check), never guessed at.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from functools import cache
from pathlib import Path

from nodecheck.checks.node.cpulist import (
    cpu_id_bound,
    format_cpulist,
    parse_cpulist,
    parse_cpumask,
    possible_contradiction,
)
from nodecheck.checks.node.fs import (
    MISSING,
    NodeFS,
    NodePath,
    ReadError,
    list_dir,
    read_optional_parsed,
    read_optional_text,
    read_parsed,
    read_prefix,
)
from nodecheck.checks.record import record


@record
class Cpu:
    """One logical CPU. `siblings` are the hardware threads of its core, itself included
    (online CPUs only)."""

    number: int
    package: int
    core: int
    siblings: frozenset[int]


@record(frozen=False)
class CpuTopology:
    online: frozenset[int]
    cpus: dict[int, Cpu]
    smt_control: str | None  # "on", "off", "forceoff", "notsupported", "notimplemented"
    smt_active: bool | None
    problems: dict[str, str] = field(default_factory=dict)
    # What the reading inferred or found contradictory, in words, each naming its CPUs.
    notes: list[str] = field(default_factory=list)

    @property
    def packages(self) -> list[int]:
        return sorted({cpu.package for cpu in self.cpus.values()})

    @property
    def cores(self) -> list[frozenset[int]]:
        """Physical cores, each as the set of its hardware threads."""
        return sorted({cpu.siblings for cpu in self.cpus.values()}, key=min)

    @property
    def threads_per_core(self) -> int:
        cores = self.cores
        return max((len(core) for core in cores), default=1)

    @property
    def threads_per_core_range(self) -> str:
        """ "2", or "1-2" where cores differ (hybrid CPUs: P-cores with two threads,
        E-cores with one)."""
        counts = {len(core) for core in self.cores} or {1}
        low, high = min(counts), max(counts)
        return str(high) if low == high else f"{low}-{high}"


# The files that name a CPU's hardware threads and its package's CPUs. Linux 5.7 added
# core_cpus and package_cpus beside thread_siblings and core_siblings, which print the
# same (Documentation/admin-guide/cputopology.rst); kernels before 2.6.26 have no `_list`
# files, only the hexadecimal masks. The first that exists is read.
THREAD_FILES = ("thread_siblings_list", "core_cpus_list", "thread_siblings", "core_cpus")
PACKAGE_FILES = ("core_siblings_list", "package_cpus_list", "core_siblings", "package_cpus")


class _Inferences:
    """What was inferred, by what it says, with the CPUs it concerns."""

    def __init__(self) -> None:
        self._cpus: dict[str, set[int]] = {}

    def add(self, what: str, cpu: int) -> None:
        self._cpus.setdefault(what, set()).add(cpu)

    def notes(self) -> list[str]:
        return [f"{what} (CPUs {format_cpulist(cpus)})" for what, cpus in self._cpus.items()]


def _read_online(
    base: Path,
    parse: Callable[[str], frozenset[int]],
    notes: list[str],
    problems: dict[str, str],
) -> frozenset[int] | None:
    """The online CPUs: `online`, else what the kernel means without it.

    Kernels before 2.6.2x have no `online` (nor `present`/`possible`) file; the CPUs then
    are the `cpuN` directories, and one is online unless its `cpuN/online` reads 0 (a CPU
    that cannot be unplugged, often cpu0, has no such file: Documentation/core-api/
    cpu_hotplug.rst). The same reading stands in for an `online` that cannot be read,
    which is also a problem. None when not even that says anything.
    """
    try:
        return read_parsed(base / "online", parse, "a CPU list")
    except ReadError as err:
        if err.reason != MISSING:
            problems["online"] = str(err)
        reason = "missing" if err.reason == MISSING else "unreadable"
    listed = set()
    for entry in list_dir(base):
        match = re.fullmatch(r"cpu(\d+)", entry)
        if match:
            listed.add(int(match.group(1)))
    source = "the cpuN directories"
    candidates = frozenset(listed)
    for name in ("present", "possible"):
        try:
            declared = read_parsed(base / name, parse, "a CPU list")
        except ReadError:
            continue
        candidates = declared & listed if listed else declared
        source = f"{name} and the cpuN directories" if listed else name
        break
    online = set()
    for number in candidates:
        try:
            state = read_optional_text(base / f"cpu{number}" / "online")
        except ReadError as err:
            # Neither file says whether the CPU runs: counted online (its directory is
            # there), and the user hears that the state is unknown.
            problems[f"cpu{number} online"] = str(err)
            state = None
        if state != "0":
            online.add(number)
    if not online:
        return None
    notes.append(
        f"devices/system/cpu/online {reason}: online CPUs {format_cpulist(online)} taken from "
        f"{source}, each online unless its cpuN/online reads 0"
    )
    return frozenset(online)


def _read_id(path: NodePath) -> int | None:
    """A topology id; None when the file is missing or says -1 (the id is unknown: arm64
    before 5.x and some firmware leave physical_package_id at -1)."""
    value = read_optional_parsed(path, int, "an integer")
    return None if value is None or value < 0 else value


@functools.lru_cache(maxsize=512)
def _parse_cpu_set(text: str, is_list: bool, bound: int) -> frozenset[int]:
    """A list or mask, parsed once per distinct text: every CPU of a package prints the
    same package list, so a 224-CPU node has a handful of texts, not 448."""
    return parse_cpulist(text, bound) if is_list else parse_cpumask(text, bound)


def _read_cpu_set(
    topology: NodePath, names: tuple[str, ...], bound: int
) -> tuple[frozenset[int] | None, str | None]:
    """The first of `names` that exists, parsed as a list or a mask, and its name."""
    for name in names:
        parse = functools.partial(_parse_cpu_set, is_list=name.endswith("_list"), bound=bound)
        value = read_optional_parsed(f"{topology}/{name}", parse, "a CPU list or mask")
        if value is not None:
            return value, name
    return None, None


@record
class _RawCpu:
    number: int
    package_id: int | None
    core_id: int | None
    threads: frozenset[int] | None
    package_cpus: frozenset[int] | None


class _SharedId:
    """An id the kernel prints alike for every CPU of one list, read once per list, as
    hwloc's look_sysfscpu does: core_id for the CPUs of one thread siblings list,
    physical_package_id for those of one package list (drivers/base/topology.c; the
    lists are those CPUs by definition, Documentation/admin-guide/cputopology.rst). That
    spares two reads of three per CPU on a machine with hundreds.

    Firmware does not always agree with itself, so the first time a CPU could take an id
    from its list, it reads its own as well; if the two differ, every CPU reads its own
    from then on (`every`, also set from the start where the ids are known to differ:
    AMD compute units), and the inferences about ids that disagree (_cores, _packages)
    see each one as before."""

    def __init__(self, file: str, every: bool = False) -> None:
        self.file = file
        self.every = every
        self._probed = False
        self._by_list: dict[frozenset[int], int | None] = {}

    def read(self, topology: str, number: int, members: frozenset[int] | None) -> int | None:
        shared = members is not None and number in members and not self.every
        if shared and members in self._by_list:
            known = self._by_list[members]
            if self._probed:
                return known
            own = _read_id(f"{topology}/{self.file}")
            self._probed = True
            if own != known:
                self.every = True
            return own
        own = _read_id(f"{topology}/{self.file}")
        if shared:
            self._by_list[members] = own  # type: ignore[index]
        return own


def _read_raw_cpu(
    base: Path,
    number: int,
    bound: int,
    packages_read: dict[int, frozenset[int]],
    ids: tuple[_SharedId, _SharedId],
) -> _RawCpu:
    """One CPU's topology files. `packages_read`: the package lists read so far, by each CPU
    they name; a CPU one of them names is not asked again (the kernel prints one list for
    all the CPUs of a package, drivers/base/topology.c; hwloc's look_sysfscpu skips such
    CPUs too), which spares a read per CPU on a machine with hundreds. Sibling lists are
    read for every CPU: lists that disagree are joined into one core (_cores). `ids`: the
    package and core ids, each read once per list (_SharedId)."""
    # Strings, not Paths: this runs for every CPU (hundreds).
    topology = f"{base}/cpu{number}/topology"
    threads, _ = _read_cpu_set(topology, THREAD_FILES, bound)
    package_cpus = packages_read.get(number)
    if package_cpus is None:
        package_cpus, _ = _read_cpu_set(topology, PACKAGE_FILES, bound)
        if package_cpus is not None and number in package_cpus:
            packages_read.update(dict.fromkeys(package_cpus, package_cpus))
    package_ids, core_ids = ids
    cpu = _RawCpu(
        number,
        package_ids.read(topology, number, package_cpus),
        core_ids.read(topology, number, threads),
        threads,
        package_cpus,
    )
    if cpu == _RawCpu(number, None, None, None, None) and not list_dir(topology):
        # Every kernel that lists a CPU online exports its topology directory
        # (drivers/base/topology.c, added as the CPU comes up): without it
        # nothing tells its threads apart, which the user must hear.
        raise ReadError(topology, "missing (no topology directory)")
    return cpu


def _cores(
    raw: dict[int, _RawCpu], online: frozenset[int], infer: _Inferences, compute_units: bool
) -> dict[int, frozenset[int]]:
    """Each CPU's core, as the set of its hardware threads, as hwloc reads it
    (hwloc/topology-linux.c, look_sysfscpu, in open-mpi/hwloc); `compute_units`: the
    machine's CPUs are AMD compute-unit CPUs (see has_compute_units)."""
    cores: dict[int, frozenset[int]] = {}
    # Without a sibling file the threads of a core share its package and core_id
    # (Documentation/admin-guide/cputopology.rst): grouped by that key in one pass.
    by_core_key: dict[tuple[int | None, frozenset[int] | None, int], set[int]] = {}
    for cpu in raw.values():
        if cpu.threads is None and cpu.core_id is not None:
            key = (cpu.package_id, cpu.package_cpus, cpu.core_id)
            by_core_key.setdefault(key, set()).add(cpu.number)
    for number, cpu in raw.items():
        if cpu.threads is not None:
            threads = (cpu.threads & online) | {number}
            ids = {raw[t].core_id for t in threads if t in raw}
            if len(ids - {None}) > 1 or (None in ids and len(ids) > 1):
                if compute_units and None not in ids:
                    # Threads of one thread_siblings mask with distinct core_id are the
                    # cores of an AMD compute unit (family 15h: two integer cores sharing
                    # a front end and FPU), each a core of its own as hwloc counts them.
                    threads = frozenset(t for t in threads if raw[t].core_id == cpu.core_id)
                    infer.add(
                        "CPUs of one thread_siblings mask with distinct core_id on an AMD "
                        "family 15h CPU (compute units): each thread counted as a core",
                        number,
                    )
                else:
                    infer.add(
                        "CPUs of one thread_siblings mask with inconsistent core_id (distinct, "
                        "missing or -1): one core, as the mask says",
                        number,
                    )
            cores[number] = frozenset(threads)
        elif cpu.core_id is not None:
            cores[number] = frozenset(by_core_key[(cpu.package_id, cpu.package_cpus, cpu.core_id)])
            infer.add("no thread siblings file: cores grouped by package and core_id", number)
        else:
            cores[number] = frozenset({number})
            infer.add("no thread siblings file nor core_id: each CPU counted as a core", number)
    return _as_partition(cores, infer, "thread sibling lists")


def _as_partition(
    cores: dict[int, frozenset[int]], infer: _Inferences, what: str
) -> dict[int, frozenset[int]]:
    """Sets that do not overlap: the kernel gives each thread of a core (each CPU of a
    package) the same list, so lists that disagree (cpu0 names cpu1, cpu1 only itself)
    are joined, never left to put one CPU in two cores (and two ranks)."""
    parent = {number: number for number in cores}

    def root(number: int) -> int:
        while parent[number] != number:
            parent[number] = parent[parent[number]]
            number = parent[number]
        return number

    # Each distinct list once: a machine's CPUs share few lists (one per core, one per
    # package), so this costs the CPUs of those lists, not CPUs times list length.
    for members in set(cores.values()):
        inside = [member for member in members if member in parent]
        for member in inside[1:]:
            parent[root(member)] = root(inside[0])
    groups: dict[int, set[int]] = {}
    for number in cores:
        groups.setdefault(root(number), set()).add(number)
    frozen = {top: frozenset(members) for top, members in groups.items()}
    joined = {number: frozen[root(number)] for number in cores}
    for number, members in joined.items():
        if members != cores[number]:
            infer.add(f"{what} that disagree with each other: joined", number)
    return joined


def _packages(raw: dict[int, _RawCpu], infer: _Inferences) -> dict[int, int]:
    """Each CPU's package number.

    A package is the CPUs of one package CPU list (core_siblings / package_cpus), as
    hwloc reads it, lists that overlap joined: ia64 kernels print one
    physical_package_id for CPUs whose lists say they are separate packages (one per
    single-core Madison). CPUs without a list are grouped by physical_package_id. A
    package keeps the physical_package_id its CPUs share; one without (missing or -1),
    or a second package with an id already taken, is numbered after the highest id.
    """
    online = frozenset(raw)
    online_part: dict[frozenset[int], frozenset[int]] = {}  # each distinct list once
    with_list: dict[int, frozenset[int]] = {}
    for number, cpu in raw.items():
        if cpu.package_cpus is not None:
            mask = cpu.package_cpus
            members = online_part.setdefault(mask, mask & online)
            with_list[number] = members if number in members else members | {number}
    groups = _as_partition(with_list, infer, "core_siblings/package_cpus lists")
    by_id: dict[int | None, set[int]] = {}
    for number, cpu in raw.items():
        if number not in groups:
            by_id.setdefault(cpu.package_id, set()).add(number)
    all_packages = sorted(
        {*groups.values(), *(frozenset(cpus) for cpus in by_id.values())}, key=min
    )
    known = [cpu.package_id for cpu in raw.values() if cpu.package_id is not None]
    next_number = max(known, default=-1) + 1
    taken: set[int] = set()
    packages: dict[int, int] = {}
    for package in all_packages:
        ids = {raw[number].package_id for number in package}
        listed = package <= with_list.keys()
        shared = ids.pop() if len(ids) == 1 else None
        if shared is not None and shared not in taken:
            numbered = shared
        else:
            numbered = next_number
            next_number += 1
        taken.add(numbered)
        for number in package:
            packages[number] = numbered
            if shared is not None and numbered != shared:
                infer.add(
                    "a physical_package_id shared by CPUs whose core_siblings/package_cpus "
                    "lists are disjoint: separate packages, as those lists say",
                    number,
                )
            elif len(ids) > 1 or (shared is None and raw[number].package_id is not None):
                infer.add(
                    "CPUs of one core_siblings/package_cpus list with distinct "
                    "physical_package_id: one package, as the list says",
                    number,
                )
            elif shared is None and not listed:
                infer.add(
                    "no physical_package_id nor package CPU list: one package assumed", number
                )
            elif shared is None:
                infer.add(
                    "physical_package_id missing or -1: packages taken from "
                    "core_siblings/package_cpus",
                    number,
                )
    return packages


def has_compute_units(fs: NodeFS) -> bool:
    """Whether the machine's CPUs are AMD compute-unit CPUs (family 15h: Bulldozer,
    Piledriver, Steamroller, Excavator), decided once for the machine from /proc/cpuinfo
    as hwloc does (is_amd_with_CU, hwloc/topology-linux.c): only there do thread
    siblings with distinct core_id name cores of their own. Without /proc/cpuinfo: no."""
    try:
        fields = read_cpuinfo(fs)
    except ReadError:
        return False
    return is_amd_compute_unit_cpu(fields)


def is_amd_compute_unit_cpu(cpuinfo: Mapping[str, str]) -> bool:
    """Whether a /proc/cpuinfo block (parse_cpuinfo) is an AMD family 15h CPU: x86
    kernels print "vendor_id: AuthenticAMD" and "cpu family: 21" (decimal) for it."""
    family = cpuinfo.get("cpu family", "")
    return cpuinfo.get("vendor_id") == "AuthenticAMD" and family.isdigit() and int(family) == 0x15


def read_cpu_topology(fs: NodeFS) -> CpuTopology:
    base = fs.sys("devices", "system", "cpu")
    problems: dict[str, str] = {}
    notes: list[str] = []
    bound = cpu_id_bound(fs)

    def cpulist(text: str) -> frozenset[int]:
        return parse_cpulist(text, bound)

    try:
        found = _read_online(base, cpulist, notes, problems)
    except ReadError as err:
        problems["online"] = str(err)
        found = None
    if found is None:
        problems.setdefault("online", f"{base / 'online'}: missing, and no cpuN directory")
    online = found or frozenset()
    contradiction = possible_contradiction(fs, online)
    if contradiction:
        notes.append(contradiction)
    infer = _Inferences()
    raw: dict[int, _RawCpu] = {}
    packages_read: dict[int, frozenset[int]] = {}
    compute_units = has_compute_units(fs)
    # On compute-unit CPUs the threads of one list have core ids of their own: each read.
    ids = (_SharedId("physical_package_id"), _SharedId("core_id", every=compute_units))
    for number in sorted(online):
        try:
            raw[number] = _read_raw_cpu(base, number, bound, packages_read, ids)
        except ReadError as err:
            problems[f"cpu{number}"] = str(err)
    cores = _cores(raw, frozenset(raw), infer, compute_units)
    packages = _packages(raw, infer)
    cpus: dict[int, Cpu] = {}
    for number, cpu in raw.items():
        core = cpu.core_id if cpu.core_id is not None else min(cores[number])
        cpus[number] = Cpu(number, packages[number], core, cores[number])
    notes.extend(infer.notes())
    smt_control = smt_active_text = None
    try:
        smt_control = read_optional_text(base / "smt" / "control")
        smt_active_text = read_optional_text(base / "smt" / "active")
    except ReadError as err:
        problems["smt"] = str(err)
    smt_active = None if smt_active_text is None else smt_active_text == "1"
    return CpuTopology(online, cpus, smt_control, smt_active, problems, notes)


@record
class CpuGovernors:
    """Each CPU's cpufreq governor (`governors`, by CPU number: a CPU without cpufreq has
    none), and a "cpuN governor" problem for each that could not be read."""

    governors: dict[int, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)


def read_governors(fs: NodeFS, cpus: Iterable[int]) -> CpuGovernors:
    """Each CPU's cpufreq governor (cpuN/cpufreq/scaling_governor,
    Documentation/admin-guide/pm/cpufreq.rst), and a "cpuN governor" problem for each that
    cannot be read; a CPU without cpufreq has none. Apart from the topology: only the cpu
    check needs it, and `tune` and `inventory` are spared a read per CPU."""
    base = fs.sys("devices", "system", "cpu")
    governors: dict[int, str] = {}
    problems: dict[str, str] = {}
    for number in cpus:
        try:
            governor = read_optional_text(f"{base}/cpu{number}/cpufreq/scaling_governor")
        except ReadError as err:
            problems[f"cpu{number} governor"] = str(err)
            continue
        if governor:
            governors[number] = governor
    return CpuGovernors(governors, problems)


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first processor block of /proc/cpuinfo as a dict ("model name", "flags", ...)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def read_cpuinfo(fs: NodeFS) -> dict[str, str]:
    """The first processor block: the start of the file is enough (the whole of it runs to
    hundreds of kilobytes on a machine with hundreds of CPUs)."""
    data = read_prefix(fs.proc("cpuinfo"), limit=1 << 16).data
    return parse_cpuinfo(data.decode(errors="replace"))


def read_cpu_model(fs: NodeFS) -> str:
    """The CPU model name.

    x86 kernels print "model name" in /proc/cpuinfo. Arm kernels print only
    part numbers there; for those, py-cpuinfo is asked, once per process
    since it takes about a second (it forks and probes CPUID or lscpu), and
    only when the procfs root is the live /proc it describes.
    """
    try:
        model = read_cpuinfo(fs).get("model name")
    except ReadError:
        model = None
    if model:
        return model
    if fs.procfs.resolve() == Path("/proc"):
        return _py_cpuinfo_brand() or "unknown"
    return "unknown"


@cache
def _py_cpuinfo_brand() -> str | None:
    try:
        import cpuinfo

        brand = cpuinfo.get_cpu_info().get("brand_raw")
    except Exception:
        return None
    return str(brand) if brand else None
