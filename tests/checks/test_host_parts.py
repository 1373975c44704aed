"""The parts the host checks read beside the inventory (numa_balancing, pcie_acs,
rdma_port_counters, cpu_governors): each reader on replica trees, as the fixture's spec
wrote them, and each part's round trip through nodecheck.facts/v1 (equal after
`loads(dumps(capture))`, an unreadable file still unreadable)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.cpu import CpuGovernors
from nodecheck.checks.node.facts import LiveFacts, NodeFacts, NodeSources, dumps, loads
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.net import RdmaPortCounterReading
from nodecheck.checks.node.numa import NumaBalancing
from nodecheck.checks.node.pci_config import ACS_P2P_REDIRECTING, SwitchPortAcs
from nodecheck.checks.registry import load_checks
from nodecheck.checks.runner import run_checks
from tests.conftest import Node
from tests.fixtures import nodes
from tests.fixtures.nodegen import PORT_COUNTERS, Device, NodeSpec, build_node
from tests.fixtures.topology_quirks import QUIRKS, write_tree


def captured(fs: NodeFS, name: str) -> NodeFacts:
    """Part `name` of the node at `fs`, captured; asserts that it round-trips equal."""
    facts = LiveFacts(NodeSources(fs=fs)).capture([name])
    assert list(facts.parts) == [name]
    loaded = loads(dumps(facts))
    assert loaded == facts
    assert loaded.parts[name] == facts.parts[name]
    return facts


P = TypeVar("P")


def part_of(node: Node, name: str, kind: type[P]) -> P:
    """Part `name` of `node` (round-tripped), which must be a `kind`."""
    value = captured(node.fs, name).parts[name]
    assert isinstance(value, kind), value
    return value


def _devices(devices: list[Device]) -> Iterator[Device]:
    for device in devices:
        yield device
        yield from _devices(device.children)


def spec_devices(spec: NodeSpec) -> dict[str, Device]:
    return {d.bdf: d for bridge in spec.host_bridges for d in _devices(bridge.devices)}


def real_file(node: Node, relative: str) -> Path:
    """Where a file of the tree really is (bus/pci/devices/<bdf> is a symlink)."""
    return Path(os.path.realpath(node.root / relative))


# --- numa_balancing ----------------------------------------------------------------------


def test_numa_balancing_is_the_sysctl_value(dgx: Node, workstation: Node) -> None:
    path = dgx.fs.proc("sys", "kernel", "numa_balancing")
    assert part_of(dgx, "numa_balancing", NumaBalancing) == NumaBalancing(path, mode=0)
    balancing = part_of(workstation, "numa_balancing", NumaBalancing)
    assert balancing.mode == nodes.workstation().numa_balancing == 1


def test_a_kernel_without_numa_balancing_is_absent_not_off(tmp_path: Path) -> None:
    root = write_tree(QUIRKS["no-numa-balancing"](), tmp_path / "node")
    balancing = part_of(Node(root), "numa_balancing", NumaBalancing)
    assert balancing.absent and balancing.mode is None and balancing.problem is None


def test_an_unreadable_or_senseless_numa_balancing_says_why(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(dgx)
    path = node.fs.proc("sys", "kernel", "numa_balancing")
    path.write_text("on\n")
    senseless = part_of(node, "numa_balancing", NumaBalancing)
    assert senseless.problem == f"{path}: expected a number, got 'on'"
    assert senseless.mode is None and not senseless.absent
    path.unlink()
    path.mkdir()
    unreadable = part_of(node, "numa_balancing", NumaBalancing)
    assert unreadable.problem == f"cannot read {path}: a directory, not a file"
    assert unreadable.mode is None and not unreadable.absent


# --- pcie_acs ------------------------------------------------------------------------------


def test_pcie_acs_reads_every_switch_port_as_the_tree_has_it(dgx_faulty: Node) -> None:
    bridges = part_of(dgx_faulty, "pcie_acs", SwitchPortAcs).bridges
    spec = spec_devices(nodes.dgx_h100_faulty())
    # Each switch's upstream port and its four downstream ports: never a root port.
    switch_ports = {
        child.bdf
        for root in (d for d in spec.values() if d.bdf.endswith(":01.0") and d.is_bridge)
        for child in _devices(root.children)
        if child.is_bridge
    }
    assert set(bridges) == switch_ports and len(bridges) == 20
    for bdf, reading in bridges.items():
        assert reading.config == dgx_faulty.fs.sys("bus", "pci", "devices", bdf, "config")
        assert not reading.truncated and reading.problem is None
        control = spec[bdf].acs_control
        assert (reading.acs.control if reading.acs else None) == control, bdf
    redirecting = sorted(b for b, r in bridges.items() if r.acs and r.acs.redirecting)
    assert redirecting == ["0000:39:00.0", "0000:99:01.0"]
    assert all(
        bridges[b].acs.control & ACS_P2P_REDIRECTING  # type: ignore[union-attr]
        for b in redirecting
    )


def test_pcie_acs_without_root_is_truncated_not_absent(build: Callable[..., Node]) -> None:
    node = build("dgx-h100", unprivileged=True)
    bridges = part_of(node, "pcie_acs", SwitchPortAcs).bridges
    assert len(bridges) == 20
    assert all(r.truncated and r.acs is None for r in bridges.values())
    assert all(r.problem and "needs root" in r.problem for r in bridges.values())


def test_pcie_acs_of_a_damaged_port_is_its_problem_and_the_others_are_read(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(dgx)
    config = real_file(node, "sys/bus/pci/devices/0000:17:00.0/config")
    config.write_bytes(bytes(4096))
    other = real_file(node, "sys/bus/pci/devices/0000:17:01.0/config")
    other.unlink()
    other.mkdir()
    bridges = part_of(node, "pcie_acs", SwitchPortAcs).bridges
    zeros = bridges["0000:17:00.0"]
    assert zeros.acs is None and not zeros.truncated
    assert zeros.problem == (
        f"{zeros.config}: vendor id 0x0000: the config space is not a device's (zeros)"
    )
    directory = bridges["0000:17:01.0"]
    assert directory.problem == f"cannot read {directory.config}: a directory, not a file"
    assert sum(1 for r in bridges.values() if r.problem is None and not r.truncated) == 18


# --- rdma_port_counters -----------------------------------------------------------------------


def test_rdma_port_counters_of_every_port(dgx: Node) -> None:
    counters = part_of(dgx, "rdma_port_counters", RdmaPortCounterReading)
    assert counters.class_present
    rdma = [d.rdma for d in spec_devices(nodes.dgx_h100()).values() if d.rdma is not None]
    assert sorted(p.key for p in counters.ports) == sorted(f"{spec.name}/1" for spec in rdma)
    for reading in counters.ports:
        assert reading.values == dict.fromkeys(PORT_COUNTERS, 0)
        assert reading.problems == {} and not reading.missing
        assert reading.read_at > 1e9  # the wall clock: comparable with another capture's


def test_rdma_port_counters_keep_each_counters_problem(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(dgx)
    counters = node.root / "sys/class/infiniband/mlx5_0/ports/1/counters"
    (counters / "symbol_error").write_text("N/A\n")
    shutil.rmtree(real_file(node, "sys/class/infiniband/mlx5_7/ports/1/counters"))
    reading = part_of(node, "rdma_port_counters", RdmaPortCounterReading)
    ports = {p.key: p for p in reading.ports}
    assert "symbol_error" in ports["mlx5_0/1"].problems
    assert "symbol_error" not in ports["mlx5_0/1"].values
    assert ports["mlx5_0/1"].values["link_downed"] == 0
    assert ports["mlx5_7/1"].missing and ports["mlx5_7/1"].values == {}


def test_no_rdma_class_is_recorded_as_absent(tmp_path: Path) -> None:
    root = write_tree(QUIRKS["no-numa-balancing"](), tmp_path / "node")
    assert not (root / "sys/class/infiniband").exists()
    counters = part_of(Node(root), "rdma_port_counters", RdmaPortCounterReading)
    assert not counters.class_present and counters.ports == []


# --- cpu_governors ------------------------------------------------------------------------


def test_cpu_governors_of_every_online_cpu(workstation: Node, dgx: Node) -> None:
    governors = part_of(workstation, "cpu_governors", CpuGovernors).governors
    assert governors and set(governors.values()) == {"schedutil"}
    read = part_of(dgx, "cpu_governors", CpuGovernors)
    spec = nodes.dgx_h100().cpu
    total = spec.sockets * spec.cores_per_socket * spec.threads_per_core
    assert read == CpuGovernors(dict.fromkeys(range(total), "performance"), {})


def test_an_unreadable_governor_is_a_problem_of_that_cpu(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(dgx)
    governor = node.fs.sys("devices", "system", "cpu", "cpu7", "cpufreq", "scaling_governor")
    governor.unlink()
    governor.mkdir()
    read = part_of(node, "cpu_governors", CpuGovernors)
    assert read.problems == {"cpu7 governor": f"{governor}: a directory, not a file"}
    assert 7 not in read.governors and read.governors[6] == "performance"


# --- a capture judges as the live node does -------------------------------------------------

HOST_PART_CHECKS = ("cpu", "numa", "pcie_acs", "pcie_link", "rdma_ports")


@pytest.mark.parametrize("name", sorted(nodes.NODES))
def test_the_checks_judge_a_loaded_capture_as_the_live_tree(tmp_path: Path, name: str) -> None:
    """Each of these checks over `loads(dumps(capture(its needs)))` says what it says on the
    live tree (same status, subject, summary, remedy, details and samples, in order), with
    the tree deleted before the capture is judged."""
    root = tmp_path / name
    build_node(nodes.NODES[name](), root)
    node = Node(root)
    checks = load_checks()
    live = {check: node.results(check) for check in HOST_PART_CHECKS}
    captures = {
        check: dumps(LiveFacts(NodeSources(fs=node.fs)).capture(checks[check].needs))
        for check in HOST_PART_CHECKS
    }
    shutil.rmtree(root)
    for check in HOST_PART_CHECKS:
        ctx = CheckContext(fs=node.fs, facts=loads(captures[check]))
        [run] = run_checks([checks[check]], ctx)
        assert run.results == live[check], (name, check)
