"""What `slurm health-check` remembers between runs: the healthy runs in a row, since
when, and on what evidence; in <state_dir>/slurm_health.json, under a lock beside it.

An undrain rests on this memory, so every rule here errs towards a later undrain:
- One run at a time: the whole run (judge, read the state, act, save) holds an exclusive
  flock(2) on slurm_health.json.lock, waited for within the run's budget. Two runs at
  once (slurmd's and an operator's) would otherwise both count on the same streak and
  lose each other's updates.
- A healthy run counts only on new evidence: the agent's results file judged again (the
  same `written_at` as the last counted run's) is the same observation, not one more
  run in a row. The quick checks health-check runs itself are new evidence every time.
- Intervals are on CLOCK_BOOTTIME (checks/node/boot.py), saved with the boot's id, so a
  wall-clock step (date -s, an NTP step) neither shortens nor lengthens them; a streak
  is of one boot, and a new boot starts it again. Wall-clock times are kept for the log.
- A run whose count cannot be saved never undrains on it (slurm_health.decide); an
  unhealthy run that cannot save the reset removes the file instead (which works on a
  full filesystem: unlink(2) frees space, it needs none), so the count it could not reset
  is never read back.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import stat
import time
from pathlib import Path
from typing import Any

from nodecheck.agent.state_files import forget_state, load_state, save_state
from nodecheck.checks.record import record

HYSTERESIS_FILE = "slurm_health.json"
STATE_LIMIT = 4096  # bytes; the state is one short JSON object
# How often a run waiting for another's lock tries again.
LOCK_RETRY_S = 0.05


@record
class Hysteresis:
    """Healthy runs in a row and when the first of them was, on this boot's clock and on
    the wall clock (None: the last run was not healthy); the `written_at` of the agent
    results the last counted run judged (None: none yet)."""

    healthy_runs: int = 0
    healthy_since: float | None = None  # CLOCK_BOOTTIME seconds: intervals are measured on it
    healthy_since_wall: float | None = None  # the same moment by the wall clock, for the log
    counted_results_at: float | None = None


@record
class Observation:
    """What one run saw: healthy or not, when (this boot's clock; the wall clock for the
    log) and the agent results' `written_at` it judged (None: its own run of the checks)."""

    healthy: bool
    at: float
    wall: float
    results_at: float | None = None


def already_counted(previous: Hysteresis, observation: Observation) -> bool:
    """A healthy run on the very agent results the last counted run judged."""
    return (
        observation.healthy
        and observation.results_at is not None
        and observation.results_at == previous.counted_results_at
    )


def next_hysteresis(previous: Hysteresis, observation: Observation) -> Hysteresis:
    if not observation.healthy:
        return Hysteresis()
    if already_counted(previous, observation):
        return previous
    since, since_wall = previous.healthy_since, previous.healthy_since_wall
    if since is None:
        since, since_wall = observation.at, observation.wall
    counted = (
        observation.results_at
        if observation.results_at is not None
        else previous.counted_results_at
    )
    return Hysteresis(previous.healthy_runs + 1, since, since_wall, counted)


def _number(value: Any) -> float | None:
    """A finite number of the saved state, None for null; ValueError for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"not a number: {value!r}")
    return float(value)


def load_hysteresis(path: Path, boot_id: str) -> Hysteresis:
    """The saved state of this boot. A missing or damaged file, or one of another boot
    (its clock readings mean nothing now), is no healthy run yet: the safe side, it only
    delays an undrain."""
    document = load_state(path, STATE_LIMIT)
    try:
        if document is None:
            return Hysteresis()
        runs = document["healthy_runs"]
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 0:
            return Hysteresis()
        if document["boot_id"] != boot_id:
            return Hysteresis()
        since = _number(document["healthy_since"])
        if (runs > 0) != (since is not None):
            return Hysteresis()
        return Hysteresis(
            runs,
            since,
            _number(document["healthy_since_wall"]),
            _number(document["counted_results_at"]),
        )
    except (ValueError, KeyError, TypeError):
        return Hysteresis()


def save_hysteresis(path: Path, state: Hysteresis, boot_id: str) -> None:
    """Replace the saved state; OSError when it cannot be."""
    document = {
        "boot_id": boot_id,
        "healthy_runs": state.healthy_runs,
        "healthy_since": state.healthy_since,
        "healthy_since_wall": state.healthy_since_wall,
        "counted_results_at": state.counted_results_at,
    }
    save_state(path, document)


def forget_hysteresis(path: Path) -> None:
    """Remove the saved state (no healthy run yet); OSError when it cannot be removed.
    Nothing to remove is no error (the file, or its folder, missing or not a folder)."""
    forget_state(path)


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


class HysteresisBusyError(Exception):
    """Another run held the lock for longer than this one may wait."""


class HysteresisLock:
    """The exclusive lock on the state's lock file, held from its making to `release()`
    (or to the process's end: a crashed run never holds it).

    It waits at most `wait_s` for another run to release it (HysteresisBusyError after
    that). OSError when the lock file cannot be opened: the state folder cannot be made,
    or the file made in it. An existing lock file is opened read-only, so a state folder
    gone read-only still serialises its runs (flock(2) needs no write access)."""

    def __init__(self, path: Path, wait_s: float) -> None:
        with contextlib.suppress(OSError):  # a folder that cannot be made fails the open
            path.parent.mkdir(parents=True, exist_ok=True)
        # O_NONBLOCK: a FIFO planted as the lock file would otherwise block the open for
        # ever (fifo(7)), past every budget; it is then refused as no regular file.
        flags = os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        self._descriptor = os.open(lock_path(path), flags, 0o600)
        opened = os.fstat(self._descriptor)
        if not stat.S_ISREG(opened.st_mode) or opened.st_uid != os.geteuid():
            os.close(self._descriptor)
            raise OSError(
                errno.EPERM,
                f"{lock_path(path)} is not a regular file of this user's (uid {os.geteuid()})",
            )
        started = time.monotonic()
        self.waited_s = 0.0  # how long another run kept this one waiting
        while True:
            try:
                fcntl.flock(self._descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                self.waited_s = time.monotonic() - started
                if self.waited_s >= wait_s:
                    self.release()
                    raise HysteresisBusyError(
                        f"another slurm health-check has held {lock_path(path)} for over "
                        f"{wait_s:g} s"
                    ) from None
                time.sleep(LOCK_RETRY_S)

    def release(self) -> None:
        os.close(self._descriptor)
