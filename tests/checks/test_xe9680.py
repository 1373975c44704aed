"""The Dell XE9680 replica (tests/fixtures/nodes.py, from a real node's lspci -vvv): ACS
on the NVSwitch path, the management LOM's link, each GPU's own compute NIC, and the
network note; and the compute/storage/management rule behind them, on literal facts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.nic_roles import NicFacts, NicRole, classify_nics, nic_roles
from nodecheck.checks.node.topology import Relation
from nodecheck.checks.result import Status
from nodecheck.tuning.bindings import pair_nics
from tests.agent.test_cli import run
from tests.conftest import Node, by_status
from tests.fixtures import nodes
from tests.fixtures.nodegen import Link, NodeSpec, build_node

COMPUTE, STORAGE, SOCKET, MANAGEMENT = (
    NicRole.COMPUTE,
    NicRole.STORAGE,
    NicRole.SOCKET,
    NicRole.MANAGEMENT,
)
PIX, PXB, PHB, NODE, SYS = Relation.PIX, Relation.PXB, Relation.PHB, Relation.NODE, Relation.SYS
XE_COMPUTE = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
XE_STORAGE = ["mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8"]
# The Switchtec downstream ports above the NVSwitches, ACS redirect on in the real node.
SWITCHTEC_PORTS = [f"0000:82:0{slot}.0" for slot in range(4)]


# --- the rule, on literal facts ------------------------------------------------------


def rdma(rate: float | None) -> NicFacts:
    return NicFacts(rdma=True, rate_gbps=rate)


def ethernet(rate: float | None) -> NicFacts:
    return NicFacts(rdma=False, rate_gbps=rate)


def test_a_slower_port_behind_the_gpus_switch_is_storage() -> None:
    """XE9680, GPU 0's switch: its 400 GbE CX-7 and a dual 100 GbE CX-6 Dx, all PIX."""
    nics = {"cx7": rdma(400), "cx6-0": rdma(100), "cx6-1": rdma(100), "lom": ethernet(1)}
    relations = {"gpu0": {"cx7": PIX, "cx6-0": PIX, "cx6-1": PIX}, "gpu1": {"cx7": NODE}}
    assert classify_nics(nics, relations) == {
        "cx7": COMPUTE,
        "cx6-0": STORAGE,
        "cx6-1": STORAGE,
        "lom": MANAGEMENT,
    }


def test_rails_behind_shared_switches_are_compute_and_a_far_port_storage() -> None:
    """DGX H100: two GPUs and two NICs per switch; a RoCE port on a root port of its own."""
    nics = {"ib0": rdma(400), "ib1": rdma(400), "roce": rdma(200)}
    relations = {
        "gpu0": {"ib0": PIX, "ib1": PIX, "roce": SYS},
        "gpu1": {"ib0": PIX, "ib1": PIX, "roce": SYS},
    }
    assert classify_nics(nics, relations) == {"ib0": COMPUTE, "ib1": COMPUTE, "roce": STORAGE}


def test_a_fast_nic_that_is_no_gpus_nearest_is_storage() -> None:
    """A PXB NIC of the fastest class while the GPU has its own PIX NIC: NCCL takes the PIX
    one, so the other is not a rail."""
    nics = {"own": rdma(400), "further": rdma(400)}
    relations = {"gpu0": {"own": PIX, "further": PXB}}
    assert classify_nics(nics, relations) == {"own": COMPUTE, "further": STORAGE}


def test_without_a_nic_within_pxb_each_gpus_nearest_fastest_are_compute() -> None:
    """NICs on root ports of their own (PHB/NODE/SYS from every GPU): NCCL still sends the
    collectives over the GPU's nearest, without GPUDirect RDMA; a NIC as fast but farther
    (SYS) is not its rail. (This test once expected every fastest RDMA NIC of the node,
    near or not, to be compute: a GB200 tray's storage ports then joined the rails.)"""
    nics = {"a": rdma(200), "b": rdma(200), "slow": rdma(25), "unknown": rdma(None)}
    relations = {"gpu0": {"a": PHB, "b": SYS, "slow": PHB, "unknown": PHB}}
    assert classify_nics(nics, relations) == {
        "a": COMPUTE,
        "b": STORAGE,
        "slow": STORAGE,
        "unknown": STORAGE,
    }
    # Without any GPU (a CPU-only node), the fastest RDMA NICs are still compute.
    assert classify_nics(nics, {}) == {
        "a": COMPUTE,
        "b": COMPUTE,
        "slow": STORAGE,
        "unknown": STORAGE,
    }


def test_without_rdma_the_fastest_interfaces_carry_the_sockets() -> None:
    nics = {"fast0": ethernet(100), "fast1": ethernet(100), "bmc": ethernet(1)}
    assert classify_nics(nics, {"gpu0": {}}) == {
        "fast0": SOCKET,
        "fast1": SOCKET,
        "bmc": MANAGEMENT,
    }
    assert classify_nics({"only": ethernet(None)}, {}) == {"only": SOCKET}
    assert classify_nics({}, {"gpu0": {}}) == {}


def test_the_other_replicas_keep_their_roles(
    dgx: Node, workstation: Node, build: Callable[..., Node]
) -> None:
    roles = nic_roles(read_inventory(dgx.fs))
    assert roles == {**{f"mlx5_{i}": COMPUTE for i in range(8)}, "mlx5_8": STORAGE} | {
        "eno1": MANAGEMENT
    }
    assert nic_roles(read_inventory(workstation.fs)) == {"enp14s0": SOCKET}
    assert nic_roles(read_inventory(build("cpu-only").fs)) == {"enp14s0": SOCKET}


# --- the replica -------------------------------------------------------------------


@pytest.fixture(scope="module")
def xe_build(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Node]:
    """The XE9680 replica changed by `alter(spec)` first, built once per change."""
    cache: dict[str, Node] = {}

    def make(name: str, alter: Callable[[NodeSpec], None]) -> Node:
        if name not in cache:
            spec = nodes.xe9680()
            alter(spec)
            cache[name] = Node(build_node(spec, tmp_path_factory.mktemp(name) / "node"))
        return cache[name]

    return make


@pytest.fixture(scope="module")
def xe(build: Callable[..., Node]) -> Node:
    """The replica as captured, with its eight H100s answering the fake NVML."""
    return build("xe9680")


def test_the_healthy_xe9680_passes_every_check(xe: Node) -> None:
    """The whole of `check` on the node as captured, GPUs included: nothing to warn about
    (the LOM's x1 link and ACS above the NVSwitches are how every XE9680 is built)."""
    runs = xe.run()
    results = [result for run in runs for result in run.results]
    assert by_status(results, Status.FAIL, Status.ERROR, Status.WARN) == []
    judged = {run.check.name for run in runs if run.status is Status.OK}
    assert judged >= {"gpu_count", "gpu_pcie", "gpu_nvlink", "pcie_link", "pcie_acs", "numa"}


def test_acs_on_the_nvswitch_path_is_not_judged(xe: Node) -> None:
    """The Switchtec ports have ACS redirect on, but only NVSwitches (whose PCIe links carry
    management; the GPUs talk over NVLink) are below them: not a failure, not a subject."""
    results = xe.results("pcie_acs")
    assert by_status(results, Status.FAIL, Status.ERROR, Status.WARN) == []
    subjects = {result.subject for result in results}
    assert not subjects & {f"bridge {port}" for port in SWITCHTEC_PORTS}
    # Every switch port above a GPU or an RDMA NIC is judged, the storage ports' included.
    assert {"bridge 0000:17:01.0", "bridge 0000:17:02.0", "bridge 0000:17:03.0"} <= subjects


@pytest.mark.parametrize(
    ("port", "above"),
    [("0000:17:01.0", "gpu 0000:19:00.0"), ("0000:99:03.0", "nic mlx5_7, nic mlx5_8")],
)
def test_acs_redirect_above_a_gpu_or_rdma_nic_still_fails(
    xe_build: Callable[..., Node], port: str, above: str
) -> None:
    def redirect(spec: NodeSpec) -> None:
        spec.find_device(port).acs_control = nodes.ACS_CTL_SWITCHTEC_DOWNSTREAM

    results = xe_build(f"acs-{port[5:7]}", redirect).results("pcie_acs")
    [failed] = by_status(results, Status.FAIL)
    assert failed.subject == f"bridge {port}" and above in failed.summary
    assert f"setpci -s {port} ECAP_ACS+0x6.w=0000" in failed.remedy


def test_the_management_lom_is_noted_not_warned(xe: Node) -> None:
    """The BCM5720 LOM is trained x1 of x2 on every XE9680: no warning, but said."""
    results = xe.results("pcie_link")
    assert by_status(results, Status.WARN, Status.FAIL, Status.ERROR) == []
    by_subject = {result.subject: result for result in results}
    for name in ("eno8303", "eno8403"):
        lom = by_subject[f"nic {name}"]
        assert lom.status is Status.OK and "x1 of x2" in lom.summary
        assert "management NIC" in lom.summary and lom.details["role"] == "management"
        assert lom.remedy == ""
    assert by_subject["nic mlx5_0"].details["role"] == "compute"
    assert by_subject["nic mlx5_1"].details["role"] == "storage"


def test_a_training_nics_narrow_link_still_warns(xe_build: Callable[..., Node]) -> None:
    def narrow(spec: NodeSpec) -> None:
        spec.find_device("0000:3c:00.0").link = Link(32.0, 8, max_width=16)  # GPU 1's CX-7
        spec.find_device("0000:1b:00.1").link = Link(16.0, 4, max_width=16)  # a storage port

    results = xe_build("narrow-nics", narrow).results("pcie_link")
    warned = {result.subject: result for result in by_status(results, Status.WARN)}
    assert set(warned) == {"nic mlx5_3", "nic mlx5_2"}
    assert "x8 of x16" in warned["nic mlx5_3"].summary and warned["nic mlx5_3"].remedy


def tune_document(node: Node, *args: str) -> dict[str, Any]:
    done = run(*node.cli_args, "tune", "--format", "json", *args)
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def test_tune_pairs_each_gpu_with_its_own_compute_nic(xe: Node) -> None:
    doc = tune_document(xe, "--nodes", "16")
    assert [(r["gpu"], r["nics"], r["nic_relation"]) for r in doc["ranks"]] == [
        (gpu, [nic], "PIX") for gpu, nic in zip(nodes.XE_GPU_BUS_IDS, XE_COMPUTE, strict=True)
    ]
    notes = "\n".join(doc["notes"])
    assert (
        "GPU 0000:19:00.0 is also near mlx5_1 (storage, 100 Gb/s, PIX), "
        "mlx5_2 (storage, 100 Gb/s, PIX)" in notes
    )
    assert "GPU 0000:9b:00.0 is also near mlx5_7 (storage, 100 Gb/s, PIX)" in notes
    assert doc["ranks"][0]["also_near"] == [
        "mlx5_1 (storage, 100 Gb/s, PIX)",
        "mlx5_2 (storage, 100 Gb/s, PIX)",
    ]
    assert doc["ranks"][1]["also_near"] == []
    [network] = [note for note in doc["notes"] if note.startswith("network:")]
    assert network.startswith("network: 3200 Gb/s between nodes (8 compute RDMA NIC(s) at 400")
    assert "not counted: storage mlx5_1, mlx5_2, mlx5_7, mlx5_8 at 100 Gb/s" in network
    env = doc["env"]
    assert env["NCCL_IB_HCA"] == "=" + ",".join(f"{name}:1" for name in XE_COMPUTE)
    # Compute and storage ports are all Ethernet (RoCE) here: the rate decided it.
    [hca] = [r for r in doc["recommendations"] if r["name"] == "NCCL_IB_HCA"]
    for name in XE_STORAGE:
        assert (
            f"{name} (Ethernet: 100 Gb/s, slower than the compute NICs' 400 Gb/s)"
            in (hca["reason"])
        )
    assert "beside InfiniBand" not in hca["reason"]


def test_pairing_falls_back_when_every_compute_port_is_down(
    xe_build: Callable[..., Node],
) -> None:
    """With the CX-7s' ports down, NCCL can only use the storage ports: GPU 0 gets one."""

    def ports_down(spec: NodeSpec) -> None:
        for bus in nodes.XE_GPU_BUS_IDS:
            nic = spec.find_device(f"{bus[:5]}{int(bus[5:7], 16) + 1:02x}:00.0")
            assert nic.rdma is not None
            nic.rdma.state, nic.rdma.phys_state = "1: DOWN", "3: Disabled"

    inventory = read_inventory(xe_build("compute-down", ports_down).fs)
    pairings = pair_nics(inventory, inventory.gpus)
    assert pairings[0].nics[0] in ("mlx5_1", "mlx5_2") and pairings[0].relation == "PIX"
    assert all(not set(p.nics) & set(XE_COMPUTE) for p in pairings)


def test_the_replica_is_the_described_node(xe: Node) -> None:
    """The facts the checks above rest on, read back from the tree."""
    inventory = read_inventory(xe.fs)
    assert [gpu.bdf for gpu in inventory.gpus] == nodes.XE_GPU_BUS_IDS
    assert len(inventory.nvswitches) == 4
    assert [nic.name for nic in inventory.nics if nic.is_rdma] == [f"mlx5_{i}" for i in range(12)]
    assert {nic.name: nic.rate_gbps for nic in inventory.nics if nic.name in XE_STORAGE} == {
        name: 100.0 for name in XE_STORAGE
    }
    assert Path(xe.root / "sys/bus/pci/drivers/tg3").is_dir()
