"""Every host check on every replica node, and on this machine's own /sys and /proc."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import UNPRIVILEGED, Action, Result, Status
from tests.conftest import LIVE, Node, by_status
from tests.fixtures.nvml_scenarios import modified
from tests.fixtures.nvml_scenarios import workstation as workstation_scenario

HOST_CHECKS = (
    "cpu",
    "nccl_env",
    "numa",
    "nvswitch_sxid",
    "pcie_acs",
    "pcie_aer",
    "pcie_link",
    "rdma_ports",
    "torch_alloc",
)


def subjects(results: list[Result], *statuses: Status) -> list[str]:
    return sorted(result.subject for result in by_status(results, *statuses))


def test_every_host_check_is_registered() -> None:
    assert set(HOST_CHECKS) <= set(load_checks())


@pytest.mark.parametrize("check", HOST_CHECKS)
def test_healthy_dgx_has_no_finding(dgx: Node, check: str) -> None:
    results = dgx.results(check)
    assert results
    bad = by_status(results, Status.FAIL, Status.ERROR, Status.WARN, Status.SKIP)
    assert bad == []


def test_healthy_dgx_judges_every_device(dgx: Node) -> None:
    results = dgx.results("pcie_link", "pcie_acs", "numa")
    gpu_subjects = {r.subject for r in results if r.subject.startswith("gpu ")}
    assert len(gpu_subjects) == 8
    # The sixteen downstream switch ports and four upstream ports, not the root ports.
    acs_bridges = {r.subject for r in dgx.results("pcie_acs")}
    assert len(acs_bridges) == 20
    assert "bridge 0000:15:01.0" not in acs_bridges


def test_faulty_dgx_acs_redirect(dgx_faulty: Node) -> None:
    results = dgx_faulty.results("pcie_acs")
    assert subjects(results, Status.FAIL) == ["bridge 0000:39:00.0", "bridge 0000:99:01.0"]
    first = by_status(results, Status.FAIL)[0]
    assert "gpu 0000:3a:00.0" in first.summary
    assert "ReqRedir" in first.summary and "CmpltRedir" in first.summary
    assert first.remedy.startswith("sudo setpci -s 0000:39:00.0 ECAP_ACS+0x6.w=0000")
    samples = {s.labels["bridge"]: s.value for r in results for s in r.samples}
    assert samples["0000:39:00.0"] == 1 and samples["0000:17:00.0"] == 0


def test_faulty_dgx_narrow_gpu_link(dgx_faulty: Node) -> None:
    results = dgx_faulty.results("pcie_link")
    assert subjects(results, Status.FAIL) == ["gpu 0000:9c:00.0"]
    (narrow,) = by_status(results, Status.FAIL)
    assert "x8 of x16" in narrow.summary
    assert "reseat" in narrow.remedy
    assert by_status(results, Status.WARN, Status.ERROR) == []


def test_faulty_dgx_unknown_numa_node(dgx_faulty: Node) -> None:
    results = dgx_faulty.results("numa")
    assert subjects(results, Status.WARN) == ["gpu 0000:ba:00.0"]
    (unknown,) = by_status(results, Status.WARN)
    # The remedy names the node the GPU's host-bridge neighbours report.
    assert "echo 1 | sudo tee /sys/bus/pci/devices/0000:ba:00.0/numa_node" in unknown.remedy


def test_faulty_dgx_p2p_disabled_in_gpu_process(dgx_faulty: Node) -> None:
    results = dgx_faulty.results("nccl_env")
    (finding,) = by_status(results, Status.FAIL)
    assert finding.summary.startswith("NCCL_P2P_DISABLE=1")
    assert "pid 4242 (python3)" in finding.summary
    assert finding.details["found_in"] == ["pid 4242 (python3)"]
    assert by_status(results, Status.WARN, Status.ERROR) == []


def test_faulty_dgx_bad_allocator_conf(dgx_faulty: Node) -> None:
    results = dgx_faulty.results("torch_alloc")
    (finding,) = by_status(results, Status.FAIL)
    assert "PYTORCH_CUDA_ALLOC_CONF" in finding.summary
    assert "pid 4242 (python3)" in finding.summary
    assert "'true'" in finding.summary and "at least 20" in finding.summary


def test_host_checks_are_all_listed() -> None:
    host = {
        c.name
        for c in load_checks().values()
        if c.run.__module__.startswith("nodecheck.checks.host.")
    }
    # network_sweep judges a record the cross-node sweep leaves, which no replica holds
    # (it says skip there): tests/checks/test_network_sweep.py.
    assert host == {*HOST_CHECKS, "network_sweep"}


def test_faulty_dgx_has_exactly_the_planted_faults(dgx_faulty: Node) -> None:
    results = dgx_faulty.results(*HOST_CHECKS)
    found = sorted(
        (r.status.value, r.subject)
        for r in by_status(results, Status.FAIL, Status.WARN, Status.ERROR)
    )
    assert found == [
        ("fail", "bridge 0000:39:00.0"),
        ("fail", "bridge 0000:99:01.0"),
        ("fail", "gpu 0000:9c:00.0"),
        ("fail", "gpu 0000:bc:00.0"),  # pcie_aer: the Surprise Down at its switch port
        ("fail", "node"),
        ("fail", "node"),
        ("warn", "gpu 0000:ba:00.0"),
    ]


def test_secrets_in_process_environments_are_never_kept(dgx_faulty: Node) -> None:
    from tests.fixtures.nodes import SECRET

    context = dgx_faulty.context()
    variables = context.variables
    assert all(
        s.name.startswith(("NCCL_", "TORCH_", "PYTORCH_", "CUDA_")) for s in variables.settings
    )
    assert SECRET not in repr(variables)
    assert SECRET not in repr(dgx_faulty.results())


def test_workstation(workstation: Node) -> None:
    results = workstation.results(*HOST_CHECKS)
    assert subjects(results, Status.FAIL, Status.ERROR) == []
    warnings = by_status(results, Status.WARN)
    assert sorted(r.subject for r in warnings) == ["gpu 0000:01:00.0", "node"]
    link = next(r for r in warnings if r.subject.startswith("gpu"))
    assert "2.5 GT/s of 16 GT/s" in link.summary and "idle" in link.summary
    governor = next(r for r in warnings if r.subject == "node")
    assert "schedutil" in governor.summary
    # One NUMA node: numa_node -1 is normal and balancing does not matter.
    assert "automatic NUMA balancing is on" in " ".join(r.summary for r in results)
    acs = [r for r in workstation.run("pcie_acs")[0].results]
    assert [r.status for r in acs] == [Status.SKIP]


@pytest.mark.parametrize(("utilization", "busy"), [(0, False), (49, False), (90, True)])
def test_a_slow_link_under_load_is_a_hardware_finding(
    workstation: Node, tmp_path: Path, utilization: int, busy: bool
) -> None:
    """The GeForce's link at 2.5 of 16 GT/s: power saving while the GPU idles (no action),
    a link that trained down while NVML reads it busy (inspect the hardware)."""
    scenario = modified(
        workstation_scenario(), gpu=0, utilization={"gpu": utilization, "memory": 0}
    )
    node = workstation.with_scenario(scenario, tmp_path / "busy.json")
    [run] = node.run("pcie_link")
    [link] = [r for r in run.results if r.subject == "gpu 0000:01:00.0"]
    finding = run.check.meant(link)
    assert link.status is Status.WARN and "2.5 GT/s of 16 GT/s" in link.summary
    if busy:
        assert f"while the GPU is busy ({utilization} % utilisation)" in link.summary
        assert finding.action is Action.INSPECT_HARDWARE and "reseat" in link.remedy
        assert link.details["utilization_pct"] == utilization
    else:
        assert "idle" in link.summary and finding.action is Action.NONE


def test_live_machine_nothing_fails() -> None:
    """Fixture (d): this machine's real /sys and /proc (no GPU here)."""
    runs = LIVE.run()
    assert all(run.completed for run in runs), [r.results for r in runs if not r.completed]
    results = [result for run in runs for result in run.results]
    assert by_status(results, Status.FAIL, Status.ERROR) == []
    acs = next(run for run in runs if run.check.name == "pcie_acs")
    assert [r.status for r in acs.results] == [Status.SKIP]


def test_vm_keeps_acs(dgx_faulty: Node, copy_node: Callable[[Node], Node]) -> None:
    """Inside a VM, ACS redirect is required: reported, not failed."""
    vm = copy_node(dgx_faulty)
    (vm.root / "sys/devices/virtual/dmi/id/sys_vendor").write_text("QEMU\n")
    results = vm.results("pcie_acs")
    assert by_status(results, Status.FAIL) == []
    redirecting = [r for r in results if r.subject == "bridge 0000:39:00.0"]
    assert redirecting[0].status is Status.OK and "VM" in redirecting[0].summary


def test_unprivileged_reader_gets_a_skip_saying_so_not_a_pass(build: Callable[..., Node]) -> None:
    """Without root the ACS bits are out of reach for good: one `skip` naming the ports
    not read and why, never an `ok`, and no `error` that would hold its class Unknown on
    every node of an unprivileged deployment."""
    node = build("dgx-h100", unprivileged=True)
    results = node.results("pcie_acs")
    assert [r.status for r in results] == [Status.SKIP]
    assert "CAP_SYS_ADMIN" in results[0].summary
    assert results[0].details["cause"] == UNPRIVILEGED
    bridges = results[0].details["bridges"]
    assert isinstance(bridges, list) and len(bridges) == 20
