"""`nodecheck npd`: a node-problem-detector custom plugin (agent/kubernetes/npd.py)."""

from __future__ import annotations

from pathlib import Path

import click

from nodecheck.agent.cli.options import (
    CONFIG_OPTION,
    FiniteFloatRange,
    given,
    global_options,
    node_fs,
    nvml_session,
)
from nodecheck.checks.config import BUDGET_RANGE_S
from nodecheck.checks.result import FaultClass

# NPD cuts a plugin's output at its config's max_output_length, 80 bytes when unset
# (kubernetes/node-problem-detector pkg/custompluginmonitor/types/config.go,
# defaultMaxOutputLength).
NPD_DEFAULT_MAX_OUTPUT_BYTES = 80
NPD_MAX_OUTPUT_RANGE_BYTES = (16, 4096)
# The class's quick checks, when the agent's results cannot be used: NPD kills the plugin
# at its rule's timeout, so the shipped rule allows more than this.
NPD_DEFAULT_BUDGET_S = 20.0
# How old the agent's results may be ([slurm] results_max_age's default, for the same file).
NPD_DEFAULT_RESULTS_MAX_AGE_S = 300.0
NPD_RESULTS_MAX_AGE_RANGE_S = (1.0, 86400.0)


@click.command("npd")
@click.option(
    "--class",
    "fault_class",
    required=True,
    type=click.Choice([fault_class.value for fault_class in FaultClass]),
    help="The class of fault to judge (one NPD rule, one node condition, per class).",
)
@CONFIG_OPTION
@click.option(
    "--budget",
    type=FiniteFloatRange(*BUDGET_RANGE_S),
    default=NPD_DEFAULT_BUDGET_S,
    show_default=True,
    metavar="SECONDS",
    help="For the class's quick checks when the agent's results cannot be used; keep it "
    "below the NPD rule's timeout.",
)
@click.option(
    "--max-age",
    type=FiniteFloatRange(*NPD_RESULTS_MAX_AGE_RANGE_S),
    default=NPD_DEFAULT_RESULTS_MAX_AGE_S,
    show_default=True,
    metavar="SECONDS",
    help="How old the agent's results file may be.",
)
@click.option(
    "--max-output",
    type=click.IntRange(*NPD_MAX_OUTPUT_RANGE_BYTES),
    default=NPD_DEFAULT_MAX_OUTPUT_BYTES,
    show_default=True,
    metavar="BYTES",
    help="Cut the message to this many bytes: the NPD plugin config's max_output_length "
    "(NPD's default is 80).",
)
@global_options
@click.pass_context
def npd(
    ctx: click.Context,
    fault_class: str,
    config_path: Path | None,
    budget: float,
    max_age: float,
    max_output: int,
) -> None:
    """A node-problem-detector custom plugin: judge one class of fault on this node.

    It judges from the agent's latest results (results_file) when fresh, else runs
    the class's quick checks itself within --budget (never the benchmarks). One
    line on stdout, NPD's condition message. Exit status (NPD's plugin protocol):
    0 OK, 1 a check of the class fails, 2 unknown (could not determine, nothing
    judged, or a usage or configuration error), 3 internal error (unknown too).
    """
    fs = node_fs(ctx)
    from nodecheck.agent.kubernetes.npd import run_npd

    verdict = run_npd(
        fs=fs,
        nvml=nvml_session(ctx),
        config_path=config_path,
        nvml_timeout_s=given(ctx).get("nvml_timeout"),
        fault_class=FaultClass(fault_class),
        budget_s=budget,
        max_age_s=max_age,
        max_output_bytes=max_output,
    )
    click.echo(verdict.message)
    ctx.exit(verdict.exit_status)
