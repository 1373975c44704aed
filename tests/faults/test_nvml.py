"""Faults of NVML and of the XID sources: each costs only what it touches, names itself,
and is never read as a pass.

Everything runs through the real nvidia-ml-py against the fake libnvidia-ml.so.1
(tests/fake_nvml) on the 8-GPU replica trees; the faulty scenario has one planted
fault per GPU (tests/fixtures/nvml_scenarios.py), so "the others unaffected" is
checked by those faults still being found.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from nodecheck.checks.bench.gate import check_gate
from nodecheck.checks.config import BenchOptions, CheckConfig
from nodecheck.checks.node.gpu import GpuHistory, read_gpu_activity
from nodecheck.checks.node.nvml import NvmlSession
from nodecheck.checks.node.xid import XidEvent, XidListener, XidLog
from nodecheck.checks.result import Result, Status
from nodecheck.checks.runner import CheckRun
from tests.conftest import Node, by_status
from tests.fixtures.nvml_scenarios import (
    DGX_GPUS,
    Scenario,
    dgx_healthy,
    modified,
    write_scenario,
)
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
PER_GPU_CHECKS = GPU_CHECKS[2:]
HUNG_BUS = DGX_GPUS[2]  # 0000:3a:00.0, GPU 2
LOST_BUS = DGX_GPUS[4]  # 0000:9a:00.0, GPU 4
WAIT_S = 60.0


def subject(bus_id: str) -> str:
    return f"gpu {bus_id}"


def of(results: list[Result], check_subject: str) -> list[Result]:
    return [result for result in results if result.subject == check_subject]


def wait_for(condition: Callable[[], Any], what: str, seconds: float = WAIT_S) -> Any:
    """Poll until `condition()` is true; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")


def by_check(runs: list[CheckRun]) -> dict[tuple[str, str], Result]:
    """(check name, subject) -> result, for checks with one result per subject."""
    return {(run.check.name, r.subject): r for run in runs for r in run.results}


def flat(runs: list[CheckRun]) -> list[Result]:
    return [result for run in runs for result in run.results]


def planted_faults_found(runs: list[CheckRun]) -> None:
    """The faulty scenario's faults on GPUs other than 2, 3 and 4 are still reported."""
    found = by_check(runs)
    memory = {
        bus: found[("gpu_memory_errors", subject(bus))].status
        for bus in (DGX_GPUS[0], DGX_GPUS[1], DGX_GPUS[6])
    }
    assert memory[DGX_GPUS[0]] is Status.WARN, memory  # row remapping pending
    assert memory[DGX_GPUS[1]] is Status.FAIL, memory  # 2 uncorrectable ECC errors
    assert memory[DGX_GPUS[6]] is Status.FAIL, memory  # row remapping failed
    # GPU 5's link at x8 is read through NVML still: evidence in gpu_pcie (pcie_link,
    # from sysfs, is the check that judges it).
    narrow = found[("gpu_pcie", subject(DGX_GPUS[5]))]
    link = narrow.details["link"]
    assert isinstance(link, dict) and (link["width"], link["max_width"]) == (8, 16)
    capped = found[("gpu_state", subject(DGX_GPUS[6]))]
    assert "power limit lowered to 500 W" in capped.summary


# -- 1. one hung GPU blinds only itself ---------------------------------------------


def test_hung_gpu_is_an_error_for_that_gpu_only_and_is_read_again_once_its_call_returns(
    dgx_faulty: Node, tmp_path: Path
) -> None:
    """GPU 2's nvmlDeviceGetFieldValues hangs: every pass, GPU 2 alone is `error` naming it
    ("NVML did not answer in 1 s (GPU 2 at 0000:3a:00.0 ...)"), answered at once while
    its call is stuck (one stuck thread, not one per pass), the other GPUs' planted
    faults are still found, GPU 4 lost meanwhile is reported lost, and once the stuck
    call returns the next pass reads GPU 2 again."""
    hanging = faulty_scenario()
    hanging["gpus"][2]["hang"] = {"nvmlDeviceGetFieldValues": 0}
    hanging["gpus"][4]["lost_after_s"] = 0.5
    node = dgx_faulty.with_scenario(hanging, tmp_path / "hang.json")
    session = node.nvml()
    history = GpuHistory()

    def one_pass() -> list[CheckRun]:
        return node.run(*GPU_CHECKS, nvml=session, gpu_history=history)

    first_runs = one_pass()
    first = flat(first_runs)
    hung = [r for r in of(first, subject(HUNG_BUS)) if "XID" not in r.summary]
    assert len(hung) == len(PER_GPU_CHECKS) + 1  # gpu_count names it too
    assert {r.status for r in hung} == {Status.ERROR}
    assert all("NVML did not answer in 1 s (GPU 2 at 0000:3a:00.0" in r.summary for r in hung), [
        r.summary for r in hung
    ]
    planted_faults_found(first_runs)

    # GPU 4 was lost 0.5 s after init; this pass starts after the first one's 1 s deadline.
    second_runs = one_pass()
    second = flat(second_runs)
    hung = [r for r in of(second, subject(HUNG_BUS)) if "XID" not in r.summary]
    assert {r.status for r in hung} == {Status.ERROR}
    assert any("is still stuck" in r.summary for r in hung), [r.summary for r in hung]
    stuck_threads = [t for t in threading.enumerate() if t.name == "nvml-GPU 2"]
    assert len(stuck_threads) == 1, stuck_threads
    lost = [r for r in of(second, subject(LOST_BUS)) if "XID" not in r.summary]
    assert lost and {r.status for r in lost} == {Status.FAIL}
    assert all("GPU is lost" in r.summary for r in lost), [r.summary for r in lost]
    planted_faults_found(second_runs)
    others = {r.subject for r in by_status(second, Status.ERROR)}
    assert others == {subject(HUNG_BUS)}, others

    # The driver answers again: the scenario without the hang, reloaded by an init,
    # releases the stuck call (tests/fake_nvml/README.md, Hangs).
    released = faulty_scenario()
    released["gpus"][4]["lost_after_s"] = 0
    write_scenario(released, node.scenario or tmp_path / "hang.json")
    import pynvml

    pynvml.nvmlInit()
    try:

        def read_again() -> list[Result] | None:
            results = flat(one_pass())
            mine = of(results, subject(HUNG_BUS))
            return results if mine and all(r.status is not Status.ERROR for r in mine) else None

        after = wait_for(read_again, "GPU 2 to be read again")
    finally:
        pynvml.nvmlShutdown()
    throttle = [r for r in of(after, subject(HUNG_BUS)) if "hw_thermal" in r.summary]
    assert throttle and throttle[0].status in (Status.WARN, Status.FAIL)  # its own fault
    assert not session.stuck_keys()


def test_hung_enumeration_is_node_level_and_answered_at_once_while_stuck(
    dgx: Node, tmp_path: Path
) -> None:
    """nvmlDeviceGetCount hanging: every GPU check is one node-level `error` naming the
    listing; the next pass is answered at once (no second stuck thread), naming how long
    the call has been stuck."""
    scenario = modified(dgx_healthy(), hang={"nvmlDeviceGetCount_v2": 0})
    node = dgx.with_scenario(scenario, tmp_path / "count.json")
    session = node.nvml()
    first = node.run(*PER_GPU_CHECKS, nvml=session)
    for run in first:
        assert [(r.status, r.subject) for r in run.results] == [(Status.ERROR, "node")]
        assert run.results[0].summary == "NVML did not answer in 1 s (listing the GPUs)"
    second = node.run(*PER_GPU_CHECKS, nvml=session)
    for run in second:
        [result] = run.results
        assert result.status is Status.ERROR
        assert result.summary.startswith("NVML did not answer in 1 s (listing the GPUs: its call")
        assert result.summary.endswith("is still stuck)")
    listing = [t for t in threading.enumerate() if t.name == "nvml-listing the GPUs"]
    assert len(listing) == 1, listing


AGENT_CONFIG = """\
[agent]
listen = "127.0.0.1:{port}"
expected_gpus = 8
nvml_timeout = 2

{checks}
"""
HOST_CHECKS = ("pcie_acs", "pcie_link", "numa", "nccl_env", "torch_alloc", "cpu")
AGENT_HANG_S = 30.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _results(port: int) -> dict[tuple[str, str], dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/results", timeout=5) as reply:
            document = json.loads(reply.read())
    except OSError:
        return {}
    return {(r["check"], r["subject"]): r for r in document["results"]}


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text: str = reply.read().decode()
        return text


def test_agent_with_a_hung_gpu_keeps_judging_the_others_and_recovers(
    dgx_faulty: Node, tmp_path: Path
) -> None:
    """A real `nodecheck agent` (its XID listener on the same NVML session, its 10 s shared
    reads) with GPU 2's nvmlDeviceGetFieldValues stuck for 30 s: meanwhile GPU 2 alone is
    `error`, the other GPUs' ECC and row-remap failures stay, their metrics stay, GPU 4
    lost 3 s in is reported lost; after the hang GPU 2 is read and judged again."""
    scenario = faulty_scenario()
    scenario["gpus"][2]["hang"] = {"nvmlDeviceGetFieldValues": {"until_s": AGENT_HANG_S}}
    scenario["gpus"][4]["lost_after_s"] = 3
    node = dgx_faulty.with_scenario(scenario, tmp_path / "hang.json")
    port = _free_port()
    config = tmp_path / "agent.toml"
    checks = "".join(f"\n[checks.{name}]\nenabled = false\n" for name in HOST_CHECKS) + "".join(
        f"\n[checks.{name}]\ninterval = 1\n" for name in (GPU_CHECKS[0], *PER_GPU_CHECKS)
    )
    config.write_text(AGENT_CONFIG.format(port=port, checks=checks))
    process = subprocess.Popen(
        [sys.executable, "-m", "nodecheck.agent", *node.cli_args, "agent", "--config", str(config)],
        env={**os.environ, **node.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    started = time.monotonic()
    try:

        def lost_while_hung() -> dict[tuple[str, str], dict[str, Any]] | None:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            found = _results(port)
            # Each check runs on its own schedule: wait until every one has seen it.
            lost = [found.get((check, subject(LOST_BUS))) for check in PER_GPU_CHECKS]
            return found if all(r and "GPU is lost" in r["summary"] for r in lost) else None

        during = wait_for(lost_while_hung, "GPU 4 reported lost", seconds=AGENT_HANG_S)
        assert time.monotonic() - started < AGENT_HANG_S  # still within GPU 2's hang
        for check in PER_GPU_CHECKS:
            hung = during[(check, subject(HUNG_BUS))]
            assert hung["status"] == "error", (check, hung)
            assert "NVML did not answer in 2 s (GPU 2 at 0000:3a:00.0" in hung["summary"]
            assert during[(check, subject(LOST_BUS))]["status"] == "fail", check
        assert during[("gpu_memory_errors", subject(DGX_GPUS[1]))]["status"] == "fail"
        assert during[("gpu_memory_errors", subject(DGX_GPUS[6]))]["status"] == "fail"
        replays = during[("gpu_pcie", subject(DGX_GPUS[5]))]
        assert replays["status"] == "warn"
        assert "PCIe replays per minute" in replays["summary"]
        assert ("gpu_state", "node") not in during or during[("gpu_state", "node")][
            "status"
        ] != "error"
        temperatures = re.findall(
            r'nodecheck_gpu_temperature_celsius\{[^}]*gpu="(\d)"', _metrics(port)
        )
        assert set(temperatures) == {"0", "1", "3", "5", "6"}  # all but hung, lost, invisible

        def read_again() -> dict[tuple[str, str], dict[str, Any]] | None:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            found = _results(port)
            mine = [found.get((check, subject(HUNG_BUS))) for check in PER_GPU_CHECKS]
            return found if all(r and r["status"] != "error" for r in mine) else None

        after = wait_for(read_again, "GPU 2 read again", seconds=AGENT_HANG_S + 60)
        assert after[("gpu_memory_errors", subject(HUNG_BUS))]["status"] == "ok"
        assert after[("gpu_throttle", subject(HUNG_BUS))]["status"] in ("warn", "fail")
        assert after[("gpu_memory_errors", subject(DGX_GPUS[1]))]["status"] == "fail"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    stderr = process.stderr.read().decode() if process.stderr else ""
    assert "Traceback" not in stderr, stderr


def test_hung_gpu_is_named_by_the_benchmark_gate(dgx: Node, tmp_path: Path) -> None:
    """read_gpu_activity (the benchmarks' gate) with GPU 2's utilization call hung: GPU 2
    alone reports the hang by name, the other seven are read, and the gate refuses by
    naming GPU 2; asked again, GPU 2 is answered at once."""
    scenario = dgx_healthy()
    scenario["gpus"][0].update(processes=[], utilization={"gpu": 0, "memory": 0})
    scenario["gpus"][2]["hang"] = {"nvmlDeviceGetUtilizationRates": 0}
    node = dgx.with_scenario(scenario, tmp_path / "gate.json")
    session = node.nvml()
    activity = read_gpu_activity(session)
    assert [gpu.index for gpu in activity] == list(range(8))
    problems = {gpu.index: gpu.problem for gpu in activity if gpu.problem}
    assert list(problems) == [2], problems
    assert problems[2] == f"NVML did not answer in 1 s (GPU 2 at {HUNG_BUS})"
    assert all(gpu.memory_free for gpu in activity if gpu.index != 2)
    started = time.monotonic()
    refusal = check_gate(node.context(nvml=session), BenchOptions(idle_window_s=0))
    assert time.monotonic() - started < 15
    assert refusal is not None and refusal.reason == "gpu_unhealthy"
    assert refusal.text.startswith(f"GPU 2 ({HUNG_BUS}) cannot be read: NVML did not answer")
    assert "still stuck" in refusal.text


OPENING_CALLS = ("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetPciInfo_v3")


def reload_scenario(scenario: Scenario, path: Path) -> None:
    """Write `scenario` and load it with an init of our own (tests/fake_nvml/README.md,
    Loading and timing): a call stuck in the old scenario's hang returns."""
    import pynvml

    write_scenario(scenario, path)
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()


@pytest.mark.parametrize("call", OPENING_CALLS)
def test_a_gpu_whose_opening_hangs_costs_only_that_gpu(
    dgx_faulty: Node, tmp_path: Path, call: str
) -> None:
    """GPU 2's handle or bus id lookup (the listing) hanging: GPU 2 alone is `error` ("NVML
    did not answer in 1 s (GPU 2, opening it)"), by index since NVML never named it; the
    other GPUs are read and their planted faults found, nothing is a node-level error;
    the next pass answers GPU 2 at once (one stuck thread)."""
    scenario = faulty_scenario()
    scenario["gpus"][2]["hang"] = {call: 0}
    node = dgx_faulty.with_scenario(scenario, tmp_path / "open.json")
    session = node.nvml()
    started = time.monotonic()
    first_runs = node.run(*GPU_CHECKS, nvml=session)
    assert time.monotonic() - started < 30  # one 1 s deadline, not one per check or GPU
    first = flat(first_runs)
    assert [r for r in first if r.subject == "node" and r.status is Status.ERROR] == []
    planted_faults_found(first_runs)
    by_index = of(first, "gpu index 2")
    assert {r.status for r in by_index} == {Status.ERROR}
    assert len(by_index) == len(PER_GPU_CHECKS) + 1  # gpu_count names it too
    assert all(r.summary == "NVML did not answer in 1 s (GPU 2, opening it)" for r in by_index)
    # gpu_count cannot tell which of sysfs's GPUs NVML did not name (0000:3a:00.0, and
    # 0000:bc:00.0 fallen off the bus) is GPU 2: `error` for each, naming GPU 2's hang.
    unnamed = (subject(HUNG_BUS), subject(DGX_GPUS[7]))
    for bus in unnamed:
        unlisted = by_check(first_runs)[("gpu_count", bus)]
        assert unlisted.status is Status.ERROR, unlisted
        assert "GPU 2: NVML did not answer in 1 s (GPU 2, opening it)" in unlisted.summary
    errors = {r.subject for r in by_status(first, Status.ERROR)}
    assert errors == {"gpu index 2", *unnamed}, errors
    second = flat(node.run(*PER_GPU_CHECKS, nvml=session))
    again = of(second, "gpu index 2")
    assert again and all(r.summary.endswith("is still stuck)") for r in again), again
    assert len([t for t in threading.enumerate() if t.name == "nvml-GPU 2"]) == 1


def test_a_gpu_stuck_while_opened_keeps_the_bus_id_it_had(dgx_faulty: Node, tmp_path: Path) -> None:
    """A GPU read once, whose bus id lookup then hangs (the driver wedged mid-run, as in
    the agent): the next pass names it by its bus id, `error` on its own subject, the
    others judged; the pass after answers it at once; released, it is read again."""
    path = tmp_path / "wedge.json"
    node = dgx_faulty.with_scenario(faulty_scenario(), path)
    session = node.nvml()
    history = GpuHistory()
    healthy = node.run(*PER_GPU_CHECKS, nvml=session, gpu_history=history)
    assert all(r.status is not Status.ERROR for r in of(flat(healthy), subject(HUNG_BUS)))
    wedged = faulty_scenario()
    wedged["gpus"][2]["hang"] = {"nvmlDeviceGetPciInfo_v3": 0}
    reload_scenario(wedged, path)
    try:
        runs = node.run(*PER_GPU_CHECKS, nvml=session, gpu_history=history)
        mine = of(flat(runs), subject(HUNG_BUS))
        assert len(mine) == len(PER_GPU_CHECKS) and {r.status for r in mine} == {Status.ERROR}
        assert all("NVML did not answer in 1 s (GPU 2, opening it" in r.summary for r in mine)
        planted_faults_found(runs)
        errors = {r.subject for r in by_status(flat(runs), Status.ERROR)}
        assert errors == {subject(HUNG_BUS)}, errors
        again = of(
            flat(node.run(*PER_GPU_CHECKS, nvml=session, gpu_history=history)), subject(HUNG_BUS)
        )
        assert again and all(r.summary.endswith("is still stuck)") for r in again), again
    finally:
        reload_scenario(faulty_scenario(), path)

    def read_again() -> list[Result] | None:
        results = flat(node.run(*PER_GPU_CHECKS, nvml=session, gpu_history=history))
        mine = of(results, subject(HUNG_BUS))
        return results if mine and all(r.status is not Status.ERROR for r in mine) else None

    wait_for(read_again, "GPU 2 read again")


def test_a_lost_gpu_whose_lookup_by_bus_id_hangs_leaves_the_one_before_it_named(
    dgx: Node, tmp_path: Path
) -> None:
    """GPUs 4 and 5 lost before the run (no bus id from NVML), GPU 5's lookup by bus id
    hanging: GPU 4 is still named by its bus id (`fail` "GPU is lost" on 0000:9a:00.0);
    GPU 5, whose slot cannot be told, stays by index; within one deadline."""
    scenario = modified(dgx_healthy(), gpu=4, lost_after_s=0)
    scenario["gpus"][5].update(lost_after_s=0, hang={"nvmlDeviceGetHandleByPciBusId_v2": 0})
    node = dgx.with_scenario(scenario, tmp_path / "lost.json")
    started = time.monotonic()
    runs = node.run(*PER_GPU_CHECKS, nvml=node.nvml())
    assert time.monotonic() - started < 30
    results = flat(runs)
    named = of(results, subject(LOST_BUS))
    assert len(named) == len(PER_GPU_CHECKS), named
    assert all(r.status is Status.FAIL and "GPU is lost" in r.summary for r in named), named
    by_index = of(results, "gpu index 5")
    assert len(by_index) == len(PER_GPU_CHECKS) and {r.status for r in by_index} == {Status.FAIL}
    assert of(results, "gpu index 4") == []


def test_a_gpu_whose_opening_hangs_is_named_by_the_benchmark_gate(
    dgx: Node, tmp_path: Path
) -> None:
    """read_gpu_activity with GPU 2's bus id lookup hung: GPU 2 alone names the hang, the
    other seven are read."""
    scenario = dgx_healthy()
    scenario["gpus"][2]["hang"] = {"nvmlDeviceGetPciInfo_v3": 0}
    node = dgx.with_scenario(scenario, tmp_path / "gate.json")
    activity = read_gpu_activity(node.nvml())
    assert [gpu.index for gpu in activity] == list(range(8))
    problems = {gpu.index: gpu.problem for gpu in activity if gpu.problem}
    assert problems == {2: "NVML did not answer in 1 s (GPU 2, opening it)"}, problems
    assert all(gpu.memory_free for gpu in activity if gpu.index != 2)


# -- 2. the XID listener retries, and a source that is not listening is never a pass ---


@pytest.mark.parametrize(
    ("absent", "why"),
    [
        ({"init_error": "DRIVER_NOT_LOADED"}, "the NVIDIA kernel driver is not loaded"),
        ({"init_hang_s": 2}, "NVML did not answer in 1 s (nvmlInit"),
    ],
    ids=["init_fails", "init_hangs"],
)
def test_xid_listener_retries_until_nvml_answers(
    dgx: Node, tmp_path: Path, absent: Scenario, why: str
) -> None:
    """NVML failing (or hanging) at start: the listener says why in the XidLog, keeps
    trying with backoff, and listens (and delivers XID 79) once NVML answers."""
    path = tmp_path / "late.json"
    # XID 79 on GPU 3 0.3 s after the scenario is loaded (by the init that succeeds, or
    # the hanging one); NVML delivers it to a set registered later too.
    answering = modified(dgx_healthy(), gpu=3, xids=[{"xid": 79, "after_s": 0.3}])
    node = dgx.with_scenario({**answering, **absent}, path)
    xid_log = XidLog()
    listener = XidListener(node.nvml(), xid_log, poll_s=0.1, retry_initial_s=0.05, retry_max_s=0.2)
    listener.start()
    try:
        wait_for(lambda: (xid_log.source_error or "").startswith(why), f"source_error {why!r}")
        assert not xid_log.listening
        # The driver comes up (or the hanging init returns): the next init that loads
        # the scenario succeeds.
        write_scenario(answering, path)
        wait_for(lambda: xid_log.listening, "the listener to listen")
        assert xid_log.source_error is None
        [event] = wait_for(xid_log.events, "XID 79 from NVML")
        assert (event.bus_id, event.xid) == (DGX_GPUS[3], 79)
        assert listener.attempts >= 2
    finally:
        assert listener.stop()


def test_gpu_xid_with_no_readable_source_is_an_error_naming_both(
    dgx_faulty: Node, tmp_path: Path
) -> None:
    """The kernel log unreadable (missing here; /dev/kmsg behind a unit's DevicePolicy)
    and the listener not listening (no driver): `error` naming both sources and why,
    never `ok` for the GPU that had XID 79 (0000:bc:00.0 in the faulty node's log)."""
    node = dgx_faulty.with_scenario({"init_error": "DRIVER_NOT_LOADED"}, tmp_path / "n.json")
    session = node.nvml()
    xid_log = XidLog()
    listener = XidListener(session, xid_log, retry_initial_s=0.05, retry_max_s=0.2)
    listener.start()
    try:
        wait_for(lambda: listener.attempts >= 1 and xid_log.source_error, "a first attempt")
        results = node.results(
            "gpu_xid", kernel_log=tmp_path / "kmsg", xid_log=xid_log, nvml=session
        )
    finally:
        assert listener.stop()
    assert by_status(results, Status.OK) == []
    [blind] = results
    assert blind.status is Status.ERROR and blind.subject == "node"
    assert f"cannot read the kernel log for XIDs: {tmp_path / 'kmsg'}: missing" in blind.summary
    assert (
        "NVML XID events are not listened to: the NVIDIA kernel driver is not loaded"
        in blind.summary
    )


def test_kernel_log_unreadable_while_the_listener_listens_says_so_on_each_gpu(
    dgx: Node, tmp_path: Path
) -> None:
    """Only NVML events to go on (as under the shipped unit, ProtectKernelLogs=yes): each
    GPU is judged from them and says that XIDs from before the listener started are not
    seen, naming the kernel log and why it is unreadable; never a bare "ok"."""
    session = dgx.nvml()
    xid_log = XidLog()
    listener = XidListener(session, xid_log, poll_s=0.1)
    listener.start()
    try:
        wait_for(lambda: xid_log.listening, "the listener to listen")
        results = dgx.results(
            "gpu_xid", kernel_log=tmp_path / "kmsg", xid_log=xid_log, nvml=session
        )
    finally:
        assert listener.stop()
    assert {r.subject for r in results} == {subject(bus) for bus in DGX_GPUS}
    assert {r.status for r in results} == {Status.OK}
    for result in results:
        assert result.summary.startswith("no XID in NVML events since "), result.summary
        assert (
            f"the kernel log is unreadable ({tmp_path / 'kmsg'}: missing): XIDs from before "
            "then are not seen" in result.summary
        ), result.summary


def test_gpu_xid_names_the_one_source_it_rests_on(dgx: Node) -> None:
    """The kernel log readable but the listener not listening: each result says so."""
    xid_log = XidLog()  # never started
    results = dgx.results("gpu_xid", xid_log=xid_log)
    gpu = next(r for r in results if r.subject == subject(DGX_GPUS[2]))
    assert gpu.summary.startswith("no XID in the kernel log (")
    assert "NVML XID events are not listened to: the NVML event listener has not started" in (
        gpu.summary
    )
    assert "or NVML events" not in gpu.summary


def test_a_gpu_the_listener_could_not_register_has_no_source_without_the_kernel_log(
    dgx: Node, tmp_path: Path
) -> None:
    """nvmlDeviceRegisterEvents failing for GPU 3 while the kernel log is unreadable: GPU 3
    alone is `error` (no XID source for it), the others are judged from NVML events."""
    scenario = modified(dgx_healthy(), gpu=3, errors={"nvmlDeviceRegisterEvents": "UNKNOWN"})
    node = dgx.with_scenario(scenario, tmp_path / "r.json")
    session = node.nvml()
    xid_log = XidLog()
    listener = XidListener(session, xid_log, poll_s=0.1)
    listener.start()
    try:
        wait_for(lambda: xid_log.listening, "the listener to listen")
        assert set(xid_log.unwatched) == {DGX_GPUS[3]}
        results = node.results(
            "gpu_xid", kernel_log=tmp_path / "kmsg", xid_log=xid_log, nvml=session
        )
    finally:
        assert listener.stop()
    blind = next(r for r in results if r.subject == subject(DGX_GPUS[3]))
    assert blind.status is Status.ERROR
    assert "no XID source for this GPU" in blind.summary
    assert "registering failed: Unknown Error" in blind.summary
    others = [r for r in results if r.subject.startswith("gpu ") and r is not blind]
    assert len(others) == 7 and {r.status for r in others} == {Status.OK}


REGISTERING_CALLS = (
    *OPENING_CALLS,
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
)


@pytest.mark.parametrize("call", REGISTERING_CALLS)
def test_a_gpu_whose_xid_registration_hangs_costs_only_that_gpu_and_is_retried(
    dgx: Node, tmp_path: Path, call: str
) -> None:
    """One call of GPU 3's registration for XID events hanging: the listener listens to
    the other seven (GPU 5's XID 48 arrives, a `fail`), GPU 3 is unwatched saying it hung; with the
    kernel log unreadable (the shipped unit) GPU 3 alone is `error` in gpu_xid, the others
    `ok`; once the driver answers again GPU 3 is registered and its XID 79 arrives."""
    path = tmp_path / "register.json"
    answering = modified(
        modified(dgx_healthy(), gpu=3, xids=[{"xid": 79}]), gpu=5, xids=[{"xid": 48}]
    )
    hanging = copy.deepcopy(answering)
    hanging["gpus"][3]["hang"] = {call: 0}
    node = dgx.with_scenario(hanging, path)
    session = node.nvml()
    xid_log = XidLog()
    listener = XidListener(session, xid_log, poll_s=0.1, retry_initial_s=0.05, retry_max_s=0.2)
    listener.start()
    try:
        wait_for(lambda: xid_log.listening, "the listener to listen")
        [(name, why)] = xid_log.unwatched.items()
        assert name in ("GPU 3", DGX_GPUS[3]), name
        assert why.startswith("NVML did not answer in 1 s (GPU 3"), why
        wait_for(lambda: any(e.bus_id == DGX_GPUS[5] for e in xid_log.events()), "GPU 5's XID 48")
        assert not any(e.bus_id == DGX_GPUS[3] for e in xid_log.events())
        results = node.results(
            "gpu_xid", kernel_log=tmp_path / "kmsg", xid_log=xid_log, nvml=session
        )
        blind = of(results, subject(DGX_GPUS[3]))
        assert [r.status for r in blind] == [Status.ERROR], blind
        assert "no XID source for this GPU" in blind[0].summary
        assert "NVML did not answer in 1 s (GPU 3" in blind[0].summary
        [ecc] = of(results, subject(DGX_GPUS[5]))
        assert ecc.status is Status.FAIL and "XID 48" in ecc.summary, ecc
        others = [
            r for r in results if r.subject not in (subject(DGX_GPUS[3]), subject(DGX_GPUS[5]))
        ]
        assert len(others) == 6 and {r.status for r in others} == {Status.OK}, others

        reload_scenario(answering, path)
        wait_for(lambda: not xid_log.unwatched, "GPU 3 registered")
        wait_for(lambda: any(e.bus_id == DGX_GPUS[3] for e in xid_log.events()), "GPU 3's XID 79")
        assert xid_log.listening
    finally:
        assert listener.stop()


def test_an_xid_storm_is_judged_in_seconds_each_error_once(dgx: Node, tmp_path: Path) -> None:
    """An XID storm on GPU 1: a kernel log of 100k XID 48 lines (~10 MiB, journalctl form)
    and 10k NVML events, half of them the log's latest: gpu_xid answers within 20 s (a
    bound for a loaded machine, under its 30 s timeout; comparing each NVML event with every
    event kept took minutes), counting each error once: 100k + 5k."""
    bus = DGX_GPUS[1]
    start = time.time() - 7 * 86_400
    log_lines = [
        f"{datetime.fromtimestamp(start + i * 0.01, timezone.utc).isoformat()} dgx01 kernel: "
        f"NVRM: Xid (PCI:{bus[:-2]}): 48, pid=4242, name=python, An uncorrectable ECC error"
        for i in range(100_000)
    ]
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("\n".join(log_lines) + "\n")
    xid_log = XidLog()
    xid_log.set_listening(start - 60)
    for i in range(5_000):  # the kernel log's latest errors, seen by NVML 1 s later
        xid_log.add(XidEvent(bus, 48, start + 950 + i * 0.01 + 1, "nvml event"))
    for i in range(5_000):  # after the log's last line, 6 s apart: errors it lacks
        xid_log.add(XidEvent(bus, 48, start + 2_000 + i * 6, "nvml event"))
    began = time.monotonic()
    results = dgx.results("gpu_xid", kernel_log=kernel_log, xid_log=xid_log)
    assert time.monotonic() - began < 20
    [storm] = of(results, subject(bus))
    assert "XID 48 GPU_ECC_DBE x105000," in storm.summary, storm
    others = [r for r in results if r is not storm]
    assert len(others) == 7 and {r.status for r in others} == {Status.OK}, others


def test_driver_version_unreadable_is_an_error_not_driver_none(dgx: Node, tmp_path: Path) -> None:
    """nvmlSystemGetDriverVersion failing: gpu_state's node result says it could not compare
    the library with the kernel module (`error`), not "driver None"."""
    scenario = modified(dgx_healthy(), errors={"nvmlSystemGetDriverVersion": "UNKNOWN"})
    node = dgx.with_scenario(scenario, tmp_path / "d.json")
    [result] = [r for r in node.results("gpu_state") if r.subject == "node"]
    assert result.status is Status.ERROR
    assert "NVML did not report its driver version" in result.summary


# -- 3. --kernel-log that is not a kernel log --------------------------------------


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _loop(tmp_path: Path) -> Path:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    return tmp_path / "a"


def _text(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("to do:\n- reboot node 7\n- NVRM is the driver\n")
    return path


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "kern.log"
    path.write_bytes(b"")
    return path


def _binary(tmp_path: Path) -> Path:
    path = tmp_path / "kern.log"
    path.write_bytes(bytes(range(256)) * 64)
    return path


def _nul_bytes(tmp_path: Path) -> Path:
    """A log file a crash left as zeros before any line of it reached the disk."""
    path = tmp_path / "kern.log"
    path.write_bytes(b"\0" * 8192)
    return path


def _one_huge_line(tmp_path: Path) -> Path:
    """17 MiB without a newline: the 16 MiB tail read holds no line's end."""
    path = tmp_path / "kern.log"
    path.write_bytes(b"x" * (17 << 20))
    return path


def _one_huge_line_ended(tmp_path: Path) -> Path:
    """The same line with its newline: the tail holds only the end of it."""
    path = tmp_path / "kern.log"
    path.write_bytes(b"x" * (17 << 20) + b"\n")
    return path


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (
            lambda tmp: Path("/bin/ls"),
            "not a kernel log: no line in kmsg, dmesg or syslog form (binary data)",
        ),
        (lambda tmp: Path("/dev/null"), "character device 1:3, not /dev/kmsg (1:11) or a log file"),
        (_text, "not a kernel log: no line in kmsg, dmesg or syslog form"),
        (_binary, "not a kernel log: no line in kmsg, dmesg or syslog form (binary data)"),
        (_empty, "empty: no kernel messages to read XIDs from"),
        (_nul_bytes, "only NUL bytes: no kernel messages to read XIDs from"),
        (
            _one_huge_line,
            "no line ended within the last 16 MiB read (of 17 MiB): one line longer than "
            "that, or not a log",
        ),
        (
            _one_huge_line_ended,
            "no whole line within the last 16 MiB read (of 17 MiB): only the end of one "
            "longer than that",
        ),
        (lambda tmp: tmp, "a directory, not a log file or /dev/kmsg"),
        (_fifo, "a FIFO, not a log file or /dev/kmsg"),
        (_loop, "a symlink loop"),
    ],
    ids=[
        "bin_ls",
        "dev_null",
        "text",
        "binary",
        "empty",
        "nul_bytes",
        "one_huge_line",
        "one_huge_line_ended",
        "directory",
        "fifo",
        "symlink_loop",
    ],
)
def test_a_kernel_log_that_is_not_one_is_an_error_naming_it(
    dgx: Node, tmp_path: Path, make: Callable[[Path], Path], reason: str
) -> None:
    """--kernel-log naming a file with no kernel-log line, a device, a FIFO...: one `error`
    naming the file and why, within a bound, never "no XID in the kernel log"."""
    path = make(tmp_path)
    started = time.monotonic()
    results = dgx.results("gpu_xid", kernel_log=path)
    assert time.monotonic() - started < 15
    [result] = results
    assert result.status is Status.ERROR, result
    assert result.summary == f"cannot read the kernel log for XIDs: {path}: {reason}"


def test_a_huge_kernel_log_is_read_by_its_tail_and_says_so(dgx: Node, tmp_path: Path) -> None:
    """A 20 MiB kern.log: its last 16 MiB are read (the XID 48 at its end is found) and
    every result says only that much was read."""
    line = "Nov 30 15:28:53 node7 kernel: eth0: link up\n"
    path = tmp_path / "kern.log"
    with path.open("w") as log:
        log.write(line * (20 * (1 << 20) // len(line)))
        stamp = time.strftime("%b %d %H:%M:%S", time.localtime(time.time() - 60))
        log.write(f"{stamp} node7 kernel: NVRM: Xid (PCI:0000:1a:00): 48, pid=1, DBE\n")
    results = dgx.results("gpu_xid", kernel_log=path)
    [dbe] = [r for r in results if r.subject == subject(DGX_GPUS[1])]
    assert dbe.status is Status.FAIL and "XID 48" in dbe.summary
    clean = next(r for r in results if r.subject == subject(DGX_GPUS[2]))
    assert clean.summary == f"no XID in the last 16 MiB of 20 MiB of the kernel log ({path})"


def test_a_log_after_a_crash_is_read_through_its_nul_bytes(dgx: Node, tmp_path: Path) -> None:
    """A syslog file after an unclean shutdown: NUL bytes where lines were being written,
    at its start and in its middle (one after a line cut short). Each run ends a line: the
    XIDs after them are found at the times their lines carry, and the results say that NUL
    bytes were read as line breaks."""
    now = int(time.time())
    at = {DGX_GPUS[1]: now - 600, DGX_GPUS[2]: now - 120}

    def syslog(when: int, text: str) -> bytes:
        stamp = time.strftime("%b %d %H:%M:%S", time.localtime(when))
        return f"{stamp} node7 kernel: {text}".encode()

    path = tmp_path / "kern.log"
    path.write_bytes(
        b"\0" * 4096
        + syslog(at[DGX_GPUS[1]], f"NVRM: Xid (PCI:{DGX_GPUS[1][:-2]}): 48, pid=1, DBE\n")
        + syslog(now - 300, "eth0: link u")  # cut short by the crash
        + b"\0" * 1000
        + syslog(at[DGX_GPUS[2]], f"NVRM: Xid (PCI:{DGX_GPUS[2][:-2]}): 48, pid=2, DBE\n")
    )
    results = dgx.results("gpu_xid", kernel_log=path)
    for bus, logged in at.items():
        [dbe] = of(results, subject(bus))
        assert "XID 48 GPU_ECC_DBE x1, last" in dbe.summary, dbe
        assert "unknown time" not in dbe.summary, dbe
        seen = {s.metric.name: s.value for s in dbe.samples}
        assert seen["nodecheck_gpu_xid_last_seen_timestamp_seconds"] == logged, dbe.samples
        assert dbe.details["log_times"] == ["syslog (local time, the year inferred: this year)"]
        assert dbe.details["log_notes"] == [
            "2 runs of NUL bytes (5096 bytes) read as line breaks (what a crash leaves in a "
            "log file that was being written)"
        ], dbe.details
    [clean] = of(results, subject(DGX_GPUS[3]))
    assert clean.status is Status.OK and clean.details["log_notes"], clean


NODECHECK = [sys.executable, "-m", "nodecheck.agent"]
LOG_CHECKS = ["--only", "gpu_xid", "--only", "nvswitch_sxid"]


def test_a_line_of_megabytes_reaches_no_result_whole(dgx: Node, tmp_path: Path) -> None:
    """An XID line and an SXid line of 7 MB each: `nodecheck check --json` shows the start of
    each message and says it was cut; the document stays small (it was 14 MB)."""
    xid_line = f"[ 1.0] NVRM: Xid (PCI:{DGX_GPUS[0][:-2]}): 79, " + "A" * 7_000_000
    sxid_line = "[ 1.0] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 24007, Fatal, " + "B" * 7_000_000
    path = tmp_path / "kern.log"
    path.write_text(f"{xid_line}\n{sxid_line}\n")
    done = subprocess.run(
        [*NODECHECK, *dgx.cli_args, "check", "--json", *LOG_CHECKS, "--kernel-log", str(path)],
        env={**os.environ, **dgx.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert len(done.stdout) < 100_000, len(done.stdout)
    found = {(r["check"], r["subject"]): r for r in json.loads(done.stdout)["results"]}
    lost = found[("gpu_xid", subject(DGX_GPUS[0]))]
    assert f"({'A' * 200}… (cut: 7000000 characters in all))" in lost["summary"], lost
    fatal = found[("nvswitch_sxid", "nvswitch 0000:05:00.0")]
    assert fatal["status"] == "fail", fatal
    assert f"({'B' * 200}… (cut: 7000000 characters in all))" in fatal["summary"], fatal


# -- 4. fewer GPUs than expected is a fail, whatever the reason -----------------------


@pytest.mark.parametrize(
    "scenario",
    [{"init_error": "DRIVER_NOT_LOADED"}, {"gpus": []}],
    ids=["no_driver", "nvml_sees_none"],
)
def test_expected_gpus_with_none_on_the_bus_fails(
    build: Callable[..., Node], tmp_path: Path, scenario: Scenario
) -> None:
    """--expected-gpus 8 on a node with no GPU on the bus: `fail`, "0 of 8"."""
    node = build("cpu-only").with_scenario(scenario, tmp_path / "none.json")
    [count] = node.results("gpu_count", config=CheckConfig(expected_gpus=8))
    assert count.status is Status.FAIL
    assert "0 of 8" in count.summary, count.summary


# -- 5. NVML answering nonsense ---------------------------------------------------


NONSENSE = [
    (
        "gpu_state",
        {"temperature": 4294967295, "errors": {"nvmlDeviceGetTemperatureV": "FUNCTION_NOT_FOUND"}},
        "NVML reported temperature 4294967295 °C: implausible",
    ),
    ("gpu_state", {"temperature": -5}, "NVML reported temperature -5 °C: implausible"),
    (
        "gpu_state",
        {"temperature_thresholds": {"slowdown": 0}},
        "NVML reported temperature_threshold 0 °C: implausible",
    ),
    ("gpu_state", {"power_mw": 4294967295}, "NVML reported power 4294967.295 W: implausible"),
    ("gpu_state", {"power_limit_mw": 0}, "NVML reported power_limit 0.0 W: implausible"),
    ("gpu_pcie", {"pcie": {"width": 0}}, "NVML reported PCIe width 0: implausible"),
    ("gpu_pcie", {"pcie": {"width": 255}}, "NVML reported PCIe width 255: implausible"),
    ("gpu_pcie", {"pcie": {"gen": 99}}, "NVML reported PCIe generation 99: implausible"),
    (
        "gpu_pcie",
        {"pcie": {"width": 32, "max_width": 16}},
        "NVML reported PCIe width x32 above its maximum x16: implausible",
    ),
    ("gpu_state", {"name": "H100\u0080\u00ff"}, "NVML reported a name that is not UTF-8: "),
    ("gpu_state", {"uuid": "GPU-\u00ff\u00fe"}, "NVML reported a uuid that is not UTF-8: "),
]


@pytest.mark.parametrize(
    ("check", "changes", "finding"),
    NONSENSE,
    ids=[
        "temperature_uint_max",
        "temperature_negative",
        "slowdown_threshold_zero",
        "power_megawatts",
        "power_limit_zero",
        "pcie_width_0",
        "pcie_width_255",
        "pcie_gen_99",
        "pcie_width_above_max",
        "name_not_utf8",
        "uuid_not_utf8",
    ],
)
def test_nonsense_from_nvml_is_an_error_on_that_gpu(
    dgx_faulty: Node, tmp_path: Path, check: str, changes: dict[str, Any], finding: str
) -> None:
    """An impossible value on GPU 3 (the one without a planted fault): `error` on GPU 3
    naming the query and the value, never a pass or a false fail; the other GPUs are
    judged as usual."""
    scenario = modified(faulty_scenario(), gpu=3, **changes)
    node = dgx_faulty.with_scenario(scenario, tmp_path / "n.json")
    runs = node.run(*GPU_CHECKS)
    mine = by_check(runs)[(check, subject(DGX_GPUS[3]))]
    assert mine.status is Status.ERROR, mine
    assert finding in mine.summary, mine.summary
    flagged = {r.subject for r in by_status(flat(runs), Status.ERROR)}
    assert flagged == {subject(DGX_GPUS[3])}, flagged
    planted_faults_found(runs)


def test_nvml_counting_100000_gpus_is_an_error_not_100000_reads(dgx: Node, tmp_path: Path) -> None:
    """nvmlDeviceGetCount answering 100000: every GPU check is one `error` naming the
    call and the value, within a bound."""
    node = dgx.with_scenario(modified(dgx_healthy(), device_count=100000), tmp_path / "c.json")
    started = time.monotonic()
    runs = node.run(*PER_GPU_CHECKS)
    assert time.monotonic() - started < 30
    for run in runs:
        [result] = run.results
        assert (result.status, result.subject) == (Status.ERROR, "node"), run.check.name
        assert result.summary == (
            "NVML could not list the GPUs: NVML reported 100000 GPUs (nvmlDeviceGetCount): "
            "implausible (at most 256)"
        )


def test_a_bus_id_that_is_not_one_costs_only_that_gpu(dgx_faulty: Node, tmp_path: Path) -> None:
    """GPU 3 reporting the bus id "garbage": GPU 3 (by index) is `error` naming it, the
    other GPUs are judged as usual, and gpu_count cannot tell whether the sysfs GPU
    NVML did not name is that one (`error`, not "fallen off the bus")."""
    scenario = modified(faulty_scenario(), gpu=3, bus_id_reported="garbage")
    node = dgx_faulty.with_scenario(scenario, tmp_path / "bus.json")
    runs = node.run(*GPU_CHECKS)
    by_index = [r for r in flat(runs) if r.subject == "gpu index 3"]
    assert len(by_index) == len(PER_GPU_CHECKS) + 1  # gpu_count names it too
    assert {r.status for r in by_index} == {Status.ERROR}
    assert all("NVML reported bus id 'garbage': not a PCI bus id" in r.summary for r in by_index)
    planted_faults_found(runs)
    sysfs_side = by_check(runs)[("gpu_count", subject(DGX_GPUS[3]))]
    assert sysfs_side.status is Status.ERROR
    assert "cannot tell whether it is one of them" in sysfs_side.summary


def test_ecc_lifetime_counts_going_down_are_an_error(dgx_faulty: Node, tmp_path: Path) -> None:
    """GPU 3's aggregate uncorrectable ECC count falls between two passes: `error` naming
    both values, not a pass."""
    ecc = {"aggregate_uncorrected": {"base": 1000, "per_s": -200}}
    node = dgx_faulty.with_scenario(
        modified(faulty_scenario(), gpu=3, ecc=ecc), tmp_path / "e.json"
    )
    session, history = node.nvml(), GpuHistory()
    node.run(*GPU_CHECKS, nvml=session, gpu_history=history)
    time.sleep(0.3)  # the counter falls 200 a second: any interval shows it
    runs = node.run(*GPU_CHECKS, nvml=session, gpu_history=history)
    mine = by_check(runs)[("gpu_memory_errors", subject(DGX_GPUS[3]))]
    assert mine.status is Status.ERROR
    assert "NVML reported aggregate uncorrectable ECC count" in mine.summary
    assert "in the previous reading: implausible" in mine.summary
    planted_faults_found(runs)


def test_throttle_time_beyond_the_wall_time_is_an_error(dgx_faulty: Node, tmp_path: Path) -> None:
    """GPU 3's hw_thermal counter gains 5 s per second: `error` naming the counter and
    both times, not a 100 % throttling `fail`."""
    throttle = {"hw_thermal": {"base": 0, "per_s": 5e9}}
    scenario = modified(faulty_scenario(), gpu=3, throttle_ns=throttle)
    node = dgx_faulty.with_scenario(scenario, tmp_path / "t.json")
    session, history = node.nvml(), GpuHistory()
    node.results("gpu_throttle", nvml=session, gpu_history=history)
    time.sleep(0.3)  # the counter gains 5 s a second: any interval shows it
    results = node.results("gpu_throttle", nvml=session, gpu_history=history)
    [mine] = [r for r in results if r.subject == subject(DGX_GPUS[3])]
    assert mine.status is Status.ERROR, mine
    assert "NVML reported hw_thermal throttle time of" in mine.summary
    assert "between readings: implausible" in mine.summary
    hot = next(r for r in results if r.subject == subject(DGX_GPUS[2]))
    assert hot.status is Status.FAIL  # GPU 2's real 50 % thermal slowdown still fails


# -- 6. the session refuses a deadline that is none --------------------------------


@pytest.mark.parametrize("deadline", [math.nan, math.inf, -math.inf, 0.0, -1.0, "5", True])
def test_a_deadline_that_is_no_deadline_is_refused(deadline: Any) -> None:
    """NaN, infinity, zero, negative or not a number: ValueError at construction."""
    with pytest.raises(ValueError, match="NVML deadline must be"):
        NvmlSession(deadline_s=deadline)
