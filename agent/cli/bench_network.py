"""`nodecheck bench network`: all_reduce across every rank of a job, and the sweep.

Parses and dispatches: checks/bench/network.py gates, reads the node and runs the torch
child; agent/cli/network_view.py renders the report on rank 0.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import click

from nodecheck.agent.cli.bench import shared_bench_options
from nodecheck.agent.cli.options import (
    FiniteFloatRange,
    check_config,
    fail_usage,
    global_options,
    long_lived,
    node_fs,
    nvml_session,
)
from nodecheck.checks.config import (
    BenchOptions,
    Thresholds,
)

MIB = 1 << 20
# 1 MiB to 16 GiB per rank: the guide's all_reduce_bench.py measures up to 4 GiB.
PAYLOAD_RANGE_MIB = (1, 16384)
DEFAULT_PAYLOAD_MIB = {"cuda": 1024, "cpu": 64}
RENDEZVOUS_RANGE_S = (1.0, 3600.0)


@click.command("network")
@click.option(
    "--device",
    type=click.Choice(["cuda", "cpu"]),
    default="cuda",
    show_default=True,
    help="cuda: NCCL, one rank per GPU; cpu: gloo over sockets.",
)
@click.option(
    "--payload-mib",
    "payload_mib",
    type=click.IntRange(*PAYLOAD_RANGE_MIB),
    multiple=True,
    metavar="MIB",
    help="All_reduce payload per rank, repeatable; the largest is judged and swept. "
    "[default: 1024 on cuda, 64 on cpu]",
)
@click.option(
    "--sweep",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Pair the nodes to name a slow node or link; auto: when the whole job is below "
    "what its NICs should reach (or there is no NIC rate, as on cpu).",
)
@click.option(
    "--rendezvous-timeout",
    type=FiniteFloatRange(*RENDEZVOUS_RANGE_S),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="How long the ranks wait for each other: to start, and in any collective.",
)
@click.option(
    "--node-name",
    default=None,
    metavar="NAME",
    help="This node's name in the report. [default: the host name, as the node's agent reads it]",
)
@shared_bench_options(
    "per payload, and per pair of a sweep round",
    "the reference (a pair: the run's median over the nodes of each node's best pair; "
    "the whole job: its NICs' rate)",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (rank 0).")
@global_options
@click.pass_context
def network(
    ctx: click.Context,
    device: str,
    payload_mib: tuple[int, ...],
    duration: float,
    sweep: str,
    rendezvous_timeout: float,
    node_name: str | None,
    state_dir: Path | None,
    idle_window: float,
    warn_below: float,
    fail_below: float,
    as_json: bool,
) -> None:
    """All_reduce bus bandwidth across every rank of a job (srun or torchrun), and a
    sweep over node pairs that names a slow node or link.

    Exit status: 0 measured and nothing slow, 1 something slow, 2 could not measure
    (a busy node, the rendezvous, a rank lost, a payload too large).
    """
    long_lived()
    if fail_below > warn_below:
        fail_usage("--fail-below must not be above --warn-below")
    from nodecheck.agent.cli.network_view import render_json, render_table
    from nodecheck.checks.bench import network as bench_network
    from nodecheck.checks.context import CheckContext

    fs = node_fs(ctx)
    options = BenchOptions(
        device=device,
        duration_s=duration,
        idle_window_s=idle_window,
        thresholds=Thresholds(warn=warn_below, fail=fail_below),
    )
    if state_dir is not None:
        options = replace(options, state_dir=state_dir)
    run = bench_network.NetworkRun(
        payloads=tuple(size * MIB for size in payload_mib or (DEFAULT_PAYLOAD_MIB[device],)),
        sweep=sweep,
        rendezvous_timeout_s=rendezvous_timeout,
        node=bench_network.node_name(node_name),
    )
    context = CheckContext(fs=fs, nvml=nvml_session(ctx), config=check_config(ctx, bench=options))
    try:
        outcome = bench_network.run_network(context, options, run)
    finally:
        context.nvml.close()
    from nodecheck.checks.printable import printable

    if outcome.report is None:
        click.echo(printable(f"nodecheck bench network: {run.node}: {outcome.error}"), err=True)
        ctx.exit(bench_network.EXIT_UNMEASURED)
    report = outcome.report
    if outcome.record_error is not None:
        line = f"nodecheck bench network: {run.node}: {outcome.record_error}"
        click.echo(printable(line), err=True)
    if outcome.rank == 0:
        click.echo(render_json(report) if as_json else render_table(report), nl=False)
    sys.stdout.flush()
    ctx.exit(bench_network.exit_status(report, outcome.rank))
