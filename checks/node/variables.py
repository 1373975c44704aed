"""NCCL, CUDA and PyTorch variables, from everywhere a training process takes them.

Sources: the calling environment; NCCL's config files (`/etc/nccl.conf`, and
`$NCCL_CONF_FILE` or else `~/.nccl.conf`, src/misc/param.cc initEnv); and the
environment of every process holding a GPU (`/dev/nvidiaN`) open, from
`<procfs>/<pid>/environ` and `<procfs>/<pid>/fd/`.

Only names with an audited prefix are kept. Everything else in an environment
is dropped as it is parsed and never stored, logged or printed: secrets live
there.
"""

from __future__ import annotations

import pwd
import re
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path

from nodecheck.checks.node.fs import (
    EXITED,
    MISSING,
    PERMISSION_DENIED,
    Contents,
    NodeFS,
    ReadError,
    list_dir,
    read_bytes,
    read_link,
    read_optional_text,
    read_prefix,
)
from nodecheck.checks.record import record

AUDITED_PREFIXES = ("NCCL_", "TORCH_", "PYTORCH_", "CUDA_")
GPU_DEVICE_RE = re.compile(r"^/dev/nvidia\d+$")

# How much of a process's `environ` is read. The file shows the block execve(2) set up
# (mm->env_start..env_end; only prctl PR_SET_MM can move it), and since Linux 4.13
# execve takes at most 3/4 of _STK_LIM, 6 MiB, of arguments and environment together
# (fs/exec.c bprm_stack_limits; each string at most MAX_ARG_STRLEN, 32 pages). 16 MiB
# reads every environment exec can build, with room for older kernels that bounded it
# by a quarter of a larger stack rlimit; a longer one is cut, and the cut reported.
ENVIRON_LIMIT = 16 << 20
# NCCL reads its config files whole (src/misc/param.cc setEnvFile, line by line); a
# megabyte of NAME=value lines is far past any real one, so a longer file is cut, reported.
NCCL_CONF_LIMIT = 1 << 20


def audited(name: str) -> bool:
    return name.startswith(AUDITED_PREFIXES)


MAX_COUNT_DIGITS = 9


def parse_count(value: str) -> int | None:
    """A non-negative integer as launchers write one ("8", " 8 "); None for anything else.
    str.isdigit is not enough: it accepts "²", which int() refuses."""
    text = value.strip()
    # Past 9 digits no count, rank or GPU index is meant (and int() refuses over 4300).
    if len(text) > MAX_COUNT_DIGITS:
        return None
    return int(text) if text.isascii() and text.isdigit() else None


@record
class Source:
    """Where a variable was found. `label` is what a person reads."""

    kind: str  # "environment", "file" or "process"
    label: str
    pid: int | None = None
    # The node's own, set for every job (/etc/nccl.conf), not a job's or a user's.
    node_wide: bool = False


# NCCL reads it after NCCL_CONF_FILE or ~/.nccl.conf (NVIDIA/nccl src/misc/param.cc,
# initEnv): the one file that is the node's, not the job's.
NODE_NCCL_CONF = "/etc/nccl.conf"
CALLING_ENVIRONMENT = Source("environment", "the calling environment")


@record
class Setting:
    name: str
    value: str
    source: Source
    line: int | None = None  # for config files

    @property
    def where(self) -> str:
        if self.line is not None:
            return f"{self.source.label} line {self.line}"
        return self.source.label


@record
class ConfLine:
    """A `NAME=value` line of an NCCL config file, exactly as NCCL reads it."""

    line: int
    name: str
    value: str


def parse_nccl_conf(text: str) -> list[ConfLine]:
    """Parse an NCCL config file the way NCCL does (src/misc/param.cc setEnvFile).

    NCCL splits each line at the first '=' and trims nothing: "NCCL_DEBUG = INFO"
    defines a variable named "NCCL_DEBUG " that nothing reads. Lines without '='
    are skipped; a '#' line defines a name no one reads, which is how comments
    work. Names are returned as NCCL sees them, whitespace included.
    """
    lines = []
    for number, raw in enumerate(text.split("\n"), start=1):
        name, sep, value = raw.partition("=")
        if not sep or not name or name.lstrip().startswith("#"):
            continue
        lines.append(ConfLine(number, name, value))
    return lines


# An audited entry of an `environ` block: at the start or after a NUL, up to the next NUL.
_AUDITED_ENTRY_RE = re.compile(
    rb"(?:\A|(?<=\0))((?:"
    + b"|".join(p.encode() for p in AUDITED_PREFIXES)
    + rb")[^=\0]*)=([^\0]*)"
)


def parse_environ(data: bytes) -> dict[str, str]:
    """Audited variables of a NUL-separated `environ` block; all others are dropped.

    Only audited entries are ever sliced out (a regular expression finds them), so a
    16 MiB block of NULs or of other variables costs no more than its own bytes.
    """
    kept: dict[str, str] = {}
    for match in _AUDITED_ENTRY_RE.finditer(data):
        kept[match.group(1).decode(errors="replace")] = match.group(2).decode(errors="replace")
    return kept


def parse_passwd_homes(text: str) -> dict[int, str]:
    """uid -> home directory from /etc/passwd text."""
    homes: dict[int, str] = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 7 and fields[2].isdigit():
            homes.setdefault(int(fields[2]), fields[5])
    return homes


def parse_status_uid(text: str) -> int | None:
    """Real uid from `<procfs>/<pid>/status` ("Uid:\t1000\t1000\t1000\t1000")."""
    match = re.search(r"^Uid:\s+(\d+)", text, re.MULTILINE)
    return int(match.group(1)) if match else None


@record(frozen=False)
class GpuProcess:
    pid: int
    command: str
    devices: list[str]


@record(frozen=False)
class Variables:
    """Every audited setting found, the sources read, and those that could not be.

    `unreadable` holds what permissions kept from this reader (another user's
    process: root can read it); `problems` what could not be read for any other
    reason (a directory or a FIFO in place of a file, an I/O error, a symlink
    loop) or was read only in part, each naming the path.
    """

    settings: list[Setting] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    gpu_processes: list[GpuProcess] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def find_gpu_processes(fs: NodeFS) -> tuple[list[GpuProcess], list[str], list[str]]:
    """Processes with a `/dev/nvidiaN` open, the pids whose fds permissions kept from this
    reader, and any other failure to read a process's fds (naming the path).

    nvidiactl and nvidia-uvm are opened by any CUDA-aware process; only the
    per-GPU nodes mean a process holds a GPU.
    """
    processes = []
    unreadable = []
    problems = []
    try:
        entries = list_dir(fs.procfs)
    except ReadError as err:
        return [], [], [str(err)]
    for entry in entries:
        if not entry.isdigit():
            continue
        fd_dir = fs.proc(entry, "fd")
        try:
            fds = list_dir(fd_dir)  # [] when the process exited meanwhile
        except ReadError as err:
            if err.reason == PERMISSION_DENIED:
                unreadable.append(entry)
            else:
                problems.append(str(err))
            continue
        devices = set()
        for fd in fds:
            try:
                target = read_link(fd_dir / fd)
            except ReadError:
                continue  # closed meanwhile
            if GPU_DEVICE_RE.match(target):
                devices.add(target)
        if devices:
            try:
                command = read_optional_text(fs.proc(entry, "comm")) or "?"
            except ReadError:
                command = "?"
            processes.append(GpuProcess(int(entry), command, sorted(devices)))
    return processes, unreadable, problems


class HomeDirectories:
    """Home directories by uid, the way NCCL finds `~/.nccl.conf` (getpwuid, not $HOME).

    On the live root the system's user database answers (LDAP and SSSD users
    included); under another root its /etc/passwd does.
    """

    def __init__(self, fs: NodeFS) -> None:
        self._fs = fs
        self._homes: dict[int, str] | None = None

    def home(self, uid: int) -> str | None:
        """The user's home directory as the node names it (a host path: NodeFS.host
        keeps it, and anything below it, inside the root filesystem)."""
        if self._fs.rootfs.resolve() == Path("/"):
            try:
                return pwd.getpwuid(uid).pw_dir
            except KeyError:
                return None
        if self._homes is None:
            try:
                data = read_bytes(self._fs.host("/etc/passwd"))
                self._homes = parse_passwd_homes(data.decode(errors="replace"))
            except ReadError:
                self._homes = {}
        return self._homes.get(uid) or None


def _cut_note(path: Path, what: str, limit: int) -> str:
    return f"{path}: longer than {limit >> 20} MiB; {what} past {limit >> 20} MiB were not read"


def _host_label(fs: NodeFS, path: Path) -> str:
    """A file under the root filesystem as the host names it (/etc/nccl.conf)."""
    try:
        return "/" + str(path.relative_to(fs.rootfs))
    except ValueError:  # --rootfs is / by another name (a symlink to it)
        return str(path)


def _record_failure(found: Variables, err: ReadError, label: str | None = None) -> None:
    """Permissions go to `unreadable` (root can read it); anything else is a problem."""
    where = f"{label}: {err}" if label else str(err)
    if err.reason == PERMISSION_DENIED:
        found.unreadable.append(where)
    else:
        found.problems.append(where)


def read_variables(fs: NodeFS, environ: Mapping[str, str], uid: int) -> Variables:
    """Collect audited settings from every source (see module docstring)."""
    found = Variables()
    homes = HomeDirectories(fs)
    read_files: set[Path] = set()

    def add_environment(values: Mapping[str, str], source: Source) -> None:
        found.sources.append(source)
        for name, value in sorted(values.items()):
            if audited(name):
                found.settings.append(Setting(name, value, source))

    def add_conf_files(values: Mapping[str, str], owner_uid: int | None) -> None:
        """The files NCCL in a process with these variables would read."""
        names: list[str] = []
        conf_file = values.get("NCCL_CONF_FILE")
        if conf_file:
            names.append(conf_file)
        elif owner_uid is not None:
            home = homes.home(owner_uid)
            if home is not None:
                names.append(home.rstrip("/") + "/.nccl.conf")
        names.append(NODE_NCCL_CONF)
        for name in names:
            try:
                path = fs.host(name)
            except ReadError as err:
                found.problems.append(str(err))
                continue
            if path in read_files:
                continue
            read_files.add(path)
            try:
                contents = read_prefix(path, NCCL_CONF_LIMIT)
            except ReadError as err:
                # NCCL reads this file as the job's user: one we cannot read, for whatever
                # reason, holds settings we cannot judge (not just another user's secret).
                if err.reason != MISSING:
                    found.problems.append(str(err))
                continue
            if contents.truncated:
                found.problems.append(_cut_note(path, "lines", NCCL_CONF_LIMIT))
            source = Source("file", _host_label(fs, path), node_wide=name == NODE_NCCL_CONF)
            found.sources.append(source)
            for line in parse_nccl_conf(contents.data.decode(errors="replace")):
                if audited(line.name.strip()):
                    found.settings.append(Setting(line.name, line.value, source, line.line))

    add_environment(environ, CALLING_ENVIRONMENT)
    add_conf_files(environ, uid)

    processes, unreadable_fds, fd_problems = find_gpu_processes(fs)
    found.gpu_processes = processes
    found.unreadable.extend(f"pid {pid}: open files not readable" for pid in unreadable_fds)
    found.problems.extend(fd_problems)
    for process in processes:
        label = f"pid {process.pid} ({process.command})"
        environ_path = fs.proc(str(process.pid), "environ")
        try:
            contents: Contents = read_prefix(environ_path, ENVIRON_LIMIT)
        except ReadError as err:
            # A process that held a GPU a moment ago and is gone now (a DataLoader worker)
            # has no environment left to audit: that is not a failure to audit it.
            if err.reason not in (MISSING, EXITED):
                _record_failure(found, err, label)
            continue
        if contents.truncated:
            found.problems.append(
                f"{label}: " + _cut_note(environ_path, "variables", ENVIRON_LIMIT)
            )
        values = parse_environ(contents.data)
        add_environment(values, Source("process", label, process.pid))
        try:
            status = read_optional_text(fs.proc(str(process.pid), "status")) or ""
        except ReadError:
            status = ""
        add_conf_files(values, parse_status_uid(status))
    return found
