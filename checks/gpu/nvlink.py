"""NVLink: links expected vs active, and error counter rates.

An inactive link on an NVLink GPU takes bandwidth out of every all_reduce
(NCCL routes around it, slowly), so it fails. Expected links per model come
from docs/hardware.md §11 (A100 SXM 12, H100/H200/B200 SXM 18); for other models
every link NVML lists is expected. Error rates follow DCGM's limits
(dcgm_gpu_hardware_limits.h): any new replay or recovery error is worth a look,
CRC errors only at 100 per second or more ("RM has informed us that CRC errors
only matter at rates of 100+ per second").
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.gpu import GpuReading, counter_rate
from nodecheck.checks.per_gpu import GPU_LABELS, Verdict, per_gpu_results
from nodecheck.checks.registry import register
from nodecheck.checks.result import Action, FaultClass, MetricSpec, Result, Sample, Status

ACTIVE_LINKS = MetricSpec(
    "nodecheck_gpu_nvlink_links_active",
    "gauge",
    "Active NVLinks (nvmlDeviceGetNvLinkState)",
    GPU_LABELS,
)
EXPECTED_LINKS = MetricSpec(
    "nodecheck_gpu_nvlink_links_expected",
    "gauge",
    "NVLinks this GPU model should have active",
    GPU_LABELS,
)
LINK_ACTIVE = MetricSpec(
    "nodecheck_gpu_nvlink_link_active",
    "gauge",
    "1 when this NVLink is active",
    (*GPU_LABELS, "nvlink"),
)
ERRORS = MetricSpec(
    "nodecheck_gpu_nvlink_errors_total",
    "counter",
    "NVLink errors summed over links, by type (NVML_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL)",
    (*GPU_LABELS, "error"),
)

# Model name pattern -> NVLinks the GPU has (docs/hardware.md §11, MLE NVLink table).
EXPECTED_BY_MODEL = (
    (re.compile(r"A100-SXM", re.IGNORECASE), 12),
    (re.compile(r"H100 80GB HBM3|H100 SXM|H200(?! NVL)|B200", re.IGNORECASE), 18),
)
CRC_PER_SECOND_WARN = 100.0  # DCGM_LIMIT_MAX_LWLINK_CRC_ERROR
RESET = (
    "drain the node, check `nvidia-smi nvlink -s` and `-e`, and reset the GPU; RMA if it persists"
)


def expected_links(model: str, present: int) -> int:
    for pattern, links in EXPECTED_BY_MODEL:
        if pattern.search(model):
            return links
    return present


def judge_nvlink(gpu: GpuReading, previous: GpuReading | None, *, peers: int) -> Verdict:
    labels = gpu.labels()
    states = gpu.nvlink_active or []
    active = sum(states)
    expected = expected_links(gpu.model, len(states))
    verdict = Verdict(f"{active} of {expected} NVLinks active")
    verdict.details.update({"active": active, "expected": expected, "links": len(states)})
    verdict.samples += [
        Sample(ACTIVE_LINKS, active, labels),
        Sample(EXPECTED_LINKS, expected, labels),
        *(
            Sample(LINK_ACTIVE, int(up), {**labels, "nvlink": str(i)})
            for i, up in enumerate(states)
        ),
        *(Sample(ERRORS, n, {**labels, "error": kind}) for kind, n in gpu.nvlink_errors.items()),
    ]
    if active < expected:
        down = [str(i) for i, up in enumerate(states) if not up]
        where = f" (link {', '.join(down)} inactive)" if down else ""
        if peers == 1 and active == 0:
            verdict.add(Status.OK, "no NVLink peer: the only GPU NVML sees")
        else:
            verdict.add(Status.FAIL, f"{active} of {expected} NVLinks active{where}", RESET)
    if previous is not None:
        _judge_rates(gpu, previous, verdict)
    return verdict


def _judge_rates(gpu: GpuReading, previous: GpuReading, verdict: Verdict) -> None:
    seconds = gpu.read_at - previous.read_at
    rates = {
        kind: rate
        for kind, count in gpu.nvlink_errors.items()
        if (rate := counter_rate(count, previous.nvlink_errors.get(kind), seconds)) is not None
    }
    verdict.details["errors_per_second"] = rates
    crc = rates.get("crc_flit", 0.0) + rates.get("crc_data", 0.0)
    if crc >= CRC_PER_SECOND_WARN:
        verdict.add(Status.WARN, f"{crc:.0f} NVLink CRC errors per second", RESET)
    for kind in ("replay", "recovery"):
        if rates.get(kind, 0.0) > 0:
            new = gpu.nvlink_errors[kind] - previous.nvlink_errors[kind]
            verdict.add(Status.WARN, f"{new} new NVLink {kind} error(s) in {seconds:.0f} s", RESET)


# The reads this check relies on; one that fails is reported, never passed over.
QUERIES = ("nvlink", "field_values", "nvlink_errors")


@register(
    "gpu_nvlink",
    fault_class=FaultClass.GPU_HARDWARE,
    action=Action.RESET_GPU,
    interval_s=60,
    timeout_s=30,
    needs=("gpus",),
)
def check_gpu_nvlink(ctx: CheckContext) -> Iterator[Result]:
    """NVLinks expected vs active per GPU, and their error rates."""
    gpus = ctx.gpus.snapshot.gpus
    peers = len(gpus)

    def judge(gpu: GpuReading, previous: GpuReading | None) -> Verdict:
        if gpu.nvlink_active is None:
            return Verdict("no NVLink on this GPU", not_applicable=True)
        return judge_nvlink(gpu, previous, peers=peers)

    yield from per_gpu_results(ctx, judge, QUERIES)
