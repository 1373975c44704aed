"""The GPU's PCIe link as NVML sees it, and its replay rate.

NVML's maximum is the lower of the GPU's and the slot's, so a Gen5 GPU in a
Gen4 slot is not flagged for being in a Gen4 slot. Width below the maximum is
a fault at any time (a bad riser or seating). Generation below the maximum is
normal while the GPU idles, since GPUs lower their link speed to save power
(docs/hardware.md §3), so it warns only while the GPU is busy.

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
from nodecheck.checks.result import MetricSpec, Result, Sample, Status


def _gauge(name: str, help_text: str) -> MetricSpec:
    return MetricSpec(name, "gauge", help_text, GPU_LABELS)


GENERATION = _gauge(
    "nodecheck_gpu_pcie_link_generation",
    "Current PCIe generation (nvmlDeviceGetCurrPcieLinkGeneration)",
)
MAX_GENERATION = _gauge(
    "nodecheck_gpu_pcie_link_max_generation",
    "Highest PCIe generation of GPU and slot (nvmlDeviceGetMaxPcieLinkGeneration)",
)
WIDTH = _gauge(
    "nodecheck_gpu_pcie_link_width",
    "Current PCIe link width in lanes (nvmlDeviceGetCurrPcieLinkWidth)",
)
MAX_WIDTH = _gauge(
    "nodecheck_gpu_pcie_link_max_width",
    "Maximum PCIe link width in lanes (nvmlDeviceGetMaxPcieLinkWidth)",
)
REPLAYS = MetricSpec(
    "nodecheck_gpu_pcie_replays_total",
    "counter",
    "PCIe link-level replays (NVML_FI_DEV_PCIE_REPLAY_COUNTER)",
    GPU_LABELS,
)

REPLAYS_PER_MINUTE_WARN = 8.0  # DCGM_LIMIT_MAX_PCIREPLAY_RATE
RESEAT = "drain the node and reseat the GPU or its riser; if it persists, RMA"


def _busy(gpu: GpuReading) -> bool:
    return bool(gpu.utilization_pct) or bool(gpu.processes)


def judge_pcie(gpu: GpuReading, previous: GpuReading | None) -> Verdict:
    verdict = Verdict("PCIe link at full width")
    labels = gpu.labels()
    link = gpu.pcie
    if link is not None:
        for spec, value in (
            (GENERATION, link.generation),
            (MAX_GENERATION, link.max_generation),
            (WIDTH, link.width),
            (MAX_WIDTH, link.max_width),
        ):
            if value is not None:
                verdict.samples.append(Sample(spec, value, labels))
        verdict.details["link"] = vars(link)
        shown = (
            f"Gen{link.generation} x{link.width} (max Gen{link.max_generation} x{link.max_width})"
        )
        verdict.ok_summary = f"PCIe {shown}"
        if link.width is not None and link.max_width is not None and link.width < link.max_width:
            verdict.add(
                Status.FAIL,
                f"PCIe link trained at x{link.width} of x{link.max_width}: {shown}",
                RESEAT,
            )
        gen, max_gen = link.generation, link.max_generation
        if gen is not None and max_gen is not None and gen < max_gen:
            if _busy(gpu):
                verdict.add(
                    Status.WARN, f"PCIe Gen{gen} of Gen{max_gen} while the GPU is busy", RESEAT
                )
            else:
                verdict.add(Status.OK, "the link is below its top generation while the GPU idles")
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
QUERIES = ("pcie", "field_values", "utilization", "processes", "pcie_replays")


@register("gpu_pcie", interval_s=60, timeout_s=30, needs=("gpus",))
def check_gpu_pcie(ctx: CheckContext) -> Iterator[Result]:
    """NVML's PCIe generation and width per GPU, and the replay rate."""
    yield from per_gpu_results(ctx, judge_pcie, QUERIES)
