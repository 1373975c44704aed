"""`nodecheck slurm task-prolog`: one task's tune environment as TaskProlog lines
(agent/slurm/task.py)."""

from __future__ import annotations

import os

import click

from nodecheck.agent.cli.options import global_options, job_options, local_rank_option, log
from nodecheck.agent.cli.tune import tune_plan

# A task waits for its prolog: a few seconds at most (a healthy node plans in 0.1 s).
TASK_PROLOG_TIMEOUT_S = 5.0


@click.command("task-prolog")
@local_rank_option("The task's local rank. [default: SLURM_LOCALID]")
@job_options
@global_options
@click.pass_context
def slurm_task_prolog(
    ctx: click.Context,
    local_rank: int | None,
    nodes: int | None,
    single_switch: bool,
    with_smt_siblings: bool,
) -> None:
    """This task's tune environment, for slurm.conf's TaskProlog=.

    Prints the export NAME=value and unset NAME lines slurmstepd applies to the task
    (its local rank from SLURM_LOCALID, its GPU from CUDA_VISIBLE_DEVICES or
    SLURM_STEP_GPUS; its threads from its own CPUs), a print line only for a rank that
    must not run, and its notes on stderr (never into the job's output). Exit status 2, with
    nothing exported, for a rank that must not run here (its GPU lost) or no local rank
    at all; a task beyond the node's GPUs, or on a node without GPUs, gets nothing set
    and exit status 0.
    """
    from nodecheck.agent.slurm.task import (
        EXIT_MUST_NOT_RUN,
        TaskPrologError,
        local_rank_of_task,
        print_line,
        task_prolog_lines,
    )

    try:
        rank = local_rank_of_task(local_rank, os.environ)
    except TaskPrologError as err:
        click.echo(print_line(f"nodecheck task-prolog: {err}"))
        ctx.exit(EXIT_MUST_NOT_RUN)
    # Tuning is advice: a node that cannot be read in time, or a plan that fails, must
    # not cancel every task (a non-zero TaskProlog exit does). The task runs as it is,
    # and its user reads why in a `print` line.
    try:
        plan = tune_plan(
            ctx, nodes, single_switch, with_smt_siblings, timeout_s=TASK_PROLOG_TIMEOUT_S
        )
    except SystemExit:
        click.echo(
            print_line("nodecheck task-prolog: the node could not be read in time; no tuning")
        )
        ctx.exit(0)
    except Exception as err:
        log.debug("event=task_prolog_failed", exc_info=err)
        click.echo(print_line(f"nodecheck task-prolog: no tuning ({type(err).__name__}: {err})"))
        ctx.exit(0)
    affinity = _task_affinity(ctx)
    lines, notes, code = task_prolog_lines(plan, rank, os.environ, affinity)
    for line in lines:
        click.echo(line)
    for note in notes:
        say_on_stderr(note)
    ctx.exit(code)


def _task_affinity(ctx: click.Context) -> set[int] | None:
    """The CPUs this process may run on, slurmstepd's for the task, when the node read
    is this machine (a replica's or a capture's tasks have no affinity here)."""
    from nodecheck.agent.cli.options import node_fs
    from nodecheck.checks.node.inventory import is_live_procfs

    if not is_live_procfs(node_fs(ctx)):
        return None
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None


def say_on_stderr(line: str) -> None:
    """A note for slurmd's log; nothing lost when slurmstepd gave no stderr."""
    import contextlib

    from nodecheck.checks.printable import printable

    with contextlib.suppress(OSError, ValueError):
        click.echo(printable(line), err=True)
