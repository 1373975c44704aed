"""The calling environment as `tune` and `exec` read it: only the names they use, filtered
as the environment is read, so that a capture carries no secret (`HF_TOKEN`,
`AWS_SECRET_ACCESS_KEY` and everything else a shell holds never enter the facts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field

from nodecheck.checks.node.variables import AUDITED_PREFIXES
from nodecheck.checks.record import record

# Names read beside the audited prefixes (node/variables.py): the launchers' job size
# (Slurm's sbatch(1) OUTPUT ENVIRONMENT VARIABLES; torchrun's WORLD_SIZE and
# LOCAL_WORLD_SIZE), the GPUs Slurm gave the job step, the local rank as each launcher
# names it (torchrun, srun, Open MPI, MPICH/Intel MPI) and OpenMP's thread count, which
# tune sets per rank. None of their values is ever shown (they are not audited).
# MASTER_ADDR and GLOO_SOCKET_IFNAME are not kept at all: the master_addr_route part
# keeps only which interface's subnet holds MASTER_ADDR, the gloo_socket_ifname part only
# whether GLOO_SOCKET_IFNAME is set and which of this node's interfaces it names.
CALLING_NAMES = frozenset(
    {
        "OMP_NUM_THREADS",
        "SLURM_JOB_NUM_NODES",
        "SLURM_NNODES",
        "SLURM_STEP_GPUS",
        "SLURM_JOB_GPUS",
        "SLURM_LOCALID",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
    }
)


def kept_name(name: str) -> bool:
    """Whether `tune` and `exec` read this variable (and a capture may carry it)."""
    return name in CALLING_NAMES or name.startswith(AUDITED_PREFIXES)


@record
class CallingEnvironment:
    """The kept variables of the environment nodecheck was called with, by name."""

    values: dict[str, str] = field(default_factory=dict)


def read_calling_environment(environ: Mapping[str, str]) -> CallingEnvironment:
    return CallingEnvironment({name: value for name, value in environ.items() if kept_name(name)})
