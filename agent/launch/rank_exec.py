"""`nodecheck exec`: apply one local rank's binding and environment, then become CMD.

    torchrun --nproc-per-node 8 --no-python nodecheck exec -- python train.py
    srun --ntasks-per-node 8 nodecheck exec -- python train.py

The rank comes from --local-rank, else the launcher (RANK_VARIABLES): torchrun's
LOCAL_RANK, then the MPI launchers', then Slurm's SLURM_LOCALID, which comes last
because a batch script carries its own (0) into every process an mpirun inside it
starts. When two of them disagree the one taken is said, and the other named. The
child gets LOCAL_RANK where the launcher did not set it (srun, mpirun), as torch's
code reads that one. The binding goes through numactl when it is installed (CPUs and
memory); otherwise through sched_setaffinity, which binds the CPUs only.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping

from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.processes import memory_nodes_allowed
from nodecheck.checks.node.variables import parse_count
from nodecheck.checks.printable import printable
from nodecheck.checks.record import record
from nodecheck.tuning.plan import Plan, RankPlan
from nodecheck.tuning.recommendation import Action

# Each launcher's local rank, the one nearest the process first: torchrun's; Open MPI's
# (and PRRTE's, https://docs.open-mpi.org/en/main/tuning-apps/environment-var.html);
# MPICH Hydra's and Intel MPI's; MVAPICH2's; Cray PALS's (aprun, mpiexec on HPE Cray
# EX); Slurm's last: sbatch and salloc set SLURM_LOCALID for the batch step, and an
# mpirun inside it hands that to all its ranks, where its own variable is each rank's.
RANK_VARIABLES = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
    "SLURM_LOCALID",
)
EXIT_USAGE = 2
EXIT_CANNOT_APPLY = 1
EXIT_NOT_EXECUTABLE = 126  # as a shell reports a command it cannot run
EXIT_NOT_FOUND = 127


class ExecError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@record
class LocalRank:
    """The rank taken, where from ("--local-rank" or a variable), and the warning when a
    launcher variable says another."""

    rank: int
    source: str
    warning: str = ""


def local_rank_from(option: int | None, environ: Mapping[str, str]) -> LocalRank:
    """The local rank: the option, else the first launcher variable set (RANK_VARIABLES);
    a warning naming both where another one set says otherwise."""
    found: list[tuple[str, int]] = []
    for name in RANK_VARIABLES:
        value = environ.get(name)
        if value is None:
            continue
        rank = parse_count(value)
        if rank is None:
            if option is not None or found:
                continue  # not the one taken: a stray variable does not stop the launch
            # Its value is not shown: only audited variables' values ever leave nodecheck.
            raise ExecError(
                f"{name} is set but is not a local rank (a non-negative integer): "
                "pass --local-rank N",
                EXIT_USAGE,
            )
        found.append((name, rank))
    if option is not None:
        taken = LocalRank(option, "--local-rank")
    elif found:
        taken = LocalRank(found[0][1], found[0][0])
    else:
        raise ExecError(
            "no local rank: pass --local-rank N, or run under a launcher that sets "
            f"{' or '.join(RANK_VARIABLES)} (torchrun, srun, mpirun)",
            EXIT_USAGE,
        )
    others = [f"{name}={rank}" for name, rank in found if rank != taken.rank]
    if others:
        warning = (
            f"local rank {taken.rank} from {taken.source}, but {', '.join(others)} says otherwise"
        )
        if any(other.startswith("SLURM_LOCALID=") for other in others):
            warning += " (an mpirun inside a Slurm batch step hands it the step's SLURM_LOCALID)"
        return LocalRank(taken.rank, taken.source, warning)
    return taken


def rank_plan_for(plan: Plan, local_rank: int) -> RankPlan:
    """The rank's plan; refused when CUDA cannot drive its GPU (a job started there would
    fail at its first CUDA call with "invalid device ordinal", or worse run on a GPU that
    another rank drives, and the node needs draining anyway), or when the rank has no CPU
    to run on: exit 2 with the reason."""
    rank = plan.rank(local_rank)
    if rank is not None and rank.refusal:
        raise ExecError(f"local rank {local_rank}: {rank.refusal}", EXIT_USAGE)
    if rank is not None and rank.error:
        # No CPU to bind it to: an empty affinity is EINVAL in sched_setaffinity(2), and
        # numactl refuses --physcpubind= with nothing after it.
        raise ExecError(f"local rank {local_rank}: {rank.error}", EXIT_USAGE)
    if rank is not None:
        return rank
    if not plan.ranks:
        raise ExecError(f"no GPU for local rank {local_rank}: {plan.notes[0]}", EXIT_USAGE)
    unseen = f": {plan.unseen}" if plan.unseen else ""
    raise ExecError(
        f"no GPU for local rank {local_rank}: this node has {len(plan.ranks)} visible "
        f"(local ranks 0-{len(plan.ranks) - 1}){unseen}",
        EXIT_USAGE,
    )


@record
class Launch:
    argv: list[str]
    env: dict[str, str]
    affinity: frozenset[int]
    summary: str
    # Printed even with --quiet: a GPU of the node CUDA cannot drive, a binding that may
    # not be this rank's GPU.
    warnings: tuple[str, ...] = ()
    # The rank and the NUMA node numactl is handed (--membind), when it is.
    local_rank: int = 0
    membind: int | None = None


def applied_environment(
    plan: Plan, rank: RankPlan, environ: Mapping[str, str]
) -> tuple[dict[str, str], list[str], list[str], list[str]]:
    """The child's environment: (env, names set, names unset, names kept though flagged
    or advised against).

    What the user set and works stays: an advisory change (their NCCL_SOCKET_IFNAME
    where another interface is faster) and a warning (NCCL_DEBUG=INFO, NCCL_PROTO=^LL128
    as a workaround) are theirs to decide, and `nodecheck tune` explains them. A value
    the checks fail (NCCL_P2P_DISABLE=1 on NVLink, an allocator setting torch rejects)
    is replaced or removed.
    """
    env = dict(environ)
    changed: list[str] = []
    recommendations = [r for r in plan.env + rank.env if r.value is not None]
    # Names whose working value the user keeps, known before any is applied: a name that
    # must agree with one of them (same_as) is left alone too, in whichever order they come.
    kept = [
        r.name
        for r in recommendations
        if env.get(r.name) != r.value and r.action is Action.CHANGE and r.advisory
    ]
    for recommendation in recommendations:
        name, value = recommendation.name, recommendation.value
        if value is None or env.get(name) == value or name in kept:
            continue
        if recommendation.same_as in kept and recommendation.current is None:
            # Set, it would override the user's value kept under the other name; one the
            # user set here that is not kept (no count, a value torch rejects) is replaced.
            continue
        env[name] = value
        changed.append(name)
    removed = []
    for removal in plan.removals:
        name = removal.name
        if removal.current is None or name in changed or env.get(name) != removal.current:
            continue  # found elsewhere (a file, another job), or already replaced
        if removal.severity == "fail":
            del env[name]
            removed.append(name)
        else:
            kept.append(name)
    return env, changed, removed, kept


def _not_runnable(path: str) -> str | None:
    """Why the file at `path` cannot be executed, or None when it can (as far as stat
    and access(2) say: execve may still refuse it, a noexec mount for one)."""
    if os.path.isdir(path):
        return "a directory"
    if not os.access(path, os.X_OK):
        return "no execute permission"
    return None


def check_command(name: str, search_path: str) -> None:
    """ExecError unless `name` can be run, with the POSIX shell's statuses (Shell Command
    Language, 2.8.2 "Exit Status for Commands"): 127 when it is not found, 126 when it is
    found but cannot be run. A name with a slash is that file; a bare name is looked up in
    `search_path` as execvp(3) does, where a directory is passed over and a file found
    without the execute bit is what is reported (bash says "Permission denied")."""
    quoted = shlex.quote(name)
    if "/" in name:
        if not os.path.exists(name):
            raise ExecError(f"{quoted}: command not found (no such file)", EXIT_NOT_FOUND)
        why = _not_runnable(name)
        if why is not None:
            raise ExecError(f"{quoted}: cannot be run: {why}", EXIT_NOT_EXECUTABLE)
        return
    if shutil.which(name, path=search_path) is not None:
        return
    for directory in search_path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate):
            why = _not_runnable(candidate)
            raise ExecError(f"{quoted}: cannot be run: {candidate}: {why}", EXIT_NOT_EXECUTABLE)
    raise ExecError(f"{quoted}: command not found", EXIT_NOT_FOUND)


def prepare(
    plan: Plan,
    rank: RankPlan,
    command: list[str],
    environ: Mapping[str, str],
    local_rank: LocalRank | None = None,
) -> Launch:
    """The command line, environment and affinity that apply `rank` to `command` (one
    word at least); `local_rank` where it came from (its warning is shown, and the child
    gets LOCAL_RANK where it is not set)."""
    path = environ.get("PATH", os.defpath)
    check_command(command[0], path)
    env, changed, removed, kept = applied_environment(plan, rank, environ)
    if "LOCAL_RANK" not in env:
        # torch's launch code, Lightning, Accelerate read LOCAL_RANK; srun and mpirun
        # set only their own variable.
        env["LOCAL_RANK"] = str(rank.binding.local_rank)
        changed.append("LOCAL_RANK")
    binding = rank.binding
    where = (
        f"local rank {binding.local_rank} -> GPU {binding.gpu}, NUMA node "
        f"{'?' if binding.numa_node is None else binding.numa_node}, CPUs {rank.cpulist}"
    )
    numactl = shutil.which("numactl", path=path)
    if numactl is not None:
        argv = [numactl, *binding.numactl()[1:], "--", *command]
        how = "through numactl"
    else:
        argv = list(command)
        how = (
            "numactl is not installed: CPU affinity only, memory is not bound "
            "(it follows first touch)"
        )
    summary = f"nodecheck exec: {where}; {how}"
    if changed:
        summary += f"; set {', '.join(changed)}"
    if removed:
        summary += f"; unset {', '.join(removed)}"
    if kept:
        summary += f"; kept your {', '.join(kept)} (see nodecheck tune)"
    # The DataLoader's share is the script's to take: exec can only say what it is.
    summary += (
        f"; CPU budget: {rank.budget.split()}: DataLoader(num_workers="
        f"{rank.dataloader.num_workers}, pin_memory=True) in the script"
    )
    if plan.left_out:
        summary += (
            f"; not counted, not meant for this host or container: GPU "
            f"{', '.join(plan.left_out)} (see nodecheck tune)"
        )
    # Which torch and NCCL the renamed variables followed, and where each came from.
    summary += f"; versions: {plan.torch.describe()}; {plan.nccl.describe()}"
    warnings = (
        *([plan.python_problem] if plan.python_problem else []),
        *plan.unusable,
        *([rank.warning] if rank.warning else []),
        *([local_rank.warning] if local_rank is not None and local_rank.warning else []),
    )
    membind = binding.membind if numactl is not None else None
    return Launch(
        argv, env, frozenset(binding.cpus), summary, warnings, binding.local_rank, membind
    )


def check_numactl_can_apply(launch: Launch, here: NodeFS) -> None:
    """Refuse, in one line, what numactl would refuse with its whole usage text: CPUs
    outside this process's affinity once it is set (--physcpubind is checked against
    it) or a memory node outside the nodes this process may use (--membind). `here`:
    this machine's procfs, where numactl runs, whatever tree the plan was read from."""
    if os.path.basename(launch.argv[0]) != "numactl":
        return
    cannot = f"local rank {launch.local_rank}: numactl cannot apply this binding here"
    outside = launch.affinity - os.sched_getaffinity(0)
    if outside:
        raise ExecError(
            f"{cannot}: CPUs {format_cpulist(outside)} are outside this process's affinity "
            f"({format_cpulist(os.sched_getaffinity(0))}) once set (the cpuset narrows it)",
            EXIT_CANNOT_APPLY,
        )
    allowed = memory_nodes_allowed(here)
    if launch.membind is not None and allowed is not None and launch.membind not in allowed:
        raise ExecError(
            f"{cannot}: --membind={launch.membind} names a NUMA node this process may not "
            f"allocate on (Mems_allowed_list {format_cpulist(allowed)}); was the plan read "
            "from another node's tree (--sysfs-root)?",
            EXIT_CANNOT_APPLY,
        )


def replace_process(launch: Launch, quiet: bool, here: NodeFS | None = None) -> None:
    """Bind, then exec; returns only by raising ExecError.

    The CPU affinity is set here in every case: a launcher may have narrowed this
    process's affinity already (srun --cpu-bind, mpirun --bind-to, taskset), and numactl
    accepts only CPUs inside the affinity it starts with; a process may widen its own
    affinity anywhere inside its cpuset. A binding numactl cannot apply on this machine
    is refused in one line (exit 1) rather than left to numactl's usage text.
    Its lines on stderr are escaped (checks/printable.py): they name the job's variables.
    """
    for warning in launch.warnings:
        print(printable(f"nodecheck exec: warning: {warning}"), file=sys.stderr, flush=True)
    if launch.affinity:
        try:
            os.sched_setaffinity(0, launch.affinity)
        except OSError as err:
            raise ExecError(
                f"cannot bind to CPUs {format_cpulist(launch.affinity)}: {err.strerror}",
                EXIT_CANNOT_APPLY,
            ) from err
    check_numactl_can_apply(launch, NodeFS() if here is None else here)
    if not quiet:
        print(printable(launch.summary), file=sys.stderr, flush=True)
    try:
        os.execvpe(launch.argv[0], launch.argv, launch.env)
    except FileNotFoundError as err:
        raise ExecError(f"{launch.argv[0]}: command not found", EXIT_NOT_FOUND) from err
    except PermissionError as err:
        raise ExecError(
            f"{shlex.quote(launch.argv[0])}: cannot be run: permission denied",
            EXIT_NOT_EXECUTABLE,
        ) from err
    except OSError as err:
        raise ExecError(
            f"{shlex.quote(launch.argv[0])}: cannot be run: {err.strerror}", EXIT_NOT_EXECUTABLE
        ) from err
