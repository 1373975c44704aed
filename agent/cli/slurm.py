"""`nodecheck slurm`: the group of Slurm's hooks, each imported only when it is run
(agent/cli/lazy.py), as the commands of `nodecheck` are."""

from __future__ import annotations

import click

from nodecheck.agent.cli.lazy import LazyGroup, command_in
from nodecheck.agent.cli.options import global_options

# Each subcommand's module, and the first sentence of its help, as `slurm --help` lists it.
SLURM_COMMANDS = {
    "epilog": command_in(
        "slurm_gate",
        "slurm_epilog",
        "The checks after a job, for slurm.conf's Epilog= (as root, on the node).",
    ),
    "health-check": command_in(
        "slurm_health",
        "slurm_health_check",
        "For HealthCheckProgram: judge this node, drain it on a failure, undrain it when healthy.",
    ),
    "prolog": command_in(
        "slurm_gate",
        "slurm_prolog",
        "The gate before a job, for slurm.conf's Prolog= (as root, on the node).",
    ),
    "task-prolog": command_in(
        "slurm_task",
        "slurm_task_prolog",
        "This task's tune environment, for slurm.conf's TaskProlog=.",
    ),
}


@click.group("slurm", cls=LazyGroup, lazy_commands=SLURM_COMMANDS)
@global_options
def slurm() -> None:
    """Slurm's hooks: the health check (drain and resume), a prolog gate, a task prolog
    with tune's environment, an epilog."""
