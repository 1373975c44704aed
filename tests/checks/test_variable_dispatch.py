"""On the replicas: the RoCE ports' GID tables read as facts (and through a capture), and
`check` (nccl_env, torch_alloc) and `tune` (red_flags) judging variables alike."""

from __future__ import annotations

import os
from collections.abc import Callable

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.codec import decode, encode
from nodecheck.checks.node.facts import LiveFacts, NodeSources, dumps, loads
from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.net import PortGidTypes, read_roce_gid_types
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Result, Status
from nodecheck.checks.runner import run_checks
from nodecheck.tuning.red_flags import removals
from tests.conftest import CLEAN_ENVIRON, Node, by_status

ROCE_PORT = ("mlx5_8", 1)  # the 8-GPU replica's RoCE NIC, nearest no GPU


def test_gid_tables_of_the_roce_port(dgx: Node) -> None:
    """Only the RoCE port's table is read (the eight InfiniBand rails need no GID index),
    each entry's type as the replica's gid_attrs/types/<index> holds it."""
    tables = read_roce_gid_types(dgx.fs, read_inventory(dgx.fs).rdma)
    assert tables == [
        PortGidTypes(*ROCE_PORT, {0: "IB/RoCE v1", 1: "RoCE v2", 2: "IB/RoCE v1", 3: "RoCE v2"})
    ]


def test_gid_tables_round_trip(dgx: Node) -> None:
    tables = read_roce_gid_types(dgx.fs, read_inventory(dgx.fs).rdma)
    assert decode(list[PortGidTypes], encode(tables), "roce_gids") == tables
    live = LiveFacts(NodeSources(fs=dgx.fs, environ=dict(CLEAN_ENVIRON), uid=1000))
    captured = live.capture(["inventory", "roce_gids"])
    assert loads(dumps(captured)).get("roce_gids") == tables == captured.get("roce_gids")


def gid_results(context: CheckContext) -> list[Result]:
    (run,) = run_checks([load_checks()["nccl_env"]], context)
    return [r for r in run.results if "GID index" in r.summary]


def test_gid_index_judged_from_a_capture_as_live(dgx: Node) -> None:
    environ = {**CLEAN_ENVIRON, "NCCL_IB_GID_INDEX": "2"}
    live = gid_results(dgx.context(environ))
    (finding,) = by_status(live, Status.WARN)
    assert "mlx5_8 port 1: IB/RoCE v1" in finding.summary
    sources = NodeSources(fs=dgx.fs, environ=environ, uid=1000)
    needs = load_checks()["nccl_env"].needs
    capture = loads(dumps(LiveFacts(sources).capture(needs)))
    assert gid_results(CheckContext(facts=capture)) == live


def test_a_gid_type_that_cannot_be_read_is_an_error(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(dgx)
    types = node.root / "sys/class/infiniband/mlx5_8/ports/1/gid_attrs/types"
    (types / "3").unlink()
    os.mkfifo(types / "3")
    (unknown,) = gid_results(node.context({**CLEAN_ENVIRON, "NCCL_IB_GID_INDEX": "3"}))
    assert unknown.status is Status.ERROR
    assert "cannot tell whether GID index 3 is RoCE v2 on mlx5_8 port 1" in unknown.summary
    assert "a FIFO" in unknown.summary
    # The other entries are still told.
    (wrong,) = gid_results(node.context({**CLEAN_ENVIRON, "NCCL_IB_GID_INDEX": "2"}))
    assert wrong.status is Status.WARN


def test_a_capture_without_gid_tables_cannot_pass_a_gid_index(dgx: Node) -> None:
    """An older capture holding no roce_gids: the GID index is an error, never a pass."""
    environ = {**CLEAN_ENVIRON, "NCCL_IB_GID_INDEX": "3"}
    sources = NodeSources(fs=dgx.fs, environ=environ, uid=1000)
    capture = loads(dumps(LiveFacts(sources).capture(["inventory", "variables", "nccl_library"])))
    (unknown,) = gid_results(CheckContext(facts=capture))
    assert unknown.status is Status.ERROR and "the capture holds no roce_gids" in unknown.summary


# Flagged by nccl_env or torch_alloc, by the dispatch; and sound ones, flagged by neither.
VARIABLES = {
    "NCCL_P2P_DISABLE": "1",
    "NCCL_IB_DISABLE": "1",
    "NCCL_DEBUG": "INFO",
    "NCCL_ALGO": "Ring",
    "NCCL_IB_HCA": "mlx5_9",
    "NCCL_IB_GID_INDEX": "2",
    "NCCL_SOCKET_IFNAME": "docker",
    "NCCL_LL_THRESHOLD": "0",
    "NCCL_ASYNC_ERROR_HANDLING": "1",
    "CUDA_LAUNCH_BLOCKING": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segment:True",
    "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
    "NCCL_IB_TIMEOUT": "22",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "CUDA_VISIBLE_DEVICES": "0,1",
}


def test_check_and_tune_flag_the_same_variables(dgx: Node) -> None:
    environ = {**CLEAN_ENVIRON, **VARIABLES}
    checks = load_checks()
    runs = run_checks([checks["nccl_env"], checks["torch_alloc"]], dgx.context(environ))
    flagged: dict[tuple[str, str], tuple[str, Status]] = {}
    for run in runs:
        for result in by_status(list(run.results), Status.WARN, Status.FAIL):
            if "variable" not in result.details:
                continue  # not about one setting (the allocator names disagreeing)
            key = (str(result.details["variable"]), str(result.details["value"]))
            worst = max(
                result.status,
                flagged.get(key, (run.check.name, Status.OK))[1],
                key=lambda s: s.severity,
            )
            flagged[key] = (run.check.name, worst)
    tuned = {
        (r.name, str(r.flagged_value)): (r.source.split(";")[0], r.severity)
        for r in removals(dgx.context(environ))
    }
    assert {
        key: (f"the {check} check", status.value) for key, (check, status) in flagged.items()
    } == tuned
    assert len(tuned) == 12  # every flagged variable of the table, and only those
