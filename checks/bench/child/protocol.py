"""The child's side of the JSON-lines protocol, and its tie to the parent (no torch here)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from typing import Any

PARENT_VARIABLE = "NODECHECK_BENCH_PARENT"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def emit(**message: Any) -> None:
    """One JSON line on stdout, flushed at once so the parent sees progress live."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def progress(fraction: float, what: str = "") -> None:
    emit(progress=round(min(max(fraction, 0.0), 1.0), 4), what=what)


def parse_line(line: bytes | str) -> dict[str, Any] | None:
    """A protocol message, or None for anything else a library printed to stdout
    (NCCL_DEBUG=INFO writes there)."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def die_with_parent() -> None:
    """Be killed when the process that started us dies (Ctrl-C on nodecheck, SIGTERM to
    the agent): the child runs in its own session, so no terminal signal reaches it, and
    a benchmark left behind would hold every GPU. Linux only; elsewhere a no-op."""
    expected = os.environ.get(PARENT_VARIABLE)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    # The parent may have died before prctl took effect.
    if expected is not None and os.getppid() != int(expected):
        os._exit(1)
