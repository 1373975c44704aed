"""The CPUs this process's cgroup lets it run on: its cpuset, found where the node mounts it.

A Slurm job step, a container or a systemd slice confines its processes to a
cpuset. A binding must stay inside it: the kernel refuses an affinity with no
allowed CPU (EINVAL) and silently narrows one that is partly outside.

The cpuset, not `sched_getaffinity`, is the limit: `srun --cpu-bind` or a
launcher may already have narrowed this process's affinity to a few cores, and
a process may widen its own affinity anywhere inside its cpuset.

Where the hierarchy is mounted is read, never assumed (/sys/fs/cgroup is only the
systemd convention): `<procfs>/self/mountinfo` (Documentation/filesystems/proc.rst,
"/proc/<pid>/mountinfo"), else `<procfs>/mounts` on kernels before 2.6.26 or in a
capture that has only that. Each form of the cpuset the kernel has served:

  cgroup v2 (Documentation/admin-guide/cgroup-v2.rst): `0::/path` in /proc/self/cgroup;
      `<mount>/path/cpuset.cpus.effective`, present only where the cpuset controller is
      enabled (else the nearest ancestor's holds). A cgroup2 mount without "cpuset" in
      its root's cgroup.controllers has no cpuset: the controller is on a v1 hierarchy
      or not built.
  cgroup v1 (Documentation/admin-guide/cgroup-v1/cpusets.rst): `N:cpuset:/path` (or
      `N:cpu,cpuset:/path`, controllers mounted together); `cpuset.effective_cpus`, or
      `cpuset.cpus` on kernels older than that file, walking up while a cgroup's list
      is empty.
  the `cpuset` filesystem (`mount -t cpuset`, and cgroup v1 mounted with `noprefix`, as
      the kernel itself mounts it for the cpuset type: kernel/cgroup/cpuset.c
      cpuset_mount): the same files without the `cpuset.` prefix, `cpus`.
  `/proc/self/cpuset` (cpuset(7)): the task's cpuset path, where /proc/self/cgroup does
      not name one (an old kernel, or a capture).

Paths in /proc/self/cgroup are relative to the cgroup namespace's root, and a mount's
`root` field says which directory of the hierarchy it shows: in a container that
bind-mounts its own cgroup (root /docker/ID) the process's cgroup /docker/ID is the
mount point itself. hwloc reads cpusets the same way (open-mpi/hwloc,
hwloc/topology-linux.c: hwloc_find_linux_cgroup_mntpnt, hwloc_read_linux_cgroup_name,
hwloc_admin_disable_set_from_cgroup).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from nodecheck.checks.lazy_logging import get_logger
from nodecheck.checks.node.cpulist import (
    NR_CPUS_MAX,
    cpu_id_bound,
    format_cpulist,
    parse_cpulist,
)
from nodecheck.checks.node.fs import NodeFS, ReadError, read_optional_text
from nodecheck.checks.record import record

log = get_logger(__name__)

CGROUP2, CGROUP1, CPUSET_FS = "cgroup2", "cgroup", "cpuset"
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def unescape_mount_field(text: str) -> str:
    """A path field of mountinfo or /proc/mounts as the kernel meant it: it prints space,
    tab, newline and backslash as \\040, \\011, \\012 and \\134 (fs/proc_namespace.c,
    mangle() / seq_path_root)."""
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), text)


@record
class Mount:
    mount_point: str
    root: str  # the directory of the filesystem this mount shows; "/" when not known
    fs_type: str
    options: frozenset[str]  # per-mount and superblock options together ("cpuset", "noprefix")
    # Not from a mount table: where cgroups conventionally sit, taken where there is none.
    guessed: bool = False


# Where the hierarchies are mounted by convention (systemd's /sys/fs/cgroup, the v1 cpuset
# under it, the old cpuset filesystem's /dev/cpuset: cgroup-v1/cpusets.rst), looked at only
# where no mount table can be read.
CONVENTIONAL_MOUNTS = (
    Mount("/sys/fs/cgroup", "/", "cgroup2", frozenset(), guessed=True),
    Mount("/sys/fs/cgroup/cpuset", "/", "cgroup", frozenset({"cpuset"}), guessed=True),
    Mount("/dev/cpuset", "/", "cpuset", frozenset(), guessed=True),
)


def parse_mountinfo(text: str) -> list[Mount]:
    """Mounts from /proc/<pid>/mountinfo, in order (a later mount at a point hides an
    earlier one). A line: mount ID, parent ID, major:minor, root, mount point, mount
    options, optional fields ("shared:1 master:2", any number), "-", filesystem type,
    source, superblock options. A line without its "-" separator is skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        tail = fields[separator + 1 :]
        if len(fields) < 6 or len(tail) < 3:
            continue
        options = set(fields[5].split(",")) | set(tail[2].split(","))
        mounts.append(
            Mount(
                mount_point=unescape_mount_field(fields[4]),
                root=unescape_mount_field(fields[3]),
                fs_type=tail[0],
                options=frozenset(options),
            )
        )
    return mounts


def parse_proc_mounts(text: str) -> list[Mount]:
    """Mounts from /proc/mounts (fstab(5) lines: source, mount point, type, options,
    dump, pass). It has no root field: every mount shows its filesystem's root."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mounts.append(
            Mount(
                mount_point=unescape_mount_field(fields[1]),
                root="/",
                fs_type=fields[2],
                options=frozenset(fields[3].split(",")),
            )
        )
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller -> cgroup path from /proc/<pid>/cgroup; "" is the v2 unified hierarchy.

    "4:memory:/slurm/uid_1000/job_1" -> {"memory": "/slurm/uid_1000/job_1"};
    "0::/user.slice" -> {"": "/user.slice"}; "1:cpu,cpuacct:/" names two controllers.
    """
    paths: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def parse_proc_cpuset(text: str) -> str | None:
    """The cpuset path of /proc/<pid>/cpuset ("/slurm/job_1"), or None if it holds none."""
    path = text.strip()
    return path if path.startswith("/") else None


@record
class CpusetReading:
    """What limits the CPUs of this process.

    `cpus` None with no `error`: nothing to read limits it (no cgroup file, as under a
    replica tree; no cpuset controller; the root cpuset). With an `error`: it could not be
    determined, and the error says why."""

    cpus: frozenset[int] | None
    source: str = ""  # the file the CPUs were read from
    notes: tuple[str, ...] = ()  # what had to be inferred to read them
    error: str = ""
    # The NUMA nodes whose memory the cpuset allows (cpuset.mems): a memory binding to
    # any other node is refused (set_mempolicy(2): EINVAL). None: not limited, or unknown
    # (a note says which).
    mems: frozenset[int] | None = None
    mems_source: str = ""


def _host_path(fs: NodeFS, absolute: str) -> Path:
    """A path of this node's filesystem under the NodeFS roots: under /sys through the
    sysfs root, under /proc through the procfs root, anything else (/cgroup/unified,
    /dev/cpuset) under the root filesystem."""
    parts = PurePosixPath("/", absolute).parts[1:]
    if parts[:1] == ("sys",):
        return fs.sys(*parts[1:])
    if parts[:1] == ("proc",):
        return fs.proc(*parts[1:])
    return fs.host(absolute)


def _kind(mount: Mount) -> str | None:
    if mount.fs_type == "cgroup2":
        return CGROUP2
    if mount.fs_type == "cpuset" or (
        mount.fs_type == "cgroup" and {"cpuset", "noprefix"} <= mount.options
    ):
        return CPUSET_FS
    if mount.fs_type == "cgroup" and "cpuset" in mount.options:
        return CGROUP1
    return None


def _relative_to_root(path: str, root: str) -> PurePosixPath | None:
    """The cgroup's directory below a mount whose `root` is that directory of the
    hierarchy; None when the cgroup lies outside what the mount shows."""
    cgroup, shown = PurePosixPath("/", path), PurePosixPath("/", root)
    if cgroup == shown:
        return PurePosixPath()
    if shown in cgroup.parents:
        return cgroup.relative_to(shown)
    return None


def _mounts(fs: NodeFS) -> tuple[list[Mount], list[str]] | str:
    """The node's mounts and a note on how they were found, or why they could not be."""
    try:
        text = read_optional_text(fs.proc("self", "mountinfo"))
        if text is not None:
            return parse_mountinfo(text), []
        text = read_optional_text(fs.proc("mounts"))
    except ReadError as err:
        return f"the mounts could not be read ({err})"
    if text is None:
        guessed = [m for m in CONVENTIONAL_MOUNTS if _host_path(fs, m.mount_point).is_dir()]
        if not guessed:
            return "neither /proc/self/mountinfo nor /proc/mounts is there"
        places = ", ".join(m.mount_point for m in guessed)
        return guessed, [
            "neither /proc/self/mountinfo nor /proc/mounts is there: the cgroup hierarchies "
            f"are taken to be where they conventionally are ({places})"
        ]
    return parse_proc_mounts(text), [
        "no /proc/self/mountinfo (a kernel before 2.6.26, or a capture): the cgroup mounts "
        "come from /proc/mounts, which has no mount roots, so each is taken to show its "
        "hierarchy from the top"
    ]


def _has_cpuset_controller(fs: NodeFS, mount: Mount) -> bool | str:
    """Whether a cgroup2 mount offers the cpuset controller (its cgroup.controllers), or
    why that could not be read."""
    path = _host_path(fs, mount.mount_point) / "cgroup.controllers"
    try:
        text = read_optional_text(path)
    except ReadError as err:
        return str(err)
    if text is None:
        # A guessed mount may not be cgroup2 at all: let its files tell.
        return True if mount.guessed else f"{path}: missing"
    return "cpuset" in text.split()


def _read_cpus(
    fs: NodeFS, directories: list[Path], names: tuple[str, ...], what: str = "CPUs"
) -> CpusetReading:
    """The first non-empty list among `names` in the nearest directory that has one (CPUs,
    or memory nodes with `what="memory nodes"`: the same list format)."""
    bound = cpu_id_bound(fs) if what == "CPUs" else NR_CPUS_MAX
    notes: list[str] = []
    for directory in directories:
        for name in names:
            path = directory / name
            try:
                text = read_optional_text(path)
            except ReadError as err:
                return CpusetReading(None, str(path), tuple(notes), str(err))
            if text is None:
                continue
            try:
                cpus = parse_cpulist(text, bound)
            except ValueError as err:
                return CpusetReading(
                    None,
                    str(path),
                    tuple(notes),
                    f"{path}: not a {'CPU' if what == 'CPUs' else 'node'} list the kernel "
                    f"prints ({err})",
                )
            if cpus:
                if directory != directories[0]:
                    notes.append(
                        f"the cpuset's {what} come from {path}: its own cgroup's list is empty or "
                        "absent, and a cgroup's cpuset is its nearest ancestor's then"
                    )
                if name != names[0]:
                    notes.append(
                        f"no {names[0]} (a kernel older than that file): read {name}, the "
                        f"cgroup's configured {what}, which is what it may use there"
                    )
                return CpusetReading(cpus, str(path), tuple(notes))
            break  # present but empty: look at the parent
    return CpusetReading(
        None,
        "",
        tuple(notes),
        f"no cpuset file ({' or '.join(names)}) in {directories[0]} or above it",
    )


# The files holding a cgroup's CPUs and memory nodes, preferred first, by hierarchy kind
# (cgroup-v2.rst "Cpuset Interface Files"; cgroup-v1/cpusets.rst 1.3: effective_* are
# what the cgroup may use, the plain files what was configured, older kernels' only ones).
CPUS_FILES = {
    CGROUP2: ("cpuset.cpus.effective",),
    CGROUP1: ("cpuset.effective_cpus", "cpuset.cpus"),
    CPUSET_FS: ("effective_cpus", "cpus"),
}
MEMS_FILES = {
    CGROUP2: ("cpuset.mems.effective",),
    CGROUP1: ("cpuset.effective_mems", "cpuset.mems"),
    CPUSET_FS: ("effective_mems", "mems"),
}


def read_cpuset(fs: NodeFS) -> CpusetReading:
    """This process's cpuset: where its hierarchy is mounted, which cgroup it is in, and
    that cgroup's CPUs."""
    try:
        cgroup_text = read_optional_text(fs.proc("self", "cgroup"))
        cpuset_text = read_optional_text(fs.proc("self", "cpuset"))
    except ReadError as err:
        return CpusetReading(None, error=f"which cgroup this process is in is unknown: {err}")
    memberships = parse_proc_cgroup(cgroup_text or "")
    cpuset_path = parse_proc_cpuset(cpuset_text or "")
    if not memberships and cpuset_path is None:
        return CpusetReading(None)  # no cgroup to read: a replica tree, or no cgroups
    found = _mounts(fs)
    if isinstance(found, str):
        return CpusetReading(None, error=f"where the cpuset is mounted is unknown: {found}")
    mounts, notes = found
    # Which hierarchy holds the cpuset, and this process's path in it.
    wanted: list[tuple[str, str, str]] = []  # (kind, path, where the path was read)
    if "cpuset" in memberships:
        where = "/proc/self/cgroup"
        wanted += [
            (CGROUP1, memberships["cpuset"], where),
            (CPUSET_FS, memberships["cpuset"], where),
        ]
    elif "" in memberships:
        wanted.append((CGROUP2, memberships[""], "/proc/self/cgroup"))
    if cpuset_path is not None and not wanted:
        where = "/proc/self/cpuset"
        wanted += [(kind, cpuset_path, where) for kind in (CGROUP1, CPUSET_FS, CGROUP2)]
        notes.append(
            f"/proc/self/cgroup names no cpuset: the cgroup path {cpuset_path} comes from "
            "/proc/self/cpuset"
        )
    unreadable: list[str] = []
    for kind, path, where in wanted:
        candidates = [m for m in reversed(mounts) if _kind(m) == kind]
        if kind == CGROUP2:
            usable = []
            for mount in candidates:
                has = _has_cpuset_controller(fs, mount)
                if has is True:
                    usable.append(mount)
                elif isinstance(has, str):
                    unreadable.append(has)
            candidates = usable
        placed = [
            (m, rel) for m in candidates if (rel := _relative_to_root(path, m.root)) is not None
        ]
        if candidates and not placed:
            roots = ", ".join(f"{m.mount_point} (root {m.root})" for m in candidates)
            return CpusetReading(
                None,
                notes=tuple(notes),
                error=f"the cgroup {path} (from {where}) lies outside every mount of its "
                f"hierarchy: {roots}",
            )
        if not placed:
            continue
        # The mount showing the most of the cgroup's own subtree: the longest root.
        mount, relative = max(placed, key=lambda item: len(PurePosixPath(item[0].root).parts))
        directory = _host_path(fs, mount.mount_point)
        cgroup_dir = directory.joinpath(*relative.parts)
        if not cgroup_dir.is_dir():
            return CpusetReading(
                None,
                notes=tuple(notes),
                error=f"the cgroup {path} (from {where}) is not under {mount.mount_point}, "
                f"where its hierarchy is mounted ({cgroup_dir} is not a directory)",
            )
        chain = [
            directory.joinpath(*relative.parts[:depth])
            for depth in range(len(relative.parts), -1, -1)
        ]
        reading = _read_cpus(fs, chain, CPUS_FILES[kind])
        if reading.cpus is None and not reading.source and mount.guessed:
            continue  # no cpuset file where one was guessed: not that hierarchy
        if reading.error:
            log.warning("event=bad_cpuset path=%r error=%r", reading.source, reading.error)
        mems = _read_cpus(fs, chain, MEMS_FILES[kind], "memory nodes")
        mems_notes = list(mems.notes)
        if mems.error:
            mems_notes.append(
                f"the cpuset's memory nodes could not be read ({mems.error}): memory is bound "
                "to each GPU's node as if the cpuset allowed every node"
            )
        return CpusetReading(
            reading.cpus,
            reading.source,
            (*notes, *reading.notes, *mems_notes),
            reading.error,
            mems.cpus,
            mems.source,
        )
    if unreadable:
        return CpusetReading(
            None,
            notes=tuple(notes),
            error="whether cgroup2 offers the cpuset controller is unknown: "
            + "; ".join(unreadable),
        )
    if "cpuset" in memberships and memberships["cpuset"] not in ("", "/"):
        return CpusetReading(
            None,
            notes=tuple(notes),
            error=f"this process is in the cpuset {memberships['cpuset']} (/proc/self/cgroup), "
            "but no cpuset hierarchy is mounted here to read it from",
        )
    return CpusetReading(None, notes=tuple(notes))  # no cpuset controller: nothing limits it


def read_allowed_cpus(fs: NodeFS) -> frozenset[int] | None:
    """CPUs of this process's cpuset; None when there is none to read or it could not be
    read (read_cpuset says which, and why)."""
    return read_cpuset(fs).cpus


def describe_cpuset(reading: CpusetReading) -> str:
    """The cpuset in words for a note: "cpuset 0-5 (from FILE)"."""
    if reading.cpus is None:
        return "no cpuset"
    return f"cpuset {format_cpulist(reading.cpus)} (from {reading.source})"
