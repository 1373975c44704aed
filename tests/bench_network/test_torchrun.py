"""`nodecheck bench network` as torchrun's worker (--no-python), as README.md shows it.

Two workers on this machine with the c10d rendezvous: torchrun sets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT; both run on one host, so one node: the whole
job is measured, no sweep, rank 0 prints the report, the node's lowest rank its record.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch (the CPU build make test installs)")


def test_bench_network_under_torchrun(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    nodecheck = shutil.which("nodecheck", path=str(Path(sys.executable).parent))
    if not torchrun.exists() or nodecheck is None:
        pytest.skip("torchrun or nodecheck is not installed beside this Python")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [
        str(torchrun),
        "--nnodes=1",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--no-python",
        nodecheck,
        "bench",
        "network",
        "--device",
        "cpu",
        "--payload-mib",
        "1",
        "--payload-mib",
        "2",
        "--duration",
        "0.2",
        "--idle-window",
        "0",
        "--json",
        "--node-name",
        "node-a",
        "--state-dir",
        str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # rank 0's document alone
    assert report["schema"] == "nodecheck.bench_network/v1" and report["status"] == "ok"
    assert (report["ranks"], report["nodes"], report["backend"]) == (2, ["node-a"], "gloo")
    assert [row["bytes"] for row in report["payloads"]] == [1 << 20, 2 << 20]
    assert report["payload_bytes"] == 2 << 20  # the largest is judged
    assert report["sweep"]["why"] == "one node: no pair to sweep"
    record = json.loads((tmp_path / "network.json").read_text())
    assert record["whole_job"] == report["whole_job"] and record["pairs"] == []
    assert record["verdict"]["status"] == "ok" and record["version"] == 1
