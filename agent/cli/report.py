"""How `nodecheck check` shows its results: a table for people, a stable JSON contract for tools."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import click

from nodecheck.agent.findings import StoredRun, check_document, overall_status, report_rows
from nodecheck.checks.printable import printable
from nodecheck.checks.record import record
from nodecheck.checks.result import Status
from nodecheck.checks.runner import CheckRun

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


def exit_code(runs: Sequence[CheckRun]) -> int:
    statuses = {result.status for run in runs for result in run.results}
    if Status.FAIL in statuses:
        return EXIT_FAIL
    if Status.ERROR in statuses:
        return EXIT_UNDETERMINED
    return EXIT_OK


def render_json(hostname: str, runs: Sequence[CheckRun]) -> str:
    """The nodecheck.check/v2 document of a run of `nodecheck check` (agent/findings.py)."""
    now = time.time()
    stored = [StoredRun(run, now, run.check.interval_s) for run in runs]
    return json.dumps(check_document(hostname, stored, now), indent=2, default=str)


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
