"""Which all_reduce algorithm NCCL ran, from its own debug log (no torch here).

A node whose NCCL fell back from NVLS to Ring runs at three quarters of its peers'
bus bandwidth with nothing wrong in any counter (docs/hardware.md §13: 482 against
368 GB/s on 8x H200): the algorithm belongs beside every busbw figure. NCCL says
which it chose in its tuning log, written with NCCL_DEBUG=INFO and
NCCL_DEBUG_SUBSYS=TUNING to NCCL_DEBUG_FILE, by rank 0 only, one line per collective,
each prefixed by `host:pid:tid [cudaDev] NCCL INFO ` (NVIDIA/nccl src/debug.cc). The
line's form depends on the release (NVIDIA/nccl src/enqueue.cc at each tag):

- before 2.20 the INFO line is commented out (only a TRACE line, in debug builds):
  nothing to read, the algorithm is `unknown`;
- 2.20-2.22: `%ld Bytes -> Algo %d proto %d time %f`, the algorithm a number
  (src/include/nccl_common.h: NCCL_ALGO_TREE 0, RING 1, COLLNET_DIRECT 2,
  COLLNET_CHAIN 3, NVLS 4, NVLS_TREE 5, PAT 6 from 2.23);
- 2.23: the collective first, `%s: %ld Bytes -> Algo %d proto %d time %f`
  (`AllReduce: 1048576 Bytes -> Algo 1 proto 2 time ...`, ncclFuncToString in
  src/collectives.cc);
- 2.24 onwards: `%s: %ld Bytes -> Algo %s proto %s channel{Lo..Hi}={%d..%d}`, the
  algorithm by ncclAlgoToString (src/collectives.cc: TREE, RING, COLLNET_DIRECT,
  COLLNET_CHAIN, NVLS, NVLS_TREE, PAT). Collectives NCCL runs with its symmetric-memory
  kernels (2.27 on: `AllReduce [Symmetric]: ... -> Kernel ...`) or the copy engines
  name no algorithm of this list: they read as `unknown`.

One pattern reads them all: an optional `Func: `, the bytes, the algorithm by number
or by name, lower-cased as the metric's label (`nvls_tree`). A line counts when its
size is the payload's and, where the collective is named, it is an AllReduce (a
barrier's one-element all_reduce has another size; a broadcast is not ours). The
caller reads only the part of the file written while the payload's first all_reduce
was enqueued (`read_segment`): debug output goes through an unbuffered (to 2.26:
setbuf(file, nullptr)) or line-buffered (2.27 on: setlinebuf) FILE in src/debug.cc,
so the file's size after a collective returns covers that collective's line.
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
# src/include/nccl_common.h, in NCCL_ALGO_* order; also the lower-cased names
# ncclAlgoToString gives (src/collectives.cc).
ALGORITHMS_BY_NUMBER = (
    "tree",
    "ring",
    "collnet_direct",
    "collnet_chain",
    "nvls",
    "nvls_tree",
    "pat",
)
ALL_REDUCE = "allreduce"  # ncclFuncToString(ncclFuncAllReduce), lower-cased
_TUNING_LINE = re.compile(
    r"NCCL INFO\s+(?:(?P<func>[A-Za-z]+): )?(?P<bytes>\d+) Bytes -> "
    r"Algo (?P<algo>\d+|[A-Za-z_]+) proto "
)


def _algorithm_name(algo: str) -> str | None:
    """A number of nccl_common.h or a name of ncclAlgoToString, as the label; None for
    anything else ("Unknown", a number past PAT)."""
    if algo.isdigit():
        number = int(algo)
        return ALGORITHMS_BY_NUMBER[number] if number < len(ALGORITHMS_BY_NUMBER) else None
    name = algo.lower()
    return name if name in ALGORITHMS_BY_NUMBER else None


def algorithms_in(text: str, payload_bytes: int | None = None) -> list[str]:
    """The algorithms NCCL's tuning lines in `text` name, each once, in order of first
    appearance. A line that gives another size than `payload_bytes` is another
    collective's (a barrier's one-element all_reduce), and one that names another
    collective than AllReduce is not ours: both are left out. Anything else is not a
    tuning line."""
    found: list[str] = []
    for line in text.splitlines():
        match = _TUNING_LINE.search(line)
        if match is None:
            continue
        func = match.group("func")
        if func is not None and func.lower() != ALL_REDUCE:
            continue
        if payload_bytes is not None and int(match.group("bytes")) != payload_bytes:
            continue
        name = _algorithm_name(match.group("algo"))
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


def warnings_in_file(path: Path) -> list[str]:
    """NCCL's WARN lines in the log at `path`: those of its first MAX_SEGMENT_BYTES
    (init: a transport that could not connect, a bad NCCL_* setting) and of its last
    (why a rank failed at the end), a long log's middle left out; [] when unreadable."""
    size = log_size(path) or 0
    if size <= 2 * MAX_SEGMENT_BYTES:
        return warnings_in(read_segment(path, 0, 2 * MAX_SEGMENT_BYTES))
    head = read_segment(path, 0)
    tail = read_segment(path, size - MAX_SEGMENT_BYTES)
    # The tail starts mid-line: its first, partial line is left out.
    tail = tail.partition("\n")[2]
    return warnings_in(head) + warnings_in(tail)
