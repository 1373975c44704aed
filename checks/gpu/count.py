"""GPU count: GPUs on the PCI bus, GPUs NVML sees, and the count expected.

The classic failure is a GPU that fell off the bus (XID 79): it is still in
sysfs (and lspci) but NVML no longer enumerates it, or answers GPU_IS_LOST
for it (docs/hardware.md §7). Joining NVML's view with the sysfs inventory by PCI
bus id names the missing GPU instead of just counting one short.

Not every GPU on the bus is meant to be seen here, though: sysfs shows all of
the host's GPUs inside a container that was given only some of them, and a GPU
bound to vfio-pci belongs to a VM. Those are `skip`, not "fallen off the bus"
(node/gpu_assignment.py decides, for `nodecheck tune` too). One bound to another
host driver (nouveau) is this host's, and fails.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.gpu import GpuReading
from nodecheck.checks.node.gpu_assignment import CUDA_DRIVER, not_meant_here
from nodecheck.checks.node.nvidia_driver import NvidiaDriver
from nodecheck.checks.node.nvml import NvmlUnavailableError
from nodecheck.checks.per_gpu import GPU_LABELS, lost_result, nvml_unavailable_result, subject_of
from nodecheck.checks.registry import register
from nodecheck.checks.result import (
    NODE,
    Action,
    FaultClass,
    MetricSpec,
    Result,
    Sample,
    Status,
    gpu_subject,
)

ON_BUS = MetricSpec(
    "nodecheck_gpus_on_pci_bus",
    "gauge",
    "NVIDIA GPUs on the PCI bus (<sysfs>/bus/pci/devices, vendor 0x10de, display class)",
)
VISIBLE = MetricSpec(
    "nodecheck_gpus_visible_to_nvml", "gauge", "GPUs NVML enumerates (nvmlDeviceGetCount)"
)
ANSWERING_COUNT = MetricSpec(
    "nodecheck_gpus_answering", "gauge", "GPUs NVML enumerates and can read (not lost)"
)
EXPECTED = MetricSpec("nodecheck_gpus_expected", "gauge", "GPUs this node should have (configured)")
ANSWERS = MetricSpec(
    "nodecheck_gpu_nvml_answering",
    "gauge",
    "Per GPU on the PCI bus and meant for this host: 1 when NVML enumerates it and answers "
    "for it, 0 when it is missing from NVML, reported lost, its calls hang, or NVML as a "
    "whole hangs or fails (absent when NVML is not installed or not permitted)",
    GPU_LABELS,
)
# NVML failing as a whole for these reasons says nothing is answering for the GPUs on the
# bus (a driver wedged after an XID 79 hangs or fails nvmlInit); a missing library or a
# refused device file says the agent cannot ask, which is no news about the GPUs.
SILENT_CAUSES = frozenset(
    {"nvml hung", NvmlUnavailableError.INIT_FAILED, NvmlUnavailableError.QUERY_FAILED}
)
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
UNBOUND_REMEDY = (
    "the nvidia driver did not take this GPU: look in the kernel log for NVRM errors "
    "(RmInitAdapter failed); drain the node and reboot it; if it persists, reseat or RMA it"
)


def _other_driver_remedy(driver: str) -> str:
    return (
        f"the nvidia driver cannot take a GPU {driver} holds: blacklist {driver} "
        "(a modprobe.d blacklist line), rebuild the initramfs and reboot; drain the node "
        "until then"
    )


@register(
    "gpu_count",
    fault_class=FaultClass.GPU_HARDWARE,
    # A GPU fallen off the bus or lost comes back with a reset or a reboot (NVIDIA's
    # XID catalog, XID 79: RESTART_BM); the driver problems say their own (below).
    action=Action.REBOOT,
    gate=True,
    interval_s=60,
    timeout_s=30,
    needs=("gpus", "pci_gpus", "nvidia_driver"),
    options=("expected_gpus",),
)
def check_gpu_count(ctx: CheckContext) -> Iterator[Result]:
    """GPUs on the PCI bus, GPUs NVML sees, and the expected count."""
    on_bus = ctx.pci_gpus
    samples = [Sample(ON_BUS, len(on_bus))]
    if ctx.config.expected_gpus is not None:
        samples.append(Sample(EXPECTED, ctx.config.expected_gpus))
    driver: NvidiaDriver = ctx.part("nvidia_driver")
    exposed = None if driver.exposed_gpus is None else set(driver.exposed_gpus)
    if driver.gpus_error:
        yield Result(Status.ERROR, NODE, f"cannot list the driver's GPUs: {driver.gpus_error}")
    meant: list[str] = []
    for gpu in on_bus:
        reason = not_meant_here(gpu, exposed)
        if reason is None:
            meant.append(gpu.bdf)
        else:
            yield Result(Status.SKIP, gpu_subject(gpu.bdf), reason)
    unavailable = nvml_unavailable_result(ctx)
    snapshot = ctx.gpus.snapshot
    # NVML answering "no GPU" while GPUs are on the bus or expected is a count, not a skip.
    counted = snapshot.usable and (meant or ctx.config.expected_gpus)
    if unavailable is not None and not counted:
        yield _without_nvml(ctx, meant, unavailable, samples)
        return
    seen = snapshot.by_bus_id()
    answering = [one for one in snapshot.gpus if one.lost is None]
    samples += [Sample(VISIBLE, len(snapshot.gpus)), Sample(ANSWERING_COUNT, len(answering))]
    for one in snapshot.gpus:
        info = {
            **one.labels(),
            "uuid": one.uuid or "",
            "vbios": one.vbios or "",
            "driver_version": snapshot.driver_version or "",
        }
        samples.append(Sample(INFO, 1, info))
    by_bdf = {gpu.bdf: gpu for gpu in on_bus}
    # GPUs NVML lists without a usable bus id: any of them may be a GPU sysfs shows.
    unnamed = [gpu for gpu in snapshot.gpus if gpu.bus_id is None and gpu.lost is None]
    for bus_id in meant:
        reading = seen.get(bus_id)
        labels = reading.labels() if reading else unread_labels(bus_id)
        answers = reading is not None and reading.lost is None and reading.hung is None
        samples.append(Sample(ANSWERS, int(answers), labels))
        if reading is None and unnamed:
            names = ", ".join(f"GPU {gpu.index}: {gpu.hung or gpu.error}" for gpu in unnamed)
            yield Result(
                Status.ERROR,
                gpu_subject(bus_id),
                f"not listed by NVML under its bus id, and NVML gave no usable bus id for "
                f"{names}: cannot tell whether it is one of them",
            )
        elif reading is None:
            yield _missing_result(bus_id, by_bdf[bus_id].driver)
    yield from _nvml_only_results(snapshot.gpus, set(by_bdf))
    yield _node_result(ctx, len(meant), snapshot.gpus, samples)


def unread_labels(bus_id: str) -> dict[str, str]:
    """A GPU's labels where NVML gave no reading of it: its bus id alone."""
    return {"gpu": "", "bus_id": bus_id, "model": "unknown"}


def _missing_result(bus_id: str, driver: str | None) -> Result:
    """A GPU meant for this host that NVML does not enumerate."""
    action = None  # the check's: a reboot
    if driver is None:
        summary, remedy = "on the PCI bus with no driver bound", UNBOUND_REMEDY
    elif driver != CUDA_DRIVER:
        summary = f"on the PCI bus, bound to {driver}, not the nvidia driver"
        remedy = _other_driver_remedy(driver)
        action = Action.FIX_NODE_CONFIG
    else:
        summary = "on the PCI bus but not enumerated by NVML (fallen off the bus?)"
        remedy = MISSING_REMEDY
    return Result(Status.FAIL, gpu_subject(bus_id), summary, remedy, action=action)


def _nvml_only_results(gpus: list[GpuReading], on_bus: set[str]) -> Iterator[Result]:
    for gpu in gpus:
        if gpu.lost is not None:
            yield lost_result(gpu)
        elif gpu.hung is not None:
            yield Result(Status.ERROR, subject_of(gpu), gpu.hung, details={"cause": "nvml hung"})
        elif gpu.error is not None and gpu.bus_id is None:
            yield Result(Status.ERROR, subject_of(gpu), gpu.error, details={"cause": "nvml error"})
        elif gpu.bus_id is not None and gpu.bus_id not in on_bus:
            # NVML answers for the running machine; a --sysfs-root capture of
            # another node is the usual cause.
            yield Result(
                Status.WARN,
                gpu_subject(gpu.bus_id),
                "NVML sees this GPU but it is not on the PCI bus read from sysfs",
                "check that --sysfs-root is this node's sysfs",
                action=Action.INVESTIGATE,
            )


def _node_result(
    ctx: CheckContext, meant: int, gpus: list[GpuReading], samples: list[Sample]
) -> Result:
    expected = ctx.config.expected_gpus
    lost = sum(1 for gpu in gpus if gpu.lost is not None)
    answering = len(gpus) - lost
    counts = f"{answering} GPU(s) answering NVML"
    if lost:
        counts += f" ({lost} lost)"
    counts += f", {meant} on the PCI bus for this host"
    details: dict[str, object] = {
        "on_pci_bus": meant,
        "visible_to_nvml": len(gpus),
        "answering": answering,
        "expected": expected,
    }
    if expected is not None:
        counts += f", {expected} expected"
        if answering < expected:
            return Result(
                Status.FAIL,
                NODE,
                f"{expected - answering} GPU(s) missing, {answering} of {expected} answering: "
                f"{counts}",
                "drain the node; reboot it and check the kernel log for XID 79 and the "
                "BMC for GPU power faults",
                details,
                tuple(samples),
            )
    if answering < meant:
        return Result(
            Status.FAIL,
            NODE,
            f"{meant - answering} GPU(s) on the bus are not usable: {counts}",
            "drain the node; the results for each missing GPU say what to do",
            details,
            tuple(samples),
        )
    if expected is not None and answering > expected:
        return Result(
            Status.WARN,
            NODE,
            f"more GPUs than expected: {counts}",
            "correct the expected GPU count in the configuration",
            details,
            tuple(samples),
            action=Action.FIX_NODE_CONFIG,
        )
    return Result(Status.OK, NODE, counts, details=details, samples=tuple(samples))


def _without_nvml(
    ctx: CheckContext, meant: list[str], unavailable: Result, samples: list[Sample]
) -> Result:
    """NVML cannot answer. With no GPU on the bus for this host that is a CPU node: skip."""
    cause = unavailable.details.get("cause")
    if cause in SILENT_CAUSES:
        samples += [Sample(ANSWERS, 0, unread_labels(bdf)) for bdf in meant]
    expected = ctx.config.expected_gpus
    if expected is not None and len(meant) < expected:
        # Whatever NVML says, at most the GPUs on the bus can answer: fewer than expected.
        return Result(
            Status.FAIL,
            NODE,
            f"{expected - len(meant)} GPU(s) missing: {len(meant)} of {expected} expected GPUs "
            f"on the PCI bus for this host ({unavailable.summary})",
            "drain the node; reboot it and check the kernel log for XID 79 and the "
            "BMC for GPU power faults",
            {"cause": cause, "on_pci_bus": len(meant), "expected": expected},
            tuple(samples),
        )
    if not meant and not expected:
        return Result(
            Status.SKIP,
            NODE,
            f"no GPU on the PCI bus for this host; {unavailable.summary}",
            samples=tuple(samples),
        )
    what = f"{len(meant)} GPU(s) on the PCI bus"
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
            action=Action.FIX_NODE_CONFIG,
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
