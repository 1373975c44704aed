"""`nodecheck snapshot`: the root snapshot (agent/daemon/snapshot.py) written for the agent."""

from __future__ import annotations

from pathlib import Path

import click

from nodecheck.agent.cli.options import (
    global_options,
    node_fs,
    nvml_session,
    say,
    say_unread,
    written_or_exit,
)


@click.command("snapshot")
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
    written = written_or_exit("snapshot", output, lambda: write_snapshot(output, facts))
    say_unread("nodecheck snapshot", facts)
    names = ", ".join(check.name for check in checks)
    # Written through (`--output /dev/stdout`), stdout may be the document itself.
    say(f"{output}: {len(facts.parts)} parts, for {names}", err=written.through)
