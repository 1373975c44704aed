"""A cross-node sweep's record reaches `nodecheck slurm health-check` as every finding does:
through [remediation]'s policy and dry run, with no check named anywhere but its module.
Real health-check subprocesses on the healthy DGX replica (every other check passes there),
the record literal in its state directory (tests/checks/test_network_sweep.py's), and the
stand-in scontrol of test_slurm_health_cli."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.agent.test_slurm_health_cli import Slurm, health_check, line_of
from tests.checks.test_network_sweep import HEALTHY, SLOW_NODE, named_before, record
from tests.conftest import Node


def health_check_on(
    node: Node, tmp_path: Path, text: str, config: str = ""
) -> tuple[subprocess.CompletedProcess[str], str, Slurm]:
    """One health-check run with `text` as the record in its state directory: the run, its
    log line, and the stand-in scontrol's state and calls."""
    slurm = Slurm(tmp_path / "slurm")
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "network.json").write_text(text)
    # The sweep before named this node too: a node is failed only on two in a row.
    (tmp_path / "state" / "network.previous.json").write_text(named_before(time.time()))
    done = health_check(node, slurm, tmp_path, config=config)
    return done, line_of(done), slurm


def test_a_node_the_sweep_named_slow_would_be_drained_with_the_reason(
    dgx: Node, tmp_path: Path
) -> None:
    config = "[remediation]\ndry_run = true\n"
    done, line, slurm = health_check_on(dgx, tmp_path, record(SLOW_NODE), config)
    assert done.returncode == 1, done.stderr
    assert "action=drain" in line and "dry_run=true" in line, line
    assert "would drain with: " in line and "scontrol update NodeName=gpu01 State=DRAIN" in line
    assert "'Reason=nodecheck: network_sweep node: sweep 10 min ago over 8 nodes" in line, line
    assert "dgx-h100-01 slow: 0.31 GB/s in both its pairs" in line
    assert slurm.updates() == [] and slurm.state()["flags"] == []


def test_with_the_performance_policy_off_it_is_reported_not_acted_on(
    dgx: Node, tmp_path: Path
) -> None:
    config = "[remediation]\nperformance = false\n"
    done, line, slurm = health_check_on(dgx, tmp_path, record(SLOW_NODE), config)
    assert done.returncode == 1, done.stderr  # unhealthy, said
    assert "action=nothing" in line
    assert "gpu-performance with [remediation] performance = false" in line
    assert "first network_sweep node" in line
    assert slurm.updates() == []


def test_a_healthy_sweep_changes_nothing(dgx: Node, tmp_path: Path) -> None:
    done, line, slurm = health_check_on(dgx, tmp_path, record(HEALTHY))
    assert done.returncode == 0, done.stderr
    assert "action=nothing" in line and "in service, nothing to do" in line
    assert slurm.updates() == []


def test_a_stale_record_drains_nothing_and_flags_nothing(dgx: Node, tmp_path: Path) -> None:
    old = record(SLOW_NODE, finished_at=time.time() - 4 * 86400)
    done, line, slurm = health_check_on(dgx, tmp_path, old)
    # Sweeps that stopped must not drain a fleet (nor, as errors, with drain_on_error).
    assert done.returncode == 0, done.stderr
    assert "action=nothing" in line and "in service, nothing to do" in line
    assert slurm.updates() == []
