"""Are nodecheck's benchmarks right? Each against an independent reference, on this machine.

    .venv/bin/python -m bench.bench_accuracy [--device cpu|cuda]

1. Matmul: nodecheck's probe (a few large shapes, a couple of seconds) against
   an exhaustive sweep in the mamf-finder style (every m, n, k of a grid, each
   timed, the maximum taken). Goal: the probe reaches at least 95 % of the
   sweep's maximum in at most a tenth of its time.
2. all_reduce: nodecheck's busbw against a minimal loop, written here from
   scratch, that times `dist.all_reduce` at the same payload with the same
   number of ranks. Goal: within 10 %.

Prints a table with both ratios. On a CPU the all_reduce runs gloo between
two local processes; with --device cuda, NCCL across every GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from typing import Any

import torch

from nodecheck.checks.bench.child import matmul as probe
from nodecheck.checks.bench.child_runner import run_child

# mamf-finder sweeps thousands of shapes; these grids keep a run to about a minute
# on two CPU cores, and to several minutes on a GPU.
SWEEP = {
    "cpu": [1024, 1536, 2048, 2560, 3072],
    "cuda": list(range(2048, 20481, 1024)),
}
PAYLOAD = {"cpu": 32 << 20, "cuda": 1 << 30}

# nccl-tests' way, not nodecheck's: N calls back to back with one sync at the end,
# the average time per call (all_reduce_perf without -z, no per-iteration barrier).
REFERENCE_LOOP = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    cuda = sys.argv[1] == "cuda"
    size, calls = int(sys.argv[2]), int(sys.argv[3])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    x = torch.ones(size // 4, device=f"cuda:{rank}" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(5):
        dist.all_reduce(x)
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    sync()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=x.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(size / (elapsed.item() / calls) * 2 * (world - 1) / world / 1e9)
    dist.destroy_process_group()
    """
)


def sweep(device: torch.device, dtype: torch.dtype) -> tuple[float, tuple[int, ...], float]:
    """mamf-finder style: every shape of the grid, warmed up and timed; the best median."""
    sizes = SWEEP[device.type]
    timer = probe._Timer(device)
    best, best_shape = 0.0, (0, 0, 0)
    began = time.perf_counter()
    for m, n, k in itertools.product(sizes, repeat=3):
        a = torch.randn(m, k, dtype=dtype, device=device)
        b = torch.randn(k, n, dtype=dtype, device=device)
        c = torch.empty(m, n, dtype=dtype, device=device)

        def mm(a: torch.Tensor = a, b: torch.Tensor = b, c: torch.Tensor = c) -> None:
            torch.mm(a, b, out=c)

        timer.time(mm)
        rate = statistics.median(2 * m * n * k / timer.time(mm) / 1e12 for _ in range(5))
        if rate > best:
            best, best_shape = rate, (m, n, k)
    return best, best_shape, time.perf_counter() - began


def matmul_case(device: torch.device, duration: float) -> dict[str, Any]:
    dtype = torch.bfloat16
    began = time.perf_counter()
    found = probe.measure_device(
        device, dtype, probe.SHAPES[device.type], duration, None, lambda: None
    )
    probe_seconds = time.perf_counter() - began
    best, best_shape, sweep_seconds = sweep(device, dtype)
    return {
        "probe_tflops": found["tflops"],
        "probe_seconds": probe_seconds,
        "sweep_tflops": best,
        "sweep_shape": best_shape,
        "sweep_seconds": sweep_seconds,
    }


def _free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return int(probe_socket.getsockname()[1])


def reference_busbw(kind: str, world: int, size: int, calls: int) -> float:
    port = str(_free_port())
    ranks = []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "PYTHONWARNINGS": "ignore",
        }
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-c", REFERENCE_LOOP, kind, str(size), str(calls)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    outputs = [process.communicate()[0] for process in ranks]
    return float(outputs[0].strip())


def allreduce_case(kind: str, world: int, seconds: float) -> dict[str, Any]:
    size = PAYLOAD[kind]
    spec = {
        "benchmark": "allreduce",
        "device": kind,
        "processes": world,
        "gpus": list(range(world)),
        "duration_s": seconds,
        "payloads": [size],
    }
    outcome = run_child(spec, 300)
    if outcome.result is None:
        raise SystemExit(f"nodecheck's all_reduce failed: {outcome.error}")
    row = outcome.result["payloads"][0]
    # As many calls as nodecheck timed, so both see the same stretch of machine time.
    reference = reference_busbw(kind, world, size, int(row["iterations"]))
    return {"payload": size, "ours": row["busbw_gbps"], "reference": reference}


def main() -> int:
    """Exit status 1 when a measure misses its goal (for `make gpu`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--duration", type=float, default=2.0, help="the probe's duration")
    args = parser.parse_args()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    world = torch.cuda.device_count() if args.device == "cuda" else 2
    matmul = matmul_case(device, args.duration)
    # all_reduce needs two ranks: on a one-GPU machine it is not measured (said below).
    reduce = allreduce_case(args.device, world, 4.0) if world >= 2 else None
    reach = matmul["probe_tflops"] / matmul["sweep_tflops"]
    share = matmul["probe_seconds"] / matmul["sweep_seconds"]
    print(f"device {args.device}, torch {torch.__version__}, {os.cpu_count()} CPUs")
    print(f"{'measure':<44} {'nodecheck':>12} {'reference':>12} {'ratio':>7}  goal        ok")
    print(
        f"{'matmul bf16 TFLOPS (probe vs sweep max)':<44} {matmul['probe_tflops']:>12.3f} "
        f"{matmul['sweep_tflops']:>12.3f} {reach:>7.3f}  >= 0.95     "
        f"{'yes' if reach >= 0.95 else 'NO'}"
    )
    print(
        f"{'matmul time, s (probe vs sweep)':<44} {matmul['probe_seconds']:>12.1f} "
        f"{matmul['sweep_seconds']:>12.1f} {share:>7.3f}  <= 0.10     "
        f"{'yes' if share <= 0.1 else 'NO'}"
    )
    met = [reach >= 0.95, share <= 0.1]
    if reduce is None:
        print(f"{'all_reduce busbw':<44} not measured: needs two GPUs, this machine has {world}")
    else:
        agreement = reduce["ours"] / reduce["reference"]
        met.append(0.9 <= agreement <= 1.1)
        label = f"all_reduce busbw GB/s, {reduce['payload'] >> 20} MiB x{world}"
        print(
            f"{label:<44} {reduce['ours']:>12.3f} {reduce['reference']:>12.3f} "
            f"{agreement:>7.3f}  0.90-1.10   {'yes' if met[-1] else 'NO'}"
        )
    print(json.dumps({"sweep_best_shape": matmul["sweep_shape"]}))
    return 0 if all(met) else 1


if __name__ == "__main__":
    sys.exit(main())
