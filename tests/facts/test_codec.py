"""The facts codec (checks/node/codec.py) on literal dataclasses, and `loads` refusing what
is not a nodecheck.facts/v1 capture it can read, each with the message it must give.

The dataclasses are declared at module level: the codec resolves a dataclass's type hints
(`typing.get_type_hints`) in its module, as it does for the real facts.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.codec import FactsFormatError, decode, encode, parse_json
from nodecheck.checks.node.facts import (
    SCHEMA,
    FactsError,
    NodeFacts,
    PartUnavailableError,
    Unread,
    dumps,
    loads,
)


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class Width(enum.IntEnum):
    X8 = 8
    X16 = 16


@dataclass(frozen=True)
class Link:
    width: Width
    speed_gts: float


@dataclass(frozen=True)
class Tree:
    name: str
    children: list[Tree] = field(default_factory=list)


@dataclass(frozen=True)
class Everything:
    text: str
    count: int
    ratio: float
    flag: bool
    nothing: None
    path: Path
    colour: Colour
    width: Width
    items: list[int]
    row: tuple[int, ...]
    pair: tuple[int, str]
    names: set[str]
    ids: frozenset[int]
    by_name: dict[str, int]
    by_number: dict[int, str]
    by_colour: dict[Colour, float]
    mapping: Mapping[str, float]
    kind: Literal["gpu", "nic"]
    maybe_link: Link | None
    number_or_text: int | str
    links: list[Link]
    tree: Tree
    anything: Any
    defaulted: str = "default"


def everything() -> Everything:
    return Everything(
        text="NVIDIA H100 80GB HBM3 \u00b0C",
        count=-3,
        ratio=0.25,
        flag=False,
        nothing=None,
        path=Path("/sys/bus/pci/devices/0000:18:00.0"),
        colour=Colour.GREEN,
        width=Width.X16,
        items=[3, 1, 2],
        row=(5, 4),
        pair=(7, "seven"),
        names={"mlx5_1", "mlx5_0", "ibp25s0"},
        ids=frozenset({30, 10, 20}),
        by_name={"b": 2, "a": 1},
        by_number={16: "x16", -1: "unknown"},
        by_colour={Colour.RED: 1.5},
        mapping={"power_w": 71.0},
        kind="nic",
        maybe_link=Link(Width.X8, 32.0),
        number_or_text="eight",
        links=[Link(Width.X16, 32.0), Link(Width.X8, 16.0)],
        tree=Tree("root", [Tree("left"), Tree("right", [Tree("leaf")])]),
        anything={"free": ["form", 1]},
    )


def round_trip(value: Any, hint: object) -> Any:
    """`value` through JSON text and back, as a capture carries it."""
    return decode(hint, json.loads(json.dumps(encode(value), allow_nan=False)), "value")


def test_every_supported_type_comes_back_equal_and_of_its_type() -> None:
    original = everything()
    back = round_trip(original, Everything)
    assert back == original
    for name in ("path", "colour", "width", "row", "pair", "names", "ids", "tree"):
        assert type(getattr(back, name)) is type(getattr(original, name)), name
    assert type(back.maybe_link.width) is Width
    assert list(back.by_number) == [16, -1] and type(back.by_number) is dict


def test_unions_and_optionals_take_the_arm_that_fits() -> None:
    assert round_trip(Link(Width.X8, 16.0), Link | None) == Link(Width.X8, 16.0)
    assert round_trip(None, Link | None) is None
    assert round_trip(8, int | str) == 8
    assert round_trip("eight", int | str) == "eight"
    with pytest.raises(FactsFormatError, match=r"^value: fits no type$"):
        decode(int | str, [8], "value")


def test_sets_are_written_sorted_so_the_same_facts_give_the_same_text() -> None:
    assert encode({"mlx5_1", "ibp25s0", "mlx5_0"}) == ["ibp25s0", "mlx5_0", "mlx5_1"]
    # Sets of numbers as the kernel writes CPU lists: ranges, ascending.
    assert encode(frozenset({30, 10, 20})) == "10,20,30"
    assert encode(frozenset({3, 1, 2, 7})) == "1-3,7"
    assert encode({Link(Width.X16, 32.0), Link(Width.X8, 16.0)}) == encode(
        {Link(Width.X8, 16.0), Link(Width.X16, 32.0)}
    )
    facts = NodeFacts(1.0, {"hostname": "dgx-01", "virtualization": None})
    assert dumps(facts) == dumps(NodeFacts(1.0, {"virtualization": None, "hostname": "dgx-01"}))


def test_non_finite_floats_are_written_as_strings_and_refused_when_read() -> None:
    """No fact is NaN or infinite: the encoder writes one as JSON can carry it (the capture
    is still written whole), and the decoder refuses it where it stands, as it refuses
    the NaN and Infinity literals Python's json reads."""
    assert [encode(math.inf), encode(-math.inf), encode(math.nan)] == [
        "Infinity",
        "-Infinity",
        "NaN",
    ]
    cases = [
        (float, "NaN", "value: NaN is not a number"),
        (float, "Infinity", "value: Infinity is not a finite number"),
        (float | None, "-Infinity", "value: -Infinity is not a finite number"),
        (Link, {"width": 8, "speed_gts": "NaN"}, "value.speed_gts: NaN is not a number"),
        (float, "nan", "value: expected a number, found a string"),
    ]
    for hint, value, message in cases:
        with pytest.raises(FactsFormatError) as raised:
            decode(hint, value, "value")
        assert str(raised.value) == message, value
    for literal, message in [
        ("NaN", "speed_gts: NaN is not a number"),
        ("Infinity", "speed_gts: Infinity is not a finite number"),
        ("-Infinity", "speed_gts: -Infinity is not a finite number"),
    ]:
        with pytest.raises(FactsFormatError) as raised:
            decode(Link, parse_json(f'{{"width": 16, "speed_gts": {literal}}}'), "value")
        assert str(raised.value) == f"value.{message}", literal
    # Where a string fits, the text "NaN" is a string, not a float.
    assert decode(str | float, "NaN", "value") == "NaN"
    assert round_trip(Link(Width.X8, 16.0), Link) == Link(Width.X8, 16.0)


def test_a_key_given_twice_is_refused_naming_its_object() -> None:
    """JSON leaves which of two values for one key counts to the reader: neither is
    taken, in a dataclass, a mapping or the envelope."""
    cases: list[tuple[object, str, str]] = [
        (Link, '{"width": 8, "speed_gts": 16.0, "width": 16}', "value"),
        (dict[str, int], '{"a": 1, "a": 2}', "value"),
        (Tree, '{"name": "r", "children": [{"name": "x", "name": "y"}]}', "value.children[0]"),
    ]
    for hint, text, where in cases:
        with pytest.raises(FactsFormatError) as raised:
            decode(hint, parse_json(text), "value")
        assert str(raised.value).startswith(f"{where}: key "), text
        assert "is given twice (which value is meant cannot be told)" in str(raised.value)
    assert decode(dict[str, int], parse_json('{"a": 1, "b": 2}'), "value") == {"a": 1, "b": 2}


def test_int_keys_are_strings_in_json_and_ints_again() -> None:
    assert encode({16: "x16", -1: "unknown"}) == {"16": "x16", "-1": "unknown"}
    assert round_trip({16: "x16", -1: "unknown"}, dict[int, str]) == {16: "x16", -1: "unknown"}
    with pytest.raises(FactsFormatError, match=r"^value: key 'x16' is not an integer$"):
        decode(dict[int, str], {"x16": "x"}, "value")


def test_a_wrong_type_is_refused_naming_the_field_path() -> None:
    document = encode(everything())
    document["links"][1]["speed_gts"] = "fast"
    with pytest.raises(FactsFormatError) as raised:
        decode(Everything, document, "parts.x.value")
    message = "parts.x.value.links[1].speed_gts: expected a number, found a string"
    assert str(raised.value) == message

    cases: list[tuple[object, Any, str]] = [
        (int, True, "value: expected an integer, found a boolean"),
        (int, 1.5, "value: expected an integer, found a number"),
        (bool, 1, "value: expected true or false, found a number"),
        (str, None, "value: expected a string, found null"),
        (list[int], {"a": 1}, "value: expected a list, found an object"),
        (dict[str, int], {"a": "1"}, "value['a']: expected an integer, found a string"),
        (tuple[int, str], [1], "value: expected a list of 2, found a list"),
        (Link, [8, 16.0], "value: expected an object (Link), found a list"),
        (Colour, "blue", "value: 'blue' is not one of 'red', 'green'"),
        (Literal["gpu", "nic"], "hca", "value: 'hca' is not one of ('gpu', 'nic')"),
        (
            Tree,
            {"name": "r", "children": [{"name": 3}]},
            "value.children[0].name: expected a string, found a number",
        ),
    ]
    for hint, value, message in cases:
        with pytest.raises(FactsFormatError) as raised:
            decode(hint, value, "value")
        assert str(raised.value) == message, hint


def test_an_unknown_or_missing_field_is_refused_naming_it() -> None:
    with pytest.raises(FactsFormatError) as raised:
        decode(Link, {"width": 16, "speed_gts": 32.0, "lanes": 16}, "parts.x.value")
    assert str(raised.value) == "parts.x.value: unknown field 'lanes' of Link"
    with pytest.raises(FactsFormatError) as raised:
        decode(Link, {"width": 16}, "parts.x.value.links[0]")
    assert str(raised.value) == "parts.x.value.links[0]: no 'speed_gts' (Link)"
    # A field with a default may be absent: a later nodecheck v1 adds fields that way.
    assert decode(Tree, {"name": "leaf"}, "value") == Tree("leaf")


def test_what_is_not_a_fact_is_not_encoded() -> None:
    with pytest.raises(TypeError, match="is not a fact"):
        encode(object())
    with pytest.raises(TypeError, match="is not a fact"):
        encode({"callback": print})


# --- loads ----------------------------------------------------------------------------


def capture_text(**changes: Any) -> str:
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "taken_at": 1796134522.5,
        "nodecheck_version": "0.1.0",
        "roots": {"sysfs": "/sys", "procfs": "/proc", "rootfs": "/"},
        "parts": {
            "hostname": {"value": "dgx-01"},
            "virtualization": {"value": None},
            "gpus": {"unread": {"reason": "NVML did not answer in 5 s", "cause": "timeout"}},
        },
    }
    document.update(changes)
    return json.dumps(document)


def test_a_capture_loads_to_the_facts_it_holds_and_unread_stays_unread() -> None:
    facts = loads(capture_text())
    assert facts == NodeFacts(
        1796134522.5,
        {
            "hostname": "dgx-01",
            "virtualization": None,
            "gpus": Unread("NVML did not answer in 5 s", "timeout"),
        },
        {"sysfs": "/sys", "procfs": "/proc", "rootfs": "/"},
        "0.1.0",
    )
    assert loads(dumps(facts)) == facts
    ctx = CheckContext(facts=facts)
    assert ctx.hostname == "dgx-01" and ctx.now == 1796134522.5
    with pytest.raises(PartUnavailableError, match="NVML did not answer in 5 s"):
        ctx.part("gpus")
    with pytest.raises(PartUnavailableError, match="the capture holds no inventory"):
        ctx.part("inventory")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", r"^cap\.json is not JSON: "),
        ("[1, 2]", r"^cap\.json is not a nodecheck\.facts/v1 capture \(no schema\)$"),
        (json.dumps({"taken_at": 1.0}), r"^cap\.json is not a nodecheck\.facts/v1 capture \(no "),
        (
            capture_text(schema="nodecheck.check/v1"),
            r"^cap\.json is a 'nodecheck\.check/v1' document, not a nodecheck\.facts/v1 capture$",
        ),
        (
            capture_text(schema="nodecheck.facts/v2"),
            r"^cap\.json is a nodecheck\.facts/v2 capture, newer than this nodecheck reads "
            r"\(nodecheck\.facts/v1\): judge it with the nodecheck that took it, or upgrade$",
        ),
        (
            capture_text(parts={"hostname": {"value": 42}}),
            r"^cap\.json: parts\.hostname\.value: expected a string, found a number$",
        ),
        (
            capture_text(parts={"gpus": {"value": {"gpus": [{"index": "0"}]}}}),
            r"^cap\.json: parts\.gpus\.value\.gpus\[0\]\.index: expected an integer, found a "
            r"string$",
        ),
        (
            capture_text(parts={"gpus": {"unread": {"reason": "hung"}}}),
            r"^cap\.json: parts\.gpus\.unread: no 'cause' \(Unread\)$",
        ),
        (
            capture_text(parts={"hostname": {"value": "a", "unread": {}}}),
            r'^cap\.json: parts\.hostname: expected \{"value": \.\.\.\} or \{"unread": \.\.\.\}$',
        ),
        (
            capture_text(parts={"bios_settings": {"value": {}}}),
            r"^cap\.json: parts\.bios_settings: no such part \(parts: hostname, inventory, ",
        ),
        (capture_text(taken_at="yesterday"), r"^cap\.json: taken_at: expected a number, found a "),
        (capture_text(parts=None), r"^cap\.json: parts: expected an object, found null$"),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "no-schema",
        "another-schema",
        "newer-schema",
        "damaged-field",
        "damaged-nested-field",
        "damaged-unread",
        "value-and-unread",
        "unknown-part",
        "bad-taken-at",
        "no-parts",
    ],
)
def test_loads_refuses_what_it_cannot_judge_and_says_why(text: str, message: str) -> None:
    with pytest.raises(FactsError, match=message):
        loads(text, "cap.json")


def test_a_newer_schema_is_refused_even_when_it_would_parse() -> None:
    """v2 may mean anything: the same parts are no reason to read it as v1."""
    assert loads(capture_text()).parts["hostname"] == "dgx-01"
    with pytest.raises(FactsError, match="newer than this nodecheck reads"):
        loads(capture_text(schema="nodecheck.facts/v2"))
    with pytest.raises(FactsError, match="newer than this nodecheck reads"):
        loads(capture_text(schema="nodecheck.facts/v10"))


# --- hostile captures: numbers, strings and lists that would crash or exhaust a loader


def _capture_with(**fields: Any) -> str:
    document: dict[str, Any] = {"schema": "nodecheck.facts/v1", "taken_at": 1.0, "parts": {}}
    document.update(fields)
    return json.dumps(document)


def test_a_cpulist_is_ascii_digits_in_canonical_form() -> None:
    assert decode(frozenset[int], "0-3,8", "v") == frozenset({0, 1, 2, 3, 8})
    for text in ("٠-٣", "0-²", "08", "1_0", " 1", "3-1", "-1", ""):
        with pytest.raises(FactsFormatError, match=r"^v: "):
            decode(frozenset[int], text, "v")


def test_the_numbers_a_document_expands_to_are_bounded() -> None:
    """A few hundred bytes of "0-4194303,..." would be gigabytes of integers: refused."""
    bomb = ",".join(["0-4194303"] * 40)
    text = _capture_with(parts={"cpu_governors": {"value": {"governors": {}, "problems": {}}}})
    assert loads(text).parts["cpu_governors"] is not None
    hostile = _capture_with(parts={"coherent_gpus": {"value": {"by_bus_id": {}, "numbers": bomb}}})
    with pytest.raises(FactsError):
        loads(hostile)  # (an unknown field: refused before anything is expanded)
    from nodecheck.checks.node.codec import expansion_budget

    with expansion_budget(1000), pytest.raises(FactsFormatError, match="too long"):
        decode(list[frozenset[int]], ["0-600", "0-600"], "v")
    with pytest.raises(FactsFormatError, match="not a range this node can have"):
        decode(frozenset[int], "0-4194304", "v")


def test_integer_keys_are_written_as_str_writes_them() -> None:
    assert decode(dict[int, str], {"8": "a", "-1": "b"}, "v") == {8: "a", -1: "b"}
    for key in ("08", "8_0", " 8", "٨", "+8", "1" * 30):
        with pytest.raises(FactsFormatError, match="is not an integer"):
            decode(dict[int, str], {key: "a"}, "v")


def test_numbers_python_cannot_hold_are_refused_not_crashed_on() -> None:
    with pytest.raises(FactsFormatError, match="too large"):
        decode(float, 10**400, "v")
    for taken_at in ("1" * 5000, str(10**400)):
        text = '{"schema": "nodecheck.facts/v1", "taken_at": ' + taken_at + ', "parts": {}}'
        with pytest.raises(FactsError):
            loads(text)


def test_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(FactsFormatError, match="lone surrogate"):
        decode(str, "\udc80", "v")
    text = _capture_with(parts={"hostname": {"value": "\udc80"}})
    with pytest.raises(FactsError, match="lone surrogate"):
        loads(text)
    assert decode(str, "dgx-é", "v") == "dgx-é"


def test_the_envelope_and_unread_are_strict() -> None:
    with pytest.raises(FactsError, match="unknown field 'extra'"):
        loads(_capture_with(extra=1))
    bogus = {"hostname": {"unread": {"reason": "x", "cause": "bogus"}}}
    with pytest.raises(FactsError, match="cause"):
        loads(_capture_with(parts=bogus))
