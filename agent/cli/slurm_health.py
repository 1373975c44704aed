"""`nodecheck slurm health-check`: judge this node for Slurm and drain or undrain it
(agent/slurm/health.py)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import click

from nodecheck.agent.cli.options import (
    AGENT_LOG_LEVEL,
    CONFIG_OPTION,
    config_or_exit,
    given,
    global_options,
    node_fs,
    nvml_session,
)


@click.command("health-check")
@CONFIG_OPTION
@click.option(
    "--node",
    default=None,
    metavar="NAME",
    help="The node's Slurm NodeName. [default: $SLURMD_NODENAME, else the short host name]",
)
@click.option(
    "--scontrol",
    default="scontrol",
    show_default=True,
    metavar="PATH",
    help="The scontrol command to read the node's state and to drain or undrain it with.",
)
@global_options
@click.pass_context
def slurm_health_check(
    ctx: click.Context, config_path: Path | None, node: str | None, scontrol: str
) -> None:
    """For HealthCheckProgram: judge this node, drain it on a failure, undrain it when healthy.

    It judges from the agent's latest results (results_file) when fresh, else runs
    the quick checks itself within [slurm] budget (never the benchmarks). It drains
    with a "nodecheck:" reason, undrains (UNDRAIN) only what it drained and only
    after [slurm] undrain_after_runs healthy runs in a row (or undrain_after
    seconds), and never touches a node that is down, rebooting or drained for
    another reason, or whose state scontrol cannot give. One log line per run.
    Exit status: 0 healthy, 1 unhealthy, 2 usage or configuration error, 3 could
    not determine (the state unread, scontrol failing, checks undetermined).
    """
    fs = node_fs(ctx, log_level=AGENT_LOG_LEVEL)
    config = config_or_exit(config_path)
    if "nvml_timeout" in given(ctx):
        config = replace(config, nvml_timeout_s=given(ctx)["nvml_timeout"])
    from nodecheck.agent.slurm.health import node_name, run_health_check

    ctx.exit(
        run_health_check(
            fs=fs,
            nvml=nvml_session(ctx),
            config=config,
            node=node or node_name(dict(os.environ)),
            scontrol=scontrol,
        )
    )
