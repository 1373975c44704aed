"""The rdma_ports check on replica trees: port state and rate against the node's rails,
and the error counters of ports/<n>/counters as real files, judged by rate across two
readings (the agent's history) and by what one reading shows."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.net import (
    PortCounterHistory,
    parse_port_rate,
    parse_port_width,
    read_port_counters,
)
from nodecheck.checks.result import Result, Status
from tests.conftest import Node
from tests.fixtures import nodes
from tests.fixtures.nodegen import (
    Device,
    HostBridge,
    NodeSpec,
    RdmaSpec,
    build_node,
)
from tests.fixtures.nodes import MELLANOX

PORT_DIR = Path("sys/class/infiniband/{device}/ports/1")


def rdma_results(node: Node, history: PortCounterHistory | None = None) -> dict[str, Result]:
    """The check's results by subject; with `history`, as the agent runs it (the previous
    readings kept), without it as a one-shot run."""
    options: dict[str, Any] = {} if history is None else {"port_counter_history": history}
    results = node.results("rdma_ports", **options)
    return {result.subject: result for result in results}


def dgx_with(**changes: dict[str, Any]) -> NodeSpec:
    """The healthy DGX replica with the RDMA specs of some devices changed (by name)."""
    spec = nodes.dgx_h100()
    found = set()
    for bridge in spec.host_bridges:
        for device in _walk(bridge.devices):
            if device.rdma is not None and device.rdma.name in changes:
                device.rdma = replace(device.rdma, **changes[device.rdma.name])
                found.add(device.rdma.name)
    assert found == set(changes)
    return spec


def _walk(devices: list[Device]) -> list[Device]:
    return [d for device in devices for d in (device, *_walk(device.children))]


@pytest.fixture
def build_spec(tmp_path: Path, dgx: Node) -> Callable[[NodeSpec], Node]:
    def make(spec: NodeSpec) -> Node:
        root = tmp_path / "node"
        build_node(spec, root)
        return Node(root, dgx.nvml_library, dgx.scenario)

    return make


def samples_of(result: Result) -> dict[str, float]:
    return {sample.metric.name: sample.value for sample in result.samples}


# --- parsers, on literal strings ------------------------------------------------------


def test_port_width_from_the_rate() -> None:
    assert parse_port_width("400 Gb/sec (4X NDR)") == 4
    assert parse_port_width("200 Gb/sec (2X NDR)\n") == 2
    assert parse_port_width("2.5 Gb/sec (1X SDR)") == 1
    assert parse_port_width("100 Gb/sec") is None
    assert parse_port_rate("56 Gb/sec (4X FDR)") == 56.0


# --- the link ---------------------------------------------------------------------------


def test_healthy_dgx_every_port_active_at_its_rate_with_counters(dgx: Node) -> None:
    results = rdma_results(dgx)
    assert sorted(results) == [f"rdma mlx5_{index}/1" for index in range(9)]
    assert {r.status for r in results.values()} == {Status.OK}
    rail = samples_of(results["rdma mlx5_0/1"])
    assert rail["nodecheck_rdma_port_active"] == 1
    assert rail["nodecheck_rdma_port_rate_bytes_per_second"] == 400e9 / 8
    assert rail["nodecheck_rdma_port_expected_rate_bytes_per_second"] == 400e9 / 8
    assert rail["nodecheck_rdma_port_width"] == 4
    for counter in ("link_downed", "link_error_recovery", "symbol_errors", "receive_errors"):
        assert rail[f"nodecheck_rdma_port_{counter}_total"] == 0
    storage = results["rdma mlx5_8/1"]
    assert storage.details["role"] == "storage"
    # A storage port is not held to the rails' rate.
    assert "nodecheck_rdma_port_expected_rate_bytes_per_second" not in samples_of(storage)


def test_a_rail_at_fewer_lanes_fails(build_spec: Callable[[NodeSpec], Node]) -> None:
    node = build_spec(dgx_with(mlx5_3={"rate": "200 Gb/sec (2X NDR)"}))
    results = rdma_results(node)
    bad = {subject: r for subject, r in results.items() if r.status is not Status.OK}
    assert list(bad) == ["rdma mlx5_3/1"]
    result = bad["rdma mlx5_3/1"]
    assert result.status is Status.FAIL
    assert "200 Gb/s (2 of 4 lanes trained)" in result.summary
    assert "fastest rail at 400 Gb/s" in result.summary
    assert "cable or transceiver" in result.remedy


def test_a_rail_at_a_lower_speed_fails(build_spec: Callable[[NodeSpec], Node]) -> None:
    node = build_spec(dgx_with(mlx5_6={"rate": "200 Gb/sec (4X HDR)"}))
    result = rdma_results(node)["rdma mlx5_6/1"]
    assert result.status is Status.FAIL
    assert "runs at 200 Gb/s, below the node's fastest rail at 400 Gb/s" in result.summary


def test_a_rail_that_is_down_fails_and_says_why(build_spec: Callable[[NodeSpec], Node]) -> None:
    node = build_spec(
        dgx_with(
            mlx5_1={"state": "1: DOWN", "phys_state": "2: Polling", "rate": "10 Gb/sec (4X SDR)"}
        )
    )
    results = rdma_results(node)
    result = results["rdma mlx5_1/1"]
    assert result.status is Status.FAIL
    assert "DOWN, physical state Polling: no signal from the other end" in result.summary
    assert samples_of(result)["nodecheck_rdma_port_active"] == 0
    # The down port's rate is no rail rate: the others still expect 400 Gb/s and pass.
    others = [r for s, r in results.items() if s != "rdma mlx5_1/1"]
    assert {r.status for r in others} == {Status.OK}


def test_a_storage_port_down_warns(build_spec: Callable[[NodeSpec], Node]) -> None:
    node = build_spec(dgx_with(mlx5_8={"state": "1: DOWN", "phys_state": "3: Disabled"}))
    result = rdma_results(node)["rdma mlx5_8/1"]
    assert result.status is Status.WARN
    assert "storage RDMA port is not ACTIVE" in result.summary
    assert "turned off" in result.summary


# --- the counters -----------------------------------------------------------------------


def write_counter(node: Node, device: str, name: str, value: str) -> None:
    (node.root / str(PORT_DIR).format(device=device) / "counters" / name).write_text(value)


def test_rising_counters_warn_in_the_agent_not_in_one_reading(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(dgx)
    history = PortCounterHistory()
    first = rdma_results(node, history)
    assert {r.status for r in first.values()} == {Status.OK}
    write_counter(node, "mlx5_2", "link_downed", "3\n")
    write_counter(node, "mlx5_2", "symbol_error", "1200\n")
    second = rdma_results(node, history)
    flapping = second["rdma mlx5_2/1"]
    assert flapping.status is Status.WARN
    assert "link flaps" in flapping.summary and "symbol errors" in flapping.summary
    per_minute = flapping.details["per_minute"]
    assert isinstance(per_minute, dict) and per_minute["link_downed"] > 0
    assert per_minute["port_rcv_errors"] == 0
    assert samples_of(flapping)["nodecheck_rdma_port_link_downed_total"] == 3
    assert [s for s, r in second.items() if r.status is not Status.OK] == ["rdma mlx5_2/1"]
    # A third reading with no new errors: no rate, no warning.
    third = rdma_results(node, history)
    assert third["rdma mlx5_2/1"].status is Status.OK
    # One reading alone (a one-shot run): counts since the last clear, no rate: exported only.
    alone = rdma_results(node)["rdma mlx5_2/1"]
    assert alone.status is Status.OK
    assert samples_of(alone)["nodecheck_rdma_port_symbol_errors_total"] == 1200


def test_cleared_counters_are_no_rate(dgx: Node, copy_node: Callable[[Node], Node]) -> None:
    node = copy_node(dgx)
    write_counter(node, "mlx5_4", "port_rcv_errors", "500\n")
    history = PortCounterHistory()
    rdma_results(node, history)
    write_counter(node, "mlx5_4", "port_rcv_errors", "0\n")  # perfquery -R
    result = rdma_results(node, history)["rdma mlx5_4/1"]
    assert result.status is Status.OK
    assert "port_rcv_errors went down since the last reading (cleared)" in result.summary


def test_a_saturated_counter_warns_in_one_reading(build_spec: Callable[[NodeSpec], Node]) -> None:
    counters = {
        "link_downed": 255,
        "link_error_recovery": 0,
        "symbol_error": 65535,
        "port_rcv_errors": 7,
    }
    node = build_spec(dgx_with(mlx5_5={"counters": counters}))
    result = rdma_results(node)["rdma mlx5_5/1"]
    assert result.status is Status.WARN
    assert "link_downed, symbol_error at their maximum (saturated" in result.summary
    assert "perfquery -R" in result.remedy


def test_no_counters_folder_is_an_error(build_spec: Callable[[NodeSpec], Node]) -> None:
    node = build_spec(dgx_with(mlx5_7={"counters": None}))
    results = rdma_results(node)
    result = results["rdma mlx5_7/1"]
    assert result.status is Status.ERROR
    assert "no counters folder" in result.summary
    assert "nodecheck_rdma_port_link_downed_total" not in samples_of(result)


def test_an_unreadable_counter_is_named_and_the_others_still_read(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(dgx)
    write_counter(node, "mlx5_0", "symbol_error", "N/A\n")
    os.remove(node.root / str(PORT_DIR).format(device="mlx5_0") / "counters" / "link_downed")
    result = rdma_results(node)["rdma mlx5_0/1"]
    assert result.status is Status.ERROR
    assert "cannot read the symbol_error counter" in result.summary
    assert "cannot read the link_downed counter" in result.summary and "missing" in result.summary
    assert samples_of(result)["nodecheck_rdma_port_receive_errors_total"] == 0
    reading = read_port_counters(NodeFS(sysfs=node.root / "sys"), "mlx5_0", 1)
    assert sorted(reading.values) == ["link_error_recovery", "port_rcv_errors"]


# --- RDMA devices that are no network-class PCI function, or on no PCI function -----------


def test_rdma_on_a_pci_function_of_no_network_class(
    build_spec: Callable[[NodeSpec], Node],
) -> None:
    """A QLogic TrueScale HCA (qib) is PCI class 0x0c0600 (serial bus: InfiniBand), a
    ConnectX-3 VPI 0x028000: both seen in hwloc's real captures. Their ports are judged
    (state and counters), with a note that the NIC roles do not cover them."""
    spec = nodes.workstation(with_gpu=False)
    qib = Device(
        "0000:43:00.0",
        0x1077,
        0x7322,
        0x0C0600,
        None,
        "ib_qib",
        rdma=RdmaSpec(
            "qib0",
            "InfiniBand",
            "40 Gb/sec (4X QDR)",
            state="1: DOWN",
            phys_state="2: Polling",
        ),
    )
    cx3 = Device(
        "0000:82:00.0",
        MELLANOX,
        0x1003,
        0x028000,
        None,
        "mlx4_core",
        rdma=RdmaSpec("mlx4_0", "InfiniBand", "56 Gb/sec (4X FDR)"),
    )
    spec.host_bridges.append(HostBridge("0000:43", 0, [qib]))
    spec.host_bridges.append(HostBridge("0000:82", 0, [cx3]))
    results = rdma_results(build_spec(spec))
    assert sorted(results) == ["rdma mlx4_0/1", "rdma qib0/1"]
    assert results["rdma mlx4_0/1"].status is Status.OK
    assert results["rdma mlx4_0/1"].details["role"] == "unclassified"
    assert "no network class" in str(results["rdma mlx4_0/1"].details["note"])
    down = results["rdma qib0/1"]
    assert down.status is Status.WARN
    assert "unclassified RDMA port is not ACTIVE (DOWN, physical state Polling" in down.summary


def test_a_software_rdma_device_is_not_judged(dgx: Node, copy_node: Callable[[Node], Node]) -> None:
    node = copy_node(dgx)
    rxe = node.root / "sys/devices/virtual/infiniband/rxe0"
    port = rxe / "ports/1"
    port.mkdir(parents=True)
    for name, value in (("state", "4: ACTIVE"), ("rate", "10 Gb/sec (4X SDR)")):
        (port / name).write_text(value + "\n")
    (node.root / "sys/class/infiniband/rxe0").symlink_to(
        os.path.relpath(rxe, node.root / "sys/class/infiniband")
    )
    results = rdma_results(node)
    assert results["rdma rxe0"].status is Status.SKIP
    assert "software RDMA device" in results["rdma rxe0"].summary
    assert len([s for s in results if s.startswith("rdma mlx5_")]) == 9


def test_no_rdma_class_is_a_skip(workstation: Node, copy_node: Callable[[Node], Node]) -> None:
    node = copy_node(workstation)
    infiniband = node.root / "sys/class/infiniband"
    if infiniband.exists():
        for entry in infiniband.iterdir():
            entry.unlink()
        infiniband.rmdir()
    results = node.results("rdma_ports")
    assert [(r.status, r.subject) for r in results] == [(Status.SKIP, "node")]
    assert "<sysfs>/class/infiniband is absent" in results[0].summary


def test_the_agent_keeps_one_counter_history() -> None:
    from nodecheck.agent.daemon.agent import Agent

    agent = Agent(NodeFS(), None, None)
    assert agent._context().port_counter_history is agent._context().port_counter_history


def test_an_unlistable_rdma_class_is_an_error(
    workstation: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(workstation)
    infiniband = node.root / "sys/class/infiniband"
    if infiniband.exists():
        for entry in infiniband.iterdir():
            entry.unlink()
        infiniband.rmdir()
    infiniband.write_text("")  # a file where the class folder should be
    results = node.results("rdma_ports")
    assert [(r.status, r.subject) for r in results] == [(Status.ERROR, "node")]
    assert "cannot list the RDMA devices" in results[0].summary


def test_an_infiniband_controller_without_an_rdma_device_fails(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """mlx5_ib not loaded: the ConnectX-7 is on the PCI bus (class 0x0207), its RDMA device
    is not in class/infiniband. Absence of the port is no pass."""
    node = copy_node(dgx)
    link = node.root / "sys/class/infiniband/mlx5_4"
    device_dir = Path(os.path.realpath(link))
    link.unlink()
    shutil.rmtree(device_dir)
    results = node.results("rdma_ports")
    failed = [r for r in results if r.status is Status.FAIL]
    assert len(failed) == 1 and failed[0].subject.startswith("nic ")
    assert "has no RDMA device" in failed[0].summary and "mlx5_ib" in failed[0].remedy
    assert len([r for r in results if r.subject.startswith("rdma mlx5_")]) == 8
