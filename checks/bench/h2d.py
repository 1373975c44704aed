"""Host-to-device and device-to-host copy bandwidth per GPU, from pinned memory on its NUMA node.

Confirms under load what pcie_link sees at idle: a GPU whose copies run at
half its peers' rate has a link problem (x8, a slow switch uplink) or a NUMA
placement problem, either of which starves its data loader.
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
    run_benchmark,
    select_targets,
)
from nodecheck.checks.bench.state import BenchState
from nodecheck.checks.config import BenchOptions
from nodecheck.checks.context import CheckContext
from nodecheck.checks.per_gpu import GPU_LABELS
from nodecheck.checks.registry import register_benchmark
from nodecheck.checks.result import NODE, MetricSpec, Result, Sample, Status, gpu_subject

H2D = MetricSpec(
    "nodecheck_bench_h2d_bandwidth_bytes_per_second",
    "gauge",
    "Host-to-device copy bandwidth from pinned memory on the GPU's NUMA node",
    GPU_LABELS,
)
D2H = MetricSpec(
    "nodecheck_bench_d2h_bandwidth_bytes_per_second",
    "gauge",
    "Device-to-host copy bandwidth into pinned memory on the GPU's NUMA node",
    GPU_LABELS,
)
DIRECTIONS = (("h2d", H2D), ("d2h", D2H))
REMEDY = (
    "compare with pcie_link and gpu_pcie for this GPU (width, speed, the switch uplink) and "
    "with numa (is it on the right node?); reseat the GPU or riser if the link is narrow"
)


def judge_h2d(
    result: dict[str, Any],
    targets: list[Target],
    state: BenchState,
    options: BenchOptions,
    host: str = "",
) -> Judgement:
    devices = result["devices"]
    judgement = Judgement([])
    medians = {
        direction: statistics.median(
            float(devices[t.name][f"{direction}_bytes_per_second"]) for t in targets
        )
        if len(targets) > 1
        else None
        for direction, _ in DIRECTIONS
    }
    for target in targets:
        measured = devices[target.name]
        identity = target.gpu.uuid if target.gpu and target.gpu.uuid else f"{host}/{target.name}"
        labels = target.gpu.labels() if target.gpu else {"gpu": "", "bus_id": "", "model": "cpu"}
        checks: list[tuple[Status, str] | None] = []
        texts = []
        samples = []
        for direction, spec in DIRECTIONS:
            rate = float(measured[f"{direction}_bytes_per_second"])
            key = f"h2d/{identity}/{direction}"
            baseline = state.baseline(key)
            status, notes = fold(
                peer_and_baseline(rate, medians[direction], baseline, options.thresholds)
            )
            checks.append((status, ""))
            texts.append(
                f"{direction} {rate / 1e9:.3g} GB/s" + (f" ({', '.join(notes)})" if notes else "")
            )
            samples.append(Sample(spec, rate, labels))
            if status is Status.OK:
                judgement.good_values[key] = rate
        status, _ = fold(checks)
        subject = gpu_subject(target.gpu.bus_id) if target.gpu and target.gpu.bus_id else NODE
        details = {
            "bytes": measured["bytes"],
            "cpus": measured["cpus"],
            **{f"{d}_bytes_per_second": measured[f"{d}_bytes_per_second"] for d, _ in DIRECTIONS},
        }
        judgement.results.append(
            Result(
                status,
                subject,
                "; ".join(texts),
                REMEDY if status is not Status.OK else "",
                details,
                tuple(samples),
            )
        )
    return judgement


@register_benchmark("h2d", interval_s=86400, timeout_s=3600)
def bench_h2d(ctx: CheckContext) -> list[Result]:
    """Host-device copy bandwidth per GPU, bound to the GPU's NUMA node."""
    options = ctx.config.bench
    targets = select_targets(ctx, options)
    if isinstance(targets, Result):
        return [targets]
    local_cpus = {gpu.bdf: sorted(gpu.local_cpus) for gpu in ctx.pci_gpus if gpu.local_cpus}
    spec = {
        **base_spec("h2d", options, targets),
        "max_bytes": memory_caps(ctx, targets, options.memory_fraction),
        "cpus": {
            t.name: local_cpus[t.gpu.bus_id]
            for t in targets
            if t.gpu and t.gpu.bus_id in local_cpus
        },
    }
    return run_benchmark(ctx, spec, targets, judge_h2d)
