"""XID errors: where they are seen (the kernel log, NVML events) and how each line reads.

An XID is the driver's report of a GPU error. The kernel log has every one
since boot (`NVRM: Xid (PCI:0000:1b:00): 79, pid=..., GPU has fallen off the
bus.`); NVML delivers them as events, but only to a process waiting at the
moment (docs/hardware.md §8). So a one-shot run reads the kernel log, and the
agent also runs `XidListener` so an XID reaches the metrics at once. What each
XID means is NVIDIA's catalog (`xid_catalog`).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import functools
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import field
from pathlib import Path
from typing import Any

from nodecheck.checks.lazy_logging import DEBUG, INFO, WARNING, get_logger
from nodecheck.checks.node.fs import NodeFS, ReadError, read_text
from nodecheck.checks.node.gpu import ENUMERATION_JOB, device_count, gpu_key, normalize_bus_id
from nodecheck.checks.node.kernel_log import (
    KERNEL_LOG_LIMIT,
    MESSAGE_LIMIT,
    KernelLogText,
    LineClock,
    cut_message,
    cut_note,
    every_line_counts,
    in_kernel_log_form,
    parse_boot_time,
    read_kernel_log,
)
from nodecheck.checks.node.nvml import NvmlHungError, NvmlSession, NvmlUnavailableError
from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.node.xid_catalog import (
    NVLINK5_XIDS,
    XID_CATALOG,
    XidAction,
    XidInfo,
    classify,
)
from nodecheck.checks.record import record

__all__ = [
    "KERNEL_LOG_LIMIT",
    "NVLINK5_XIDS",
    "XID_CATALOG",
    "KernelLogText",
    "XidAction",
    "XidInfo",
    "classify",
    "in_kernel_log_form",
    "parse_boot_time",
    "read_kernel_log",
]

log = get_logger(__name__)


@record
class XidEvent:
    """One XID on one GPU. `at` is wall-clock seconds, None when the log had no time.

    `severity` is the driver's own word on the line, where it writes one
    ("fatal" or "nonfatal", as NVLink5 XIDs 144-150 do), else None; `clock` names
    how `at` was read from the line (kernel_log.LineClock), "" for NVML events.
    """

    bus_id: str
    xid: int
    at: float | None
    source: str
    message: str = ""
    severity: str | None = None
    clock: str = field(default="", compare=False)


# The driver's XID line, as drivers old and new write it:
#   NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
#   NVRM: Xid (0000:03:00): 14, Channel 00000001          (older drivers: no "PCI:")
#   NVRM: Xid (PCI:0000:3b:00.0): 48, ...                  (with the PCI function)
#   NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 ...)
# (NVIDIA's XID guide, docs.nvidia.com/deploy/xid-errors/, "Viewing the Xid messages";
# leptonai/gpud components/accelerator/nvidia/xid/kmsg.go for the forms seen in the field).
# The bus id may lack its domain (0000 then) and its function (NVIDIA GPUs are function 0).
# The XID is a few digits: a longer number is no line the driver wrote (and int() of more
# than 4300 digits raises, Python 3.11's sys.int_info.str_digits_check_threshold).
XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})"
    r"(?:\.([0-7]))?\)\s*:\s*(\d{1,9})(?!\d)"
)
# NVLink5 XIDs (144-150, GB200) name the unit, then say whether it was fatal, then the
# cross-containment domain: "RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (...)". NVIDIA's XID
# catalog documents that word for those XIDs only: on any other XID the same text is
# part of the message, never the driver's severity.
DRIVER_SEVERITY = LazyPattern(r"\b[A-Z][A-Z0-9_]*(?:/[A-Z0-9_]+)? (Nonfatal|Fatal) XC\d")
# When a GPU stops answering, the driver logs XID 79 and then, on a line of its own,
#   NVRM: GPU 0000:bc:00.0: GPU has fallen off the bus.
# (NVIDIA/open-gpu-kernel-modules, src/nvidia/arch/nvalloc/unix/src/osinit.c,
# osHandleGpuLost: nvErrorLog_va(..., ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, ...),
# then NV_DEV_PRINTF, whose prefix is "NVRM: GPU <domain:bus:device.function>: ").
# A log may hold the second line without the first (a filter on "Xid", a message split
# over lines: leptonai/gpud PR #1209): that line alone is XID 79, counted once.
GPU_LOST_LINE = re.compile(
    r"NVRM: GPU ([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?: "
    r"GPU has fallen off the bus"
)
GPU_LOST_XID = 79
# The lost-GPU line is the same error as an XID 79 line of that GPU this close to it
# (by time; by place in the log when either line has no time).
GPU_LOST_SAME_WITHIN_S = 5.0
GPU_LOST_SAME_WITHIN_LINES = 20
GPU_LOST_MESSAGE = "GPU has fallen off the bus (the driver's line without an Xid 79 line)"


def xid_bus_id(domain: str | None, bus: str, device: str, function: str | None) -> str:
    """The GPU's bus id in nodecheck's form (0000:1b:00.0); ValueError if it cannot be one."""
    return normalize_bus_id(f"{domain or '0000'}:{bus}:{device}.{function or '0'}")


def parse_kernel_log(
    text: str, boot_time: float | None, now: float | None = None
) -> list[XidEvent]:
    """XID events in kernel log text, in any form kernel_log describes.

    `boot_time` (wall-clock seconds) turns since-boot stamps into times; a log
    file with only since-boot stamps is taken to be of the current boot.
    Stamps without a year get the one that puts the line in the past (of `now`).
    """
    clock = LineClock(boot_time, time.time() if now is None else now)
    every_line = every_line_counts(text)
    found: list[tuple[int, XidEvent]] = []  # (line number, event)
    lost: list[tuple[int, XidEvent]] = []  # lost-GPU lines: XID 79 unless a duplicate
    for number, line in enumerate(text.splitlines()):
        match = XID_LINE.search(line)
        if not match:
            if lost_match := GPU_LOST_LINE.search(line):
                stamp = clock.stamp(line[: lost_match.start()])
                try:
                    bus = xid_bus_id(*lost_match.group(1, 2, 3, 4))
                except ValueError:
                    continue
                event = XidEvent(
                    bus, GPU_LOST_XID, stamp.at, "kernel log", GPU_LOST_MESSAGE, None, stamp.form
                )
                lost.append((number, event))
            elif every_line:
                clock.stamp(line)
            continue
        try:
            bus = xid_bus_id(*match.group(1, 2, 3, 4))
        except ValueError:
            continue  # a device number past 0x1f: not a line the driver wrote
        xid = int(match.group(5))
        message = line[match.end() :].lstrip(", ").strip()
        stamp = clock.stamp(line[: match.start()])
        # The driver writes the severity word right after the unit, at the message's start.
        opening = message[:MESSAGE_LIMIT]
        said = DRIVER_SEVERITY.search(opening) if xid in NVLINK5_XIDS else None
        severity = said.group(1).lower() if said else None
        shown = cut_message(message)  # a line may be megabytes long: results show its start
        found.append(
            (number, XidEvent(bus, xid, stamp.at, "kernel log", shown, severity, stamp.form))
        )
    if lost:
        xid_79: dict[str, list[tuple[int, XidEvent]]] = {}
        for number, event in found:
            if event.xid == GPU_LOST_XID:
                xid_79.setdefault(event.bus_id, []).append((number, event))
        found += [(n, e) for n, e in lost if not _logged_as_xid_79(n, e, xid_79.get(e.bus_id))]
        found.sort(key=lambda item: item[0])
    return [event for _, event in found]


def _logged_as_xid_79(
    number: int, event: XidEvent, xid_79: list[tuple[int, XidEvent]] | None
) -> bool:
    """Whether an XID 79 line of the same GPU is the one error this lost-GPU line repeats."""
    for other_number, other in xid_79 or ():
        if event.at is not None and other.at is not None:
            if abs(event.at - other.at) < GPU_LOST_SAME_WITHIN_S:
                return True
        elif abs(number - other_number) <= GPU_LOST_SAME_WITHIN_LINES:
            return True
    return False


@record
class KernelLogXids:
    events: list[XidEvent]
    boot_time: float | None  # when this boot began, wall-clock seconds (/proc/stat btime)
    # Set when only the tail of a huge log file was read: "the last 16 MiB of 40 MiB".
    cut: str | None = None
    notes: tuple[str, ...] = ()  # what reading the log inferred (KernelLogText.notes)


def read_boot_time(fs: NodeFS) -> float | None:
    """When this boot began (<procfs>/stat btime), None when it cannot be read."""
    try:
        return parse_boot_time(read_text(fs.proc("stat")))
    except ReadError:
        return None


def kernel_log_xids(fs: NodeFS, path: Path, read: KernelLogText | None = None) -> KernelLogXids:
    """XIDs in the kernel log at `path` (`read`: its text, already read); ReadError when
    it cannot be read."""
    if read is None:
        read = read_kernel_log(path)
    boot_time = read_boot_time(fs)
    events = parse_kernel_log(read.text, boot_time)
    return KernelLogXids(events, boot_time, cut_note(read), read.notes)


class XidLog:
    """XID events the listener has seen, and whether it is listening (thread-safe).

    The checks read `listening` and `source_error` to say which source a
    result rests on: a listener that is not listening is never a pass.
    """

    NOT_STARTED = "the NVML event listener has not started"

    def __init__(self, limit: int = 10_000) -> None:
        self._events: list[XidEvent] = []
        self._limit = limit
        self._lock = threading.Lock()
        self._listening_since: float | None = None
        self._source_error: str | None = self.NOT_STARTED
        self._unwatched: dict[str, str] = {}

    def add(self, event: XidEvent) -> None:
        with self._lock:
            self._events.append(event)
            del self._events[: -self._limit]

    def events(self) -> list[XidEvent]:
        with self._lock:
            return list(self._events)

    def set_listening(self, since: float, unwatched: dict[str, str] | None = None) -> None:
        with self._lock:
            self._listening_since, self._source_error = since, None
            self._unwatched = dict(unwatched or {})

    def set_unwatched(self, unwatched: dict[str, str]) -> None:
        """Replace the GPUs not registered (a late registration succeeded, or failed anew)."""
        with self._lock:
            self._unwatched = dict(unwatched)

    def set_not_listening(self, why: str) -> None:
        with self._lock:
            self._listening_since, self._source_error = None, why
            self._unwatched = {}

    @property
    def unwatched(self) -> dict[str, str]:
        """GPUs the listener could not register for XID events, and why: by bus id, or
        "GPU <index>" for a GPU that never told NVML its bus id."""
        with self._lock:
            return dict(self._unwatched)

    @property
    def listening(self) -> bool:
        with self._lock:
            return self._listening_since is not None

    @property
    def listening_since(self) -> float | None:
        """Wall-clock seconds since which every XID event is seen, None when not listening."""
        with self._lock:
            return self._listening_since

    @property
    def source_error(self) -> str | None:
        """Why the listener is not listening, None while it is."""
        with self._lock:
            return self._source_error


SAME_XID_WITHIN_S = 5.0


def merge_sources(kernel: Iterable[XidEvent], nvml: Iterable[XidEvent]) -> list[XidEvent]:
    """Both sources together, each XID once: an NVML event that the kernel log also
    has (same GPU and XID, less than 5 s apart) is the same error seen twice.

    The kernel log's events first, then the NVML events it lacks, in their order.
    An NVML event is compared with the kernel log's and with the NVML events kept
    before it (one error delivered twice is kept once). Indexed by (GPU, XID), and
    by time within each: a 16 MiB kernel log (~100k XID lines) during an XID storm
    (10k events) is merged in well under a second, not in minutes.
    """
    merged = list(kernel)
    times: dict[tuple[str, int], list[float]] = {}
    for seen in merged:
        if seen.at is not None:
            times.setdefault((seen.bus_id, seen.xid), []).append(seen.at)
    for bucket in times.values():
        bucket.sort()
    for event in nvml:
        bucket = times.setdefault((event.bus_id, event.xid), [])
        if event.at is not None:
            # The first time not before event.at - 5 s; a duplicate is under event.at + 5 s.
            first = bisect.bisect_right(bucket, event.at - SAME_XID_WITHIN_S)
            if first < len(bucket) and bucket[first] < event.at + SAME_XID_WITHIN_S:
                continue
            bisect.insort(bucket, event.at)
        merged.append(event)
    return merged


XID_CRITICAL_EVENT = 0x8  # nvmlEventTypeXidCriticalError


class XidListener:
    """Waits for NVML XID events on a thread and records them in an `XidLog`.

    `start()` returns at once; `stop()` returns within about `poll_s` plus a
    second, since the thread only blocks in nvmlEventSetWait for `poll_s` at a
    time. `on_event` (optional) is called on the listener thread for each
    event, so the agent can re-judge at once instead of at the next poll.

    When NVML cannot be used yet (the driver loads after the agent starts, an
    nvmlInit hangs) the listener tries again after `retry_initial_s`, doubling
    the wait up to `retry_max_s`, until it listens or is stopped; meanwhile
    `xid_log.listening` is False and `xid_log.source_error` says why. Each GPU
    is registered as its own job under its session key: one whose registration
    hangs is unwatched (`xid_log.unwatched` says so) and retried with the same
    backoff while the others are listened to. The blocking wait runs on this
    thread, never as a session job, so it never makes the session look stuck.
    """

    def __init__(
        self,
        session: NvmlSession,
        xid_log: XidLog,
        *,
        poll_s: float = 0.5,
        on_event: Callable[[XidEvent], None] | None = None,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 60.0,
    ) -> None:
        self.session = session
        self.xid_log = xid_log
        self.poll_s = poll_s
        self.on_event = on_event
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.error: str | None = None
        self.attempts = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, ready_timeout_s: float | None = None) -> None:
        """Start listening; with `ready_timeout_s`, wait until the first attempt is done."""
        self._thread = threading.Thread(target=self._run, name="nvml-xid-listener", daemon=True)
        self._thread.start()
        if ready_timeout_s is not None:
            self._ready.wait(ready_timeout_s)

    def stop(self) -> bool:
        """Stop and join; False when the thread is stuck in the driver."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(self.poll_s + 1.0)
        return not self._thread.is_alive()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        delay = self.retry_initial_s
        try:
            while not self._stop.is_set():
                self.attempts += 1
                event_set = None
                try:
                    nvml = self.session.module()
                    event_set = self.session.run(nvml.nvmlEventSetCreate, EVENT_SET_JOB)
                    count = self.session.run(functools.partial(device_count, nvml), ENUMERATION_JOB)
                except Exception as err:  # any failure: say why, and try again later
                    if event_set is not None:
                        with contextlib.suppress(Exception):
                            nvml.nvmlEventSetFree(event_set)
                    self._not_listening(err, delay)
                    self._ready.set()
                    if self._stop.wait(delay):
                        return
                    delay = min(delay * 2, self.retry_max_s)
                    continue
                try:
                    registered = _RegisteredGpus()
                    pending = self._register(nvml, event_set, registered, range(count))
                    self.error = None
                    self.xid_log.set_listening(time.time(), pending.unwatched)
                    log.info(
                        "event=xid_listener_listening gpus=%d attempts=%d",
                        len(registered),
                        self.attempts,
                    )
                    self._ready.set()
                    delay = self.retry_initial_s
                    broken = self._listen(nvml, event_set, registered, pending)
                finally:
                    with contextlib.suppress(Exception):
                        nvml.nvmlEventSetFree(event_set)
                if broken is not None:
                    self._not_listening(broken, delay)
                    if self._stop.wait(delay):
                        return
        finally:
            self.xid_log.set_not_listening("the NVML event listener stopped")

    def _not_listening(self, err: Exception, retry_in_s: float) -> None:
        """Record why; log the first failure and every change of reason, not each retry."""
        text = str(err) or type(err).__name__
        if isinstance(err, NvmlUnavailableError | NvmlHungError | RuntimeError):
            why = text
        else:
            why = f"registering for XID events failed: {text}"
        changed = why != self.error
        self.error = why
        self.xid_log.set_not_listening(why)
        quiet = isinstance(err, NvmlUnavailableError) and err.kind in (
            NvmlUnavailableError.LIBRARY_MISSING,
            NvmlUnavailableError.DRIVER_NOT_LOADED,
        )  # a CPU-only node: nothing to listen to, nothing to warn about
        level = INFO if quiet else WARNING
        log.log(
            level if changed else DEBUG,
            "event=xid_listener_unavailable reason=%r retry_in_s=%g",
            why,
            retry_in_s,
        )

    def _register(
        self, api: Any, event_set: object, registered: _RegisteredGpus, indices: Iterable[int]
    ) -> _Unregistered:
        """Register each GPU of `indices` for XID events in `event_set`, each GPU its own job
        under its session key (the key of its reads: one stuck there is answered at once).

        A GPU whose registration hung is not listened to, says so, and is retried at each
        `retry_hung` (its job may also finish late: it then records itself in
        `registered`); the other GPUs are listened to meanwhile.
        """
        indices = list(indices)
        jobs = {
            gpu_key(index): functools.partial(
                _register_gpu, api, self.session, event_set, registered, index
            )
            for index in indices
        }
        labels = {
            gpu_key(index): f"GPU {index}, registering it for XID events" for index in indices
        }
        outcomes = self.session.run_many(jobs, labels=labels)
        pending = _Unregistered()
        for index in indices:
            outcome = outcomes[gpu_key(index)]
            if isinstance(outcome, NvmlHungError):
                pending.hung[index] = str(outcome)
                log.warning("event=xid_register_hung gpu=%d error=%r", index, str(outcome))
            elif isinstance(outcome, BaseException):
                pending.failed[f"GPU {index}"] = f"registering failed: {outcome}"
                log.warning("event=xid_register_failed gpu=%d error=%r", index, str(outcome))
            elif outcome is not None:
                name, why = outcome
                if name == f"GPU {index}":  # it failed before telling its bus id
                    name = self.session.known_bus_id(index) or name
                pending.failed[name] = why
        pending.name_hung(self.session)
        return pending

    def _retry_hung(
        self, api: Any, event_set: object, registered: _RegisteredGpus, pending: _Unregistered
    ) -> None:
        """Register again the GPUs whose registration hung; forget those registered since."""
        for index in [index for index in pending.hung if registered.has(index)]:
            del pending.hung[index]  # its stuck call came back and registered it
        if not pending.hung:
            return
        again = self._register(api, event_set, registered, list(pending.hung))
        pending.hung = again.hung
        pending.failed.update(again.failed)
        pending.name_hung(self.session)

    WAIT_FAILURES_BEFORE_REREGISTERING = 3

    def _listen(
        self, api: Any, event_set: object, registered: _RegisteredGpus, pending: _Unregistered
    ) -> Exception | None:
        """Wait for events until stopped (None), or until waiting keeps failing (the error).

        GPUs whose registration hung are retried with the listener's backoff.
        """
        timeout_ms = max(int(self.poll_s * 1000), 1)
        failures = 0
        retry_delay = self.retry_initial_s
        retry_at = time.monotonic() + retry_delay
        while not self._stop.is_set():
            if pending.hung and time.monotonic() >= retry_at:
                self._retry_hung(api, event_set, registered, pending)
                self.xid_log.set_unwatched(pending.unwatched)
                retry_delay = min(retry_delay * 2, self.retry_max_s)
                retry_at = time.monotonic() + retry_delay
                if not pending.hung:
                    log.info("event=xid_listener_listening gpus=%d", len(registered))
            try:
                data = api.nvmlEventSetWait_v2(event_set, timeout_ms)
            except api.NVMLError_Timeout:
                failures = 0
                continue
            except api.NVMLError as err:
                # A lost GPU can make the wait fail once; failing again and again
                # means the set is dead (NVML shut down): register afresh.
                failures += 1
                log.warning("event=xid_wait_failed error=%r failures=%d", str(err), failures)
                if failures >= self.WAIT_FAILURES_BEFORE_REREGISTERING:
                    return RuntimeError(f"waiting for XID events fails: {err}")
                self._stop.wait(self.poll_s)
                continue
            failures = 0
            if not data.eventType & XID_CRITICAL_EVENT:
                continue
            bus = registered.bus_of(_address(data.device))
            event = XidEvent(bus, int(data.eventData), time.time(), "nvml event")
            self.xid_log.add(event)
            log.warning("event=xid gpu=%s xid=%d", bus, event.xid)
            if self.on_event is not None:
                try:
                    self.on_event(event)
                except Exception as err:
                    log.error("event=xid_callback_failed error=%r", str(err))
        return None


EVENT_SET_JOB = "creating the XID event set"


class _RegisteredGpus:
    """The GPUs registered in one event set, by handle address (to name an event's GPU).

    Written by the registration jobs, a job that finished after its deadline too:
    that GPU is then registered, and its events must be named."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buses: dict[int | None, str] = {}
        self._indices: set[int] = set()

    def add(self, index: int, address: int | None, bus: str) -> None:
        with self._lock:
            self._buses[address] = bus
            self._indices.add(index)

    def has(self, index: int) -> bool:
        with self._lock:
            return index in self._indices

    def bus_of(self, address: int | None) -> str:
        with self._lock:
            return self._buses.get(address, "unknown")

    def __len__(self) -> int:
        with self._lock:
            return len(self._indices)


@record(frozen=False)
class _Unregistered:
    """GPUs not listened to: those that cannot be (by bus id, or "GPU <index>"), and those
    whose registration hung (by index; retried), with why."""

    failed: dict[str, str] = field(default_factory=dict)
    hung: dict[int, str] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)

    def name_hung(self, session: NvmlSession) -> None:
        """Name each hung GPU by the bus id it reported in the session, if it ever did."""
        self.names = {index: session.known_bus_id(index) or f"GPU {index}" for index in self.hung}

    @property
    def unwatched(self) -> dict[str, str]:
        hung = {
            self.names.get(index, f"GPU {index}"): f"{why}; retrying"
            for index, why in self.hung.items()
        }
        return {**self.failed, **hung}


def _register_gpu(
    api: Any, session: NvmlSession, event_set: object, registered: _RegisteredGpus, index: int
) -> tuple[str, str] | None:
    """Register GPU `index` for XID events: None when it is, else (its name, why not)."""
    bus = f"GPU {index}"
    try:
        handle = api.nvmlDeviceGetHandleByIndex(index)
        bus = normalize_bus_id(api.nvmlDeviceGetPciInfo(handle).busId)
        # Known before the calls that may hang: a GPU stuck in them is named by it.
        session.remember_bus_id(index, bus)
        supported = api.nvmlDeviceGetSupportedEventTypes(handle)
        if not supported & XID_CRITICAL_EVENT:
            return bus, "the GPU does not report XID events"
        api.nvmlDeviceRegisterEvents(handle, XID_CRITICAL_EVENT, event_set)
    except (api.NVMLError, ValueError, UnicodeDecodeError) as err:
        log.warning("event=xid_register_failed gpu=%d error=%r", index, str(err))
        return bus, f"registering failed: {err}"
    registered.add(index, _address(handle), bus)
    return None


def _address(handle: object) -> int | None:
    """A device handle's pointer value, to match event data back to a GPU."""
    return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
