"""Which all_reduce algorithm NCCL ran, from its own debug log (no torch here).

A node whose NCCL fell back from NVLS to Ring runs at three quarters of its peers'
bus bandwidth with nothing wrong in any counter (hardware.md's figures: 480 against
368 GB/s on 8x H100): the algorithm belongs beside every busbw figure. NCCL says
which it chose in its tuning log (NVIDIA/nccl src/enqueue.cc), written with
NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=TUNING to NCCL_DEBUG_FILE, one line per
collective, each prefixed by `host:pid:tid [dev] NCCL INFO ` (src/debug.cc), in
one of two forms:

- releases 2.1x-2.2x, on rank 0 only:
  `%ld Bytes -> Algo %d proto %d time %f`, the algorithm a number
  (src/include/device.h: NCCL_ALGO_TREE 0, RING 1, COLLNET_DIRECT 2,
  COLLNET_CHAIN 3, NVLS 4, NVLS_TREE 5, PAT 6);
- newer ones, on every rank:
  `Best tuning, algorithm, %s, protocol, %s`, the name from ncclAlgoStr
  ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"),
  without the size: the caller reads only the part of the file written while the
  payload's all_reduce was enqueued (`read_segment`).

Debug output goes through a line-buffered FILE (src/debug.cc: setlinebuf), so the
file's size after a collective returns covers that collective's lines.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

UNKNOWN = "unknown"
GLOO = "gloo"
# The part of a log read for one payload: a handful of lines is what one collective
# writes; anything beyond this is another program's output, not read.
MAX_SEGMENT_BYTES = 64 * 1024
# src/include/device.h, in NCCL_ALGO_* order.
ALGORITHMS_BY_NUMBER = (
    "tree",
    "ring",
    "collnet_direct",
    "collnet_chain",
    "nvls",
    "nvls_tree",
    "pat",
)
# ncclAlgoStr (src/enqueue.cc, later src/include/device.h), lower-cased as the metric's label.
ALGORITHMS_BY_NAME = {
    "tree": "tree",
    "ring": "ring",
    "collnetdirect": "collnet_direct",
    "collnetchain": "collnet_chain",
    "nvls": "nvls",
    "nvlstree": "nvls_tree",
    "pat": "pat",
}
_PREFIX = r"NCCL INFO\s+"
_OLD_FORM = re.compile(_PREFIX + r"(?P<bytes>\d+) Bytes -> Algo (?P<algo>\d+) proto \d+ time ")
_NEW_FORM = re.compile(_PREFIX + r"Best tuning, algorithm, (?P<name>[A-Za-z]+), protocol, ")


def algorithms_in(text: str, payload_bytes: int | None = None) -> list[str]:
    """The algorithms NCCL's tuning lines in `text` name, each once, in order of first
    appearance. Lines of the old form that give another size than `payload_bytes` are
    another collective's (a barrier's one-element all_reduce) and left out; the new form
    has no size and counts wherever it is. Anything else is not a tuning line."""
    found: list[str] = []
    for line in text.splitlines():
        name: str | None = None
        old = _OLD_FORM.search(line)
        if old is not None:
            if payload_bytes is not None and int(old.group("bytes")) != payload_bytes:
                continue
            number = int(old.group("algo"))
            name = ALGORITHMS_BY_NUMBER[number] if number < len(ALGORITHMS_BY_NUMBER) else None
        else:
            new = _NEW_FORM.search(line)
            if new is not None:
                name = ALGORITHMS_BY_NAME.get(new.group("name").lower())
        if name is not None and name not in found:
            found.append(name)
    return found


def algorithm_label(text: str, payload_bytes: int | None = None) -> str:
    """The metric label: the algorithms joined with `+`, or `unknown` when no tuning line
    names one (NCCL logged nothing, a truncated or foreign file)."""
    return "+".join(algorithms_in(text, payload_bytes)) or UNKNOWN


def log_size(path: Path | None) -> int | None:
    """The log file's size now (where the next lines will start), None without one."""
    if path is None:
        return None
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def read_segment(path: Path | None, start: int | None, limit: int = MAX_SEGMENT_BYTES) -> str:
    """What was appended to the log since `start`, at most `limit` bytes; "" when the file
    is missing, unreadable or shorter than `start` (truncated meanwhile)."""
    if path is None or start is None:
        return ""
    try:
        with open(path, "rb") as log:
            log.seek(start)
            data = log.read(limit)
    except OSError:
        return ""
    # A cut last line is left out: half a line could read as a different number.
    if len(data) == limit and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
    return data.decode("utf-8", errors="replace")


def log_files(directory: Path) -> list[Path]:
    """The NCCL logs in `directory` (NCCL_DEBUG_FILE=<directory>/nccl.%h.%p), by name."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [directory / name for name in sorted(names) if name.startswith("nccl.")]


def rank_log_file(directory: Path, pid: int) -> Path | None:
    """This process's log: src/debug.cc puts the host name for %h, cut at its first dot,
    and the pid for %p; found by the pid, so the host name need not be guessed. None
    before NCCL opened it."""
    suffix = f".{pid}"
    return next((path for path in log_files(directory) if path.name.endswith(suffix)), None)


# What is relayed of one rank's log: NCCL's warnings say why a rank failed (a CUDA error,
# a transport that could not connect), and with NCCL_DEBUG_FILE they go to the file.
MAX_WARNINGS = 20
MAX_WARNING_CHARS = 500


def warnings_in(text: str) -> list[str]:
    """NCCL's WARN lines in `text`, the first MAX_WARNINGS, each cut to MAX_WARNING_CHARS."""
    found = [line for line in text.splitlines() if " NCCL WARN " in line]
    return [line[:MAX_WARNING_CHARS] for line in found[:MAX_WARNINGS]]
