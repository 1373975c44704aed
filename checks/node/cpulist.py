"""The kernel's CPU list format ("0-55,112-167"), as in sysfs `cpulist` files.

Format: Documentation/admin-guide/cputopology.rst and lib/bitmap.c
(bitmap_parselist); ranges may carry a stride ("0-10:2") since Linux 4.x.
"""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse "0-3,8,10-14:2" into a set of CPU numbers; "" is the empty set."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return frozenset()
    for item in text.split(","):
        part, _, stride_text = item.strip().partition(":")
        stride = int(stride_text.split("/")[-1]) if stride_text else 1
        if "-" in part:
            first_text, last_text = part.split("-", 1)
            first, last = int(first_text), int(last_text)
            if last < first or stride < 1:
                raise ValueError(f"bad CPU range {part!r}")
            cpus.update(range(first, last + 1, stride))
        else:
            cpus.add(int(part))
    if any(cpu < 0 for cpu in cpus):
        raise ValueError(f"negative CPU number in {text!r}")
    return frozenset(cpus)


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
