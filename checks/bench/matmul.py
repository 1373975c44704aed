"""Matmul TFLOPS per GPU, judged against the node's other GPUs, its own past, and its model.

One GPU 15 % slower than its peers slows every synchronous step of a job to
its pace, and no health counter shows it: only a measurement does. The child
(child/matmul.py) runs a few large shapes on every GPU at once.
"""

from __future__ import annotations

import statistics
from typing import Any

from nodecheck.checks.bench.driver import (
    Judgement,
    Target,
    base_spec,
    fold,
    memory_caps,
    peer_and_baseline,
    ratio_verdict,
    run_benchmark,
    select_targets,
)
from nodecheck.checks.bench.state import BenchState
from nodecheck.checks.config import BenchOptions
from nodecheck.checks.context import CheckContext
from nodecheck.checks.per_gpu import GPU_LABELS
from nodecheck.checks.registry import register_benchmark
from nodecheck.checks.result import NODE, MetricSpec, Result, Sample, Status, gpu_subject
from nodecheck.checks.rules.gpu_peaks import achievable_tflops, matmul_rates

# `shape`: the shapes the GPU ran, in order (the figure is the best of them, so only GPUs
# that ran the same shapes compare: a memory cap that shrank them is another measurement).
LABELS = (*GPU_LABELS, "dtype", "shape")
FLOPS = MetricSpec(
    "nodecheck_bench_matmul_flops_per_second",
    "gauge",
    "Matmul rate of the last benchmark, median of the best shape (2mnk / time)",
    LABELS,
)
PEER_RATIO = MetricSpec(
    "nodecheck_bench_matmul_peer_ratio",
    "gauge",
    "Matmul rate over the median of the node's GPUs in the same run",
    LABELS,
)
BASELINE_RATIO = MetricSpec(
    "nodecheck_bench_matmul_baseline_ratio",
    "gauge",
    "Matmul rate over this GPU's rolling median of good runs",
    LABELS,
)
REMEDY = (
    "look at gpu_throttle and gpu_state for this GPU (clock reasons, power limit, "
    "temperature); if it stays slow with nothing throttling, drain the node and RMA the GPU"
)


def shapes_label(shapes: list[dict[str, Any]]) -> str:
    """The shapes run, each MxNxK, joined with + in run order: "8192x8192x8192+4096x..."."""
    return "+".join("x".join(map(str, shape["shape"])) for shape in shapes)


def baseline_key(target: Target, dtype: str, shapes: list[dict[str, Any]], host: str) -> str:
    """Per GPU (its UUID; the host and device name where there is none, so a state
    directory shared between nodes never mixes them), dtype, and the shapes run: a
    memory cap that shrank them makes a different measurement."""
    identity = target.gpu.uuid if target.gpu and target.gpu.uuid else f"{host}/{target.name}"
    return f"matmul/{identity}/{dtype}/{shapes_label(shapes)}"


def judge_matmul(
    result: dict[str, Any],
    targets: list[Target],
    state: BenchState,
    options: BenchOptions,
    host: str = "",
) -> Judgement:
    devices = result["devices"]
    measured = [t for t in targets if "error" not in devices[t.name]]
    rates = {target.name: float(devices[target.name]["tflops"]) for target in measured}
    peers = statistics.median(rates.values()) if len(rates) > 1 else None
    dtype = options.dtype
    judgement = Judgement([], measured=bool(rates))
    for target in targets:
        subject = gpu_subject(target.gpu.bus_id) if target.gpu and target.gpu.bus_id else NODE
        if target.name not in rates:
            failed = devices[target.name]["error"]
            judgement.results.append(
                Result(Status.ERROR, subject, f"matmul failed: {failed}", details={"cause": failed})
            )
            continue
        tflops = rates[target.name]
        key = baseline_key(target, dtype, devices[target.name]["shapes"], host)
        baseline = state.baseline(key)
        model = target.gpu.model if target.gpu else "cpu"
        expected = achievable_tflops(model, dtype)
        thresholds = options.thresholds
        status, texts = fold(
            [
                *peer_and_baseline(tflops, peers, baseline, thresholds),
                ratio_verdict(
                    tflops,
                    expected,
                    f"the {expected:g} TFLOPS a healthy {model} reaches" if expected else "",
                    thresholds.reference_warn,
                    thresholds.reference_fail,
                ),
            ]
        )
        rates_of_model = matmul_rates(model)
        peak = rates_of_model.peak_tflops.get(dtype) if rates_of_model else None
        shown = f"{tflops:.3g} TFLOPS {dtype}"
        if peak:
            texts.insert(0, f"{tflops / peak:.0%} of the {peak:g} TFLOPS peak")
        summary = shown + (f" ({'; '.join(texts)})" if texts else "")
        labels = {
            **(target.gpu.labels() if target.gpu else {"gpu": "", "bus_id": "", "model": "cpu"}),
            "dtype": dtype,
            "shape": shapes_label(devices[target.name]["shapes"]),
        }
        samples = [Sample(FLOPS, tflops * 1e12, labels)]
        if peers:
            samples.append(Sample(PEER_RATIO, tflops / peers, labels))
        if baseline:
            samples.append(Sample(BASELINE_RATIO, tflops / baseline, labels))
        details = {
            "tflops": tflops,
            "peer_median_tflops": peers,
            "baseline_tflops": baseline,
            "expected_tflops": expected,
            "peak_tflops": peak,
            "shapes": devices[target.name]["shapes"],
        }
        remedy = REMEDY if status is not Status.OK else ""
        judgement.results.append(Result(status, subject, summary, remedy, details, tuple(samples)))
        if status is Status.OK:
            judgement.good_values[key] = tflops
    return judgement


@register_benchmark("matmul", interval_s=86400, timeout_s=3600)
def bench_matmul(ctx: CheckContext) -> list[Result]:
    """Matmul TFLOPS per GPU, all GPUs at once, against peers, baseline and model."""
    options = ctx.config.bench
    targets = select_targets(ctx, options)
    if isinstance(targets, Result):
        return [targets]
    spec = {
        **base_spec("matmul", options, targets),
        "dtype": options.dtype,
        "max_bytes": memory_caps(ctx, targets, options.memory_fraction),
        "bus_ids": {t.name: t.gpu.bus_id for t in targets if t.gpu and t.gpu.bus_id},
    }
    return run_benchmark(ctx, spec, targets, judge_matmul)
