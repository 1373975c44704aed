"""What every benchmark does around its measurement: lock, gate, child, watch, verdict, state.

A benchmark module supplies the child's spec and a `judge` that turns the
child's result into Results (and the good values to remember); `run_benchmark`
does the rest, the same way for all three.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import threading
import time
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any

from nodecheck.checks.bench.child_runner import run_child
from nodecheck.checks.bench.gate import ForeignProcessWatch, Refusal, check_gate
from nodecheck.checks.bench.state import BenchBusyError, BenchState
from nodecheck.checks.config import BenchOptions, Thresholds
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.gpu import GpuActivity, GpuReading, read_gpu_activity
from nodecheck.checks.node.nvml import NvmlHungError, NvmlUnavailableError
from nodecheck.checks.record import record
from nodecheck.checks.result import NODE, MetricSpec, Result, Sample, Status

SKIPS = MetricSpec(
    "nodecheck_bench_skips_total",
    "counter",
    "Benchmark runs not started or stopped for job safety, by reason "
    "(gpu_busy, foreign_process, maintenance, busy_lock, nvml_unavailable, gpu_unhealthy)",
    ("reason",),
)
LAST_SUCCESS = MetricSpec(
    "nodecheck_bench_last_success_timestamp_seconds",
    "gauge",
    "When the last run of this benchmark that measured ended (whatever its verdict); 0: "
    "it has never measured here; a fleet leaves out results older than twice the interval",
    ("benchmark",),
)


class LastMeasurements:
    """The samples of each benchmark's last run that measured (the run whose end is its
    last success), kept in memory by (state directory, host/benchmark) and put back on
    every result of a run that was refused or failed: a node whose GPUs are busy keeps
    exporting its last figures beside their last-success time, so a fleet sees them age
    out by its freshness filter instead of vanishing at the first refusal. An agent that
    restarts has none until it measures again (its last success, on disk, stays).

    Only the measured rates are carried (the `*_per_second` families), never the verdicts
    derived from them (peer and baseline ratios, the variation): a node alert on a ratio
    would otherwise keep firing on a days-old run while the check says skip. And only for
    GPUs still among the run's targets: a GPU gone from the bus is not reported measured."""

    def __init__(self) -> None:
        self._samples: dict[tuple[str, str], tuple[Sample, ...]] = {}
        self._lock = threading.Lock()

    def keep(self, state_dir: Path, key: str, samples: tuple[Sample, ...]) -> None:
        rates = tuple(sample for sample in samples if sample.metric.name.endswith("_per_second"))
        with self._lock:
            self._samples[(str(state_dir), key)] = rates

    def last(self, state_dir: Path, key: str, targets: list[Target]) -> tuple[Sample, ...]:
        present = {target.gpu.bus_id for target in targets if target.gpu}
        with self._lock:
            kept = self._samples.get((str(state_dir), key), ())
        return tuple(
            sample
            for sample in kept
            if not sample.labels.get("bus_id") or sample.labels["bus_id"] in present
        )


LAST_MEASUREMENTS = LastMeasurements()


@record(frozen=False)
class Judgement:
    """What `judge` returns: the results, good values to add to the baselines, and
    whether anything was measured at all (a run where every GPU failed was not)."""

    results: list[Result]
    good_values: dict[str, float] = field(default_factory=dict)
    measured: bool = True


Judge = Callable[
    [dict[str, Any], "list[Target]", BenchState, BenchOptions, str], Judgement
]  # (the child's result, targets, state, options, host name)


@record
class Target:
    """A device the benchmark runs on: a GPU (NVML index and its reading) or the CPU."""

    name: str  # "0".."7" or "cpu"
    gpu: GpuReading | None = None


def ratio_verdict(
    value: float, reference: float | None, what: str, warn: float, fail: float
) -> tuple[Status, str] | None:
    """Compare with a reference rate: (status, "0.85x <what>"), None without a reference."""
    if reference is None or reference <= 0:
        return None
    ratio = value / reference
    status = Status.FAIL if ratio < fail else Status.WARN if ratio < warn else Status.OK
    return status, f"{ratio:.2f}x {what}"


def fold(checks: list[tuple[Status, str] | None]) -> tuple[Status, list[str]]:
    """The worst status of several comparisons, and their texts."""
    found = [check for check in checks if check is not None]
    statuses = [status for status, _ in found] or [Status.OK]
    worst = max(statuses, key=lambda status: status.severity)
    return worst, [text for _, text in found]


def peer_and_baseline(
    value: float, peers: float | None, baseline: float | None, thresholds: Thresholds
) -> list[tuple[Status, str] | None]:
    return [
        ratio_verdict(value, peers, "the node's median", thresholds.warn, thresholds.fail),
        ratio_verdict(value, baseline, "its baseline", thresholds.warn, thresholds.fail),
    ]


def select_targets(ctx: CheckContext, options: BenchOptions) -> list[Target] | Result:
    """The devices to run on, or the Result that says why there are none."""
    if options.device == "cpu":
        return [Target("cpu")]
    snapshot = ctx.gpus.snapshot
    if not snapshot.usable:
        reason = snapshot.hung or snapshot.unavailable
        return Result(
            Status.SKIP, NODE, f"no GPU to benchmark: {reason} (--device cpu runs on the CPU)"
        )
    readable = [gpu for gpu in snapshot.gpus if gpu.readable]
    by_index = {gpu.index: gpu for gpu in readable}
    wanted = options.gpus if options.gpus is not None else tuple(sorted(by_index))
    missing = [index for index in wanted if index not in by_index]
    if missing:
        return Result(
            Status.ERROR,
            NODE,
            f"GPU {', '.join(map(str, missing))} not found or not readable through NVML",
        )
    if not wanted:
        return Result(Status.SKIP, NODE, "NVML sees no GPU to benchmark")
    return [Target(str(index), by_index[index]) for index in wanted]


def base_spec(name: str, options: BenchOptions, targets: list[Target]) -> dict[str, Any]:
    """What every child spec holds: the benchmark, the device, the GPUs and the duration."""
    return {
        "benchmark": name,
        "device": options.device,
        "gpus": [int(target.name) for target in targets if target.gpu],
        "duration_s": options.duration_s,
    }


def memory_caps(ctx: CheckContext, targets: list[Target], fraction: float) -> dict[str, int]:
    """The most each GPU's benchmark may allocate: a fraction of its free memory."""
    if not any(target.gpu for target in targets):
        return {}
    try:
        activity: list[GpuActivity] = read_gpu_activity(ctx.nvml)
    except (NvmlUnavailableError, NvmlHungError):
        return {}
    free = {str(gpu.index): gpu.memory_free for gpu in activity if gpu.memory_free}
    return {
        target.name: int(free[target.name] * fraction) for target in targets if target.name in free
    }


def _skip(state: BenchState, refusal: Refusal) -> Result:
    counts = state.count_skip(refusal.reason)
    samples = tuple(Sample(SKIPS, count, {"reason": reason}) for reason, count in counts.items())
    return Result(
        Status.SKIP,
        NODE,
        f"not run: {refusal.text}",
        "" if refusal.reason != "gpu_busy" else "--force runs it anyway on a drained node",
        {"cause": refusal.reason},
        samples,
    )


def run_benchmark(
    ctx: CheckContext, spec: dict[str, Any], targets: list[Target], judge: Judge
) -> list[Result]:
    """Lock, gate, run the child under its deadline and the watch, judge, remember."""
    options = ctx.config.bench
    host = ctx.hostname
    state = BenchState(options.state_dir)
    if importlib.util.find_spec("torch") is None:
        missing = Result(
            Status.ERROR,
            NODE,
            "torch is not installed, and the benchmarks run on it",
            "pip install 'nodecheck[bench]' (or the CUDA build of torch your site uses)",
        )
        # With its last success (0: never), so a fleet sees a node that cannot measure.
        return _with_state_series(state, [missing], host, spec["benchmark"], False)
    key = last_success_key(host, spec["benchmark"])
    try:
        with state.exclusive_run(host):
            results, measured = _locked_run(
                ctx,
                options,
                state,
                spec,
                lambda result: judge(result, targets, state, options, host),
            )
        if not measured:
            results = _with_samples(
                results, LAST_MEASUREMENTS.last(options.state_dir, key, targets)
            )
        skipped = any(result.status is Status.SKIP for result in results)
        results = _with_state_series(state, results, host, spec["benchmark"], skipped)
    except BenchBusyError as err:
        results = [_skip(state, Refusal("busy_lock", f"another benchmark is running ({err})"))]
        results = _with_samples(results, LAST_MEASUREMENTS.last(options.state_dir, key, targets))
        results = _with_state_series(state, results, host, spec["benchmark"], True)
    except OSError as err:
        return [
            Result(
                Status.ERROR,
                NODE,
                f"cannot use the state directory {options.state_dir}: {err}",
                "point --state-dir at a writable directory",
            )
        ]
    if state.problem is not None:
        results.append(Result(Status.WARN, NODE, state.problem))
    return results


def last_success_key(host: str, benchmark: str) -> str:
    # Per host: nodes may share a state directory (NFS).
    return f"{host}/{benchmark}"


def _with_state_series(
    state: BenchState, results: list[Result], host: str, benchmark: str, skipped: bool
) -> list[Result]:
    """The skip counters (a skip carries its own) and the last success ride on every
    benchmark result, so those series never vanish between runs: a run that failed or
    was refused leaves the last success where it was."""
    data = state.read()
    samples: tuple[Sample, ...] = ()
    if not skipped:
        samples += tuple(
            Sample(SKIPS, count, {"reason": reason}) for reason, count in data["skips"].items()
        )
    # 0 until the first measurement: "never" is a value (the fleet reports an agent that
    # has run a benchmark for 3 intervals without measuring once), while a benchmark that
    # does not apply here (all_reduce on one GPU, no GPU at all) never gets this far and
    # exports no last success.
    when = data["last_success"].get(last_success_key(host, benchmark))
    samples += (Sample(LAST_SUCCESS, float(when or 0.0), {"benchmark": benchmark}),)
    return _with_samples(results, samples)


def _with_samples(results: list[Result], samples: tuple[Sample, ...]) -> list[Result]:
    """`samples` added to the first result's."""
    if not samples or not results:
        return results
    first = results[0]
    return [dataclasses.replace(first, samples=first.samples + samples), *results[1:]]


def _locked_run(
    ctx: CheckContext,
    options: BenchOptions,
    state: BenchState,
    spec: dict[str, Any],
    judge: Callable[[dict[str, Any]], Judgement],
) -> tuple[list[Result], bool]:
    """The run's results, and whether it measured."""
    if not options.force:
        refusal = check_gate(ctx, options)
        if refusal is not None:
            return [_skip(state, refusal)], False
    stop = threading.Event()
    stopped: list[Refusal] = []

    def on_foreign(refusal: Refusal) -> None:
        stopped.append(refusal)
        stop.set()

    watch = ForeignProcessWatch(ctx, options, on_foreign)

    def progress(fraction: float) -> None:
        if options.on_progress is not None:
            options.on_progress(spec["benchmark"], fraction)

    try:
        outcome = run_child(
            spec,
            options.child_timeout_s,
            on_start=watch.start,
            on_progress=progress,
            stop=stop,
        )
    finally:
        watch.close()
    if stopped:
        return [_skip(state, stopped[0])], False
    if outcome.result is None:
        return [
            Result(
                Status.ERROR,
                NODE,
                f"{spec['benchmark']} failed: {outcome.error}",
                details={"cause": outcome.cause, "stderr": outcome.stderr_tail[-500:]},
            )
        ], False
    ended = time.time()
    judgement = judge(outcome.result)
    if judgement.measured:
        key = last_success_key(ctx.hostname, spec["benchmark"])
        state.record_success(key, ended)
        measured = tuple(sample for result in judgement.results for sample in result.samples)
        LAST_MEASUREMENTS.keep(options.state_dir, key, measured)
    if judgement.good_values:
        state.record(judgement.good_values, options.baseline_runs)
    return judgement.results, judgement.measured
