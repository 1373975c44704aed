"""nodecheck_bench_last_success_timestamp_seconds on real benchmark runs (real torch on the
CPU, the gate against the fake NVML): 0 before the first measurement (never), the end of
every run that measured, left where it was by runs that failed or were refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nodecheck.checks.bench.driver import last_success_key
from nodecheck.checks.bench.state import BenchState, parse_state
from nodecheck.checks.result import Result, Status
from tests.checks.test_bench import bench
from tests.conftest import Node

METRIC = "nodecheck_bench_last_success_timestamp_seconds"


def last_success(results: list[Result]) -> dict[str, float]:
    return {
        sample.labels["benchmark"]: sample.value
        for result in results
        for sample in result.samples
        if sample.metric.name == METRIC
    }


def test_the_last_success_of_matmul(dgx: Node, tmp_path: Path) -> None:
    """GPU 0 of the healthy DGX runs a job: the gate refuses unless forced; --device cpu
    measures the CPU while the fake NVML plays the GPUs."""
    options = {"device": "cpu", "dtype": "fp32"}
    [refused] = bench(dgx, "matmul", tmp_path, **options)
    assert refused.status is Status.SKIP and refused.details["cause"] == "gpu_busy"
    assert last_success([refused]) == {"matmul": 0.0}  # nothing measured yet: never

    before = time.time()
    measured = bench(dgx, "matmul", tmp_path, force=True, **options)
    after = time.time()
    assert measured[0].status in (Status.OK, Status.WARN, Status.FAIL)
    stamp = last_success(measured)["matmul"]
    assert before < stamp < after
    assert list(last_success(measured)) == ["matmul"]

    # Refused again, then a run that fails: the timestamp stays that of the measurement.
    [refused] = bench(dgx, "matmul", tmp_path, **options)
    assert refused.status is Status.SKIP and last_success([refused]) == {"matmul": stamp}
    [failed] = bench(dgx, "matmul", tmp_path, force=True, duration_s=60, timeout_s=3.0, **options)
    assert failed.status is Status.ERROR and failed.details["cause"] == "timeout"
    assert last_success([failed]) == {"matmul": stamp}

    # Kept in the state directory, per host and benchmark: an agent restarted finds it.
    state, host = BenchState(tmp_path / "state"), dgx.context().hostname
    assert state.last_success(last_success_key(host, "matmul")) == stamp
    assert state.last_success(last_success_key(host, "h2d")) is None
    [h2d] = bench(dgx, "h2d", tmp_path, **options)  # refused: h2d never measured
    assert h2d.status is Status.SKIP and last_success([h2d]) == {"h2d": 0.0}


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU")
def test_a_run_where_every_gpu_failed_measured_nothing(dgx: Node, tmp_path: Path) -> None:
    """--device cuda where torch has no GPU: every GPU's result is an error."""
    results = bench(dgx, "matmul", tmp_path, device="cuda", gpus=(1, 2), force=True)
    assert {result.status for result in results} == {Status.ERROR}
    assert last_success(results) == {"matmul": 0.0}
    host = dgx.context().hostname
    assert BenchState(tmp_path / "state").last_success(last_success_key(host, "matmul")) is None


def test_the_state_file_s_last_success_on_literals() -> None:
    """Files written before it existed have none; a damaged one is damage (moved aside)."""
    old = parse_state('{"version": 1, "runs": {}, "skips": {}}')
    assert old["last_success"] == {}
    good = parse_state('{"version": 1, "runs": {}, "skips": {}, "last_success": {"h/matmul": 5}}')
    assert good["last_success"] == {"h/matmul": 5}
    for bad in ('"yesterday"', "true", "[1]"):
        text = (
            f'{{"version": 1, "runs": {{}}, "skips": {{}}, "last_success": {{"h/matmul": {bad}}}}}'
        )
        with pytest.raises(ValueError, match="last_success"):
            parse_state(text)
    with pytest.raises(ValueError, match="last_success"):
        parse_state('{"version": 1, "runs": {}, "skips": {}, "last_success": [5]}')


def measurements(results: list[Result]) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    """The figures the results export: every sample but the state series (skip counts and
    the last success, which ride on every result)."""
    return sorted(
        (sample.metric.name, tuple(sorted(sample.labels.items())), sample.value)
        for result in results
        for sample in result.samples
        if sample.metric.name not in (METRIC, "nodecheck_bench_skips_total")
    )


Figure = tuple[str, tuple[tuple[str, str], ...], float]


def rates(figures: list[Figure]) -> list[Figure]:
    return [figure for figure in figures if figure[0].endswith("_per_second")]


def test_a_refused_or_failed_run_keeps_exporting_the_last_measurement(
    dgx: Node, tmp_path: Path
) -> None:
    """The fleet's freshness filter ages a node's figures by their last success: a run
    refused (GPUs busy) or failed carries the last measured rates, equal, beside an
    unchanged last success (never the ratios judged from them); the next measurement
    replaces them."""
    options = {"device": "cpu", "dtype": "fp32"}
    [refused] = bench(dgx, "matmul", tmp_path, **options)
    assert refused.status is Status.SKIP and measurements([refused]) == []  # none yet

    first = bench(dgx, "matmul", tmp_path, force=True, **options)
    figures = measurements(first)
    assert "nodecheck_bench_matmul_flops_per_second" in {name for name, _, _ in figures}
    stamp = last_success(first)["matmul"]

    [refused] = bench(dgx, "matmul", tmp_path, **options)
    assert refused.status is Status.SKIP and refused.details["cause"] == "gpu_busy"
    assert measurements([refused]) == rates(figures)
    assert last_success([refused]) == {"matmul": stamp}
    [failed] = bench(dgx, "matmul", tmp_path, force=True, duration_s=60, timeout_s=3.0, **options)
    assert failed.status is Status.ERROR and failed.details["cause"] == "timeout"
    assert measurements([failed]) == rates(figures)
    assert last_success([failed]) == {"matmul": stamp}

    second = bench(dgx, "matmul", tmp_path, force=True, **options)
    assert last_success(second)["matmul"] > stamp
    [refused] = bench(dgx, "matmul", tmp_path, **options)
    assert measurements([refused]) == rates(measurements(second))
    assert rates(measurements(second)) != measurements(second)  # a baseline ratio too
    assert last_success([refused]) == last_success(second)
    # Per benchmark: h2d never measured, so its refusal carries nothing of matmul's.
    [h2d] = bench(dgx, "h2d", tmp_path, **options)
    assert h2d.status is Status.SKIP and measurements([h2d]) == []


def test_a_benchmark_that_does_not_apply_exports_no_last_success(
    workstation: Node, tmp_path: Path
) -> None:
    """all_reduce on a one-GPU node never runs: no last success, not even 0, so a fleet
    does not report it as a benchmark that never measured."""
    results = bench(workstation, "allreduce", tmp_path, device="cuda")
    assert {result.status for result in results} == {Status.SKIP}
    assert last_success(results) == {}


def test_carried_samples_are_the_rates_of_gpus_still_targeted() -> None:
    from nodecheck.checks.bench.driver import LastMeasurements, Target
    from nodecheck.checks.bench.matmul import FLOPS, PEER_RATIO
    from nodecheck.checks.result import Sample

    kept = LastMeasurements()
    gpu = {"gpu": "0", "bus_id": "00000000:18:00.0", "model": "H100", "dtype": "bf16"}
    gone = {**gpu, "gpu": "1", "bus_id": "00000000:2A:00.0"}
    samples = (Sample(FLOPS, 7e14, gpu), Sample(PEER_RATIO, 0.8, gpu), Sample(FLOPS, 7e14, gone))
    kept.keep(Path("/state"), "n1/matmul", samples)

    class Gpu:
        bus_id = "00000000:18:00.0"

    target = Target("0", Gpu())  # type: ignore[arg-type]
    assert kept.last(Path("/state"), "n1/matmul", [target]) == (Sample(FLOPS, 7e14, gpu),)
    assert kept.last(Path("/state"), "n2/matmul", [target]) == ()
