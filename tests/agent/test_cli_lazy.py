"""`nodecheck` imports a command's module only when that command runs (agent/cli/lazy.py):
the tables of the lazy groups name every command, with the help each one gives."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys

import click
import pytest

import nodecheck.agent.cli as cli_package
from nodecheck.agent.cli import cli
from nodecheck.agent.cli.lazy import LazyGroup
from nodecheck.agent.cli.slurm import slurm
from tests.conftest import Node

# The modules that define commands (the others render or apply what a command produced).
COMMAND_MODULES = {
    "agent",
    "bench",
    "bench_network",  # `bench network`, bench's own subcommand
    "capture",
    "check",
    "config",
    "inventory",
    "mfu",
    "npd",
    "slurm",
    "slurm_gate",
    "slurm_health",
    "slurm_task",
    "snapshot",
    "tune",
}
LAZY_GROUPS = [pytest.param(cli, id="nodecheck"), pytest.param(slurm, id="slurm")]


def loaded(group: LazyGroup) -> dict[str, click.Command]:
    """Every command of the group, imported as running it would."""
    ctx = click.Context(group)
    commands = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}
    assert None not in commands.values()
    return {name: command for name, command in commands.items() if command is not None}


@pytest.mark.parametrize("group", LAZY_GROUPS)
def test_each_summary_in_the_table_is_its_commands_own_help(group: LazyGroup) -> None:
    """The table's line is the one click makes of the command's help (its first
    sentence), so the two cannot drift apart."""
    for name, command in loaded(group).items():
        assert command.name == name
        summary = group.lazy_commands[name].summary
        assert summary == command.get_short_help_str(limit=10_000), name


@pytest.mark.parametrize("group", LAZY_GROUPS)
@pytest.mark.parametrize("width", [50, 80, 120])
def test_the_help_lists_the_commands_as_their_own_help_would(group: LazyGroup, width: int) -> None:
    """The "Commands" section from the table is the one click writes from the commands
    themselves, shortened alike at any terminal width."""
    ctx = click.Context(group, terminal_width=width)
    from_table = click.HelpFormatter(width=width)
    group.format_commands(ctx, from_table)
    from_commands = click.HelpFormatter(width=width)
    click.Group(commands=list(loaded(group).values())).format_commands(ctx, from_commands)
    assert from_table.getvalue() == from_commands.getvalue()
    assert "Commands:" in from_table.getvalue()


def test_every_command_defined_is_in_a_table() -> None:
    """No command module holds a command that no group offers (nor the reverse); root.py
    holds the `nodecheck` group itself."""
    offered = {id(cli)} | {
        id(command)
        for group in (cli, slurm)
        for command in loaded(group).values()
        for command in [command, *getattr(command, "commands", {}).values()]
    }
    modules = {info.name for info in pkgutil.iter_modules(cli_package.__path__)}
    defining = set()
    for name in sorted(modules):
        module = importlib.import_module(f"nodecheck.agent.cli.{name}")
        commands = [
            value
            for value in vars(module).values()
            if isinstance(value, click.Command)
            and getattr(value.callback, "__module__", None) == module.__name__
        ]
        for command in commands:
            assert id(command) in offered, f"{name}.{command.name} is in no group's table"
        if commands:
            defining.add(name)
    assert defining == {*COMMAND_MODULES, "root"}


PROBE = (
    "import json, sys\n"
    "from nodecheck.agent.cli import cli\n"
    "try:\n"
    "    cli.main(sys.argv[1:], prog_name='nodecheck', standalone_mode=False)\n"
    "except SystemExit:\n"
    "    pass\n"
    "ours = [name.rpartition('.')[2] for name in sys.modules\n"
    "        if name.startswith('nodecheck.agent.cli.')]\n"
    "print('MODULES ' + json.dumps(sorted(ours)), file=sys.stderr)\n"
)


def command_modules_imported(args: list[str], env: dict[str, str]) -> set[str]:
    """The command modules a fresh interpreter imported to run `nodecheck ARGS`."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **env},
        timeout=120,
    )
    line = next((x for x in done.stderr.splitlines() if x.startswith("MODULES ")), None)
    assert line is not None, done.stderr[-2000:]
    return set(json.loads(line.removeprefix("MODULES "))) & COMMAND_MODULES


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["--help"], set()),
        (["slurm", "--help"], {"slurm"}),
        (["slurm", "prolog", "--help"], {"slurm", "slurm_gate"}),
        (["check", "--help"], {"check"}),
        (["check", "--json"], {"check"}),
        (["tune", "--format", "json"], {"tune"}),
    ],
)
def test_a_command_imports_only_its_own_module(
    dgx: Node, command: list[str], expected: set[str]
) -> None:
    args = command if "--help" in command else [*dgx.cli_args, *command]
    assert command_modules_imported(args, dgx.env) == expected
