"""Host-to-device and device-to-host copy bandwidth per GPU, from pinned memory.

One GPU at a time (each link measured alone), with the process bound to the
CPUs of the GPU's own NUMA node so the host buffer is local: what a well-bound
data loader gets. On a GPU with a healthy Gen5 x16 link this is about
50 GB/s each way; a link trained at x8 or Gen4 shows at half (docs/hardware.md §3).

On a CPU-only machine (`--device cpu`) it measures the same copy loop between
two host buffers, so the code path is exercised for real in CI.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import torch

from nodecheck.checks.bench.child.protocol import progress

BUFFER_BYTES = 256 << 20
MIN_TIMED = 3


ORIGINAL_AFFINITY = os.sched_getaffinity(0)


def _bind(cpus: list[int] | None) -> None:
    """The GPU's NUMA node's CPUs, or every CPU we started with when it has none."""
    os.sched_setaffinity(0, cpus or ORIGINAL_AFFINITY)


def _rates(copy: Any, size: int, budget: float, cuda: bool) -> dict[str, float]:
    if cuda:
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    copy()  # warm-up
    rates: list[float] = []
    stop = time.monotonic() + budget
    while len(rates) < MIN_TIMED or time.monotonic() < stop:
        if cuda:
            start.record()
            copy()
            end.record()
            end.synchronize()
            seconds = float(start.elapsed_time(end)) / 1000
        else:
            began = time.perf_counter()
            copy()
            seconds = time.perf_counter() - began
        rates.append(size / seconds)
    return {"bytes_per_second": statistics.median(rates), "iterations": len(rates)}


def measure_gpu(
    index: int | None, size: int, budget: float, cpus: list[int] | None
) -> dict[str, Any]:
    _bind(cpus)
    elements = size // 4
    if index is not None:
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        host = torch.empty(elements, dtype=torch.float32).pin_memory()
        gpu = torch.empty(elements, dtype=torch.float32, device=device)
        h2d = _rates(lambda: gpu.copy_(host, non_blocking=True), size, budget / 2, True)
        d2h = _rates(lambda: host.copy_(gpu, non_blocking=True), size, budget / 2, True)
    else:
        source = torch.ones(elements, dtype=torch.float32)
        target = torch.empty(elements, dtype=torch.float32)
        h2d = _rates(lambda: target.copy_(source), size, budget / 2, False)
        d2h = _rates(lambda: source.copy_(target), size, budget / 2, False)
    return {
        "bytes": size,
        "h2d_bytes_per_second": h2d["bytes_per_second"],
        "d2h_bytes_per_second": d2h["bytes_per_second"],
        "cpus": sorted(os.sched_getaffinity(0)),
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    cuda = spec["device"] == "cuda"
    targets: list[int | None] = list(spec["gpus"]) if cuda else [None]
    limits: dict[str, int] = spec.get("max_bytes") or {}
    cpus: dict[str, list[int]] = spec.get("cpus") or {}
    budget = spec["duration_s"] / len(targets)
    results = {}
    for step, index in enumerate(targets):
        name = "cpu" if index is None else str(index)
        size = min(BUFFER_BYTES, limits.get(name, BUFFER_BYTES))
        results[name] = measure_gpu(index, size, budget, cpus.get(name))
        progress((step + 1) / len(targets), "h2d")
    return {"devices": results}
