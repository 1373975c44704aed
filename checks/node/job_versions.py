"""The torch and NCCL a job runs: from the Python the user named (`--python`, or exec's
command: checks/node/job_python.py), and from the libraries a running GPU process has
mapped.

A process's mapped files are in /proc/<pid>/maps, one mapping a line, "address perms
offset dev inode pathname" (the kernel's Documentation/filesystems/proc.rst, "The
/proc/PID/maps file"); its paths are in the process's own mount namespace, so the files
beside them are read through /proc/<pid>/root, as chroot(2) to it would resolve them.

- libnccl: a distribution's package (and conda's) maps the real file, named
  `libnccl.so.MAJOR.MINOR.PATCH`: the version is in the name. pip's `nvidia-nccl-cuXX`
  maps `<site-packages>/nvidia/nccl/lib/libnccl.so.2`: the version is that
  distribution's, in its metadata beside it. A torch built with NCCL linked in statically
  maps none.
- torch: `<site-packages>/torch/lib/libtorch*.so` or `libc10*.so`; the version is the
  `torch` distribution's in that site-packages.

Only the GPU processes the `variables` part found are read, in pid order, and only until
one shows libnccl or torch (a job's ranks run one environment; a DataLoader worker has its
rank's maps): MAPS_PROCESSES_READ at most, each maps file at most MAPS_LIMIT bytes.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from nodecheck.checks.node.fs import (
    EXITED,
    MISSING,
    NodeFS,
    ReadError,
    read_prefix,
    resolve_inside,
)
from nodecheck.checks.node.job_python import (
    NCCL_WHEEL,
    JobPython,
    JobPythonReading,
    read_job_python,
)
from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.node.torch_package import find_distribution
from nodecheck.checks.node.variables import GpuProcess
from nodecheck.checks.record import record

# A PyTorch process on CUDA maps some thousands of regions, about 150 bytes a line: a
# few MiB at most; a longer file is cut, and said.
MAPS_LIMIT = 8 << 20
MAPS_PROCESSES_READ = 4
LIBNCCL_VERSIONED = LazyPattern(r"^libnccl\.so\.(\d+)\.(\d+)\.(\d+)$")
LIBNCCL = LazyPattern(r"^libnccl\.so(\.\d+)*$")
LIBTORCH = LazyPattern(r"^lib(torch|c10)[a-z_]*\.so$")


@record
class ProcessLibraries:
    """What one running GPU process has loaded: torch's and NCCL's version as read, each
    with where it was read ("" for none), and a problem when its maps could not be read."""

    pid: int
    label: str  # "pid 5151 (python3)"
    torch: str | None = None
    torch_where: str = ""
    nccl: str | None = None
    nccl_where: str = ""
    problem: str = ""


@record
class JobVersions:
    """The job's Python as named (None when none was) and the running GPU processes read."""

    python: JobPythonReading | None = None
    processes: tuple[ProcessLibraries, ...] = ()
    # GPU processes not read: one read before them already showed the job's libraries.
    not_read: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()


def mapped_paths(maps: str) -> list[str]:
    """The distinct files a maps text names, in order ("(deleted)" ones left out: the
    file beside them is no longer the one loaded)."""
    seen: dict[str, None] = {}
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/") and not fields[5].endswith(" (deleted)"):
            seen.setdefault(fields[5], None)
    return list(seen)


def _site_packages(path: PurePosixPath, depth: int) -> PurePosixPath | None:
    """The folder `depth` levels above `path`, when it is a site-packages or dist-packages."""
    folder = path.parents[depth] if len(path.parents) > depth else None
    if folder is not None and folder.name in ("site-packages", "dist-packages"):
        return folder
    return None


def _distribution_beside(
    root: Path, folder: PurePosixPath, wanted: LazyPattern | str
) -> tuple[str, str] | None:
    """The distribution `wanted` names in `folder` (a path of the process), read through
    its root."""
    try:
        inside = resolve_inside(root, str(folder))
    except ReadError:
        return None

    def takes(name: str) -> bool:
        return name == wanted if isinstance(wanted, str) else wanted.match(name) is not None

    return find_distribution(takes, [str(inside)])


def libraries_of(root: Path, paths: list[str]) -> tuple[str | None, str, str | None, str]:
    """(torch, where, nccl, where) from a process's mapped files, `root` its /proc/<pid>/root."""
    torch: str | None = None
    torch_where = ""
    nccl: str | None = None
    nccl_where = ""
    for text in paths:
        path = PurePosixPath(text)
        versioned = LIBNCCL_VERSIONED.match(path.name)
        if nccl is None and versioned:
            nccl, nccl_where = ".".join(versioned.groups()), f"its mapped {text}"
        elif nccl is None and LIBNCCL.match(path.name):
            # pip's nvidia/nccl/lib/libnccl.so.2: the version is the wheel's.
            site = _site_packages(path, 3)
            found = None if site is None else _distribution_beside(root, site, NCCL_WHEEL)
            if found is not None:
                nccl, nccl_where = found[1], f"{found[0]} beside its mapped {text}"
        if torch is None and LIBTORCH.match(path.name) and path.parent.name == "lib":
            site = _site_packages(path, 2)
            found = None if site is None else _distribution_beside(root, site, "torch")
            if found is not None:
                torch, torch_where = found[1], f"torch's metadata beside its mapped {text}"
    return torch, torch_where, nccl, nccl_where


def read_process_libraries(fs: NodeFS, process: GpuProcess) -> ProcessLibraries | None:
    """The process's torch and NCCL; None when it exited meanwhile."""
    label = f"pid {process.pid} ({process.command})"
    path = fs.proc(str(process.pid), "maps")
    try:
        contents = read_prefix(path, MAPS_LIMIT)
    except ReadError as err:
        if err.reason in (MISSING, EXITED):
            return None
        return ProcessLibraries(process.pid, label, problem=str(err))
    paths = mapped_paths(contents.data.decode("utf-8", "replace"))
    root = fs.proc(str(process.pid), "root")
    torch, torch_where, nccl, nccl_where = libraries_of(root, paths)
    problem = (
        f"{path}: longer than {MAPS_LIMIT >> 20} MiB, read in part" if contents.truncated else ""
    )
    return ProcessLibraries(process.pid, label, torch, torch_where, nccl, nccl_where, problem)


def read_job_versions(
    fs: NodeFS,
    job_python: JobPython | None,
    environ: dict[str, str],
    gpu_processes: list[GpuProcess],
) -> JobVersions:
    python = None if job_python is None else read_job_python(job_python, environ)
    read: list[ProcessLibraries] = []
    pending = sorted(gpu_processes, key=lambda p: p.pid)
    while pending and len(read) < MAPS_PROCESSES_READ:
        process = pending.pop(0)
        found = read_process_libraries(fs, process)
        if found is None:
            continue
        read.append(found)
        if found.torch is not None or found.nccl is not None:
            break
    notes: tuple[str, ...] = ()
    if pending and not any(p.torch or p.nccl for p in read):
        notes = (
            f"the first {len(read)} GPU processes map neither torch nor libnccl; "
            f"{len(pending)} more not read",
        )
    return JobVersions(python, tuple(read), tuple(p.pid for p in pending), notes)
