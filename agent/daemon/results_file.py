"""The agent's results file (the nodecheck.check/v2 document of agent/findings.py, read by
`nodecheck slurm health-check` and `nodecheck npd`), what /results serves (the same
document), written whole or not at all after every run, and whether that works.

A write that fails (a read-only or full filesystem, a folder gone or a file in its
place) is counted in nodecheck_results_write_failures_total, sets
nodecheck_results_last_write_successful to 0 and makes /healthz answer 503 with the
reason, until a write succeeds again; it is logged once per change of the reason, and
once when writes succeed again, never once per run. The embedded default path without
its folder is the agent run by hand, not installed as a service (`make run`: systemd's
RuntimeDirectory= or the DaemonSet's hostPath make the folder): said once, quietly, and
no failure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nodecheck.agent.config import DEFAULT_RESULTS_FILE
from nodecheck.agent.daemon.scheduler import ResultStore
from nodecheck.agent.findings import StoredRun, check_document, document_text
from nodecheck.checks.lazy_logging import ERROR, INFO, get_logger
from nodecheck.checks.node.output import OutputPathError, write_output
from nodecheck.checks.record import record

log = get_logger(__name__)


def stored_document(hostname: str, stored: Sequence[StoredRun]) -> str:
    """The results file's text: the check document of the latest runs, dated now."""
    return document_text(check_document(hostname, stored, time.time()))


def served_document(store: ResultStore, hostname: str) -> dict[str, Any]:
    """/results: the same document, each result with its check's age in seconds."""
    stored = store.all()
    now = time.time()
    document = check_document(hostname, stored, now)
    ages = {s.run.check.name: round(now - s.finished_at, 3) for s in stored}
    for row in document["results"]:
        row["age_seconds"] = ages.get(row["check"])
    return document


@record
class ResultsWrites:
    """How writing the results file goes: failed writes since the agent started, and why
    the latest one failed (None: it succeeded, or none was tried yet)."""

    failures: int = 0
    problem: str | None = None


class ResultsFile:
    """Writes the results file at `path_of()` (the configuration in force; None: no file),
    keeping count of how that goes. Safe to call from any thread."""

    def __init__(self, path_of: Callable[[], Path | None]) -> None:
        self._path_of = path_of
        self._lock = threading.Lock()
        self._failures = 0
        self._problem: str | None = None
        self._not_installed = False  # the default path, its folder absent

    def write(self, text: str) -> None:
        """Write `text` whole or not at all; never raises an OSError (it is counted)."""
        path = self._path_of()
        if path is None:
            return
        try:
            write_output(path, text, 0o600)  # the rule of every output path
        except OSError as err:
            self._failed(path, err)
            return
        with self._lock:
            recovered = self._problem is not None or self._not_installed
            self._problem, self._not_installed = None, False
        if recovered:
            log.info("event=results_written path=%s", path)

    def _failed(self, path: Path, err: OSError) -> None:
        problem = err.strerror or str(err)
        missing = isinstance(err, FileNotFoundError) or (
            isinstance(err, OutputPathError) and err.missing_folder
        )
        not_installed = missing and path == DEFAULT_RESULTS_FILE
        with self._lock:
            # Logged once per change: a missing default folder is remembered as such, not
            # as a problem (the agent run by hand), so compare with what was said last.
            said = (None if self._not_installed else self._problem, self._not_installed)
            changed = (None if not_installed else problem, not_installed) != said
            if not_installed:
                self._problem, self._not_installed = None, True
            else:
                self._failures += 1
                self._problem, self._not_installed = problem, False
        if changed:
            log.log(
                INFO if not_installed else ERROR,
                "event=results_write_failed path=%s error=%r",
                path,
                problem,
            )

    def state(self) -> ResultsWrites | None:
        """How writes go; None when there is no results file to write (none configured, or
        the default path without its folder)."""
        with self._lock:
            if self._path_of() is None or self._not_installed:
                return None
            return ResultsWrites(self._failures, self._problem)

    def health_problem(self) -> str | None:
        """For /healthz: why results are not being written, None while they are."""
        state = self.state()
        if state is None or state.problem is None:
            return None
        return f"results file not written: {state.problem}"
