"""NCCL advice that rests on NCCL's defaults and the ML Engineering book, quoted right:
NCCL_DEBUG=WARN (unset, NCCL logs nothing), queue pairs per connection as advice (the
fabric decides, not a count of GPUs), the book's throughput bands for the node, in its
words and unit and as the derivation they are, the RoCE traffic class named, never
guessed, and the GID index said only where a compute rail runs RoCE."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from nodecheck.tuning.nccl import JobShape, throughput_verdict
from nodecheck.tuning.plan import Plan, TuneOptions, make_plan
from nodecheck.tuning.recommendation import Action, LeftUnset, Recommendation
from tests.conftest import Node
from tests.fixtures.pinned_facts import JOB_TORCH_2_13, TORCH_2_13, with_parts


def plan_for(node: Node, environ: Mapping[str, str] | None = None, nodes: int = 16) -> Plan:
    options = TuneOptions(shape=JobShape(nodes))
    return make_plan(
        with_parts(
            node.context(environ or {}), torch_version=TORCH_2_13, job_versions=JOB_TORCH_2_13
        ),
        options,
    )


def env_of(plan: Plan) -> dict[str, Recommendation]:
    return {r.name: r for r in plan.env}


def left(plan: Plan, name: str) -> LeftUnset:
    return next(item for item in plan.left_unset if name in item.names)


def network(plan: Plan) -> str:
    [note] = [note for note in plan.notes if note.startswith("network:")]
    return note


def test_nccl_debug_is_warn_and_a_chosen_level_is_kept(dgx: Node) -> None:
    unset = env_of(plan_for(dgx))["NCCL_DEBUG"]
    assert (unset.value, unset.action, unset.advisory) == ("WARN", Action.SET, False)
    assert "NCCL logs nothing" in unset.reason and "src/debug.cc" in unset.source
    warn = env_of(plan_for(dgx, {"NCCL_DEBUG": "WARN"}))["NCCL_DEBUG"]
    assert warn.action is Action.KEEP
    # INFO is one change to WARN (not an "unset"), and the user's to keep while debugging.
    plan = plan_for(dgx, {"NCCL_DEBUG": "INFO"})
    info = env_of(plan)["NCCL_DEBUG"]
    assert (info.value, info.action, info.current, info.advisory) == (
        "WARN",
        Action.CHANGE,
        "INFO",
        True,
    )
    assert not [r for r in plan.removals if r.name == "NCCL_DEBUG"]


def test_queue_pairs_are_advice_not_a_count_of_gpus(dgx: Node, build: Callable[..., Node]) -> None:
    """128 GPUs on InfiniBand (adaptive routing on by default) and on RoCE (off): neither
    gets NCCL_IB_QPS_PER_CONNECTION set; the reason says why for its link layer."""
    infiniband = plan_for(dgx, nodes=16)
    assert "NCCL_IB_QPS_PER_CONNECTION" not in infiniband.environment(None)
    reason = left(infiniband, "NCCL_IB_QPS_PER_CONNECTION").reason
    assert "adaptive routing on by default" in reason and "confirm with the" in reason
    assert "64" not in reason  # no switch's port count stands in for the fabric
    roce = plan_for(build("xe9680"), nodes=16)
    assert "NCCL_IB_QPS_PER_CONNECTION" not in roce.environment(None)
    reason = left(roce, "NCCL_IB_QPS_PER_CONNECTION").reason
    assert "on RoCE NCCL leaves adaptive routing off" in reason and "ECMP" in reason


BOOK_QUOTE = (
    '"To get reasonable GPU throughput when training at scale (64+GPUs) with DeepSpeed ZeRO '
    'Stage 3 with V100s": "100Gbps is not enough", "200-400Gbps is ok", "800-1000Gbps is ideal"'
)


def test_network_note_per_node_and_per_gpu(dgx: Node, build: Callable[..., Node]) -> None:
    """The book's bands are for a node (deepspeedai/DeepSpeed#2928's math counts a node's traffic):
    the L40S node's 4 x 200 Gb/s, 100 per GPU, is in "800-1000Gbps is ideal", not "not
    enough" per GPU; the figure per GPU is said, never judged. The quote is the book's
    own words and unit, from network/benchmarks/README.md, as a derivation."""
    l40s = network(plan_for(build("l40s-epyc"), nodes=16))
    assert "800 Gb/s between nodes (4 compute RDMA NIC(s) at 200 Gb/s" in l40s
    assert "not counted: storage mlx5_4, mlx5_5 at 100 Gb/s" in l40s
    assert "100 Gb/s per GPU over 8 GPU(s)" in l40s
    assert 'is in the book\'s "800-1000Gbps is ideal"' in l40s and "at or below" not in l40s
    for note in (l40s, network(plan_for(dgx, nodes=16))):
        assert BOOK_QUOTE in note and "network/benchmarks/README.md" in note
        assert "deepspeedai/DeepSpeed#2928" in note and "a derivation" in note
        assert "for a node's bandwidth to the others" in note and "no figure per GPU" in note
        assert "network/README.md" not in note and "need" not in note
    dgx_note = network(plan_for(dgx, nodes=16))
    assert "3200 Gb/s between nodes (8 compute RDMA NIC(s)" in dgx_note
    assert "400 Gb/s per GPU over 8 GPU(s)" in dgx_note
    assert 'above the book\'s "800-1000Gbps is ideal"' in dgx_note
    xe = network(plan_for(build("xe9680"), nodes=16))
    assert "3200 Gb/s between nodes" in xe and "not counted: storage" in xe
    small = network(plan_for(dgx, nodes=2))
    assert "this job has 16 GPUs, fewer than the 64+ the bands are for" in small


@pytest.mark.parametrize(
    ("node_gbps", "band"),
    [
        (1600, 'above the book\'s "800-1000Gbps is ideal"'),
        (1000, 'in the book\'s "800-1000Gbps is ideal"'),
        (800, 'in the book\'s "800-1000Gbps is ideal"'),
        (600, 'between the book\'s "200-400Gbps is ok" and "800-1000Gbps is ideal"'),
        (400, 'in the book\'s "200-400Gbps is ok"'),
        (200, 'in the book\'s "200-400Gbps is ok"'),
        (150, 'between the book\'s "100Gbps is not enough" and "200-400Gbps is ok"'),
        (100, 'at or below the book\'s "100Gbps is not enough"'),
        (2.5, 'at or below the book\'s "100Gbps is not enough"'),
    ],
)
def test_throughput_bands_are_for_the_node(node_gbps: float, band: str) -> None:
    """Each band of the book against the node's total, whatever its GPU count: 800 Gb/s
    is the same band for one GPU or eight (pure: the figures alone)."""
    shape = JobShape(16)
    for ranks in (1, 4, 8):
        assert f"{node_gbps:g} Gb/s for the node is {band}:" in throughput_verdict(
            node_gbps, ranks, shape
        )


def test_gid_note_only_for_compute_roce_ports(dgx: Node, build: Callable[..., Node]) -> None:
    """The DGX's rails are InfiniBand; its one RoCE port (mlx5_8) is storage, which
    NCCL_IB_HCA keeps NCCL off: no GID note. On the L40S node the rails are RoCE: the note
    names them, not the storage ConnectX-6 Dx (mlx5_4, mlx5_5)."""
    assert not [item for item in plan_for(dgx).left_unset if "NCCL_IB_GID_INDEX" in item.names]
    gid = left(plan_for(build("l40s-epyc")), "NCCL_IB_GID_INDEX")
    assert "on the RoCE rails (mlx5_0, mlx5_1, mlx5_2, mlx5_3)" in gid.reason
    assert "mlx5_4" not in gid.reason and "mlx5_5" not in gid.reason


def test_roce_traffic_class_is_named_never_guessed(dgx: Node, build: Callable[..., Node]) -> None:
    roce = plan_for(build("xe9680"))
    [note] = [note for note in roce.notes if note.startswith("RoCE (")]
    assert "traffic class 0 and service level 0" in note
    assert "NCCL_IB_TC" in note and "NCCL_IB_SL" in note and "does not guess" in note
    assert "NCCL_IB_TC" not in roce.environment(None)
    # The DGX's rails are InfiniBand; its RoCE port is storage, which NCCL is kept off.
    assert not [note for note in plan_for(dgx).notes if note.startswith("RoCE (")]
