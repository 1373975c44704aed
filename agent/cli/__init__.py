"""The `nodecheck` command.

Heavy modules (the check framework, and later NVML and torch) are imported
inside the commands, so `nodecheck --help` stays fast.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from nodecheck.agent.interruption import Interrupted, raise_on_stop_signals
from nodecheck.agent.logs import LEVELS, configure_logging
from nodecheck.checks.config import (
    BENCH_DURATION_RANGE_S,
    BUDGET_RANGE_S,
    DEFAULT_EPILOG_BUDGET_S,
    DEFAULT_NVML_TIMEOUT_S,
    DEFAULT_PROLOG_BUDGET_S,
    IDLE_WINDOW_RANGE_S,
    MEMORY_FRACTION_RANGE,
    NVML_TIMEOUT_RANGE_S,
    RATIO_RANGE,
    BenchOptions,
    CheckConfig,
    Thresholds,
)
from nodecheck.checks.printable import printable
from nodecheck.checks.result import FaultClass

if TYPE_CHECKING:
    from nodecheck.checks.node.facts import NodeFacts, PartUnavailableError
    from nodecheck.checks.node.fs import NodeFS
    from nodecheck.checks.node.nvml import NvmlSession
    from nodecheck.checks.node.output import Written
    from nodecheck.tuning.plan import Plan

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
MAX_JOB_GPUS = 1 << 20
MAX_NODES = 1 << 16
MAX_LOCAL_RANK = MAX_GPUS_PER_NODE - 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
# How long `inventory` and `tune` may take to read the node (the checks have 10-15 s each).
NODE_READ_TIMEOUT_S = 30.0
# A task waits for its prolog: a few seconds at most (a healthy node plans in 0.1 s).
TASK_PROLOG_TIMEOUT_S = 5.0
DEFAULT_LOG_LEVEL = "warning"
# `nodecheck npd` (agent/kubernetes/npd.py). NPD cuts a plugin's output at its config's
# max_output_length, 80 bytes when unset (kubernetes/node-problem-detector
# pkg/custompluginmonitor/types/config.go, defaultMaxOutputLength).
NPD_DEFAULT_MAX_OUTPUT_BYTES = 80
NPD_MAX_OUTPUT_RANGE_BYTES = (16, 4096)
# The class's quick checks, when the agent's results cannot be used: NPD kills the plugin
# at its rule's timeout, so the shipped rule allows more than this.
NPD_DEFAULT_BUDGET_S = 20.0
# How old the agent's results may be ([slurm] results_max_age's default, for the same file).
NPD_DEFAULT_RESULTS_MAX_AGE_S = 300.0
NPD_RESULTS_MAX_AGE_RANGE_S = (1.0, 86400.0)
# The agent is a daemon: its lifecycle lines (listening, ready, reloaded, stopping) are
# what an operator reads in the journal, so it logs them by default; a one-shot command
# prints its answer on stdout and only problems on stderr.
AGENT_LOG_LEVEL = "info"

log = logging.getLogger("nodecheck.cli")


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


class EscapingGroup(click.Group):
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


@click.group(
    cls=EscapingGroup,
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
    """--kernel-log FILE, for the commands that read XIDs and SXids (check, capture)."""
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


@cli.command(cls=CheckCommand)
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
    from nodecheck.checks.runner import run_checks

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
        context = CheckContext(facts=facts, config=config)
        runs = run_checks(selected, context)
    else:
        assert fs is not None
        context = CheckContext(fs=fs, nvml=nvml_session(ctx), kernel_log=kernel_log, config=config)
        try:
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


@cli.command()
@click.option(
    "--json", "as_json", is_flag=True, help="Print the nodecheck.inventory/v1 JSON document."
)
@facts_option
@global_options
@click.pass_context
def inventory(ctx: click.Context, as_json: bool, facts_path: Path | None) -> None:
    """Show the node (or a capture): GPUs (with NVML's view), NICs, NUMA nodes and their
    PCIe relations."""
    from nodecheck.agent.cli.inventory_view import (
        inventory_facts,
        render_inventory,
        render_inventory_json,
    )
    from nodecheck.checks.node.facts import PartUnavailableError

    if facts_path is not None:
        facts = load_facts(ctx, facts_path)
    else:
        from nodecheck.checks.node.facts import LiveFacts, NodeSources

        sources = NodeSources(fs=node_fs(ctx), nvml=nvml_session(ctx))
        try:
            # Each part on its own thread under the deadline: a read that blocks in the
            # kernel (a wedged device's attribute) must not hang us.
            facts = LiveFacts(sources).capture(
                ["inventory", "cpu_model", "gpus"], timeout_s=NODE_READ_TIMEOUT_S
            )
        finally:
            sources.session().close()
    render = render_inventory_json if as_json else render_inventory
    try:
        text = of_capture(facts_path, lambda: render(inventory_facts(facts)))
    except PartUnavailableError as err:
        cannot_without("show the node", err)
    click.echo(text)


CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The agent's TOML configuration. [default: /etc/nodecheck/config.toml if it exists, "
    "else embedded defaults]",
)


def _config_or_exit(path: Path | None) -> Any:
    from nodecheck.agent.config import DEFAULT_PATH, ConfigError, load_config
    from nodecheck.checks.registry import load_checks

    try:
        return load_config(path or DEFAULT_PATH, set(load_checks()))
    except ConfigError as err:
        fail_usage(f"bad configuration: {err}")


def _listen(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--listen by the configuration's own rules ("" serves nothing, as listen = "")."""
    from nodecheck.agent.config import parse_listen

    if value:
        try:
            parse_listen(value)
        except ValueError as err:
            raise click.BadParameter(str(err)) from None
    return value


def _snapshot(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    from nodecheck.agent.config import snapshot_problem

    if value is None:
        return None
    value = value.absolute()  # the agent's paths do not depend on where it was started
    problem = snapshot_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


def _web_config(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """--web.config.file: read and checked at once (file:line: key: why)."""
    from nodecheck.agent.web.config import WebConfigError, load_web_config

    if value is None:
        return None
    value = value.absolute()
    try:
        load_web_config(value)
    except WebConfigError as err:
        raise click.BadParameter(str(err)) from None
    return value


@cli.command()
@CONFIG_OPTION
@click.option(
    "--listen",
    default=None,
    metavar="HOST:PORT",
    callback=_listen,
    help="Override the configured listen address (:PORT for every interface, [IPv6]:PORT; "
    '"" for no server: the checks run, nothing is served).',
)
@click.option(
    "--snapshot",
    "snapshot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=_snapshot,
    default=None,
    help="Serve the root-only checks from this `nodecheck snapshot` file (privilege separation).",
)
@click.option(
    "--web.config.file",
    "web_config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=_web_config,
    default=None,
    help="TLS, client certificates, headers and basic auth from node_exporter's web "
    "configuration file (the exporter toolkit's YAML), instead of the file's tls_cert_file, "
    "tls_key_file and basic_auth_file.",
)
@global_options
@click.pass_context
def agent(
    ctx: click.Context,
    config_path: Path | None,
    listen: str | None,
    snapshot_path: Path | None,
    web_config_file: Path | None,
) -> None:
    """Run the checks on their schedule and serve them to Prometheus.

    /metrics, /healthz and /results on port 19410 by default; with no
    configuration file, embedded defaults (every check, no GPU needed).
    SIGTERM stops it, SIGHUP reloads the configuration. Options given here
    (--listen, --snapshot, --web.config.file, --nvml-timeout) win over the file's,
    across reloads.
    Exit status: 0 when stopped, 2 for a bad configuration or an address it
    cannot listen on.
    """
    long_lived()
    try:
        _run_agent(ctx, config_path, listen, snapshot_path, web_config_file)
    except Interrupted:
        # Stopped while it was starting, before its own handlers were in place: a stop
        # like any other (systemd's stop sends SIGTERM), exit 0 as documented.
        log.info("event=stopping")
        ctx.exit(0)


def _run_agent(
    ctx: click.Context,
    config_path: Path | None,
    listen: str | None,
    snapshot_path: Path | None,
    web_config_file: Path | None = None,
) -> None:
    fs = node_fs(ctx, log_level=AGENT_LOG_LEVEL)
    from nodecheck.agent.config import DEFAULT_PATH, ConfigError
    from nodecheck.agent.daemon.agent import Agent, ListenError

    _config_or_exit(config_path)  # refuse a bad file before starting anything
    overrides: dict[str, Any] = {}
    if listen is not None:
        overrides["listen"] = listen
    if snapshot_path is not None:
        overrides["snapshot"] = snapshot_path
    if web_config_file is not None:
        overrides["web_config_file"] = web_config_file
    if "nvml_timeout" in given(ctx):
        overrides["nvml_timeout_s"] = given(ctx)["nvml_timeout"]
    try:
        daemon = Agent(fs, config_path or DEFAULT_PATH, settings(ctx)["nvml_library"], overrides)
    except ConfigError as err:
        fail_usage(f"bad configuration: {err}")
    try:
        daemon.run_until_signalled()
    except ListenError as err:
        fail_usage(str(err))


@cli.command()
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("/run/nodecheck/snapshot.json"),
    show_default=True,
    help="Where to write the snapshot: replaced atomically (its folder must exist; only "
    "the default's is created), as capture -o writes (/dev/null, a terminal, a FIFO or "
    "an own descriptor written through, a symlink's target replaced).",
)
@global_options
@click.pass_context
def snapshot(ctx: click.Context, output: Path) -> None:
    """Capture what the checks that need root judge, for the agent to judge.

    For nodecheck-snapshot.timer: the agent, unprivileged, runs those checks over
    this capture (ACS from PCIe config space, the environments of other users'
    jobs, the kernel log's SXids), a nodecheck.facts/v1 document.
    """
    fs = node_fs(ctx)
    from nodecheck.agent.daemon.snapshot import root_checks, take_snapshot, write_snapshot
    from nodecheck.checks.node.facts import NodeSources
    from nodecheck.checks.registry import load_checks

    checks = root_checks(load_checks())
    # The service's own environment is not a job's (the agent reads none either).
    sources = NodeSources(fs=fs, environ={}, nvml=nvml_session(ctx))
    try:
        facts = take_snapshot(sources, checks)
    finally:
        sources.session().close()
    written = _written_or_exit("snapshot", output, lambda: write_snapshot(output, facts))
    _say_unread("nodecheck snapshot", facts)
    names = ", ".join(check.name for check in checks)
    # Written through (`--output /dev/stdout`), stdout may be the document itself.
    say(f"{output}: {len(facts.parts)} parts, for {names}", err=written.through)


def _written_or_exit(command: str, output: Path, write: Callable[[], Written]) -> Written:
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


def _say_unread(command: str, facts: NodeFacts) -> None:
    """One line on stderr naming the parts that could not be read (recorded as such)."""
    from nodecheck.checks.node.facts import Unread

    unread = {name: v for name, v in facts.parts.items() if isinstance(v, Unread)}
    if unread:
        listed = "; ".join(f"{name} ({value.reason})" for name, value in unread.items())
        say(f"{command}: recorded as unread: {listed}", err=True)


@cli.command()
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Write the capture to FILE instead of stdout: replaced atomically, mode 0600 (its "
    "folder must exist). /dev/null, a terminal, a FIFO or one of this process's own "
    "descriptors (-o /dev/stdout, /dev/fd/N) is written through; other devices are "
    "refused; a symlink is never replaced: its target file is (not one another user "
    "planted in a sticky folder such as /tmp).",
)
@kernel_log_option
@global_options
@click.pass_context
def capture(ctx: click.Context, output: Path | None, kernel_log: Path | None) -> None:
    """Write this node's facts: everything the checks, inventory and tune judge.

    A nodecheck.facts/v1 document (docs/facts.md), for `check`, `inventory` and
    `tune --facts FILE` anywhere: a support bundle. It holds no secret (only the
    audited NCCL_, TORCH_, PYTORCH_ and CUDA_ variables are kept as they are read).
    A part that could not be read is recorded as such and named on stderr; the exit
    status is 0 all the same (2 for a usage error or a file it cannot write).
    """
    import os

    fs = node_fs(ctx)
    from nodecheck.checks.node.facts import LiveFacts, NodeSources, dumps
    from nodecheck.checks.node.output import write_output

    sources = NodeSources(
        fs=fs,
        environ=dict(os.environ),
        uid=os.getuid(),
        nvml=nvml_session(ctx),
        kernel_log=kernel_log,
    )
    try:
        facts = LiveFacts(sources).capture()
    finally:
        sources.session().close()
    text = dumps(facts)
    if output is None:
        click.echo(text, nl=False)
        _say_unread("nodecheck capture", facts)
        return
    # A support bundle: readable by its owner only, whole or not at all.
    written = _written_or_exit("capture", output, lambda: write_output(output, text, 0o600))
    _say_unread("nodecheck capture", facts)
    # Written through (`-o /dev/stdout`), stdout may be the document itself.
    say(f"{output}: {len(facts.parts)} parts", err=written.through)


@cli.group()
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

    click.echo(_config_or_exit(config_path).show(load_checks()), nl=False)


@config.command("check")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@global_options
@click.pass_context
def config_check(ctx: click.Context, path: Path) -> None:
    """Validate a configuration file and the files it names: exit 0 when usable, 2 with
    file, line and key if not."""
    configure_logging(settings(ctx)["log_level"])
    _config_or_exit(path)
    say(f"{path}: ok")


@cli.command()
@click.option(
    "--params",
    type=FiniteFloatRange(min=1, max=1e15),
    required=True,
    help="Model parameters (70e9 for 70B).",
)
@click.option(
    "--seqlen", type=click.IntRange(min=1, max=1 << 24), required=True, help="Sequence length."
)
@click.option(
    "--global-batch",
    type=click.IntRange(min=1, max=1 << 24),
    required=True,
    help="Sequences per iteration, across all GPUs.",
)
@click.option(
    "--iter-time",
    type=FiniteFloatRange(min=1e-3, max=86400),
    required=True,
    metavar="SECONDS",
    help="Seconds per iteration.",
)
@click.option(
    "--gpus",
    "job_gpus",
    type=click.IntRange(min=1, max=MAX_JOB_GPUS),
    required=True,
    help="GPUs in the job.",
)
@click.option(
    "--no-recompute", is_flag=True, help="Activations are not recomputed (x3 instead of x4)."
)
@click.option(
    "--gpu-model",
    default=None,
    metavar="NAME",
    help="H100-SXM, A100-PCIe, ... (one the peak-rate table knows; exit 2 for another). "
    "[default: this node's GPU, through NVML]",
)
@click.option(
    "--dtype",
    type=click.Choice(["bf16", "fp16", "fp32"]),
    default="bf16",
    show_default=True,
    help="The data type whose dense peak MFU is against.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@global_options
@click.pass_context
def mfu(
    ctx: click.Context,
    params: float,
    seqlen: int,
    global_batch: int,
    iter_time: float,
    job_gpus: int,
    no_recompute: bool,
    gpu_model: str | None,
    dtype: str,
    as_json: bool,
) -> None:
    """Achieved TFLOPS per GPU and MFU of a training run.

    By the estimate in Stas Bekman's Machine Learning Engineering book
    (github.com/stas00/ml-engineering, training/performance, "TFLOPS as a
    performance metric"), shown with the figures. Exit status: 0; 1 when the MFU
    is above 100 % (impossible: the inputs are wrong); 2 usage error (a --gpu-model
    with no known peak, or none for --dtype, included).
    """
    import json

    from nodecheck.tuning.mfu import compute_mfu, named_model_problem

    if gpu_model is not None:
        problem = named_model_problem(gpu_model, dtype)
        if problem is not None:
            fail_usage(f"{problem[0]} {problem[1]}")
    else:
        from nodecheck.checks.context import CheckContext

        context = CheckContext(fs=node_fs(ctx), nvml=nvml_session(ctx), config=check_config(ctx))
        try:
            readings = [g for g in context.gpus.snapshot.gpus if g.name]
        finally:
            context.nvml.close()
        gpu_model = readings[0].name if readings else None
    try:
        figures = compute_mfu(
            params,
            seqlen,
            global_batch,
            iter_time,
            job_gpus,
            recompute=not no_recompute,
            gpu_model=gpu_model,
            dtype=dtype,
        )
    except ValueError as err:
        fail_usage(f"mfu: {err}")
    warning = figures.warning()
    if as_json:
        document = {
            "schema": "nodecheck.mfu/v1",
            "tflops_per_gpu": figures.tflops_per_gpu,
            "mfu": figures.mfu,
            "peak_tflops": figures.peak_tflops,
            "gpu_model": figures.model,
            "dtype": dtype,
            "formula": figures.formula(),
            "plausible": figures.plausible,
            "warning": warning,
        }
        click.echo(json.dumps(document, indent=2, allow_nan=False))
    else:
        click.echo(f"achieved: {figures.tflops_per_gpu:.1f} TFLOPS per GPU")
        click.echo(f"  = {figures.formula()} / 1e12")
        if figures.mfu is None:
            what = f"the peak of {figures.model!r} is not known" if figures.model else "no GPU here"
            say(f"MFU: unknown ({what}; name the GPU with --gpu-model, e.g. H100-SXM)")
        else:
            say(
                f"MFU: {figures.mfu:.1%} of the {figures.model}'s {figures.peak_tflops:g} "
                f"TFLOPS dense {dtype} peak"
            )
    if warning:
        say(f"nodecheck: {warning}", err=True)
        ctx.exit(1)


BENCH_ORDER = ("matmul", "allreduce", "h2d")


def local_rank_option(help_text: str) -> Callable[[F], F]:
    return click.option(
        "--local-rank",
        type=click.IntRange(min=0, max=MAX_LOCAL_RANK),
        default=None,
        metavar="N",
        help=help_text,
    )


def job_options(function: F) -> F:
    """What `tune` and `exec` are told about the job."""
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


def _tune_plan(
    ctx: click.Context,
    nodes: int | None,
    single_switch: bool,
    with_smt_siblings: bool,
    timeout_s: float = NODE_READ_TIMEOUT_S,
) -> Plan:
    import os

    fs = node_fs(ctx)
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.runner import UnfinishedError, run_bounded
    from nodecheck.tuning.nccl import JobShape
    from nodecheck.tuning.plan import TuneOptions, make_plan

    def plan() -> Plan:
        options = TuneOptions(
            shape=JobShape(nodes, single_switch), with_smt_siblings=with_smt_siblings
        )
        # Every part make_plan reads (the cpuset, the installed torch's version, ...) comes
        # through the context: over a loaded capture, the same call plans another node.
        return make_plan(CheckContext(fs=fs, environ=dict(os.environ), uid=os.getuid()), options)

    try:
        # A read that blocks in the kernel (a wedged device's attribute) must not hang us.
        return run_bounded(plan, "reading the node", timeout_s)
    except UnfinishedError as err:
        say(f"nodecheck: {err}", err=True)
        sys.exit(EXIT_INTERNAL)


def _tune_plan_of_capture(
    ctx: click.Context,
    facts_path: Path,
    nodes: int | None,
    single_switch: bool,
    with_smt_siblings: bool,
) -> Plan:
    """The plan for a captured node: make_plan over the capture's parts (its cpuset, torch
    version and calling environment included), nothing read here."""
    facts = load_facts(ctx, facts_path)
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.node.facts import PartUnavailableError
    from nodecheck.tuning.nccl import JobShape
    from nodecheck.tuning.plan import TuneOptions, make_plan

    options = TuneOptions(shape=JobShape(nodes, single_switch), with_smt_siblings=with_smt_siblings)
    try:
        return of_capture(facts_path, lambda: make_plan(CheckContext(facts=facts), options))
    except PartUnavailableError as err:
        cannot_without("plan the node", err)


@cli.command()
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "shell", "env", "json"]),
    default=None,
    help="text: a table with reasons; shell: export lines for bash; env: a systemd "
    "EnvironmentFile; json: the nodecheck.tune/v1 document. [default: text on a "
    "terminal, else shell]",
)
@local_rank_option("Only this local rank (and its own variables in shell and env output).")
@job_options
@facts_option
@global_options
@click.pass_context
def tune(
    ctx: click.Context,
    output_format: str | None,
    local_rank: int | None,
    nodes: int | None,
    single_switch: bool,
    with_smt_siblings: bool,
    facts_path: Path | None,
) -> None:
    """Recommend CPU/NUMA bindings and NCCL, allocator and thread settings per local rank.

    Each recommendation carries its reason and source, marked keep, set, change
    or unset against the current environment. Local rank N drives the Nth GPU
    in PCI bus order (of CUDA_VISIBLE_DEVICES, when set). With --local-rank N
    naming a rank that must not run (exec refuses it), it exits 2, and its shell
    output fails when evaluated. It exits 3 when what it needs of the node could not be
    determined (a capture without the part, or one that records it unread).
    """
    if facts_path is not None:
        plan = _tune_plan_of_capture(ctx, facts_path, nodes, single_switch, with_smt_siblings)
    else:
        plan = _tune_plan(ctx, nodes, single_switch, with_smt_siblings)
    from nodecheck.agent.cli.tune_view import RENDERERS, refused_rank

    if local_rank is not None and plan.rank(local_rank) is None:
        visible = len(plan.ranks)
        fail_usage(
            f"--local-rank {local_rank}: "
            + (f"this node has {visible} GPU rank(s), 0-{visible - 1}" if visible else "no GPU")
        )
    chosen = output_format or ("text" if sys.stdout.isatty() else "shell")
    click.echo(RENDERERS[chosen](plan, local_rank), nl=False)
    refusal = refused_rank(plan, local_rank)
    if refusal:
        # A rank exec refuses: a launcher must not start it either.
        say(f"nodecheck tune: {refusal}", err=True)
        ctx.exit(EXIT_USAGE)


@cli.command(
    "exec",
    context_settings={"allow_interspersed_args": False},
)
@local_rank_option(
    "The local rank. [default: LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK]"
)
@job_options
@click.option("--quiet", is_flag=True, help="Do not print what was applied to stderr.")
@global_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
@click.pass_context
def exec_command(
    ctx: click.Context,
    local_rank: int | None,
    nodes: int | None,
    single_switch: bool,
    with_smt_siblings: bool,
    quiet: bool,
    command: tuple[str, ...],
) -> None:
    """Run CMD bound to its local rank's CPUs and NUMA node, with that rank's environment.

    For launchers: torchrun --no-python nodecheck exec -- python train.py, or
    srun nodecheck exec -- python train.py. Exit status: CMD's own; 1 when the kernel
    refuses the rank's CPUs or numactl could not apply its binding here (CPUs or a NUMA
    node this process may not use); 2 for a bad or missing rank, no GPU for it, a rank
    that must not run, or no CMD; 126 when CMD cannot be run; 127 when CMD is not found.
    """
    import os

    from nodecheck.agent.cli.rank_exec import ExecError, local_rank_from, prepare, rank_plan_for

    try:
        if not command:
            raise ExecError("no command: nodecheck exec [OPTIONS] -- CMD [ARGS...]", EXIT_USAGE)
        rank = local_rank_from(local_rank, os.environ)
        plan = _tune_plan(ctx, nodes, single_switch, with_smt_siblings)
        launch = prepare(plan, rank_plan_for(plan, rank), list(command), os.environ)
        from nodecheck.agent.cli.rank_exec import replace_process

        replace_process(launch, quiet)
    except ExecError as err:
        say(f"nodecheck exec: {err}", err=True)
        ctx.exit(err.code)


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


@cli.command()
@click.argument("which", type=click.Choice([*BENCH_ORDER, "all"]))
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
    "--duration",
    type=FiniteFloatRange(*BENCH_DURATION_RANGE_S),
    default=BenchOptions.duration_s,
    show_default=True,
    metavar="SECONDS",
    help="Measuring time per benchmark.",
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
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    callback=_state_dir,
    help="Where results and baselines are kept: a directory that exists (only the "
    "default is created). [default: /var/lib/nodecheck as root, else "
    "~/.local/state/nodecheck]",
)
@click.option(
    "--idle-window",
    type=FiniteFloatRange(*IDLE_WINDOW_RANGE_S),
    default=BenchOptions.idle_window_s,
    show_default=True,
    metavar="SECONDS",
    help="How long every GPU must be idle before a benchmark starts.",
)
@click.option(
    "--warn-below",
    type=FiniteFloatRange(*RATIO_RANGE, min_open=True),
    default=Thresholds.warn,
    show_default=True,
    metavar="RATIO",
    help="Warn below this ratio to the node's median or the baseline.",
)
@click.option(
    "--fail-below",
    type=FiniteFloatRange(*RATIO_RANGE, min_open=True),
    default=Thresholds.fail,
    show_default=True,
    metavar="RATIO",
    help="Fail below this ratio to the node's median or the baseline.",
)
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

    Each runs in a child process with a deadline, only while every GPU is idle,
    and is judged against the node's other GPUs, its own history and the GPU
    model's expected rate. Same exit status as `check`, and 3 when nothing
    was measured (every benchmark skipped: busy GPUs, no GPU).
    """
    long_lived()
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


@cli.group()
@global_options
def slurm() -> None:
    """Slurm's hooks: the health check (drain and resume), a prolog gate, a task prolog
    with tune's environment, an epilog."""


def gate_options(default_budget_s: float) -> Callable[[F], F]:
    """What `slurm prolog` and `slurm epilog` are told: the GPUs expected, the budget."""

    def decorate(function: F) -> F:
        function = expected_gpus_option("stops the job")(function)
        return click.option(
            "--budget",
            "budget_s",
            type=FiniteFloatRange(*BUDGET_RANGE_S),
            default=default_budget_s,
            metavar="SECONDS",
            help="Give up on the checks after this long in all (then it passes, saying so). "
            f"[default: {default_budget_s:g}]",
        )(function)

    return decorate


def _run_gate(
    ctx: click.Context,
    command: str,
    names: tuple[str, ...] | None,
    expected_gpus: int | None,
    budget_s: float,
    kernel_log: Path | None,
) -> int:
    """Run a gate's checks on this node and say its verdict on stderr; its exit status."""
    fs = node_fs(ctx)
    from nodecheck.agent.slurm.prolog import run_gate, say
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.node.nvml import NvmlSession

    config = check_config(ctx, expected_gpus=expected_gpus)
    # No NVML call may take the whole budget: a hung GPU is then an error, not a hang.
    nvml = NvmlSession(
        deadline_s=min(config.nvml_timeout_s, budget_s / 2),
        library_path=settings(ctx)["nvml_library"],
    )
    context = CheckContext(fs=fs, nvml=nvml, kernel_log=kernel_log, config=config)
    outcome = run_gate(command, context, names, budget_s)
    say(outcome)
    return outcome.code


@slurm.command("prolog")
@gate_options(DEFAULT_PROLOG_BUDGET_S)
@kernel_log_option
@global_options
@click.pass_context
def slurm_prolog(
    ctx: click.Context, expected_gpus: int | None, budget_s: float, kernel_log: Path | None
) -> None:
    """The gate before a job, for slurm.conf's Prolog= (as root, on the node).

    Runs the GPU checks (gpu_count, gpu_xid, gpu_memory_errors) under a budget and
    exits 1 only when the node is unusable for any job: a GPU lost, a drain-class XID,
    uncorrectable memory errors, fewer GPUs than expected; Slurm then drains the node
    and requeues the job. Anything else (warn, error, a slow link) passes with a line
    on stderr. It never calls a Slurm command.
    """
    from nodecheck.agent.slurm.prolog import gate_checks

    ctx.exit(_run_gate(ctx, "prolog", gate_checks(), expected_gpus, budget_s, kernel_log))


@slurm.command("epilog")
@gate_options(DEFAULT_EPILOG_BUDGET_S)
@kernel_log_option
@global_options
@click.pass_context
def slurm_epilog(
    ctx: click.Context, expected_gpus: int | None, budget_s: float, kernel_log: Path | None
) -> None:
    """The checks after a job, for slurm.conf's Epilog= (as root, on the node).

    Runs every quick check (never a benchmark) under a budget; exits 1, and Slurm drains
    the node, only on what makes it unusable (as the prolog); the rest on stderr.
    """
    from nodecheck.agent.slurm.prolog import NO_BENCHMARKS_HERE

    click.echo(f"nodecheck epilog: {NO_BENCHMARKS_HERE}", err=True)
    ctx.exit(_run_gate(ctx, "epilog", None, expected_gpus, budget_s, kernel_log))


@slurm.command("task-prolog")
@local_rank_option("The task's local rank. [default: SLURM_LOCALID]")
@job_options
@global_options
@click.pass_context
def slurm_task_prolog(
    ctx: click.Context,
    local_rank: int | None,
    nodes: int | None,
    single_switch: bool,
    with_smt_siblings: bool,
) -> None:
    """This task's tune environment, for slurm.conf's TaskProlog=.

    Prints the export NAME=value and unset NAME lines slurmstepd applies to the task
    (its local rank from SLURM_LOCALID, its GPU from CUDA_VISIBLE_DEVICES or
    SLURM_STEP_GPUS), and print lines for what the user should see. Exit status 2, with
    nothing exported, for a rank that must not run here (its GPU lost) or no local rank
    at all; a task beyond the node's GPUs, or on a node without GPUs, gets nothing set
    and exit status 0.
    """
    from nodecheck.agent.slurm.task import (
        EXIT_MUST_NOT_RUN,
        TaskPrologError,
        local_rank_of_task,
        print_line,
        task_prolog_lines,
    )

    try:
        rank = local_rank_of_task(local_rank, os.environ)
    except TaskPrologError as err:
        click.echo(print_line(f"nodecheck task-prolog: {err}"))
        ctx.exit(EXIT_MUST_NOT_RUN)
    # Tuning is advice: a node that cannot be read in time, or a plan that fails, must
    # not cancel every task (a non-zero TaskProlog exit does). The task runs as it is,
    # and its user reads why in a `print` line.
    try:
        plan = _tune_plan(
            ctx, nodes, single_switch, with_smt_siblings, timeout_s=TASK_PROLOG_TIMEOUT_S
        )
    except SystemExit:
        click.echo(
            print_line("nodecheck task-prolog: the node could not be read in time; no tuning")
        )
        ctx.exit(0)
    except Exception as err:
        log.debug("event=task_prolog_failed", exc_info=err)
        click.echo(print_line(f"nodecheck task-prolog: no tuning ({type(err).__name__}: {err})"))
        ctx.exit(0)
    lines, code = task_prolog_lines(plan, rank, os.environ)
    for line in lines:
        click.echo(line)
    ctx.exit(code)


@slurm.command("health-check")
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
    config = _config_or_exit(config_path)
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


@cli.command()
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


def long_lived() -> None:
    """The cyclic garbage collector back on, for a command that runs for long: what was
    allocated so far (modules, click's tables) is moved out of its sight for good. Such
    a command (the collector on) also leaves through the interpreter's own shutdown."""
    gc.freeze()
    gc.enable()


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
    logging.shutdown()
    os._exit(status)


def main() -> None:
    """Entry point: no traceback reaches a user (--log-level debug logs where it rose)."""
    # A command lives for a fraction of a second and keeps most of what it allocates (the
    # facts, the results): the cyclic collector would only walk them again and again (a
    # twentieth of `check --facts`, bench/cli_latency.py). The long-lived commands (the
    # agent, the benchmarks) turn it back on: long_lived().
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
