"""Timing one all_reduce payload over a process group: what `allreduce` (one node's GPUs)
and `network` (every rank of a job, then node pairs) share.

Each iteration is timed on its own (barrier, then one blocking all_reduce), and an
iteration's time is the slowest rank's: the collective is done only when every rank is.
busbw = bytes / time x 2(n-1)/n, n the group's ranks (nccl-tests, src/all_reduce.cu
AllReduceGetBw).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist

from nodecheck.checks.record import record
from nodecheck.checks.rules.network_sweep import bus_factor

WARMUP = 2
MIN_TIMED = 5


@record
class RankLayout:
    rank: int
    world: int
    local: int


def _whole_number(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{name} is not a whole number")
    return int(text)


def rank_layout(env: Mapping[str, str]) -> RankLayout:
    """RANK, WORLD_SIZE, LOCAL_RANK (torchrun), else srun's SLURM_PROCID, SLURM_NTASKS,
    SLURM_LOCALID. The values are nodecheck's to read: the names are said, never the
    values."""
    names = (
        ("RANK", "WORLD_SIZE", "LOCAL_RANK")
        if "RANK" in env
        else ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
    )
    if names[0] not in env or names[1] not in env:
        raise ValueError("not a rank: set RANK and WORLD_SIZE (torchrun) or run under srun")
    rank, world = _whole_number(env, names[0]), _whole_number(env, names[1])
    local = _whole_number(env, names[2]) if names[2] in env else 0
    if rank >= world:
        raise ValueError(f"{names[0]} is not below {names[1]}")
    return RankLayout(rank, world, local)


def payload_tensor(size: int, device: torch.device) -> torch.Tensor:
    """`size` bytes of float32 ones on `device`."""
    return torch.ones(size // 4, dtype=torch.float32, device=device)


def slowest_iterations(
    tensor: torch.Tensor,
    budget_s: float,
    sync: Callable[[], None],
    group: dist.ProcessGroup | None = None,
    warmup: int = WARMUP,
) -> list[float]:
    """Seconds per timed all_reduce of `tensor` over `group` (the default: every rank),
    each the slowest rank's; at least MIN_TIMED of them, more while `budget_s` lasts.
    Every rank of the group gets the same list."""
    for _ in range(warmup):
        dist.all_reduce(tensor, group=group)
    sync()
    # Every rank must run the same number of iterations: the group's first rank decides.
    leader = dist.get_global_rank(group, 0) if group is not None else 0
    durations = []
    stop = time.monotonic() + budget_s
    while True:
        dist.barrier(group=group)
        began = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        sync()
        durations.append(time.perf_counter() - began)
        more = torch.tensor(
            [1 if len(durations) < MIN_TIMED or time.monotonic() < stop else 0],
            device=tensor.device,
        )
        dist.broadcast(more, leader, group=group)
        if not more.item():
            break
    local = torch.tensor(durations, dtype=torch.float64, device=tensor.device)
    ranks = dist.get_world_size(group)
    gathered = [torch.empty_like(local) for _ in range(ranks)]
    dist.all_gather(gathered, local, group=group)
    slowest: list[float] = torch.stack(gathered).max(dim=0).values.tolist()
    return slowest


def busbw_per_iteration(size: int, seconds: list[float], ranks: int) -> list[float]:
    """Bytes per second of bus bandwidth for each iteration's time."""
    factor = bus_factor(ranks)
    return [size / elapsed * factor for elapsed in seconds]
