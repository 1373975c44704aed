"""The NVML checks, run through the real nvidia-ml-py against the fake libnvidia-ml.

The faulty DGX scenario puts one fault on each GPU (tests/fixtures/nvml_scenarios.py),
so every test here also asserts that nothing is found on the wrong GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nodecheck.checks.config import CheckConfig
from nodecheck.checks.node.gpu import GpuHistory
from nodecheck.checks.node.kernel_log import parse_boot_time
from nodecheck.checks.node.xid import XidListener, XidLog
from nodecheck.checks.registry import checks_in
from nodecheck.checks.result import Result, Status
from tests.conftest import Node, by_status
from tests.fixtures.nvml_scenarios import DGX_GPUS, dgx_healthy, modified
from tests.fixtures.nvml_scenarios import dgx_faulty as faulty_scenario

GPU_CHECKS = (
    "gpu_count",
    "gpu_xid",
    "gpu_memory_errors",
    "gpu_throttle",
    "gpu_pcie",
    "gpu_nvlink",
    "gpu_state",
    "gpu_fabric",
)


def test_every_gpu_check_is_tested_here() -> None:
    assert set(checks_in("nodecheck.checks.gpu")) == set(GPU_CHECKS)


def subject(bus_id: str) -> str:
    return f"gpu {bus_id}"


def statuses(results: list[Result]) -> dict[str, Status]:
    return {result.subject: result.status for result in results}


def one(results: list[Result], bus_id: str) -> Result:
    [found] = [result for result in results if result.subject == subject(bus_id)]
    return found


def two_passes(node: Node, *names: str, pause_s: float = 0.25) -> list[Result]:
    """Run the checks twice with one history, as the agent does, so rates can be judged."""
    history = GpuHistory()
    node.results(*names, gpu_history=history)
    time.sleep(pause_s)
    return node.results(*names, gpu_history=history)


# -- healthy: no false alarm --------------------------------------------------------


@pytest.mark.parametrize("passes", [1, 2])
def test_healthy_dgx_has_no_finding(dgx: Node, passes: int) -> None:
    results = node_results(dgx, passes)
    assert by_status(results, Status.WARN, Status.FAIL, Status.ERROR) == []
    per_gpu = {r.subject for r in results if r.subject.startswith("gpu ")}
    assert per_gpu == {subject(bus) for bus in DGX_GPUS}
    # Every per-GPU check judged every GPU.
    for name in GPU_CHECKS[1:]:
        judged = {r.subject for r in dgx.results(name)}
        assert {subject(bus) for bus in DGX_GPUS} <= judged, name


def node_results(node: Node, passes: int) -> list[Result]:
    if passes == 1:
        return node.results(*GPU_CHECKS)
    return two_passes(node, *GPU_CHECKS)


def test_healthy_samples_carry_gpu_labels(dgx: Node) -> None:
    results = dgx.results("gpu_state")
    gpu0 = one(results, "0000:18:00.0")
    temperature = [s for s in gpu0.samples if s.metric.name == "nodecheck_gpu_temperature_celsius"]
    assert [dict(s.labels) for s in temperature] == [
        {"gpu": "0", "bus_id": "0000:18:00.0", "model": "NVIDIA H100 80GB HBM3"}
    ]
    assert temperature[0].value == 34
    # The SM clock, current and maximum, in hertz (the fake's defaults: 1980 MHz each).
    clocks = {s.metric.name: s.value for s in gpu0.samples if "sm_clock" in s.metric.name}
    assert clocks == {
        "nodecheck_gpu_sm_clock_hertz": 1980e6,
        "nodecheck_gpu_max_sm_clock_hertz": 1980e6,
    }
    assert gpu0.details["processes"] == [
        {"pid": 5151, "name": "python3", "used_memory_bytes": 70 << 30}
    ]
    assert "in use by python3 (5151)" in gpu0.summary


def test_sw_power_cap_under_load_is_normal(dgx: Node) -> None:
    """The healthy scenario power-caps 20 % of the time: judged ok, exported (DCGM #285)."""
    results = two_passes(dgx, "gpu_throttle")
    gpu0 = one(results, "0000:18:00.0")
    assert gpu0.status is Status.OK
    share = gpu0.details["shares"]["sw_power_cap"]  # type: ignore[index]
    assert 0.1 < share < 0.3


# -- faulty: every fault on its GPU --------------------------------------------------


def test_memory_errors(dgx_faulty: Node) -> None:
    results = dgx_faulty.results("gpu_memory_errors")
    found = statuses(results)
    assert found.pop(subject("0000:18:00.0")) is Status.WARN
    assert found.pop(subject("0000:1a:00.0")) is Status.FAIL
    assert found.pop(subject("0000:ba:00.0")) is Status.FAIL
    assert set(found.values()) == {Status.OK}
    pending = one(results, "0000:18:00.0")
    assert "row remapping is pending" in pending.summary
    assert "reset the GPU when it is idle (nvidia-smi -r -i 0000:18:00.0)" in pending.remedy
    ecc = one(results, "0000:1a:00.0")
    assert "2 uncorrectable ECC error(s)" in ecc.summary and "recovery action 1" in ecc.summary
    assert "drain" in ecc.remedy
    failed = one(results, "0000:ba:00.0")
    assert "row remapping failed" in failed.summary and "RMA" in failed.remedy


def test_uncorrectable_ecc_without_a_recovery_action_warns(dgx: Node, tmp_path: Path) -> None:
    """The volatile count stays above 0 until a reset; with the driver asking for nothing,
    running work may go on: a warning to reset when idle, not a drain (NVIDIA's memory
    error docs): NodecheckGpuResetNeeded at warning."""
    scenario = modified(
        dgx_healthy(),
        gpu=1,
        ecc={"volatile_uncorrected": 3, "aggregate_uncorrected": 3},
        recovery_action=0,
    )
    node = dgx.with_scenario(scenario, tmp_path / "ue.json")
    results = node.results("gpu_memory_errors")
    ecc = one(results, "0000:1a:00.0")
    assert ecc.status is Status.WARN, ecc.summary
    assert "3 uncorrectable ECC error(s)" in ecc.summary and "no recovery action" in ecc.summary
    assert ecc.remedy.startswith("reset the GPU when it is idle (nvidia-smi -r -i 0000:1a:00.0)")


def test_throttle_judged_by_time_share(dgx_faulty: Node) -> None:
    """One sample can only warn; two readings measure the share and fail it."""
    single = dgx_faulty.results("gpu_throttle")
    assert one(single, "0000:3a:00.0").status is Status.WARN
    assert (
        "hardware slowdown active now: hw_slowdown, hw_thermal"
        in one(single, "0000:3a:00.0").summary
    )

    results = two_passes(dgx_faulty, "gpu_throttle")
    hot = one(results, "0000:3a:00.0")
    assert hot.status is Status.FAIL
    share = hot.details["shares"]["hw_thermal"]  # type: ignore[index]
    assert 0.3 < share < 0.7  # 50 % in the scenario, over a short real interval
    assert "cooling" in hot.remedy
    others = [r for r in results if r.subject != subject("0000:3a:00.0")]
    assert {r.status for r in others} == {Status.OK}


def test_pcie_replay_rate_and_one_judge_of_the_link(dgx_faulty: Node) -> None:
    """gpu_pcie judges replays; the link trained at x8 is judged once, by pcie_link
    (sysfs), and NVML's reading of it is evidence in gpu_pcie's details."""
    single = dgx_faulty.results("gpu_pcie")
    narrow = one(single, "0000:9c:00.0")
    assert narrow.status is Status.OK  # a rate needs two readings; the width is not its
    assert "NVML link Gen5 x8 (max Gen5 x16)" in narrow.summary
    assert narrow.details["link"]["width"] == 8  # type: ignore[index]
    [link] = [r for r in dgx_faulty.results("pcie_link") if r.subject == narrow.subject]
    assert link.status is Status.FAIL and "x8 of x16" in link.summary
    assert "reseat" in link.remedy

    results = two_passes(dgx_faulty, "gpu_pcie")
    assert "PCIe replays per minute" in one(results, "0000:9c:00.0").summary
    assert [r.subject for r in by_status(results, Status.WARN, Status.FAIL)] == [
        subject("0000:9c:00.0")
    ]


def test_nvlink_down_and_errors(dgx_faulty: Node) -> None:
    results = two_passes(dgx_faulty, "gpu_nvlink")
    down = one(results, "0000:9a:00.0")
    assert down.status is Status.FAIL
    assert "16 of 18 NVLinks active (link 3, 7 inactive)" in down.summary
    assert "new NVLink recovery error(s)" in down.summary
    assert [r.subject for r in by_status(results, Status.WARN, Status.FAIL)] == [down.subject]
    links = [s for s in down.samples if s.metric.name == "nodecheck_gpu_nvlink_link_active"]
    assert {s.labels["nvlink"] for s in links if s.value == 0} == {"3", "7"}


def test_state(dgx_faulty: Node) -> None:
    results = dgx_faulty.results("gpu_state")
    capped = one(results, "0000:ba:00.0")
    assert capped.status is Status.WARN
    assert "power limit lowered to 500 W from the default 700 W" in capped.summary
    assert capped.remedy == "restore it: nvidia-smi -i 6 -pl 700"
    hot = one(results, "0000:3a:00.0")
    assert hot.status is Status.WARN and "86 °C, within 5 °C of slowdown" in hot.summary
    reset = one(results, "0000:1a:00.0")
    assert reset.status is Status.FAIL and "the driver asks for a GPU reset" in reset.summary
    flagged = {r.subject for r in by_status(results, Status.WARN, Status.FAIL, Status.ERROR)}
    assert flagged == {capped.subject, hot.subject, reset.subject}
    job = one(results, "0000:3c:00.0")
    assert job.details["processes"] == [
        {"pid": 4242, "name": "python3", "used_memory_bytes": 12 << 30}
    ]


def test_count_names_the_gpu_that_fell_off(dgx_faulty: Node) -> None:
    results = dgx_faulty.results("gpu_count")
    missing = one(results, "0000:bc:00.0")
    assert missing.status is Status.FAIL
    assert "not enumerated by NVML" in missing.summary and "XID 79" in missing.remedy
    [node] = [r for r in results if r.subject == "node"]
    assert node.status is Status.FAIL
    assert (
        node.summary
        == "1 GPU(s) on the bus are not usable: 7 GPU(s) answering NVML, 8 on the PCI bus "
        "for this host"
    )
    answering = {
        s.labels["bus_id"]: s.value
        for s in node.samples
        if s.metric.name == "nodecheck_gpu_nvml_answering"
    }
    assert answering == {bus: 0 if bus == "0000:bc:00.0" else 1 for bus in DGX_GPUS}


def test_expected_count(dgx: Node) -> None:
    results = dgx.results("gpu_count", config=CheckConfig(expected_gpus=8))
    [node] = [r for r in results if r.subject == "node"]
    assert node.status is Status.OK and "8 expected" in node.summary
    results = dgx.results("gpu_count", config=CheckConfig(expected_gpus=16))
    [node] = [r for r in results if r.subject == "node"]
    assert node.status is Status.FAIL and node.summary.startswith("8 GPU(s) missing")


def test_xid_from_the_kernel_log(dgx_faulty: Node) -> None:
    results = dgx_faulty.results("gpu_xid")
    dbe = one(results, "0000:1a:00.0")
    assert dbe.status is Status.FAIL
    # Logged 30 min before the replica was built, which was at most minutes ago.
    assert re.search(r"XID 48 GPU_ECC_DBE x1, last 3\d min ago", dbe.summary), dbe.summary
    assert dbe.remedy == "drain the node and reset the GPU"
    off_the_bus = one(results, "0000:bc:00.0")
    assert off_the_bus.status is Status.FAIL
    assert off_the_bus.remedy == "drain the node and reboot it"
    app = one(results, "0000:18:00.0")
    assert (
        app.status is Status.OK and "XID 13" in app.summary and "application error" in app.summary
    )
    assert {r.subject for r in by_status(results, Status.FAIL, Status.WARN)} == {
        dbe.subject,
        off_the_bus.subject,
    }
    counts = {
        (s.labels["bus_id"], s.labels["xid"]): s.value
        for r in results
        for s in r.samples
        if s.metric.name == "nodecheck_gpu_xid_events"
    }
    assert counts == {
        ("0000:18:00.0", "13"): 1,
        ("0000:1a:00.0", "48"): 1,
        ("0000:bc:00.0", "79"): 1,
    }


def test_xid_clears_once_the_gpu_recovered(
    dgx: Node, copy_node: Callable[[Node], Node], tmp_path: Path
) -> None:
    """XID 79 ten minutes ago on a GPU that now answers, with no recovery action: cleared."""
    node = copy_node(dgx)
    kmsg = node.root / "dev" / "kmsg"
    # The replica's own boot time, written when the session built it.
    boot = parse_boot_time((node.root / "proc" / "stat").read_text())
    assert boot is not None
    since_boot_us = int((time.time() - 600 - boot) * 1e6)
    kmsg.write_text(
        kmsg.read_text()
        + f"4,2000,{since_boot_us},-;NVRM: Xid (PCI:0000:9a:00): 79, GPU has fallen off the bus.\n"
    )
    cleared = one(node.results("gpu_xid"), "0000:9a:00.0")
    assert cleared.status is Status.OK and "the GPU answers again" in cleared.summary
    pending = dgx_healthy()
    pending["gpus"][4]["recovery_action"] = 2
    node = node.with_scenario(pending, tmp_path / "reboot.json")
    still = one(node.results("gpu_xid"), "0000:9a:00.0")
    assert still.status is Status.FAIL and still.remedy == "drain the node and reboot it"


def test_xid_listener_delivers_events(dgx: Node, tmp_path: Path) -> None:
    """GPU 3 falls off the bus 0.3 s after init with XID 79: the listener records it at
    once, gpu_xid fails that GPU, and the listener stops cleanly."""
    scenario = modified(dgx_healthy(), gpu=3, xids=[{"xid": 79, "after_s": 0.3}], lost_after_s=0.3)
    node = dgx.with_scenario(scenario, tmp_path / "xid79.json")
    xid_log = XidLog()
    session = node.nvml()
    listener = XidListener(session, xid_log, poll_s=0.1)
    listener.start(ready_timeout_s=5)
    try:
        deadline = time.monotonic() + 30
        while not xid_log.events() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert xid_log.listening and xid_log.source_error is None
        results = node.results("gpu_xid", xid_log=xid_log, nvml=session)
    finally:
        assert listener.stop()
    assert not listener.running
    assert not xid_log.listening and xid_log.source_error == "the NVML event listener stopped"
    [event] = xid_log.events()
    assert (event.bus_id, event.xid, event.source) == ("0000:3c:00.0", 79, "nvml event")
    fallen = one(results, "0000:3c:00.0")
    assert fallen.status is Status.FAIL and fallen.remedy == "drain the node and reboot it"
    assert "or NVML events" in one(results, "0000:3a:00.0").summary
    # Stopped, it is no source any more: the results say so, and keep what it recorded.
    after = node.results("gpu_xid", xid_log=xid_log, nvml=session)
    assert one(after, "0000:3c:00.0").status is Status.FAIL
    assert "NVML XID events are not listened to: the NVML event listener stopped" in (
        one(after, "0000:3a:00.0").summary
    )


def test_kernel_log_unreadable_is_undetermined(dgx: Node, tmp_path: Path) -> None:
    [result] = dgx.results("gpu_xid", kernel_log=tmp_path / "missing")
    assert result.status is Status.ERROR
    assert result.summary.startswith("cannot read the kernel log for XIDs: ")
    assert result.summary.endswith("missing: missing")
    assert result.remedy.startswith("no kernel log at that path")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    [result] = dgx.results("gpu_xid", kernel_log=fifo)
    assert result.status is Status.ERROR and "not a log file or /dev/kmsg" in result.summary


def test_driver_version_mismatch(dgx: Node, copy_node: Callable[[Node], Node]) -> None:
    node = copy_node(dgx)
    version = node.root / "proc" / "driver" / "nvidia" / "version"
    version.write_text(version.read_text().replace("570.124.06", "570.86.15"))
    [result] = [r for r in node.results("gpu_state") if r.subject == "node"]
    assert result.status is Status.FAIL
    assert result.summary == "NVML library 570.124.06 but kernel module 570.86.15 loaded"


def test_vbios_mismatch(dgx: Node, tmp_path: Path) -> None:
    scenario = modified(dgx_healthy(), gpu=2, vbios_version="96.00.74.00.1C")
    node = dgx.with_scenario(scenario, tmp_path / "vbios.json")
    [result] = [r for r in node.results("gpu_state") if r.subject == "node"]
    assert result.status is Status.WARN and "96.00.74.00.1C, 96.00.99.00.01" in result.summary


def test_workstation_without_datacenter_features(workstation: Node) -> None:
    """No ECC, no NVLink, an idle Gen1 link: nothing to flag, NVLink not applicable."""
    results = workstation.results(*GPU_CHECKS)
    assert by_status(results, Status.WARN, Status.FAIL, Status.ERROR) == []
    nvlink = workstation.results("gpu_nvlink")
    assert [(r.status, r.summary) for r in nvlink] == [(Status.SKIP, "no NVLink on this GPU")]
    [memory] = workstation.results("gpu_memory_errors")
    assert (memory.status, memory.summary) == (
        Status.SKIP,
        "no ECC or memory error reporting on this GPU",
    )


# -- NVML failing -------------------------------------------------------------------


def test_lost_gpu_mid_run(dgx: Node, tmp_path: Path) -> None:
    scenario = modified(dgx_healthy(), gpu=2, lost_after_s=0.2)
    node = dgx.with_scenario(scenario, tmp_path / "lost.json")
    history = GpuHistory()
    session = node.nvml()
    first = node.results(*GPU_CHECKS, nvml=session, gpu_history=history)
    assert by_status(first, Status.FAIL, Status.ERROR) == []
    time.sleep(0.3)
    second = node.results(*GPU_CHECKS, nvml=session, gpu_history=history)
    lost = [r for r in second if r.subject == subject("0000:3a:00.0")]
    assert lost and all(r.status is Status.FAIL for r in lost if "xid" not in r.summary.lower())
    assert any("GPU is lost" in r.summary for r in lost), [(r.status, r.summary) for r in lost]
    flagged = {r.subject for r in by_status(second, Status.FAIL, Status.ERROR, Status.WARN)}
    assert flagged == {subject("0000:3a:00.0"), "node"}
    [count] = [r for r in second if r.subject == "node" and r.status is Status.FAIL]
    assert count.summary.startswith(
        "1 GPU(s) on the bus are not usable: 7 GPU(s) answering NVML (1 lost)"
    )


def test_hung_call_leaves_the_others_answering(dgx: Node, tmp_path: Path) -> None:
    scenario = modified(dgx_healthy(), gpu=4, hang={"nvmlDeviceGetPowerUsage": 0})
    node = dgx.with_scenario(scenario, tmp_path / "hang.json")
    started = time.monotonic()
    results = node.results(*GPU_CHECKS)
    assert time.monotonic() - started < 10  # the call itself hangs for an hour
    hung = [r for r in results if r.subject == subject("0000:9a:00.0")]
    assert {r.status for r in hung if "XID" not in r.summary} == {Status.ERROR}
    assert all("NVML did not answer in 1 s" in r.summary for r in hung if r.status is Status.ERROR)
    others = [r for r in results if r.subject not in ("node", subject("0000:9a:00.0"))]
    assert {r.status for r in others} <= {Status.OK, Status.SKIP}


def test_hung_init(dgx: Node, tmp_path: Path) -> None:
    node = dgx.with_scenario(modified(dgx_healthy(), init_hang_s=30), tmp_path / "init.json")
    results = node.results(*GPU_CHECKS[2:])
    assert {(r.status, r.subject) for r in results} == {(Status.ERROR, "node")}
    assert all("NVML did not answer in 1 s (nvmlInit)" in r.summary for r in results)


def answering_of(results: list[Result]) -> dict[str, float]:
    """nodecheck_gpu_nvml_answering by bus id, from gpu_count's node result."""
    return {
        sample.labels["bus_id"]: sample.value
        for result in results
        for sample in result.samples
        if sample.metric.name == "nodecheck_gpu_nvml_answering"
    }


@pytest.mark.parametrize(
    ("scenario", "silent"),
    [
        # One GPU's calls hang: that GPU alone is silent.
        (modified(dgx_healthy(), gpu=4, hang={"nvmlDeviceGetPowerUsage": 0}), {"0000:9a:00.0"}),
        # NVML hangs or fails as a whole (a wedged driver): every GPU on the bus is silent.
        (modified(dgx_healthy(), init_hang_s=30), set(DGX_GPUS)),
        (modified(dgx_healthy(), init_error="UNKNOWN"), set(DGX_GPUS)),
        # NVML refuses the agent (no access to /dev/nvidia*): nothing known of the GPUs,
        # so no series at all, never a 1.
        (modified(dgx_healthy(), init_error="NO_PERMISSION"), None),
    ],
    ids=["one-gpu-hangs", "init-hangs", "init-fails", "no-permission"],
)
def test_answering_is_zero_for_each_gpu_nvml_does_not_answer_for(
    dgx: Node, tmp_path: Path, scenario: dict[str, object], silent: set[str] | None
) -> None:
    node = dgx.with_scenario(scenario, tmp_path / "scenario.json")
    answering = answering_of(node.results("gpu_count"))
    if silent is None:
        assert answering == {}
    else:
        assert answering == {bus: 0 if bus in silent else 1 for bus in DGX_GPUS}


@pytest.mark.parametrize(
    ("error", "count_status", "others"),
    [
        ("DRIVER_NOT_LOADED", Status.FAIL, Status.SKIP),
        ("LIB_RM_VERSION_MISMATCH", Status.FAIL, Status.ERROR),
        ("NO_PERMISSION", Status.ERROR, Status.ERROR),
    ],
)
def test_init_failure(
    dgx: Node, tmp_path: Path, error: str, count_status: Status, others: Status
) -> None:
    node = dgx.with_scenario(modified(dgx_healthy(), init_error=error), tmp_path / "init.json")
    [count] = node.results("gpu_count")
    assert count.status is count_status
    assert "8 GPU(s) on the PCI bus" in count.summary
    for name in GPU_CHECKS[2:]:
        assert {r.status for r in node.results(name)} == {others}, name


def test_library_missing(dgx: Node, tmp_path: Path) -> None:
    """--nvml-library naming no file: the GPUs on the bus cannot be judged (error),
    every other GPU check skips with the reason."""
    from nodecheck.checks.node.nvml import NvmlSession

    session = NvmlSession(library_path=str(tmp_path / "libnvidia-ml.so.1"))
    [count] = dgx.results("gpu_count", nvml=session)
    assert count.status is Status.ERROR
    assert "NVML library not found" in count.summary and "install the NVIDIA driver" in count.remedy
    [state] = dgx.results("gpu_state", nvml=session)
    assert state.status is Status.SKIP and "NVML library not found" in state.summary


def test_cpu_only_node_passes(build: Callable[..., Node]) -> None:
    node = build("cpu-only")
    results = node.results(*GPU_CHECKS)
    assert {r.status for r in results} == {Status.SKIP}


def test_faulty_dgx_has_exactly_the_planted_gpu_faults(dgx_faulty: Node) -> None:
    """Two passes (so rates count): each planted fault found once, on its GPU, nothing else."""
    history = GpuHistory()
    session = dgx_faulty.nvml()
    dgx_faulty.run(*GPU_CHECKS, nvml=session, gpu_history=history)
    time.sleep(0.25)
    runs = dgx_faulty.run(*GPU_CHECKS, nvml=session, gpu_history=history)
    found = sorted(
        (run.check.name, result.status.value, result.subject)
        for run in runs
        for result in by_status(run.results, Status.FAIL, Status.WARN, Status.ERROR)
    )
    gpu = {bus[5:7]: subject(bus) for bus in DGX_GPUS}
    assert found == sorted(
        [
            ("gpu_count", "fail", gpu["bc"]),
            ("gpu_count", "fail", "node"),
            ("gpu_memory_errors", "fail", gpu["1a"]),
            ("gpu_memory_errors", "fail", gpu["ba"]),
            ("gpu_memory_errors", "warn", gpu["18"]),
            ("gpu_nvlink", "fail", gpu["9a"]),
            ("gpu_pcie", "warn", gpu["9c"]),
            ("gpu_state", "fail", gpu["1a"]),
            ("gpu_state", "warn", gpu["3a"]),
            ("gpu_state", "warn", gpu["ba"]),
            ("gpu_throttle", "fail", gpu["3a"]),
            ("gpu_xid", "fail", gpu["1a"]),
            ("gpu_xid", "fail", gpu["bc"]),
        ]
    )


def test_cpu_only_node_needs_no_kernel_log(build: Callable[..., Node], tmp_path: Path) -> None:
    """A user who cannot read /dev/kmsg still gets a clean pass on a machine with no GPU."""
    node = build("cpu-only")
    [result] = node.results("gpu_xid", kernel_log=tmp_path / "unreadable")
    assert result.status is Status.SKIP


def test_a_failed_read_is_never_a_pass(dgx: Node, tmp_path: Path) -> None:
    """A read that fails for a reason other than "not supported" is an error, on that GPU."""
    scenario = modified(
        dgx_healthy(),
        gpu=1,
        errors={
            "nvmlDeviceGetTotalEccErrors": "UNKNOWN",
            "nvmlDeviceGetPowerUsage": "NO_PERMISSION",
        },
    )
    node = dgx.with_scenario(scenario, tmp_path / "errors.json")
    memory = one(node.results("gpu_memory_errors"), "0000:1a:00.0")
    assert memory.status is Status.ERROR and memory.summary.startswith("cannot read ecc: ")
    state = one(node.results("gpu_state"), "0000:1a:00.0")
    assert state.status is Status.ERROR and "cannot read power: " in state.summary
    flagged = by_status(node.results(*GPU_CHECKS), Status.ERROR, Status.WARN, Status.FAIL)
    assert {r.subject for r in flagged} == {subject("0000:1a:00.0")}


def test_field_values_refused(dgx: Node, tmp_path: Path) -> None:
    """nvmlDeviceGetFieldValues failing outright (each field asked alone fails too) is
    reported by every check that needs it, never read as "no throttling"."""
    scenario = modified(dgx_healthy(), gpu=3, errors={"nvmlDeviceGetFieldValues": "UNKNOWN"})
    node = dgx.with_scenario(scenario, tmp_path / "fields.json")
    for name in ("gpu_throttle", "gpu_pcie", "gpu_nvlink", "gpu_state"):
        result = one(node.results(name), "0000:3c:00.0")
        assert result.status is Status.ERROR, name
        assert "cannot read field_values: Unknown Error" in result.summary, name


def test_lost_before_a_one_shot_run(dgx: Node, tmp_path: Path) -> None:
    """A GPU lost before the run answers GPU_IS_LOST even for its PCI info: NVML is asked
    by bus id, so the GPU is named by its slot, once, and the count says it is lost."""
    node = dgx.with_scenario(modified(dgx_healthy(), gpu=4, lost_after_s=0), tmp_path / "l.json")
    results = node.results(*GPU_CHECKS)
    lost = [r for r in results if r.subject == subject("0000:9a:00.0")]
    assert {r.status for r in lost if "XID" not in r.summary} == {Status.FAIL}
    assert not [r for r in results if "index" in r.subject]
    count = node.results("gpu_count")
    assert [r.summary for r in count if r.subject == subject("0000:9a:00.0")] == [
        "NVML: GPU is lost"
    ]
    [total] = [r for r in count if r.subject == "node"]
    assert total.status is Status.FAIL and "7 GPU(s) answering NVML (1 lost)" in total.summary


def test_gpus_not_meant_for_this_host(
    dgx: Node, copy_node: Callable[[Node], Node], tmp_path: Path
) -> None:
    """In a container given one GPU, sysfs still shows all eight; a GPU bound to vfio-pci
    belongs to a VM; neither is "fallen off the bus". A GPU with no driver at all is."""
    node = copy_node(dgx)
    gpus_dir = node.root / "proc" / "driver" / "nvidia" / "gpus"
    for bus in DGX_GPUS[1:]:
        shutil.rmtree(gpus_dir / bus)
    scenario = dgx_healthy()
    scenario["gpus"] = scenario["gpus"][:1]
    node = node.with_scenario(scenario, tmp_path / "container.json")
    results = node.results("gpu_count")
    assert {r.subject for r in by_status(results, Status.SKIP)} == {
        subject(bus) for bus in DGX_GPUS[1:]
    }
    assert "not assigned to this container" in one(results, DGX_GPUS[1]).summary
    [total] = [r for r in results if r.subject == "node"]
    assert (total.status, total.summary) == (
        Status.OK,
        "1 GPU(s) answering NVML, 1 on the PCI bus for this host",
    )

    bare = copy_node(dgx)
    devices = bare.root / "sys" / "bus" / "pci" / "devices"
    (bare.root / "sys" / "bus" / "pci" / "drivers" / "vfio-pci").mkdir()
    vfio = devices / DGX_GPUS[6] / "driver"
    vfio.unlink()
    vfio.symlink_to(os.readlink(devices / DGX_GPUS[0] / "driver").replace("nvidia", "vfio-pci"))
    (devices / DGX_GPUS[5] / "driver").unlink()
    scenario = dgx_healthy()
    del scenario["gpus"][5:7]
    results = bare.with_scenario(scenario, tmp_path / "bare.json").results("gpu_count")
    passed_through = one(results, DGX_GPUS[6])
    assert passed_through.status is Status.SKIP and "bound to vfio-pci" in passed_through.summary
    unbound = one(results, DGX_GPUS[5])
    assert (
        unbound.status is Status.FAIL and unbound.summary == "on the PCI bus with no driver bound"
    )
    assert "RmInitAdapter" in unbound.remedy


def test_enumeration_errors(dgx: Node, tmp_path: Path) -> None:
    """No permission to open one GPU is `error` for that GPU, not "lost"; NVML failing to
    count the GPUs is `error` for every GPU check, never a crash."""
    scenario = modified(
        dgx_healthy(), gpu=2, errors={"nvmlDeviceGetHandleByIndex_v2": "NO_PERMISSION"}
    )
    node = dgx.with_scenario(scenario, tmp_path / "perm.json")
    for name in GPU_CHECKS[2:]:
        [result] = [r for r in node.results(name) if r.subject == "gpu index 2"]
        assert result.status is Status.ERROR, name
        assert result.summary == "NVML cannot open it: Insufficient Permissions"
    broken = modified(dgx_healthy(), errors={"nvmlDeviceGetCount_v2": "UNKNOWN"})
    node = dgx.with_scenario(broken, tmp_path / "count.json")
    runs = node.run(*GPU_CHECKS)
    assert all(run.completed for run in runs)
    for run in runs[2:]:
        assert [(r.status, r.summary) for r in run.results] == [
            (Status.ERROR, "NVML could not list the GPUs: Unknown Error")
        ]


def test_per_field_errors_are_reported(dgx: Node, tmp_path: Path) -> None:
    scenario = modified(
        dgx_healthy(), gpu=0, field_errors={"230": "NO_PERMISSION", "270": "UNKNOWN"}
    )
    node = dgx.with_scenario(scenario, tmp_path / "fields.json")
    state = one(node.results("gpu_state"), "0000:18:00.0")
    assert state.status is Status.ERROR
    assert "cannot read recovery_action: Insufficient Permissions" in state.summary
    throttle = one(node.results("gpu_throttle"), "0000:18:00.0")
    assert throttle.status is Status.ERROR
    assert "cannot read throttle_time: Unknown Error" in throttle.summary
    assert one(node.results("gpu_pcie"), "0000:18:00.0").status is Status.OK
    # A field id the driver does not know yet is absent, not an error.
    older = modified(dgx_healthy(), gpu=0, field_errors={"270": "INVALID_ARGUMENT"})
    node = dgx.with_scenario(older, tmp_path / "older.json")
    assert one(node.results("gpu_throttle"), "0000:18:00.0").status is Status.OK


def test_old_driver_falls_back_to_deprecated_calls(dgx_faulty: Node, tmp_path: Path) -> None:
    """A driver without nvmlDeviceGetTemperatureV or ...ClocksEventReasons: the older calls
    give the same values, so a hot, throttling GPU is still found."""
    old = "FUNCTION_NOT_FOUND"
    scenario = modified(
        faulty_scenario(),
        gpu=2,
        errors={"nvmlDeviceGetTemperatureV": old, "nvmlDeviceGetCurrentClocksEventReasons": old},
    )
    node = dgx_faulty.with_scenario(scenario, tmp_path / "old.json")
    assert "86 °C" in one(node.results("gpu_state"), "0000:3a:00.0").summary
    throttle = one(node.results("gpu_throttle"), "0000:3a:00.0")
    assert throttle.status is Status.WARN and "hw_thermal" in throttle.summary


def test_the_agents_checks_share_one_nvml_read(dgx: Node) -> None:
    """Contexts sharing reads (the agent's) take one NVML snapshot within the TTL."""
    from nodecheck.checks.context import SharedReads

    shared = SharedReads(ttl_s=0.5)
    session = dgx.nvml()
    first, second = (dgx.context(nvml=session, shared=shared) for _ in range(2))
    view = first.gpus
    assert second.gpus is view and first.pci_gpus is second.pci_gpus
    time.sleep(0.6)
    assert dgx.context(nvml=session, shared=shared).gpus is not view
