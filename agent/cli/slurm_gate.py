"""`nodecheck slurm prolog` and `slurm epilog`: a gate's checks on this node under a
budget (agent/slurm/prolog.py judges them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from nodecheck.agent.cli.options import (
    CONFIG_OPTION,
    F,
    FiniteFloatRange,
    check_config,
    expected_gpus_option,
    global_options,
    kernel_log_option,
    node_fs,
    settings,
)
from nodecheck.checks.config import BUDGET_RANGE_S, DEFAULT_EPILOG_BUDGET_S, DEFAULT_PROLOG_BUDGET_S


def gate_options(default_budget_s: float) -> Callable[[F], F]:
    """What `slurm prolog` and `slurm epilog` are told: the GPUs expected, the budget,
    whether this is a dry run."""

    def decorate(function: F) -> F:
        function = CONFIG_OPTION(function)  # its state_dir, where a failure is recorded
        function = expected_gpus_option("stops the job")(function)
        function = click.option(
            "--dry-run",
            is_flag=True,
            help="Say on stderr whether it would fail (and Slurm drain the node), and pass.",
        )(function)
        return click.option(
            "--budget",
            "budget_s",
            type=FiniteFloatRange(*BUDGET_RANGE_S),
            default=default_budget_s,
            metavar="SECONDS",
            help="Give up on the checks after this long in all (then it passes, saying so). "
            f"[default: {default_budget_s:g}]",
        )(function)

    return decorate


def _run_gate(
    ctx: click.Context,
    config_path: Path | None,
    command: str,
    names: tuple[str, ...] | None,
    expected_gpus: int | None,
    budget_s: float,
    kernel_log: Path | None,
    dry_run: bool,
) -> int:
    """Run a gate's checks on this node and say its verdict on stderr; its exit status
    (0 on a dry run, which says what it would have been)."""
    fs = node_fs(ctx)
    from nodecheck.agent.slurm.prolog import run_gate, say
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.node.nvml import NvmlSession

    config = check_config(ctx, expected_gpus=expected_gpus)
    # No NVML call may take the whole budget: a hung GPU is then an error, not a hang.
    nvml = NvmlSession(
        deadline_s=min(config.nvml_timeout_s, budget_s / 2),
        library_path=settings(ctx)["nvml_library"],
    )
    context = CheckContext(fs=fs, nvml=nvml, kernel_log=kernel_log, config=config)
    # The prolog judges the job's GPUs only (SLURM_JOB_GPUS, in its environment).
    import os

    outcome = run_gate(
        command, context, names, budget_s, os.environ if command == "prolog" else None
    )
    say(outcome)
    if dry_run and outcome.code != 0:
        click.echo(
            f"nodecheck {command}: dry run (--dry-run): would exit {outcome.code}, and Slurm "
            f"drain the node ({command.capitalize()} error); passing",
            err=True,
        )
        return 0
    if outcome.code != 0:
        import time

        from nodecheck.agent.slurm.prolog import record_failure

        problem = record_failure(config_path, command, outcome, os.environ, time.time())
        if problem:
            click.echo(problem, err=True)
    return outcome.code


@click.command("prolog")
@gate_options(DEFAULT_PROLOG_BUDGET_S)
@kernel_log_option
@global_options
@click.pass_context
def slurm_prolog(
    ctx: click.Context,
    config_path: Path | None,
    expected_gpus: int | None,
    budget_s: float,
    kernel_log: Path | None,
    dry_run: bool,
) -> None:
    """The gate before a job, for slurm.conf's Prolog= (as root, on the node).

    Runs the GPU checks (gpu_count, gpu_xid, gpu_memory_errors) under a budget and
    exits 1 only when the node is unusable for any job: a GPU lost, a drain-class XID,
    uncorrectable memory errors, fewer GPUs than expected; Slurm then drains the node
    and requeues the job. Anything else (warn, error, a slow link) passes with a line
    on stderr. It never calls a Slurm command.
    """
    from nodecheck.agent.slurm.prolog import gate_checks

    ctx.exit(
        _run_gate(
            ctx, config_path, "prolog", gate_checks(), expected_gpus, budget_s, kernel_log, dry_run
        )
    )


@click.command("epilog")
@gate_options(DEFAULT_EPILOG_BUDGET_S)
@kernel_log_option
@global_options
@click.pass_context
def slurm_epilog(
    ctx: click.Context,
    config_path: Path | None,
    expected_gpus: int | None,
    budget_s: float,
    kernel_log: Path | None,
    dry_run: bool,
) -> None:
    """The checks after a job, for slurm.conf's Epilog= (as root, on the node).

    Runs every quick check (never a benchmark) under a budget; exits 1, and Slurm drains
    the node, only on what makes it unusable (as the prolog); the rest on stderr.
    """
    from nodecheck.agent.slurm.prolog import NO_BENCHMARKS_HERE

    click.echo(f"nodecheck epilog: {NO_BENCHMARKS_HERE}", err=True)
    ctx.exit(
        _run_gate(ctx, config_path, "epilog", None, expected_gpus, budget_s, kernel_log, dry_run)
    )
