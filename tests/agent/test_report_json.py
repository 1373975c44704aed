"""`check --json`'s encoder gives json.dumps's text, byte for byte."""

from __future__ import annotations

import enum
import json
import math
from pathlib import Path
from typing import Any

import pytest

from nodecheck.agent.cli.report import indented_json


class Level(str, enum.Enum):
    FAIL = "fail"


class Count(enum.IntEnum):
    TWO = 2


DOCUMENTS: list[Any] = [
    {},
    [],
    "plain",
    {"a": 1, "b": [1, 2.5, None, True, False], "c": {}, "d": [], "e": {"f": {"g": []}}},
    [math.nan, math.inf, -math.inf, 0.1, 1e16, -0.0, 10**30, -3],
    {"text": 'é\u2028\x00\x1b"\\/ é 🚀', "é": "key", "\n": "newline key"},
    {3: "int key", 2.5: "float key", True: "bool key", None: "none key", -7: "negative"},
    {"enum": Level.FAIL, "int enum": Count.TWO, Level.FAIL: "enum key", Count.TWO: "int enum key"},
    {"tuple": (1, (2, 3)), "path": Path("/sys/x"), "set": {4}},
    [[[[{"deep": [{"er": 1}]}]]]],
]


@pytest.mark.parametrize("document", DOCUMENTS)
@pytest.mark.parametrize("indent", [1, 2, 4])
def test_the_text_is_json_dumps_s(document: Any, indent: int) -> None:
    assert indented_json(document, indent, str) == json.dumps(document, indent=indent, default=str)


def test_keys_json_cannot_write_are_refused_as_json_refuses_them() -> None:
    with pytest.raises(TypeError, match="keys must be str, int, float, bool or None, not tuple"):
        indented_json({(1, 2): "x"}, 2, str)
    with pytest.raises(TypeError):
        json.dumps({(1, 2): "x"}, indent=2)
