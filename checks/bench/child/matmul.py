"""Matmul TFLOPS per device, in the mamf-finder style but with a few shapes, not a sweep.

For each device (all at once: a GPU that throttles only when the whole node is
hot must show it) and each shape: warm up, then time `torch.mm(A, B, out=C)`
repeatedly until the shape's share of the duration is spent, flushing the L2
cache between timed runs (mamf-finder zeroes a 256 MiB buffer), with CUDA
events on a GPU. TFLOPS = 2mnk / t. The device's figure is the best shape's
median: the median resists a stray slow iteration, the best shape is what
the hardware can do.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import torch

from nodecheck.checks.bench.child.protocol import progress

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Large shapes that run near the maximum on current GPUs (mamf-finder's best
# shapes on H100/A100 are all this size or larger); on a CPU the rate is flat
# above ~1k, and smaller shapes keep an iteration short.
SHAPES = {
    "cuda": [(8192, 8192, 8192), (12288, 12288, 12288)],
    "cpu": [(1536, 1536, 1536), (2048, 2048, 2048)],
}
FLUSH_BYTES = {"cuda": 256 << 20, "cpu": 32 << 20}
WARMUP_SHARE = 0.2
MIN_TIMED = 3


def _fit(
    shape: tuple[int, int, int], itemsize: int, limit: int | None, reserved: int
) -> tuple[int, int, int]:
    """Halve the shape until A, B and C fit in `limit` bytes beside `reserved` (the flush
    buffer; cuBLAS's workspace comes out of the caching allocator's cap, set per GPU)."""
    m, n, k = shape
    while limit is not None and (m * k + k * n + m * n) * itemsize + reserved > limit and m > 256:
        m, n, k = m // 2, n // 2, k // 2
    return m, n, k


def _cap_memory(device: torch.device, limit: int | None) -> None:
    """Make the cap binding: the caching allocator refuses to grow past it (an
    out-of-memory in the benchmark, never in a job that arrives next to it)."""
    if device.type == "cuda" and limit is not None:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(limit / total, 1.0), device)


def _check_bus_id(device: torch.device, expected: str | None) -> None:
    """CUDA's index must be NVML's (CUDA_DEVICE_ORDER=PCI_BUS_ID makes it so); MIG or an
    odd driver could break that, and the result would land on the wrong GPU."""
    if device.type != "cuda" or expected is None:
        return
    properties = torch.cuda.get_device_properties(device)
    bus = getattr(properties, "pci_bus_id", None)
    if bus is not None and int(expected.split(":")[1], 16) != int(bus):
        raise RuntimeError(f"CUDA device {device.index} is not the GPU at {expected}")


class _Timer:
    """Wall time of one mm on the device: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self.end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def time(self, run: Any) -> float:
        if self.cuda:
            self.start.record()
            run()
            self.end.record()
            self.end.synchronize()
            return float(self.start.elapsed_time(self.end)) / 1000
        began = time.perf_counter()
        run()
        return time.perf_counter() - began


def measure_device(
    device: torch.device,
    dtype: torch.dtype,
    shapes: list[tuple[int, int, int]],
    duration_s: float,
    limit: int | None,
    on_shape: Any,
) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.set_device(device)
        _cap_memory(device, limit)
    flush_bytes = FLUSH_BYTES[device.type]
    flush = torch.empty(flush_bytes // 4, dtype=torch.float32, device=device)
    timer = _Timer(device)
    per_shape: list[dict[str, Any]] = []
    budget = duration_s / len(shapes)
    for shape in shapes:
        m, n, k = _fit(shape, torch.tensor([], dtype=dtype).element_size(), limit, flush_bytes)
        a = torch.randn(m, k, dtype=dtype, device=device)
        b = torch.randn(k, n, dtype=dtype, device=device)
        c = torch.empty(m, n, dtype=dtype, device=device)

        def mm(a: torch.Tensor = a, b: torch.Tensor = b, c: torch.Tensor = c) -> None:
            torch.mm(a, b, out=c)

        warm_until = time.monotonic() + budget * WARMUP_SHARE
        timer.time(mm)
        while time.monotonic() < warm_until:
            timer.time(mm)
        rates: list[float] = []
        stop = time.monotonic() + budget * (1 - WARMUP_SHARE)
        while len(rates) < MIN_TIMED or time.monotonic() < stop:
            flush.zero_()
            rates.append(2 * m * n * k / timer.time(mm) / 1e12)
        per_shape.append(
            {
                "shape": [m, n, k],
                "median_tflops": statistics.median(rates),
                "max_tflops": max(rates),
                "iterations": len(rates),
            }
        )
        del a, b, c
        on_shape()
    best = max(per_shape, key=lambda s: float(s["median_tflops"]))
    return {"tflops": best["median_tflops"], "best_shape": best["shape"], "shapes": per_shape}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    dtype = DTYPES[spec["dtype"]]
    kind = spec["device"]
    shapes = [tuple(s) for s in spec.get("shapes") or SHAPES[kind]]
    if kind == "cuda":
        devices = {str(i): torch.device("cuda", i) for i in spec["gpus"]}
    else:
        devices = {"cpu": torch.device("cpu")}
    limits: dict[str, int] = spec.get("max_bytes") or {}
    total = len(devices) * len(shapes)
    done = [0]
    lock = threading.Lock()

    def shape_done() -> None:
        with lock:
            done[0] += 1
            progress(done[0] / total, "matmul")

    results: dict[str, Any] = {}
    bus_ids: dict[str, str] = spec.get("bus_ids") or {}

    def one(name: str, device: torch.device) -> None:
        # One GPU failing (a CUDA error, out of memory) is that GPU's result.
        try:
            _check_bus_id(device, bus_ids.get(name))
            results[name] = measure_device(
                device, dtype, shapes, spec["duration_s"], limits.get(name), shape_done
            )
        except Exception as err:
            results[name] = {"error": f"{type(err).__name__}: {err}"}

    # One thread per device: torch releases the GIL inside kernels and syncs,
    # so every GPU runs at once, as under a real job.
    threads = [threading.Thread(target=one, args=item) for item in devices.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"devices": results, "dtype": spec["dtype"], "torch": torch.__version__}
