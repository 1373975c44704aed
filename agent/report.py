"""How `nodecheck check` shows its results: a table for people, a stable JSON contract for tools."""

from __future__ import annotations

import json
from collections.abc import Sequence

import click

from nodecheck.checks.printable import printable
from nodecheck.checks.record import record
from nodecheck.checks.result import Result, Status, worst
from nodecheck.checks.runner import CheckRun

CHECK_SCHEMA = "nodecheck.check/v1"

STATUS_ORDER = (Status.FAIL, Status.ERROR, Status.WARN, Status.OK, Status.SKIP)
STATUS_COLOURS = {
    Status.FAIL: "red",
    Status.ERROR: "magenta",
    Status.WARN: "yellow",
    Status.OK: "green",
    Status.SKIP: "bright_black",
}

# Exit status of `nodecheck check` (docs/checks.md, "Exit status").
EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_UNDETERMINED = 3


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
    """One result per subject, in the order subjects first appear. A check may judge one
    subject several ways (cpu: the governors and SMT, both about "node"); a report shows
    one row for it: the worst status, the findings' summaries worst first (joined "; "),
    their remedies, details and metric samples all kept."""
    by_subject: dict[str, list[Result]] = {}
    for result in results:
        by_subject.setdefault(result.subject, []).append(result)
    folded = []
    for subject, members in by_subject.items():
        if len(members) == 1:
            folded.append(members[0])
            continue
        ordered = sorted(members, key=lambda r: -r.status.severity)  # stable: ties keep order
        folded.append(
            Result(
                worst(r.status for r in ordered),
                subject,
                _joined([r.summary for r in ordered]),
                _joined([r.remedy for r in ordered if r.status not in (Status.OK, Status.SKIP)])
                or _joined([r.remedy for r in ordered]),
                _merged_details(ordered),
                tuple(sample for r in members for sample in r.samples),
            )
        )
    return folded


def report_rows(runs: Sequence[CheckRun]) -> list[tuple[str, Result]]:
    """(check name, result) for every row of a report: one per check and subject."""
    return [(run.check.name, result) for run in runs for result in fold(run.results)]


def overall_status(runs: Sequence[CheckRun]) -> Status:
    return worst(result.status for run in runs for result in run.results)


def exit_code(runs: Sequence[CheckRun]) -> int:
    statuses = {result.status for run in runs for result in run.results}
    if Status.FAIL in statuses:
        return EXIT_FAIL
    if Status.ERROR in statuses:
        return EXIT_UNDETERMINED
    return EXIT_OK


def check_document(hostname: str, runs: Sequence[CheckRun]) -> dict[str, object]:
    """The `nodecheck.check/v1` document: the JSON contract other tools read."""
    return {
        "schema": CHECK_SCHEMA,
        "hostname": hostname,
        "status": overall_status(runs).value,
        "results": [
            {
                "check": name,
                "status": result.status.value,
                "subject": result.subject,
                "summary": result.summary,
                "remedy": result.remedy,
                "details": dict(result.details),
            }
            for name, result in report_rows(runs)
        ],
    }


def render_json(hostname: str, runs: Sequence[CheckRun]) -> str:
    return json.dumps(check_document(hostname, runs), indent=2, default=str)


@record
class _Row:
    """A row of the table as it is shown: every text escaped (checks/printable.py)."""

    check: str
    status: Status
    subject: str
    summary: str
    remedy: str


def _shown_rows(runs: Sequence[CheckRun]) -> list[_Row]:
    """The report's rows, escaped here, at the table, where they are shown: a subject, a
    summary or a remedy quotes what the node, a job's environment or a capture said (a
    newline in NCCL_SOCKET_IFNAME would start a forged line; an ESC, an escape sequence
    on root's terminal). The JSON document keeps the real values (json.dumps escapes)."""
    return [
        _Row(
            printable(name),
            result.status,
            printable(result.subject),
            printable(result.summary),
            printable(result.remedy),
        )
        for name, result in report_rows(runs)
    ]


def render_table(hostname: str, runs: Sequence[CheckRun]) -> str:
    """Results grouped by status, worst first; each remedy under its result."""
    rows = _shown_rows(runs)
    counts = {status: sum(1 for r in rows if r.status is status) for status in STATUS_ORDER}
    status = overall_status(runs)
    tally = ", ".join(f"{counts[s]} {s.value}" for s in STATUS_ORDER if counts[s])
    lines = [
        f"{click.style('nodecheck', bold=True)} {printable(hostname)}: "
        f"{click.style(status.value.upper(), fg=STATUS_COLOURS[status], bold=True)} ({tally})"
    ]
    check_width = max((len(row.check) for row in rows), default=5)
    subject_width = max((len(row.subject) for row in rows), default=4)
    for group in STATUS_ORDER:
        members = [row for row in rows if row.status is group]
        if not members:
            continue
        lines.append("")
        lines.append(click.style(group.value.upper(), fg=STATUS_COLOURS[group], bold=True))
        for row in sorted(members, key=lambda row: (row.check, row.subject)):
            lines.append(
                f"  {row.check:<{check_width}}  {row.subject:<{subject_width}}  {row.summary}"
            )
            if row.remedy and group is not Status.SKIP:
                indent = " " * (check_width + subject_width + 6)
                label = "fix:" if group in (Status.FAIL, Status.WARN, Status.ERROR) else "tip:"
                lines.append(f"{indent}{click.style(label, bold=True)} {row.remedy}")
    return "\n".join(lines)
