"""What `nodecheck tune` recommends on the replica nodes, and how it marks it against the
calling environment."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping

import pytest

from nodecheck.agent.launch.tune_view import render_text
from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.net import NetInterface
from nodecheck.checks.rules.job_versions import VersionEvidence
from nodecheck.tuning.bindings import bind_ranks
from nodecheck.tuning.nccl import JobShape, ifname_value, job_nodes, socket_candidates
from nodecheck.tuning.plan import Plan, TuneOptions, make_plan
from nodecheck.tuning.pytorch import CpuBudget, allocator, cpu_budget, parse_version
from nodecheck.tuning.recommendation import Action, Recommendation
from tests.conftest import Node
from tests.fixtures.nodegen import add_mig_instances
from tests.fixtures.pinned_facts import JOB_TORCH_2_13, TORCH_2_13, job_with, with_parts

IB_RAILS = "=" + ",".join(f"mlx5_{i}:1" for i in range(8))
DGX_GPUS = [f"0000:{bus}:00.0" for bus in ("18", "1a", "3a", "3c", "9a", "9c", "ba", "bc")]


def plan_for(
    node: Node,
    environ: Mapping[str, str] | None = None,
    *,
    nodes: int | None = None,
    single_switch: bool = False,
    torch_version: tuple[int, int] | None = (2, 13),
) -> Plan:
    """The plan with the job's torch at `torch_version` (None: not known)."""
    options = TuneOptions(shape=JobShape(nodes, single_switch))
    job = job_with(None if torch_version is None else ".".join(map(str, torch_version)) + ".0")
    ctx = with_parts(node.context(environ or {}), torch_version=TORCH_2_13, job_versions=job)
    return make_plan(ctx, options)


def torch_at(text: str | None) -> VersionEvidence:
    """The job's torch as --python reads it (None: not known)."""
    if text is None:
        return VersionEvidence("torch")
    return VersionEvidence("torch", text, "--python /opt/venv/bin/python", True)


def by_name(recommendations: list[Recommendation]) -> dict[str, Recommendation]:
    return {r.name: r for r in recommendations}


def left_names(plan: Plan) -> set[str]:
    return {name for left in plan.left_unset for name in left.names}


def test_dgx_recommendations(dgx: Node) -> None:
    plan = plan_for(dgx)
    assert plan.environment(None) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        # With the eight IB rails NCCL's sockets only bootstrap: over eno1, which holds
        # the default route (1 Gb/s, the out-of-band network), not the faster IPoIB ports;
        # gloo binds there too.
        "NCCL_SOCKET_IFNAME": "eno1",
        "GLOO_SOCKET_IFNAME": "eno1",
        # The storage RoCE port mlx5_8 is nearest no GPU: the rails are named exactly.
        "NCCL_IB_HCA": IB_RAILS,
        "NCCL_DEBUG": "WARN",  # unset, NCCL logs nothing (NVIDIA/nccl src/debug.cc)
        # The flight recorder and its dump on a timeout, torchtitan's values.
        "TORCH_FR_BUFFER_SIZE": "20000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }
    assert all(r.action is Action.SET and r.reason and r.source for r in plan.env)
    assert (
        "mlx5_8 (Ethernet, another fabric: 200 Gb/s, slower than the compute NICs' 400 Gb/s)"
        in by_name(plan.env)["NCCL_IB_HCA"].reason
    )
    assert plan.removals == []  # the healthy node's job has nothing flagged
    assert {"NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE"} <= left_names(plan)
    # The one RoCE port is storage, which NCCL_IB_HCA keeps NCCL off: no GID index to say.
    assert "NCCL_IB_GID_INDEX" not in left_names(plan)
    # Without --nodes the job's size is unknown: QPS and CROSS_NIC wait for it.
    assert {"NCCL_IB_QPS_PER_CONNECTION", "NCCL_CROSS_NIC"} <= left_names(plan)
    timeout = next(left for left in plan.left_unset if left.names == ("NCCL_IB_TIMEOUT",))
    assert timeout.found == ("NCCL_IB_TIMEOUT=22 in /etc/nccl.conf line 1",)
    assert [(r.binding.numa_node, r.nics.nics[0], r.nics.relation) for r in plan.ranks] == [
        (i // 4, f"mlx5_{i}", "PIX") for i in range(8)
    ]
    for rank in plan.ranks:
        # 14 cores and their 14 SMT siblings: one intra-op thread per physical core (the
        # process's own among them), 2 DataLoader workers and the pin-memory thread on the
        # siblings: 17 of the 28.
        assert len(rank.binding.cpus) == 28
        assert plan.environment(rank)["OMP_NUM_THREADS"] == "14"
        assert rank.dataloader.num_workers == 2 and rank.dataloader.pin_memory
        assert rank.budget.used == 17 and rank.budget.cpus == 28 and rank.budget.cores == 14
        assert "2 DataLoader worker(s) + 1 pin-memory thread = 17 of the rank's 28" in (
            rank.dataloader.reason
        )
    assert any("3200 Gb/s" in note and "400 Gb/s per GPU" in note for note in plan.notes)


def dgx_with_debug_job(dgx: Node, copy_node: Callable[[Node], Node]) -> Node:
    """The healthy node whose training job (pid 5151) also runs with NCCL_DEBUG=INFO."""
    node = copy_node(dgx)
    environ = node.root / "proc" / "5151" / "environ"
    environ.write_bytes(environ.read_bytes() + b"NCCL_DEBUG=INFO\0")
    return node


def test_marks_against_the_calling_environment(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    environ = {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "OMP_NUM_THREADS": "1",  # what torchrun sets
        "NCCL_SOCKET_IFNAME": "eno1",  # up, holds the default route: it works
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512",
        "NCCL_IB_HCA": "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7",
        "NCCL_DEBUG": "INFO",
    }
    plan = plan_for(dgx, environ)
    env = by_name(plan.env)
    assert env["CUDA_DEVICE_ORDER"].action is Action.KEEP
    assert env["NCCL_SOCKET_IFNAME"].action is Action.KEEP
    assert env["NCCL_SOCKET_IFNAME"].current == "eno1"
    # The user's own allocator option stays; expandable segments join it.
    assert env["PYTORCH_CUDA_ALLOC_CONF"].value == "max_split_size_mb:512,expandable_segments:True"
    assert env["PYTORCH_CUDA_ALLOC_CONF"].action is Action.CHANGE
    assert env["PYTORCH_ALLOC_CONF"].action is Action.SET
    # An exact list of the eight rails is kept as written.
    assert env["NCCL_IB_HCA"].action is Action.KEEP
    [omp] = plan.ranks[0].env
    assert (omp.name, omp.value, omp.action) == ("OMP_NUM_THREADS", "14", Action.CHANGE)
    # NCCL_DEBUG=INFO is changed to WARN (unset, NCCL would log nothing), the user's to keep.
    assert plan.removals == []
    debug = env["NCCL_DEBUG"]
    assert (debug.value, debug.action, debug.current, debug.advisory) == (
        "WARN",
        Action.CHANGE,
        "INFO",
        True,
    )
    # The same name flagged only in a job on the GPUs leaves this shell's own value alone.
    elsewhere = plan_for(dgx_with_debug_job(dgx, copy_node), {"NCCL_DEBUG": "WARN"})
    [debug] = elsewhere.removals
    assert debug.found_in == ("pid 5151 (python3)",) and debug.current is None
    kept = plan_for(dgx, {"NCCL_SOCKET_IFNAME": "=ibp25s0", "OMP_NUM_THREADS": "8"})
    assert by_name(kept.env)["NCCL_SOCKET_IFNAME"].action is Action.KEEP
    assert kept.ranks[0].env[0].action is Action.KEEP  # 8 of the budget's 25: the user's


def test_faulty_node_red_flags_are_unset(dgx_faulty: Node) -> None:
    plan = plan_for(dgx_faulty)
    removals = {r.name: r for r in plan.removals}
    assert set(removals) == {"NCCL_P2P_DISABLE", "PYTORCH_CUDA_ALLOC_CONF"}
    assert all(r.action is Action.UNSET for r in removals.values())
    p2p = removals["NCCL_P2P_DISABLE"]
    assert p2p.found_in == ("pid 4242 (python3)",) and p2p.flagged_value == "1"
    assert "peer-to-peer" in p2p.reason and "nccl_env" in p2p.source
    assert "torch will abort" in removals["PYTORCH_CUDA_ALLOC_CONF"].reason
    # The replacement the node should run with instead:
    assert plan.environment(None)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    # The GPU whose firmware gives no NUMA node is placed by its host bridge's devices.
    rank6 = plan.rank(6)
    assert rank6 is not None and rank6.binding.numa_node == 1
    assert "numa_node -1" in rank6.binding.note
    cpus = [set(r.binding.cpus) for r in plan.ranks]
    assert len(set().union(*cpus)) == sum(len(c) for c in cpus)  # still disjoint


def test_red_flag_in_a_config_file(dgx: Node, copy_node: Callable[[Node], Node]) -> None:
    node = copy_node(dgx)
    (node.root / "etc" / "nccl.conf").write_text("NCCL_IB_TIMEOUT=22\nNCCL_ALGO=Ring\n")
    [algo] = plan_for(node).removals
    assert algo.name == "NCCL_ALGO" and algo.current is None
    assert algo.found_in == ("/etc/nccl.conf line 2",)
    assert "remove line 2 (NCCL_ALGO) from /etc/nccl.conf" in algo.source


@pytest.mark.parametrize(
    ("nodes", "single_switch", "qps", "cross_nic"),
    [
        (8, False, None, None),  # 64 GPUs: one switch's worth
        (9, False, None, None),  # 72 GPUs: QPS is advice, never set (the fabric decides)
        (4, True, None, "1"),
        (1, True, None, None),  # one node: no network traffic at all
    ],
)
def test_fabric_settings_follow_the_job(
    dgx: Node, nodes: int, single_switch: bool, qps: str | None, cross_nic: str | None
) -> None:
    env = plan_for(dgx, nodes=nodes, single_switch=single_switch).environment(None)
    assert env.get("NCCL_IB_QPS_PER_CONNECTION") == qps
    assert env.get("NCCL_CROSS_NIC") == cross_nic


def test_job_size_from_the_launcher(dgx: Node) -> None:
    assert job_nodes({"SLURM_JOB_NUM_NODES": "16"}) == (16, "SLURM_JOB_NUM_NODES")
    assert job_nodes({"WORLD_SIZE": "128", "LOCAL_WORLD_SIZE": "8"})[0] == 16
    assert job_nodes({"WORLD_SIZE": "8"}) == (None, "")
    plan = plan_for(dgx, {"SLURM_JOB_NUM_NODES": "16"})
    assert "NCCL_IB_QPS_PER_CONNECTION" not in plan.environment(None)
    assert "the job spans 16 node(s), from SLURM_JOB_NUM_NODES" in plan.notes
    assert any("400 Gb/s per GPU over 8 GPU(s)" in note for note in plan.notes)
    # srun --gpus-per-task: this task sees GPU 3 only, the step's eight share the NICs.
    task = plan_for(
        dgx,
        {
            "SLURM_JOB_NUM_NODES": "2",
            "CUDA_VISIBLE_DEVICES": "3",
            "SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7",
        },
    )
    [network] = [note for note in task.notes if note.startswith("network:")]
    assert "400 Gb/s per GPU over 8 GPU(s)" in network and "this job has 16 GPUs" in network


def test_workstation(workstation: Node) -> None:
    plan = plan_for(workstation)
    env = plan.environment(None)
    # Without RDMA the sockets carry the collectives: the fastest interface, gloo's too.
    assert env["NCCL_SOCKET_IFNAME"] == "enp14s0" and env["GLOO_SOCKET_IFNAME"] == "enp14s0"
    assert "NCCL_IB_HCA" not in env
    assert {"NCCL_IB_QPS_PER_CONNECTION", "NCCL_CROSS_NIC"} <= left_names(plan)
    [rank] = plan.ranks
    assert rank.binding.cpus == tuple(range(32)) and rank.nics.nics == ()  # with siblings
    assert any("no RDMA NIC" in note for note in plan.notes)
    assert any(
        '2.5 Gb/s for the node is at or below the book\'s "100Gbps is not enough"' in note
        for note in plan.notes
    )


def test_cpu_only_node(build: Callable[..., Node]) -> None:
    plan = plan_for(build("cpu-only"))
    assert plan.ranks == [] and plan.env == []
    assert plan.notes == ["no NVIDIA GPU on this node: no ranks to bind, and no GPU settings"]


def test_cuda_visible_devices(dgx: Node) -> None:
    assert [r.binding.gpu for r in plan_for(dgx, {"CUDA_VISIBLE_DEVICES": "1,7,-1,2"}).ranks] == [
        "0000:1a:00.0",
        "0000:bc:00.0",
    ]  # CUDA stops at the first index it cannot use
    hidden = plan_for(dgx, {"CUDA_VISIBLE_DEVICES": ""})
    assert hidden.ranks == [] and "hides them all" in hidden.notes[0]
    uuids = plan_for(dgx, {"CUDA_VISIBLE_DEVICES": "GPU-6f0c0000-1b2e"})
    assert [r.binding.gpu for r in uuids.ranks] == [DGX_GPUS[0]]
    assert any("is GPU 0000:18:00.0, by its UUID" in note for note in uuids.notes)


# GPU 5 of the replica (0000:9c:00.0, NUMA node 1), as its information file names it.
GPU5_UUID = "GPU-6f0c0005-1b2e-4d5c-9a7b-00000000009c"
NODE1_CPUS = frozenset(range(56, 112)) | frozenset(range(168, 224))


@pytest.mark.parametrize("visible", [GPU5_UUID, "GPU-6f0c0005", "5"])
def test_a_uuid_binds_its_gpu_s_socket(dgx: Node, visible: str) -> None:
    """The reviewer's case: CUDA_VISIBLE_DEVICES=GPU-<GPU 5's UUID> gave rank 0 GPU
    0000:18:00.0 and NUMA node 0's CPUs. Its rank is GPU 5's, on node 1's CPUs (all 56
    cores with their siblings: the only rank there), exactly as index 5 gives."""
    plan = plan_for(dgx, {"CUDA_VISIBLE_DEVICES": visible})
    [rank] = plan.ranks
    assert (rank.binding.gpu, rank.binding.numa_node) == (DGX_GPUS[5], 1)
    assert frozenset(rank.binding.cpus) == NODE1_CPUS
    assert rank.nics.nics[0] == "mlx5_5" and rank.warning == ""
    assert plan.unseen == ""


def test_uuids_in_any_order_are_the_gpus_they_name(dgx: Node) -> None:
    uuid = "GPU-6f0c{:04x}-1b2e-4d5c-9a7b-{:012x}".format
    visible = ",".join(uuid(i, int(DGX_GPUS[i][5:7], 16)) for i in (7, 0, 4, 3))
    plan = plan_for(dgx, {"CUDA_VISIBLE_DEVICES": visible})
    assert [r.binding.gpu for r in plan.ranks] == [DGX_GPUS[i] for i in (7, 0, 4, 3)]
    assert [r.binding.numa_node for r in plan.ranks] == [1, 0, 1, 0]
    # The text's header says whose order local ranks follow.
    header = render_text(plan, None).splitlines()[0]
    assert header.endswith("local rank N drives the Nth GPU in CUDA_VISIBLE_DEVICES's order")
    in_bus_order = render_text(plan_for(dgx, {"CUDA_VISIBLE_DEVICES": "2,5"}), None)
    assert in_bus_order.splitlines()[0].endswith("drives the Nth GPU in PCI bus order")


@pytest.mark.parametrize("visible", ["5,5", "5,+5gpu", "GPU-6f0c0005,GPU-6f0c0005-1b2e"])
def test_a_gpu_named_twice_gets_no_rank(dgx: Node, visible: str) -> None:
    """The reviewer's other case: 0,0 gave two ranks the same CPUs with status ok."""
    plan = plan_for(dgx, {"CUDA_VISIBLE_DEVICES": visible})
    assert plan.ranks == [] and plan.env == []
    assert plan.notes[0].startswith("CUDA_VISIBLE_DEVICES names GPU 0000:9c:00.0 twice")
    assert plan.notes[0].endswith("name each GPU once: no ranks to bind")


def test_an_unknown_uuid_is_where_cuda_stops(dgx: Node) -> None:
    plan = plan_for(dgx, {"CUDA_VISIBLE_DEVICES": f"{GPU5_UUID},GPU-deadbeef,3"})
    [rank] = plan.ranks
    assert rank.binding.gpu == DGX_GPUS[5]
    assert plan.unseen.startswith(
        "CUDA_VISIBLE_DEVICES entry 2 ('GPU-deadbeef') is the UUID of no GPU here: CUDA stops "
        "there and sees only the 1 GPU(s) before it"
    )
    assert rank.warning == f"{plan.unseen} (nodecheck exec refuses such a rank)"
    assert plan.rank(1) is None  # not the one-GPU-per-task rule: a second GPU was meant


# Two MIG devices as `nvidia-smi -L` names them (R470 on): the driver's files name neither.
MIG_A = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
MIG_B = "MIG-0f9e8d7c-0000-5000-8000-000000000001"


def test_a_second_mig_device_leaves_rank_1_without_a_gpu(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """CUDA enumerates one MIG device per process (MIG user guide, "CUDA Device
    Enumeration"): with two given, rank 0 runs on the first, warned, and rank 1 is not
    the one-GPU-per-task rule's: torch.cuda.set_device(1) fails."""
    node = copy_node(dgx)
    add_mig_instances(node.root, minor=5, count=2)
    plan = plan_for(node, {"CUDA_VISIBLE_DEVICES": f"{MIG_A},{MIG_B}"})
    [rank] = plan.ranks
    assert rank.binding.gpu == DGX_GPUS[5]
    assert plan.unseen.startswith(
        f"CUDA_VISIBLE_DEVICES entry 2 ('{MIG_B}') is a second MIG device, and CUDA enumerates "
        "one MIG device per process"
    )
    assert f"{plan.unseen} (nodecheck exec refuses such a rank)" in rank.warning
    assert plan.rank(1) is None
    # One GPU by index is the one-GPU-per-task rule's: every rank drives it.
    one_gpu = plan_for(node, {"CUDA_VISIBLE_DEVICES": "5"})
    assert one_gpu.unseen == "" and one_gpu.rank(1) is not None


def test_a_uuid_prefix_beside_an_unknown_uuid_is_not_guessed(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """GPU 7's information file is empty (the driver printed nothing): GPU-6f0c0001
    begins GPU 1's UUID only among those known, but may begin GPU 7's too, which CUDA
    would find ambiguous: could not determine, no rank; the whole UUID is certain."""
    node = copy_node(dgx)
    (node.root / f"proc/driver/nvidia/gpus/{DGX_GPUS[7]}/information").write_text("")
    plan = plan_for(node, {"CUDA_VISIBLE_DEVICES": "GPU-6f0c0001"})
    assert plan.ranks == [] and plan.rank(0) is None
    assert plan.notes[0].startswith(
        "nodecheck cannot tell which GPU CUDA_VISIBLE_DEVICES entry 1 ('GPU-6f0c0001') names: "
        "it begins GPU 0000:1a:00.0's UUID, but the UUID of GPU 0000:bc:00.0 is not known"
    )
    assert "CUDA may see a GPU there, but nodecheck cannot place it" in plan.notes[0]
    whole = plan_for(node, {"CUDA_VISIBLE_DEVICES": "GPU-6f0c0001-1b2e-4d5c-9a7b-00000000001a"})
    [rank] = whole.ranks
    assert rank.binding.gpu == DGX_GPUS[1] and rank.warning == ""


def test_binding_stays_inside_the_cpuset(dgx: Node) -> None:
    """A job given socket 0's cores only: ranks of socket 1's GPUs cannot run next to
    them; all eight share socket 0's 56 cores, still disjoint, and say so."""
    inventory = read_inventory(dgx.fs)
    node0 = next(n.cpus for n in inventory.numa_nodes if n.number == 0)
    bindings = bind_ranks(inventory, {}, allowed=node0)
    assert all(set(b.cpus) <= node0 for b in bindings)
    assert [b.numa_node for b in bindings] == [0, 0, 0, 0, None, None, None, None]
    assert "may not use any CPU of NUMA node 1 (cpuset 0-55,112-167)" in bindings[4].note
    assert [len(b.cpus) for b in bindings] == [7] * 8
    assert len(set().union(*(set(b.cpus) for b in bindings))) == 8 * 7
    # Socket 1 only partly in the cpuset: its ranks split what they may use.
    part = node0 | frozenset(range(56, 60))
    split = bind_ranks(inventory, {}, allowed=part)
    assert [b.cpus for b in split[4:]] == [(56,), (57,), (58,), (59,)]


def test_each_task_sees_one_gpu(dgx: Node) -> None:
    """srun --gpus-per-task=1: each task sees its own GPU, the step has all eight. A task
    takes its GPU's share of the socket, not the whole socket."""
    inventory = read_inventory(dgx.fs)
    step = {"SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7"}
    [task5] = bind_ranks(inventory, {**step, "CUDA_VISIBLE_DEVICES": "5"})
    assert (task5.gpu, task5.numa_node, task5.cpus) == ("0000:9c:00.0", 1, tuple(range(70, 84)))
    [alone] = bind_ranks(inventory, {"CUDA_VISIBLE_DEVICES": "5"})  # no step: the whole socket
    assert len(alone.cpus) == 56
    # The plan answers for the task's own local rank, and names the NICs of every GPU.
    plan = plan_for(dgx, {**step, "CUDA_VISIBLE_DEVICES": "5", "SLURM_LOCALID": "5"})
    rank = plan.rank(5)
    assert rank is not None and rank.local_rank == 5 and rank.binding.gpu == "0000:9c:00.0"
    assert rank.nics.nics[0] == "mlx5_5"
    assert plan.environment(None)["NCCL_IB_HCA"] == IB_RAILS


def test_slurm_constrain_devices(dgx: Node) -> None:
    """ConstrainDevices: the job has GPUs 4-7 and CUDA numbers them 0-3."""
    environ = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "4,5,6,7"}
    plan = plan_for(dgx, environ)
    assert [r.binding.gpu for r in plan.ranks] == DGX_GPUS[4:]
    assert [r.binding.numa_node for r in plan.ranks] == [1, 1, 1, 1]
    assert any("counts among the job's GPUs" in note for note in plan.notes)
    # Without ConstrainDevices Slurm gives the GPUs' own indices: nothing to map.
    plain = plan_for(dgx, {"CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7"})
    assert [r.binding.gpu for r in plain.ranks] == [DGX_GPUS[1]] and plain.notes[-1:] != [
        "counts among"
    ]
    # A batch script's one process on one of its GPUs keeps the whole socket.
    [alone] = plan_for(dgx, {"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_GPUS": "0,1,2,3"}).ranks
    assert len(alone.binding.cpus) == 112  # its 56 cores with their siblings
    # Not Slurm's format: ignored rather than expanded into a billion indices.
    [huge] = plan_for(dgx, {"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_GPUS": "0-999999999"}).ranks
    assert len(huge.binding.cpus) == 112


def test_a_flagged_value_is_one_piece_of_advice(dgx: Node) -> None:
    """NCCL_IB_HCA=mlx5 selects by prefix (a warning): the advice is to change it, with
    the warning as part of the reason, not to change it and unset it too."""
    plan = plan_for(dgx, {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "nonexistent"})
    env = by_name(plan.env)
    assert env["NCCL_IB_HCA"].action is Action.CHANGE and env["NCCL_IB_HCA"].advisory
    assert "prefix match" in env["NCCL_IB_HCA"].reason
    # A value the check fails is no choice to respect.
    assert env["NCCL_SOCKET_IFNAME"].value == "eno1" and not env["NCCL_SOCKET_IFNAME"].advisory
    assert "matches no network interface" in env["NCCL_SOCKET_IFNAME"].reason
    assert plan.removals == []


def test_missing_cpu_topology(dgx: Node, copy_node: Callable[[Node], Node]) -> None:
    """Without topology/ (thread_siblings_list) each CPU counts as a core: the ranks still
    get CPUs, never an empty set."""
    node = copy_node(dgx)
    for topology in (node.root / "sys" / "devices" / "system" / "cpu").glob("cpu*/topology"):
        shutil.rmtree(topology)
    plan = plan_for(node)
    assert all(len(rank.binding.cpus) == 28 for rank in plan.ranks)  # 112 threads per node / 4
    # Siblings unknown: each CPU counts as a core, 28 - 2 workers - the pin thread.
    assert all(plan.environment(rank)["OMP_NUM_THREADS"] == "25" for rank in plan.ranks)
    assert any("the topology of CPU(s) 0-223 could not be read" in n for n in plan.notes)


@pytest.mark.parametrize(
    ("current", "value"),
    [
        (None, "expandable_segments:True"),
        ("expandable_segments:True", "expandable_segments:True"),
        (
            "garbage_collection_threshold:0.6",
            "garbage_collection_threshold:0.6,expandable_segments:True",
        ),
        ("expandable_segments:true,max_split_size_mb:16", "expandable_segments:True"),
        # Deliberate choices stand: IPC users turn segments off; cudaMallocAsync has its own pool.
        ("expandable_segments:False", "expandable_segments:False"),
        ("backend:cudaMallocAsync", "backend:cudaMallocAsync"),
    ],
)
def test_allocator_value(current: str | None, value: str) -> None:
    environ = {} if current is None else {"PYTORCH_CUDA_ALLOC_CONF": current}
    recommendations = allocator(environ, torch_at("2.13.0"))
    assert [r.value for r in recommendations] == [value, value]


def test_allocator_name_follows_the_torch_version() -> None:
    assert [r.name for r in allocator({}, torch_at("2.8.0"))] == ["PYTORCH_CUDA_ALLOC_CONF"]
    assert [r.name for r in allocator({}, torch_at("2.9.0"))] == [
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
    ]
    assert len(allocator({}, torch_at(None))) == 2  # unknown version: both, the same value
    assert parse_version("2.9.1+cu128") == (2, 9) and parse_version("nightly") is None


def interface(name: str, speed: int | None, **overrides: object) -> NetInterface:
    values: dict[str, object] = {
        "pci_bdf": "0000:01:00.0",
        "virtual": False,
        "operstate": "up",
        "speed_mbps": speed,
        "arp_type": 1,
    }
    values.update(overrides)
    return NetInterface(name, **values)  # type: ignore[arg-type]


def test_socket_candidates() -> None:
    interfaces = [
        interface("lo", None, virtual=True, arp_type=772, operstate="unknown"),
        interface("docker0", 10000, virtual=True),
        interface("virbr0", 10000, virtual=True),
        interface("bond0", 200000, virtual=True, kind="bond"),
        interface("eth0.100", 100000, virtual=True, kind="stacked"),  # a VLAN
        interface("cali12ab", 100000, virtual=True, kind="stacked"),  # Calico's veth side
        interface("br0", 100000, virtual=True, kind="bridge"),
        interface("eth0", 100000),
        interface("eth1", 100000, operstate="down"),
        interface("eth2", 400000),  # up but without an address
    ]
    addressed = {"lo", "docker0", "virbr0", "bond0", "eth0", "eth0.100", "cali12ab", "br0", "eth1"}
    assert [i.name for i in socket_candidates(interfaces, addressed)] == [
        "bond0",
        "eth0",
        "eth0.100",
    ]
    # Without /proc/net the addresses are unknown: speed alone orders them.
    assert [i.name for i in socket_candidates(interfaces, None)] == [
        "eth2",
        "bond0",
        "eth0",
        "eth0.100",
    ]


@pytest.mark.parametrize(
    ("chosen", "every", "value"),
    [
        (["ibp25s0", "ibp27s0"], ["lo", "eno1", "ibp25s0", "ibp27s0"], "ibp"),
        # "ibp" would also take the slower ibp9s0: exact names instead.
        (["ibp25s0", "ibp27s0"], ["ibp25s0", "ibp27s0", "ibp9s0"], "=ibp25s0,ibp27s0"),
        (["eth1"], ["eth0", "eth1", "eth10"], "=eth1"),  # eth1 as a prefix takes eth10 too
        (["eno1"], ["lo", "eno1"], "eno1"),
        (["eth0", "enp3s0"], ["eth0", "enp3s0", "eno1"], "=eth0,enp3s0"),
    ],
)
def test_ifname_value(chosen: list[str], every: list[str], value: str) -> None:
    assert ifname_value(chosen, every) == value


def test_allocator_reads_the_name_torch_reads() -> None:
    """torch 2.9+ takes PYTORCH_ALLOC_CONF first: that is the setting in force, and the
    advice starts from it; older torch reads only PYTORCH_CUDA_ALLOC_CONF."""
    environ = {
        "PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync",
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
    }
    assert {r.value for r in allocator(environ, torch_at("2.13.0"))} == {"backend:cudaMallocAsync"}
    [old] = allocator(environ, torch_at("2.8.0"))
    assert old.value == "max_split_size_mb:128,expandable_segments:True"


def test_nics_follow_port_state_and_bus_order(dgx: Node, copy_node: Callable[[Node], Node]) -> None:
    node = copy_node(dgx)
    (node.root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "state").write_text(
        "1: DOWN\n"
    )
    plan = plan_for(node)
    assert [r.nics.nics for r in plan.ranks[:2]] == [("mlx5_1",), ("mlx5_1",)]
    assert plan.environment(None)["NCCL_IB_HCA"] == "=" + ",".join(
        f"mlx5_{i}:1" for i in range(1, 8)
    )
    # NICs are dealt in bus order whatever order CUDA_VISIBLE_DEVICES lists the GPUs in.
    swapped = plan_for(dgx, {"CUDA_VISIBLE_DEVICES": "3,2"})
    assert [(r.binding.gpu, r.nics.nics[0]) for r in swapped.ranks] == [
        ("0000:3c:00.0", "mlx5_3"),
        ("0000:3a:00.0", "mlx5_2"),
    ]


def test_what_the_reading_inferred_reaches_the_plan(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """The bindings stand on the online CPUs taken without `online` and on a CPU placed by
    its link: the plan's notes say so, once each."""
    node = copy_node(dgx)
    cpu = node.root / "sys" / "devices" / "system" / "cpu"
    (cpu / "online").write_bytes(b"\x00\x01")
    node_list = node.root / "sys" / "devices" / "system" / "node" / "node0" / "cpulist"
    node_list.write_text("0-54,112-167\n")  # CPU 55 left out: placed by cpu55/node0
    notes = plan_for(node).notes
    [online] = [n for n in notes if n.startswith("devices/system/cpu/online unreadable")]
    assert "online CPUs 0-223 taken from present and the cpuN directories" in online
    assert [n for n in notes if "cpu55/node0" in n] == [
        "node 0: CPU 55 is in no node's list: placed by its cpu55/node0 link"
    ]
    assert len(notes) == len(set(notes))


@pytest.mark.parametrize(
    ("cpus", "budget"),
    [
        (28, CpuBudget(28, 25, 2, 1)),  # a DGX H100 rank: 14 cores with their siblings
        (14, CpuBudget(14, 11, 2, 1)),  # the same without them
        (4, CpuBudget(4, 1, 2, 1)),
        (3, CpuBudget(3, 1, 1, 1)),
        (2, CpuBudget(2, 2, 0, 0)),  # no worker: the process loads and pins its batches
        (1, CpuBudget(1, 1, 0, 0)),
    ],
)
def test_cpu_budget_adds_up(cpus: int, budget: CpuBudget) -> None:
    """OMP_NUM_THREADS (the process's own thread included) + workers + the pin-memory
    thread never exceed the rank's CPUs; the book's 2 workers, fewer on tiny ranks."""
    assert cpu_budget(cpus) == budget
    assert budget.used == cpus
    assert f"= {cpus} of the rank's {cpus} CPU(s)" in budget.split()


def test_intra_op_threads_stay_within_the_physical_cores() -> None:
    """28 hardware threads on 14 cores: 14 intra-op threads, the rest on the siblings;
    14 CPUs on 14 cores: 11, so that the workers and the pin thread have CPUs too."""
    assert cpu_budget(28, 14) == CpuBudget(28, 14, 2, 1, 14)
    assert "at most one per physical core, 14" in cpu_budget(28, 14).split()
    assert cpu_budget(14, 14) == CpuBudget(14, 11, 2, 1, 14)
    assert "physical core" not in cpu_budget(14, 14).split()


def test_cpu_budget_never_oversubscribes() -> None:
    for cpus in range(1, 513):
        budget = cpu_budget(cpus)
        assert budget.used <= cpus and budget.intra_op >= 1 and budget.workers <= 2


def test_without_smt_siblings(dgx: Node) -> None:
    """--no-smt-siblings: one thread per core, and the budget is of those 14."""
    options = TuneOptions(with_smt_siblings=False)
    plan = make_plan(
        with_parts(dgx.context({}), torch_version=TORCH_2_13, job_versions=JOB_TORCH_2_13), options
    )
    for rank in plan.ranks:
        assert len(rank.binding.cpus) == 14
        assert plan.environment(rank)["OMP_NUM_THREADS"] == "11"
        assert rank.dataloader.num_workers == 2


def test_flight_recorder(dgx: Node) -> None:
    """TORCH_NCCL_DUMP_ON_TIMEOUT=1 with a flight recorder buffer (torchtitan's 20000);
    the name torch reads (before 2.9: TORCH_NCCL_TRACE_BUFFER_SIZE); a user's buffer size
    and a dump turned off on purpose stay theirs (advisory)."""
    env = by_name(plan_for(dgx).env)
    assert env["TORCH_FR_BUFFER_SIZE"].value == "20000"
    assert "the cost" in env["TORCH_FR_BUFFER_SIZE"].reason
    assert "torchtitan" in env["TORCH_FR_BUFFER_SIZE"].source
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"].value == "1"
    old = by_name(plan_for(dgx, torch_version=(2, 5)).env)
    assert (
        old["TORCH_NCCL_TRACE_BUFFER_SIZE"].value == "20000" and "TORCH_FR_BUFFER_SIZE" not in old
    )
    mine = by_name(
        plan_for(dgx, {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}).env
    )
    assert mine["TORCH_FR_BUFFER_SIZE"].action is Action.KEEP
    dump = mine["TORCH_NCCL_DUMP_ON_TIMEOUT"]
    assert dump.action is Action.CHANGE and dump.advisory
    off = by_name(plan_for(dgx, {"TORCH_FR_BUFFER_SIZE": "0"}).env)["TORCH_FR_BUFFER_SIZE"]
    assert off.value == "20000" and off.action is Action.CHANGE and off.advisory


def test_code_hints(dgx: Node, build: Callable[..., Node]) -> None:
    """The gc hint against stragglers and torchrun --numa-binding, with their reasons; none
    on a node without GPUs."""
    hints = plan_for(dgx).code_hints
    assert [h.code.split()[0] for h in hints] == ["gc.disable()", "torchrun"]
    assert "straggler" in hints[0].reason and "nodecheck exec is better" in hints[1].reason
    assert all(h.source for h in hints)
    assert plan_for(build("cpu-only")).code_hints == []
