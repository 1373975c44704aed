"""8 simulated nodes: 8 network namespaces on a bridge, one rank each, gloo over TCP.

One node's veth slowed by a tbf qdisc: the sweep names that node, and only it; the same
set unshaped names nothing; a slow *link* (what one node sends to one other, shaped) is
told apart from a slow node: both ends named as a link, each with the other as peer.
Payloads and rates are small (1 MiB, 50 Mbit/s against veth's GB/s), so each run takes
seconds on a loaded 2-core machine. There, healthy pairs measured at once spread by up to
5x (the pairs share two cores), while the shaped node is over 100x slower: the thresholds
are set between (--warn-below 0.1, --fail-below 0.05), where a real fabric's defaults
(0.9, 0.8) would name noise.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodecheck.checks.config import default_state_dir
from nodecheck.checks.rules.network_sweep import pair_rounds
from tests.conftest import Node
from tests.fixtures.netns import INSIDE, SimulatedNodes, unavailable
from tests.fixtures.network_ranks import NODECHECK, RankRun, rank_env, start, wait_all
from tests.fixtures.nodegen import build_node
from tests.fixtures.nodes import workstation

pytest.importorskip("torch", reason="torch (the CPU build make test installs)")

NODES = 8
SLOW_RATE = "50mbit"
PORT = 29500  # inside node-0's namespace: nothing else listens there
DEADLINE_S = 240.0


@pytest.fixture(scope="module")
def nodes() -> Iterator[SimulatedNodes]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    simulated = SimulatedNodes(NODES)
    try:
        try:
            simulated.create()
        except RuntimeError as err:
            pytest.skip(f"cannot make network namespaces here: {err}")
        yield simulated
    finally:
        simulated.remove()


@pytest.fixture
def unshaped(nodes: SimulatedNodes) -> Iterator[SimulatedNodes]:
    nodes.clear()
    yield nodes
    nodes.clear()


def sweep(
    nodes: SimulatedNodes, state: Path, state_dirs: dict[int, Path] | None = None
) -> tuple[list[RankRun], dict, list[dict]]:  # type: ignore[type-arg]
    """One run over the 8 nodes: every rank's exit, rank 0's JSON report, each record
    (node i's in `state`/node-i, or in `state_dirs`[i])."""
    directories = {index: state / f"node-{index}" for index in range(NODES)}
    directories.update(state_dirs or {})
    processes = []
    for index in range(NODES):
        directories[index].mkdir(parents=True, exist_ok=True)
        argv = [
            *NODECHECK, "bench", "network", "--device", "cpu", "--payload-mib", "1",
            "--duration", "0.1", "--sweep", "always", "--json", "--rendezvous-timeout", "60",
            "--warn-below", "0.1", "--fail-below", "0.05", "--node-name", f"node-{index}",
            "--state-dir", str(directories[index]),
        ]  # fmt: skip
        env = rank_env(index, NODES, nodes.address(0), PORT, GLOO_SOCKET_IFNAME=INSIDE)
        processes.append(start(nodes.command(index, argv, env)))
    runs = wait_all(processes, DEADLINE_S)
    report = json.loads(runs[0].stdout)
    records = [
        json.loads((directories[index] / "network.json").read_text()) for index in range(NODES)
    ]
    return runs, report, records


def verdicts(report: dict) -> dict[str, tuple[str, str | None]]:  # type: ignore[type-arg]
    return {row["node"]: (row["culprit"], row["peer"]) for row in report["results"]}


def test_a_healthy_set_names_nothing(unshaped: SimulatedNodes, tmp_path: Path) -> None:
    runs, report, records = sweep(unshaped, tmp_path)
    assert [run.code for run in runs] == [0] * NODES, [run.stderr for run in runs]
    assert all(not run.stdout for run in runs[1:])  # only rank 0 reports
    assert report["status"] == "ok" and report["ranks"] == NODES
    assert set(verdicts(report).values()) == {("none", None)}
    assert report["sweep"]["rounds_run"] == 2 and report["sweep"]["confident"]  # MIN_ROUNDS
    assert report["expected_source"] == "the run's median pair"
    assert "no NIC rate" in report["expected_note"]
    whole = report["whole_job"]
    assert 0 < whole["busbw_min"] <= whole["busbw_p10"] <= whole["busbw_median"]
    assert whole["busbw_median"] <= whole["busbw_p90"]
    assert [record["node"] for record in records] == [f"node-{i}" for i in range(NODES)]
    assert all(record["verdict"]["status"] == "ok" for record in records)
    assert all(len(record["pairs"]) == 2 for record in records)


def test_a_slow_node_is_named(unshaped: SimulatedNodes, tmp_path: Path) -> None:
    # node-5 is also a replica node of that name, its record written where its agent reads
    # it (the default state directory under its root), and judged there by its agent's
    # check after the sweep: the record as the sweep writes it, not a literal one.
    spec = workstation(with_gpu=False)
    spec.hostname = "node-5"
    replica = Node(build_node(spec, tmp_path / "node-5-root"))
    agent_state = replica.fs.host(str(default_state_dir()))
    unshaped.slow_node(5, SLOW_RATE)
    runs, report, records = sweep(unshaped, tmp_path, {5: agent_state})
    # Rank 0 says something is slow; the others measured (their records written).
    assert [run.code for run in runs] == [1] + [0] * (NODES - 1), [run.stderr for run in runs]
    named = {node: v for node, v in verdicts(report).items() if v != ("none", None)}
    assert named == {"node-5": ("node", None)}, report["results"]
    assert report["sweep"]["confident"] and report["sweep"]["rounds_run"] >= 3
    slow = records[5]
    assert slow["verdict"]["culprit"] == "node" and slow["verdict"]["status"] == "fail"
    assert slow["verdict"]["confidence"] == "high"
    assert "node-5 is slow with every partner" in slow["verdict"]["message"]
    # Its pairs, each with the figure measured, all slow; a partner's only slow pair is it.
    assert all(pair["slow"] for pair in slow["pairs"]) and len(slow["pairs"]) >= 2
    for record in records[:5] + records[6:]:
        assert record["verdict"]["culprit"] == "none"
        assert all(pair["peer"] == "node-5" for pair in record["pairs"] if pair["slow"])
    judged = subprocess.run(
        [*NODECHECK, *replica.cli_args, "check", "--only", "network_sweep", "--json"],
        capture_output=True, text=True, env={**replica.env, "PATH": os.environ["PATH"]},
        timeout=120, check=False,
    )  # fmt: skip
    # Named with high confidence, but over gloo (sockets, not the GPUs' rails): a warning
    # of the GPU-performance class, never a failure that drains (exit 0).
    assert judged.returncode == 0, judged.stderr
    [result] = json.loads(judged.stdout)["results"]
    assert result["status"] == "warn" and result["class"] == "gpu-performance"
    assert "node-5" in result["summary"], result
    assert "measured over gloo: not failing the node on it" in result["summary"]


def test_a_slow_link_is_told_apart_from_a_slow_node(
    unshaped: SimulatedNodes, tmp_path: Path
) -> None:
    first, second = pair_rounds(NODES, 1)[0][1]  # node-2 and node-3 meet in round 1
    unshaped.slow_link(first, second, SLOW_RATE)
    runs, report, records = sweep(unshaped, tmp_path)
    # Rank 0 says something is slow; the others measured (their records written).
    assert [run.code for run in runs] == [1] + [0] * (NODES - 1), [run.stderr for run in runs]
    named = {node: v for node, v in verdicts(report).items() if v != ("none", None)}
    assert named == {
        f"node-{first}": ("link", f"node-{second}"),
        f"node-{second}": ("link", f"node-{first}"),
    }, report["results"]
    assert records[first]["verdict"]["culprit"] == "link"
    assert records[first]["verdict"]["confidence"] == "low"  # one measurement
    assert records[first]["verdict"]["peer"] == f"node-{second}"
    assert (
        f"the link node-{first} <-> node-{second} is slow" in records[first]["verdict"]["message"]
    )
