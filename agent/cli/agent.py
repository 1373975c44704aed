"""`nodecheck agent`: the daemon (agent/daemon/agent.py), its options checked first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from nodecheck.agent.cli.options import (
    AGENT_LOG_LEVEL,
    CONFIG_OPTION,
    config_or_exit,
    fail_usage,
    given,
    global_options,
    log,
    long_lived,
    node_fs,
    settings,
)
from nodecheck.agent.interruption import Interrupted


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


@click.command("agent")
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
    web_config_file: Path | None,
) -> None:
    fs = node_fs(ctx, log_level=AGENT_LOG_LEVEL)
    from nodecheck.agent.config import DEFAULT_PATH, ConfigError
    from nodecheck.agent.daemon.agent import Agent, ListenError

    config_or_exit(config_path)  # refuse a bad file before starting anything
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
