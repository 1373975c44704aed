"""`nodecheck inventory` on a node whose CPUs' node has no memory and whose memory is in
memory-only nodes (the hbm-tiers replica): each says what it serves."""

from __future__ import annotations

import shutil
from pathlib import Path

from nodecheck.agent.cli.inventory_view import memory_relation
from nodecheck.checks.node.inventory import read_inventory
from tests.conftest import Node
from tests.fixtures.nodegen import build_node
from tests.fixtures.nodes import hbm_tiers


def test_memory_only_nodes_say_the_cpus_they_serve(tmp_path: Path) -> None:
    node = Node(build_node(hbm_tiers(), tmp_path / "hbm"))
    nodes = read_inventory(node.fs).numa_nodes
    assert [memory_relation(nodes, n) for n in nodes] == [
        "no memory; its memory: node 1,2",
        "serves CPUs 0-31 (initiators: node 0, access1)",
        "serves CPUs 0-31 (initiators: node 0, access1)",
    ]
    # Without the access directories the CPUs they serve are unknown, never guessed.
    for folder in (node.root / "sys" / "devices" / "system" / "node").glob("node*/access*"):
        shutil.rmtree(folder)
    nodes = read_inventory(node.fs).numa_nodes
    assert [memory_relation(nodes, n) for n in nodes] == [
        "no memory; its memory nodes: could not determine",
        "CPUs it serves: could not determine (no accessN/initiators)",
        "CPUs it serves: could not determine (no accessN/initiators)",
    ]


def test_ordinary_nodes_have_no_relation(tmp_path: Path) -> None:
    spec = hbm_tiers()
    spec.memory_gib_per_node, spec.memory_targets = [64], []
    nodes = read_inventory(Node(build_node(spec, tmp_path / "plain")).fs).numa_nodes
    assert [memory_relation(nodes, n) for n in nodes] == [""]
