"""`nodecheck tune` and `nodecheck exec`: a node's plan for a job's ranks (tuning/plan.py),
shown (agent/launch/tune_view.py) or applied to one rank's command (agent/launch/rank_exec.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from nodecheck.agent.cli.options import (
    EXIT_INTERNAL,
    EXIT_USAGE,
    NODE_READ_TIMEOUT_S,
    cannot_without,
    facts_option,
    fail_usage,
    global_options,
    job_options,
    load_facts,
    local_rank_option,
    node_fs,
    of_capture,
    say,
)

if TYPE_CHECKING:
    from nodecheck.checks.node.job_python import JobPython
    from nodecheck.tuning.plan import Plan

F = TypeVar("F", bound=Callable[..., Any])

# What the torch and NCCL versions of the job are read from, and what that costs: said in
# the options' help and in docs/tuning.md.
PYTHON_HELP = (
    "The job's Python: an interpreter (/opt/venv/bin/python) or an environment's folder "
    "(a venv or conda prefix). torch's and NCCL's versions are read from its package "
    "metadata, never by importing torch: a venv or conda environment is read as it lies "
    "(no process started, about a millisecond); another interpreter (the system's, or a "
    "venv that includes the system's site-packages) is started once with -S to print its "
    "paths (some tens of ms, at most 10 s)."
)


def python_option(help_text: str) -> Callable[[F], F]:
    return click.option(
        "--python",
        "job_python",
        default=None,
        metavar="PATH",
        help=help_text,
    )


def tune_plan(
    ctx: click.Context,
    nodes: int | None,
    single_switch: bool,
    with_smt_siblings: bool,
    timeout_s: float = NODE_READ_TIMEOUT_S,
    job_python: JobPython | None = None,
) -> Plan:
    """The plan for this node, read within `timeout_s` (exit 3 when it could not be);
    `job_python` the Python the job runs, where it was named."""
    fs = node_fs(ctx)
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.runner import UnfinishedError, run_bounded
    from nodecheck.tuning.nccl import JobShape
    from nodecheck.tuning.plan import TuneOptions, make_plan

    def plan() -> Plan:
        options = TuneOptions(
            shape=JobShape(nodes, single_switch), with_smt_siblings=with_smt_siblings
        )
        # Every part make_plan reads (the cpuset, the job's torch version, ...) comes
        # through the context: over a loaded capture, the same call plans another node.
        context = CheckContext(
            fs=fs, environ=dict(os.environ), uid=os.getuid(), job_python=job_python
        )
        return make_plan(context, options)

    try:
        # A read that blocks in the kernel (a wedged device's attribute) must not hang us.
        return run_bounded(plan, "reading the node", timeout_s)
    except UnfinishedError as err:
        say(f"nodecheck: {err}", err=True)
        sys.exit(EXIT_INTERNAL)


def named_python(path: str | None, by_command: bool = False) -> JobPython | None:
    """The Python the job runs as the user named it: --python's PATH (an empty one is a
    usage error), or exec's CMD, taken as it is: its versions are read at best (a name
    that is not found or not Python leaves them unknown, said in a note), and whether
    CMD runs at all is exec's to say (127, 126)."""
    if path is None:
        return None
    if not by_command and (not path.strip() or not path.isprintable()):
        fail_usage("--python: give the path of the job's interpreter or environment")
    from nodecheck.checks.node.job_python import EXEC_COMMAND, JobPython

    return JobPython(path, EXEC_COMMAND if by_command else "--python")


def _tune_plan_of_capture(
    ctx: click.Context,
    facts_path: Path,
    nodes: int | None,
    single_switch: bool,
    with_smt_siblings: bool,
) -> Plan:
    """The plan for a captured node: make_plan over the capture's parts (its cpuset, torch
    version and calling environment included), nothing read here."""
    facts = load_facts(ctx, facts_path)
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.node.facts import PartUnavailableError
    from nodecheck.tuning.nccl import JobShape
    from nodecheck.tuning.plan import TuneOptions, make_plan

    options = TuneOptions(shape=JobShape(nodes, single_switch), with_smt_siblings=with_smt_siblings)
    try:
        return of_capture(facts_path, lambda: make_plan(CheckContext(facts=facts), options))
    except PartUnavailableError as err:
        cannot_without("plan the node", err)


@click.command("tune")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "shell", "env", "json"]),
    default=None,
    help="text: a table with reasons; shell: export lines for bash; env: a systemd "
    "EnvironmentFile; json: the nodecheck.tune/v1 document. [default: text on a "
    "terminal, else shell]",
)
@local_rank_option("Only this local rank (and its own variables in shell and env output).")
@job_options
@python_option(
    PYTHON_HELP + " [default: the running GPU processes' mapped libraries, else unknown: "
    "renamed variables are set under both names]"
)
@facts_option
@global_options
@click.pass_context
def tune(
    ctx: click.Context,
    output_format: str | None,
    local_rank: int | None,
    nodes: int | None,
    single_switch: bool,
    with_smt_siblings: bool,
    job_python: str | None,
    facts_path: Path | None,
) -> None:
    """Recommend CPU/NUMA bindings and NCCL, allocator and thread settings per local rank.

    Each recommendation carries its reason and source, marked keep, set, change
    or unset against the current environment. Local rank N drives the Nth GPU
    in PCI bus order (of CUDA_VISIBLE_DEVICES, when set). With --local-rank N
    naming a rank that must not run (exec refuses it), it exits 2, and its shell
    output fails when evaluated. It exits 3 when what it needs of the node could not be
    determined (a capture without the part, or one that records it unread).
    """
    if facts_path is not None:
        if job_python is not None:
            fail_usage("--python reads this node's Python; a capture (--facts) holds its own")
        plan = _tune_plan_of_capture(ctx, facts_path, nodes, single_switch, with_smt_siblings)
    else:
        plan = tune_plan(
            ctx, nodes, single_switch, with_smt_siblings, job_python=named_python(job_python)
        )
    from nodecheck.agent.launch.tune_view import RENDERERS, refused_rank

    if local_rank is not None and plan.rank(local_rank) is None:
        visible = len(plan.ranks)
        fail_usage(
            f"--local-rank {local_rank}: "
            + (f"this node has {visible} GPU rank(s), 0-{visible - 1}" if visible else "no GPU")
            # Why (the plan's first note when it has no rank: exec says the same).
            + (f": {plan.unseen or plan.notes[0]}" if plan.unseen or not visible else "")
        )
    if plan.python_problem:
        say(f"nodecheck tune: warning: {plan.python_problem}", err=True)
    chosen = output_format or ("text" if sys.stdout.isatty() else "shell")
    click.echo(RENDERERS[chosen](plan, local_rank), nl=False)
    refusal = refused_rank(plan, local_rank)
    if refusal:
        # A rank exec refuses: a launcher must not start it either.
        say(f"nodecheck tune: {refusal}", err=True)
        ctx.exit(EXIT_USAGE)


@click.command("exec", context_settings={"allow_interspersed_args": False})
@local_rank_option(
    "The local rank. [default: LOCAL_RANK, the MPI launcher's (OMPI_COMM_WORLD_LOCAL_RANK, "
    "MPI_LOCALRANKID, ...), SLURM_LOCALID]"
)
@job_options
@python_option(
    PYTHON_HELP + " [default: CMD's own, when CMD is a Python interpreter or a script whose "
    "shebang names one (torchrun): exec is about to start it anyway]"
)
@click.option("--quiet", is_flag=True, help="Do not print what was applied to stderr.")
@global_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
@click.pass_context
def exec_command(
    ctx: click.Context,
    local_rank: int | None,
    nodes: int | None,
    single_switch: bool,
    with_smt_siblings: bool,
    job_python: str | None,
    quiet: bool,
    command: tuple[str, ...],
) -> None:
    """Run CMD bound to its local rank's CPUs and NUMA node, with that rank's environment.

    For launchers: torchrun --no-python nodecheck exec -- python train.py, or
    srun nodecheck exec -- python train.py. Exit status: CMD's own; 1 when the kernel
    refuses the rank's CPUs or numactl could not apply its binding here (CPUs or a NUMA
    node this process may not use); 2 for a bad or missing rank, no GPU for it, a rank
    that must not run, or no CMD; 126 when CMD cannot be run; 127 when CMD is not found.
    """
    from nodecheck.agent.launch.rank_exec import ExecError, local_rank_from, prepare, rank_plan_for

    try:
        if not command:
            raise ExecError("no command: nodecheck exec [OPTIONS] -- CMD [ARGS...]", EXIT_USAGE)
        rank = local_rank_from(local_rank, os.environ)
        # The Python the job runs: --python, else CMD itself (checks/node/job_python.py
        # tells an interpreter or a Python script from anything else).
        named = named_python(job_python) or named_python(command[0], by_command=True)
        plan = tune_plan(ctx, nodes, single_switch, with_smt_siblings, job_python=named)
        launch = prepare(plan, rank_plan_for(plan, rank.rank), list(command), os.environ, rank)
        from nodecheck.agent.launch.rank_exec import replace_process

        replace_process(launch, quiet)
    except ExecError as err:
        say(f"nodecheck exec: {err}", err=True)
        ctx.exit(err.code)
