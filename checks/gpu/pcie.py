"""The GPU's PCIe replay rate, with its link as NVML sees it for evidence.

The link's width and speed are judged once, by pcie_link (sysfs, which also sees the
switch ports above the GPU); NVML's generation and width (its maximum the lower of the
GPU's and the slot's) are exported and kept in the details beside that judgement.

Replays are link-level retransmissions. DCGM's limit is 8 per minute
("the maximum recommended by RM", dcgm_gpu_hardware_limits.h); a rate needs
two readings, so a one-shot run exports the counter and judges nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.gpu import GpuReading, counter_rate
from nodecheck.checks.per_gpu import GPU_LABELS, Verdict, per_gpu_results
from nodecheck.checks.registry import register
from nodecheck.checks.result import Action, FaultClass, MetricSpec, Result, Sample, Status

REPLAYS = MetricSpec(
    "nodecheck_gpu_pcie_replays_total",
    "counter",
    "PCIe link-level replays (NVML_FI_DEV_PCIE_REPLAY_COUNTER)",
    GPU_LABELS,
)

REPLAYS_PER_MINUTE_WARN = 8.0  # DCGM_LIMIT_MAX_PCIREPLAY_RATE


def judge_pcie(gpu: GpuReading, previous: GpuReading | None) -> Verdict:
    """The replay rate. NVML's generation and width are evidence here (details only, not
    judged nor exported): pcie_link owns the link's judgement and its metrics, from
    sysfs, for GPUs, NICs and the switch ports between them alike, so one link is judged
    and exported once."""
    verdict = Verdict("PCIe replays within limits")
    labels = gpu.labels()
    link = gpu.pcie
    if link is not None:
        verdict.details["link"] = vars(link)
        shown = (
            f"Gen{link.generation} x{link.width} (max Gen{link.max_generation} x{link.max_width})"
        )
        verdict.ok_summary = f"PCIe replays within limits; NVML link {shown}"
    elif gpu.pcie_replays is None:
        return Verdict("NVML reports no PCIe link state for this GPU", not_applicable=True)
    if gpu.pcie_replays is not None:
        verdict.samples.append(Sample(REPLAYS, gpu.pcie_replays, labels))
    if previous is not None:
        rate = counter_rate(gpu.pcie_replays, previous.pcie_replays, gpu.read_at - previous.read_at)
        if rate is not None:
            per_minute = rate * 60
            verdict.details["replays_per_minute"] = per_minute
            if per_minute > REPLAYS_PER_MINUTE_WARN:
                verdict.add(
                    Status.WARN,
                    f"{per_minute:.0f} PCIe replays per minute (limit {REPLAYS_PER_MINUTE_WARN:g})",
                    "a marginal link: reseat the GPU or riser at the next maintenance",
                )
    return verdict


# The reads this check relies on; one that fails is reported, never passed over.
QUERIES = ("pcie", "field_values", "pcie_replays")


@register(
    "gpu_pcie",
    fault_class=FaultClass.GPU_PERFORMANCE,
    action=Action.INSPECT_HARDWARE,
    interval_s=60,
    timeout_s=30,
    needs=("gpus",),
)
def check_gpu_pcie(ctx: CheckContext) -> Iterator[Result]:
    """PCIe replays per GPU (NVML), with NVML's link generation and width as evidence."""
    yield from per_gpu_results(ctx, judge_pcie, QUERIES)
