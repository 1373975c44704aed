"""Processes of this node as procfs shows them: a GPU process's command name, its process
group, this process's PID namespace and memory nodes, the processes of a daemon found by
their command name, and the benchmarks' maintenance file.

/proc/<pid>/comm, /proc/<pid>/stat and /proc/<pid>/status are described in the kernel's
Documentation/filesystems/proc.rst. A pid NVML lists may be outside this PID namespace
(NVML reports the host's PIDs inside a container without hostPID): its files are then
absent here, which is said, never guessed.
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path

from nodecheck.checks.node.cpulist import parse_cpulist
from nodecheck.checks.node.fs import NodeFS, ReadError, list_dir, read_optional_text, read_text
from nodecheck.checks.record import record


@record
class ProcessName:
    """A process's command name (/proc/<pid>/comm), or why it could not be read."""

    command: str | None
    problem: str = ""


@record
class GpuProcessNames:
    """The command name of every process NVML lists on a GPU, by pid."""

    by_pid: dict[int, ProcessName] = field(default_factory=dict)

    def name_of(self, pid: int) -> str:
        """The command; "?" for a pid that could not be read (outside this PID namespace)."""
        found = self.by_pid.get(pid)
        return "?" if found is None or found.command is None else found.command


def read_process_name(fs: NodeFS, pid: int) -> ProcessName:
    try:
        return ProcessName(read_text(fs.proc(str(pid), "comm")))
    except ReadError as err:
        return ProcessName(None, str(err))


def read_process_names(fs: NodeFS, pids: list[int]) -> GpuProcessNames:
    return GpuProcessNames({pid: read_process_name(fs, pid) for pid in sorted(set(pids))})


# NVIDIA Fabric Manager's daemon, /usr/bin/nv-fabricmanager (the nvidia-fabricmanager
# service; docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/). The kernel keeps a
# command name to TASK_COMM_LEN - 1 = 15 bytes (include/linux/sched.h), so its comm reads
# "nv-fabricmanage", as `systemctl status nvidia-fabricmanager` shows it.
FABRIC_MANAGER_COMMAND = "nv-fabricmanage"


@record
class DaemonProcesses:
    """The pids whose command name (/proc/<pid>/comm) is `command`; `pids` None when this
    process cannot see every process of the node, and `problem` says why."""

    command: str
    pids: tuple[int, ...] | None
    problem: str = ""


def find_processes_named(fs: NodeFS, command: str) -> DaemonProcesses:
    """Every process of the node whose command name is `command`.

    None rather than "none running" where the process list is not the node's: inside a
    PID namespace of our own (a container without hostPID), or where procfs hides other
    users' processes (mounted with hidepid=, which hides pid 1 from a non-root reader).
    """
    if in_pid_namespace(fs):
        why = "this process runs in a PID namespace of its own: the host's processes are hidden"
        return DaemonProcesses(command, None, why)
    try:
        entries = list_dir(fs.procfs)
    except ReadError as err:
        return DaemonProcesses(command, None, str(err))
    if "1" not in entries:
        why = f"{fs.proc('1')} is not visible: procfs hides other users' processes (hidepid)"
        return DaemonProcesses(command, None, why)
    found = []
    for entry in entries:
        if not (entry.isascii() and entry.isdigit()):
            continue
        # One that exited meanwhile, or is not ours to read, has no name: never the daemon.
        if read_process_name(fs, int(entry)).command == command:
            found.append(int(entry))
    return DaemonProcesses(command, tuple(sorted(found)))


def describe_process(fs: NodeFS, pid: int) -> str:
    """ "pid 123 (python)", or "pid 123" when its name cannot be read."""
    name = read_process_name(fs, pid)
    return f"pid {pid}" if name.command is None else f"pid {pid} ({name.command})"


def parse_process_group(stat: str) -> int:
    """The process group from /proc/<pid>/stat ("pid (comm) state ppid pgrp ...").

    The command name may hold spaces and parentheses, so fields are counted
    after its last ')'.
    """
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[2])


def process_group(fs: NodeFS, pid: int) -> int | None:
    try:
        return parse_process_group(read_text(fs.proc(str(pid), "stat")))
    except (ReadError, ValueError, IndexError):
        return None  # gone, or not visible from here: not ours


def parse_ns_pids(status: str) -> list[int]:
    """The NSpid line of /proc/<pid>/status: one PID per nested PID namespace."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return [int(field) for field in line.split()[1:]]
    return []


def in_pid_namespace(fs: NodeFS) -> bool:
    """Whether we run in a PID namespace below the host's (a container without hostPID)."""
    try:
        return len(parse_ns_pids(read_text(fs.proc("self", "status")))) > 1
    except ReadError:
        return False


def parse_mems_allowed(status: str) -> frozenset[int] | None:
    """The Mems_allowed_list line of /proc/<pid>/status; None when absent or garbled."""
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == "Mems_allowed_list":
            try:
                return parse_cpulist(value.strip())
            except ValueError:
                return None
    return None


def memory_nodes_allowed(fs: NodeFS) -> frozenset[int] | None:
    """The NUMA nodes this process may allocate on (Mems_allowed_list of
    /proc/self/status), which libnuma checks a --membind against; None when it cannot be
    read (numactl then judges alone)."""
    try:
        status = read_text(fs.proc("self", "status"))
    except ReadError:
        return None
    return parse_mems_allowed(status)


def read_maintenance_note(fs: NodeFS, maintenance_file: str) -> tuple[Path, str | None]:
    """The maintenance file under the root filesystem and its text: None when absent, ""
    when present but unreadable (it exists: it is honoured)."""
    path = fs.host(maintenance_file)
    try:
        return path, read_optional_text(path)
    except ReadError:
        return path, ""
