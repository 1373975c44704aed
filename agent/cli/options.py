"""What the commands share: the global options (the roots, NVML, logging), the options
two or more commands take, and the plumbing between options and the modules a command
drives (settings, the NodeFS, the NVML session, a capture, usage errors).

Each command's own options live with it (check.py, tune.py, ...); this module is
imported by every one of them, so it imports nothing heavy at the top.
"""

from __future__ import annotations

import gc
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from nodecheck.agent.logs import LEVELS, configure_logging
from nodecheck.checks.config import (
    DEFAULT_NVML_TIMEOUT_S,
    NVML_TIMEOUT_RANGE_S,
    BenchOptions,
    CheckConfig,
)
from nodecheck.checks.lazy_logging import get_logger
from nodecheck.checks.printable import printable

if TYPE_CHECKING:
    from nodecheck.agent.config import AgentConfig
    from nodecheck.checks.node.facts import NodeFacts, PartUnavailableError
    from nodecheck.checks.node.fs import NodeFS
    from nodecheck.checks.node.nvml import NvmlSession
    from nodecheck.checks.node.output import Written

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
SETTINGS_KEY = "nodecheck.settings"

ROOT_OPTIONS = {
    "sysfs_root": ("--sysfs-root", "/sys", "Where sysfs is mounted (a captured node tree works)."),
    "procfs_root": ("--procfs-root", "/proc", "Where procfs is mounted."),
    "rootfs": (
        "--rootfs",
        "/",
        "Root of the host filesystem, for /etc/nccl.conf and home directories.",
    ),
}
# Bounds on what a user types, far beyond any real value but short of absurd ones
# (a 20-digit GPU count passes int() and then means nothing).
MAX_GPUS_PER_NODE = 1024
MAX_NODES = 1 << 16
MAX_LOCAL_RANK = MAX_GPUS_PER_NODE - 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
# How long `inventory` and `tune` may take to read the node (the checks have 10-15 s each).
NODE_READ_TIMEOUT_S = 30.0
DEFAULT_LOG_LEVEL = "warning"
# The agent is a daemon: its lifecycle lines (listening, ready, reloaded, stopping) are
# what an operator reads in the journal, so it logs them by default; a one-shot command
# prints its answer on stdout and only problems on stderr.
AGENT_LOG_LEVEL = "info"

log = get_logger("nodecheck.cli")


class FiniteFloatRange(click.FloatRange):
    """A number in a range, and a number at all: click's FloatRange lets `nan` through
    (every comparison with NaN is false). Every float option of every command uses it."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


def _remember_regular_file(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A library to load must be a regular file: dlopen() of a FIFO blocks until something
    writes to it."""
    import stat

    if value is not None:
        mode = Path(value).stat().st_mode  # click's exists=True has seen it
        if not stat.S_ISREG(mode):
            from nodecheck.checks.node.fs import file_kind

            raise click.BadParameter(f"{value}: {file_kind(mode)}, not a regular file")
    return _remember(ctx, param, value)


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Options can come before or after the command name; the last one given wins."""
    if value is not None and param.name is not None:
        ctx.meta.setdefault(SETTINGS_KEY, {})[param.name] = value
    return value


def global_options(function: F) -> F:
    """The root, NVML and logging options, on the group and every command."""
    for name, (flag, default, help_text) in reversed(ROOT_OPTIONS.items()):
        function = click.option(
            flag,
            name,
            type=click.Path(file_okay=False, path_type=str),
            default=None,
            expose_value=False,
            callback=_remember,
            is_eager=True,
            help=f"{help_text} [default: {default}]",
        )(function)
    function = click.option(
        "--nvml-library",
        "nvml_library",
        type=click.Path(exists=True, dir_okay=False, path_type=str),
        default=None,
        expose_value=False,
        callback=_remember_regular_file,
        is_eager=True,
        metavar="FILE",
        help="Load NVML from this file instead of the system's libnvidia-ml.so.1.",
    )(function)
    function = click.option(
        "--nvml-timeout",
        "nvml_timeout",
        type=FiniteFloatRange(*NVML_TIMEOUT_RANGE_S),
        default=None,
        expose_value=False,
        callback=_remember,
        is_eager=True,
        metavar="SECONDS",
        help="Give up on NVML calls after this long; a GPU off the bus can hang them. "
        f"[default: {DEFAULT_NVML_TIMEOUT_S:g}]",
    )(function)
    return click.option(
        "--log-level",
        "log_level",
        type=click.Choice(LEVELS, case_sensitive=False),
        default=None,
        expose_value=False,
        callback=_remember,
        is_eager=True,
        help=f"Logging to stderr, key=value lines. [default: {DEFAULT_LOG_LEVEL}; "
        f"{AGENT_LOG_LEVEL} for the agent]",
    )(function)


def say(message: str, err: bool = False) -> None:
    """One line of ours that quotes what came from outside (a path or a name typed on the
    command line, a part of a capture, a reason the node gave), escaped as every text for
    people is (checks/printable.py): a newline in it must not start a line of its own, an
    ESC must not reach the terminal."""
    click.echo(printable(message), err=err)


def fail_usage(message: str) -> NoReturn:
    say(f"nodecheck: {message}", err=True)
    sys.exit(EXIT_USAGE)


def given(ctx: click.Context) -> dict[str, Any]:
    """The global options given on the command line (before or after the command)."""
    chosen: dict[str, Any] = ctx.meta.get(SETTINGS_KEY, {})
    return chosen


def settings(ctx: click.Context, log_level: str = DEFAULT_LOG_LEVEL) -> dict[str, Any]:
    chosen = given(ctx)
    values = {name: chosen.get(name, default) for name, (_, default, _) in ROOT_OPTIONS.items()}
    values["log_level"] = chosen.get("log_level", log_level)
    values["nvml_library"] = chosen.get("nvml_library")
    values["nvml_timeout"] = chosen.get("nvml_timeout", DEFAULT_NVML_TIMEOUT_S)
    return values


def check_config(
    ctx: click.Context, *, expected_gpus: int | None = None, bench: BenchOptions | None = None
) -> CheckConfig:
    """The one configuration a command's checks are judged under: what its options say,
    checks/config.py's defaults for the rest."""
    return CheckConfig(
        expected_gpus=expected_gpus,
        nvml_timeout_s=settings(ctx)["nvml_timeout"],
        bench=BenchOptions() if bench is None else bench,
    )


def nvml_session(ctx: click.Context) -> NvmlSession:
    """The NVML session the global --nvml-* options describe (NVML loads on first use)."""
    from nodecheck.checks.node.nvml import NvmlSession

    return NvmlSession(
        deadline_s=check_config(ctx).nvml_timeout_s, library_path=settings(ctx)["nvml_library"]
    )


def node_fs(ctx: click.Context, log_level: str = DEFAULT_LOG_LEVEL) -> NodeFS:
    """The NodeFS for the chosen roots; a root that is not a directory is a usage error."""
    from nodecheck.checks.node.fs import NodeFS

    values = settings(ctx, log_level)
    configure_logging(values["log_level"])
    for name, (flag, _, _) in ROOT_OPTIONS.items():
        root = Path(values[name])
        if not root.is_dir():
            what = "not a directory" if root.exists() else "no such directory"
            fail_usage(f"{flag} {values[name]}: {what}")
    return NodeFS(
        sysfs=Path(values["sysfs_root"]),
        procfs=Path(values["procfs_root"]),
        rootfs=Path(values["rootfs"]),
    )


def _kernel_log(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A log file or a character device (/dev/kmsg), as the configuration's kernel_log."""
    if value is None:
        return None
    from nodecheck.agent.config import kernel_log_problem

    problem = kernel_log_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


def expected_gpus_option(what_fewer_does: str) -> Callable[[F], F]:
    """--expected-gpus N: the GPUs this node should have (CheckConfig.expected_gpus)."""
    return click.option(
        "--expected-gpus",
        "expected_gpus",
        type=click.IntRange(min=0, max=MAX_GPUS_PER_NODE),
        default=CheckConfig.expected_gpus,
        metavar="N",
        help=f"GPUs this node should have; fewer visible to NVML {what_fewer_does}. "
        "[default: the GPUs on the PCI bus]",
    )


def kernel_log_option(function: F) -> F:
    """--kernel-log FILE, for the commands that read XIDs and SXids (check, capture, the
    Slurm prolog and epilog)."""
    return click.option(
        "--kernel-log",
        "kernel_log",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        callback=_kernel_log,
        default=None,
        metavar="FILE",
        help="Read XIDs from this kernel log (kmsg, dmesg or syslog lines). "
        "[default: <rootfs>/dev/kmsg]",
    )(function)


def facts_option(function: F) -> F:
    """--facts FILE: judge a `nodecheck capture` instead of this node."""
    return click.option(
        "--facts",
        "facts_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        metavar="FILE",
        help="Judge this `nodecheck capture` file instead of this node: neither the roots "
        "nor NVML are read.",
    )(function)


def of_capture(path: Path | None, work: Callable[[], T]) -> T:
    """`work()` over a capture (None: the live node, as it is). A capture's values can
    fit their types yet contradict each other (a CPU with no siblings, a NIC naming an
    RDMA device that is not there: a capture edited by hand); what then fails is the
    capture's fault, said in one line with exit 2, never an internal error."""
    if path is None:
        return work()
    from nodecheck.checks.node.facts import PartUnavailableError

    try:
        return work()
    except (click.exceptions.Exit, click.ClickException, PartUnavailableError):
        raise
    except Exception as err:
        log.debug("event=capture_contradicts_itself", exc_info=err)
        fail_usage(
            f"{path}: its facts contradict each other ({type(err).__name__}: {err}): was it edited?"
        )


def cannot_without(doing: str, err: PartUnavailableError) -> NoReturn:
    """A part the command needs is not at hand (a capture without it, or one that
    records it unread): it cannot determine what it shows, exit 3, the part named."""
    unread = err.unread
    remedy = f"; {unread.remedy}" if unread.remedy else ""
    say(f"nodecheck: cannot {doing} without its {err.name} part: {unread.reason}{remedy}", err=True)
    sys.exit(EXIT_INTERNAL)


def load_facts(ctx: click.Context, path: Path) -> NodeFacts:
    """The capture at `path`; anything else (not a capture, damaged, a newer schema, no
    regular file) is a usage error naming the file. The roots and NVML are left alone."""
    from nodecheck.checks.node.facts import FactsError, load
    from nodecheck.checks.node.fs import NotRegularFileError

    configure_logging(settings(ctx)["log_level"])
    try:
        return load(path)
    except FactsError as err:
        fail_usage(f"--facts {err}")
    except NotRegularFileError as err:
        fail_usage(f"--facts {path}: {err.kind}, not a capture")
    except OSError as err:
        fail_usage(f"--facts {path}: {err.strerror or err}")


CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The agent's TOML configuration. [default: /etc/nodecheck/config.toml if it exists, "
    "else embedded defaults]",
)


def config_or_exit(path: Path | None) -> AgentConfig:
    """The agent's configuration at `path` (None: the default file or the embedded
    defaults); a bad one is a usage error naming file, line and key."""
    from nodecheck.agent.config import DEFAULT_PATH, ConfigError, load_config
    from nodecheck.checks.registry import load_checks

    try:
        return load_config(path or DEFAULT_PATH, set(load_checks()))
    except ConfigError as err:
        fail_usage(f"bad configuration: {err}")


def local_rank_option(help_text: str) -> Callable[[F], F]:
    return click.option(
        "--local-rank",
        type=click.IntRange(min=0, max=MAX_LOCAL_RANK),
        default=None,
        metavar="N",
        help=help_text,
    )


def job_options(function: F) -> F:
    """What `tune`, `exec` and `slurm task-prolog` are told about the job."""
    function = click.option(
        "--with-smt-siblings/--no-smt-siblings",
        default=True,
        help="Give each rank its cores' SMT siblings (hyperthreads) too, as torchrun "
        "--numa-binding=exclusive does, or only one thread per core. [default: with]",
    )(function)
    function = click.option(
        "--single-switch",
        is_flag=True,
        help="Every node's NICs hang off one switch (sets NCCL_CROSS_NIC=1).",
    )(function)
    return click.option(
        "--nodes",
        type=click.IntRange(min=1, max=MAX_NODES),
        default=None,
        metavar="N",
        help="Nodes the job spans. [default: from SLURM_JOB_NUM_NODES or WORLD_SIZE/"
        "LOCAL_WORLD_SIZE when set]",
    )(function)


def written_or_exit(command: str, output: Path, write: Callable[[], Written]) -> Written:
    """`write()`'s destination, saying on stderr when it was a symlink's target; exit 2
    naming the path when it cannot write there (the rule of checks/node/output.py)."""
    try:
        written = write()
    except OSError as err:
        fail_usage(f"cannot write {output}: {err.strerror or err}")
    if written.path != output:
        say(
            f"nodecheck {command}: {output} is a symlink: replaced its target "
            f"{written.path} atomically (the symlink stays)",
            err=True,
        )
    return written


def say_unread(command: str, facts: NodeFacts) -> None:
    """One line on stderr naming the parts that could not be read (recorded as such)."""
    from nodecheck.checks.node.facts import Unread

    unread = {name: v for name, v in facts.parts.items() if isinstance(v, Unread)}
    if unread:
        listed = "; ".join(f"{name} ({value.reason})" for name, value in unread.items())
        say(f"{command}: recorded as unread: {listed}", err=True)


def long_lived() -> None:
    """The cyclic garbage collector back on, for a command that runs for long: what was
    allocated so far (modules, click's tables) is moved out of its sight for good. Such
    a command (the collector on) also leaves through the interpreter's own shutdown."""
    gc.freeze()
    gc.enable()
