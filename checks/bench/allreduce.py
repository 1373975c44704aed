"""all_reduce bus bandwidth across the node's GPUs (NCCL), or local processes (gloo, --device cpu).

An all_reduce that reaches 60 % of what the NVLink fabric should is a node that
passes every health check and still slows a job. The child
(child/allreduce.py) runs one rank per GPU over a short payload ladder; the
largest payload is judged against the published rate for the node type (at
1 GiB or more, docs/hardware.md §13) and against this node's own baseline.
"""

from __future__ import annotations

from typing import Any

from nodecheck.checks.bench.driver import (
    Judgement,
    Target,
    base_spec,
    fold,
    memory_caps,
    ratio_verdict,
    run_benchmark,
    select_targets,
)
from nodecheck.checks.bench.nccl_log import UNKNOWN
from nodecheck.checks.bench.state import BenchState
from nodecheck.checks.config import BenchOptions
from nodecheck.checks.context import CheckContext
from nodecheck.checks.registry import register_benchmark
from nodecheck.checks.result import NODE, MetricSpec, Result, Sample, Status
from nodecheck.checks.rules.gpu_peaks import FLOOR_MIN_PAYLOAD, allreduce_floor

# A fleet compares busbw only between nodes of one GPU model and world size, at one
# payload; the algorithm NCCL ran is shown beside it (a node that fell back from NVLS
# to Ring is a straggler with a reason) but not compared by.
LABELS = ("payload_bytes", "algorithm", "model", "ranks")
BUSBW = MetricSpec(
    "nodecheck_bench_allreduce_bus_bandwidth_bytes_per_second",
    "gauge",
    "all_reduce bus bandwidth, median iteration (algbw x 2(n-1)/n, as nccl-tests)",
    LABELS,
)
WORST = MetricSpec(
    "nodecheck_bench_allreduce_worst_bus_bandwidth_bytes_per_second",
    "gauge",
    "all_reduce bus bandwidth of the slowest iteration",
    LABELS,
)
SPREAD = MetricSpec(
    "nodecheck_bench_allreduce_variation_ratio",
    "gauge",
    "Coefficient of variation of the per-iteration bus bandwidth",
    LABELS,
)
REMEDY = (
    "check gpu_nvlink (links down, errors), pcie_acs and nccl_env (NCCL_P2P_DISABLE, "
    "NCCL_ALGO), then rerun; a node still slow is a fabric (NVSwitch, NVLink) case for RMA"
)


def _what(targets: list[Target], world: int) -> str:
    gpu = targets[0].gpu if targets and targets[0].gpu else None
    return f"{world}x{gpu.model}" if gpu else f"{world}xcpu"


def judge_allreduce(
    result: dict[str, Any],
    targets: list[Target],
    state: BenchState,
    options: BenchOptions,
    host: str = "",
) -> Judgement:
    rows = result["payloads"]
    world = int(result["world_size"])
    what = _what(targets, world)
    # Per host: a node's fabric is its own, even in a state directory shared over NFS.
    keys = {row["bytes"]: f"allreduce/{host}/{what}/{row['bytes']}" for row in rows}
    top = max(rows, key=lambda row: row["bytes"])
    busbw = float(top["busbw_gbps"])
    model = targets[0].gpu.model if targets and targets[0].gpu else "cpu"
    floor = allreduce_floor(model, world) if top["bytes"] >= FLOOR_MIN_PAYLOAD else None
    baseline = state.baseline(keys[top["bytes"]])
    thresholds = options.thresholds
    status, texts = fold(
        [
            ratio_verdict(busbw, baseline, "its baseline", thresholds.warn, thresholds.fail),
            ratio_verdict(
                busbw,
                floor,
                f"the {floor:g} GB/s of a healthy {what}" if floor else "",
                thresholds.reference_warn,
                thresholds.reference_fail,
            ),
        ]
    )
    texts.append(f"iterations vary {top['busbw_cv']:.0%}, worst {top['busbw_worst_gbps']:.3g} GB/s")
    summary = (
        f"busbw {busbw:.3g} GB/s at {top['bytes'] / 2**20:g} MiB over {world} ranks "
        f"({result['backend']}): {'; '.join(texts)}"
    )
    samples = []
    for row in rows:
        labels = {
            "payload_bytes": str(row["bytes"]),
            # A child that did not say (a test double, an older child): not a guess.
            "algorithm": str(row.get("algorithm") or UNKNOWN),
            "model": model,
            "ranks": str(world),
        }
        samples += [
            Sample(BUSBW, row["busbw_gbps"] * 1e9, labels),
            Sample(WORST, row["busbw_worst_gbps"] * 1e9, labels),
            Sample(SPREAD, row["busbw_cv"], labels),
        ]
    details = {"world_size": world, "backend": result["backend"], "payloads": rows}
    details["floor_gbps"] = floor
    details["baseline_gbps"] = baseline
    remedy = REMEDY if status is not Status.OK else ""
    judgement = Judgement(
        [Result(status, NODE, summary, remedy, details, tuple(samples))], measured=bool(rows)
    )
    if status is Status.OK:
        judgement.good_values = {keys[row["bytes"]]: float(row["busbw_gbps"]) for row in rows}
    return judgement


@register_benchmark("allreduce", interval_s=86400, timeout_s=3600)
def bench_allreduce(ctx: CheckContext) -> list[Result]:
    """all_reduce bus bandwidth across the GPUs, against the node type and baseline."""
    options = ctx.config.bench
    targets = select_targets(ctx, options)
    if isinstance(targets, Result):
        return [targets]
    if options.device == "cuda" and len(targets) < 2:
        return [Result(Status.SKIP, NODE, "all_reduce needs at least two GPUs")]
    caps = memory_caps(ctx, targets, options.memory_fraction)
    spec = {
        **base_spec("allreduce", options, targets),
        "processes": options.processes,
        # NCCL needs room of its own beside the tensor: a quarter of the cap.
        "max_bytes_per_rank": min(caps.values()) // 4 if caps else None,
    }
    return run_benchmark(ctx, spec, targets, judge_allreduce)
