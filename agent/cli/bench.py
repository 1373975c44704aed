"""`nodecheck bench`: the micro-benchmarks (checks/bench/), run one after another."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import click

from nodecheck.agent.cli.options import (
    MAX_GPUS_PER_NODE,
    FiniteFloatRange,
    check_config,
    fail_usage,
    global_options,
    long_lived,
    node_fs,
    nvml_session,
)
from nodecheck.checks.config import (
    BENCH_DURATION_RANGE_S,
    IDLE_WINDOW_RANGE_S,
    MEMORY_FRACTION_RANGE,
    RATIO_RANGE,
    BenchOptions,
    Thresholds,
)

BENCH_ORDER = ("matmul", "allreduce", "h2d")


def _state_dir(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """--state-dir: a directory this user can write in. nodecheck creates only its own
    default one: mkdir of a path someone typed, as root, makes folders anywhere."""
    from nodecheck.checks.config import is_default_state_dir
    from nodecheck.checks.node.output import output_directory_problem

    if value is None or is_default_state_dir(value):
        return value
    problem = output_directory_problem(value, writable=True)
    if problem:
        raise click.BadParameter(f"{value}: {problem}")
    return value


def _parse_gpus(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """NVML indices: ASCII digits (int() would also take "-1" and Arabic-Indic digits),
    below the most GPUs a node can have."""
    if value is None:
        return None
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts or not all(part.isascii() and part.isdigit() and len(part) <= 4 for part in parts):
        raise click.BadParameter(f"{value!r}: expected GPU indices like 0,1,2")
    indices = tuple(int(part) for part in parts)
    if max(indices) >= MAX_GPUS_PER_NODE:
        raise click.BadParameter(f"{value!r}: a GPU index is below {MAX_GPUS_PER_NODE}")
    return indices


class _ProgressBar:
    """One line on stderr, redrawn in place; only on a terminal."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()

    def __call__(self, name: str, fraction: float) -> None:
        if self.enabled:
            filled = int(fraction * 30)
            bar = "#" * filled + "." * (30 - filled)
            click.echo(f"\r{name:<10} [{bar}] {fraction:4.0%}", err=True, nl=False)

    def done(self) -> None:
        if self.enabled:
            click.echo("\r" + " " * 50 + "\r", err=True, nl=False)


F = TypeVar("F", bound=Callable[..., Any])


def shared_bench_options(duration: str, reference: str) -> Callable[[F], F]:
    """--duration, --state-dir, --idle-window, --warn-below and --fail-below, as `bench`
    and `bench network` both take them; `duration`: what it times, `reference`: what the
    ratios are to."""

    def apply(function: F) -> F:
        for option in reversed(
            [
                click.option(
                    "--duration",
                    type=FiniteFloatRange(*BENCH_DURATION_RANGE_S),
                    default=BenchOptions.duration_s,
                    show_default=True,
                    metavar="SECONDS",
                    help=f"Measuring time {duration}.",
                ),
                click.option(
                    "--state-dir",
                    type=click.Path(file_okay=False, path_type=Path),
                    default=None,
                    callback=_state_dir,
                    help="Where results, baselines and network.json are kept: a directory "
                    "that exists (only the default is created). [default: "
                    "/var/lib/nodecheck as root, else ~/.local/state/nodecheck]",
                ),
                click.option(
                    "--idle-window",
                    type=FiniteFloatRange(*IDLE_WINDOW_RANGE_S),
                    default=BenchOptions.idle_window_s,
                    show_default=True,
                    metavar="SECONDS",
                    help="How long every GPU must be idle before a benchmark starts.",
                ),
                *(
                    click.option(
                        f"--{verdict}-below",
                        type=FiniteFloatRange(*RATIO_RANGE, min_open=True),
                        default=getattr(Thresholds, verdict),
                        show_default=True,
                        metavar="RATIO",
                        help=f"{verdict.capitalize()} below this ratio to {reference}.",
                    )
                    for verdict in ("warn", "fail")
                ),
            ]
        ):
            function = option(function)
        return function

    return apply


class _BenchCommand(click.Command):
    """`bench WHICH [options]`; `bench network [options]` is a command of its own, with its
    own options (agent/cli/bench_network.py), imported only when it runs."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        if args[:1] == ["network"]:
            network = self.commands["network"]
            return network.make_context(f"{info_name} network", args[1:], parent, **extra)
        return super().make_context(info_name, args, parent, **extra)

    @property
    def commands(self) -> dict[str, click.Command]:
        """Its one subcommand, as a group's table names it (imported when asked for)."""
        from nodecheck.agent.cli.bench_network import network

        return {"network": network}


@click.command("bench", cls=_BenchCommand)
@click.argument("which", type=click.Choice([*BENCH_ORDER, "all", "network"]))
@click.option(
    "--gpus",
    callback=_parse_gpus,
    default=BenchOptions.gpus,
    metavar="0,1,...",
    help="NVML indices. [default: all]",
)
@click.option(
    "--dtype",
    type=click.Choice(["bf16", "fp16", "fp32"]),
    default=BenchOptions.dtype,
    show_default=True,
    help="Matmul data type.",
)
@click.option(
    "--device",
    type=click.Choice(["cuda", "cpu"]),
    default=BenchOptions.device,
    show_default=True,
    help="cpu runs the same benchmarks on the CPU (gloo for all_reduce).",
)
@click.option(
    "--processes",
    type=click.IntRange(min=2, max=64),
    default=BenchOptions.processes,
    show_default=True,
    help="all_reduce ranks with --device cpu.",
)
@shared_bench_options("per benchmark", "the node's median or the baseline")
@click.option(
    "--memory-fraction",
    type=FiniteFloatRange(*MEMORY_FRACTION_RANGE),
    default=BenchOptions.memory_fraction,
    show_default=True,
    help="Share of each GPU's free memory a benchmark may take.",
)
@click.option(
    "--idle-utilization",
    type=click.IntRange(min=0, max=100),
    default=BenchOptions.idle_utilization_pct,
    show_default=True,
    metavar="PERCENT",
    help="A GPU busier than this during the idle window keeps benchmarks off.",
)
@click.option(
    "--maintenance-file",
    default=BenchOptions.maintenance_file,
    show_default=True,
    metavar="PATH",
    help="While this file exists (under --rootfs), benchmarks do not start.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Run even if GPUs look busy or a maintenance file is present (a drained "
    "node); a process that appears during the run still stops it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the nodecheck.check/v2 JSON document.")
@global_options
@click.pass_context
def bench(
    ctx: click.Context,
    which: str,
    gpus: tuple[int, ...] | None,
    dtype: str,
    duration: float,
    device: str,
    processes: int,
    state_dir: Path | None,
    idle_window: float,
    warn_below: float,
    fail_below: float,
    memory_fraction: float,
    idle_utilization: int,
    maintenance_file: str,
    force: bool,
    as_json: bool,
) -> None:
    """Run micro-benchmarks: matmul TFLOPS, all_reduce bus bandwidth, host-device copies.

    `nodecheck bench network` (its own options: `bench network --help`) measures across
    the nodes of a job launched by srun or torchrun.

    Each runs in a child process with a deadline, only while every GPU is idle,
    and is judged against the node's other GPUs, its own history and the GPU
    model's expected rate. Same exit status as `check`, and 3 when nothing
    was measured (every benchmark skipped: busy GPUs, no GPU).
    """
    long_lived()
    if which == "network":
        fail_usage("network takes its own options after it: nodecheck bench network --help")
    if fail_below > warn_below:
        fail_usage("--fail-below must not be above --warn-below")
    if gpus is not None and (device == "cpu" or len(set(gpus)) != len(gpus)):
        fail_usage("--gpus takes distinct GPU indices, and only with --device cuda")
    fs = node_fs(ctx)
    from nodecheck.agent.cli.report import (
        EXIT_UNDETERMINED,
        exit_code,
        render_json,
        render_table,
    )
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.registry import load_benchmarks
    from nodecheck.checks.result import Status
    from nodecheck.checks.runner import run_checks

    progress = _ProgressBar()
    options = BenchOptions(
        device=device,
        gpus=gpus,
        dtype=dtype,
        duration_s=duration,
        processes=processes,
        force=force,
        idle_window_s=idle_window,
        idle_utilization_pct=idle_utilization,
        memory_fraction=memory_fraction,
        maintenance_file=maintenance_file,
        thresholds=Thresholds(warn=warn_below, fail=fail_below),
        on_progress=progress,
    )
    if state_dir is not None:
        options = replace(options, state_dir=state_dir)
    context = CheckContext(fs=fs, nvml=nvml_session(ctx), config=check_config(ctx, bench=options))
    available = load_benchmarks()
    names = BENCH_ORDER if which == "all" else (which,)
    runs = []
    try:
        # One after another: two benchmarks at once would measure each other.
        for name in names:
            runs += run_checks([available[name]], context)
    finally:
        progress.done()
        context.nvml.close()
    hostname = context.hostname
    click.echo(render_json(hostname, runs) if as_json else render_table(hostname, runs))
    code = exit_code(runs)
    measured = any(r.status is not Status.SKIP for run in runs for r in run.results)
    ctx.exit(code if code or measured else EXIT_UNDETERMINED)
