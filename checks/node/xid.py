"""XID errors: NVIDIA's catalog of what each means, and the two places they are seen.

An XID is the driver's report of a GPU error. The kernel log has every one
since boot (`NVRM: Xid (PCI:0000:1b:00): 79, pid=..., GPU has fallen off the
bus.`); NVML delivers them as events, but only to a process waiting at the
moment (hardware.md §5.2). So a one-shot run reads the kernel log, and the
agent also runs `XidListener` so an XID reaches the metrics at once.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import enum
import errno
import functools
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from nodecheck.checks.node.fs import NodeFS, ReadError, read_text
from nodecheck.checks.node.gpu import ENUMERATION_JOB, device_count, gpu_key, normalize_bus_id
from nodecheck.checks.node.nvml import NvmlHungError, NvmlSession, NvmlUnavailableError

log = logging.getLogger(__name__)


class XidAction(str, enum.Enum):
    """NVIDIA's immediate action for an XID (the XID catalog's resolution bucket)."""

    NONE = "none"
    APP_ERROR = "application error"
    RESTART_APP = "restart the application"
    RESET_GPU = "drain the node and reset the GPU"
    REBOOT = "drain the node and reboot it"
    FOLLOW_RECOVERY_ACTION = "follow the driver's recovery action"
    UNKNOWN = "look it up in NVIDIA's XID catalog"


@dataclass(frozen=True)
class XidInfo:
    mnemonic: str
    action: XidAction


# From NVIDIA's XID catalog as encoded in NVSentinel's xiderrorsmapping.csv
# (hardware.md §5.3). 13, 31, 43, 45 and 68 are what NVIDIA's k8s device plugin
# treats as application errors that leave the GPU healthy (internal/rm/health.go).
_RESET = XidAction.RESET_GPU
XID_CATALOG: dict[int, XidInfo] = {
    8: XidInfo("FIFO_ERROR_IDLE_TIMEOUT", XidAction.RESTART_APP),
    13: XidInfo("GR_EXCEPTION", XidAction.APP_ERROR),
    31: XidInfo("FIFO_ERROR_MMU_ERR_FLT", XidAction.APP_ERROR),
    32: XidInfo("PBDMA_ERROR", XidAction.RESTART_APP),
    43: XidInfo("RESETCHANNEL_VERIF_ERROR", XidAction.APP_ERROR),
    45: XidInfo("PREEMPTIVE_REMOVAL", XidAction.APP_ERROR),
    46: XidInfo("GPU_TIMEOUT_ERROR", _RESET),
    48: XidInfo("GPU_ECC_DBE", _RESET),
    61: XidInfo("PMU_BREAKPOINT", _RESET),
    62: XidInfo("PMU_HALT_ERROR", _RESET),
    63: XidInfo("INFOROM_DRAM_RETIREMENT_EVENT", XidAction.NONE),
    64: XidInfo("INFOROM_DRAM_RETIREMENT_FAILURE", _RESET),
    68: XidInfo("NVDEC0_ERROR", XidAction.APP_ERROR),
    74: XidInfo("NVLINK_ERROR", _RESET),
    79: XidInfo("GPU_HAS_FALLEN_OFF_THE_BUS", XidAction.REBOOT),
    92: XidInfo("EXCESSIVE_SBE_INTERRUPTS", XidAction.NONE),
    94: XidInfo("CONTAINED_ERROR", XidAction.RESTART_APP),
    95: XidInfo("UNCONTAINED_ERROR", _RESET),
    109: XidInfo("CTXSW_TIMEOUT_ERROR", _RESET),
    119: XidInfo("GSP_RPC_TIMEOUT", _RESET),
    120: XidInfo("GSP_ERROR", _RESET),
    121: XidInfo("C2C_ERROR", XidAction.NONE),
    136: XidInfo("ALI_TRAINING_FAIL", _RESET),
    140: XidInfo("UNRECOVERABLE_ECC_ERROR_ESCAPE", _RESET),
    143: XidInfo("GPU_INIT_ERROR", _RESET),
    **{xid: XidInfo("NVLINK_ERROR (NVLink5)", _RESET) for xid in range(144, 151)},
    154: XidInfo("GPU_RECOVERY_ACTION_CHANGED", XidAction.FOLLOW_RECOVERY_ACTION),
    155: XidInfo("NVLINK_SW_DEFINED", _RESET),
    156: XidInfo("RESOURCE_RETIREMENT_EVENT", _RESET),
    158: XidInfo("GPU_FATAL_TIMEOUT", _RESET),
}


def classify(xid: int) -> XidInfo:
    return XID_CATALOG.get(xid, XidInfo("unknown", XidAction.UNKNOWN))


@dataclass(frozen=True)
class XidEvent:
    """One XID on one GPU. `at` is wall-clock seconds, None when the log had no time."""

    bus_id: str
    xid: int
    at: float | None
    source: str
    message: str = ""


# "NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
# The bus id comes without the PCI function; NVIDIA GPUs are function 0.
XID_LINE = re.compile(
    r"NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(\.[0-7])?\): (\d+)"
)
# Where the time of a kernel log line comes from, in the order tried:
# /dev/kmsg record: "priority,sequence,microseconds since boot,flags;message".
KMSG_PREFIX = re.compile(r"^\d+,\d+,(\d+),[^;]*;")
# journalctl -o short-iso, rsyslog RFC 3339: "2026-11-30T15:28:53.123456+00:00 host kernel:"
ISO_PREFIX = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)")
# syslog RFC 3164, journalctl's default: "Nov 30 15:28:53 host kernel:" (local time, no year)
# (journalctl -o short-precise adds microseconds: "Nov 30 15:28:53.123456 host kernel:")
SYSLOG_PREFIX = re.compile(r"^([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)(?:\.\d+)? ")
# dmesg -T: "[Mon Nov 30 15:28:53 2026] message" (local time)
DMESG_T_PREFIX = re.compile(r"^\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]")
# dmesg, dmesg -x, "<4>[  123.456789]": seconds since boot, in brackets before the message.
SINCE_BOOT = re.compile(r"\[\s*(\d+\.\d+)\]")
DMESG_LINE = re.compile(r"^(?:<\d+>)?\[\s*\d+\.\d+\]")
# A line a kernel log holds, in any of the forms above.
KERNEL_LOG_FORMS = (KMSG_PREFIX, DMESG_LINE, DMESG_T_PREFIX, ISO_PREFIX, SYSLOG_PREFIX)


def in_kernel_log_form(line: str) -> bool:
    return any(form.match(line) for form in KERNEL_LOG_FORMS)


def parse_kernel_log(
    text: str, boot_time: float | None, now: float | None = None
) -> list[XidEvent]:
    """XID events in kernel log text: /dev/kmsg records, dmesg, journalctl or syslog lines.

    `boot_time` (wall-clock seconds) turns since-boot stamps into times; a log
    file with only since-boot stamps is taken to be of the current boot.
    Syslog stamps carry no year: the one that puts the line in the past
    (relative to `now`) is assumed.
    """
    events = []
    for line in text.splitlines():
        match = XID_LINE.search(line)
        if not match:
            continue
        try:
            bus = normalize_bus_id(f"{match.group(1)}{match.group(2) or '.0'}")
        except ValueError:
            continue  # a device number past 0x1f: not a line the driver wrote
        message = line[match.end() :].lstrip(", ").strip()
        at = _line_time(line[: match.start()], boot_time, time.time() if now is None else now)
        events.append(XidEvent(bus, int(match.group(3)), at, "kernel log", message))
    return events


def _line_time(prefix: str, boot_time: float | None, now: float) -> float | None:
    """Wall-clock time of a log line from the text before its message, None if unknown."""
    if match := KMSG_PREFIX.match(prefix):
        return None if boot_time is None else boot_time + int(match.group(1)) / 1e6
    if match := ISO_PREFIX.match(prefix):
        try:
            return datetime.fromisoformat(match.group(1).replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    if match := SYSLOG_PREFIX.match(prefix):
        return _local_time_without_year(match.group(1), now)
    if match := DMESG_T_PREFIX.match(prefix):
        return _local_time(match.group(1), "%a %b %d %H:%M:%S %Y")
    if match := SINCE_BOOT.search(prefix):
        return None if boot_time is None else boot_time + float(match.group(1))
    return None


def _local_time(text: str, layout: str) -> float | None:
    try:
        return time.mktime(time.strptime(" ".join(text.split()), layout))
    except (ValueError, OverflowError):
        return None


def _local_time_without_year(text: str, now: float) -> float | None:
    year = time.localtime(now).tm_year
    for candidate in (year, year - 1):
        at = _local_time(f"{candidate} {text}", "%Y %b %d %H:%M:%S")
        if at is not None and at <= now + 86400:
            return at
    return None


def parse_boot_time(proc_stat: str) -> float | None:
    """`btime` from /proc/stat: when the node booted, in wall-clock seconds."""
    for line in proc_stat.splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


KERNEL_LOG_LIMIT = 16 << 20
# /dev/kmsg is character device 1:11 (Documentation/admin-guide/devices.txt).
KMSG_DEVICE = (1, 11)


@dataclass(frozen=True)
class KernelLogText:
    text: str
    size: int | None  # bytes in the file; None for /dev/kmsg
    cut: bool  # only the last KERNEL_LOG_LIMIT bytes of the file were read


def read_kernel_log(path: Path) -> KernelLogText:
    """The kernel log: every record of /dev/kmsg, or the tail of a log file.

    /dev/kmsg hands out one record per read() and EAGAIN at the end (with
    O_NONBLOCK); EPIPE means the ring buffer overwrote the record we were at,
    and the next read continues with the oldest one left. Opening with
    O_NONBLOCK keeps a FIFO from blocking the open; a FIFO, a directory or a
    character device other than /dev/kmsg (/dev/null, /dev/zero) is refused,
    never read for ever. A file whose text has no line in any kernel log form
    (kmsg, dmesg, dmesg -T, journalctl, syslog) is refused too: it is not a
    clean log, it is the wrong file. ReadError names the path and why.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        if err.errno == errno.ENOENT:
            reason = "missing"
        elif err.errno in (errno.EACCES, errno.EPERM):
            reason = "permission denied"
        elif err.errno == errno.ELOOP:
            reason = "a symlink loop"
        else:
            reason = err.strerror or "cannot open"
        raise ReadError(path, reason) from err
    try:
        read = _read_records(fd, path)
    except OSError as err:
        raise ReadError(path, err.strerror or type(err).__name__) from err
    finally:
        os.close(fd)
    text = read.text
    if read.cut:
        text = text.partition("\n")[2]  # the first line was cut in the middle
    if not text.strip():
        raise ReadError(path, "empty: no kernel messages to read XIDs from")
    if not any(in_kernel_log_form(line) for line in text.splitlines()):
        binary = " (binary data)" if "\0" in text else ""
        raise ReadError(path, f"not a kernel log: no line in kmsg, dmesg or syslog form{binary}")
    return KernelLogText(text, read.size, read.cut)


def _read_records(fd: int, path: Path) -> KernelLogText:
    info = os.fstat(fd)
    mode = info.st_mode
    if stat.S_ISREG(mode):
        size = info.st_size
        start = max(size - KERNEL_LOG_LIMIT, 0)
        os.lseek(fd, start, os.SEEK_SET)
        chunks = []
        left = KERNEL_LOG_LIMIT  # a file still growing is read no further than this
        while left > 0 and (chunk := os.read(fd, min(1 << 20, left))):
            chunks.append(chunk)
            left -= len(chunk)
        return KernelLogText(b"".join(chunks).decode(errors="replace"), size, start > 0)
    if stat.S_ISDIR(mode):
        raise ReadError(path, "a directory, not a log file or /dev/kmsg")
    if stat.S_ISFIFO(mode):
        raise ReadError(path, "a FIFO, not a log file or /dev/kmsg")
    if not stat.S_ISCHR(mode):
        raise ReadError(path, "not a log file or /dev/kmsg")
    device = (os.major(info.st_rdev), os.minor(info.st_rdev))
    if device != KMSG_DEVICE:
        raise ReadError(
            path, f"character device {device[0]}:{device[1]}, not /dev/kmsg (1:11) or a log file"
        )
    records = []
    total = 0
    while total < KERNEL_LOG_LIMIT:
        try:
            record = os.read(fd, 8192)
        except BlockingIOError:
            break
        except OSError as err:
            if err.errno == errno.EPIPE:
                continue
            raise
        if not record:
            break
        records.append(record)
        total += len(record)
    return KernelLogText(b"".join(records).decode(errors="replace"), None, False)


@dataclass(frozen=True)
class KernelLogXids:
    events: list[XidEvent]
    boot_time: float | None  # when this boot began, wall-clock seconds (/proc/stat btime)
    # Set when only the tail of a huge log file was read: "the last 16 MiB of 40 MiB".
    cut: str | None = None


def kernel_log_xids(fs: NodeFS, path: Path) -> KernelLogXids:
    """XIDs in the kernel log at `path`; ReadError when it cannot be read."""
    read = read_kernel_log(path)
    try:
        boot_time = parse_boot_time(read_text(fs.proc("stat")))
    except ReadError:
        boot_time = None
    cut = None
    if read.cut and read.size is not None:
        cut = f"the last {KERNEL_LOG_LIMIT >> 20} MiB of {read.size / (1 << 20):.0f} MiB"
    return KernelLogXids(parse_kernel_log(read.text, boot_time), boot_time, cut)


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
        level = logging.INFO if quiet else logging.WARNING
        log.log(
            level if changed else logging.DEBUG,
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


@dataclass
class _Unregistered:
    """GPUs not listened to: those that cannot be (by bus id, or "GPU <index>"), and those
    whose registration hung (by index; retried), with why."""

    failed: dict[str, str] = field(default_factory=dict)
    hung: dict[int, str] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)

    def name_hung(self, session: NvmlSession) -> None:
        """Name each hung GPU by the bus id it reported in this session, if it ever did."""
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
