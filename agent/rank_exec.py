"""`nodecheck exec`: apply one local rank's binding and environment, then become CMD.

    torchrun --nproc-per-node 8 --no-python nodecheck exec -- python train.py
    srun --ntasks-per-node 8 nodecheck exec -- python train.py

The rank comes from --local-rank, else the launcher: torchrun's LOCAL_RANK,
Slurm's SLURM_LOCALID, Open MPI's OMPI_COMM_WORLD_LOCAL_RANK, MPICH's
MPI_LOCALRANKID. The binding goes through numactl when it is installed (CPUs and
memory); otherwise through sched_setaffinity, which binds the CPUs only.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.tuning.plan import Plan, RankPlan

RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
EXIT_USAGE = 2
EXIT_CANNOT_APPLY = 1
EXIT_NOT_EXECUTABLE = 126  # as a shell reports a command it cannot run
EXIT_NOT_FOUND = 127


class ExecError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def local_rank_from(option: int | None, environ: Mapping[str, str]) -> tuple[int, str]:
    """The local rank and where it came from."""
    if option is not None:
        return option, "--local-rank"
    for name in RANK_VARIABLES:
        value = environ.get(name)
        if value is None:
            continue
        if not value.strip().isdigit():
            raise ExecError(f"{name}={value!r} is not a local rank", EXIT_USAGE)
        return int(value), name
    raise ExecError(
        "no local rank: pass --local-rank N, or run under a launcher that sets "
        f"{' or '.join(RANK_VARIABLES)} (torchrun, srun, mpirun)",
        EXIT_USAGE,
    )


def rank_plan_for(plan: Plan, local_rank: int) -> RankPlan:
    rank = plan.rank(local_rank)
    if rank is not None:
        return rank
    if len(plan.ranks) == 1:
        # One GPU visible to this process (srun --gpus-per-task=1 sets
        # CUDA_VISIBLE_DEVICES to one GPU per task): whatever its number, the rank drives it.
        return plan.ranks[0]
    if not plan.ranks:
        raise ExecError(f"no GPU for local rank {local_rank}: {plan.notes[0]}", EXIT_USAGE)
    raise ExecError(
        f"no GPU for local rank {local_rank}: this node has {len(plan.ranks)} visible "
        f"(local ranks 0-{len(plan.ranks) - 1})",
        EXIT_USAGE,
    )


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    affinity: frozenset[int] | None  # set by this process when numactl is not there
    summary: str


def prepare(plan: Plan, rank: RankPlan, command: list[str], environ: Mapping[str, str]) -> Launch:
    """The command line, environment and affinity that apply `rank` to `command`."""
    if not command:
        raise ExecError("no command: nodecheck exec [OPTIONS] -- CMD [ARGS...]", EXIT_USAGE)
    env = dict(environ)
    if shutil.which(command[0], path=env.get("PATH", os.defpath)) is None:
        raise ExecError(f"{command[0]}: command not found", EXIT_NOT_FOUND)
    values = plan.environment(rank)
    changed = [name for name, value in values.items() if env.get(name) != value]
    env.update(values)
    removed = [
        r.name
        for r in plan.removals
        if r.current is not None and r.name not in values and env.get(r.name) == r.current
    ]
    for name in removed:
        del env[name]
    binding = rank.binding
    where = (
        f"local rank {rank.local_rank} -> GPU {binding.gpu}, NUMA node "
        f"{'?' if binding.numa_node is None else binding.numa_node}, CPUs {rank.cpulist}"
    )
    numactl = shutil.which("numactl", path=env.get("PATH", os.defpath))
    affinity: frozenset[int] | None = None
    if numactl is not None:
        argv = [numactl, *binding.numactl()[1:], "--", *command]
        how = "through numactl"
    else:
        argv = list(command)
        affinity = frozenset(binding.cpus)
        how = (
            "numactl is not installed: CPU affinity only, memory is not bound "
            "(it follows first touch)"
        )
    summary = f"nodecheck exec: {where}; {how}"
    if changed:
        summary += f"; set {', '.join(changed)}"
    if removed:
        summary += f"; unset {', '.join(removed)}"
    return Launch(argv, env, affinity, summary)


def replace_process(launch: Launch, quiet: bool) -> None:
    """Bind, then exec; returns only by raising ExecError."""
    if launch.affinity is not None:
        try:
            os.sched_setaffinity(0, launch.affinity)
        except OSError as err:
            raise ExecError(
                f"cannot bind to CPUs {format_cpulist(launch.affinity)}: {err.strerror}",
                EXIT_CANNOT_APPLY,
            ) from err
    if not quiet:
        print(launch.summary, file=sys.stderr, flush=True)
    try:
        os.execvpe(launch.argv[0], launch.argv, launch.env)
    except FileNotFoundError as err:
        raise ExecError(f"{launch.argv[0]}: command not found", EXIT_NOT_FOUND) from err
    except PermissionError as err:
        raise ExecError(
            f"{shlex.quote(launch.argv[0])}: permission denied", EXIT_NOT_EXECUTABLE
        ) from err
    except OSError as err:
        raise ExecError(f"{launch.argv[0]}: {err.strerror}", EXIT_NOT_EXECUTABLE) from err
