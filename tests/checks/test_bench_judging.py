"""The benchmark state (atomic, damage-proof) and the verdicts, on literal numbers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodecheck.checks.bench.allreduce import judge_allreduce
from nodecheck.checks.bench.driver import Target
from nodecheck.checks.bench.matmul import judge_matmul
from nodecheck.checks.bench.state import STATE_FILE, BenchState, parse_state
from nodecheck.checks.config import BenchOptions
from nodecheck.checks.node.gpu import GpuReading
from nodecheck.checks.result import Status
from nodecheck.checks.rules.gpu_peaks import achievable_tflops, allreduce_floor, matmul_rates

WRITER = """
import sys
from pathlib import Path
from nodecheck.checks.node.fs import write_atomically
path = Path(sys.argv[1])
big = {"A": "a" * 4_000_000, "B": "b" * 4_000_000}
print("ready", flush=True)
n = 0
while True:
    name = "AB"[n % 2]
    write_atomically(path, '{"version": 1, "runs": {}, "skips": {}, "who": "%s", "pad": "%s"}'
                     % (name, big[name]))
    n += 1
"""


def test_state_survives_a_kill_mid_write(tmp_path: Path) -> None:
    """A writer replacing a 4 MB file in a loop, killed 15 times at odd moments:
    the file is always one whole version, and no temporary file is mistaken for it."""
    path = tmp_path / STATE_FILE
    for attempt in range(15):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        time.sleep(0.01 + 0.013 * attempt)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        if path.exists():
            document = parse_state(path.read_text())
            assert document["who"] in ("A", "B")
            assert len(document["pad"]) == 4_000_000


def test_a_damaged_state_is_moved_aside_and_reported(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text('{"version": 1, "runs": {"matmul/GPU-1/bf16": [')
    state = BenchState(tmp_path)
    assert state.baseline("matmul/GPU-1/bf16") is None
    assert state.problem is not None and "was damaged" in state.problem
    [aside] = tmp_path.glob(f"{STATE_FILE}.damaged-*")
    assert aside.read_text().startswith('{"version": 1')
    state.record({"matmul/GPU-1/bf16": 700.0}, keep=3)
    assert (
        json.loads((tmp_path / STATE_FILE).read_text())["runs"]["matmul/GPU-1/bf16"][0]["value"]
        == 700.0
    )


def test_a_wrongly_shaped_state_is_damage_too(tmp_path: Path) -> None:
    """Valid JSON with entries that are not {time, value}: moved aside, never a crash."""
    (tmp_path / STATE_FILE).write_text('{"version": 1, "runs": {"k": [5.0]}, "skips": {}}')
    state = BenchState(tmp_path)
    assert state.baseline("k") is None
    assert state.problem is not None and "runs['k']" in state.problem


def test_baseline_is_a_rolling_median(tmp_path: Path) -> None:
    state = BenchState(tmp_path)
    for value in (700, 710, 690, 720, 100):
        state.record({"k": value}, keep=4)
    assert state.baseline("k") == 700.0  # median of 710, 690, 720, 100: the outlier is outvoted
    assert state.count_skip("gpu_busy") == {"gpu_busy": 1}
    assert state.count_skip("gpu_busy") == {"gpu_busy": 2}


def h100(index: int) -> Target:
    gpu = GpuReading(
        index, bus_id=f"0000:{0x18 + 2 * index:02x}:00.0", name="NVIDIA H100 80GB HBM3"
    )
    gpu.uuid = f"GPU-{index}"
    return Target(str(index), gpu)


def matmul_result(rates: list[float]) -> dict[str, object]:
    shapes = [{"shape": [8192] * 3, "median_tflops": 0, "max_tflops": 0, "iterations": 9}]
    return {"devices": {str(i): {"tflops": rate, "shapes": shapes} for i, rate in enumerate(rates)}}


@pytest.mark.parametrize(
    ("slow", "status"),
    [(760.0, Status.OK), (700.0, Status.WARN), (600.0, Status.FAIL)],
)
def test_matmul_against_peers_and_model(tmp_path: Path, slow: float, status: Status) -> None:
    """Seven H100s at 780 TFLOPS and one slower: judged against the median and MAMF's 794.5."""
    targets = [h100(i) for i in range(8)]
    rates = [780.0] * 7 + [slow]
    judgement = judge_matmul(matmul_result(rates), targets, BenchState(tmp_path), BenchOptions())
    statuses = [result.status for result in judgement.results]
    assert statuses == [Status.OK] * 7 + [status]
    last = judgement.results[-1]
    assert last.subject == "gpu 0000:26:00.0"
    assert f"{slow / 780:.2f}x the node's median" in last.summary
    assert f"{slow / 989:.0%} of the 989 TFLOPS peak" in last.summary
    # Only good results feed the baselines: a degraded GPU is not its own yardstick.
    assert ("matmul/GPU-7/bf16/8192x8192x8192" in judgement.good_values) == (status is Status.OK)


def test_matmul_against_its_baseline(tmp_path: Path) -> None:
    state = BenchState(tmp_path)
    state.record({"matmul/GPU-0/bf16/8192x8192x8192": 780.0}, keep=10)
    judgement = judge_matmul(matmul_result([690.0]), [h100(0)], state, BenchOptions())
    [result] = judgement.results
    assert result.status is Status.WARN  # 0.88 of its baseline; 0.87 of MAMF is still ok
    assert "0.88x its baseline" in result.summary


def test_allreduce_against_the_node_floor(tmp_path: Path) -> None:
    """8x H100 at 4 GiB: 480 GB/s expected (NVLS). 300 is 0.62 of it: fail."""
    rows = [
        {
            "bytes": 4 << 30,
            "iterations": 20,
            "algbw_gbps": 300 / 1.75,
            "busbw_gbps": 300.0,
            "busbw_mean_gbps": 298.0,
            "busbw_worst_gbps": 250.0,
            "busbw_cv": 0.05,
        }
    ]
    result = {"world_size": 8, "backend": "nccl", "payloads": rows}
    targets = [h100(i) for i in range(8)]
    judgement = judge_allreduce(result, targets, BenchState(tmp_path), BenchOptions())
    [verdict] = judgement.results
    assert verdict.status is Status.FAIL
    assert "0.62x the 480 GB/s of a healthy 8xNVIDIA H100 80GB HBM3" in verdict.summary
    assert "iterations vary 5%, worst 250 GB/s" in verdict.summary
    assert judgement.good_values == {}


def test_reference_tables() -> None:
    assert matmul_rates("NVIDIA H100 80GB HBM3").model == "H100 SXM"  # type: ignore[union-attr]
    assert matmul_rates("NVIDIA H100 PCIe").model == "H100 PCIe"  # type: ignore[union-attr]
    assert matmul_rates("NVIDIA GH200 480GB").model == "GH200"  # type: ignore[union-attr]
    assert matmul_rates("NVIDIA A100-SXM4-80GB").model == "A100 SXM"  # type: ignore[union-attr]
    assert matmul_rates("NVIDIA GeForce RTX 4090") is None
    assert matmul_rates("NVIDIA A100-PCIE-40GB").model == "A100 PCIe"  # type: ignore[union-attr]
    assert matmul_rates("NVIDIA H100 NVL") is None
    assert allreduce_floor("NVIDIA H100 PCIe", 8) is None
    assert achievable_tflops("NVIDIA H200", "bf16") == 794.5
    assert achievable_tflops("NVIDIA H200", "fp32") is None
    assert allreduce_floor("NVIDIA H200", 8) == 482.3
    assert allreduce_floor("NVIDIA H200", 4) is None
