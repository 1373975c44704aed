"""Per-rank NUMA and CPU bindings on the replica nodes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from nodecheck.checks.node.inventory import read_inventory
from nodecheck.tuning.bindings import bind_ranks, pair_nics
from tests.conftest import Node


def test_dgx_ranks_follow_their_gpus(dgx: Node) -> None:
    """Ranks 0-3 on NUMA 0, 4-7 on NUMA 1; 56 cores a socket, 14 each, disjoint."""
    inventory = read_inventory(dgx.fs)
    bindings = bind_ranks(inventory, {})
    assert [b.numa_node for b in bindings] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [b.gpu for b in bindings] == [gpu.bdf for gpu in inventory.gpus]
    sets = [set(b.cpus) for b in bindings]
    assert all(len(s) == 14 for s in sets)
    assert len(set().union(*sets)) == 8 * 14  # no core given twice
    node_cpus = {n.number: n.cpus for n in inventory.numa_nodes}
    assert all(set(b.cpus) <= node_cpus[b.numa_node] for b in bindings)  # type: ignore[index]
    assert bindings[0].numactl() == ["numactl", "--physcpubind=0-13", "--membind=0"]
    with_smt = bind_ranks(inventory, {}, with_smt_siblings=True)
    assert len(with_smt[0].cpus) == 28 and set(bindings[0].cpus) < set(with_smt[0].cpus)


def test_cuda_visible_devices(dgx: Node) -> None:
    bindings = bind_ranks(read_inventory(dgx.fs), {"CUDA_VISIBLE_DEVICES": "4,5"})
    assert [(b.local_rank, b.gpu, b.numa_node) for b in bindings] == [
        (0, "0000:9a:00.0", 1),
        (1, "0000:9c:00.0", 1),
    ]
    assert len(bindings[0].cpus) == 28  # the whole socket, halved


def test_one_gpu_and_no_gpu(workstation: Node, build: Callable[..., Node]) -> None:
    [binding] = bind_ranks(read_inventory(workstation.fs), {})
    assert binding.gpu == "0000:01:00.0" and len(binding.cpus) == 16  # every core of the box
    assert bind_ranks(read_inventory(build("cpu-only").fs), {}) == []


def test_each_gpu_gets_the_nic_behind_its_switch(dgx: Node) -> None:
    inventory = read_inventory(dgx.fs)
    pairings = pair_nics(inventory, inventory.gpus)
    assert [(p.gpu, p.nics[0], p.relation) for p in pairings] == [
        (gpu.bdf, f"mlx5_{i}", "PIX") for i, gpu in enumerate(inventory.gpus)
    ]
    assert all(p.note == "" for p in pairings)


def test_no_rdma_nic(workstation: Node) -> None:
    inventory = read_inventory(workstation.fs)
    [pairing] = pair_nics(inventory, inventory.gpus)
    assert pairing.nics == () and "no RDMA NIC" in pairing.note


def test_far_nic_is_noted(dgx: Node) -> None:
    """Only the storage RoCE port (socket 1, its own host bridge): NODE from socket 1's
    GPUs, SYS from socket 0's; either way no GPUDirect RDMA by default."""
    inventory = read_inventory(dgx.fs)
    storage_only = replace(inventory, nics=[n for n in inventory.nics if n.name == "mlx5_8"])
    pairings = pair_nics(storage_only, inventory.gpus)
    assert [p.relation for p in pairings] == ["SYS"] * 4 + ["NODE"] * 4
    assert all(p.nics == ("mlx5_8",) and "GPUDirect RDMA" in p.note for p in pairings)
