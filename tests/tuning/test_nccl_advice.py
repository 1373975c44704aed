"""NCCL advice that rests on NCCL's defaults and the ML Engineering book, quoted right:
NCCL_DEBUG=WARN (unset, NCCL logs nothing), queue pairs per connection as advice (the
fabric decides, not a count of GPUs), the book's throughput bands per GPU for what it
measured, and the RoCE traffic class named, never guessed."""

from __future__ import annotations

from collections.abc import Callable, Mapping

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


def test_network_note_quotes_the_book_per_gpu(dgx: Node, build: Callable[..., Node]) -> None:
    """8x400 Gb/s for 8 GPUs is 400 per GPU: the top of the book's "ok" band, not a need;
    the XE9680's storage ports are not counted."""
    note = network(plan_for(dgx, nodes=16))
    assert "3200 Gb/s between nodes" in note and "400 Gb/s per GPU over 8 GPU(s)" in note
    assert '"100Gbps is not enough, 200-400Gbps is ok, 800-1000Gbps is ideal"' in note
    assert "ZeRO-3 on V100s at 64+ GPUs" in note and "need" not in note
    assert "too little" not in note and 'in the book\'s "ok" band (200-400 Gb/s)' in note
    xe = network(plan_for(build("xe9680"), nodes=16))
    assert "400 Gb/s per GPU over 8 GPU(s)" in xe and "not counted: storage" in xe
    small = network(plan_for(dgx, nodes=2))
    assert "this job has 16 GPUs, fewer than the 64 the book measured" in small


def test_throughput_bands() -> None:
    """Each band of the book, per GPU (pure: the figures alone)."""
    shape = JobShape(16)
    assert '"ideal" band' in throughput_verdict(8 * 800, 8, shape)
    assert 'in the book\'s "ok" band' in throughput_verdict(8 * 200, 8, shape)
    assert 'above the book\'s "ok" band' in throughput_verdict(8 * 401, 8, shape)
    assert 'below the book\'s "ok" band' in throughput_verdict(8 * 150, 8, shape)
    assert '"not enough" (100 Gb/s)' in throughput_verdict(8 * 100, 8, shape)
    # 200 Gb/s per node over 2 GPUs is 100 per GPU; the same over 1 GPU is "ok".
    assert '"not enough"' in throughput_verdict(200, 2, shape)
    assert '"ok" band' in throughput_verdict(200, 1, shape)


def test_roce_traffic_class_is_named_never_guessed(dgx: Node, build: Callable[..., Node]) -> None:
    roce = plan_for(build("xe9680"))
    [note] = [note for note in roce.notes if note.startswith("RoCE (")]
    assert "traffic class 0 and service level 0" in note
    assert "NCCL_IB_TC" in note and "NCCL_IB_SL" in note and "does not guess" in note
    assert "NCCL_IB_TC" not in roce.environment(None)
    # The DGX's rails are InfiniBand; its RoCE port is storage, which NCCL is kept off.
    assert not [note for note in plan_for(dgx).notes if note.startswith("RoCE (")]
