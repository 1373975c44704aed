"""A click group whose commands are imported only when one of them is run.

Click's documented pattern, "Lazily Loading Subcommands"
(https://click.palletsprojects.com/en/stable/complex/#lazily-loading-subcommands): the
group lists the names from a table and get_command() imports the one module asked for,
so `nodecheck check` builds check's options and nobody else's. The table also holds each
command's one-line summary, so a group's --help lists its commands without importing
any of them (tests/agent/test_cli_lazy.py holds each summary to its command's own help).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import click


class LazyCommand(NamedTuple):
    """Where a command is defined (its module and the name of its click object there),
    and the one line a group's --help shows for it: the first sentence of its help."""

    module: str
    attribute: str
    summary: str


def command_in(module: str, attribute: str, summary: str) -> LazyCommand:
    """A command defined in agent/cli/<module>.py."""
    return LazyCommand(f"nodecheck.agent.cli.{module}", attribute, summary)


# click 8.4 made an unknown command its own error, suggesting close names from the
# group's `commands` (empty here, the commands being in the table); before 8.4 it is a
# plain UsageError with no suggestions, and nothing to do.
_NO_SUCH_COMMAND: Any = getattr(click.exceptions, "NoSuchCommand", ())


class LazyGroup(click.Group):
    """A group whose `lazy_commands` are imported on first use (`commands`, click's own
    table, may still hold commands built with the group)."""

    def __init__(self, *args: Any, lazy_commands: Mapping[str, LazyCommand], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = self.lazy_commands.get(cmd_name)
        if entry is None:
            return super().get_command(ctx, cmd_name)
        command = getattr(importlib.import_module(entry.module), entry.attribute)
        if not isinstance(command, click.Command) or command.name != cmd_name:
            raise TypeError(f"{entry.module}.{entry.attribute} is not the command {cmd_name!r}")
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """An unknown command's error suggests the table's names, as click's own does
        with the names in `commands` ("Did you mean ...?")."""
        try:
            return super().resolve_command(ctx, args)
        except _NO_SUCH_COMMAND as err:
            raise _NO_SUCH_COMMAND(
                err.command_name, possibilities=self.list_commands(ctx), ctx=ctx
            ) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The "Commands" section from the table's summaries: click's own layout (one
        stand-in command per name, shortened to the width as click shortens a help),
        with no command module imported."""
        stand_ins = [
            click.Command(name, help=entry.summary) for name, entry in self.lazy_commands.items()
        ]
        listing = click.Group(commands=[*self.commands.values(), *stand_ins])
        listing.format_commands(ctx, formatter)
