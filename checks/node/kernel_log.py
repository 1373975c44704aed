"""The kernel log: reading it (/dev/kmsg or a log file) and the time of each line.

A kernel message reaches an operator's file in many forms, each with its own
stamp before the message (util-linux dmesg(1), journalctl(1) `--output`,
rsyslog's templates, RFC 3164 and RFC 5424):

    6,1234,5678901,-;MSG                                /dev/kmsg: microseconds since boot
    [  123.456789] MSG                                  dmesg, journalctl -o short-monotonic
    <4>[  123.456789] MSG                               dmesg -r (the priority first)
    [  123.456789 <    0.000040>] MSG                   dmesg -d: since boot, and the gap
    [<    0.000040>] MSG                                dmesg --time-format delta: gaps only
    [Tue Jan 21 04:41:44 2025] MSG                      dmesg -T, --time-format ctime (local)
    [Jan21 04:41] MSG, then [  +0.000090] MSG          dmesg --time-format reltime (local)
    2025-01-21T04:41:44,283302+00:00 MSG                dmesg --time-format iso (a comma)
    kern  :warn  : <any of the dmesg forms>             dmesg -x / --decode
    MSG                                                 dmesg -t, --time-format notime
    Jan 21 04:41:44 host kernel: MSG                    syslog (RFC 3164), journalctl -o short
    Jan 21 04:41:44.283302 host kernel: MSG             journalctl -o short-precise
    2025-01-21T04:41:44+0000 host kernel: MSG           journalctl -o short-iso(-precise)
    Tue 2025-01-21 04:41:44 UTC host kernel: MSG        journalctl -o short-full
    1737434504.283302 host kernel: MSG                  journalctl -o short-unix
    2025-01-21T04:41:44.283302+00:00 host kernel: MSG   rsyslog RFC 3339 (high precision)
    <4>1 2025-01-21T04:41:44.283302+00:00 host kernel - - - MSG     RFC 5424

`LineClock` turns the text before a message into wall-clock seconds and names
the form it read, so a result can say how a time was obtained ("local time, the
year inferred") or that the line had none.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from nodecheck.checks.node.fs import ReadError
from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.printable import printable
from nodecheck.checks.record import record

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH = "(?:" + "|".join(MONTHS) + ")"
_WEEKDAY = "(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"

# The sequence number and the microseconds are bounded: a line of digits is no record, and
# int() of more than 4300 digits raises (Python 3.11, sys.int_info.str_digits_check_threshold).
KMSG_PREFIX = re.compile(r"^\d{1,20},\d{1,20},(\d{1,20}),[^;]*;")
RFC5424_PREFIX = LazyPattern(r"^<\d{1,3}>1 (\S+) ")
PRIORITY_PREFIX = LazyPattern(r"^<\d{1,3}>")
# dmesg -x: "kern  :warn  : " (facility and level padded to 6 and 7 columns).
DECODE_PREFIX = LazyPattern(
    r"^(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7])\s*:"
    r"(?:emerg|alert|crit|err|warn|notice|info|debug)\s*:\s?"
)
ISO_PREFIX = LazyPattern(
    r"^(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?"
    r"(Z|[+-]\d\d(?::?\d\d)?)?(?=[\s\]]|$)"
)
SHORT_FULL_PREFIX = LazyPattern(
    rf"^{_WEEKDAY} (\d{{4}})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{{1,9}}))?"
    r" ([A-Za-z][\w+/-]*) "
)
CTIME_PREFIX = LazyPattern(rf"^\[{_WEEKDAY} ({_MONTH}) ([ \d]\d) (\d\d:\d\d:\d\d) (\d{{4}})\]")
RELTIME_BASE = LazyPattern(rf"^\[({_MONTH}) ?([ \d]?\d) (\d\d):(\d\d)\]")
RELTIME_STEP = LazyPattern(r"^\[\s*\+(\d+\.\d+)\]")
DELTA_ONLY = LazyPattern(r"^\[<\s*\d+\.\d+>\]")
SINCE_BOOT = LazyPattern(r"^\[\s*(\d+\.\d+)(?:\s*<\s*\d+\.\d+>)?\]")
SYSLOG_PREFIX = LazyPattern(rf"^({_MONTH}) ([ \d]\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{{1,9}}))? ")
UNIX_PREFIX = LazyPattern(r"^(\d{9,11}\.\d{1,9}) \S+ \S+: ")

# Lines of a log with no stamp at all (dmesg -t) are known by the NVIDIA driver's own
# prefixes: nothing else tells such a file from any text.
NVIDIA_MESSAGE = LazyPattern(
    r"^(?:NVRM: |nvidia-nvswitch\d*: |nvidia-nvlink: |nvidia [0-9a-f]{4}:)"
)

STAMPED_FORMS: tuple[re.Pattern[str] | LazyPattern, ...] = (
    KMSG_PREFIX,
    RFC5424_PREFIX,
    ISO_PREFIX,
    SHORT_FULL_PREFIX,
    CTIME_PREFIX,
    RELTIME_BASE,
    RELTIME_STEP,
    DELTA_ONLY,
    SINCE_BOOT,
    SYSLOG_PREFIX,
    UNIX_PREFIX,
)


def _strip_envelope(line: str) -> str:
    """The line without a syslog priority ("<4>") and dmesg -x's facility and level."""
    if match := PRIORITY_PREFIX.match(line):
        line = line[match.end() :]
    if match := DECODE_PREFIX.match(line):
        line = line[match.end() :]
    return line


def in_kernel_log_form(line: str) -> bool:
    """A line as one of the forms above writes it (a stamp, or an NVIDIA driver message)."""
    if KMSG_PREFIX.match(line) or RFC5424_PREFIX.match(line):
        return True
    bare = _strip_envelope(line)
    return any(form.match(bare) for form in STAMPED_FORMS) or bool(NVIDIA_MESSAGE.match(bare))


# How much of a line's message a result shows. A line is what the log holds, which may be
# anything (a 10 MB line of one message): what reaches a summary, a detail or the agent's
# state is cut to this, and says so.
MESSAGE_LIMIT = 200


def cut_message(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text` as a result shows it: its control characters escaped ("\\x1b", printable()),
    and only its first `limit` characters, and how long it was, when it is longer."""
    shown = printable(text[:limit])
    if len(text) <= limit:
        return shown
    return f"{shown}… (cut: {len(text)} characters in all)"


@record
class Stamp:
    """When a line was logged (wall-clock seconds, None if unknown) and how that was read."""

    at: float | None
    form: str


NO_TIME = "no time on the line"
# A zone name as a line writes it is shown this long at most (the tz database's longest
# names, "America/Argentina/ComodRivadavia", are 32 characters).
ZONE_NAME_LIMIT = 40
# How far in the future a stamp without a year may be and still be this year's: the
# clocks of the node that wrote the log and of the one reading it may differ a little.
YEARLESS_SKEW_S = 300.0


class LineClock:
    """Times of the lines of one log, read in order (dmesg's reltime form counts on it).

    `boot_time` (wall-clock seconds, /proc/stat btime) turns since-boot stamps
    into times: such a stamp is taken to be of the current boot. Stamps without a
    year (syslog, reltime) get the latest year that puts them in the past of `now`
    (a few minutes of clock skew allowed; the form says which year was taken), and
    stamps without a zone are local time, as dmesg -T and syslog write them.
    """

    def __init__(self, boot_time: float | None, now: float) -> None:
        self.boot_time = boot_time
        self.now = now
        self._previous: float | None = None  # the last reltime line's time
        self._previous_year = ""  # how the last reltime line's year was chosen

    def _since_boot(self, seconds: float, form: str) -> Stamp:
        if self.boot_time is None:
            return Stamp(None, f"{form}; the boot time is unknown")
        return Stamp(self.boot_time + seconds, f"{form}, taken to be of this boot")

    def stamp(self, prefix: str) -> Stamp:
        """The time of a line from the text before its message.

        A reltime log's steps count from the line before, so in such a log every
        line is to be stamped, in order (`every_line_counts`)."""
        if match := KMSG_PREFIX.match(prefix):
            return self._since_boot(int(match.group(1)) / 1e6, "kmsg: since boot")
        if match := RFC5424_PREFIX.match(prefix):
            iso = ISO_PREFIX.match(match.group(1))
            if iso is None:
                return Stamp(None, "RFC 5424 without a time")
            return Stamp(_iso_time(iso), "RFC 5424")
        text = _strip_envelope(prefix)
        if match := ISO_PREFIX.match(text):
            zone = "" if match.group(8) else " (no zone: local time)"
            return Stamp(_iso_time(match), f"ISO 8601{zone}")
        if match := SHORT_FULL_PREFIX.match(text):
            return self._short_full(match)
        if match := CTIME_PREFIX.match(text):
            month, day, clock, year = match.groups()
            at = _local(f"{year} {month} {day.strip()} {clock}", "%Y %b %d %H:%M:%S")
            return Stamp(at, "dmesg -T (local time)")
        if match := RELTIME_BASE.match(text):
            month, day, hour, minute = match.groups()
            at, year = self._without_year(
                f"{month} {day.strip()} {hour}:{minute}:00", "%b %d %H:%M:%S"
            )
            self._previous = at
            self._previous_year = year
            return Stamp(at, f"dmesg reltime (local time to the minute, {year})")
        if match := RELTIME_STEP.match(text):
            if self._previous is None:
                return Stamp(None, "dmesg reltime step before any full time")
            self._previous += float(match.group(1))
            return Stamp(
                self._previous, f"dmesg reltime (local time to the minute, {self._previous_year})"
            )
        if DELTA_ONLY.match(text):
            return Stamp(None, "dmesg delta: gaps between lines, no time")
        if match := SINCE_BOOT.match(text):
            return self._since_boot(float(match.group(1)), "seconds since boot")
        if match := SYSLOG_PREFIX.match(text):
            month, day, hour, minute, second, fraction = match.groups()
            text = f"{month} {day.strip()} {hour}:{minute}:{second}"
            at, year = self._without_year(text, "%b %d %H:%M:%S")
            if at is not None and fraction:
                at += float(f"0.{fraction}")
            return Stamp(at, f"syslog (local time, {year})")
        if match := UNIX_PREFIX.match(text):
            return Stamp(float(match.group(1)), "seconds since the epoch")
        return Stamp(None, NO_TIME)

    def _short_full(self, match: re.Match[str]) -> Stamp:
        year, month, day, hour, minute, second, fraction, zone = match.groups()
        fields = (int(year), int(month), int(day), int(hour), int(minute), int(second))
        part = float(f"0.{fraction}") if fraction else 0.0
        if zone in ("UTC", "GMT", "Z"):
            try:
                at = datetime(*fields, tzinfo=timezone.utc).timestamp() + part
            except (ValueError, OverflowError, OSError):
                return Stamp(None, "journalctl short-full with an impossible date")
            return Stamp(at, "journalctl short-full (UTC)")
        try:
            local = time.mktime((*fields, 0, 0, -1)) + part
        except (OverflowError, ValueError):
            return Stamp(None, "journalctl short-full with an impossible date")
        zone = cut_message(zone, ZONE_NAME_LIMIT)  # the form reaches every result's details
        return Stamp(local, f"journalctl short-full (zone {zone} read as this node's local time)")

    def _without_year(self, text: str, layout: str) -> tuple[float | None, str]:
        """The latest time of `text` (no year) not after now, and how its year was chosen.

        A line is never from the future: "Dec 2" read on Dec 1 is last year's (only a
        clock skew of YEARLESS_SKEW_S between the writer and this node is allowed). "Feb 29"
        is of the latest leap year, which may be up to 8 years back (2096 to 2104 has
        none: 2100 is not a leap year)."""
        year = time.localtime(self.now).tm_year
        for candidate in range(year, year - 9, -1):
            at = _local(f"{candidate} {text}", f"%Y {layout}")
            if at is not None and at <= self.now + YEARLESS_SKEW_S:
                inferred = "this year" if candidate == year else str(candidate)
                return at, f"the year inferred: {inferred}"
        return None, "no year puts it in the past"


# A reltime log's first line of a minute: "[Jan21 04:41]", maybe after dmesg -x's prefix.
RELTIME_ANYWHERE = re.compile(rf"^(?:\w+\s*:\w+\s*:\s?)?\[{_MONTH} ?[ \d]?\d \d\d:\d\d\]", re.M)


def every_line_counts(text: str) -> bool:
    """Whether the time of a line depends on the lines before it (dmesg reltime)."""
    return RELTIME_ANYWHERE.search(text) is not None


def _iso_time(match: re.Match[str]) -> float | None:
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        moment = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second))
    except ValueError:
        return None
    part = float(f"0.{fraction}") if fraction else 0.0
    try:
        if not zone:
            return time.mktime(moment.timetuple()) + part
        if zone == "Z":
            offset = timedelta(0)
        else:
            digits = zone[1:].replace(":", "")
            hours, minutes = int(digits[:2]), int(digits[2:4] or 0)
            offset = timedelta(hours=hours, minutes=minutes) * (1 if zone[0] == "+" else -1)
        return moment.replace(tzinfo=timezone(offset)).timestamp() + part
    except (ValueError, OverflowError, OSError):
        return None  # a zone past 24 h, or a date the platform cannot convert


def _local(text: str, layout: str) -> float | None:
    try:
        return time.mktime(time.strptime(" ".join(text.split()), layout))
    except (ValueError, OverflowError):
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


@record
class KernelLogText:
    text: str
    size: int | None  # bytes in the file; None for /dev/kmsg
    cut: bool  # only the last KERNEL_LOG_LIMIT bytes of the file were read
    # What the reading inferred, for the results' details ("3 runs of NUL bytes ...").
    notes: tuple[str, ...] = ()


# A run of NUL bytes in a log file: after a crash or a power loss, a file whose new size
# reached the disk before its data reads back as zeros there (the XFS FAQ, xfs.org/index.php/
# XFS_FAQ, "Why do I see binary NULLS in some files after recovery when I unplugged the
# power?"), so a syslog file holds NULs where lines were being written, and the daemon's
# next line, after the reboot, follows them. The run ends a line (what came before it never
# got its newline) and the text after it starts one.
NUL_RUN = re.compile("\0+")


def _nul_runs_as_line_breaks(text: str) -> tuple[str, str | None]:
    """`text` with each run of NUL bytes made a line break, and a note saying so (None when
    it had none)."""
    runs = NUL_RUN.findall(text)
    if not runs:
        return text, None
    nuls = sum(len(run) for run in runs)
    times = "run" if len(runs) == 1 else "runs"
    note = (
        f"{len(runs)} {times} of NUL bytes ({nuls} bytes) read as line breaks "
        "(what a crash leaves in a log file that was being written)"
    )
    return NUL_RUN.sub("\n", text), note


def read_kernel_log(path: Path) -> KernelLogText:
    """The kernel log: every record of /dev/kmsg, or the tail of a log file.

    /dev/kmsg hands out one record per read() and EAGAIN at the end (with
    O_NONBLOCK); EPIPE means the ring buffer overwrote the record we were at,
    and the next read continues with the oldest one left. Opening with
    O_NONBLOCK keeps a FIFO from blocking the open; a FIFO, a directory or a
    character device other than /dev/kmsg (/dev/null, /dev/zero) is refused,
    never read for ever. A file whose text has no line in any kernel log form
    (above) is refused too: it is not a clean log, it is the wrong file. Runs of NUL
    bytes end lines (`NUL_RUN`; the result's `notes` say so). Of a file read by its
    tail, the first line is cut in the middle and left out: a tail with no line's end in
    it is refused, never taken for an empty log. ReadError names the path and why.
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
    text, nul_note = _nul_runs_as_line_breaks(read.text)
    if read.cut:
        # The first line was cut in the middle: the text starts after its end.
        _, newline, text = text.partition("\n")
        tail = f"the last {KERNEL_LOG_LIMIT >> 20} MiB read (of {_mib(read.size)})"
        if not newline:
            raise ReadError(
                path, f"no line ended within {tail}: one line longer than that, or not a log"
            )
        if not text.strip():
            raise ReadError(
                path, f"no whole line within {tail}: only the end of one longer than that"
            )
    if not text.strip():
        if nul_note:
            raise ReadError(path, "only NUL bytes: no kernel messages to read XIDs from")
        raise ReadError(path, "empty: no kernel messages to read XIDs from")
    if not any(in_kernel_log_form(line) for line in text.splitlines()):
        binary = " (binary data)" if nul_note else ""
        raise ReadError(path, f"not a kernel log: no line in kmsg, dmesg or syslog form{binary}")
    return KernelLogText(text, read.size, read.cut, (nul_note,) if nul_note else ())


def _mib(size: int | None) -> str:
    return "an unknown size" if size is None else f"{size / (1 << 20):.0f} MiB"


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


def cut_note(read: KernelLogText) -> str | None:
    """ "the last 16 MiB of 40 MiB" when only the tail of a huge log file was read."""
    if read.cut and read.size is not None:
        return f"the last {KERNEL_LOG_LIMIT >> 20} MiB of {_mib(read.size)}"
    return None


def unreadable_log_remedy(err: ReadError) -> str:
    """What to do about a kernel log that could not be read: /dev/kmsg under
    kernel.dmesg_restrict=1 needs CAP_SYSLOG (Documentation/admin-guide/sysctl/kernel.rst,
    dmesg_restrict)."""
    if err.reason == "missing":
        return "no kernel log at that path (a captured tree?): point --kernel-log at one"
    if err.reason == "permission denied":
        return (
            "run as root (or with CAP_SYSLOG), set kernel.dmesg_restrict=0, or point "
            "--kernel-log at a readable copy of the kernel log"
        )
    return "point --kernel-log at the kernel log (/dev/kmsg, or a kern.log file)"


def line_age(seconds: float) -> str:
    """How long ago a log line was written, as results say it: "45 s", "12 min", "3 h", "2 d"."""
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"
