"""GPU clock throttling, judged by how long each reason held the clocks down.

NVML counts, per reason, the nanoseconds the clocks were held down
(NVML_FI_DEV_CLOCKS_EVENT_REASON_*). Between two readings that gives the share
of the interval each reason was active: a fair verdict, where a single sample
of the reason bits is not. DCGM's power watch fails any GPU whose power
violation time is above zero, which fires on every loaded GPU (DCGM #285).
Here (docs/hardware.md §10):

- HW slowdown, HW thermal slowdown and HW power brake cut clocks by half or
  more: a fault. Warn at any share, fail at 1 % of the interval or more.
- SW thermal slowdown: warn at 10 %.
- SW power cap and sync boost: normal under load; exported, never judged
  (a lowered power limit is gpu_state's business).

With no earlier reading (a one-shot run), only the reason bits of this moment
are known: an active hardware reason is a warning that says so.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.gpu import GpuReading, counter_rate
from nodecheck.checks.per_gpu import GPU_LABELS, Verdict, per_gpu_results
from nodecheck.checks.registry import register
from nodecheck.checks.result import Action, FaultClass, MetricSpec, Result, Sample, Status

REASON_LABELS = (*GPU_LABELS, "reason")
ACTIVE = MetricSpec(
    "nodecheck_gpu_clock_event_reason_active",
    "gauge",
    "1 while this clock event reason holds the clocks down "
    "(nvmlDeviceGetCurrentClocksEventReasons)",
    REASON_LABELS,
)
SECONDS = MetricSpec(
    "nodecheck_gpu_clock_event_seconds_total",
    "counter",
    "Time this reason held the clocks down since the driver loaded "
    "(NVML_FI_DEV_CLOCKS_EVENT_REASON_* field values)",
    REASON_LABELS,
)
SHARE = MetricSpec(
    "nodecheck_gpu_clock_event_ratio",
    "gauge",
    "Share of the last interval this reason held the clocks down (0-1)",
    REASON_LABELS,
)

# Bits of nvmlClocksEventReason* (nvml.h) and the counter of each, where one exists.
REASONS: dict[str, tuple[int, str | None]] = {
    "gpu_idle": (0x001, None),
    "applications_clocks_setting": (0x002, None),
    "sw_power_cap": (0x004, "sw_power_cap"),
    "hw_slowdown": (0x008, None),
    "sync_boost": (0x010, "sync_boost"),
    "sw_thermal": (0x020, "sw_thermal"),
    "hw_thermal": (0x040, "hw_thermal"),
    "hw_power_brake": (0x080, "hw_power_brake"),
    "display_clock_setting": (0x100, None),
}
HARDWARE = ("hw_slowdown", "hw_thermal", "hw_power_brake")
HARDWARE_FAIL_SHARE = 0.01
SW_THERMAL_WARN_SHARE = 0.10
HARDWARE_REMEDY = (
    "check the GPU's cooling (fans, airflow, inlet temperature) and the node's power "
    "supplies and BMC log (a power brake is asserted from outside the GPU)"
)


def judge_throttle(gpu: GpuReading, previous: GpuReading | None) -> Verdict:
    reasons = gpu.clock_event_reasons
    if reasons is None and not gpu.throttle_ns:
        return Verdict("NVML reports no clock event reasons for this GPU", not_applicable=True)
    verdict = Verdict("no clock throttling")
    labels = gpu.labels()
    active = [name for name, (bit, _) in REASONS.items() if reasons is not None and reasons & bit]
    if reasons is not None:
        for name, (bit, _) in REASONS.items():
            verdict.samples.append(
                Sample(ACTIVE, int(bool(reasons & bit)), {**labels, "reason": name})
            )
    for counter, nanoseconds in gpu.throttle_ns.items():
        verdict.samples.append(Sample(SECONDS, nanoseconds / 1e9, {**labels, "reason": counter}))
    verdict.details["active_reasons"] = active

    shares, implausible = _shares(gpu, previous)
    for problem in implausible:
        verdict.add(Status.ERROR, problem)
    for counter, share in shares.items():
        verdict.samples.append(Sample(SHARE, share, {**labels, "reason": counter}))
    verdict.details["shares"] = shares
    judged_by_time = set()
    for name in HARDWARE:
        if name in shares:
            judged_by_time.add(name)
            share = shares[name]
            if share >= HARDWARE_FAIL_SHARE:
                verdict.add(
                    Status.FAIL,
                    f"{name} held the clocks down {share:.0%} of the time",
                    HARDWARE_REMEDY,
                )
            elif share > 0:
                verdict.add(
                    Status.WARN,
                    f"{name} held the clocks down {share:.1%} of the time",
                    HARDWARE_REMEDY,
                )
    if shares.get("sw_thermal", 0.0) >= SW_THERMAL_WARN_SHARE:
        judged_by_time.add("sw_thermal")
        verdict.add(
            Status.WARN,
            f"sw_thermal held the clocks down {shares['sw_thermal']:.0%} of the time",
            "check the GPU's cooling and the memory temperature",
        )
    unjudged = [name for name in active if name in HARDWARE and name not in judged_by_time]
    if unjudged:
        # Without two readings of its counter a reason is one sample: a warning.
        # hw_slowdown has no counter of its own (it is the union of the HW
        # reasons), so it is never more than that.
        untimed = [name for name in unjudged if REASONS[name][1] is None or previous is None]
        note = " (one sample; NVML's time counters judge how long)" if untimed else ""
        verdict.add(
            Status.WARN,
            f"hardware slowdown active now: {', '.join(unjudged)}{note}",
            HARDWARE_REMEDY,
        )
    normal = [name for name in active if name in ("sw_power_cap", "sync_boost", "sw_thermal")]
    if normal:
        verdict.add(Status.OK, f"active now: {', '.join(normal)}")
    if not shares and previous is None and gpu.throttle_ns:
        verdict.add(Status.OK, "rates need a second reading")
    return verdict


# The counters and read_at are taken a few milliseconds apart; a counter that gained
# more than the interval plus this slack held the clocks down longer than time passed.
SHARE_SLACK = 1.1
SHARE_SLACK_S = 0.05


def _shares(gpu: GpuReading, previous: GpuReading | None) -> tuple[dict[str, float], list[str]]:
    """Share of the interval since `previous` each counted reason was active (0-1), and
    the counters that gained more time than passed (nonsense, never judged)."""
    if previous is None:
        return {}, []
    seconds = gpu.read_at - previous.read_at
    shares = {}
    implausible = []
    for counter, nanoseconds in gpu.throttle_ns.items():
        rate = counter_rate(nanoseconds, previous.throttle_ns.get(counter), seconds)
        if rate is None:
            continue
        held_s = rate * seconds / 1e9
        if held_s > seconds * SHARE_SLACK + SHARE_SLACK_S:
            implausible.append(
                f"NVML reported {counter} throttle time of {held_s:.2f} s over {seconds:.2f} s "
                "between readings: implausible"
            )
            continue
        shares[counter] = min(rate / 1e9, 1.0)
    return shares, implausible


# The reads this check relies on; one that fails is reported, never passed over.
QUERIES = ("clock_event_reasons", "field_values", "throttle_time")


@register(
    "gpu_throttle",
    fault_class=FaultClass.GPU_PERFORMANCE,
    action=Action.INVESTIGATE,
    interval_s=30,
    timeout_s=30,
    needs=("gpus",),
)
def check_gpu_throttle(ctx: CheckContext) -> Iterator[Result]:
    """Clock throttling per GPU, by the share of time each reason was active."""
    yield from per_gpu_results(ctx, judge_throttle, QUERIES)
