"""The benchmark state directory: past results, baselines, skip counts, and the run lock.

`benchmarks.json` holds, per key (benchmark, GPU UUID or device, dtype or
payload), the recent *good* results; a baseline is their rolling median, so a
GPU that degrades is compared with what it did when healthy, not with its own
decline. Writes are atomic (a temporary file in the same directory, fsync,
rename, fsync of the directory): a process killed mid-write leaves the old
file or the new one, never half of either, and the next write removes the
temporary it left. The directory is created only when it is nodecheck's own
default; one it is given must exist. A file that does not parse is
moved aside (`benchmarks.json.damaged-<time>`) and reported, never fatal.

`last_success` holds, per host and benchmark, when the last run that measured
ended (whatever its verdict): it survives an agent restart, so a node whose
benchmarks are always refused (GPUs busy) shows its last measurement ageing
rather than none at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nodecheck.checks.config import is_default_state_dir
from nodecheck.checks.node.fs import write_atomically
from nodecheck.checks.node.output import OutputPathError, output_directory_problem

STATE_FILE = "benchmarks.json"
LOCK_FILE = "bench.lock"  # .<hostname>
VERSION = 1


def _empty() -> dict[str, Any]:
    return {"version": VERSION, "runs": {}, "skips": {}, "last_success": {}}


class BenchBusyError(Exception):
    """Another benchmark holds the run lock."""


def parse_state(text: str) -> dict[str, Any]:
    """The state document; ValueError when it is not one, down to each entry."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError("not a nodecheck benchmark state (version 1)")
    runs, skips = data.get("runs"), data.get("skips")
    if not isinstance(runs, dict) or not isinstance(skips, dict):
        raise ValueError("'runs' and 'skips' must be objects")
    for key, entries in runs.items():
        if not isinstance(entries, list) or not all(
            isinstance(entry, dict)
            and isinstance(entry.get("value"), (int, float))
            and isinstance(entry.get("time"), (int, float))
            for entry in entries
        ):
            raise ValueError(f"runs[{key!r}] must be a list of {{time, value}} numbers")
    if not all(isinstance(count, int) for count in skips.values()):
        raise ValueError("skip counts must be integers")
    # Absent from files written before it existed.
    last = data.setdefault("last_success", {})
    if not isinstance(last, dict) or not all(
        isinstance(when, (int, float)) and not isinstance(when, bool) for when in last.values()
    ):
        raise ValueError("'last_success' must map names to times")
    return data


class BenchState:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE
        # Set when the file was damaged and moved aside during this run.
        self.problem: str | None = None

    def _load(self) -> dict[str, Any]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return _empty()
        try:
            return parse_state(text)
        except ValueError as err:
            aside = self.path.with_name(f"{STATE_FILE}.damaged-{int(time.time())}")
            os.replace(self.path, aside)
            self.problem = f"{self.path} was damaged ({err}); moved to {aside.name}"
            return _empty()

    def _ensure_directory(self) -> None:
        """Create nodecheck's own default state directory when missing; one it was given
        must exist (OutputPathError naming what it is instead)."""
        if is_default_state_dir(self.directory):
            self.directory.mkdir(parents=True, exist_ok=True)
            return
        problem = output_directory_problem(self.directory)
        if problem is not None:
            raise OutputPathError(problem)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._ensure_directory()
        with open(self.directory / f"{STATE_FILE}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _update(self, change: Callable[[dict[str, Any]], None]) -> None:
        with self._locked():
            data = self._load()
            change(data)
            write_atomically(self.path, json.dumps(data, indent=1, sort_keys=True) + "\n")

    def read(self) -> dict[str, Any]:
        with self._locked():
            return self._load()

    def baseline(self, key: str) -> float | None:
        """Median of the recent good results for `key`, None before the first one."""
        values = [run["value"] for run in self.read()["runs"].get(key, [])]
        return statistics.median(values) if values else None

    def record(self, values: dict[str, float], keep: int) -> None:
        """Add good results (key -> value), keeping the last `keep` of each key."""
        now = time.time()

        def change(data: dict[str, Any]) -> None:
            for key, value in values.items():
                runs = data["runs"].setdefault(key, [])
                runs.append({"time": now, "value": value})
                del runs[:-keep]

        self._update(change)

    def record_success(self, key: str, when: float) -> None:
        """`key` (host/benchmark) measured, its run ending at `when` (wall clock)."""

        def change(data: dict[str, Any]) -> None:
            data["last_success"][key] = when

        self._update(change)

    def last_success(self, key: str) -> float | None:
        """When `key` last measured, None before its first measurement."""
        when = self.read()["last_success"].get(key)
        return float(when) if when is not None else None

    def count_skip(self, reason: str) -> dict[str, int]:
        """Count a skip by its reason; every reason's count after it."""
        counts: dict[str, int] = {}

        def change(data: dict[str, Any]) -> None:
            data["skips"][reason] = int(data["skips"].get(reason, 0)) + 1
            counts.update(data["skips"])

        self._update(change)
        return counts

    @contextlib.contextmanager
    def exclusive_run(self, host: str) -> Iterator[None]:
        """Hold this host's run lock: two benchmarks at once would measure each other.
        Named after the host, so nodes sharing a state directory (NFS) do not queue."""
        self._ensure_directory()
        with open(self.directory / f"{LOCK_FILE}.{host}", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as err:
                raise BenchBusyError(str(self.directory / LOCK_FILE)) from err
            yield
