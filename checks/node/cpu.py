"""CPUs, cores, sockets and SMT from `<sysfs>/devices/system/cpu`, and /proc/cpuinfo.

Attributes: Documentation/ABI/stable/sysfs-devices-system-cpu and
Documentation/admin-guide/cputopology.rst.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from nodecheck.checks.node.cpulist import cpu_id_bound, parse_cpulist
from nodecheck.checks.node.fs import (
    NodeFS,
    ReadError,
    read_optional_text,
    read_parsed,
    read_prefix,
)


@dataclass(frozen=True)
class Cpu:
    """One logical CPU. `siblings` are the hardware threads of its core, itself included."""

    number: int
    package: int
    core: int
    siblings: frozenset[int]
    governor: str | None


@dataclass
class CpuTopology:
    online: frozenset[int]
    cpus: dict[int, Cpu]
    smt_control: str | None  # "on", "off", "forceoff", "notsupported", "notimplemented"
    smt_active: bool | None
    problems: dict[str, str] = field(default_factory=dict)

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


def read_cpu_topology(fs: NodeFS) -> CpuTopology:
    base = fs.sys("devices", "system", "cpu")
    problems: dict[str, str] = {}
    bound = cpu_id_bound(fs)

    def cpulist(text: str) -> frozenset[int]:
        return parse_cpulist(text, bound)

    try:
        online = read_parsed(base / "online", cpulist, "a CPU list")
    except ReadError as err:
        problems["online"] = str(err)
        online = frozenset()
    cpus: dict[int, Cpu] = {}
    for number in sorted(online):
        topology = base / f"cpu{number}" / "topology"
        try:
            package = read_parsed(topology / "physical_package_id", int, "an integer")
            core = read_parsed(topology / "core_id", int, "an integer")
            siblings = read_parsed(topology / "thread_siblings_list", cpulist, "a CPU list")
        except ReadError as err:
            problems[f"cpu{number}"] = str(err)
            continue
        try:
            governor = read_optional_text(base / f"cpu{number}" / "cpufreq" / "scaling_governor")
        except ReadError as err:
            problems[f"cpu{number} governor"] = str(err)
            governor = None
        cpus[number] = Cpu(number, package, core, siblings or frozenset({number}), governor)
    smt_control = smt_active_text = None
    try:
        smt_control = read_optional_text(base / "smt" / "control")
        smt_active_text = read_optional_text(base / "smt" / "active")
    except ReadError as err:
        problems["smt"] = str(err)
    smt_active = None if smt_active_text is None else smt_active_text == "1"
    return CpuTopology(online, cpus, smt_control, smt_active, problems)


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
