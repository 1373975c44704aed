"""Exact comparison of results, plans and facts, for the tests that judge a capture.

`comparable` turns a value into nested tuples that compare equal exactly when the values
are equal field by field, with two differences from `==`: a NaN equals a NaN (a metric
sample or a reading may be one, and must survive a round trip as one), and dictionaries
and sets compare by content whatever order they were filled in. Types are kept (a tuple
is not a list, a Path not a str, an enum not its value).
"""

from __future__ import annotations

import difflib
import math
import pprint
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any

from nodecheck.checks.runner import CheckRun


def comparable(value: Any) -> Any:
    """`value` as nested tuples of (type name, contents), NaN-safe and order-free for
    dicts and sets."""
    kind = type(value).__name__
    if isinstance(value, Enum):
        return (kind, value.value)
    if isinstance(value, float):
        return (kind, "nan") if math.isnan(value) else (kind, value)
    if is_dataclass(value) and not isinstance(value, type):
        return (kind, tuple((f.name, comparable(getattr(value, f.name))) for f in fields(value)))
    if isinstance(value, dict) or hasattr(value, "items"):
        items = [(comparable(k), comparable(v)) for k, v in value.items()]
        return (kind, tuple(sorted(items, key=repr)))
    if isinstance(value, (set, frozenset)):
        return (kind, tuple(sorted((comparable(v) for v in value), key=repr)))
    if isinstance(value, (list, tuple)):
        return (kind, tuple(comparable(v) for v in value))
    return (kind, value)


def results_by_check(runs: list[CheckRun]) -> dict[str, Any]:
    """Each check's results (status, subject, summary, remedy, details, samples, in the
    order the check gave them) and whether it completed, by check name. A capture keeps
    the order of every dictionary it holds, so the samples of a check that walks a dict
    of counters come in the same order judged from a capture as live."""
    return {run.check.name: (run.completed, list(run.results)) for run in runs}


def differences(left: Any, right: Any, limit: int = 40) -> str:
    """The lines where two values differ, as a diff of their comparable forms pretty-printed
    (at most `limit` lines)."""
    lines = list(
        difflib.unified_diff(
            pprint.pformat(comparable(left), width=100).splitlines(),
            pprint.pformat(comparable(right), width=100).splitlines(),
            "left",
            "right",
            lineterm="",
            n=2,
        )
    )
    return "\n".join(lines[:limit]) + ("\n..." if len(lines) > limit else "")
