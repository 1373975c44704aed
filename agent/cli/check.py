"""`nodecheck check`: run the health checks and print a verdict."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from nodecheck.agent.cli.options import (
    F,
    check_config,
    expected_gpus_option,
    facts_option,
    fail_usage,
    global_options,
    kernel_log_option,
    load_facts,
    node_fs,
    nvml_session,
)


def _check_names(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> Any:
    """`--only cpu,numa` as `--only cpu --only numa`; repeats and commas mix. An empty
    name (`--only ""`, `cpu,,numa`) names no check: refused, never taken as "all"."""
    names = tuple(name.strip() for given_value in value for name in given_value.split(","))
    if any(not name for name in names):
        raise click.BadParameter(f"{','.join(value)!r}: an empty check name")
    return names


class CheckCommand(click.Command):
    """`check --help` ends with the registered checks' names, read from the registry when
    the help is shown (importing every check module costs every other command nothing)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from nodecheck.checks.registry import load_checks

        formatter.write_paragraph()
        formatter.write_text(f"Checks (for --only and --skip): {', '.join(load_checks())}.")
        super().format_epilog(ctx, formatter)


def check_selection_option(flag: str, help_text: str) -> Callable[[F], F]:
    return click.option(
        flag,
        flag.removeprefix("--"),
        multiple=True,
        metavar="NAME[,NAME...]",
        callback=_check_names,
        help=f"{help_text} (repeatable; commas separate names).",
    )


@click.command("check", cls=CheckCommand)
@check_selection_option("--only", "Run only these checks")
@check_selection_option("--skip", "Do not run these checks")
@click.option("--json", "as_json", is_flag=True, help="Print the nodecheck.check/v2 JSON document.")
@expected_gpus_option("fails gpu_count")
@kernel_log_option
@facts_option
@global_options
@click.pass_context
def check(
    ctx: click.Context,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    as_json: bool,
    expected_gpus: int | None,
    kernel_log: Path | None,
    facts_path: Path | None,
) -> None:
    """Run the health checks and print a verdict (of this node, or of a capture).

    Exit status: 0 no failure (warnings allowed), 1 a check failed, 2 usage or
    configuration error, 3 no failure but something could not be determined; 130
    (143) when Ctrl-C (SIGTERM) stopped it.
    """
    if facts_path is not None and kernel_log is not None:
        fail_usage("--kernel-log reads this node; a capture (--facts) holds its own")
    facts = load_facts(ctx, facts_path) if facts_path is not None else None
    fs = node_fs(ctx) if facts is None else None
    from nodecheck.agent.cli.report import exit_code, render_json, render_table
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.node.facts import hostname_shown
    from nodecheck.checks.registry import (
        NothingSelectedError,
        UnknownCheckError,
        load_checks,
        select_checks,
    )
    from nodecheck.checks.runner import one_cpu, run_checks

    try:
        selected = select_checks(load_checks(), only, skip)
    except UnknownCheckError as err:
        fail_usage(str(err))
    except NothingSelectedError:
        given_options = " ".join(
            [*(f"--only {name}" for name in only), *(f"--skip {name}" for name in skip)]
        )
        fail_usage(f"{given_options}: no check left to run")
    config = check_config(ctx, expected_gpus=expected_gpus)
    if facts is not None:
        # A capture is judged without a read: its threads hand the GIL over only at their
        # ends, so one CPU buys nothing, and on a VM whose host takes that CPU a while it
        # cost `check --facts` a tenth (bench/cli_latency.py --baseline).
        context = CheckContext(facts=facts, config=config)
        runs = run_checks(selected, context)
    else:
        assert fs is not None
        context = CheckContext(fs=fs, nvml=nvml_session(ctx), kernel_log=kernel_log, config=config)
        try:
            with one_cpu():
                runs = run_checks(selected, context)
        finally:
            context.nvml.close()
    # A part of its own: the inventory may be what a timed-out check is stuck on.
    hostname = hostname_shown(context.facts)
    if as_json:
        click.echo(render_json(hostname, runs))
    else:
        click.echo(render_table(hostname, runs))
    ctx.exit(exit_code(runs))
