"""Faults found while merging the matrix: the benchmark watch, the kernel log's path under
--rootfs, and advice that only makes sense to a non-root reader."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from nodecheck.checks.bench.gate import ForeignProcessWatch, Refusal
from nodecheck.checks.bench.options import BenchOptions
from nodecheck.checks.node.variables import Variables
from nodecheck.checks.result import Status
from nodecheck.checks.settings_audit import sources_summary
from tests.conftest import Node
from tests.fixtures.nvml_scenarios import dgx_healthy

WAIT_S = 60.0


def test_benchmark_watch_stops_when_one_gpu_goes_dark(dgx: Node, tmp_path: Path) -> None:
    """GPU 2's utilization call hangs while a benchmark runs: the watch can no longer see
    whether a job arrives on that GPU, so after its blind limit it stops the run, naming
    GPU 2 (before, a per-GPU problem was ignored and the run went on blind)."""
    scenario = dgx_healthy()
    for gpu in scenario["gpus"]:
        gpu["processes"] = []  # no job anywhere: only the dark GPU can stop the run
    scenario["gpus"][2]["hang"] = {"nvmlDeviceGetUtilizationRates": 0}
    node = dgx.with_scenario(scenario, tmp_path / "dark.json")
    stopped: list[Refusal] = []
    done = threading.Event()

    def stop(refusal: Refusal) -> None:
        stopped.append(refusal)
        done.set()

    watch = ForeignProcessWatch(node.context(), BenchOptions(), stop)
    watch.start(group=os.getpgrp())
    try:
        assert done.wait(WAIT_S), "the watch never stopped the run"
    finally:
        watch.close()
    [refusal] = stopped
    assert refusal.reason == "nvml_unavailable"
    assert refusal.text.startswith("lost sight of GPU 2 (0000:"), refusal.text
    assert "NVML did not answer" in refusal.text


def test_a_kernel_log_path_that_loops_under_rootfs_is_an_error(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """<rootfs>/dev/kmsg a symlink loop (resolved inside --rootfs as chroot would):
    gpu_xid says the kernel log cannot be read, an `error` naming it, never a crash."""
    node = copy_node(dgx)
    kmsg = node.root / "dev" / "kmsg"
    kmsg.parent.mkdir(exist_ok=True)
    if kmsg.exists() or kmsg.is_symlink():
        kmsg.unlink()
    kmsg.symlink_to("/dev/kmsg")  # absolute: inside --rootfs, it points at itself
    [run] = node.run("gpu_xid")
    assert run.completed, run.results
    causes = [result.details.get("cause") for result in run.results]
    assert "exception" not in causes
    errors = [result for result in run.results if result.status is Status.ERROR]
    assert errors, [(r.status, r.summary) for r in run.results]
    assert any("kmsg" in result.summary for result in errors)


@pytest.mark.skipif(os.geteuid() != 0, reason="what root is told")
def test_root_is_not_told_to_run_as_root() -> None:
    """A process environment root could not read (EPERM from a hardened kernel): the
    audit counts it, and tells root nothing about running as root."""
    variables = Variables(unreadable=["/proc/4242/environ"])
    text, details = sources_summary(variables)
    assert "1 process(es) or file(s) not readable" in text
    assert "run as root" not in text
    assert details["unreadable"] == ["/proc/4242/environ"]
