"""The CPUs this process's cgroup lets it run on (`<procfs>/self/cgroup` and the cpuset).

A Slurm job step, a container or a systemd slice confines its processes to a
cpuset. A binding must stay inside it: the kernel refuses an affinity with no
allowed CPU (EINVAL) and silently narrows one that is partly outside.

The cpuset, not `sched_getaffinity`, is the limit: `srun --cpu-bind` or a
launcher may already have narrowed this process's affinity to a few cores, and
a process may widen its own affinity anywhere inside its cpuset.

Files (Documentation/admin-guide/cgroup-v2.rst, cgroup-v1/cpusets.rst):
  v2: `0::/path` in /proc/self/cgroup; `<cgroup2>/path/cpuset.cpus.effective`,
      present only where the cpuset controller is enabled (else an ancestor's holds).
  v1: `N:cpuset:/path`; `<cgroup>/cpuset/path/cpuset.effective_cpus`.
"""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath

from nodecheck.checks.node.cpulist import cpu_id_bound, parse_cpulist
from nodecheck.checks.node.fs import NodeFS, ReadError, read_optional_text

log = logging.getLogger(__name__)


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


def _ancestors(base: Path, cgroup_path: str) -> list[Path]:
    """The cgroup's directory and each parent up to the hierarchy's root, nearest first."""
    relative = PurePosixPath(cgroup_path.lstrip("/"))
    chain = [relative, *relative.parents] if relative.parts else [relative]
    return [base / str(part) if str(part) != "." else base for part in chain]


def read_allowed_cpus(fs: NodeFS) -> frozenset[int] | None:
    """CPUs of this process's cpuset; None when there is no cpuset to read (no
    cgroup file, as under a captured node tree, or no cpuset controller)."""
    try:
        text = read_optional_text(fs.proc("self", "cgroup"))
    except ReadError:
        return None
    if not text:
        return None
    paths = parse_proc_cgroup(text)
    candidates: list[Path] = []
    if "cpuset" in paths:
        base = fs.sys("fs", "cgroup", "cpuset")
        candidates += [d / "cpuset.effective_cpus" for d in _ancestors(base, paths["cpuset"])]
    if "" in paths:
        base = fs.sys("fs", "cgroup")
        candidates += [d / "cpuset.cpus.effective" for d in _ancestors(base, paths[""])]
    for candidate in candidates:
        try:
            value = read_optional_text(candidate)
        except ReadError:
            continue
        if value:
            try:
                return parse_cpulist(value, cpu_id_bound(fs))
            except ValueError as err:
                # Not a cpuset the kernel could hold: bind as if there were none, and say so.
                log.warning("event=bad_cpuset path=%r error=%r", str(candidate), str(err))
                return None
    return None
