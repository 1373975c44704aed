"""The kernel log as facts: its XID, SXid and AER lines, parsed, never its whole text.

A capture must be safe to send, and a kernel log holds more than GPU errors (user
names in audit lines, addresses): only the lines nodecheck judges are kept, each cut
to 200 characters by kernel_log.cut_message. What reading the log inferred and why it
could not be read (with the remedy: CAP_SYSLOG for /dev/kmsg under dmesg_restrict)
are kept with them, so an unreadable log stays "could not determine" after a round trip.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from nodecheck.checks.node import kernel_log as kernel_log_module
from nodecheck.checks.node.aer import AerEvent, parse_aer_events
from nodecheck.checks.node.fs import NodeFS, ReadError
from nodecheck.checks.node.kernel_log import cut_note, unreadable_log_remedy
from nodecheck.checks.node.sxid import SxidEvent, parse_sxids
from nodecheck.checks.node.xid import XidEvent, parse_kernel_log, read_boot_time
from nodecheck.checks.record import record

DEFAULT_SOURCE = "/dev/kmsg under the root filesystem"


@record
class KernelLogUnreadable:
    """Why the kernel log could not be read: ReadError's text and reason, and the remedy."""

    message: str
    reason: str
    remedy: str


@record
class KernelLogFacts:
    """The XIDs, SXids and AER error groups of the kernel log at `source`, or why it
    could not be read."""

    source: str  # the path read (or DEFAULT_SOURCE when even the path failed)
    boot_time: float | None  # when this boot began, wall-clock seconds (/proc/stat btime)
    xids: tuple[XidEvent, ...] = ()
    sxids: tuple[SxidEvent, ...] = ()
    cut: str | None = None  # "the last 16 MiB of 40 MiB" when only the tail was read
    notes: tuple[str, ...] = ()  # what reading the log inferred (KernelLogText.notes)
    unreadable: KernelLogUnreadable | None = None
    aer: tuple[AerEvent, ...] = ()

    def misdated(self, taken_at: float) -> tuple[str, str] | None:
        """The field of a capture taken at `taken_at` whose time no node gives, and why: a
        boot after the capture, or an event logged after it. Such a boot time would date
        every XID "before the last boot" (cleared by the reboot), so a hand-edited capture
        could turn an XID 79 into a pass. The parts are read after taken_at, within the
        capture's deadline, hence CLOCK_SLACK_S; /proc/stat's btime is the wall clock
        less the time since boot, as the kernel keeps it (Documentation/filesystems/proc.rst,
        "btime"), so it is never later than the read."""
        latest = taken_at + CLOCK_SLACK_S
        if self.boot_time is not None and not 0 <= self.boot_time <= latest:
            return "boot_time", _not_before(self.boot_time, taken_at, "a boot")
        events: list[tuple[str, float | None]] = [
            *((f"xids[{index}].at", event.at) for index, event in enumerate(self.xids)),
            *((f"sxids[{index}].at", event.at) for index, event in enumerate(self.sxids)),
            *((f"aer[{index}].at", event.at) for index, event in enumerate(self.aer)),
        ]
        for where, at in events:
            if at is not None and not 0 <= at <= latest:
                return where, _not_before(at, taken_at, "an event")
        return None


def _not_before(when: float, taken_at: float, what: str) -> str:
    if when < 0:
        return f"{when!r} is before 1970: no clock dates {what} so"
    return f"{when!r} is after the capture's taken_at {taken_at!r}: {what} it cannot have seen"


# How far past a capture's taken_at its parts' own times may be: the parts are read after
# it, within the capture's deadline, and NTP may step the clock meanwhile.
CLOCK_SLACK_S = 600.0


def kernel_log_version(path: Path) -> object:
    """What the log's facts were computed from: the file's identity, size and time (a
    log that grew or was rotated is read again). A file that cannot be stat'ed gets a
    fresh version each time: a failed read is never kept."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return object()
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def read_log_facts(kernel_log: Path | None, fs: NodeFS) -> KernelLogFacts:
    """The kernel log's facts: at `kernel_log`, else <rootfs>/dev/kmsg."""
    source = str(kernel_log) if kernel_log is not None else DEFAULT_SOURCE
    boot_time = read_boot_time(fs)
    try:
        path = kernel_log if kernel_log is not None else fs.host("/dev/kmsg")
        source = str(path)
        read = kernel_log_module.read_kernel_log(path)
    except ReadError as err:
        unreadable = KernelLogUnreadable(str(err), err.reason, unreadable_log_remedy(err))
        return KernelLogFacts(source, boot_time, unreadable=unreadable)
    now = time.time()
    return KernelLogFacts(
        source,
        boot_time,
        tuple(parse_kernel_log(read.text, boot_time)),
        tuple(parse_sxids(read.text, boot_time, now)),
        cut_note(read),
        read.notes,
        aer=tuple(parse_aer_events(read.text, boot_time, now)),
    )
