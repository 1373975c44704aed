"""Runs checks in isolation: an exception or a timeout is an `error` result, never a crash.

Each check runs in its own daemon thread with its own deadline. A check that
hangs (an NFS-backed file, a wedged driver) is abandoned, reported, and left
behind; the others still run and the caller is never blocked past the
longest timeout. The report names the file the check was stuck reading, from
fs.py's registry of reads in progress: its own thread's read, or else (it
waits for a shared read, such as the inventory, that another thread does) the
oldest read in progress.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import field
from typing import TypeVar

from nodecheck.checks.context import CheckContext
from nodecheck.checks.lazy_logging import get_logger
from nodecheck.checks.node.facts import PartUnavailableError
from nodecheck.checks.node.fs import reads_in_flight
from nodecheck.checks.record import record
from nodecheck.checks.registry import Check
from nodecheck.checks.result import NODE, Result, Status, worst

log = get_logger(__name__)

T = TypeVar("T")


class UnfinishedError(Exception):
    """Work that did not finish within its deadline; names the reads it was stuck on."""

    def __init__(self, what: str, timeout_s: float, stuck_reading: list[str]) -> None:
        message = f"{what} did not finish within {timeout_s:g} s"
        if stuck_reading:
            message += ", stuck reading " + ", ".join(stuck_reading)
        super().__init__(message)
        self.stuck_reading = stuck_reading


def run_bounded(function: Callable[[], T], what: str, timeout_s: float) -> T:
    """`function()` on a daemon thread under a deadline, for commands that read the node
    outside the checks (inventory, tune): its result or its exception, or UnfinishedError
    naming the path in flight when a read blocks in the kernel. The thread is left behind."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            outcome.append(function())
        except BaseException as err:
            failure.append(err)

    thread = threading.Thread(target=work, name=f"bounded-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        paths = stuck_paths(thread.ident)
        log.warning("event=timeout what=%r timeout_s=%s reading=%r", what, timeout_s, paths)
        raise UnfinishedError(what, timeout_s, paths)
    if failure:
        raise failure[0]
    return outcome[0]


@record(frozen=False)
class CheckRun:
    """The outcome of running one check. `completed` is False on an exception or timeout."""

    check: Check
    results: list[Result]
    duration_s: float
    completed: bool

    def __post_init__(self) -> None:
        # Every result carries its meaning from here on (Check.meant).
        self.results = [self.check.meant(result) for result in self.results]

    @property
    def status(self) -> Status:
        return worst(result.status for result in self.results)


@record(frozen=False)
class _Worker:
    check: Check
    thread: threading.Thread | None = None
    started: float = 0.0
    finished: float | None = None
    results: list[Result] = field(default_factory=list)
    failure: BaseException | None = None


def _run_one(worker: _Worker, ctx: CheckContext) -> None:
    try:
        worker.results = list(worker.check.run(ctx))
    except PartUnavailableError as err:
        # The facts it judges could not be read (or a capture lacks them): said as such.
        worker.results = [unjudged(worker.check, err)]
    except BaseException as err:
        worker.failure = err
    finally:
        worker.finished = time.monotonic()


def unjudged(check: Check, err: PartUnavailableError) -> Result:
    """The one result of a check whose facts could not be read: `error`, naming why."""
    unread = err.unread
    details: dict[str, object] = {"cause": unread.cause, "part": err.name}
    if unread.stuck_reading:
        details["stuck_reading"] = list(unread.stuck_reading)
    return Result(
        Status.ERROR,
        NODE,
        f"check {check.name} cannot judge: {unread.reason}",
        unread.remedy,
        details,
    )


def _current_cpu(allowed: set[int]) -> int:
    """The CPU this thread runs on (glibc's sched_getcpu(3)), if one of `allowed`; else the
    lowest of them."""
    try:
        import ctypes

        cpu = int(ctypes.CDLL(None, use_errno=True).sched_getcpu())
    except (OSError, AttributeError):
        return min(allowed)
    return cpu if cpu in allowed else min(allowed)


@contextlib.contextmanager
def one_cpu() -> Iterator[None]:
    """The calling thread, and the threads it starts meanwhile, held to one CPU of those
    it may run on; its own affinity as it was afterwards. For a one-shot command's checks.

    The checks' threads do Python work under one GIL, a few milliseconds each, between
    reads that release it. Spread over several CPUs, each release hands the GIL to a
    thread woken on another CPU, and the thread that released it, back from its read,
    waits for it (the "convoy effect" of the GIL since Python 3.2: Antoine Pitrou's
    report, https://bugs.python.org/issue7946, and David Beazley's "Understanding the
    Python GIL", PyCon 2010): the checks of `nodecheck check` on the 8-GPU replica
    took a median 70 ms on two CPUs and 55 ms on one (40 runs each, a 2-CPU VM), the
    same as running them one after another. On one CPU a thread back from a short read
    takes the GIL again before the scheduler runs another.

    The affinity set is the calling thread's only (sched_setaffinity(2): pid 0 is the
    calling thread), and a thread started meanwhile inherits it (pthread_create(3): "The
    new thread inherits a copy of the creating thread's ... CPU affinity mask"); the
    process's other threads, and this one afterwards, keep the set they had. A thread
    left behind (a check that timed out) stays on that one CPU."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux
        yield
        return
    if len(allowed) <= 1:
        yield
        return
    try:
        os.sched_setaffinity(0, {_current_cpu(allowed)})
    except OSError:  # the cpuset changed under us: run as we were
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, allowed)


def run_checks(checks: Sequence[Check], ctx: CheckContext) -> list[CheckRun]:
    workers = [_Worker(check) for check in checks]
    for worker in workers:
        worker.started = time.monotonic()
        worker.thread = threading.Thread(
            target=_run_one, args=(worker, ctx), name=f"check-{worker.check.name}", daemon=True
        )
        worker.thread.start()
    runs = []
    for worker in workers:
        assert worker.thread is not None
        remaining = worker.started + worker.check.timeout_s - time.monotonic()
        worker.thread.join(max(remaining, 0.0))
        runs.append(_outcome(worker))
    return runs


def _undetermined(
    check: Check, duration: float, summary: str, cause: str, stuck_reading: list[str] | None = None
) -> CheckRun:
    """A check that could not say anything: one `error` result naming it and the cause."""
    details: dict[str, object] = {"cause": cause}
    if stuck_reading:
        details["stuck_reading"] = stuck_reading
    result = Result(Status.ERROR, NODE, f"check {check.name} {summary}", details=details)
    return CheckRun(check, [result], duration, completed=False)


def stuck_paths(thread: int | None, limit: int = 2, since: float | None = None) -> list[str]:
    """The reads a timed-out check is held up by: its own thread's, else the oldest of the
    others (a shared read it waits for) that began after `since` (time.monotonic()): a read
    stuck since long before is some earlier run's, already reported by that run."""
    reads = reads_in_flight()
    own = [read.path for read in reads if read.thread == thread]
    others = [
        read.path
        for read in reads
        if read.thread != thread and (since is None or read.started >= since)
    ]
    return (own or others)[:limit]


def _outcome(worker: _Worker) -> CheckRun:
    check = worker.check
    if worker.finished is None:
        thread = worker.thread.ident if worker.thread is not None else None
        paths = stuck_paths(thread, since=worker.started - check.timeout_s)
        log.warning(
            "check=%s event=timeout timeout_s=%s reading=%r", check.name, check.timeout_s, paths
        )
        summary = f"did not finish within {check.timeout_s:g} s"
        if paths:
            summary += ", stuck reading " + ", ".join(paths)
        return _undetermined(check, check.timeout_s, summary, "timeout", paths)
    duration = worker.finished - worker.started
    if worker.failure is not None:
        err = worker.failure
        log.warning("check=%s event=crash error=%r", check.name, f"{type(err).__name__}: {err}")
        log.debug("check=%s traceback", check.name, exc_info=err)
        return _undetermined(check, duration, f"failed: {type(err).__name__}: {err}", "exception")
    if not worker.results:
        # Absence is never a pass: a check that says nothing could not determine.
        return _undetermined(check, duration, "returned no result", "no result")
    return CheckRun(check, worker.results, duration, completed=True)
