"""`nodecheck bench network` under srun, as docs/benchmarks.md says: no MASTER_ADDR given.

Four tasks on the one node of the test cluster (--overcommit: it has two CPUs), gloo:
srun starts the ranks (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), each task finds the
rendezvous itself (the step's first node by `scontrol show hostnames`, a port from the
job and step ids), the four share one node name (the host name), and rank 0 alone
prints the report.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.fixtures.slurm_cluster import SlurmCluster

pytest.importorskip("torch", reason="torch (the CPU build make test installs)")


def test_network_benchmark_runs_under_srun(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    ran = slurm_cluster.run(
        "srun",
        "--nodes=1",
        "--ntasks=4",
        "--overcommit",  # four tasks on the test node's two CPUs
        "--label",
        sys.executable,
        "-m",
        "nodecheck.agent",
        "bench",
        "network",
        "--device",
        "cpu",
        "--payload-mib",
        "1",
        "--duration",
        "0.2",
        "--idle-window",
        "0",
        "--state-dir",
        str(tmp_path),
        timeout=180,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = [line.split(": ", 1) for line in ran.stdout.splitlines() if line.strip()]
    # --label: each line starts with its task's number; only rank 0 reports.
    assert lines and {task.strip() for task, _ in lines} == {"0"}, ran.stdout
    report = [text for _, text in lines]
    node = slurm_cluster.node
    assert report[0] == "nodecheck bench network: OK (1 nodes, 4 ranks, gloo)", ran.stdout
    row = next(text for text in report if re.match(r"\s+1 MiB\s+\d+\s", text))
    median = float(row.split()[5])
    assert median > 0, ran.stdout
    # One node: no pair to sweep; its verdict, and its record by its lowest rank.
    assert "sweep: not run (one node: no pair to sweep)" in report, ran.stdout
    record = json.loads((tmp_path / "network.json").read_text())
    assert (record["node"], record["nodes"], record["ranks"]) == (node, 1, 4)
    assert record["verdict"]["status"] == "ok" and record["pairs"] == []
    # The table prints GB/s to three decimals: the record's figure is the one printed.
    assert f"{record['whole_job']['busbw_median'] / 1e9:.3f}" == row.split()[5], ran.stdout
