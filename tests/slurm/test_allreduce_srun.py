"""The all_reduce benchmark child under srun, as docs/benchmarks.md says.

Two tasks on the one node, gloo on the CPU: srun starts the ranks (SLURM_PROCID,
SLURM_NTASKS), MASTER_ADDR/MASTER_PORT come from the caller's environment as
docs/benchmarks.md's recipe exports them, and rank 0 alone prints the busbw table.
"""

from __future__ import annotations

import re
import socket
import sys

import pytest

from tests.fixtures.slurm_cluster import SlurmCluster

pytest.importorskip("torch", reason="torch (the CPU build make test installs)")

ROW = re.compile(r"^\s*(?P<mib>\d+) MiB\s+(?P<busbw>[\d.]+)\s+(?P<algbw>[\d.]+)\s")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_allreduce_child_runs_under_srun(slurm_cluster: SlurmCluster) -> None:
    # docs/benchmarks.md: export MASTER_ADDR=$(scontrol show hostnames | head -n1) MASTER_PORT=...
    hosts = slurm_cluster.run("scontrol", "show", "hostnames", slurm_cluster.node).stdout
    master = hosts.split()[0]
    ran = slurm_cluster.run(
        "srun",
        "--nodes=1",
        "--ntasks=2",
        "--label",
        sys.executable,
        "-m",
        "nodecheck.checks.bench.child",
        "allreduce",
        "--device",
        "cpu",
        "--payload-mib",
        "1",
        "--payload-mib",
        "4",
        "--duration",
        "2",
        env={"MASTER_ADDR": master, "MASTER_PORT": str(_free_port())},
        timeout=300,
    )
    lines = [line.split(": ", 1) for line in ran.stdout.splitlines() if line.strip()]
    # --label: each line starts with its task's number; only rank 0 reports.
    assert lines and {task.strip() for task, _ in lines} == {"0"}, ran.stdout
    report = [text for _, text in lines]
    assert report[0] == "all_reduce over 2 ranks (gloo)", ran.stdout
    rows = [m for text in report if (m := ROW.match(text))]
    assert [int(m["mib"]) for m in rows] == [1, 4], ran.stdout
    for row in rows:
        busbw, algbw = float(row["busbw"]), float(row["algbw"])
        # Two ranks: busbw = algbw x 2(n-1)/n = algbw (nccl-tests), and it moved data.
        assert busbw > 0 and busbw == pytest.approx(algbw, abs=0.011), ran.stdout
