"""How `nodecheck check` shows its results: a table for people, a stable JSON contract for tools."""

from __future__ import annotations

import json
from collections.abc import Sequence

import click

from nodecheck.checks.result import Status, worst
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

# Exit status of `nodecheck check` (README "Exit status").
EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_UNDETERMINED = 3


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
                "check": run.check.name,
                "status": result.status.value,
                "subject": result.subject,
                "summary": result.summary,
                "remedy": result.remedy,
                "details": dict(result.details),
            }
            for run in runs
            for result in run.results
        ],
    }


def render_json(hostname: str, runs: Sequence[CheckRun]) -> str:
    return json.dumps(check_document(hostname, runs), indent=2, default=str)


def render_table(hostname: str, runs: Sequence[CheckRun]) -> str:
    """Results grouped by status, worst first; each remedy under its result."""
    rows = [(run.check.name, result) for run in runs for result in run.results]
    counts = {status: sum(1 for _, r in rows if r.status is status) for status in STATUS_ORDER}
    status = overall_status(runs)
    tally = ", ".join(f"{counts[s]} {s.value}" for s in STATUS_ORDER if counts[s])
    lines = [
        f"{click.style('nodecheck', bold=True)} {hostname}: "
        f"{click.style(status.value.upper(), fg=STATUS_COLOURS[status], bold=True)} ({tally})"
    ]
    check_width = max((len(name) for name, _ in rows), default=5)
    subject_width = max((len(result.subject) for _, result in rows), default=4)
    for group in STATUS_ORDER:
        members = [(name, result) for name, result in rows if result.status is group]
        if not members:
            continue
        lines.append("")
        lines.append(click.style(group.value.upper(), fg=STATUS_COLOURS[group], bold=True))
        for name, result in sorted(members, key=lambda row: (row[0], row[1].subject)):
            lines.append(
                f"  {name:<{check_width}}  {result.subject:<{subject_width}}  {result.summary}"
            )
            if result.remedy and group is not Status.SKIP:
                indent = " " * (check_width + subject_width + 6)
                label = "fix:" if group in (Status.FAIL, Status.WARN, Status.ERROR) else "tip:"
                lines.append(f"{indent}{click.style(label, bold=True)} {result.remedy}")
    return "\n".join(lines)
