"""The small JSON files nodecheck keeps between runs in its state folder (the healthy-run
count, the record of its drain, a hook's failure, a withheld drain): each one JSON object,
replaced atomically and readable by its owner only (but the note the agent reads), read
bounded, and removed without complaint when it is not there.

A file that cannot be read as such an object reads as none: each caller's safe side
(no healthy run yet, no drain of nodecheck's, nothing to take over)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

STATE_FILE_LIMIT = 4096  # bytes: one short JSON object (a Slurm reason is at most 255)


def load_state(path: Path, limit: int = STATE_FILE_LIMIT) -> dict[str, Any] | None:
    """The object in `path`; None when there is none, or it is no regular file, too
    large, or not a JSON object."""
    from nodecheck.checks.node.fs import NotRegularFileError, read_regular_file

    try:
        document = json.loads(read_regular_file(path, limit).decode("utf-8"))
    except (OSError, NotRegularFileError, ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def save_state(path: Path, document: dict[str, Any], mode: int = 0o600) -> None:
    """Replace `path` with `document` (atomically, `mode`), its folder made first;
    OSError when it cannot be."""
    from nodecheck.checks.node.fs import write_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(document) + "\n", mode=mode)


def forget_state(path: Path) -> None:
    """Remove `path`; nothing to remove (the file, or its folder, missing or not a folder)
    is no error. OSError when it cannot be removed (unlink needs no free space)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        path.unlink()
