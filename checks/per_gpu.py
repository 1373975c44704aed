"""The frame every NVML check shares: one result per GPU, and what to say when NVML can't answer.

A GPU check supplies `judge(gpu, previous) -> Verdict`; `per_gpu_results`
turns NVML being absent, hung, or a GPU being lost into the right result, so
each check module only judges readings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import field

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.gpu import GpuReading
from nodecheck.checks.node.nvml import NvmlUnavailableError
from nodecheck.checks.record import record
from nodecheck.checks.result import (
    NODE,
    Action,
    FaultClass,
    Result,
    Sample,
    Status,
    gpu_subject,
    worst,
)

GPU_LABELS = ("gpu", "bus_id", "model")
LOST_REMEDY = (
    "drain the node; reset the GPU (nvidia-smi -r -i {bus_id}) or reboot, and check the kernel "
    "log for XID 79; if it recurs, reseat or RMA the GPU"
)


def lost_remedy(gpu: GpuReading) -> str:
    return LOST_REMEDY.format(bus_id=gpu.bus_id or gpu.index)


def lost_result(gpu: GpuReading) -> Result:
    """A GPU NVML lost (fallen off the bus, "GPU is lost"): hardware, whichever check
    saw it, and a reset or a reboot brings it back (NVIDIA's XID catalog, XID 79)."""
    return Result(
        Status.FAIL,
        subject_of(gpu),
        f"NVML: {gpu.lost}",
        lost_remedy(gpu),
        action=Action.REBOOT,
        fault_class=FaultClass.GPU_HARDWARE,
    )


def subject_of(gpu: GpuReading) -> str:
    return gpu_subject(gpu.bus_id or f"index {gpu.index}")


@record(frozen=False)
class Verdict:
    """Findings about one GPU, folded into one Result (worst status wins)."""

    ok_summary: str
    # (status, summary, remedy, action: None for the check's)
    findings: list[tuple[Status, str, str, Action | None]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    details: dict[str, object] = field(default_factory=dict)
    # Not applicable to this GPU (no NVLink on a PCIe card): `skip` with ok_summary.
    not_applicable: bool = False
    # The findings' class where the evidence makes it another than the check's (a service
    # that is down, not the GPU); None: the check's.
    fault_class: FaultClass | None = None

    def add(
        self, status: Status, summary: str, remedy: str = "", action: Action | None = None
    ) -> None:
        self.findings.append((status, summary, remedy, action))

    def result(self, subject: str) -> Result:
        if self.not_applicable:
            return Result(Status.SKIP, subject, self.ok_summary, "", self.details)
        problems = [f for f in self.findings if f[0] is not Status.OK]
        if not problems:
            notes = [f[1] for f in self.findings]
            summary = "; ".join([self.ok_summary, *notes])
            return Result(Status.OK, subject, summary, "", self.details, tuple(self.samples))
        problems.sort(key=lambda f: -f[0].severity)
        remedies = list(dict.fromkeys(f[2] for f in problems if f[2]))
        status = worst(f[0] for f in problems)
        # The action of the worst finding that names one; None: the check's own.
        actions = [f[3] for f in problems if f[0] is status and f[3] is not None]
        return Result(
            status,
            subject,
            "; ".join(f[1] for f in problems),
            "; ".join(remedies),
            self.details,
            tuple(self.samples),
            action=actions[0] if actions else None,
            fault_class=self.fault_class,
        )


Judge = Callable[[GpuReading, GpuReading | None], Verdict]


def nvml_unavailable_result(ctx: CheckContext) -> Result | None:
    """The one result a GPU check gives when NVML cannot answer, else None.

    No NVML library or driver is `skip` (a CPU-only node; gpu_count is the
    check that says so loudly when GPUs are on the PCI bus anyway). A hung
    NVML, or one that refuses for another reason, is `error`: could not tell.
    """
    snapshot = ctx.gpus.snapshot
    if snapshot.hung is not None:
        return Result(Status.ERROR, NODE, str(snapshot.hung), details={"cause": "nvml hung"})
    unavailable = snapshot.unavailable
    if unavailable is not None:
        quiet = unavailable.kind in (
            NvmlUnavailableError.LIBRARY_MISSING,
            NvmlUnavailableError.DRIVER_NOT_LOADED,
        )
        status = Status.SKIP if quiet else Status.ERROR
        return Result(status, NODE, unavailable.message, details={"cause": unavailable.kind})
    if not snapshot.gpus:
        return Result(Status.SKIP, NODE, "NVML sees no GPU")
    return None


def per_gpu_results(
    ctx: CheckContext, judge: Judge, queries: tuple[str, ...] = ()
) -> Iterator[Result]:
    """`judge` on every readable GPU; lost and hung GPUs reported as such.

    `queries` names the reads (GpuReading.errors keys) the judge relies on: one
    that failed for a reason other than "not supported" is an `error` finding,
    so a failed read never passes as "no problem found".
    """
    unavailable = nvml_unavailable_result(ctx)
    if unavailable is not None:
        yield unavailable
        return
    view = ctx.gpus
    for gpu in view.snapshot.gpus:
        subject = subject_of(gpu)
        if gpu.hung is not None:
            yield Result(Status.ERROR, subject, gpu.hung, details={"cause": "nvml hung"})
        elif gpu.lost is not None:
            yield lost_result(gpu)
        elif gpu.error is not None:
            yield Result(Status.ERROR, subject, gpu.error, details={"cause": "nvml error"})
        else:
            verdict = judge(gpu, view.previous_of(gpu))
            for query in queries:
                if query in gpu.errors:
                    verdict.not_applicable = False
                    verdict.add(Status.ERROR, f"cannot read {query}: {gpu.errors[query]}")
            yield verdict.result(subject)
