"""What a check is given: the node's facts, the configuration, and the previous readings.

A check reads nothing itself. Its parts of the facts come through the context's
properties (`ctx.inventory`, `ctx.gpus`, ...), from a FactsSource: the node itself
(LiveFacts over NodeSources, each part read once, on first use, under its own lock)
or a capture (NodeFacts, `check --facts`). So a rule is a function of facts, the
previous readings (GPU and port counters, for rates) and `ctx.config`, and judges a
capture anywhere exactly as it judges the live node.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from nodecheck.checks.config import CheckConfig
from nodecheck.checks.node.aer import AerHistory
from nodecheck.checks.node.facts import (
    FactsSource,
    LiveFacts,
    NodeSources,
    SharedCache,
    hostname_shown,
)
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.gpu import GpuHistory, GpuReading, GpuSnapshot
from nodecheck.checks.node.net import PortCounterHistory
from nodecheck.checks.record import record

if TYPE_CHECKING:
    from nodecheck.checks.node.inventory import Inventory
    from nodecheck.checks.node.job_python import JobPython
    from nodecheck.checks.node.nvml import NvmlSession
    from nodecheck.checks.node.pci import PciDevice
    from nodecheck.checks.node.variables import Variables
    from nodecheck.checks.node.xid import XidLog

T = TypeVar("T")


@record
class GpuView:
    """This pass's NVML snapshot, and the reading before it of each GPU (by bus id)."""

    snapshot: GpuSnapshot
    previous: dict[str, GpuReading]

    def previous_of(self, gpu: GpuReading) -> GpuReading | None:
        return self.previous.get(gpu.bus_id or "")


class SharedReads(SharedCache):
    """Reads that checks running close together may share (the agent's GPU checks fall due
    within seconds of each other): one NVML snapshot serves them all for `ttl_s`, instead
    of one per check. A one-shot run has no need: its context is shared already."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, object, object]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Drop everything: something happened (an XID) that the next read must see."""
        with self._lock:
            self._entries.clear()

    def get(self, key: str, compute: Callable[[], T], version: object = None) -> T:
        """The value kept under `key`, computed again once older than `ttl_s` or when
        `version` (what the value was computed from: a file's size and time) changed."""
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                entry = self._entries.get(key)
            if entry is None or entry[2] != version or time.monotonic() - entry[0] > self.ttl_s:
                entry = (time.monotonic(), compute(), version)
                with self._lock:
                    self._entries[key] = entry
            return entry[1]  # type: ignore[return-value]


@record(frozen=False)
class CheckContext:
    """Shared by every check of one run: the facts, the configuration, the histories.

    `facts` is where the parts come from. Left out, it is the live node described by
    `fs`, `environ`, `uid`, `nvml` and `kernel_log` (the sources only checks/node reads).
    """

    fs: NodeFS = field(default_factory=NodeFS)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    uid: int = field(default_factory=os.getuid)
    nvml: NvmlSession = None  # type: ignore[assignment]  # None: a session of the defaults
    # The previous GPU readings, for rates; the agent passes the same one every pass.
    gpu_history: GpuHistory = field(default_factory=GpuHistory)
    # The previous RDMA port counter readings, for rates; kept by the agent likewise.
    port_counter_history: PortCounterHistory = field(default_factory=PortCounterHistory)
    # The previous AER counter readings of the GPUs' and NICs' paths, likewise.
    aer_history: AerHistory = field(default_factory=AerHistory)
    # XIDs from the agent's NVML event listener; None in a one-shot run.
    xid_log: XidLog | None = None
    # Where the kernel log is read for XIDs; None means <rootfs>/dev/kmsg.
    kernel_log: Path | None = None
    # Set by the agent: reads shared between the contexts of checks run close together.
    shared: SharedReads | None = None
    # The Python the job runs, where the user named it (tune and exec, never the agent).
    job_python: JobPython | None = None
    config: CheckConfig = field(default_factory=CheckConfig)
    facts: FactsSource = None  # type: ignore[assignment]
    _cache: dict[str, object] = field(default_factory=dict, repr=False)
    _locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)
    _locks_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.facts is None:
            if self.nvml is None:
                from nodecheck.checks.node.nvml import NvmlSession

                self.nvml = NvmlSession(deadline_s=self.config.nvml_timeout_s)
            sources = NodeSources(
                fs=self.fs,
                environ=self.environ,
                uid=self.uid,
                nvml=self.nvml,
                kernel_log=self.kernel_log,
                job_python=self.job_python,
                state_dir=self.config.bench.state_dir,
            )
            self.facts = LiveFacts(sources, self.shared)

    @property
    def sources(self) -> NodeSources | None:
        """The live node's sources, for what cannot be judged from a capture (benchmarks
        run on the node; the agent closes its NVML session); None for a capture."""
        return self.facts.sources if isinstance(self.facts, LiveFacts) else None

    @property
    def now(self) -> float:
        """When the facts were taken (seconds since the epoch): the rules' "now"."""
        return self.facts.taken_at

    def _once(self, key: str, compute: Callable[[], T]) -> T:
        with self._locks_lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._cache:
                self._cache[key] = compute()
            return self._cache[key]  # type: ignore[return-value]

    def part(self, name: str) -> Any:
        """Part `name` of the facts; PartUnavailableError when it could not be read."""
        return self.facts.get(name)

    @property
    def inventory(self) -> Inventory:
        return self.facts.get("inventory")  # type: ignore[no-any-return]

    @property
    def variables(self) -> Variables:
        return self.facts.get("variables")  # type: ignore[no-any-return]

    @property
    def pci_gpus(self) -> list[PciDevice]:
        """The NVIDIA GPUs on the PCI bus."""
        return self.facts.get("pci_gpus")  # type: ignore[no-any-return]

    @property
    def gpus(self) -> GpuView:
        """What NVML says about every GPU, with each GPU's previous reading: the history
        is exchanged once per snapshot, however many checks (and contexts) share it."""
        snapshot: GpuSnapshot = self.facts.get("gpus")

        def view() -> GpuView:
            return GpuView(snapshot, self.gpu_history.exchange(snapshot))

        if self.shared is not None:
            return self.shared.get("gpu view", view, version=id(snapshot))
        return self._once(f"gpu view {id(snapshot)}", view)

    @property
    def virtualization(self) -> str | None:
        """Why this node looks like a VM, or None on bare metal."""
        return self.facts.get("virtualization")  # type: ignore[no-any-return]

    @property
    def hostname(self) -> str:
        """The node's name, "unknown" where it cannot be known (for showing)."""
        return hostname_shown(self.facts)
