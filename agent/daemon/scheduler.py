"""The agent's scheduler: each check on its own interval, with jitter, never two at once.

Every check runs through the same runner as `nodecheck check` (its own thread,
its own deadline), from a thread of its own here, so a check that hangs holds
up nobody: the scheduler notes it as running and moves on, and the check is
not started again until that run ends. Results land in the ResultStore with
the time they finished; a scrape reads the store and never runs a check.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from nodecheck.agent.findings import StoredRun
from nodecheck.checks.context import CheckContext
from nodecheck.checks.lazy_logging import DEBUG, INFO, get_logger
from nodecheck.checks.record import record
from nodecheck.checks.registry import Check
from nodecheck.checks.result import Status
from nodecheck.checks.runner import CheckRun, run_checks

log = get_logger(__name__)
JITTER = 0.1  # up to 10 % of the interval, so a fleet's nodes do not all run at once


class ResultStore:
    """The latest run of each check (thread-safe)."""

    def __init__(self) -> None:
        self._runs: dict[str, StoredRun] = {}
        self._lock = threading.Lock()
        self.generation = 0  # bumped on every change: what a cached exposition keys on

    def put(self, run: CheckRun, interval_s: float) -> None:
        with self._lock:
            self._runs[run.check.name] = StoredRun(run, time.time(), interval_s)
            self.generation += 1

    def all(self) -> list[StoredRun]:
        with self._lock:
            return [self._runs[name] for name in sorted(self._runs)]

    def forget(self, names: set[str]) -> None:
        with self._lock:
            for name in names:
                self._runs.pop(name, None)
            self.generation += 1


def _stuck_checks() -> set[str]:
    """Checks whose earlier run the runner abandoned at its deadline and that is still
    stuck (its thread alive): not started again until it comes back, so a check hung
    for good costs one thread, not one per interval. Its last result, the timeout
    error, ages meanwhile, and the staleness alert sees it."""
    return {
        thread.name.removeprefix("check-")
        for thread in threading.enumerate()
        if thread.name.startswith("check-")
    }


def _running_elsewhere(scheduler: Scheduler) -> set[str]:
    """Checks another (replaced) scheduler is still running: threads named run-<check>
    that are not this scheduler's."""
    mine = {job.check.name for job in scheduler.jobs.values() if job.running}
    return {
        thread.name.removeprefix("run-")
        for thread in threading.enumerate()
        if thread.name.startswith("run-")
    } - mine


@record(frozen=False)
class Scheduled:
    check: Check
    interval_s: float
    due: float  # time.monotonic()
    running: bool = False
    group: str | None = None  # jobs of one group never run at once (the benchmarks)
    last_status: Status | None = None  # of the previous run, to log changes only


class Scheduler:
    """Runs checks when due. `run_now(name)` brings one forward (an XID event)."""

    def __init__(
        self,
        checks: list[tuple[Check, float]],
        make_context: Callable[[], CheckContext],
        store: ResultStore,
        on_run: Callable[[CheckRun], None] | None = None,
        exclusive: set[str] | None = None,
        previous: Scheduler | None = None,
    ) -> None:
        """`exclusive` names checks that must run one at a time (each benchmark would
        measure the others); they queue rather than skip. `previous` is the scheduler
        this one replaces (a reload): its due times carry over, so a reload does not
        rerun the daily benchmarks, and its runs still going count as running."""
        now = time.monotonic()
        carried: dict[str, Scheduled] = previous.jobs if previous is not None else {}
        self.jobs: dict[str, Scheduled] = {
            check.name: Scheduled(
                check,
                interval,
                carried[check.name].due if check.name in carried else now,
                group="exclusive" if check.name in (exclusive or ()) else None,
            )
            for check, interval in checks
        }
        self.make_context = make_context
        self.store = store
        self.on_run = on_run
        self.heartbeat = time.monotonic()  # the loop's last turn, for the watchdog
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(2)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def run_now(self, name: str) -> None:
        with self._lock:
            job = self.jobs.get(name)
            if job is not None:
                job.due = time.monotonic()
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.heartbeat = time.monotonic()
            try:
                nearest = self._turn()
            except Exception as err:  # never let the loop (and with it the watchdog) die
                log.error("event=scheduler_loop_failed error=%r", f"{type(err).__name__}: {err}")
                nearest = time.monotonic() + 1.0
            self._wake.wait(min(max(nearest - time.monotonic(), 0.05), 1.0))
            self._wake.clear()

    def _turn(self) -> float:
        """Start what is due; the time the next job falls due."""
        now = time.monotonic()
        stuck = _stuck_checks()
        elsewhere = _running_elsewhere(self)
        with self._lock:
            busy = {
                job.group
                for job in self.jobs.values()
                if job.group and (job.running or job.check.name in elsewhere)
            }
            due = []
            for job in self.jobs.values():
                if job.due > now or job.running or job.check.name in stuck | elsewhere:
                    continue
                if job.group is not None:
                    if job.group in busy:
                        continue  # stays due: runs when the group is free
                    busy.add(job.group)
                due.append(job)
            for job in due:
                job.running = True
                job.due = now + job.interval_s * (1 + random.uniform(0, JITTER))
            nearest = min((job.due for job in self.jobs.values()), default=now + 60)
        for job in due:
            try:
                threading.Thread(
                    target=self._run, args=(job,), name=f"run-{job.check.name}", daemon=True
                ).start()
            except RuntimeError as err:  # "can't start new thread": try again next time
                log.error("event=check_not_started check=%s error=%r", job.check.name, str(err))
                with self._lock:
                    job.running = False
        return nearest

    def _run(self, job: Scheduled) -> None:
        try:
            [run] = run_checks([job.check], self.make_context())
            if self._stop.is_set():
                return  # replaced by a reload meanwhile: the new scheduler speaks now
            self.store.put(run, job.interval_s)
            # The journal gets a line when a check's status changes; every run at debug.
            changed = run.status is not job.last_status
            job.last_status = run.status
            log.log(
                INFO if changed else DEBUG,
                "event=check check=%s status=%s duration_s=%.3f",
                run.check.name,
                run.status.value,
                run.duration_s,
            )
            if self.on_run is not None:
                self.on_run(run)
        except Exception as err:  # the runner already turns checks' failures into results
            log.error("event=scheduler_error check=%s error=%r", job.check.name, str(err))
        finally:
            with self._lock:
                job.running = False
