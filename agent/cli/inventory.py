"""`nodecheck inventory`: show the node (or a capture); agent/cli/inventory_view.py renders it."""

from __future__ import annotations

from pathlib import Path

import click

from nodecheck.agent.cli.options import (
    NODE_READ_TIMEOUT_S,
    cannot_without,
    facts_option,
    global_options,
    load_facts,
    node_fs,
    nvml_session,
    of_capture,
)


@click.command("inventory")
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
