"""GPU memory errors: ECC counts, row remapping, and retired pages on older GPUs.

Thresholds (docs/hardware.md §9): a volatile uncorrectable ECC error needs a GPU
reset (stas00/ml-engineering), but the driver's recovery action says how soon:
one pending fails, none warns (reset when idle; see _judge_uncorrectable). A
row remapping that *failed* makes the GPU an RMA candidate, one that is
*pending* takes effect at the next reset
(NVML docs: "A reset will be required to actually remap the row"). Page
retirement, the pre-Ampere mechanism, uses DCGM's limits from
dcgm_gpu_hardware_limits.h: 15 retired pages is a warning, 60 the maximum.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.gpu.state import recovery_action
from nodecheck.checks.node.gpu import GpuReading
from nodecheck.checks.per_gpu import GPU_LABELS, Verdict, per_gpu_results
from nodecheck.checks.registry import register
from nodecheck.checks.result import Action, FaultClass, MetricSpec, Result, Sample, Status


def _counter(name: str, help_text: str, labels: tuple[str, ...] = GPU_LABELS) -> MetricSpec:
    return MetricSpec(name, "counter", help_text, labels)


def _gauge(name: str, help_text: str, labels: tuple[str, ...] = GPU_LABELS) -> MetricSpec:
    return MetricSpec(name, "gauge", help_text, labels)


ECC_SPECS = {
    "volatile_corrected": _counter(
        "nodecheck_gpu_ecc_volatile_corrected_errors_total",
        "Corrected ECC errors since the driver loaded (nvmlDeviceGetTotalEccErrors, volatile)",
    ),
    "volatile_uncorrected": _counter(
        "nodecheck_gpu_ecc_volatile_uncorrected_errors_total",
        "Uncorrected ECC errors since the driver loaded (nvmlDeviceGetTotalEccErrors, volatile)",
    ),
    "aggregate_corrected": _counter(
        "nodecheck_gpu_ecc_aggregate_corrected_errors_total",
        "Corrected ECC errors over the GPU's life (nvmlDeviceGetTotalEccErrors, aggregate)",
    ),
    "aggregate_uncorrected": _counter(
        "nodecheck_gpu_ecc_aggregate_uncorrected_errors_total",
        "Uncorrected ECC errors over the GPU's life (nvmlDeviceGetTotalEccErrors, aggregate)",
    ),
}
ECC_ENABLED = _gauge("nodecheck_gpu_ecc_enabled", "1 when ECC is on (nvmlDeviceGetEccMode)")
REMAPPED_CORRECTABLE = _counter(
    "nodecheck_gpu_remapped_rows_correctable_total",
    "Rows remapped for correctable errors (nvmlDeviceGetRemappedRows)",
)
REMAPPED_UNCORRECTABLE = _counter(
    "nodecheck_gpu_remapped_rows_uncorrectable_total",
    "Rows remapped for uncorrectable errors (nvmlDeviceGetRemappedRows)",
)
REMAP_PENDING = _gauge(
    "nodecheck_gpu_row_remap_pending", "1 when a row remapping waits for a GPU reset"
)
REMAP_FAILED = _gauge(
    "nodecheck_gpu_row_remap_failed", "1 when a row remapping has ever failed on this GPU"
)
RETIRED = _counter(
    "nodecheck_gpu_retired_pages_total",
    "Memory pages retired, by cause (nvmlDeviceGetRetiredPages; GPUs before Ampere)",
    (*GPU_LABELS, "cause"),
)
RETIRED_PENDING = _gauge(
    "nodecheck_gpu_retired_pages_pending",
    "1 when a page retirement waits for a reset (nvmlDeviceGetRetiredPagesPendingStatus)",
)

RETIRED_PAGES_WARN = 15  # DCGM_LIMIT_MAX_RETIRED_PAGES_SOFT_LIMIT
RETIRED_PAGES_FAIL = 60  # DCGM_LIMIT_MAX_RETIRED_PAGES
# nvidia-smi -i takes a PCI bus id as well as an index.
RESET = "reset the GPU when it is idle (nvidia-smi -r -i {bus_id}), or drain and reboot"


def judge_memory(gpu: GpuReading, previous: GpuReading | None) -> Verdict:
    verdict = Verdict("no memory errors")
    _judge_aggregate_counts(gpu, previous, verdict)
    labels = gpu.labels()
    if gpu.ecc_mode is not None:
        current, pending = gpu.ecc_mode
        verdict.samples.append(Sample(ECC_ENABLED, int(current), labels))
        if not current:
            ecc_on = "turn ECC on (nvidia-smi -e 1) and reboot"
            verdict.add(Status.WARN, "ECC is off", ecc_on, Action.FIX_NODE_CONFIG)
        if current != pending:
            verdict.add(
                Status.WARN,
                f"ECC mode change to {'on' if pending else 'off'} waits for a reboot",
                "reboot the node to apply the ECC mode",
                Action.REBOOT,
            )
    elif gpu.remapped_rows is None and gpu.retired_pages is None:
        # GeForce and some workstation GPUs: no ECC, nothing that counts errors.
        return Verdict("no ECC or memory error reporting on this GPU", not_applicable=True)
    else:
        verdict.add(Status.OK, "no ECC on this GPU")
    for name, spec in ECC_SPECS.items():
        value = getattr(gpu.ecc, name)
        if value is not None:
            verdict.samples.append(Sample(spec, value, labels))
    volatile = gpu.ecc.volatile_uncorrected
    if volatile:
        _judge_uncorrectable(gpu, volatile, verdict)
    elif gpu.ecc.aggregate_uncorrected:
        verdict.add(
            Status.OK, f"{gpu.ecc.aggregate_uncorrected} uncorrectable ECC error(s) in its life"
        )
    _judge_rows(gpu, verdict, labels)
    _judge_pages(gpu, verdict, labels)
    return verdict


def _judge_uncorrectable(gpu: GpuReading, volatile: int, verdict: Verdict) -> None:
    """Volatile uncorrectable errors: the count stays above 0 until a reset, so it alone
    does not say the GPU must stop. The driver's recovery action does (Hopper and later;
    nvmlDeviceGpuRecoveryAction_t in nvml.h): any action pending fails, with that action, as
    gpu_state does. Without one, running and new work may go on
    (NVIDIA's GPU memory error management, https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/:
    with a remap pending, "running and new workloads may continue"): reset when idle, as
    for a pending row remap."""
    summary = f"{volatile} uncorrectable ECC error(s) since the driver loaded"
    action = gpu.recovery_action
    if action is not None and action != 0:
        verdict.add(
            Status.FAIL,
            f"{summary}; the driver asks for recovery action {action}",
            "drain the node and follow the recovery action (nodecheck check --only gpu_state)",
            recovery_action(action),
        )
        return
    if action is None:
        summary += " (the driver reports no recovery action for this GPU)"
    else:
        summary += "; the driver asks for no recovery action: running work may continue"
    verdict.add(
        Status.WARN,
        summary,
        f"{RESET.format(bus_id=gpu.bus_id)}, to clear the count and apply any pending "
        "row remap; RMA the GPU if the errors return",
    )


def _judge_aggregate_counts(gpu: GpuReading, previous: GpuReading | None, verdict: Verdict) -> None:
    """Aggregate ECC counts live in the InfoROM for the GPU's life: they never go down
    (volatile ones restart at a driver reload or GPU reset, so those may). A lower
    aggregate count than the last reading is a broken answer: `error`, not a pass."""
    if previous is None:
        return
    for name, what in (
        ("aggregate_corrected", "aggregate corrected"),
        ("aggregate_uncorrected", "aggregate uncorrectable"),
    ):
        now, before = getattr(gpu.ecc, name), getattr(previous.ecc, name)
        if now is not None and before is not None and now < before:
            verdict.add(
                Status.ERROR,
                f"NVML reported {what} ECC count {now}, down from {before} in the previous "
                "reading: implausible (a lifetime count never goes down)",
                "check the GPU with nvidia-smi -q -d ECC; an InfoROM that loses counts needs "
                "the vendor's attention",
                Action.CONTACT_SUPPORT,
            )


def _judge_rows(gpu: GpuReading, verdict: Verdict, labels: dict[str, str]) -> None:
    rows = gpu.remapped_rows
    if rows is None:
        return
    verdict.samples += [
        Sample(REMAPPED_CORRECTABLE, rows.correctable, labels),
        Sample(REMAPPED_UNCORRECTABLE, rows.uncorrectable, labels),
        Sample(REMAP_PENDING, int(rows.pending), labels),
        Sample(REMAP_FAILED, int(rows.failure), labels),
    ]
    verdict.details["remapped_rows"] = {
        "correctable": rows.correctable,
        "uncorrectable": rows.uncorrectable,
        "pending": rows.pending,
        "failure": rows.failure,
    }
    if rows.failure:
        verdict.add(
            Status.FAIL,
            "a row remapping failed: the GPU has run out of spare rows",
            "drain the node; the GPU is an RMA candidate (NVIDIA: remapping failure)",
            Action.CONTACT_SUPPORT,
        )
    if rows.pending:
        verdict.add(Status.WARN, "a row remapping is pending", RESET.format(bus_id=gpu.bus_id))


def _judge_pages(gpu: GpuReading, verdict: Verdict, labels: dict[str, str]) -> None:
    pages = gpu.retired_pages
    if pages is None:
        return
    verdict.samples += [
        Sample(RETIRED, pages.single_bit, {**labels, "cause": "multiple_single_bit_ecc"}),
        Sample(RETIRED, pages.double_bit, {**labels, "cause": "double_bit_ecc"}),
    ]
    if pages.pending is not None:
        verdict.samples.append(Sample(RETIRED_PENDING, int(pages.pending), labels))
    total = pages.single_bit + pages.double_bit
    if total >= RETIRED_PAGES_FAIL:
        verdict.add(
            Status.FAIL,
            f"{total} retired pages (limit {RETIRED_PAGES_FAIL})",
            "drain the node; the GPU is an RMA candidate",
            Action.CONTACT_SUPPORT,
        )
    elif total >= RETIRED_PAGES_WARN:
        watch = "watch the count; RMA at 60"
        verdict.add(Status.WARN, f"{total} retired pages", watch, Action.INVESTIGATE)
    if pages.pending:
        verdict.add(Status.WARN, "a page retirement is pending", RESET.format(bus_id=gpu.bus_id))


# The reads this check relies on; one that fails is reported, never passed over.
QUERIES = ("ecc_mode", "ecc", "remapped_rows", "retired_pages", "retired_pages_pending")


@register(
    "gpu_memory_errors",
    fault_class=FaultClass.GPU_HARDWARE,
    action=Action.RESET_GPU,
    gate=True,
    interval_s=60,
    timeout_s=30,
    needs=("gpus",),
)
def check_gpu_memory_errors(ctx: CheckContext) -> Iterator[Result]:
    """ECC errors, row remapping and retired pages per GPU."""
    yield from per_gpu_results(ctx, judge_memory, QUERIES)
