"""all_reduce bus bandwidth over torch.distributed (NCCL on GPUs, gloo on CPUs).

As nccl-tests and stas00's all_reduce_bench define it: algbw = bytes / time,
busbw = algbw x 2(n-1)/n, each iteration timed on its own and taken as the slowest
rank's (child/collective.py, shared with the `network` benchmark). The spread of those iterations
is all_reduce_bench.py's --profile_stability (Machine Learning Engineering book,
network/benchmarks): the coefficient of variation and the worst iteration.

Two ways in:
- `launch(spec)`: the benchmark child starts one rank process per local
  device on a free loopback port and relays rank 0's result;
- `worker()`: a rank process, also what runs under torchrun or srun across
  nodes when RANK and WORLD_SIZE (or SLURM_PROCID and SLURM_NTASKS) are set:
  `torchrun --nproc_per_node=8 -m nodecheck.checks.bench.child allreduce`.

Under `launch` on GPUs, the ranks' NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE are
overridden (`nccl_log_environment`: INFO, TUNING, a private folder), whatever the user
set: NCCL's tuning line is how each payload's algorithm is known. NCCL's warnings from
that log are relayed to stderr. The user's settings apply again outside the benchmark
ranks, and under torchrun or srun nothing is overridden (the algorithm is `unknown`).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nodecheck.checks.bench import nccl_log
from nodecheck.checks.bench.child.collective import (
    WARMUP,
    busbw_per_iteration,
    payload_tensor,
    rank_layout,
    slowest_iterations,
)
from nodecheck.checks.bench.child.protocol import PARENT_VARIABLE, emit, parse_line, progress

MIB = 1 << 20
GIB = 1 << 30
# Published busbw figures are for 4-16 GiB (docs/hardware.md §13): the ladder reaches 4 GiB
# where the memory cap allows.
LADDER = {"cuda": [64 * MIB, 256 * MIB, GIB, 4 * GIB], "cpu": [MIB, 8 * MIB, 32 * MIB]}
# Where launch() asks NCCL to write its tuning log (the ranks' own temporary folder).
NCCL_LOG_VARIABLE = "NODECHECK_NCCL_LOG_DIR"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def nccl_log_environment(directory: Path) -> dict[str, str]:
    """The ranks' NCCL logging: the tuning subsystem at INFO, into `directory`, one file
    per process (NCCL puts the host for %h and the pid for %p, src/debug.cc). These win
    over the user's own NCCL_DEBUG settings, in the ranks only: a user's NCCL_DEBUG=WARN
    would hide the algorithm, and NCCL_DEBUG_FILE elsewhere would lose it."""
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "TUNING",
        "NCCL_DEBUG_FILE": f"{directory}/nccl.%h.%p",
        NCCL_LOG_VARIABLE: str(directory),
    }


def launch(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one rank per local device; return rank 0's result.

    Ranks write their stderr straight into the child's (no pipe to fill and
    block on); the launcher watches them all, so a rank that dies at start
    fails the run at once with its exit status instead of leaving the others
    waiting in init until the deadline. Under NCCL they log its tuning into a
    private temporary folder, removed afterwards.
    """
    world = len(spec["gpus"]) if spec["device"] == "cuda" else spec["processes"]
    if world < 2:
        raise ValueError("all_reduce needs at least two ranks")
    if spec["device"] != "cuda":
        return _launch(spec, world, {})
    logs = Path(tempfile.mkdtemp(prefix="nodecheck-nccl-"))
    try:
        return _launch(spec, world, nccl_log_environment(logs))
    finally:
        _relay_warnings(logs)
        shutil.rmtree(logs, ignore_errors=True)


def _relay_warnings(logs: Path) -> None:
    """NCCL's warnings to stderr (the parent keeps its tail for the error it reports), as
    they would have gone there without NCCL_DEBUG_FILE (the init-time ones at the head of
    the file and the last ones at its tail); the rest of the log goes."""
    for path in nccl_log.log_files(logs):
        for line in nccl_log.warnings_in_file(path):
            print(line, file=sys.stderr)


def _launch(spec: dict[str, Any], world: int, logging_env: dict[str, str]) -> dict[str, Any]:
    port = _free_port()
    ranks = []
    for rank in range(world):
        env = {
            **{k: v for k, v in os.environ.items() if k != NCCL_LOG_VARIABLE},
            **logging_env,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            # The rank's GPU: --gpus 2,3 puts rank 0 on GPU 2.
            "LOCAL_RANK": str(spec["gpus"][rank] if spec["device"] == "cuda" else rank),
            "NODECHECK_BENCH_SPEC": json.dumps(spec),
            PARENT_VARIABLE: str(os.getpid()),
        }
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-m", "nodecheck.checks.bench.child", "allreduce-rank"],
                env=env,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
            )
        )
    first = ranks[0]
    assert first.stdout is not None
    result: dict[str, Any] | None = None
    selector = selectors.DefaultSelector()
    selector.register(first.stdout, selectors.EVENT_READ)
    pending = b""
    while True:
        failed = [(r, p.returncode) for r, p in enumerate(ranks) if p.poll() not in (None, 0)]
        if failed:
            for process in ranks:
                process.kill()
            rank, code = failed[0]
            raise RuntimeError(f"rank {rank} of {world} exited with status {code} (see stderr)")
        if not selector.select(0.2):
            continue
        chunk = os.read(first.stdout.fileno(), 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            message = parse_line(line)
            if message is None:
                continue
            if "result" in message:
                result = message["result"]
            else:
                emit(**message)  # progress, relayed
    codes = [process.wait() for process in ranks]
    failed = [(rank, code) for rank, code in enumerate(codes) if code]
    if failed:
        rank, code = failed[0]
        raise RuntimeError(f"rank {rank} of {world} exited with status {code} (see stderr)")
    if result is None:
        raise RuntimeError("rank 0 ended without a result")
    return result


def _rank_env() -> tuple[int, int, int]:
    """RANK, WORLD_SIZE, LOCAL_RANK from torchrun, or from srun's SLURM_* variables."""
    try:
        layout = rank_layout(os.environ)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        raise SystemExit(
            "set MASTER_ADDR and MASTER_PORT (torchrun sets them; under plain srun: "
            "export MASTER_ADDR=$(scontrol show hostnames | head -n1) MASTER_PORT=29500)"
        )
    return layout.rank, layout.world, layout.local


def measure(spec: dict[str, Any], on_payload: Any = None) -> dict[str, Any]:
    """The payload ladder on this rank; every rank gets the same result back."""
    rank, world, local = _rank_env()
    cuda = spec["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(local)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        ladder = spec.get("payloads") or LADDER[spec["device"]]
        limit = spec.get("max_bytes_per_rank")
        ladder = [size for size in ladder if limit is None or size <= limit] or ladder[:1]
        budget = spec["duration_s"] / len(ladder)
        logs = os.environ.get(NCCL_LOG_VARIABLE) if cuda and rank == 0 else None
        rows = []
        for step, size in enumerate(ladder):
            rows.append(_one_payload(size, device, world, budget, cuda, logs))
            if on_payload is not None:
                on_payload((step + 1) / len(ladder))
        return {"world_size": world, "backend": dist.get_backend(), "payloads": rows}
    finally:
        dist.destroy_process_group()


def _one_payload(
    size: int, device: torch.device, world: int, budget: float, cuda: bool, logs: str | None
) -> dict[str, Any]:
    tensor = payload_tensor(size, device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    # NCCL chooses the algorithm as the collective is enqueued and logs it then: the
    # lines written during the first warm-up all_reduce are this payload's (the
    # barriers and broadcasts between timed iterations log lines of their own).
    log_file = nccl_log.rank_log_file(Path(logs), os.getpid()) if logs else None
    start = nccl_log.log_size(log_file) or 0
    dist.all_reduce(tensor)
    sync()
    if logs:
        log_file = nccl_log.rank_log_file(Path(logs), os.getpid())
        algorithm = nccl_log.algorithm_label(nccl_log.read_segment(log_file, start), size)
    else:
        algorithm = nccl_log.GLOO if not cuda else nccl_log.UNKNOWN
    slowest = slowest_iterations(tensor, budget, sync, warmup=WARMUP - 1)
    busbw = [value / 1e9 for value in busbw_per_iteration(size, slowest, world)]
    algbw = [size / seconds / 1e9 for seconds in slowest]
    mean = statistics.fmean(busbw)
    return {
        "bytes": size,
        "algorithm": algorithm,
        "iterations": len(busbw),
        "algbw_gbps": statistics.median(algbw),
        "busbw_gbps": statistics.median(busbw),
        "busbw_mean_gbps": mean,
        "busbw_worst_gbps": min(busbw),
        "busbw_cv": statistics.pstdev(busbw) / mean if mean else 0.0,
    }


def rank_main() -> None:
    """A rank started by `launch`: rank 0 speaks the protocol."""
    spec = json.loads(os.environ["NODECHECK_BENCH_SPEC"])
    rank, _, _ = _rank_env()

    def report(fraction: float) -> None:
        if rank == 0:
            progress(fraction, "all_reduce")

    result = measure(spec, report)
    if rank == 0:
        emit(result=result)


def torchrun_main(argv: list[str]) -> None:
    """`torchrun ... -m nodecheck.checks.bench.child allreduce`: a table on rank 0."""
    parser = argparse.ArgumentParser(prog="nodecheck.checks.bench.child allreduce")
    parser.add_argument("--payload-mib", type=int, action="append", help="repeatable")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds in all")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    payloads = [size * MIB for size in args.payload_mib] if args.payload_mib else None
    spec = {"device": device, "duration_s": args.duration, "payloads": payloads}
    result = measure(spec)
    if _rank_env()[0] == 0:
        print(f"all_reduce over {result['world_size']} ranks ({result['backend']})")
        print(f"{'payload':>12} {'busbw GB/s':>11} {'algbw GB/s':>11} {'cv':>6} {'worst':>7}")
        for row in result["payloads"]:
            print(
                f"{row['bytes'] / MIB:>8.0f} MiB {row['busbw_gbps']:>11.2f} "
                f"{row['algbw_gbps']:>11.2f} {row['busbw_cv']:>6.1%} "
                f"{row['busbw_worst_gbps']:>7.2f}"
            )
