"""The labels a fleet compares benchmark series by, on literal child results of 8 H100s
(the CPU runs of tests/checks/test_bench.py show them on real measurements)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nodecheck.checks.bench.allreduce import judge_allreduce
from nodecheck.checks.bench.matmul import judge_matmul
from nodecheck.checks.bench.state import BenchState
from nodecheck.checks.config import BenchOptions
from nodecheck.checks.result import Result
from tests.checks.test_bench_judging import h100

MODEL = "NVIDIA H100 80GB HBM3"


def labels_of(results: list[Result], metric: str) -> list[dict[str, str]]:
    return [dict(s.labels) for r in results for s in r.samples if s.metric.name == metric]


def test_matmul_series_carry_the_shapes_run(tmp_path: Path) -> None:
    """A GPU whose memory cap shrank its shapes ran another measurement: its `shape`
    differs, so a fleet median never mixes it with the GPUs that ran the full shapes."""
    full = [{"shape": [8192, 8192, 8192]}, {"shape": [2048, 2048, 13312]}]
    capped = [{"shape": [4096, 4096, 4096]}]
    devices = {"0": {"tflops": 780.0, "shapes": full}, "1": {"tflops": 770.0, "shapes": capped}}
    judgement = judge_matmul(
        {"devices": devices}, [h100(0), h100(1)], BenchState(tmp_path), BenchOptions()
    )
    assert judgement.measured
    for metric in ("nodecheck_bench_matmul_flops_per_second", "nodecheck_bench_matmul_peer_ratio"):
        assert labels_of(judgement.results, metric) == [
            {
                "gpu": "0",
                "bus_id": "0000:18:00.0",
                "model": MODEL,
                "dtype": "bf16",
                "shape": "8192x8192x8192+2048x2048x13312",
            },
            {
                "gpu": "1",
                "bus_id": "0000:1a:00.0",
                "model": MODEL,
                "dtype": "bf16",
                "shape": "4096x4096x4096",
            },
        ]


def test_a_matmul_run_where_every_gpu_failed_measured_nothing(tmp_path: Path) -> None:
    devices = {"0": {"error": "CUDA error: out of memory"}}
    judgement = judge_matmul({"devices": devices}, [h100(0)], BenchState(tmp_path), BenchOptions())
    assert not judgement.measured and not judgement.results[0].samples


def row(size: int, busbw: float, **extra: Any) -> dict[str, Any]:
    return {
        "bytes": size,
        "iterations": 20,
        "algbw_gbps": busbw / 1.75,
        "busbw_gbps": busbw,
        "busbw_mean_gbps": busbw,
        "busbw_worst_gbps": busbw * 0.9,
        "busbw_cv": 0.02,
        **extra,
    }


def test_allreduce_series_carry_algorithm_model_and_ranks(tmp_path: Path) -> None:
    rows = [row(64 << 20, 300.0, algorithm="ring"), row(4 << 30, 470.0, algorithm="nvls")]
    result = {"world_size": 8, "backend": "nccl", "payloads": rows}
    targets = [h100(i) for i in range(8)]
    judgement = judge_allreduce(result, targets, BenchState(tmp_path), BenchOptions())
    expected = [
        {"payload_bytes": str(64 << 20), "algorithm": "ring", "model": MODEL, "ranks": "8"},
        {"payload_bytes": str(4 << 30), "algorithm": "nvls", "model": MODEL, "ranks": "8"},
    ]
    for metric in (
        "nodecheck_bench_allreduce_bus_bandwidth_bytes_per_second",
        "nodecheck_bench_allreduce_worst_bus_bandwidth_bytes_per_second",
        "nodecheck_bench_allreduce_variation_ratio",
    ):
        assert labels_of(judgement.results, metric) == expected


def test_a_child_that_did_not_say_is_unknown_not_a_guess(tmp_path: Path) -> None:
    result = {"world_size": 2, "backend": "nccl", "payloads": [row(1 << 30, 90.0)]}
    judgement = judge_allreduce(result, [h100(0), h100(1)], BenchState(tmp_path), BenchOptions())
    [labels, *_] = labels_of(
        judgement.results, "nodecheck_bench_allreduce_bus_bandwidth_bytes_per_second"
    )
    assert labels["algorithm"] == "unknown" and labels["ranks"] == "2"
