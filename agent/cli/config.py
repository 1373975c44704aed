"""`nodecheck config show|check`: the agent's configuration (agent/config.py)."""

from __future__ import annotations

from pathlib import Path

import click

from nodecheck.agent.cli.options import (
    CONFIG_OPTION,
    config_or_exit,
    global_options,
    say,
    settings,
)
from nodecheck.agent.logs import configure_logging


@click.group("config")
@global_options
def config() -> None:
    """Show or validate the agent's configuration."""


@config.command("show")
@CONFIG_OPTION
@global_options
@click.pass_context
def config_show(ctx: click.Context, config_path: Path | None) -> None:
    """Print the effective configuration: the file over the embedded defaults.

    Every key the file may set, with its value, each check's interval and timeout
    included; a key left unset is a comment saying what unset means. The output
    is itself a configuration (`config check` accepts it).
    """
    configure_logging(settings(ctx)["log_level"])
    from nodecheck.checks.registry import load_checks

    click.echo(config_or_exit(config_path).show(load_checks()), nl=False)


@config.command("check")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@global_options
@click.pass_context
def config_check(ctx: click.Context, path: Path) -> None:
    """Validate a configuration file and the files it names: exit 0 when usable, 2 with
    file, line and key if not."""
    configure_logging(settings(ctx)["log_level"])
    config_or_exit(path)
    say(f"{path}: ok")
