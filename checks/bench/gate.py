"""Job safety: when a benchmark may start, and the watch that stops it when a job arrives.

Before starting (unless forced): no maintenance file, no compute process on
any GPU, and every GPU's utilization at or under the limit through the idle
window. While running: a compute process on any GPU that is not in the
benchmark's own process group stops it, killed within a second (`watch`
polls every 0.25 s). The watch applies in CPU mode too: a CPU benchmark on
all cores would starve a GPU job's data loaders.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from nodecheck.checks.config import BenchOptions
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.gpu import GpuActivity, read_gpu_activity
from nodecheck.checks.node.nvml import NvmlHungError, NvmlUnavailableError
from nodecheck.checks.node.processes import (
    describe_process,
    in_pid_namespace,
    process_group,
    read_maintenance_note,
)
from nodecheck.checks.record import record


@record
class Refusal:
    """Why a benchmark does not run (or stopped): a short key for metrics, and the text."""

    reason: str
    text: str


BLIND_LIMIT_S = 2.0


def _activity(ctx: CheckContext) -> list[GpuActivity] | Refusal:
    try:
        return read_gpu_activity(ctx.nvml)
    except NvmlUnavailableError as err:
        if not ctx.pci_gpus and err.kind in (
            NvmlUnavailableError.LIBRARY_MISSING,
            NvmlUnavailableError.DRIVER_NOT_LOADED,
        ):
            return []  # no GPU here, so no GPU job to disturb
        return Refusal("nvml_unavailable", f"cannot tell whether the GPUs are idle: {err}")
    except NvmlHungError as err:
        return Refusal("nvml_unavailable", f"cannot tell whether the GPUs are idle: {err}")


def check_gate(ctx: CheckContext, options: BenchOptions) -> Refusal | None:
    """None when the benchmark may start, else why not."""
    maintenance, note = read_maintenance_note(ctx.fs, options.maintenance_file)
    if note is not None:
        shown = f": {note.splitlines()[0]}" if note else ""
        return Refusal("maintenance", f"maintenance file {maintenance} is present{shown}")
    end = time.monotonic() + options.idle_window_s
    while True:
        activity = _activity(ctx)
        if isinstance(activity, Refusal):
            return activity
        if not activity:
            return None  # no GPU: nothing to wait for
        for gpu in activity:
            where = f"GPU {gpu.index} ({gpu.bus_id or 'unknown bus id'})"
            if gpu.problem is not None:
                return Refusal("gpu_unhealthy", f"{where} cannot be read: {gpu.problem}")
            if gpu.processes:
                shown = ", ".join(describe_process(ctx.fs, p.pid) for p in gpu.processes)
                return Refusal("gpu_busy", f"{where} is in use by {shown}")
            if (
                gpu.utilization_pct is not None
                and gpu.utilization_pct > options.idle_utilization_pct
            ):
                return Refusal(
                    "gpu_busy",
                    f"{where} is {gpu.utilization_pct}% busy "
                    f"(limit {options.idle_utilization_pct}%)",
                )
        if time.monotonic() >= end:
            return None
        time.sleep(min(options.watch_interval_s, max(end - time.monotonic(), 0.0)))


class ForeignProcessWatch:
    """Polls the GPUs' compute processes while a benchmark runs; calls `stop` on a stranger.

    A process is ours when it is in the benchmark child's process group (the
    child and every rank it starts). Processes already present when the watch
    began (with --force) are tolerated; only newcomers stop the run.
    """

    def __init__(
        self,
        ctx: CheckContext,
        options: BenchOptions,
        stop: Callable[[Refusal], None],
    ) -> None:
        self.ctx = ctx
        self.forced = options.force
        self.interval_s = options.watch_interval_s
        self.stop = stop
        self.group: int | None = None
        self.tolerated: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)

    def start(self, group: int) -> None:
        self.group = group
        if self.forced:
            # --force on a drained node: what is there already (a stuck process holding
            # memory) is why the operator forced it; only newcomers stop the run.
            activity = _activity(self.ctx)
            if not isinstance(activity, Refusal):
                self.tolerated = {p.pid for gpu in activity for p in gpu.processes}
        self._thread.start()

    def close(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        blind_since: float | None = None
        while not self._done.wait(self.interval_s):
            activity = _activity(self.ctx)
            # One GPU that cannot be read (hung, lost) blinds the watch to that GPU as
            # surely as NVML failing blinds it to all of them.
            blind = (
                Refusal(activity.reason, f"the GPUs: {activity.text}")
                if isinstance(activity, Refusal)
                else _unreadable(activity)
            )
            if blind is not None or isinstance(activity, Refusal):
                # An NVML hiccup is forgiven; going blind for longer is not: a job
                # could arrive unseen.
                blind_since = blind_since or time.monotonic()
                if time.monotonic() - blind_since > BLIND_LIMIT_S:
                    what = blind.text if blind is not None else "the GPUs"
                    self.stop(Refusal("nvml_unavailable", f"lost sight of {what}"))
                    return
                continue
            blind_since = None
            refusal = self._stranger(activity)
            if refusal is not None:
                self.stop(refusal)
                return

    def _stranger(self, activity: list[GpuActivity]) -> Refusal | None:
        for gpu in activity:
            for process in gpu.processes:
                if process.pid in self.tolerated:
                    continue
                group = process_group(self.ctx.fs, process.pid)
                if group == self.group:
                    continue
                if group is None and in_pid_namespace(self.ctx.fs):
                    # NVML reports the host's PIDs; from inside a PID namespace they
                    # cannot be told apart from ours.
                    return Refusal(
                        "pid_namespace",
                        f"pid {process.pid} on GPU {gpu.index} cannot be identified from "
                        "this PID namespace (run nodecheck with the host's PIDs: hostPID)",
                    )
                where = f"GPU {gpu.index} ({gpu.bus_id})"
                return Refusal(
                    "foreign_process",
                    f"{describe_process(self.ctx.fs, process.pid)} appeared on {where}",
                )
        return None


def _unreadable(activity: list[GpuActivity]) -> Refusal | None:
    """The first GPU the watch cannot see, as a refusal naming it; None when it sees all."""
    for gpu in activity:
        if gpu.problem is not None:
            where = f"GPU {gpu.index} ({gpu.bus_id or 'bus id unknown'})"
            return Refusal("nvml_unavailable", f"{where}: {gpu.problem}")
    return None
