"""Comparing check documents (nodecheck.check/v2) made at different moments."""

from __future__ import annotations

import copy
from typing import Any


def untimed(document: dict[str, Any]) -> dict[str, Any]:
    """The document without the times it was made and its checks finished: two runs of
    the same judgement, a second apart, compare equal."""
    same = copy.deepcopy(document)
    same.pop("written_at", None)
    for check in same.get("checks", []):
        check.pop("finished_at", None)
    return same
