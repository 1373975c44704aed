"""`nodecheck capture`: this node's facts as a nodecheck.facts/v1 document."""

from __future__ import annotations

import os
from pathlib import Path

import click

from nodecheck.agent.cli.options import (
    global_options,
    kernel_log_option,
    node_fs,
    nvml_session,
    say,
    say_unread,
    written_or_exit,
)


@click.command("capture")
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
        say_unread("nodecheck capture", facts)
        return
    # A support bundle: readable by its owner only, whole or not at all.
    written = written_or_exit("capture", output, lambda: write_output(output, text, 0o600))
    say_unread("nodecheck capture", facts)
    # Written through (`-o /dev/stdout`), stdout may be the document itself.
    say(f"{output}: {len(facts.parts)} parts", err=written.through)
