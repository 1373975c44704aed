"""The host checks that read parts beside the inventory (numa, pcie_acs, rdma_ports, cpu)
and pcie_link, judged on literal facts: a NodeFacts built here from dataclasses
(tests/checks/literal_facts.py), no tree. Each check reads exactly the parts it declares,
and a part that could not be read comes back as "could not determine", never a pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from nodecheck.checks.host.cpu import check_cpu
from nodecheck.checks.host.numa import check_numa
from nodecheck.checks.host.pcie_acs import check_pcie_acs
from nodecheck.checks.host.pcie_link import check_pcie_link
from nodecheck.checks.host.rdma_ports import check_rdma_ports
from nodecheck.checks.node.cpu import CpuGovernors
from nodecheck.checks.node.facts import Unread
from nodecheck.checks.node.gpu import GpuSnapshot
from nodecheck.checks.node.net import (
    PORT_ERROR_COUNTERS,
    PortCounterHistory,
    PortCounters,
    RdmaPortCounterReading,
)
from nodecheck.checks.node.numa import NumaBalancing
from nodecheck.checks.node.pci import CLASS_DISPLAY_3D, VENDOR_NVIDIA, PcieLink
from nodecheck.checks.node.pci_config import AcsState, BridgeAcs, SwitchPortAcs
from nodecheck.checks.registry import CheckFunction, load_checks
from nodecheck.checks.result import NODE, Result, Status
from nodecheck.checks.runner import run_checks
from tests.checks.literal_facts import (
    GPU,
    GPU_PORT,
    NIC_PORT,
    ROOT_PORT,
    TAKEN_AT,
    UPSTREAM_PORT,
    context,
    inventory,
    pci_device,
)

BALANCING = Path("/proc/sys/kernel/numa_balancing")


def results(check: CheckFunction, parts: Mapping[str, object], **options: object) -> list[Result]:
    """The check function's results on a context over `parts`."""
    return list(check(context(parts, **options)))


def by_subject(found: list[Result]) -> dict[str, Result]:
    subjects = [r.subject for r in found]
    assert len(subjects) == len(set(subjects)), subjects
    return {r.subject: r for r in found}


# --- numa ---------------------------------------------------------------------------------


def numa_parts(balancing: NumaBalancing) -> dict[str, object]:
    return {"inventory": inventory(), "numa_balancing": balancing}


def test_numa_balancing_on_with_two_sockets_warns() -> None:
    found = results(check_numa, numa_parts(NumaBalancing(BALANCING, mode=1)))
    gpu = found[0]
    assert (gpu.status, gpu.subject, gpu.summary) == (
        Status.OK,
        f"gpu {GPU}",
        "on NUMA node 0, CPUs 0-3",
    )
    assert [(r.status, r.subject) for r in found[1:]] == [(Status.OK, NODE), (Status.WARN, NODE)]
    assert found[1].summary == "1 GPUs by NUMA node: node 0: 1"
    warning = found[2]
    assert warning.summary.startswith("automatic NUMA balancing is on (kernel.numa_balancing=1)")
    assert warning.remedy.startswith("sudo sysctl -w kernel.numa_balancing=0")
    assert warning.details == {"numa_balancing": 1}
    assert [s.value for s in warning.samples] == [1]


def test_numa_balancing_off_is_ok() -> None:
    last = results(check_numa, numa_parts(NumaBalancing(BALANCING, mode=0)))[-1]
    assert (last.status, last.summary) == (Status.OK, "automatic NUMA balancing is off")
    assert [s.value for s in last.samples] == [0]


def test_a_kernel_without_numa_balancing_is_said_with_the_verdict() -> None:
    found = results(check_numa, numa_parts(NumaBalancing(BALANCING, absent=True)))
    assert [r.status for r in found] == [Status.OK, Status.OK]
    assert found[-1].summary == (
        "1 GPUs by NUMA node: node 0: 1; no <procfs>/sys/kernel/numa_balancing: the kernel "
        "has no automatic NUMA balancing (CONFIG_NUMA_BALANCING)"
    )


def test_unreadable_numa_balancing_is_an_error_naming_why() -> None:
    problem = f"cannot read {BALANCING}: permission denied"
    found = results(check_numa, numa_parts(NumaBalancing(BALANCING, problem=problem)))
    assert [r.status for r in found] == [Status.OK, Status.OK, Status.ERROR]
    assert (found[-1].subject, found[-1].summary) == (NODE, problem)
    assert found[-1].samples == ()


# --- cpu ----------------------------------------------------------------------------------


def cpu_parts(governors: CpuGovernors) -> dict[str, object]:
    return {"inventory": inventory(), "cpu_governors": governors}


def test_cpus_off_the_performance_governor_warn() -> None:
    governors = {n: "performance" for n in range(6)} | {6: "powersave", 7: "powersave"}
    found = results(check_cpu, cpu_parts(CpuGovernors(governors)))
    assert [r.status for r in found] == [Status.WARN, Status.OK]
    warning, smt = found
    assert warning.summary == (
        "2 of 8 CPUs do not use the performance governor (performance on 6, powersave on 2)"
    )
    assert warning.details == {"governors": {"performance": 6, "powersave": 2}}
    assert [s.value for s in warning.samples] == [2]
    assert smt.summary == "SMT off: 2 socket(s), 8 cores, 1 thread(s) per core"


def test_no_cpufreq_is_a_skip_not_a_pass() -> None:
    found = results(check_cpu, cpu_parts(CpuGovernors()))
    assert found[0].status is Status.SKIP
    assert "no cpufreq governor" in found[0].summary


def test_unreadable_governors_are_one_finding_whatever_the_order_of_the_facts() -> None:
    problems = {
        f"cpu{n} governor": f"/sys/devices/system/cpu/cpu{n}/cpufreq/scaling_governor: "
        "permission denied"
        for n in (5, 1, 3)
    }
    governors = {n: "performance" for n in (0, 2, 4, 6, 7)}
    found = results(check_cpu, cpu_parts(CpuGovernors(governors, problems)))
    error = found[0]
    assert error.status is Status.ERROR
    assert error.summary == (
        "cannot read the cpufreq governor of 3 CPU(s) (cpu1, cpu3, cpu5): "
        "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor: permission denied"
    )
    assert error.details == {"cpus": "1,3,5", "first_problem": problems["cpu1 governor"]}
    # A capture's dictionaries come back sorted: the same facts in another order judge alike.
    backwards = CpuGovernors(dict(reversed(governors.items())), dict(reversed(problems.items())))
    assert results(check_cpu, cpu_parts(backwards)) == found


def test_governors_tied_and_problems_of_two_kinds_are_told_in_one_order() -> None:
    """Equal counts are told in CPU order; topology problems before governor problems."""
    governors = {n: "powersave" for n in range(4)} | {n: "performance" for n in range(4, 8)}
    problems = {"cpu6 governor": "/sys/devices/system/cpu/cpu6/cpufreq/scaling_governor: x"}
    topology = {"cpu2": "/sys/devices/system/cpu/cpu2/topology/core_id: y"}
    node = inventory()
    node = replace(node, cpu=replace(node.cpu, problems=topology))
    parts = {"inventory": node, "cpu_governors": CpuGovernors(governors, problems)}
    found = results(check_cpu, parts)
    assert [r.summary.split(" of ")[0] for r in found[:2]] == [
        "cannot read the topology",
        "cannot read the cpufreq governor",
    ]
    assert "(powersave on 4, performance on 4)" in found[2].summary
    backwards_node = replace(node, cpu=replace(node.cpu, problems=dict(reversed(topology.items()))))
    backwards = {
        "inventory": backwards_node,
        "cpu_governors": CpuGovernors(
            dict(reversed(governors.items())), dict(reversed(problems.items()))
        ),
    }
    assert results(check_cpu, backwards) == found


# --- pcie_acs -----------------------------------------------------------------------------


def config(bdf: str) -> Path:
    return Path("/sys/bus/pci/devices", bdf, "config")


def switch_ports(**changes: BridgeAcs) -> SwitchPortAcs:
    """The switch: the upstream port without ACS, both downstream ports with ACS that leaves
    peer traffic alone, then `changes` (by GPU_PORT / NIC_PORT / UPSTREAM_PORT name)."""
    names = {"UPSTREAM_PORT": UPSTREAM_PORT, "GPU_PORT": GPU_PORT, "NIC_PORT": NIC_PORT}
    bridges = {
        UPSTREAM_PORT: BridgeAcs(config(UPSTREAM_PORT)),
        GPU_PORT: BridgeAcs(config(GPU_PORT), AcsState(0x148, 0x5F, 0x0000)),
        NIC_PORT: BridgeAcs(config(NIC_PORT), AcsState(0x148, 0x5F, 0x0000)),
    }
    bridges |= {names[name]: reading for name, reading in changes.items()}
    return SwitchPortAcs(bridges)


def acs_parts(acs: SwitchPortAcs, virtualization: str | None = None) -> dict[str, object]:
    return {"inventory": inventory(), "virtualization": virtualization, "pcie_acs": acs}


REDIRECTING = BridgeAcs(config(GPU_PORT), AcsState(0x148, 0x5F, 0x001D))


def test_acs_redirect_on_a_switch_port_fails_with_the_setpci_command() -> None:
    found = by_subject(results(check_pcie_acs, acs_parts(switch_ports(GPU_PORT=REDIRECTING))))
    assert sorted(found) == [f"bridge {b}" for b in (UPSTREAM_PORT, GPU_PORT, NIC_PORT)]
    upstream = found[f"bridge {UPSTREAM_PORT}"]
    assert (upstream.status, upstream.summary) == (
        Status.OK,
        f"no ACS capability on the switch port above gpu {GPU}, nic mlx5_0",
    )
    failed = found[f"bridge {GPU_PORT}"]
    assert failed.status is Status.FAIL
    assert failed.summary.startswith(f"ACS ReqRedir CmpltRedir on the switch port above gpu {GPU}")
    assert failed.remedy.startswith(f"sudo setpci -s {GPU_PORT} ECAP_ACS+0x6.w=0000")
    assert failed.details["acs_control"] == "0x001d"
    assert [s.value for s in failed.samples] == [1]
    assert found[f"bridge {NIC_PORT}"].status is Status.OK


def test_acs_redirect_in_a_vm_is_as_required() -> None:
    vm = "DMI: QEMU Standard PC"
    parts = acs_parts(switch_ports(GPU_PORT=REDIRECTING), virtualization=vm)
    result = by_subject(results(check_pcie_acs, parts))[f"bridge {GPU_PORT}"]
    assert result.status is Status.OK
    assert f"as a VM requires ({vm})" in result.summary
    assert result.details["virtual_machine"] == vm


def test_acs_read_without_root_is_one_skip_asking_for_root() -> None:
    truncated = {
        name: BridgeAcs(config(bdf), truncated=True, problem="only 64 bytes readable")
        for name, bdf in (
            ("UPSTREAM_PORT", UPSTREAM_PORT),
            ("GPU_PORT", GPU_PORT),
            ("NIC_PORT", NIC_PORT),
        )
    }
    found = results(check_pcie_acs, acs_parts(switch_ports(**truncated)))
    assert [(r.status, r.subject) for r in found] == [(Status.SKIP, NODE)]
    assert "ACS not read on 3 PCIe switch port(s)" in found[0].summary
    assert found[0].remedy == "run nodecheck as root (sudo nodecheck check --only pcie_acs)"
    assert found[0].details == {
        "bridges": sorted([UPSTREAM_PORT, GPU_PORT, NIC_PORT]),
        "cause": "unprivileged",
    }
    # One port read beside them: judged, the others still said.
    mixed = results(
        check_pcie_acs, acs_parts(switch_ports(UPSTREAM_PORT=truncated["UPSTREAM_PORT"]))
    )
    assert Status.SKIP in {r.status for r in mixed} and len(mixed) > 1


def test_an_unreadable_switch_port_is_an_error_and_a_port_not_read_is_no_pass() -> None:
    problem = f"cannot read {config(NIC_PORT)}: permission denied"
    acs = switch_ports(NIC_PORT=BridgeAcs(config(NIC_PORT), problem=problem))
    found = by_subject(results(check_pcie_acs, acs_parts(acs)))
    assert (found[f"bridge {NIC_PORT}"].status, found[f"bridge {NIC_PORT}"].summary) == (
        Status.ERROR,
        problem,
    )
    missing = SwitchPortAcs({GPU_PORT: REDIRECTING})
    found = by_subject(results(check_pcie_acs, acs_parts(missing)))
    for bdf in (UPSTREAM_PORT, NIC_PORT):
        assert found[f"bridge {bdf}"].status is Status.ERROR
        assert "the facts hold no reading of its config space" in found[f"bridge {bdf}"].summary
    assert found[f"bridge {GPU_PORT}"].status is Status.FAIL


# --- rdma_ports ---------------------------------------------------------------------------


def counters(read_at: float = TAKEN_AT, **values: int) -> PortCounters:
    return PortCounters("mlx5_0", 1, read_at, dict.fromkeys(PORT_ERROR_COUNTERS, 0) | values)


def rdma_parts(*ports: PortCounters, present: bool = True) -> dict[str, object]:
    return {
        "inventory": inventory(),
        "rdma_port_counters": RdmaPortCounterReading(present, list(ports)),
    }


def test_an_active_rail_with_clean_counters_is_ok() -> None:
    [result] = results(check_rdma_ports, rdma_parts(counters()))
    assert (result.status, result.subject) == (Status.OK, "rdma mlx5_0/1")
    assert result.summary == "ACTIVE at 400 Gb/s (compute, InfiniBand)"
    assert result.details["counters"] == dict.fromkeys(PORT_ERROR_COUNTERS, 0)


def test_rising_counters_across_two_readings_warn() -> None:
    history = PortCounterHistory()
    [first] = results(check_rdma_ports, rdma_parts(counters()), port_counter_history=history)
    assert first.status is Status.OK
    later = counters(TAKEN_AT + 60, link_downed=3)
    [second] = results(check_rdma_ports, rdma_parts(later), port_counter_history=history)
    assert second.status is Status.WARN
    assert "errors rising over 60 s: 3 link flaps" in second.summary
    assert second.details["per_minute"] == {
        name: 3.0 if name == "link_downed" else 0.0 for name in PORT_ERROR_COUNTERS
    }


def test_counter_samples_keep_their_order_whatever_the_order_of_the_facts() -> None:
    canonical = results(check_rdma_ports, rdma_parts(counters(symbol_error=7)))
    shuffled = counters(symbol_error=7)
    shuffled = replace(shuffled, values=dict(sorted(shuffled.values.items(), reverse=True)))
    assert results(check_rdma_ports, rdma_parts(shuffled)) == canonical
    names = [s.metric.name for s in canonical[0].samples]
    assert names[-4:] == [
        "nodecheck_rdma_port_link_downed_total",
        "nodecheck_rdma_port_link_error_recovery_total",
        "nodecheck_rdma_port_symbol_errors_total",
        "nodecheck_rdma_port_receive_errors_total",
    ]


def test_a_port_without_a_counter_reading_is_an_error() -> None:
    [result] = results(check_rdma_ports, rdma_parts())
    assert (result.status, result.subject) == (Status.ERROR, "rdma mlx5_0/1")
    assert "the facts hold no reading of them" in result.summary


@pytest.mark.parametrize(("present", "where"), [(True, "is empty"), (False, "is absent")])
def test_no_rdma_device_is_a_skip_saying_whether_the_class_exists(
    present: bool, where: str
) -> None:
    parts = rdma_parts(present=present)
    parts["inventory"] = replace(inventory(nic_rdma=False), nics=[])
    [result] = results(check_rdma_ports, parts)
    assert (result.status, result.summary) == (
        Status.SKIP,
        f"no RDMA device (<sysfs>/class/infiniband {where})",
    )


# --- pcie_link ----------------------------------------------------------------------------


def test_a_gpu_trained_narrow_fails_from_the_inventory() -> None:
    narrow = pci_device(
        (ROOT_PORT, UPSTREAM_PORT, GPU_PORT, GPU),
        VENDOR_NVIDIA,
        0x2330,
        CLASS_DISPLAY_3D,
        link=PcieLink(32.0, 8, 32.0, 16),
        driver="nvidia",
    )
    parts = {"inventory": inventory(gpu=narrow), "gpus": GpuSnapshot()}
    found = by_subject(results(check_pcie_link, parts))
    assert sorted(found) == [f"bridge {UPSTREAM_PORT}", f"gpu {GPU}", "nic mlx5_0"]
    gpu = found[f"gpu {GPU}"]
    assert gpu.status is Status.FAIL
    assert gpu.summary == "PCIe link trained at x8 of x16: x8 32 GT/s (max x16 32 GT/s)"
    assert found["nic mlx5_0"].status is Status.OK
    assert found["nic mlx5_0"].details["role"] == "compute"


# --- what each check reads ------------------------------------------------------------------

LITERAL_PARTS: dict[str, dict[str, object]] = {
    "numa": numa_parts(NumaBalancing(BALANCING, mode=1)),
    "cpu": cpu_parts(CpuGovernors({n: "performance" for n in range(8)})),
    "pcie_acs": acs_parts(switch_ports(GPU_PORT=REDIRECTING)),
    "rdma_ports": rdma_parts(counters()),
    # NVML's view of the GPUs: their utilisation tells a link slowed by an idle GPU from
    # one slow under load.
    "pcie_link": {"inventory": inventory(), "gpus": GpuSnapshot()},
}


def judged(check: str, parts: Mapping[str, object]) -> list[Result]:
    [run] = run_checks([load_checks()[check]], context(parts))
    assert run.completed
    return run.results


@pytest.mark.parametrize("check", sorted(LITERAL_PARTS))
def test_each_check_reads_exactly_the_parts_it_declares(check: str) -> None:
    """With only its `needs`, the check judges; without any one of them, it cannot."""
    needs = load_checks()[check].needs
    parts = LITERAL_PARTS[check]
    assert set(needs) == set(parts)
    assert not any("cannot judge" in r.summary for r in judged(check, parts))
    for name in needs:
        [result] = judged(check, {k: v for k, v in parts.items() if k != name})
        assert result.status is Status.ERROR
        assert (
            result.summary
            == f"check {check} cannot judge: the capture holds no {name} (it was not captured)"
        )


@pytest.mark.parametrize("check", sorted(set(LITERAL_PARTS) - {"pcie_link"}))
def test_a_part_that_could_not_be_read_is_could_not_determine(check: str) -> None:
    name = next(n for n in load_checks()[check].needs if n not in {"inventory", "virtualization"})
    unread = Unread(f"reading {name} did not finish within 20 s", "timeout", ("/sys/x",))
    [result] = judged(check, {**LITERAL_PARTS[check], name: unread})
    assert result.status is Status.ERROR
    assert (
        result.summary == f"check {check} cannot judge: reading {name} did not finish within 20 s"
    )
    assert result.details == {"cause": "timeout", "part": name, "stuck_reading": ["/sys/x"]}
