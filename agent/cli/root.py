"""The `nodecheck` group and its entry point, main().

The group holds no command itself: COMMANDS names the module of each, imported only
when that command is run (agent/cli/lazy.py).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import click

from nodecheck.agent.cli.lazy import LazyGroup, command_in
from nodecheck.agent.cli.options import EXIT_INTERNAL, global_options, log, say
from nodecheck.agent.interruption import Interrupted, raise_on_stop_signals
from nodecheck.checks import lazy_logging
from nodecheck.checks.printable import printable

# Each command's module, and the first sentence of its help, as `nodecheck --help` lists it.
COMMANDS = {
    "agent": command_in(
        "agent", "agent", "Run the checks on their schedule and serve them to Prometheus."
    ),
    "bench": command_in(
        "bench",
        "bench",
        "Run micro-benchmarks: matmul TFLOPS, all_reduce bus bandwidth, host-device copies.",
    ),
    "capture": command_in(
        "capture",
        "capture",
        "Write this node's facts: everything the checks, inventory and tune judge.",
    ),
    "check": command_in(
        "check",
        "check",
        "Run the health checks and print a verdict (of this node, or of a capture).",
    ),
    "config": command_in("config", "config", "Show or validate the agent's configuration."),
    "exec": command_in(
        "tune",
        "exec_command",
        "Run CMD bound to its local rank's CPUs and NUMA node, with that rank's environment.",
    ),
    "inventory": command_in(
        "inventory",
        "inventory",
        "Show the node (or a capture): GPUs (with NVML's view), NICs, NUMA nodes and their "
        "PCIe relations.",
    ),
    "mfu": command_in("mfu", "mfu", "Achieved TFLOPS per GPU, MFU and HFU of a training run."),
    "npd": command_in(
        "npd",
        "npd",
        "A node-problem-detector custom plugin: judge one class of fault on this node.",
    ),
    "slurm": command_in(
        "slurm",
        "slurm",
        "Slurm's hooks: the health check (drain and resume), a prolog gate, a task prolog "
        "with tune's environment, an epilog.",
    ),
    "snapshot": command_in(
        "snapshot",
        "snapshot",
        "Capture what the checks that need root judge, for the agent to judge.",
    ),
    "tune": command_in(
        "tune",
        "tune",
        "Recommend CPU/NUMA bindings and NCCL, allocator and thread settings per local rank.",
    ),
}


# The click errors shown as "Error: <message>" (with the usage first, for a UsageError):
# BadParameter, NoSuchOption, an unexpected extra argument... A subclass that shows
# something else (click 8.2's NoArgsIsHelpError: a group's help) is left as it is.
_SHOWN_AS_MESSAGE = (click.ClickException.show, click.UsageError.show)


@contextlib.contextmanager
def _escaped_click_errors() -> Iterator[None]:
    """Click's own errors quote what was typed (a value an option refused, an unknown
    option, an extra argument: some with repr(), "unexpected extra argument" as it is):
    their message escaped like ours before click shows it."""
    try:
        yield
    except click.ClickException as err:
        if type(err).show in _SHOWN_AS_MESSAGE:
            # click declares `message` Final: it is set once, by __init__, and read by
            # format_message() when the error is shown, after this.
            err.message = printable(err.message)  # type: ignore[misc]
        raise


class EscapingGroup(LazyGroup):
    """The `nodecheck` group: an error raised while parsing its options or running any
    command below it (click's or a callback's BadParameter) is shown escaped."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with _escaped_click_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _escaped_click_errors():
            return super().invoke(ctx)


@click.group(
    cls=EscapingGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
    invoke_without_command=True,
)
@click.version_option(package_name="nodecheck", prog_name="nodecheck")
@global_options
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Health checks and tuning for GPU training nodes.

    Reads the node through sysfs and procfs (point --sysfs-root and
    --procfs-root at a captured tree to check it elsewhere).
    """
    if ctx.invoked_subcommand is None:  # plain `nodecheck`: what it can do, not an error
        click.echo(ctx.get_help())
        ctx.exit(0)


def _exit_status(code: object) -> int:
    """What sys.exit(code) would leave with: None is 0, a message is printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    say(str(code), err=True)
    return 1


def _leave(status: int) -> NoReturn:
    """Exit a short command at once: its output flushed and its log handlers closed, but
    without the interpreter's teardown, which only frees what the process is about to
    lose anyway (a tenth of `check --facts`: every module, the facts, the results).
    Nothing of ours waits for it: files are written atomically and closed, and a check
    thread still stuck in a read is abandoned either way."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`)
            stream.flush()
    lazy_logging.shutdown()
    os._exit(status)


def main() -> None:
    """Entry point: no traceback reaches a user (--log-level debug logs where it rose)."""
    # A command lives for a fraction of a second and keeps most of what it allocates (the
    # facts, the results): the cyclic collector would only walk them again and again (a
    # twentieth of `check --facts`, bench/cli_latency.py). The long-lived commands (the
    # agent, the benchmarks) turn it back on: options.long_lived().
    gc.disable()
    raise_on_stop_signals()
    try:
        cli.main(prog_name="nodecheck", standalone_mode=True)
        status = 0
    except SystemExit as done:
        if gc.isenabled():  # a long-lived command
            raise
        status = _exit_status(done.code)
    except Interrupted as stop:
        # Threads still at work (a check stuck in NVML, a benchmark's) are left behind,
        # long-lived command or not; the benchmark child dies with this process (it asked
        # for PR_SET_PDEATHSIG).
        click.echo(f"nodecheck: interrupted by {stop}", err=True)
        _leave(stop.exit_status)
    except Exception as err:
        log.debug("event=internal_error", exc_info=err)
        say(f"nodecheck: internal error: {type(err).__name__}: {err}", err=True)
        sys.exit(EXIT_INTERNAL)
    if gc.isenabled():
        return
    _leave(status)
