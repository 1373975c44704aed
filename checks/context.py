"""What a check is given: the node's roots, its calling environment, and shared reads."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from nodecheck.checks.bench.options import BenchOptions
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.gpu import (
    GpuHistory,
    GpuReading,
    GpuSnapshot,
    read_gpus,
    resolve_lost_bus_ids,
)
from nodecheck.checks.node.inventory import Inventory, read_inventory
from nodecheck.checks.node.net import PortCounterHistory
from nodecheck.checks.node.nvml import NvmlSession
from nodecheck.checks.node.pci import PciDevice, read_nvidia_gpus
from nodecheck.checks.node.variables import Variables, read_variables
from nodecheck.checks.node.virtualization import detect_virtualization

if TYPE_CHECKING:
    # Only the XID checks read the kernel log: importing it (and datetime) here would
    # slow every command, `tune` included, for nothing.
    from nodecheck.checks.node.kernel_log import KernelLogText
    from nodecheck.checks.node.xid import XidLog

T = TypeVar("T")


@dataclass(frozen=True)
class GpuView:
    """This pass's NVML snapshot, and the reading before it of each GPU (by bus id)."""

    snapshot: GpuSnapshot
    previous: dict[str, GpuReading]

    def previous_of(self, gpu: GpuReading) -> GpuReading | None:
        return self.previous.get(gpu.bus_id or "")


class SharedReads:
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


@dataclass
class CheckContext:
    """Shared by every check of one run. Expensive reads happen once, on first use.

    The runner runs checks in parallel threads, so each shared read has its own
    lock: a read that hangs (say, on /proc) holds up only the checks that need
    that read, and those are reported when their deadline passes.
    """

    fs: NodeFS = field(default_factory=NodeFS)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    uid: int = field(default_factory=os.getuid)
    nvml: NvmlSession = field(default_factory=NvmlSession)
    # The previous GPU readings, for rates; the agent passes the same one every pass.
    gpu_history: GpuHistory = field(default_factory=GpuHistory)
    # The previous RDMA port counter readings, for rates; kept by the agent likewise.
    port_counter_history: PortCounterHistory = field(default_factory=PortCounterHistory)
    # XIDs from the agent's NVML event listener; None in a one-shot run.
    xid_log: XidLog | None = None
    # Where the kernel log is read for XIDs; None means <rootfs>/dev/kmsg.
    kernel_log: Path | None = None
    expected_gpus: int | None = None
    # Set by the agent: reads shared between the contexts of checks run close together.
    shared: SharedReads | None = None
    # How benchmarks run (device, durations, gate limits, state directory).
    bench: BenchOptions = field(default_factory=BenchOptions)
    _cache: dict[str, object] = field(default_factory=dict, repr=False)
    _locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)
    _locks_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _shared(self, key: str, compute: Callable[[], T], version: object = None) -> T:
        if self.shared is not None:
            return self.shared.get(key, compute, version)
        return self._once(key if version is None else f"{key} {version}", compute)

    def _once(self, key: str, compute: Callable[[], T]) -> T:
        with self._locks_lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._cache:
                self._cache[key] = compute()
            return self._cache[key]  # type: ignore[return-value]

    @property
    def inventory(self) -> Inventory:
        return self._once("inventory", lambda: read_inventory(self.fs))

    @property
    def variables(self) -> Variables:
        return self._once("variables", lambda: read_variables(self.fs, self.environ, self.uid))

    @property
    def pci_gpus(self) -> list[PciDevice]:
        """The NVIDIA GPUs on the PCI bus: from the inventory when it is already read,
        otherwise by a lighter read (a GPU-only pass need not read every device)."""
        inventory = self._cache.get("inventory")
        if isinstance(inventory, Inventory):
            return inventory.gpus
        return self._shared("pci_gpus", lambda: read_nvidia_gpus(self.fs))

    @property
    def gpus(self) -> GpuView:
        """What NVML says about every GPU, with each GPU's previous reading."""
        return self._shared("gpus", self._read_gpus)

    def _read_gpus(self) -> GpuView:
        snapshot = read_gpus(self.nvml)
        if any(gpu.bus_id is None for gpu in snapshot.gpus):
            resolve_lost_bus_ids(self.nvml, snapshot, [gpu.bdf for gpu in self.pci_gpus])
        return GpuView(snapshot, self.gpu_history.exchange(snapshot))

    @property
    def kernel_log_path(self) -> Path:
        return self.kernel_log if self.kernel_log is not None else self.fs.host("/dev/kmsg")

    def kernel_log_text(self, path: Path) -> KernelLogText:
        """The kernel log at `path`, read once per run however many checks scan it
        (gpu_xid and nvswitch_sxid each did, up to 16 MiB apiece); in the agent, shared
        by the checks run close together, as the NVML snapshot is.

        Kept by path, with the file's identity, size and modification time: a log that
        grew or was rotated since is read again (/dev/kmsg, whose size and time say
        nothing, at most `shared.ttl_s` late, and at once after an XID event). A failed
        read is not kept: each check reads for itself and reports its own ReadError."""
        from nodecheck.checks.node.kernel_log import read_kernel_log

        try:
            info = os.stat(path)
        except OSError:
            return read_kernel_log(path)  # raises the ReadError that says why
        version = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        return self._shared(f"kernel log {path}", lambda: read_kernel_log(path), version)

    @property
    def virtualization(self) -> str | None:
        """Why this node looks like a VM, or None on bare metal."""
        return self._once("virtualization", lambda: detect_virtualization(self.fs))
