"""Findings: a check's results as everything that acts on a node reads them, and the one
document that stores them.

A `Finding` is one judged result with its meaning whole (checks/result.py: the action it
asks for, its fault class, whether the evidence is the node's or a job's), as the check
declared it or the result set it. Slurm's drain, reboot and prolog gate, the Kubernetes
conditions and taint, `nodecheck npd`, the exporter's verdict metric and the alert rules
read these fields and nothing else: no table of check names outside a check's module.

The document is `nodecheck.check/v2`: what `nodecheck check --json` prints, what the
agent serves on /results and writes to its results file (with each check's time, which
`slurm health-check` and `npd` need to tell a fresh result from a stale one). v2 adds
each result's action, class and origin and the checks' times to v1's rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nodecheck.checks.printable import one_line
from nodecheck.checks.record import record
from nodecheck.checks.registry import Check
from nodecheck.checks.result import (
    UNPRIVILEGED,
    Action,
    FaultClass,
    Origin,
    Result,
    Status,
    worst,
)
from nodecheck.checks.runner import CheckRun

CHECK_SCHEMA = "nodecheck.check/v2"
RESULTS_LIMIT = 8 << 20  # bytes; an 8-GPU node's results are tens of kB
LINE_MAX_BYTES = 4096  # a finding's line anywhere one is shown whole


@record
class StoredRun:
    """A check's run as stored: in the agent's store, its results file, or one `check`."""

    run: CheckRun
    finished_at: float  # wall clock
    interval_s: float


@record
class Finding:
    """One judged result: which check, about what, how bad, and what it means."""

    check: str
    status: Status
    subject: str
    summary: str
    action: Action = Action.INVESTIGATE
    fault_class: FaultClass = FaultClass.GPU_HARDWARE
    origin: Origin = Origin.NODE
    remedy: str = ""
    # A `skip` for what this process may never read (details["cause"] UNPRIVILEGED):
    # not judged, where another reader (root) would judge it.
    unseen: bool = False

    def line(self, max_bytes: int = LINE_MAX_BYTES) -> str:
        """ "<check> <subject>: <summary>" on one line of at most max_bytes (a Slurm
        reason, an NPD message, a condition, a prolog's stderr line)."""
        return one_line(f"{self.check} {self.subject}: {self.summary}", max_bytes)

    @property
    def node_failing(self) -> bool:
        """A failure the node's own evidence shows: what may take it out of service.
        A job's environment never does (any user could drain any node by setting a
        variable); its finding still reaches the job's user and the alerts."""
        return self.status is Status.FAIL and self.origin is Origin.NODE

    @property
    def status_against_node(self) -> Status:
        """The status as a verdict on the node: a job's failure counts as a warning."""
        if self.status is Status.FAIL and self.origin is not Origin.NODE:
            return Status.WARN
        return self.status


def finding(check: Check, result: Result) -> Finding:
    """The finding of one of `check`'s results, its meaning filled in from the check."""
    meant = check.meant(result)
    assert meant.action is not None and meant.fault_class is not None
    assert meant.origin is not None
    return Finding(
        check.name,
        meant.status,
        meant.subject,
        meant.summary,
        meant.action,
        meant.fault_class,
        meant.origin,
        meant.remedy,
        _unseen(meant.status, meant.details),
    )


def _unseen(status: Status, details: object) -> bool:
    """A `skip` whose cause is what this process may not read (Finding.unseen)."""
    return (
        status is Status.SKIP
        and isinstance(details, Mapping)
        and details.get("cause") == UNPRIVILEGED
    )


def findings_of_check(check: Check, results: Iterable[Result]) -> list[Finding]:
    return [finding(check, result) for result in results]


def findings_of(run: CheckRun) -> list[Finding]:
    """One finding per result of a run."""
    return findings_of_check(run.check, run.results)


# -- the rows of a report ------------------------------------------------------------------


def _joined(texts: list[str]) -> str:
    return "; ".join(dict.fromkeys(text for text in texts if text))


def _merged_details(results: list[Result]) -> dict[str, object]:
    """The worst result's details, the other results' keys it lacks, and under "findings"
    every result's own status, summary and details: nothing is lost, and a key keeps the
    type it has in an unfolded row (a consumer reading details["cause"] gets one value)."""
    merged: dict[str, object] = {}
    for result in results:  # worst first
        for key, value in result.details.items():
            merged.setdefault(key, value)
    merged["findings"] = [
        {"status": r.status.value, "summary": r.summary, "details": dict(r.details)}
        for r in results
    ]
    return merged


def fold(results: Sequence[Result]) -> list[Result]:
    """One result per subject and origin, in the order they first appear. A check may
    judge one subject several ways (cpu: the governors and SMT, both about "node"); a
    report shows one row for it: the worst status and the worst finding's meaning (action,
    class), the findings' summaries worst first (joined "; "), their remedies, details and
    metric samples all kept. The node's own findings and a job's are never one row: a
    job's failure must not hide the node's (which drains) nor lend it its origin."""
    by_subject: dict[tuple[str, Origin | None], list[Result]] = {}
    for result in results:
        by_subject.setdefault((result.subject, result.origin), []).append(result)
    folded = []
    for (subject, _), members in by_subject.items():
        if len(members) == 1:
            folded.append(members[0])
            continue
        ordered = sorted(members, key=lambda r: -r.status.severity)  # stable: ties keep order
        first = ordered[0]
        folded.append(
            Result(
                worst(r.status for r in ordered),
                subject,
                _joined([r.summary for r in ordered]),
                _joined([r.remedy for r in ordered if r.status not in (Status.OK, Status.SKIP)])
                or _joined([r.remedy for r in ordered]),
                _merged_details(ordered),
                tuple(sample for r in members for sample in r.samples),
                first.action,
                first.fault_class,
                first.origin,
            )
        )
    return folded


def report_rows(runs: Sequence[CheckRun]) -> list[tuple[str, Result]]:
    """(check name, result) for every row of a report: one per check and subject."""
    return [(run.check.name, result) for run in runs for result in fold(run.results)]


def overall_status(runs: Sequence[CheckRun]) -> Status:
    return worst(result.status for run in runs for result in run.results)


# -- the document --------------------------------------------------------------------------


def _row(check: Check, result: Result) -> dict[str, Any]:
    meant = finding(check, result)
    return {
        "check": check.name,
        "status": meant.status.value,
        "subject": meant.subject,
        "summary": meant.summary,
        "remedy": meant.remedy,
        "action": meant.action.value,
        "class": meant.fault_class.value,
        "origin": meant.origin.value,
        "details": dict(result.details),
    }


def check_document(hostname: str, stored: Sequence[StoredRun], written_at: float) -> dict[str, Any]:
    """The `nodecheck.check/v2` document: the JSON contract other tools read. `stored`:
    each check's run with the time it finished and its interval (`nodecheck check`: now
    and the check's own); `written_at`: when the document was made."""
    runs = [s.run for s in stored]
    return {
        "schema": CHECK_SCHEMA,
        "hostname": hostname,
        "status": overall_status(runs).value,
        "written_at": written_at,
        "checks": [
            {
                "check": s.run.check.name,
                "finished_at": s.finished_at,
                "interval_s": s.interval_s,
                "benchmark": s.run.check.benchmark,
                "completed": s.run.completed,
            }
            for s in stored
        ],
        "results": [_row(s.run.check, result) for s in stored for result in fold(s.run.results)],
    }


def document_text(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1, default=str) + "\n"


# -- reading it back -----------------------------------------------------------------------


class ResultsUnusableError(Exception):
    """A stored document that cannot be judged from: missing, unreadable, damaged or stale."""


@record
class StoredCheck:
    """One check's latest run as a stored document holds it."""

    check: str
    finished_at: float  # wall clock
    interval_s: float
    findings: tuple[Finding, ...]
    benchmark: bool = False


def _field(mapping: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise ResultsUnusableError(f"{where}: no {key}")
    value = mapping[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise ResultsUnusableError(
            f"{where}.{key}: {type(value).__name__}, not {kinds[0].__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ResultsUnusableError(f"{where}.{key}: not a finite number")
    return value


def _member(enum_type: Any, mapping: Any, key: str, where: str) -> Any:
    text = _field(mapping, key, str, where)
    try:
        return enum_type(text)
    except ValueError:
        raise ResultsUnusableError(f"{where}.{key}: {text[:30]!r}") from None


def _parsed_finding(row: Any, where: str) -> Finding:
    status = _member(Status, row, "status", where)
    return Finding(
        _field(row, "check", str, where),
        status,
        _field(row, "subject", str, where),
        _field(row, "summary", str, where),
        _member(Action, row, "action", where),
        _member(FaultClass, row, "class", where),
        _member(Origin, row, "origin", where),
        _field(row, "remedy", str, where),
        _unseen(status, row.get("details")),
    )


def parse_document(text: str) -> tuple[float, list[StoredCheck]]:
    """(written_at, the checks) of a stored document's text; ResultsUnusableError naming
    the field that is wrong. Every listed check has at least one result (absence is never
    a pass), and every result belongs to a listed check."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ResultsUnusableError(f"not JSON: {err}") from None
    schema = _field(document, "schema", str, "the document")
    if schema != CHECK_SCHEMA:
        raise ResultsUnusableError(f"schema {schema[:60]!r}, not {CHECK_SCHEMA}")
    written_at = float(_field(document, "written_at", (int, float), "the document"))
    by_check: dict[str, list[Finding]] = {}
    for number, row in enumerate(_field(document, "results", list, "the document")):
        parsed = _parsed_finding(row, f"results[{number}]")
        by_check.setdefault(parsed.check, []).append(parsed)
    checks = []
    for index, entry in enumerate(_field(document, "checks", list, "the document")):
        where = f"checks[{index}]"
        name = _field(entry, "check", str, where)
        findings = by_check.pop(name, [])
        if not findings:
            raise ResultsUnusableError(f"{where}: no results for {name[:60]!r}")
        interval = float(_field(entry, "interval_s", (int, float), where))
        if interval <= 0:
            raise ResultsUnusableError(f"{where}.interval_s: not positive")
        checks.append(
            StoredCheck(
                name,
                float(_field(entry, "finished_at", (int, float), where)),
                interval,
                tuple(findings),
                _field(entry, "benchmark", bool, where),
            )
        )
    if by_check:
        raise ResultsUnusableError(f"results of {sorted(by_check)[0][:60]!r}, not in checks")
    if not checks:
        raise ResultsUnusableError("no check in it")
    return written_at, checks


@record
class FreshResults:
    """The agent's results file as judged: when the agent wrote it (its `written_at`,
    which tells one version of the file from the next) and the quick checks' findings."""

    written_at: float
    findings: tuple[Finding, ...]


def fresh_results(
    path: Path, now: float, max_age_s: float, expected: Collection[str] = ()
) -> FreshResults:
    """The agent's results file when it is fresh: written within max_age_s, and each
    check run within its interval plus max_age_s (a check stuck for longer is stale, not
    healthy); ResultsUnusableError saying why not otherwise. Only the quick checks are
    judged, as when a caller runs them itself: not the benchmarks'. Every check of
    `expected` (those the caller would run) must be there: an agent that has just started
    has only its fast checks' results, and what it has not judged yet is no healthy run."""
    from nodecheck.agent.config import UnreadableFileError, read_text_file

    try:
        text = read_text_file(path, RESULTS_LIMIT)
    except UnreadableFileError as err:
        if err.missing:
            raise ResultsUnusableError(f"no results file at {path}") from None
        raise ResultsUnusableError(f"cannot read {path}: {err.reason}") from None
    written_at, checks = parse_document(text)
    age = now - written_at
    if age > max_age_s:
        raise ResultsUnusableError(f"{path} is {age:.0f} s old (at most {max_age_s:g} s)")
    if age < -60:  # one clock, but NTP may step it back a little
        raise ResultsUnusableError(f"{path} is dated {-age:.0f} s in the future")
    chosen = [c for c in checks if not c.benchmark]
    if not chosen:
        raise ResultsUnusableError(f"{path} holds none of the quick checks")
    missing = sorted(set(expected) - {c.check for c in chosen})
    if missing:
        raise ResultsUnusableError(f"{path} has no result of {', '.join(missing)} yet")
    for stored in chosen:
        check_age = now - stored.finished_at
        if check_age > stored.interval_s + max_age_s:
            raise ResultsUnusableError(
                f"{stored.check}'s result in {path} is {check_age:.0f} s old "
                f"(it runs every {stored.interval_s:g} s)"
            )
    return FreshResults(written_at, tuple(f for stored in chosen for f in stored.findings))


def findings_of_named(check: str, results: Iterable[Result]) -> list[Finding]:
    """findings_of_check for a check known by name: the registered check's declaration
    fills in what a result leaves unset (results a CheckRun made carry it already); a
    name no check is registered under is read the careful way (Check's defaults)."""
    from nodecheck.checks.registry import load_benchmarks, load_checks

    registered = load_checks().get(check) or load_benchmarks().get(check)
    declared = registered or Check(check, _no_run, 0.0, 0.0, check)
    return findings_of_check(declared, results)


def _no_run(_: object) -> list[Result]:
    return []
