"""The child's side of the JSON-lines protocol (no torch here)."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit(**message: Any) -> None:
    """One JSON line on stdout, flushed at once so the parent sees progress live."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def progress(fraction: float, what: str = "") -> None:
    emit(progress=round(min(max(fraction, 0.0), 1.0), 4), what=what)
