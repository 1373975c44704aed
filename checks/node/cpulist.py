"""The kernel's CPU list format ("0-55,112-167"), as in sysfs `cpulist` files.

Format: Documentation/admin-guide/cputopology.rst and lib/bitmap.c
(bitmap_parselist); ranges may carry a stride ("0-10:2", or "0-10:2/4": two of
every four) since Linux 4.x.

A CPU list names CPUs the kernel can have: ids below the number of possible
CPUs (`<sysfs>/devices/system/cpu/possible`, cputopology.rst, or the cpuN
directories where a tree shows more), which is at most NR_CPUS. x86 bounds
NR_CPUS at 8192 (arch/x86/Kconfig, NR_CPUS_RANGE_END with MAXSMP), as do powerpc
and arm64 (4096) at most. Every range is checked against
that bound before it is expanded, so "0-2147483647" is an error, not a set of
two billion integers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from nodecheck.checks.node.fs import ImplausibleValueError, NodeFS, ReadError, list_dir, read_text

NR_CPUS_MAX = 8192


def _number(text: str) -> int:
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise ValueError(f"not a CPU number: {text!r}")
    return int(text)


def parse_cpulist(text: str, cpu_bound: int = NR_CPUS_MAX) -> frozenset[int]:
    """Parse "0-3,8,10-14:2" into a set of CPU numbers; "" is the empty set.

    Every CPU must be below `cpu_bound` (the possible CPUs, see cpu_id_bound):
    ImplausibleValueError (a ValueError) names the first one that is not.
    """
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return frozenset()
    items = text.split(",")
    if len(items) > cpu_bound:
        raise ImplausibleValueError(
            f"{len(items)} CPU ranges, more than the {cpu_bound} CPUs the kernel can have"
        )
    # The kernel prints each CPU once: ranges that together name more CPUs than there can
    # be are not its output, and expanding them would cost time without bound.
    spanned = 0
    for item in items:
        part, _, stride_text = item.strip().partition(":")
        # "a-b:used/group" takes the first `used` CPUs of every `group` (bitmap_parselist);
        # a bare "a-b:step" is read as every step-th CPU.
        used_text, slash, group_text = stride_text.partition("/")
        used = _number(used_text) if stride_text else 1
        group = _number(group_text) if slash else used
        if used < 1 or group < used:
            raise ValueError(f"bad CPU range stride {item!r}")
        if not slash:
            used, group = 1, used
        if "-" in part:
            first_text, last_text = part.split("-", 1)
            first, last = _number(first_text), _number(last_text)
            if last < first:
                raise ValueError(f"bad CPU range {part!r}")
        else:
            first = last = _number(part)
        if last >= cpu_bound:
            raise ImplausibleValueError(
                f"CPU {last} is beyond the {cpu_bound} CPUs the kernel can have (0-{cpu_bound - 1})"
            )
        spanned += last - first + 1
        if spanned > cpu_bound:
            raise ImplausibleValueError(
                f"the ranges name more than the {cpu_bound} CPUs the kernel can have"
            )
        if group == 1:  # the usual "a-b": no stride to test each CPU against
            cpus.update(range(first, last + 1))
        else:
            cpus.update(cpu for cpu in range(first, last + 1) if (cpu - first) % group < used)
    return frozenset(cpus)


def parse_cpumask(text: str, cpu_bound: int = NR_CPUS_MAX) -> frozenset[int]:
    """Parse the kernel's hexadecimal CPU mask ("00000000,00000101": CPUs 0 and 8).

    The `cpumap`, `thread_siblings` and `core_siblings` files print comma-separated
    32-bit words, most significant first (lib/bitmap.c, bitmap_print_to_pagebuf with
    list=false); kernels before the `*_list` files (2.6.2x) have only these. The
    first word may be shorter ("03" on a kernel built with NR_CPUS=2). A mask with
    more words than `cpu_bound` CPUs need, or a bit at or past the bound, is
    ImplausibleValueError.
    """
    text = text.strip()
    if not text:
        return frozenset()
    words = text.split(",")
    if len(words) > NR_CPUS_MAX // 32:
        raise ImplausibleValueError(
            f"{len(words)} mask words, more than {NR_CPUS_MAX} CPUs (NR_CPUS at most) need"
        )
    value = 0
    for word in words:
        if not 1 <= len(word) <= 8 or not all(c in "0123456789abcdefABCDEF" for c in word):
            raise ValueError(f"not a 32-bit hexadecimal mask word: {word!r}")
        value = (value << 32) | int(word, 16)
    if value >> cpu_bound:
        raise ImplausibleValueError(
            f"CPU {value.bit_length() - 1} is beyond the {cpu_bound} CPUs the kernel can have"
        )
    return frozenset(bit for bit in range(value.bit_length()) if value >> bit & 1)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The inverse of parse_cpulist: {0,1,2,3,8} -> "0-3,8"."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    index = 0
    while index < len(ordered):
        start = ordered[index]
        while index + 1 < len(ordered) and ordered[index + 1] == ordered[index] + 1:
            index += 1
        end = ordered[index]
        ranges.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(ranges)


def cpu_id_bound(fs: NodeFS) -> int:
    """One past the highest CPU id a list may name: the largest of `devices/system/cpu/
    possible` and the cpuN directories, never above NR_CPUS_MAX (NR_CPUS_MAX without
    either).

    `possible` alone is no hard bound: a tree whose `possible` reads 0-3 beside cpu0-cpu7
    directories and an `online` of 0-7 contradicts itself, and bounding by `possible`
    would reject every list (no CPU, every node unreadable). The reading takes the CPUs
    the directories show and says so (see possible_contradiction)."""
    highest = max(_possible(fs) or {-1})
    highest = max(highest, max(_cpu_directories(fs), default=-1))
    return min(highest + 1, NR_CPUS_MAX) if highest >= 0 else NR_CPUS_MAX


def _possible(fs: NodeFS) -> frozenset[int] | None:
    try:
        return parse_cpulist(read_text(fs.sys("devices", "system", "cpu", "possible")))
    except (ReadError, ValueError):
        return None


def _cpu_directories(fs: NodeFS) -> frozenset[int]:
    try:
        entries = list_dir(fs.sys("devices", "system", "cpu"))
    except ReadError:
        return frozenset()
    numbers = (re.fullmatch(r"cpu(\d+)", entry) for entry in entries)
    return frozenset(n for m in numbers if m and (n := int(m.group(1))) < NR_CPUS_MAX)


def possible_contradiction(fs: NodeFS, cpus: frozenset[int]) -> str | None:
    """A note when `cpus` (the online ones) go past `possible`: the kernel never onlines
    a CPU it does not count possible (Documentation/admin-guide/cputopology.rst), so the
    tree contradicts itself; the lists were read up to the cpuN directories instead."""
    possible = _possible(fs)
    if not possible or not cpus - possible:
        return None
    return (
        f"devices/system/cpu/possible reads {format_cpulist(possible)} but CPUs "
        f"{format_cpulist(cpus - possible)} are online: sysfs contradicts itself; lists were "
        "read up to the highest cpuN directory instead"
    )
