"""The cross-node benchmark's ranks: one all_reduce over the whole job, then the sweep.

Every rank of the job runs this (under srun or torchrun, through `nodecheck bench
network`, which gated the node and read its NICs and memory first, and put them in the
spec). In order, each step a collective every rank takes part in:

1. `init_process_group` within the rendezvous timeout (NCCL on GPUs, gloo on CPUs; the
   same timeout bounds every collective after it, so a rank that dies leaves the others
   an error, not a hang);
2. every rank's node, gate verdict, NIC rate and memory gathered to all: a busy node, or
   a payload that does not fit a node's memory, stops every rank with one line naming it;
3. the whole-job all_reduce at each payload (per-iteration busbw, child/collective.py);
4. the sweep (checks/rules/network_sweep.py): every pair group of every planned round
   created up front on every rank (torch.distributed.new_group is collective over the
   whole job), then round by round: each pair's all_reduce of the largest payload at the
   same time, the figures gathered to all, localised, and the sweep stopped once sure.

Every rank returns the same report; `nodecheck bench network` prints it on rank 0 and
writes each node's record from that node's lowest rank.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nodecheck.checks.bench.child.collective import (
    busbw_per_iteration,
    payload_tensor,
    rank_layout,
    slowest_iterations,
)
from nodecheck.checks.bench.network_record import node_record, write_record
from nodecheck.checks.rules.network_sweep import (
    PairFigure,
    Profile,
    localise,
    pair_rounds,
    planned_rounds,
    should_sweep,
    stability,
    sweep_is_done,
    whole_job_shortfall,
)

# A gloo rank holds its tensor and as much again in flight (its ring's chunks); NCCL's
# buffers are its own (NCCL_BUFFSIZE), beside the one tensor.
COPIES_PER_RANK = 2


class NetworkBenchmarkError(Exception):
    """Why the ranks stopped without measuring: one line, the same on every rank."""


def run(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        layout = rank_layout(os.environ)
    except ValueError as err:
        raise NetworkBenchmarkError(str(err)) from None
    if layout.world < 2:
        raise NetworkBenchmarkError("all_reduce needs at least two ranks")
    cuda = spec["device"] == "cuda"
    device = torch.device("cuda", layout.local) if cuda else torch.device("cpu")
    timeout = datetime.timedelta(seconds=spec["rendezvous_timeout_s"])
    try:
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            rank=layout.rank,
            world_size=layout.world,
            timeout=timeout,
        )
    except (RuntimeError, ValueError) as err:
        # torch's own message names the rendezvous address: only its kind is shown.
        raise NetworkBenchmarkError(
            f"the rendezvous did not complete within {spec['rendezvous_timeout_s']:g} s "
            f"({layout.world} ranks expected): {type(err).__name__}"
        ) from None
    # Only now a CUDA context (cudaSetDevice initializes the primary context at once: CUDA
    # Runtime API, cudaSetDevice), which NVML lists as a process: the rendezvous completes
    # once every rank has started, so every rank's gate is done, and none of them saw
    # another rank's context as a job on the node's GPUs.
    if cuda:
        torch.cuda.set_device(layout.local)
    try:
        # Objects travel over gloo: NCCL's object collectives would need every GPU's
        # memory before the gate verdicts are known.
        control = dist.new_group(backend="gloo", timeout=timeout) if cuda else None
        ranks, report = _after_rendezvous(spec, layout.local, cuda, device, timeout, control)
        me = ranks[layout.rank]
        lowest = min(r for r, info in enumerate(ranks) if info["node"] == me["node"])
        # Every rank has its report before any record is written: a rank lost before
        # this barrier leaves every node's previous record as it was.
        dist.barrier(group=control)
        record_error = _write_record(spec, report) if lowest == layout.rank else None
        # Every node's record written before any rank returns: a launcher stops the other
        # ranks once one exits with an error (torchrun, srun --kill-on-bad-exit).
        dist.barrier(group=control)
    except (RuntimeError, dist.DistError) as err:
        # torch's message can name a peer's address and port: only its kind is shown.
        raise NetworkBenchmarkError(
            f"a collective failed (a rank lost, or past the "
            f"{spec['rendezvous_timeout_s']:g} s timeout): {type(err).__name__}"
        ) from None
    finally:
        dist.destroy_process_group()
    return {
        "rank": layout.rank,
        "node": me["node"],
        "record_error": record_error,
        "report": report,
    }


def _write_record(spec: dict[str, Any], report: dict[str, Any]) -> str | None:
    """This node's record in the state directory; the one line why not, if it fails."""
    state_dir = Path(spec["state_dir"])
    try:
        if spec["create_state_dir"]:
            state_dir.mkdir(parents=True, exist_ok=True)
        write_record(state_dir, node_record(report, spec["node"], time.time()))
    except OSError as err:
        return f"cannot write its record in {state_dir}: {err.strerror or err}"
    return None


def _after_rendezvous(
    spec: dict[str, Any],
    local: int,
    cuda: bool,
    device: torch.device,
    timeout: datetime.timedelta,
    control: dist.ProcessGroup | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every rank's readings shared, the refusals and memory judged, then the measurement."""
    ranks = _gathered(
        {
            "node": spec["node"],
            "local": local,
            # Where the schedule starts (rank 0's counts): the Slurm job's id turns it, so
            # that nightly sweeps of the same nodes measure other pairs.
            "turn": _job_number(os.environ),
            "refused": spec.get("refused"),
            "nic_bytes_per_second": spec.get("nic_bytes_per_second"),
            "nic_text": spec.get("nic_text"),
            "memory_available_bytes": spec.get("memory_available_bytes"),
        },
        control,
    )
    nodes = _nodes_in_order(ranks)
    _stop_on_duplicates(ranks)
    _stop_on_refusals(ranks)
    _stop_on_memory(ranks, nodes, max(spec["payloads"]), cuda)
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    return ranks, _measure(spec, ranks, nodes, device, sync, control)


def _gathered(mine: Any, group: dist.ProcessGroup | None) -> list[Any]:
    """Every rank's `mine` (JSON), in rank order, on every rank. As JSON bytes in CPU
    tensors over gloo: all_gather_object would unpickle what the network brings, and
    needs numpy, which the CPU build of torch does not bring."""
    data = json.dumps(mine).encode()
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=group)
    lengths = [int(size.item()) for size in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8)
    padded[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    parts = [torch.zeros(max(lengths), dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return [
        json.loads(bytes(part[:length].tolist()))
        for part, length in zip(parts, lengths, strict=True)
    ]


def _job_number(env: Mapping[str, str]) -> int:
    job = env.get("SLURM_JOB_ID", "")
    return int(job) if job.isascii() and job.isdigit() else 0


def _stop_on_duplicates(ranks: list[dict[str, Any]]) -> None:
    """Two hosts of one name would be taken for one node (its pairs holding three hosts'
    ranks): a local rank named twice on a node says so."""
    seen: set[tuple[str, int]] = set()
    for info in ranks:
        key = (info["node"], info["local"])
        if key in seen:
            raise NetworkBenchmarkError(
                f"two ranks are local rank {info['local']} of {info['node']}: two hosts of "
                "one name (give each its own --node-name)"
            )
        seen.add(key)


def _nodes_in_order(ranks: list[dict[str, Any]]) -> list[str]:
    """The nodes in the order of their lowest rank."""
    return list(dict.fromkeys(info["node"] for info in ranks))


def _stop_on_refusals(ranks: list[dict[str, Any]]) -> None:
    refused = {info["node"]: info["refused"] for info in ranks if info["refused"]}
    if refused:
        node, why = next(iter(refused.items()))
        more = f" (and {len(refused) - 1} node(s) more)" if len(refused) > 1 else ""
        raise NetworkBenchmarkError(f"not run: {node}: {why}{more}")


def _stop_on_memory(ranks: list[dict[str, Any]], nodes: list[str], size: int, cuda: bool) -> None:
    for node in nodes:
        infos = [info for info in ranks if info["node"] == node]
        available = infos[0]["memory_available_bytes"]
        if available is None:
            continue
        # A GPU's free memory is that GPU's; a node's host memory is every local rank's.
        sharing = 1 if cuda else len(infos)
        needed = size * COPIES_PER_RANK * sharing
        if needed > available:
            where = "its GPU's free memory" if cuda else "its available memory"
            raise NetworkBenchmarkError(
                f"the payload of {size / (1 << 20):.0f} MiB does not fit {node}: "
                f"{needed / (1 << 20):.0f} MiB needed, {available / (1 << 20):.0f} MiB "
                f"is {where}"
            )


def _expected(ranks: list[dict[str, Any]], cuda: bool) -> tuple[float | None, str]:
    """The median over the nodes of their compute NICs' summed rate: a ring's busbw
    reaches a node's NIC rate at most (every byte the factor 2(n-1)/n counts crosses each
    node's NICs once). The median, not the smallest: a node whose NICs trained low would
    otherwise lower the bar for the whole job and hide itself (its own checks, rdma_ports
    and pcie_link, judge its NICs)."""
    if not cuda:
        return None, "gloo runs over sockets: no NIC rate to judge by; judged by the run"
    by_node = {info["node"]: (info["nic_bytes_per_second"], info["nic_text"]) for info in ranks}
    missing = [node for node, (rate, _) in by_node.items() if rate is None]
    if missing:
        return None, f"no compute NIC rate read on {missing[0]}; judged by the run"
    median = statistics.median(float(rate) for rate, _ in by_node.values())
    texts = sorted({text for _, text in by_node.values()})
    shown = texts[0] if len(texts) == 1 else f"the nodes' median of {', '.join(texts)}"
    return median, f"{shown}, ring busbw reaches the NICs' rate (2(n-1)/n)"


def _measure(
    spec: dict[str, Any],
    ranks: list[dict[str, Any]],
    nodes: list[str],
    device: torch.device,
    sync: Any,
    control: dist.ProcessGroup | None,
) -> dict[str, Any]:
    world = len(ranks)
    warn, fail = spec["warn_below"], spec["fail_below"]
    budget = spec["duration_s"]
    payloads = []
    for size in sorted(spec["payloads"]):
        began = time.monotonic()
        tensor = payload_tensor(size, device)
        seconds = slowest_iterations(tensor, budget, sync)
        del tensor
        busbw = busbw_per_iteration(size, seconds, world)
        wall = time.monotonic() - began
        payloads.append(
            {"bytes": size, "iterations": len(busbw), "wall_s": wall, **_profile(busbw)}
        )
    whole = payloads[-1]
    expected, expected_source = _expected(ranks, spec["device"] == "cuda")
    sweep, why = should_sweep(spec["sweep"], whole["busbw_median"], expected, warn)
    shortfall = whole_job_shortfall(whole["busbw_median"], expected, warn)
    if len(nodes) < 2:
        sweep, why = False, "one node: no pair to sweep"
    figures: list[PairFigure] = []
    rounds_run = 0
    planned = planned_rounds(len(nodes)) if sweep else 0
    localisation = None
    began = time.monotonic()
    if sweep:
        timeout = datetime.timedelta(seconds=spec["rendezvous_timeout_s"])
        groups = _pair_groups(ranks, nodes, planned, timeout)
        size = whole["bytes"]
        tensor = payload_tensor(size, device)
        me = dist.get_rank()
        for number, round_groups in enumerate(groups, start=1):
            mine: dict[str, Any] | None = None
            for (first, second), (members, group) in round_groups.items():
                if me in members:
                    seconds = slowest_iterations(tensor, budget, sync, group=group)
                    median = stability(busbw_per_iteration(size, seconds, len(members)))
                    if me == members[0]:
                        mine = {"first": first, "second": second, "busbw": median.busbw_median}
            found = [item for item in _gathered(mine, control) if item is not None]
            figures += [PairFigure(number, **item) for item in found]
            rounds_run = number
            localisation = localise(nodes, figures, warn, fail, shortfall)
            if sweep_is_done(localisation, rounds_run, planned):
                break
    report = _report(
        spec,
        world,
        nodes,
        payloads,
        expected,
        expected_source,
        why,
        shortfall,
        figures,
        localisation,
        rounds_run,
        planned,
    )
    report["sweep"]["wall_s"] = time.monotonic() - began  # its groups made, its rounds run
    return report


def _pair_groups(
    ranks: list[dict[str, Any]], nodes: list[str], planned: int, timeout: datetime.timedelta
) -> list[dict[tuple[str, str], tuple[list[int], dist.ProcessGroup | None]]]:
    """Every pair group of every planned round, created in the same order on every rank
    (new_group is collective over the whole job even for ranks outside the group)."""
    ranks_of = {node: [r for r, info in enumerate(ranks) if info["node"] == node] for node in nodes}
    turn = ranks[0]["turn"] % len(nodes)
    order = nodes[turn:] + nodes[:turn]  # neighbours stay neighbours
    rounds = []
    for pairs in pair_rounds(len(order), planned):
        groups = {}
        for a, b in pairs:
            first, second = sorted((order[a], order[b]), key=nodes.index)
            members = sorted(ranks_of[first] + ranks_of[second])
            # The job's timeout, or torch's default (30 min for gloo) would bound a pair
            # whose partner stopped.
            group = dist.new_group(ranks=members, timeout=timeout)
            groups[(first, second)] = (members, group)
        rounds.append(groups)
    return rounds


def _profile(busbw: list[float]) -> dict[str, float]:
    profile = stability(busbw)
    return {
        "busbw_median": profile.busbw_median,
        "busbw_min": profile.busbw_min,
        "busbw_p10": profile.busbw_p10,
        "busbw_p90": profile.busbw_p90,
        "cv": profile.cv,
    }


def _report(
    spec: dict[str, Any],
    world: int,
    nodes: list[str],
    payloads: list[dict[str, Any]],
    expected: float | None,
    expected_source: str,
    why: str,
    shortfall: str | None,
    figures: list[PairFigure],
    localisation: Any,
    rounds_run: int,
    planned: int,
) -> dict[str, Any]:
    whole = payloads[-1]
    if localisation is not None:
        verdicts = [
            {
                "node": v.node,
                "status": v.status,
                "culprit": v.culprit,
                "peer": v.peer,
                "confidence": v.confidence,
                "message": v.message,
            }
            for v in localisation.verdicts
        ]
        reference: float | None = localisation.reference
        confident = localisation.confident
    else:
        # No sweep: a whole job below its NICs' rate is every node's low-confidence warn.
        verdicts = [
            {
                "node": node,
                "status": "ok" if shortfall is None else "warn",
                "culprit": "none",
                "peer": None,
                "confidence": "high" if shortfall is None else "low",
                "message": f"{node}: no sweep ({why})"
                + ("" if shortfall is None else f"; {shortfall}"),
            }
            for node in nodes
        ]
        reference, confident = None, shortfall is None
    slow_pairs = (
        {(p.first, p.second, p.round) for p in localisation.slow_pairs} if localisation else set()
    )
    return {
        "backend": dist.get_backend(),
        "ranks": world,
        "nodes": nodes,
        "payloads": payloads,
        "payload_bytes": whole["bytes"],
        "whole_job": {key: whole[key] for key in Profile.__dataclass_fields__},
        "expected_bytes_per_second": expected if expected is not None else reference,
        # The expectation is the NICs' rate (else the run's own reference, or none).
        "expected_from_nics": expected is not None,
        "expected_source": expected_source
        if expected is not None
        else ("the run's median pair" if reference is not None else None),
        "expected_note": expected_source,
        "sweep": {
            "ran": localisation is not None,
            "why": why,
            "rounds_planned": planned,
            "rounds_run": rounds_run,
            "confident": confident,
        },
        "pairs": [
            {
                "round": p.round,
                "first": p.first,
                "second": p.second,
                "busbw_bytes_per_second": p.busbw,
                "slow": (p.first, p.second, p.round) in slow_pairs,
            }
            for p in figures
        ],
        "verdicts": verdicts,
        "thresholds": {"warn": spec["warn_below"], "fail": spec["fail_below"]},
    }
