"""This boot, and a clock no one can step: for intervals a wall-clock jump must not shorten.

The boot's id is `<procfs>/sys/kernel/random/boot_id`, a random UUID the kernel makes
once per boot ("a UUID generated the first time this is retrieved, and unvarying after
that": the kernel's Documentation/admin-guide/sysctl/kernel.rst, "random"). The clock is
CLOCK_BOOTTIME, seconds since that boot, suspend included: "nonsettable", so neither
settimeofday(2), date -s nor an NTP step moves it (clock_gettime(2)). Its readings are
comparable only within one boot, hence the id with each.
"""

from __future__ import annotations

import re
import time

from nodecheck.checks.node.fs import NodeFS, ReadError, read_text
from nodecheck.checks.record import record

_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@record
class BootMoment:
    """A moment of this boot: the boot's id and CLOCK_BOOTTIME's seconds then."""

    boot_id: str
    seconds: float


def parse_boot_id(text: str) -> str | None:
    """The boot id in boot_id's text (a lowercase UUID), None for anything else."""
    value = text.strip()
    return value if _BOOT_ID.fullmatch(value) else None


def read_boot_moment(fs: NodeFS) -> BootMoment:
    """Now, on this boot's clock; ReadError when the boot's id cannot be read or is no
    UUID (without it a reading of the clock cannot be told from another boot's)."""
    path = fs.proc("sys", "kernel", "random", "boot_id")
    text = read_text(path)
    boot_id = parse_boot_id(text)
    if boot_id is None:
        raise ReadError(path, f"not a boot id: {text[:40]!r}")
    return BootMoment(boot_id, time.clock_gettime(time.CLOCK_BOOTTIME))
