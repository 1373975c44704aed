"""Per-rank NUMA and CPU bindings on the replica nodes."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from nodecheck.checks.node.cgroup import CpusetReading
from nodecheck.checks.node.inventory import read_inventory
from nodecheck.tuning.bindings import RankBinding, bind_ranks, far_nic_notes, pair_nics
from nodecheck.tuning.plan import TuneOptions, make_plan
from tests.conftest import Node
from tests.fixtures.graft import placed_gpus_spec
from tests.fixtures.nodegen import build_node
from tests.fixtures.nodes import hbm_tiers
from tests.fixtures.pinned_facts import with_parts


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
    assert all(p.nics == ("mlx5_8",) for p in pairings)
    # One note per relation, naming each GPU and its NIC (not "this GPU" eight times).
    sys_gpus, node_gpus = inventory.gpus[:4], inventory.gpus[4:]
    assert far_nic_notes(pairings) == [
        f"the nearest RDMA NIC of GPU {', '.join(f'{g.bdf} (mlx5_8)' for g in gpus)} is "
        f"{relation} from it: NCCL does not use GPUDirect RDMA that far by default "
        "(NCCL_NET_GDR_LEVEL)"
        for relation, gpus in (("SYS", sys_gpus), ("NODE", node_gpus))
    ]
    # Each GPU's nearest NIC is PIX with its own rails: nothing is far.
    assert far_nic_notes(pair_nics(inventory, inventory.gpus)) == []


# --- bindings that can always run ---------------------------------------------------------


def placed(tmp_path: Path, numa_nodes: list[int], **layout: int) -> Node:
    root = tmp_path / "placed-gpus"
    build_node(placed_gpus_spec(numa_nodes, **layout), root)
    return Node(root)


def assert_runnable(bindings: list[RankBinding], usable: frozenset[int]) -> None:
    """Every rank can be applied: CPUs it may use, never none; or an error saying why."""
    for binding in bindings:
        if binding.error:
            assert binding.cpus == ()
            with pytest.raises(ValueError, match="no CPU to bind to"):
                binding.numactl()
        else:
            assert binding.cpus and set(binding.cpus) <= usable, binding
            assert binding.numactl()[1] != "--physcpubind="


def cpus_of(bindings: list[RankBinding]) -> list[set[int]]:
    return [set(b.cpus) for b in bindings]


def disjoint(sets: list[set[int]]) -> bool:
    return sum(len(s) for s in sets) == len(set().union(*sets))


def test_no_cpu_read_is_an_error_for_every_rank(tmp_path: Path) -> None:
    """A tree whose devices/system/cpu could not be read (an old or stripped kernel): no
    rank gets an empty binding; each is an error naming the file."""
    node = placed(tmp_path, [0, 1])
    shutil.rmtree(node.root / "sys" / "devices" / "system" / "cpu")
    inventory = read_inventory(node.fs)
    bindings = bind_ranks(inventory, {})
    assert len(bindings) == 2
    assert_runnable(bindings, frozenset())
    assert all("no online CPU could be read" in b.error for b in bindings)
    read = "devices/system/cpu/online: missing, and no cpuN directory"
    assert all(read in b.error for b in bindings)
    plan = make_plan(node.context(), TuneOptions())
    assert [r.error for r in plan.ranks] == [b.error for b in bindings]
    assert all(r.env == [] for r in plan.ranks)  # no OMP_NUM_THREADS at all, never 0
    # Said once, on each rank's line: not again as a note of the plan.
    assert not any("no CPU to bind it to" in note for note in plan.notes)


def test_an_online_file_naming_no_cpu_is_said_as_read(tmp_path: Path) -> None:
    """`online` read fine but empty (an incomplete tree): the reason says that, not that
    the file could not be read."""
    node = placed(tmp_path, [0])
    (node.root / "sys" / "devices" / "system" / "cpu" / "online").write_text("\n")
    [binding] = bind_ranks(read_inventory(node.fs), {})
    assert "devices/system/cpu/online was read and names no CPU" in binding.error
    assert "could not be read" not in binding.error


def test_a_gpu_on_an_offline_node_is_not_bound_to_its_memory(tmp_path: Path) -> None:
    """hwloc's offline-cpu0-node0: node 0 has no directory (offline, no memory), its CPUs
    name it by their cpuN/node0 links. A GPU there gets those CPUs, never --membind=0; a
    GPU at -1 goes to node 1, the only node, and says it was inferred."""
    node = placed(tmp_path, [0, 1, -1])
    shutil.rmtree(node.root / "sys" / "devices" / "system" / "node" / "node0")
    bindings = bind_ranks(read_inventory(node.fs), {})
    assert_runnable(bindings, frozenset(range(8)))
    assert [b.numa_node for b in bindings] == [None, 1, 1]
    assert set(bindings[0].cpus) <= {0, 1, 2, 3} and disjoint(cpus_of(bindings))
    assert "does not list (offline, or not described" in bindings[0].note
    assert "--membind=0" not in bindings[0].numactl()
    assert "node 1 is the only node with online CPUs" in bindings[2].note


def test_memory_is_bound_only_to_the_cpusets_memory_nodes(tmp_path: Path) -> None:
    """hwloc's 16amd64-4n4c-cgroup-distance-merge: the cpuset allows CPUs of node 0 but
    only the memory of nodes 2-3 (cpuset.mems). --membind=0 would be refused (EINVAL):
    the rank keeps node 0's CPUs, its memory unbound, with the reason."""
    node = placed(tmp_path, [0, 1])
    cpuset = CpusetReading(frozenset(range(8)), "/cpuset/job/cpus", mems=frozenset({1}))
    plan = make_plan(with_parts(node.context(), cpuset=cpuset), TuneOptions())
    first, second = (rank.binding for rank in plan.ranks)
    assert (first.numa_node, second.numa_node) == (None, 1)
    assert set(first.cpus) <= {0, 1, 2, 3} and "--membind=0" not in first.numactl()
    assert "memory nodes (1) leave out NUMA node 0" in first.note
    assert second.numactl()[-1] == "--membind=1"


def test_a_cpuset_without_online_cpus_is_an_error(tmp_path: Path) -> None:
    node = placed(tmp_path, [0, 1])
    bindings = bind_ranks(read_inventory(node.fs), {}, allowed=frozenset({100, 101}))
    assert_runnable(bindings, frozenset())
    assert all("cpuset (100-101) holds none of the online CPUs (0-7)" in b.error for b in bindings)
    # Without an `online` file the online CPUs are inferred, and the reason says from what.
    (node.root / "sys" / "devices" / "system" / "cpu" / "online").unlink()
    [first, _] = bind_ranks(read_inventory(node.fs), {}, allowed=frozenset({100, 101}))
    assert "the online CPUs (0-7; devices/system/cpu/online missing: online CPUs 0-7 taken" in (
        first.error
    )


@pytest.mark.parametrize(
    ("numa_nodes", "memory_only_nodes", "words"),
    [
        ([0, 0, 1, 2], 1, "NUMA node 2, which has no online CPU (a memory-only node"),
        ([0, 0, 1, -1], 0, "no NUMA node (numa_node -1)"),
        ([0, 0, 1, 3], 0, "NUMA node 3, which devices/system/node does not list"),
    ],
    ids=["memory-only-node", "numa-node-minus-one", "unlisted-node"],
)
def test_a_gpu_without_a_cpu_node_gets_cpus_of_its_own(
    tmp_path: Path, numa_nodes: list[int], memory_only_nodes: int, words: str
) -> None:
    """Two sockets of 4 cores, two GPUs on socket 0 and one on socket 1, and a fourth
    GPU whose node has no CPU to give: it takes the cores socket 1 holds beyond its own
    rank's share of 2 (its peers'), disjoint from the others, without --membind, and says
    why."""
    node = placed(tmp_path, numa_nodes, memory_only_nodes=memory_only_nodes)
    inventory = read_inventory(node.fs)
    bindings = bind_ranks(inventory, {})
    assert_runnable(bindings, frozenset(range(8)))
    assert [b.numa_node for b in bindings] == [0, 0, 1, None]
    assert [len(b.cpus) for b in bindings] == [2, 2, 2, 2]
    assert set(bindings[3].cpus) <= {4, 5, 6, 7}
    assert disjoint(cpus_of(bindings)) and all(not b.warning for b in bindings)
    assert words in bindings[3].note
    assert bindings[3].numactl()[2:] == []  # memory not bound to a node without CPUs


def test_a_gpu_placed_nowhere_shares_rather_than_shrink_a_local_rank(tmp_path: Path) -> None:
    """hwloc's 16amd64-8n2c with GPUs grafted on: eight nodes of 2 cores, a GPU on each and
    a ninth with numa_node -1. No core is spare: every local rank keeps its 2 cores, and the
    ninth shares one rank's, both warned (it used to take CPU 1, leaving rank 0 one CPU)."""
    node = placed(tmp_path, [*range(8), -1], sockets=8, cores=2)
    bindings = bind_ranks(read_inventory(node.fs), {})
    assert_runnable(bindings, frozenset(range(16)))
    assert [len(b.cpus) for b in bindings[:8]] == [2] * 8
    assert disjoint(cpus_of(bindings[:8]))
    assert [b.numa_node for b in bindings] == [*range(8), None]
    [partner] = [b for b in bindings[:8] if b.cpus == bindings[8].cpus]
    assert f"shares CPU(s) {partner.cpus[0]}-{partner.cpus[1]}" in bindings[8].warning
    assert bindings[8].gpu in partner.warning
    assert [b.warning for b in bindings].count("") == 7


def test_more_gpus_on_a_node_than_its_cpus_spill_to_free_cpus(tmp_path: Path) -> None:
    """Four GPUs on socket 0 of a 2x2-core box: two keep socket 0's cores, two run on
    socket 1's (no GPU there), each alone; no rank shares a CPU."""
    node = placed(tmp_path, [0, 0, 0, 0], cores=2)
    bindings = bind_ranks(read_inventory(node.fs), {})
    assert_runnable(bindings, frozenset(range(4)))
    assert [b.numa_node for b in bindings] == [0, 0, None, None]
    assert disjoint(cpus_of(bindings)) and all(not b.warning for b in bindings)
    assert "NUMA node 0 has 2 CPU(s) in reach for the ranks of its 4 GPUs" in bindings[2].note


def test_more_ranks_than_cores_share_threads_then_cpus_and_say_so(tmp_path: Path) -> None:
    """One socket of 2 cores x 2 threads and 4 GPUs: one hardware thread each (two ranks
    per core, warned); one core without SMT and 3 GPUs: all three on CPU 0, warned, and
    OMP_NUM_THREADS is 1, never 0."""
    node = placed(tmp_path, [0, 0, 0, 0], sockets=1, cores=2, threads=2)
    bindings = bind_ranks(read_inventory(node.fs), {})
    assert_runnable(bindings, frozenset(range(4)))
    assert disjoint(cpus_of(bindings)) and [len(b.cpus) for b in bindings] == [1, 1, 1, 1]
    assert all("shares a core (one SMT thread each)" in b.warning for b in bindings)
    crowded = placed(tmp_path / "crowded", [0, 0, 0], sockets=1, cores=1)
    plan = make_plan(crowded.context(), TuneOptions())
    assert [r.binding.cpus for r in plan.ranks] == [(0,), (0,), (0,)]
    assert all("shares CPU(s) 0 with the rank(s) of GPU" in r.warning for r in plan.ranks)
    assert all(plan.environment(r)["OMP_NUM_THREADS"] == "1" for r in plan.ranks)
    assert any("share CPUs or cores with other ranks" in note for note in plan.notes)


def test_slurm_tasks_each_seeing_one_gpu_stay_runnable(tmp_path: Path) -> None:
    """srun --gpus-per-task=1 on a 1-socket, 2-core box with 4 GPUs in the step: each task
    takes its share, which is one core for two tasks: a CPU, and the warning."""
    node = placed(tmp_path, [0, 0, 0, 0], sockets=1, cores=2)
    inventory = read_inventory(node.fs)
    step = {"SLURM_STEP_GPUS": "0,1,2,3"}
    seen = [bind_ranks(inventory, {**step, "CUDA_VISIBLE_DEVICES": str(i)}) for i in range(4)]
    for [task] in seen:
        assert_runnable([task], frozenset(range(2)))
        assert "shares CPU(s)" in task.warning
    # Slurm's ConstrainDevices numbering (indices among the step's GPUs) lands on the same.
    constrained = bind_ranks(inventory, {"SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert [b.gpu for b in constrained] == ["0000:12:00.0", "0000:13:00.0"]
    assert_runnable(constrained, frozenset(range(2)))
    assert disjoint(cpus_of(constrained))


def test_an_unreadable_cpuset_warns_every_rank(tmp_path: Path) -> None:
    node = placed(tmp_path, [0, 1])
    unknown = CpusetReading(None, error="/sys/fs/cgroup/job/cpuset.cpus.effective: garbage")
    plan = make_plan(with_parts(node.context(), cpuset=unknown), TuneOptions())
    assert all("the cpuset of this process could not be read" in r.warning for r in plan.ranks)
    assert all(r.binding.cpus for r in plan.ranks)
    read = CpusetReading(frozenset({1, 2, 5}), "/cgroup/unified/job/cpuset.cpus.effective")
    limited = make_plan(with_parts(node.context(), cpuset=read), TuneOptions())
    assert [r.binding.cpus for r in limited.ranks] == [(1, 2), (5,)]


def test_a_rank_the_cpuset_keeps_off_its_gpus_node_is_warned(tmp_path: Path) -> None:
    """hwloc's 16amd64-4n4c-cgroup-distance-merge with GPUs grafted on: the cpuset allows
    only node 0's CPUs, so the rank of node 1's GPU runs on node 0: it runs, warned, and
    the warning says what to ask the scheduler for."""
    node = placed(tmp_path, [0, 1])
    cpuset = CpusetReading(frozenset({0, 1, 2, 3}), "/cpuset/job/cpus")
    plan = make_plan(with_parts(node.context(), cpuset=cpuset), TuneOptions())
    first, second = plan.ranks
    assert first.warning == "" and first.binding.numa_node == 0
    assert set(second.binding.cpus) <= {0, 1, 2, 3} and second.binding.numa_node is None
    assert "is on NUMA node 1 (CPUs 4-7), but this process's cpuset (0-3)" in second.warning
    assert "ask the scheduler for CPUs of each GPU's node" in second.warning
    assert "runs away from its GPU" in second.binding.note


def test_siblings_go_to_other_ranks_before_a_cpu_is_shared(dgx: Node) -> None:
    """A cpuset of 4 cores (8 threads) for 8 ranks: with siblings, socket 0's ranks would
    take whole cores and socket 1's share their CPUs; instead each rank gets one thread,
    no CPU is held twice, and the ranks that share a core say so."""
    inventory = read_inventory(dgx.fs)
    allowed = frozenset({0, 1, 2, 3, 112, 113, 114, 115})
    bindings = bind_ranks(inventory, {}, allowed=allowed, with_smt_siblings=True)
    held = [cpu for b in bindings for cpu in b.cpus]
    assert sorted(held) == sorted(allowed)  # every thread once, none twice
    assert all(len(b.cpus) == 1 for b in bindings)
    assert all("shares a core" in b.warning for b in bindings)
    # With CPUs enough the siblings stay with their cores.
    roomy = bind_ranks(inventory, {}, with_smt_siblings=True)
    assert [len(b.cpus) for b in roomy] == [28] * 8


@pytest.mark.parametrize(
    ("bandwidths", "membind", "said"),
    [
        # The HBM node reads faster from node 0's CPUs than the CXL node: it takes memory.
        ((409600, 65536), 1, "node 1 with the highest read bandwidth from it (409600 MB/s)"),
        ((65536, 409600), 2, "node 2 with the highest read bandwidth from it (409600 MB/s)"),
        # Nothing tells the two apart: memory is not bound, never bound to node 0.
        ((None, None), None, "the kernel gives no read bandwidth that tells one from"),
        ((409600, 409600), None, "the kernel gives no read bandwidth that tells one from"),
    ],
)
def test_a_cpu_only_node_binds_memory_to_the_memory_node_it_uses(
    tmp_path: Path, bandwidths: tuple[int | None, int | None], membind: int | None, said: str
) -> None:
    """The GPU's CPUs are on node 0, which has no memory: --membind=0 would be refused
    (set_mempolicy(2)); memory goes to a memory-only node naming node 0 an initiator."""
    node = Node(build_node(hbm_tiers(bandwidths), tmp_path / "hbm"))
    [binding] = bind_ranks(read_inventory(node.fs), {})
    assert binding.numa_node == 0 and binding.cpus
    assert binding.membind == membind
    assert said in binding.note
    assert "--membind=0" not in " ".join(binding.numactl())
    if membind is None:
        assert binding.memory_unbound and binding.numactl()[-1].startswith("--physcpubind=")
    else:
        assert binding.numactl()[-1] == f"--membind={membind}"


def test_one_memory_node_and_none(tmp_path: Path) -> None:
    """One memory-only node serving node 0 takes its memory; with no initiators named
    (no accessN directories), which memory is nearest is not guessed."""
    spec = hbm_tiers()
    spec.memory_targets = spec.memory_targets[1:]
    spec.memory_targets[0].number = 1
    node = Node(build_node(spec, tmp_path / "one"))
    [binding] = bind_ranks(read_inventory(node.fs), {})
    assert binding.membind == 1 and "(access1/initiators)" in binding.note
    for link in (node.root / "sys" / "devices" / "system" / "node").glob("node*/access*"):
        shutil.rmtree(link)
    [unknown] = bind_ranks(read_inventory(node.fs), {})
    assert unknown.membind is None and unknown.memory_unbound
    assert "could not be determined, so memory is not bound" in unknown.note


def test_a_node_with_memory_keeps_its_own(workstation: Node) -> None:
    [binding] = bind_ranks(read_inventory(workstation.fs), {})
    assert binding.membind == binding.numa_node == 0 and not binding.memory_unbound
