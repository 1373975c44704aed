"""GPU count: GPUs on the PCI bus, GPUs NVML sees, and the count expected.

The classic failure is a GPU that fell off the bus (XID 79): it is still in
sysfs (and lspci) but NVML no longer enumerates it, or answers GPU_IS_LOST
for it (hardware.md §5.8). Joining NVML's view with the sysfs inventory by PCI
bus id names the missing GPU instead of just counting one short.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.nvml import NvmlUnavailableError
from nodecheck.checks.per_gpu import GPU_LABELS, LOST_REMEDY, nvml_unavailable_result
from nodecheck.checks.registry import register
from nodecheck.checks.result import NODE, MetricSpec, Result, Sample, Status, gpu_subject

ON_BUS = MetricSpec(
    "nodecheck_gpus_on_pci_bus",
    "gauge",
    "NVIDIA GPUs on the PCI bus (<sysfs>/bus/pci/devices, vendor 0x10de, display class)",
)
VISIBLE = MetricSpec(
    "nodecheck_gpus_visible_to_nvml", "gauge", "GPUs NVML enumerates (nvmlDeviceGetCount)"
)
EXPECTED = MetricSpec("nodecheck_gpus_expected", "gauge", "GPUs this node should have (configured)")
INFO = MetricSpec(
    "nodecheck_gpu_info",
    "gauge",
    "One series per GPU NVML sees, value 1 (nvmlDeviceGetName, GetUUID, GetVbiosVersion)",
    (*GPU_LABELS, "uuid", "vbios", "driver_version"),
)

MISSING_REMEDY = (
    "NVML does not see this GPU: look for XID 79 in the kernel log; drain the node and "
    "reboot it; if the GPU stays missing, reseat or RMA it"
)


@register("gpu_count", interval_s=60, timeout_s=15)
def check_gpu_count(ctx: CheckContext) -> Iterator[Result]:
    """GPUs on the PCI bus, GPUs NVML sees, and the expected count."""
    on_bus = sorted(gpu.bdf for gpu in ctx.inventory.gpus)
    samples = [Sample(ON_BUS, len(on_bus))]
    if ctx.expected_gpus is not None:
        samples.append(Sample(EXPECTED, ctx.expected_gpus))
    unavailable = nvml_unavailable_result(ctx)
    if unavailable is not None:
        yield _without_nvml(ctx, on_bus, unavailable, samples)
        return
    snapshot = ctx.gpus.snapshot
    seen = snapshot.by_bus_id()
    samples.append(Sample(VISIBLE, len(snapshot.gpus)))
    for gpu in snapshot.gpus:
        labels = {
            **gpu.labels(),
            "uuid": gpu.uuid or "",
            "vbios": gpu.vbios or "",
            "driver_version": snapshot.driver_version or "",
        }
        samples.append(Sample(INFO, 1, labels))
    for bus_id in on_bus:
        if bus_id not in seen:
            yield Result(
                Status.FAIL,
                gpu_subject(bus_id),
                "on the PCI bus but not enumerated by NVML (fallen off the bus?)",
                MISSING_REMEDY,
            )
    for gpu in snapshot.gpus:
        if gpu.lost is not None:
            yield Result(
                Status.FAIL,
                gpu_subject(gpu.bus_id or f"index {gpu.index}"),
                f"NVML: {gpu.lost}",
                LOST_REMEDY,
            )
        elif gpu.bus_id is not None and gpu.bus_id not in on_bus:
            # NVML answers for the running machine; a --sysfs-root capture of
            # another node is the usual cause.
            yield Result(
                Status.WARN,
                gpu_subject(gpu.bus_id),
                "NVML sees this GPU but it is not on the PCI bus read from sysfs",
                "check that --sysfs-root is this node's sysfs",
            )
    yield _node_result(ctx, len(on_bus), len(snapshot.gpus), samples)


def _node_result(ctx: CheckContext, on_bus: int, visible: int, samples: list[Sample]) -> Result:
    expected = ctx.expected_gpus
    counts = f"{visible} GPU(s) visible to NVML, {on_bus} on the PCI bus"
    details = {"on_pci_bus": on_bus, "visible_to_nvml": visible, "expected": expected}
    if expected is not None:
        counts += f", {expected} expected"
        if visible < expected:
            return Result(
                Status.FAIL,
                NODE,
                f"{expected - visible} GPU(s) missing: {counts}",
                "drain the node; reboot it and check the kernel log for XID 79 and the "
                "BMC for GPU power faults",
                details,
                tuple(samples),
            )
    if visible < on_bus:
        return Result(
            Status.FAIL,
            NODE,
            f"{on_bus - visible} GPU(s) on the bus are not usable: {counts}",
            "drain the node; the results for each missing GPU say what to do",
            details,
            tuple(samples),
        )
    if expected is not None and visible > expected:
        return Result(
            Status.WARN,
            NODE,
            f"more GPUs than expected: {counts}",
            "correct the expected GPU count in the configuration",
            details,
            tuple(samples),
        )
    return Result(Status.OK, NODE, counts, details=details, samples=tuple(samples))


def _without_nvml(
    ctx: CheckContext, on_bus: list[str], unavailable: Result, samples: list[Sample]
) -> Result:
    """NVML cannot answer. With no GPU on the bus that is a CPU-only node: skip."""
    cause = unavailable.details.get("cause")
    expected = ctx.expected_gpus
    if not on_bus and not expected:
        return Result(
            Status.SKIP,
            NODE,
            f"no GPU on the PCI bus; {unavailable.summary}",
            samples=tuple(samples),
        )
    what = f"{len(on_bus)} GPU(s) on the PCI bus"
    if expected is not None:
        what += f", {expected} expected"
    if cause == NvmlUnavailableError.DRIVER_NOT_LOADED:
        return Result(
            Status.FAIL,
            NODE,
            f"{what}, but {unavailable.summary}",
            "load the driver (modprobe nvidia) and look in the kernel log for why it failed",
            {"cause": cause},
            tuple(samples),
        )
    if cause == NvmlUnavailableError.VERSION_MISMATCH:
        return Result(
            Status.FAIL,
            NODE,
            f"{what}, but {unavailable.summary}",
            "a driver upgrade is half done: reboot the node (or reload the nvidia modules)",
            {"cause": cause},
            tuple(samples),
        )
    remedy = (
        "install the NVIDIA driver, or mount its libraries into the container "
        "(--nvml-library names a libnvidia-ml.so.1 elsewhere)"
        if cause == NvmlUnavailableError.LIBRARY_MISSING
        else ""
    )
    return Result(
        Status.ERROR,
        NODE,
        f"cannot count usable GPUs: {what}, but {unavailable.summary}",
        remedy,
        {"cause": cause},
        tuple(samples),
    )
