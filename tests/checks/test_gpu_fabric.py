"""gpu_fabric: the rules on literal readings, Fabric Manager found in a procfs tree, and the
check on the replicas through the real nvidia-ml-py against the fake libnvidia-ml."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from nodecheck.checks.gpu.fabric import (
    MANAGER_SUBJECT,
    RESTART_MANAGER,
    START_MANAGER,
    judge_fabric,
    judge_manager,
)
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.gpu import GpuFabric, GpuHistory, GpuReading, fabric_of
from nodecheck.checks.node.processes import (
    FABRIC_MANAGER_COMMAND,
    DaemonProcesses,
    find_processes_named,
)
from nodecheck.checks.result import Action, FaultClass, Result, Status
from tests.conftest import Node
from tests.fixtures import nodes
from tests.fixtures.nodegen import build_node
from tests.fixtures.nvml_scenarios import (
    DGX_GPUS,
    GB200_CLIQUE_ID,
    GB200_CLUSTER_UUID,
    dgx_fabric_failed,
    dgx_fabric_in_progress,
    dgx_fabric_manager_down,
    dgx_healthy,
    write_scenario,
)

NO_CLUSTER = "00000000-0000-0000-0000-000000000000"
RUNNING = DaemonProcesses(FABRIC_MANAGER_COMMAND, (3117,))
STOPPED = DaemonProcesses(FABRIC_MANAGER_COMMAND, ())


def reading(state: int, status: int = 0, read_at: float = 100.0) -> GpuReading:
    fabric = GpuFabric(state, status, 0, NO_CLUSTER, 0)
    return GpuReading(0, "0000:18:00.0", "NVIDIA H100 80GB HBM3", fabric=fabric, read_at=read_at)


def minute_before(history: GpuHistory) -> None:
    """The history's readings dated a minute earlier: the agent's previous pass."""
    previous = history._previous  # the test stands in for the clock
    for bus_id, gpu in previous.items():
        previous[bus_id] = replace(gpu, read_at=gpu.read_at - 60.0)


def verdict_of(gpu: GpuReading, **options: object) -> Result:
    options = {"nvswitches": 4, "manager": RUNNING, "previous": None, **options}
    previous = options.pop("previous")
    assert previous is None or isinstance(previous, GpuReading)
    return judge_fabric(gpu, previous, **options).result("gpu 0000:18:00.0")  # type: ignore[arg-type]


# -- rules on literal readings -------------------------------------------------------


def test_a_registered_gpu_passes_and_exports_its_state() -> None:
    result = verdict_of(reading(3))
    assert (result.status, result.summary) == (Status.OK, "registered with the NVLink fabric")
    assert {(s.metric.name, s.value) for s in result.samples} == {
        ("nodecheck_gpu_fabric_state", 3),
        ("nodecheck_gpu_fabric_status", 0),
    }


def test_no_fabric_support_is_nothing_to_judge() -> None:
    pcie = GpuReading(0, "0000:18:00.0", "NVIDIA H100 PCIe", unsupported={"fabric"})
    for gpu in (pcie, reading(0)):
        result = verdict_of(gpu)
        assert (result.status, result.summary) == (Status.SKIP, "no NVLink fabric on this GPU")


def test_not_started_with_fabric_manager_stopped_asks_to_start_it() -> None:
    """A service down: the node's configuration, which takes nothing out of service; one
    reading warns (the boot may not have started it yet), two a minute apart fail."""
    once = verdict_of(reading(1, 27), manager=STOPPED)
    assert once.status is Status.WARN and once.action is Action.FIX_NODE_CONFIG
    assert once.fault_class is FaultClass.NODE_CONFIG
    assert once.summary == (
        "not registered with the NVLink fabric (not started); it fails if still so at the "
        "next reading; Fabric Manager (nv-fabricmanager) is not running"
    )
    assert once.remedy == START_MANAGER
    assert [s.metric.name for s in once.samples] == ["nodecheck_gpu_fabric_state"]
    again = verdict_of(
        reading(1, 27, read_at=160.0), manager=STOPPED, previous=reading(1, 27, read_at=100.0)
    )
    assert again.status is Status.FAIL and again.fault_class is FaultClass.NODE_CONFIG
    assert "(not started), and 60 s before: stuck;" in again.summary


def test_not_started_with_fabric_manager_running_asks_to_restart_it() -> None:
    result = verdict_of(reading(1, read_at=160.0), manager=RUNNING, previous=reading(1))
    assert result.status is Status.FAIL and result.action is Action.FIX_NODE_CONFIG
    assert result.remedy == RESTART_MANAGER and result.fault_class is FaultClass.NODE_CONFIG


def test_in_progress_warns_once_and_fails_stuck_a_reading_later() -> None:
    once = verdict_of(reading(2, 27))
    assert once.status is Status.WARN and once.action is None  # the check's: reset-gpu
    assert once.summary == (
        "not registered with the NVLink fabric (in progress); it fails if still so at the "
        "next reading"
    )
    assert "nvidia-smi -r -i 0000:18:00.0" in once.remedy
    # the agent's next reading, a minute later: stuck, the GPU's own state
    again = verdict_of(reading(2, 27, read_at=160.0), previous=reading(2, 27, read_at=100.0))
    assert again.status is Status.FAIL and again.fault_class is None  # gpu-hardware
    assert (
        again.summary
        == "not registered with the NVLink fabric (in progress), and 60 s before: stuck"
    )
    # a run seconds after the previous one (an XID's) is no evidence of being stuck
    soon = verdict_of(reading(2, 27, read_at=105.0), previous=reading(2, 27, read_at=100.0))
    assert soon.status is Status.WARN


def test_a_failed_registration_names_its_status() -> None:
    result = verdict_of(reading(3, 999))
    assert result.status is Status.FAIL and result.action is None
    assert result.summary == "NVLink fabric registration failed: NVML_ERROR_UNKNOWN"
    assert verdict_of(reading(3, 42)).summary.endswith("failed: nvmlReturn_t 42")


def test_without_nvswitches_the_domain_is_named_not_fabric_manager() -> None:
    """A GB200 tray: its Fabric Manager runs in the rack's switch trays."""
    result = verdict_of(reading(1, read_at=160.0), nvswitches=0, manager=None, previous=reading(1))
    assert result.status is Status.FAIL and result.action is Action.INVESTIGATE
    assert result.fault_class is FaultClass.NODE_CONFIG  # the rack's, not this node's
    assert "NVLink switch trays" in result.remedy and "systemctl" not in result.remedy


def test_fabric_manager_on_its_own() -> None:
    ok = judge_manager(RUNNING, 4, 0)
    assert (ok.status, ok.summary) == (Status.OK, "Fabric Manager runs (pid 3117) for 4 NVSwitches")
    assert [(s.metric.name, s.value) for s in ok.samples] == [
        ("nodecheck_fabric_manager_processes", 1)
    ]
    holding = judge_manager(STOPPED, 4, 0)
    assert holding.status is Status.WARN and holding.action is Action.FIX_NODE_CONFIG
    down = judge_manager(STOPPED, 4, 8)
    assert down.status is Status.FAIL and "8 GPU(s) off the NVLink fabric" in down.summary
    hidden = judge_manager(DaemonProcesses(FABRIC_MANAGER_COMMAND, None, "hidden"), 4, 8)
    assert (hidden.status, hidden.samples) == (Status.SKIP, ())


def test_fabric_of_pynvml_structs_keeps_the_state_byte() -> None:
    """pynvml reads nvml.h's unsigned char state as a c_uint: padding above it is not state."""
    info = pynvml.c_nvmlGpuFabricInfo_t()
    info.state = 0xABCD03
    info.status = 0
    info.cliqueId = 4026
    info.clusterUuid[:] = list(bytes.fromhex(GB200_CLUSTER_UUID.replace("-", "")))
    assert fabric_of(info, None) == GpuFabric(3, 0, 4026, GB200_CLUSTER_UUID, None)


def test_implausible_fabric_values_are_refused() -> None:
    assert GpuFabric(3, 0, 0, NO_CLUSTER).implausible() is None
    assert GpuFabric(256, 0, 0, NO_CLUSTER).implausible() is not None
    assert GpuFabric(3, -1, 0, NO_CLUSTER).implausible() is not None
    assert GpuFabric(3, 0, 0, "not a uuid").implausible() is not None


# -- Fabric Manager in procfs ---------------------------------------------------------


def procfs(root: Path, processes: dict[int, str], own_status: str = "NSpid:\t4242\n") -> NodeFS:
    for pid, comm in processes.items():
        (root / "proc" / str(pid)).mkdir(parents=True)
        (root / "proc" / str(pid) / "comm").write_text(comm + "\n")
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "status").write_text(own_status)
    return NodeFS(sysfs=root / "sys", procfs=root / "proc", rootfs=root)


def test_fabric_manager_is_found_by_its_cut_command_name(tmp_path: Path) -> None:
    fs = procfs(tmp_path, {1: "systemd", 3117: "nv-fabricmanage", 3200: "nv-fabricmanager2"})
    assert find_processes_named(fs, FABRIC_MANAGER_COMMAND).pids == (3117,)


def test_no_fabric_manager_is_an_empty_list(tmp_path: Path) -> None:
    fs = procfs(tmp_path, {1: "systemd", 2222: "nvidia-persiste"})
    assert find_processes_named(fs, FABRIC_MANAGER_COMMAND) == STOPPED


def test_hidden_processes_are_not_taken_for_none(tmp_path: Path) -> None:
    in_container = procfs(tmp_path / "a", {1: "sleep"}, own_status="NSpid:\t4242\t7\n")
    found = find_processes_named(in_container, FABRIC_MANAGER_COMMAND)
    assert found.pids is None and "PID namespace" in found.problem
    hidepid = procfs(tmp_path / "b", {4242: "nodecheck"})
    found = find_processes_named(hidepid, FABRIC_MANAGER_COMMAND)
    assert found.pids is None and "hidepid" in found.problem


# -- the check on the replicas --------------------------------------------------------


def per_gpu(results: list[Result]) -> dict[str, Result]:
    return {r.subject: r for r in results if r.subject.startswith("gpu ")}


def manager_result(results: list[Result]) -> Result:
    [found] = [r for r in results if r.subject == MANAGER_SUBJECT]
    return found


@pytest.fixture(scope="module")
def dgx_without_manager(scratch_dir: Path, fake_nvml_library: Path) -> Callable[..., Node]:
    """The DGX replica with its Fabric Manager daemon not running, with a scenario."""
    root = build_node(nodes.dgx_h100(fabric_manager=False), scratch_dir / "dgx-no-fm")

    def make(scenario: dict[str, object], name: str) -> Node:
        return Node(root, fake_nvml_library, write_scenario(scenario, root / name))

    return make


def test_healthy_dgx_every_gpu_registered_and_fabric_manager_running(dgx: Node) -> None:
    results = dgx.results("gpu_fabric")
    gpus = per_gpu(results)
    assert set(gpus) == {f"gpu {bus}" for bus in DGX_GPUS}
    assert {(r.status, r.summary) for r in gpus.values()} == {
        (Status.OK, "registered with the NVLink fabric")
    }
    manager = manager_result(results)
    assert (manager.status, manager.summary) == (
        Status.OK,
        "Fabric Manager runs (pid 3117) for 4 NVSwitches",
    )


def test_fabric_manager_down_fails_every_gpu_with_the_start_remedy(
    dgx_without_manager: Callable[..., Node],
) -> None:
    node = dgx_without_manager(dgx_fabric_manager_down(), "fm-down.json")
    history = GpuHistory()
    node.results("gpu_fabric", gpu_history=history)  # the agent's previous pass...
    minute_before(history)  # ... a minute before this one
    results = node.results("gpu_fabric", gpu_history=history)
    gpus = per_gpu(results)
    assert len(gpus) == 8
    for result in gpus.values():
        assert result.status is Status.FAIL and result.action is Action.FIX_NODE_CONFIG
        assert result.fault_class is FaultClass.NODE_CONFIG
        assert result.remedy == START_MANAGER
        assert "Fabric Manager (nv-fabricmanager) is not running" in result.summary
    manager = manager_result(results)
    assert manager.status is Status.FAIL and manager.action is Action.FIX_NODE_CONFIG
    assert manager.summary.endswith("4 NVSwitches, 8 GPU(s) off the NVLink fabric")


def test_fabric_manager_stopped_after_registration_warns(
    dgx_without_manager: Callable[..., Node],
) -> None:
    results = dgx_without_manager(dgx_healthy(), "fm-stopped.json").results("gpu_fabric")
    assert {r.status for r in per_gpu(results).values()} == {Status.OK}
    assert manager_result(results).status is Status.WARN


def test_not_started_while_fabric_manager_runs_asks_to_restart_it(
    dgx: Node, tmp_path: Path
) -> None:
    node = dgx.with_scenario(dgx_fabric_manager_down(), tmp_path / "not-started.json")
    results = node.results("gpu_fabric")
    assert {r.remedy for r in per_gpu(results).values()} == {RESTART_MANAGER}
    assert manager_result(results).status is Status.OK


def test_one_gpu_in_progress_is_the_only_failure(dgx: Node, tmp_path: Path) -> None:
    node = dgx.with_scenario(dgx_fabric_in_progress(), tmp_path / "in-progress.json")
    history = GpuHistory()
    first = per_gpu(node.results("gpu_fabric", gpu_history=history))  # the agent's previous pass
    assert {s for s, r in first.items() if r.status is not Status.OK} == {f"gpu {DGX_GPUS[2]}"}
    assert first[f"gpu {DGX_GPUS[2]}"].status is Status.WARN
    minute_before(history)
    gpus = per_gpu(node.results("gpu_fabric", gpu_history=history))
    failing = {s: r for s, r in gpus.items() if r.status is not Status.OK}
    assert list(failing) == [f"gpu {DGX_GPUS[2]}"]
    [stuck] = failing.values()
    assert stuck.status is Status.FAIL and stuck.action is Action.RESET_GPU
    assert stuck.summary.startswith("not registered with the NVLink fabric (in progress), and ")
    assert stuck.summary.endswith(" s before: stuck")
    assert f"nvidia-smi -r -i {DGX_GPUS[2]}" in stuck.remedy


def test_one_gpu_failed_registration(dgx: Node, tmp_path: Path) -> None:
    node = dgx.with_scenario(dgx_fabric_failed(), tmp_path / "failed.json")
    gpus = per_gpu(node.results("gpu_fabric"))
    failing = {s: r for s, r in gpus.items() if r.status is not Status.OK}
    assert list(failing) == [f"gpu {DGX_GPUS[5]}"]
    [failed] = failing.values()
    assert failed.summary == "NVLink fabric registration failed: NVML_ERROR_UNKNOWN"
    assert failed.action is Action.RESET_GPU and failed.details["state"] == "completed"


def test_gb200_tray_gpus_registered_with_their_domain_and_no_fabric_manager(
    build: Callable[..., Node],
) -> None:
    results = build("gb200-tray").results("gpu_fabric")
    expected = (
        f"registered with the NVLink fabric (cluster {GB200_CLUSTER_UUID}, "
        f"clique {GB200_CLIQUE_ID})"
    )
    assert {(r.status, r.summary) for r in per_gpu(results).values()} == {(Status.OK, expected)}
    assert len(per_gpu(results)) == 4
    assert [r for r in results if r.subject == MANAGER_SUBJECT] == []


def test_workstation_has_no_fabric(workstation: Node) -> None:
    results = workstation.results("gpu_fabric")
    assert [(r.status, r.summary) for r in results] == [
        (Status.SKIP, "no NVLink fabric on this GPU")
    ]


def test_xe9680_with_its_switchtec_nvswitches(build: Callable[..., Node]) -> None:
    results = build("xe9680").results("gpu_fabric")
    assert {r.status for r in per_gpu(results).values()} == {Status.OK}
    assert manager_result(results).status is Status.OK
