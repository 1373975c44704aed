"""How `nodecheck check` shows its results: a table for people, a stable JSON contract for tools."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

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
    return indented_json(check_document(hostname, stored, now), indent=2, default=str)


def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if value == math.inf:
        return "Infinity"
    if value == -math.inf:
        return "-Infinity"
    return float.__repr__(value)


def _key_text(key: object) -> str:
    # json's rules for a key that is not a str: a number or a constant as its text.
    if isinstance(key, str):
        return encode_basestring_ascii(key)
    if isinstance(key, float):
        return encode_basestring_ascii(_float_text(key))
    if key is True or key is False or key is None:
        return f'"{"true" if key else "false" if key is False else "null"}"'
    if isinstance(key, int):
        return encode_basestring_ascii(int.__repr__(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def indented_json(document: Any, indent: int, default: Callable[[Any], Any]) -> str:
    """`json.dumps(document, indent=indent, default=default)`, the same text, in a third
    less time: json's own encoder is C only without `indent`, and its Python one makes a
    generator per list and dict. The strings are json's C encoder's."""
    step = " " * indent
    string = encode_basestring_ascii
    float_repr = float.__repr__
    int_repr = int.__repr__

    def text(value: Any, newline: str) -> str:
        kind = type(value)
        if kind is str:
            return string(value)
        if kind is float:
            return float_repr(value) if value - value == 0.0 else _float_text(value)
        if kind is int:
            return int_repr(value)
        if kind is bool:
            return "true" if value else "false"
        if value is None:
            return "null"
        if kind is dict:
            if not value:
                return "{}"
            inner = newline + step
            items = [
                (string(key) if type(key) is str else _key_text(key)) + ": " + text(item, inner)
                for key, item in value.items()
            ]
            return "{" + inner + ("," + inner).join(items) + newline + "}"
        if kind is list or kind is tuple:
            if not value:
                return "[]"
            inner = newline + step
            return (
                "["
                + inner
                + ("," + inner).join([text(item, inner) for item in value])
                + newline
                + "]"
            )
        # Subclasses (an enum of str or int), then what json hands to `default`, in
        # json's order of checks.
        if isinstance(value, str):
            return string(value)
        if isinstance(value, int):
            return int_repr(value)
        if isinstance(value, float):
            return _float_text(value)
        if isinstance(value, (list, tuple)):
            return text(list(value), newline)
        if isinstance(value, dict):
            return text(dict(value), newline)
        return text(default(value), newline)

    return text(document, "\n")


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
