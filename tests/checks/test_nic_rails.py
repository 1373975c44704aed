"""Compute rails that trained slower or went down stay compute and are warned about; a
GB200 tray's NICs, none within PXB of a GPU, are each GPU's nearest, not every RDMA NIC.
The rules on literal facts, then the XE9680 and GB200 replicas through `nodecheck tune`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.net import parse_phys_state
from nodecheck.checks.node.nic_roles import (
    NicFacts,
    NicRole,
    classify_nics,
    compute_rails,
    nic_roles,
    pcie_link_gbps,
    rail_problems,
)
from nodecheck.checks.node.pci import PcieLink
from nodecheck.checks.node.topology import Relation
from nodecheck.checks.result import Status
from nodecheck.tuning.bindings import pair_nics
from tests.agent.test_cli import run
from tests.conftest import Node, by_status
from tests.fixtures import nodes
from tests.fixtures.nodegen import NodeSpec, build_node

COMPUTE, STORAGE = NicRole.COMPUTE, NicRole.STORAGE
PIX, NODE, SYS = Relation.PIX, Relation.NODE, Relation.SYS
CX7, CX6DX, BF3 = "15b3:1021", "15b3:101d", "15b3:a2dc"
GEN5_X16 = pcie_link_gbps(PcieLink(32.0, 16, 32.0, 16))
GEN4_X16 = pcie_link_gbps(PcieLink(16.0, 16, 16.0, 16))
XE_COMPUTE = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]


def rail(
    rate: float | None,
    model: str = CX7,
    layer: str = "InfiniBand",
    link: float | None = GEN5_X16,
    state: str = "",
) -> NicFacts:
    """An RDMA NIC; `state` given: no active port, in that state."""
    return NicFacts(True, rate, model, layer, link, active=not state, port_state=state)


def own_rails(count: int) -> dict[str, dict[str, Relation]]:
    """GPU i behind one switch with mlx5_i (PIX), every other NIC across the sockets."""
    return {
        f"gpu{g}": {f"mlx5_{n}": PIX if n == g else SYS for n in range(count)} for g in range(count)
    }


# --- the rules, on literal facts -----------------------------------------------------


def test_a_rail_trained_slower_or_down_stays_compute_and_is_named() -> None:
    """Eight 400G rails; mlx5_3 trained at 200G (a bad cable), mlx5_5's port is down."""
    nics = {f"mlx5_{n}": rail(400) for n in range(8)}
    nics["mlx5_3"] = rail(200)
    nics["mlx5_5"] = rail(None, state="DOWN, physical state Polling")
    relations = own_rails(8)
    assert classify_nics(nics, relations) == {name: COMPUTE for name in nics}
    degraded, down = rail_problems(nics, relations)
    assert (degraded.nic, degraded.gpus, degraded.rate_gbps, degraded.class_gbps) == (
        "mlx5_3",
        ("gpu3",),
        200,
        400,
    )
    assert degraded.peers == ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_4", "mlx5_6", "mlx5_7")
    message = degraded.message()
    assert "mlx5_3 (the rail of GPU gpu3) runs at 200 Gb/s" in message
    assert "peers (mlx5_0, mlx5_1, mlx5_2, mlx5_4, mlx5_6, mlx5_7) run at 400 Gb/s" in message
    assert "reseat or replace its cable or transceiver and check the switch port" in message
    assert (down.nic, down.gpus, down.down) == ("mlx5_5", ("gpu5",), True)
    assert (
        "no active port (DOWN, physical state Polling: no signal from the other end of the "
        "cable)" in down.message()
    )
    assert "check the switch port" in down.message()


def test_a_rail_whose_port_state_is_unreadable_is_not_called_down() -> None:
    nics = {"mlx5_0": rail(400), "mlx5_1": rail(None, state="state unknown")}
    [problem] = rail_problems(nics, own_rails(2))
    assert problem.nic == "mlx5_1"
    assert "port state of compute NIC mlx5_1 (the rail of GPU gpu1) could not be read" in (
        problem.message()
    )
    assert "no active port" not in problem.message()
    assert problem.for_its_gpu == "the port state of its compute NIC mlx5_1 could not be read"


def test_equally_near_rails_are_told_apart_by_class_not_live_rate() -> None:
    """DGX H100 style: two GPUs and two CX-7 behind one switch; ib1 trained at 200G is
    still a rail (its peers run at 400G), not a storage port."""
    nics = {"ib0": rail(400), "ib1": rail(200), "ib2": rail(400), "ib3": rail(400)}
    relations = {
        "gpu0": {"ib0": PIX, "ib1": PIX, "ib2": SYS, "ib3": SYS},
        "gpu1": {"ib0": PIX, "ib1": PIX, "ib2": SYS, "ib3": SYS},
        "gpu2": {"ib0": SYS, "ib1": SYS, "ib2": PIX, "ib3": PIX},
    }
    assert classify_nics(nics, relations) == {name: COMPUTE for name in nics}
    [problem] = rail_problems(nics, relations)
    assert (problem.nic, problem.gpus, problem.peers) == (
        "ib1",
        ("gpu0", "gpu1"),
        ("ib0", "ib2", "ib3"),
    )


def test_a_down_rail_beside_a_live_storage_port_is_still_the_rail() -> None:
    """XE9680 GPU 0's switch with the CX-7's port down: its class comes from its PCIe link
    (Gen5 x16) against the CX-6 Dx's 100G; the CX-6 Dx stays storage."""
    nics = {
        "cx7": rail(None, layer="Ethernet", state="DOWN, physical state Disabled"),
        "cx6-0": rail(100, CX6DX, "Ethernet", GEN4_X16),
        "cx6-1": rail(100, CX6DX, "Ethernet", GEN4_X16),
    }
    relations = {"gpu0": {"cx7": PIX, "cx6-0": PIX, "cx6-1": PIX}}
    assert classify_nics(nics, relations) == {"cx7": COMPUTE, "cx6-0": STORAGE, "cx6-1": STORAGE}
    [problem] = rail_problems(nics, relations)
    assert problem.nic == "cx7" and problem.down


def test_a_rate_below_the_pcie_link_alone_is_no_problem() -> None:
    """A 200G NIC on a Gen5 x16 link, with no peer faster: nothing degraded."""
    nics = {"mlx5_0": rail(200), "mlx5_1": rail(200)}
    assert rail_problems(nics, own_rails(2)) == []


@pytest.mark.parametrize(
    "layout",
    ["own CX-7 at NODE, the rest SYS", "per Grace: two CX-7 and a BlueField-3, all NODE"],
)
def test_gb200_nics_on_grace_root_ports_are_each_gpus_nearest(layout: str) -> None:
    """GB200: no NIC within PXB of a GPU. 400G BlueField-3 storage ports (Ethernet) must
    not join the CX-7 rails (InfiniBand), whether farther or as near."""
    cx7 = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5"]
    bf3 = ["mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7"]
    nics = {name: rail(400) for name in cx7} | {name: rail(400, BF3, "Ethernet") for name in bf3}
    socket = {"mlx5_0": 0, "mlx5_1": 0, "mlx5_2": 0, "mlx5_3": 0}
    relations: dict[str, dict[str, Relation]] = {}
    for g in range(4):
        if layout.startswith("own"):
            relations[f"gpu{g}"] = {n: NODE if n == cx7[g] else SYS for n in nics}
        else:
            relations[f"gpu{g}"] = {n: NODE if socket.get(n, 1) == g // 2 else SYS for n in nics}
    roles = classify_nics(nics, relations)
    assert roles == {name: COMPUTE for name in cx7} | {name: STORAGE for name in bf3}
    rails, notes = compute_rails(nics, relations)
    if layout.startswith("own"):
        assert rails == {name: [f"gpu{g}"] for g, name in enumerate(cx7)} and notes == []
    else:
        assert notes[0].startswith(
            "mlx5_0, mlx5_1 (InfiniBand) and mlx5_2, mlx5_3 (Ethernet) are equally near and "
            "fast: the InfiniBand ones are taken as the compute rails"
        )
        assert "set NCCL_IB_HCA if this node is built otherwise" in notes[0]


def test_physical_port_states_and_pcie_capacity_parse() -> None:
    assert parse_phys_state("5: LinkUp\n") == "LinkUp"
    assert parse_phys_state("2: Polling") == "Polling"
    assert parse_phys_state("7: Phy Test") == "Phy Test"
    with pytest.raises(ValueError):
        parse_phys_state("LinkUp")
    assert pytest.approx(32 * 16 * 128 / 130) == GEN5_X16
    assert pcie_link_gbps(PcieLink(2.5, 1, 2.5, 1)) == pytest.approx(2.0)
    assert pcie_link_gbps(PcieLink(32.0, 16, None, 16)) is None
    assert pcie_link_gbps(None) is None


# --- the replicas ----------------------------------------------------------------


def degraded_xe9680() -> NodeSpec:
    """The XE9680 with GPU 1's CX-7 (mlx5_3) trained at 200G and GPU 5's (mlx5_9) down."""
    spec = nodes.xe9680()
    slow = spec.find_device("0000:3c:00.0")
    assert slow.rdma is not None and slow.netdev is not None
    slow.rdma.rate, slow.netdev.speed = "200 Gb/sec (4X HDR)", 200000
    down = spec.find_device("0000:bc:00.0")
    assert down.rdma is not None and down.netdev is not None
    down.rdma.state, down.rdma.phys_state = "1: DOWN", "2: Polling"
    down.rdma.rate, down.netdev.operstate, down.netdev.speed = "10 Gb/sec (4X SDR)", "down", None
    return spec


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Node]:
    built: dict[str, Node] = {}

    def make(name: str, spec: Callable[[], NodeSpec]) -> Node:
        if name not in built:
            built[name] = Node(build_node(spec(), tmp_path_factory.mktemp(name) / "node"))
        return built[name]

    return {
        "xe-degraded": make("xe-degraded", degraded_xe9680),
        "gb200": make("gb200", nodes.gb200_tray),
    }


def tune(node: Node, *args: str) -> dict[str, Any]:
    done = run(*node.cli_args, "tune", "--format", "json", *args)
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def test_tune_keeps_a_degraded_rail_and_warns(replicas: dict[str, Node]) -> None:
    node = replicas["xe-degraded"]
    doc = tune(node, "--nodes", "16")
    active = [name for name in XE_COMPUTE if name != "mlx5_9"]
    assert doc["env"]["NCCL_IB_HCA"] == "=" + ",".join(f"{name}:1" for name in active)
    ranks = doc["ranks"]
    assert ranks[1]["nics"] == ["mlx5_3"] and ranks[1]["nic_relation"] == "PIX"
    assert "mlx5_9" not in ranks[5]["nics"] and ranks[5]["nic_relation"] == "NODE"
    # The rank's own warning, which `exec` and the shell format print, not only a node note.
    assert ranks[1]["status"] == "warn" and "mlx5_3 runs at 200 Gb/s" in ranks[1]["warning"]
    assert ranks[5]["status"] == "warn" and "mlx5_9 has no active port" in ranks[5]["warning"]
    assert ranks[0]["status"] == "ok" and "warning" not in ranks[0]
    notes = doc["notes"]
    [slow] = [note for note in notes if note.startswith("warning: compute NIC mlx5_3")]
    assert "(the rail of GPU 0000:3b:00.0) runs at 200 Gb/s while its peers" in slow
    assert "run at 400 Gb/s" in slow and "mlx5_0, mlx5_4" in slow
    assert "reseat or replace its cable or transceiver and check the switch port" in slow
    [down] = [note for note in notes if note.startswith("warning: compute NIC mlx5_9")]
    assert (
        "(the rail of GPU 0000:bb:00.0) has no active port (DOWN, physical state Polling:" in down
    )
    assert "check the switch port" in down
    [network] = [note for note in notes if note.startswith("network:")]
    assert network.startswith("network: 2600 Gb/s between nodes (7 compute RDMA NIC(s) at 200/400")
    assert "degraded: mlx5_3 (see the warning)" in network
    assert "not counted: compute mlx5_9, no active port" in network

    inventory = read_inventory(node.fs)
    assert nic_roles(inventory)["mlx5_3"] is COMPUTE and nic_roles(inventory)["mlx5_9"] is COMPUTE
    pairings = pair_nics(inventory, inventory.gpus)
    assert pairings[1].warning.startswith("its compute NIC mlx5_3 runs at 200 Gb/s")
    assert pairings[5].warning.startswith("its compute NIC mlx5_9 has no active port: NCCL")
    assert [p.warning for p in pairings].count("") == 6
    # The check that judges NIC links by role judges mlx5_3 as the rail it is.
    results = node.results("pcie_link")
    by_subject = {result.subject: result for result in results}
    assert by_subject["nic mlx5_3"].details["role"] == "compute"
    assert by_status(results, Status.FAIL, Status.ERROR) == []


def test_tune_on_a_gb200_tray_keeps_storage_off_the_rails(replicas: dict[str, Node]) -> None:
    node = replicas["gb200"]
    inventory = read_inventory(node.fs)
    assert [gpu.bdf for gpu in inventory.gpus] == nodes.GB200_GPU_BUS_IDS
    roles = nic_roles(inventory)
    assert roles == {
        **{name: COMPUTE for name in ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5")},
        **{name: STORAGE for name in ("mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7")},
    }
    doc = tune(node, "--nodes", "4")
    assert doc["env"]["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_4:1,mlx5_5:1"
    [hca] = [r for r in doc["recommendations"] if r["name"] == "NCCL_IB_HCA"]
    assert (
        "mlx5_2 (Ethernet, another fabric: 400 Gb/s, as near and fast as the InfiniBand"
        in (hca["reason"])
    )
    assert [(r["nics"][0], r["nic_relation"]) for r in doc["ranks"]] == [
        ("mlx5_0", "NODE"),
        ("mlx5_1", "NODE"),
        ("mlx5_4", "NODE"),
        ("mlx5_5", "NODE"),
    ]
    notes = doc["notes"]
    assert sum(note.startswith("NIC roles: mlx5_0, mlx5_1 (InfiniBand)") for note in notes) == 1
    [network] = [note for note in notes if note.startswith("network:")]
    assert network.startswith("network: 1600 Gb/s between nodes (4 compute RDMA NIC(s) at 400")
    assert "not counted: storage mlx5_2, mlx5_3, mlx5_6, mlx5_7" in network
    assert not [note for note in notes if note.startswith("warning:")]


def test_the_gb200_replica_is_the_described_tray(replicas: dict[str, Node]) -> None:
    root = Path(replicas["gb200"].root)
    inventory = read_inventory(replicas["gb200"].fs)
    layers = {nic.name: nic.link_layer for nic in inventory.nics}
    assert layers == {
        **{name: "InfiniBand" for name in ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5")},
        **{name: "Ethernet" for name in ("mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7")},
    }
    for gpu in inventory.gpus:
        assert {inventory.relation(gpu, nic.pci) for nic in inventory.nics} <= {NODE, SYS}
    assert (root / "sys/class/infiniband/mlx5_2/ports/1/phys_state").read_text() == "5: LinkUp\n"


def gb200_with_pcie_gpus() -> NodeSpec:
    """The tray's layout with GPUs the driver does not attach coherently (no numa_status):
    what a Grace server with PCIe GPUs in its slots shows."""
    spec = nodes.gb200_tray()
    spec.proc_files = {
        path: text for path, text in spec.proc_files.items() if not path.endswith("numa_status")
    }
    return spec


def test_a_gb200_gpu_reaches_its_nic_over_c2c(
    replicas: dict[str, Node], tmp_path_factory: pytest.TempPathFactory
) -> None:
    notes = tune(replicas["gb200"], "--nodes", "4")["notes"]
    for bdf in nodes.GB200_GPU_BUS_IDS:
        [note] = [n for n in notes if n.startswith(f"GPU {bdf} hangs off its Grace CPU")]
        assert "NCCL 2.27 and later count that path as P2C" in note
        assert "GPUDirect RDMA over C2C by default (NCCL_NET_GDR_C2C=1" in note
    assert not [n for n in notes if "NCCL does not use GPUDirect RDMA that far" in n]
    [gdr] = [
        left
        for left in tune(replicas["gb200"], "--nodes", "4")["left_unset"]
        if "NCCL_NET_GDR_LEVEL" in left["names"]
    ]
    assert "GPUDirect RDMA stays off" not in gdr["reason"]
    # The same layout with PCIe GPUs: no C2C, and NCCL stops GPUDirect RDMA at PXB.
    pcie = Node(build_node(gb200_with_pcie_gpus(), tmp_path_factory.mktemp("gb-pcie") / "n"))
    notes = tune(pcie, "--nodes", "4")["notes"]
    # One note for the four, each GPU named with its NIC.
    [far] = [n for n in notes if "NCCL does not use GPUDirect RDMA that far" in n]
    assert "is NODE from it" in far
    assert all(f"{bdf} (mlx5_" in far for bdf in nodes.GB200_GPU_BUS_IDS)
    assert not [n for n in notes if "C2C" in n]
