"""What an expert adds to `tune`, each only where the node shows the need: NVLS and its
memory (NVSwitches, an NVLink domain), multi-node NVLink and the IMEX channel (an IMEX
domain), NCCL_TOPO_FILE (a VM whose GPUs sit with no PCIe switch above them), CollNet
(InfiniBand rails and the SHARP plugin), peer-to-peer off between far GPUs (no NVSwitch),
and a verdict on each value someone set for a variable tune leaves unset (queue pairs and
their split, TORCH_NCCL_ASYNC_ERROR_HANDLING). Where the need is absent, so is the advice."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from nodecheck.agent.launch.tune_view import render_text, tune_document
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import dumps, loads
from nodecheck.checks.node.nccl_library import NcclLibraries, NcclLibrary
from nodecheck.checks.node.topology import Relation
from nodecheck.checks.rules.job_versions import VersionEvidence
from nodecheck.tuning.interconnect import default_p2p_level, nvls_memory_mib
from nodecheck.tuning.nccl import JobShape, queue_pairs_verdict
from nodecheck.tuning.plan import PLAN_NEEDS, Plan, TuneOptions, make_plan
from nodecheck.tuning.pytorch import async_error_handling_verdict
from nodecheck.tuning.recommendation import LeftUnset
from tests.conftest import Node
from tests.fixtures import nodes
from tests.fixtures.graft import placed_gpus_spec
from tests.fixtures.nodegen import NodeSpec, build_node
from tests.fixtures.pinned_facts import JOB_PYTHON, job_with, with_parts

QPS = "NCCL_IB_QPS_PER_CONNECTION"
ASYNC = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def nccl(*versions: tuple[int, int, int]) -> NcclLibraries:
    """The nccl_library part as a node with these libnccl files would read."""
    return NcclLibraries(
        tuple(
            NcclLibrary(v, f"/usr/lib/x86_64-linux-gnu/libnccl.so.{'.'.join(map(str, v))}")
            for v in versions
        ),
        (),
    )


def the_jobs(project: str, text: str) -> VersionEvidence:
    """A version the job runs, as checks/rules/job_versions.py hands it over."""
    return VersionEvidence(project, text, "the test", the_jobs=True)


def plan_for(
    node: Node,
    environ: Mapping[str, str] | None = None,
    *,
    nodes: int | None = 16,
    libraries: NcclLibraries | None = None,
    torch: str | None = "2.13.0+cpu",
    job_nccl: str | None = None,
) -> Plan:
    """The plan with the job's torch and NCCL as `tune --python` reads them from a venv
    (None: not there); `libraries`: the NCCL installed on the node."""
    parts: dict[str, object] = {"job_versions": job_with(torch, job_nccl)}
    if libraries is not None:
        parts["nccl_library"] = libraries
    ctx = with_parts(node.context(environ or {}), **parts)
    return make_plan(ctx, TuneOptions(shape=JobShape(nodes)))


def left(plan: Plan, name: str) -> LeftUnset | None:
    return next((item for item in plan.left_unset if name in item.names), None)


def note(plan: Plan, start: str) -> str | None:
    return next((n for n in plan.notes if n.startswith(start)), None)


def built(spec: NodeSpec, root: Path) -> Node:
    return Node(build_node(spec, root))


# --- NVLS ----------------------------------------------------------------------------------


def test_nvls_on_nvswitch_nodes_with_its_memory_and_the_books_own_file(
    dgx: Node, workstation: Node
) -> None:
    found = left(plan_for(dgx), "NCCL_NVLS_ENABLE")
    assert found is not None
    # 8 GPUs x 16 channels x 2 MiB on Hopper; 24 channels on Blackwell.
    assert "256 MiB per GPU on Hopper, 384 MiB on Blackwell" in found.reason
    assert "482 vs 368 GB/s" in found.reason and "NCCL 2.27.7" in found.reason
    assert "more than 4 on 8x H200, more than 5 on 8x B200" in found.reason
    assert 'network/README.md, "SHARP"' in found.source
    assert "src/transport/nvls.cc" in found.source and "network benchmarks" not in found.source
    # No NVSwitch, no NVLink domain: nothing about NVLS.
    assert left(plan_for(workstation), "NCCL_NVLS_ENABLE") is None


def test_nvls_memory_figures() -> None:
    """2 MiB per channel and head (128 KiB x 8 steps x 2), heads capped at 32."""
    assert nvls_memory_mib(8, 16) == 256
    assert nvls_memory_mib(4, 24) == 192
    assert nvls_memory_mib(72, 24) == 32 * 48


# --- an NVLink domain ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def gb200(build: Callable[..., Node]) -> Node:
    return build("gb200-tray")


def test_an_nvlink_domain_gets_mnnvl_and_nvls(gb200: Node) -> None:
    plan = plan_for(gb200, job_nccl="2.27.3")
    mnnvl = left(plan, "NCCL_MNNVL_ENABLE")
    assert mnnvl is not None
    assert "names 18 nodes" in mnnvl.reason and "channel0" in mnnvl.reason
    assert "NCCL 2.21 and later" in mnnvl.reason and "src/mnnvl.cc" in mnnvl.source
    nvls = left(plan, "NCCL_NVLS_ENABLE")
    assert nvls is not None and "in the NVLink domain, at most 32" in nvls.reason
    assert "1.5 GiB on Blackwell" in nvls.reason
    # The channel is there and NCCL is new enough: no warning; the GPUs hang off Grace by
    # NVLink-C2C, so no peer-to-peer note either.
    assert not [n for n in plan.notes if "IMEX channel" in n or n.startswith("peer-to-peer")]


def test_no_imex_channel_and_old_nccl_warn(
    tmp_path: Path, gb200: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(gb200)
    (node.root / "dev" / "nvidia-caps-imex-channels" / "channel0").unlink()
    plan = plan_for(node, libraries=nccl((2, 20, 5), (2, 27, 3)))
    warning = note(plan, "warning: no IMEX channel")
    assert warning is not None
    assert "major 234 in /proc/devices" in warning and "NVreg_CreateImexChannel0=1" in warning
    assert "NCCL 2.27 and later then fail at init" in warning
    old = note(plan, "warning: NCCL 2.20.5")
    assert old is not None and "older than 2.21" in old and "2.27.3" not in old
    # The node list alone still shows the domain.
    assert left(plan, "NCCL_MNNVL_ENABLE") is not None


def test_a_tray_without_imex_is_no_domain(tmp_path: Path) -> None:
    spec = nodes.gb200_tray()
    spec.files = {k: v for k, v in spec.files.items() if "imex" not in k}
    plan = plan_for(built(spec, tmp_path / "tray"))
    assert left(plan, "NCCL_MNNVL_ENABLE") is None
    assert left(plan, "NCCL_NVLS_ENABLE") is None  # no NVSwitch on its own PCI bus either
    assert not [n for n in plan.notes if "IMEX" in n]


def test_mnnvl_verdicts(gb200: Node) -> None:
    off = left(plan_for(gb200, {"NCCL_MNNVL_ENABLE": "0"}), "NCCL_MNNVL_ENABLE")
    assert off is not None and "warning: 0 sends the traffic" in off.verdict


# --- a VM ----------------------------------------------------------------------------------


def vm_spec(gpus: int = 2) -> NodeSpec:
    """A QEMU guest given `gpus` H100s, each on its own root bus (no bridge above)."""
    spec = placed_gpus_spec(list(range(gpus)))
    spec.cpu = replace(spec.cpu, hypervisor=True, sockets=max(2, gpus))
    spec.memory_gib_per_node = [64] * max(2, gpus)
    spec.dmi = ("QEMU", "Standard PC (Q35 + ICH9, 2009)")
    return spec


def test_a_vm_whose_gpus_hide_the_host_topology_needs_a_topology_file(tmp_path: Path) -> None:
    plan = plan_for(built(vm_spec(), tmp_path / "vm"), nodes=1)
    found = left(plan, "NCCL_TOPO_FILE")
    assert found is not None
    assert "hypervisor flag" in found.reason and "which is not here" in found.reason
    assert "0000:10:00.0, 0000:11:00.0" in found.reason and "src/graph/topo.cc" in found.source
    # The topology file speaks for peer-to-peer in a VM: no second note about it.
    assert note(plan, "peer-to-peer") is None
    kept = left(
        plan_for(built(vm_spec(), tmp_path / "vm2"), {"NCCL_TOPO_FILE": "/t.xml"}, nodes=1),
        "NCCL_TOPO_FILE",
    )
    assert kept is not None and kept.verdict.startswith("NCCL_TOPO_FILE=/t.xml: kept")


def test_nccl_reads_the_daemons_file_itself(tmp_path: Path) -> None:
    spec = vm_spec()
    spec.files["/var/run/nvidia-topologyd/virtualTopology.xml"] = "<system version='1'/>"
    found = left(plan_for(built(spec, tmp_path / "vm"), nodes=1), "NCCL_TOPO_FILE")
    assert found is not None and "which is here: NCCL reads it by itself" in found.reason


def test_no_topology_advice_on_bare_metal_or_one_lone_gpu(tmp_path: Path) -> None:
    bare = placed_gpus_spec([0, 1])
    assert left(plan_for(built(bare, tmp_path / "bare"), nodes=1), "NCCL_TOPO_FILE") is None
    lone = built(vm_spec(gpus=1), tmp_path / "lone")  # one GPU, no RDMA NIC: nothing to place
    assert left(plan_for(lone, nodes=1), "NCCL_TOPO_FILE") is None


# --- CollNet over SHARP --------------------------------------------------------------------


def with_sharp(node: Node) -> Node:
    for relative in (
        "usr/lib/x86_64-linux-gnu/libnccl-net.so",
        "opt/mellanox/sharp/lib/libsharp_coll.so.5",
    ):
        path = node.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x7fELF")
    return node


def test_collnet_where_the_sharp_plugin_meets_infiniband_rails(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    assert left(plan_for(dgx), "NCCL_COLLNET_ENABLE") is None  # no plugin: no advice
    node = with_sharp(copy_node(dgx))
    found = left(plan_for(node), "NCCL_COLLNET_ENABLE")
    assert found is not None
    assert "/usr/lib/x86_64-linux-gnu/libnccl-net.so" in found.reason
    assert "/opt/mellanox/sharp/lib/libsharp_coll.so.5" in found.reason
    assert "no node can see" in found.reason and "HPC-X" in found.source
    # A one-node job has no inter-node all_reduce to offload.
    assert left(plan_for(node, nodes=1), "NCCL_COLLNET_ENABLE") is None
    kept = left(plan_for(node, {"NCCL_COLLNET_ENABLE": "1"}), "NCCL_COLLNET_ENABLE")
    assert kept is not None and "kept: NCCL tries CollNet" in kept.verdict


def test_no_collnet_on_roce(build: Callable[..., Node], copy_node: Callable[[Node], Node]) -> None:
    """SHARP is an InfiniBand switch feature: the XE9680's RoCE rails get nothing."""
    node = with_sharp(copy_node(build("xe9680")))
    assert left(plan_for(node), "NCCL_COLLNET_ENABLE") is None


# --- peer-to-peer between far GPUs -----------------------------------------------------------


def test_far_gpus_without_nvlink_lose_peer_to_peer(tmp_path: Path, dgx: Node) -> None:
    """Two GPUs on two sockets of an Intel box (SYS): off in every NCCL version."""
    node = built(placed_gpus_spec([0, 1]), tmp_path / "far")
    found = note(plan_for(node, nodes=1, job_nccl="2.27.3"), "peer-to-peer")
    assert found is not None
    assert "0000:10:00.0 and 0000:11:00.0 (SYS)" in found
    job = f"NCCL 2.27.3 (from nvidia-nccl-cu12 in {JOB_PYTHON}"
    assert f"on this Intel CPU with 2 GPUs that is PXB ({job}" in found
    assert "SHM transport" in found and "src/graph/paths.cc" in found
    # Told where peer-to-peer may go, NCCL does as told: nothing to add.
    assert note(plan_for(node, {"NCCL_P2P_LEVEL": "SYS"}, nodes=1), "peer-to-peer") is None
    # NVSwitches join the DGX's GPUs, whatever their PCIe distance.
    assert note(plan_for(dgx), "peer-to-peer") is None


def test_the_l40s_nodes_gpus_across_switches_lose_peer_to_peer(build: Callable[..., Node]) -> None:
    """The L40S/EPYC replica: no NVLink, two GPUs under each of four PCIe switches. Only
    the pairs under one switch (PIX) stay on peer-to-peer with NCCL 2.23 and later."""
    found = note(plan_for(build("l40s-epyc"), nodes=1, job_nccl="2.27.3"), "peer-to-peer")
    assert found is not None
    assert found.startswith("peer-to-peer: GPUs 0000:03:00.0 and 0000:23:00.0 (NODE);")
    assert "0000:03:00.0 and 0000:83:00.0 (SYS)" in found and "20 more pair(s)" in found
    assert "0000:03:00.0 and 0000:04:00.0" not in found  # one switch: PIX, peer-to-peer
    assert "on this AMD CPU with 8 GPUs that is PXB" in found


def amd_box(gpus: int, root: Path) -> Node:
    spec = placed_gpus_spec([0, 1] * (gpus // 2))
    spec.cpu = replace(spec.cpu, vendor_id="AuthenticAMD", model="AMD EPYC 9654 96-Core Processor")
    return built(spec, root)


def test_amd_pairs_keep_peer_to_peer_and_more_gpus_lose_it_from_2_23(tmp_path: Path) -> None:
    pair = amd_box(2, tmp_path / "pair")
    assert note(plan_for(pair, nodes=1, job_nccl="2.27.3"), "peer-to-peer") is None
    four = amd_box(4, tmp_path / "four")
    assert note(plan_for(four, nodes=1, job_nccl="2.22.3"), "peer-to-peer") is None
    found = note(plan_for(four, nodes=1, job_nccl="2.23.4"), "peer-to-peer")
    assert found is not None and "AMD CPU with 4 GPUs that is PXB" in found
    # The NCCL installed on the node is not the job's: its release decides nothing.
    unknown = note(plan_for(four, nodes=1, libraries=nccl((2, 27, 3))), "peer-to-peer")
    assert unknown is not None and "PXB from NCCL 2.23, SYS before" in unknown
    assert "the job's NCCL is not known (" in unknown
    assert "installed here, maybe not the job's: NCCL 2.27.3" in unknown


def test_default_p2p_levels() -> None:
    """NVIDIA/nccl src/graph/paths.cc, ncclTopoCheckP2p, before and from 2.23."""
    assert default_p2p_level((2, 27), "GenuineIntel", 8) is Relation.PXB
    assert default_p2p_level((2, 27), "AuthenticAMD", 2) is Relation.SYS
    assert default_p2p_level((2, 27), "AuthenticAMD", 3) is Relation.PXB
    assert default_p2p_level((2, 22), "AuthenticAMD", 8) is Relation.SYS
    assert default_p2p_level((2, 22), "GenuineIntel", 2) is Relation.PXB
    assert default_p2p_level((2, 22), "arm", 2) is Relation.PXB
    assert default_p2p_level((2, 22), "Shanghai", 2) is Relation.PXB


# --- verdicts on what someone set ----------------------------------------------------------


def test_a_jobs_queue_pairs_get_a_verdict_with_the_split_advice(
    dgx: Node, build: Callable[..., Node]
) -> None:
    plan = plan_for(dgx, {QPS: "4"}, job_nccl="2.27.3")
    found = left(plan, QPS)
    assert found is not None
    assert found.found == (f"{QPS}=4 in the calling environment", f"{QPS}=4 in pid 5151 (python3)")
    assert found.verdict.startswith(f"{QPS}=4: kept: 4 queue pairs")
    job = f"NCCL 2.27.3 (from nvidia-nccl-cu12 in {JOB_PYTHON}"
    assert f"{job}, its site-packages read without starting it (a venv)) sends each " in (
        found.verdict
    )
    assert "NCCL_IB_SPLIT_DATA_ON_QPS=1 splits every message over all 4" in found.verdict
    assert "src/transport/net_ib.cc (2.18-2.28)" in found.source
    text = render_text(plan, None)
    assert "kept: 4 queue pairs" in text
    [document] = [item for item in tune_document(plan, None)["left_unset"] if QPS in item["names"]]
    assert document["verdict"] == found.verdict
    json.dumps(document)
    # Nothing set, nothing to judge (the XE9680 runs no job).
    quiet = left(plan_for(build("xe9680")), QPS)
    assert quiet is not None and quiet.found == () and quiet.verdict == ""


def test_queue_pair_verdicts_by_version() -> None:
    nobody_knows = VersionEvidence("NCCL")
    assert queue_pairs_verdict("1", nobody_knows, {}) == "NCCL's default"
    assert queue_pairs_verdict("0", nobody_knows, {}).startswith("not a count")
    assert queue_pairs_verdict("many", nobody_knows, {}).startswith("not a count")
    old = queue_pairs_verdict("4", the_jobs("NCCL", "2.19.4"), {})
    expected = "NCCL 2.19.4 (from the test) splits every message over all 4 (its default, =1)"
    assert expected in old
    assert "measure both" not in old
    oldest = queue_pairs_verdict("2", the_jobs("NCCL", "2.17.1"), {})
    assert "it has no NCCL_IB_SPLIT_DATA_ON_QPS" in oldest
    newer = queue_pairs_verdict("4", the_jobs("NCCL", "2.21.5"), {})
    assert "NCCL 2.21.5 (from the test) sends each message on one of them in turn" in newer
    unknown = queue_pairs_verdict("4", nobody_knows, {"NCCL_IB_SPLIT_DATA_ON_QPS": "1"})
    assert unknown.startswith("kept: 4 queue pairs") and "the job's NCCL is not known" in unknown
    assert "NCCL 2.20 and later send each message on one of them in turn" in unknown
    assert "2.18-2.19 split every message" in unknown
    assert unknown.endswith("(NCCL_IB_SPLIT_DATA_ON_QPS=1 in this environment)")


def test_async_error_handling_1_and_the_flight_recorder(dgx: Node) -> None:
    old = async_error_handling_verdict("1", the_jobs("torch", "2.3.1"))
    assert old.startswith("warning: with torch 2.3 and older (torch 2.3.1 (from the test))")
    assert "pytorch issue #121055" in old
    new = async_error_handling_verdict("1", the_jobs("torch", "2.13.0"))
    assert new.startswith(
        "kept, at a cost: torch 2.4 and later (torch 2.13.0 (from the test)) wait for"
    )
    assert "ncclCommAbort" in new
    unknown = async_error_handling_verdict("1", VersionEvidence("torch"))
    assert "the job's torch is not known" in unknown and "with torch 2.3 and older" in unknown
    assert async_error_handling_verdict("3", VersionEvidence("torch")) == "torch's default"
    plan = plan_for(dgx, {ASYNC: "1"}, torch="2.3.1")
    found = left(plan, ASYNC)
    assert found is not None
    assert f"{ASYNC}=1: warning: with torch 2.3 and older" in found.verdict
    # The replica's job sets 3, the default: said as such, once.
    assert f"{ASYNC}=3: torch's default" in found.verdict


def test_a_capture_without_the_platform_part_says_what_it_could_not_judge(dgx: Node) -> None:
    """A capture from a nodecheck before the nccl_platform part: tune plans anyway, names
    what it could not judge, and still gives what the inventory shows (NVSwitches: NVLS)."""
    names = [name for name in PLAN_NEEDS if name != "nccl_platform"]
    capture = dgx.context({}).facts.capture(names)  # type: ignore[attr-defined]
    plan = make_plan(CheckContext(facts=loads(dumps(capture))), TuneOptions(shape=JobShape(16)))
    [said] = [n for n in plan.notes if n.startswith("what NCCL's interconnect features rest on")]
    assert "(the nccl_platform part) is unknown (" in said
    assert said.endswith("the NVLink domain, SHARP, VM topology and peer-to-peer advice not judged")
    assert left(plan, "NCCL_NVLS_ENABLE") is not None


def test_the_p2p_note_counts_the_jobs_gpus(build: Callable[..., Node]) -> None:
    """NCCL's peer-to-peer level counts the communicator's GPUs on the node: two GPUs of
    the L40S replica on an AMD CPU keep peer-to-peer (SYS) in NCCL 2.23 and later, and the
    GPUs the job does not use make no pairs."""
    node = build("l40s-epyc")
    two = plan_for(node, {"CUDA_VISIBLE_DEVICES": "0,2"}, nodes=1, job_nccl="2.27.3")
    assert note(two, "peer-to-peer") is None
    four = note(
        plan_for(node, {"CUDA_VISIBLE_DEVICES": "0,2,4,6"}, nodes=1, job_nccl="2.27.3"),
        "peer-to-peer",
    )
    assert four is not None and "on this AMD CPU with 4 GPUs that is PXB" in four
    assert "0000:04:00.0" not in four  # GPU 1, not the job's
