"""Dataclasses to JSON and back, by their type hints: the encoding of nodecheck.facts/v1.

Every fact is a dataclass of plain values (str, int, float, bool, None, Path, enums,
lists, tuples, sets, dicts and other such dataclasses). `encode` turns one into JSON
values; `decode` builds the equal object back from them, checking each value against
the field's type and naming where it is wrong (`parts.gpus.gpus[3].power_w: expected
a number, found a string`), so a damaged or hand-edited capture is refused in one
line, never half-loaded.

JSON has no NaN or infinity, and no fact is either (NVML and sysfs give finite
numbers): a float that is not finite is written as the string "NaN", "Infinity" or
"-Infinity", so that a capture is still written whole, and refused where it stands when
read, as are the literals NaN and Infinity Python's json accepts. A set of integers
(CPUs, NUMA nodes) is written as the kernel writes it, a cpulist string ("0-55,112-167":
Documentation/admin-guide/cputopology.rst), which keeps a 224-CPU node's capture small;
other sets are written sorted. Dictionaries keep the order the facts have them in (the
node's), so results judged from a capture list what they list in the live node's order.

A capture comes from elsewhere: every number is read in ASCII digits and the form
`str(int)` writes, every string must be valid Unicode (no lone surrogate), and the
numbers a document's cpulists expand to are counted against one budget, so a few
hundred bytes of "0-1048575,0-1048575,..." cannot take the machine's memory. An
object that names a key twice is refused at its place (JSON leaves which one counts to
the reader; Python's json keeps the last). A dataclass that knows what its source can
give defines `implausible()`: the field that holds a value no node gives, and why (a
temperature of -300 °C, a PCIe link at x0), checked as it is decoded, so that a
hand-edited capture is refused rather than judged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import math
import re
import sys
import threading
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from nodecheck.checks.node.patterns import LazyPattern

Decoder = Callable[[Any, str], Any]

# How encode writes a float that is not finite; what decode refuses in its place.
_NON_FINITE = frozenset({"NaN", "Infinity", "-Infinity"})


class FactsFormatError(ValueError):
    """A value that does not fit its field; the message says where and why."""


class NonFiniteLiteral:
    """Where the JSON text held the literal NaN, Infinity or -Infinity (Python's json
    reads them, JSON has none): refused by the decoder that meets it, naming the place."""

    def __init__(self, text: str) -> None:
        self.text = text


class RepeatedKeyObject(dict[str, Any]):
    """A JSON object that names `key` more than once: refused by the decoder that meets
    it, naming the place (which of the values was meant cannot be told)."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    built = dict(pairs)
    if len(built) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                return RepeatedKeyObject(pairs, key)
            seen.add(key)
    return built


def parse_json(text: str) -> Any:
    """JSON values of `text`, with NaN and Infinity literals and keys named twice kept
    as markers for the decoders to refuse where they stand (json.JSONDecodeError,
    RecursionError or ValueError as json.loads raises them)."""
    return json.loads(text, parse_constant=NonFiniteLiteral, object_pairs_hook=_object)


def refuse_repeated_key(value: object, where: str) -> None:
    """FactsFormatError naming `where` when `value` is an object that names a key twice."""
    if isinstance(value, RepeatedKeyObject):
        raise FactsFormatError(
            f"{where}: key {value.key!r} is given twice (which value is meant cannot be told)"
        )


def _kind(value: object) -> str:
    if isinstance(value, NonFiniteLiteral):
        return value.text
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _sort_key(value: object) -> tuple[str, object]:
    return (type(value).__name__, value if isinstance(value, (int, float, str)) else repr(value))


def encode(value: object) -> Any:
    """JSON values for a fact (a dataclass, or anything a fact's field may hold)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value.value if isinstance(value, enum.Enum) else value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, enum.Enum):
        return encode(value.value)
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            spec.name: encode(getattr(value, spec.name))
            for spec in dataclasses.fields(value)
            if spec.init
        }
    if isinstance(value, (set, frozenset)):
        if value and all(type(item) is int and item >= 0 for item in value):
            return _cpulist(value)
        return [encode(item) for item in sorted(value, key=_sort_key)]
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    if isinstance(value, Mapping):
        return {str(encode(key)): encode(item) for key, item in value.items()}
    raise TypeError(f"{type(value).__name__} is not a fact")


def _cpulist(numbers: set[int] | frozenset[int]) -> str:
    """ "0-3,8,10-11": ranges of consecutive numbers, ascending."""
    ordered = sorted(numbers)
    ranges: list[str] = []
    start = previous = ordered[0]
    for number in ordered[1:]:
        if number != previous + 1:
            ranges.append(f"{start}-{previous}" if previous > start else str(start))
            start = number
        previous = number
    ranges.append(f"{start}-{previous}" if previous > start else str(start))
    return ",".join(ranges)


# A capture is read whole into memory, so a range is bounded before it is expanded: the
# sets written this way are CPUs, NUMA nodes and process ids, and no pid exceeds
# pid_max's limit of 2^22 (Documentation/admin-guide/sysctl/kernel.rst, pid_max).
CPULIST_BOUND = 1 << 22
# What one document's cpulists may expand to, all together: an 8192-CPU node's capture
# (every PCI device's local CPUs, every CPU's siblings) stays far below it.
EXPANSION_BUDGET = 4_000_000

_NUMBER = LazyPattern(r"0|[1-9][0-9]*", re.ASCII)
_INTEGER_KEY = LazyPattern(r"0|-?[1-9][0-9]*", re.ASCII)
_budget = threading.local()


@contextlib.contextmanager
def expansion_budget(numbers: int = EXPANSION_BUDGET) -> Iterator[None]:
    """Count what the cpulists decoded in this block expand to against `numbers`."""
    _budget.left = numbers
    try:
        yield
    finally:
        del _budget.left


def _parse_cpulist(text: str, where: str) -> list[int]:
    numbers: list[int] = []
    for piece in text.split(","):
        first, dash, last = piece.partition("-")
        if not _NUMBER.fullmatch(first) or (dash and not _NUMBER.fullmatch(last)):
            raise FactsFormatError(f'{where}: {text!r} is not a list of numbers ("0-3,8")')
        low, high = int(first), int(last) if dash else int(first)
        if high < low or high >= CPULIST_BOUND:
            raise FactsFormatError(f"{where}: {piece!r} is not a range this node can have")
        left = getattr(_budget, "left", CPULIST_BOUND) - (high - low + 1)
        if left < 0:
            raise FactsFormatError(f"{where}: the document's lists of numbers are too long")
        if hasattr(_budget, "left"):
            _budget.left = left
        numbers.extend(range(low, high + 1))
    return numbers


_DECODERS: dict[object, Decoder] = {}


def decode(hint: object, value: Any, where: str) -> Any:
    """The object of type `hint` that `value` (JSON values) encodes; FactsFormatError
    naming `where` in the document when it does not fit."""
    return decoder_for(hint)(value, where)


def decoder_for(hint: object) -> Decoder:
    found = _DECODERS.get(hint)
    if found is None:
        found = _build(hint)
        _DECODERS[hint] = found
    return found


def _wrong(where: str, expected: str, value: object) -> FactsFormatError:
    return FactsFormatError(f"{where}: expected {expected}, found {_kind(value)}")


def _decode_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _wrong(where, "a string", value)
    if not value.isascii():
        try:
            value.encode("utf-8")  # JSON's "\ud800" is a string no UTF-8 can carry
        except UnicodeEncodeError:
            raise FactsFormatError(f"{where}: not valid Unicode (a lone surrogate)") from None
    return value


def _decode_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(where, "an integer", value)
    return value


def _decode_float(value: Any, where: str) -> float:
    shown = value.text if isinstance(value, NonFiniteLiteral) else value
    if isinstance(shown, str) and shown in _NON_FINITE:
        # No reading gives one: a NaN power limit would pass every comparison unjudged.
        which = "a number" if shown == "NaN" else "a finite number"
        raise FactsFormatError(f"{where}: {shown} is not {which}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong(where, "a number", value)
    try:
        return float(value)
    except OverflowError:
        raise FactsFormatError(f"{where}: {value} is too large for a number") from None


def _decode_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _wrong(where, "true or false", value)
    return value


def _decode_any(value: Any, where: str) -> Any:
    if isinstance(value, NonFiniteLiteral):
        raise FactsFormatError(f"{where}: {value.text} is not a number")
    refuse_repeated_key(value, where)
    return value


def _decode_path(value: Any, where: str) -> Path:
    return Path(_decode_str(value, where))


def _build(hint: object) -> Decoder:
    if hint in (Any, object):
        return _decode_any
    if hint is str:
        return _decode_str
    if hint is bool:
        return _decode_bool
    if hint is int:
        return _decode_int
    if hint is float:
        return _decode_float
    if hint is type(None):
        return _decode_none
    if isinstance(hint, type) and issubclass(hint, Path):
        return _decode_path
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_decoder(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass_decoder(hint)
    origin = typing.get_origin(hint)
    arguments = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _union_decoder(arguments)
    if origin is typing.Literal:
        return _literal_decoder(arguments)
    if origin in (list, tuple, set, frozenset) or origin is typing.Sequence:
        return _sequence_decoder(origin, arguments)
    if origin in (dict, Mapping) or (origin is not None and _is_mapping(origin)):
        return _mapping_decoder(arguments)
    if origin is not None and _is_sequence(origin):
        return _sequence_decoder(tuple, (arguments[0], ...))
    raise TypeError(f"no facts decoder for {hint!r}")


def _is_mapping(origin: object) -> bool:
    return isinstance(origin, type) and issubclass(origin, Mapping)


def _is_sequence(origin: object) -> bool:
    from collections.abc import Sequence

    return isinstance(origin, type) and issubclass(origin, Sequence)


def _decode_none(value: Any, where: str) -> None:
    if value is not None:
        raise _wrong(where, "null", value)


def _enum_decoder(cls: type[enum.Enum]) -> Decoder:
    def decode_enum(value: Any, where: str) -> enum.Enum:
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(repr(member.value) for member in cls)
            raise FactsFormatError(f"{where}: {value!r} is not one of {names}") from None

    return decode_enum


def _literal_decoder(allowed: tuple[object, ...]) -> Decoder:
    def decode_literal(value: Any, where: str) -> Any:
        if value not in allowed:
            raise FactsFormatError(f"{where}: {value!r} is not one of {allowed!r}")
        return value

    return decode_literal


def _json_kinds(hint: object) -> tuple[type, ...]:
    """The JSON value types an arm's encoding takes, for picking the arm of a union."""
    if hint is bool:
        return (bool,)
    if hint is int:
        return (int,)
    if hint is float:
        return (float, int, str)
    if hint is str or (isinstance(hint, type) and issubclass(hint, Path)):
        return (str,)
    return ()


def _union_decoder(arms: tuple[object, ...]) -> Decoder:
    optional = type(None) in arms
    others = [arm for arm in arms if arm is not type(None)]
    if len(others) == 1:
        inner = decoder_for(others[0])

        def decode_optional(value: Any, where: str) -> Any:
            return None if value is None and optional else inner(value, where)

        return decode_optional
    decoders = [decoder_for(arm) for arm in others]
    # An arm whose own type is the JSON value's goes first: 3 in `float | int` is the int,
    # "NaN" in `str | float` the string (a float there is written as a number when finite).
    exact = {bool: [], int: [], float: [], str: []}  # type: dict[type, list[Decoder]]
    for arm, decoder in zip(others, decoders, strict=True):
        kinds = _json_kinds(arm)
        if kinds:
            exact[kinds[0]].append(decoder)

    def decode_union(value: Any, where: str) -> Any:
        if value is None and optional:
            return None
        preferred = exact.get(type(value), [])
        failures = []
        for decoder in [*preferred, *(d for d in decoders if d not in preferred)]:
            try:
                return decoder(value, where)
            except FactsFormatError as err:
                failures.append(str(err))
        raise FactsFormatError(failures[0] if len(failures) == 1 else f"{where}: fits no type")

    return decode_union


def _sequence_decoder(origin: object, arguments: tuple[object, ...]) -> Decoder:
    if origin is tuple and arguments and arguments[-1] is not Ellipsis:
        items = [decoder_for(argument) for argument in arguments]

        def decode_fixed(value: Any, where: str) -> tuple[Any, ...]:
            if not isinstance(value, list) or len(value) != len(items):
                raise _wrong(where, f"a list of {len(items)}", value)
            return tuple(
                item(v, f"{where}[{i}]")
                for i, (item, v) in enumerate(zip(items, value, strict=True))
            )

        return decode_fixed
    item = decoder_for(arguments[0] if arguments else Any)
    build: Callable[[list[Any]], Any] = {tuple: tuple, set: set, frozenset: frozenset}.get(
        origin,  # type: ignore[call-overload]
        list,
    )

    numbers = origin in (set, frozenset) and arguments == (int,)

    def decode_sequence(value: Any, where: str) -> Any:
        if numbers and isinstance(value, str):
            return build(_parse_cpulist(value, where))
        if not isinstance(value, list):
            raise _wrong(where, "a list", value)
        return build([item(v, f"{where}[{i}]") for i, v in enumerate(value)])

    return decode_sequence


def _mapping_decoder(arguments: tuple[object, ...]) -> Decoder:
    key_hint, value_hint = arguments if arguments else (str, Any)
    item = decoder_for(value_hint)
    integer_enum = (
        isinstance(key_hint, type)
        and issubclass(key_hint, enum.Enum)
        and all(isinstance(member.value, int) for member in key_hint)
    )
    if key_hint is int or integer_enum:
        as_key = decoder_for(key_hint)

        def decode_key(key: str, where: str) -> Any:
            # JSON keys are strings: an integer key (or an enum of integers) is written
            # "8", as str(int) writes it (never "08", "8_0" or another script's digits).
            if not isinstance(key, str) or not _INTEGER_KEY.fullmatch(key) or len(key) > 20:
                raise FactsFormatError(f"{where}: key {key!r} is not an integer")
            return as_key(int(key), where)

    else:
        key_decoder = decoder_for(key_hint)

        def decode_key(key: str, where: str) -> Any:
            return key_decoder(key, where)

    def decode_mapping(value: Any, where: str) -> dict[Any, Any]:
        if not isinstance(value, dict):
            raise _wrong(where, "an object", value)
        refuse_repeated_key(value, where)
        decoded = {decode_key(k, where): item(v, f"{where}[{k!r}]") for k, v in value.items()}
        if len(decoded) != len(value):  # "8" and an enum's "8" are one key
            raise FactsFormatError(f"{where}: two keys name the same entry")
        return decoded

    return decode_mapping


def _dataclass_decoder(cls: type) -> Decoder:
    module = sys.modules.get(cls.__module__)
    hints = typing.get_type_hints(cls, vars(module) if module else None)
    fields = [spec for spec in dataclasses.fields(cls) if spec.init]
    # Filled in on first use: a dataclass that holds itself (a tree) must not recurse here.
    decoders: dict[str, Decoder] = {}
    required = {
        spec.name
        for spec in fields
        if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
    }
    known = {spec.name for spec in fields}
    implausible: Callable[[Any], tuple[str, str] | None] | None = getattr(cls, "implausible", None)

    def decode_dataclass(value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise _wrong(where, f"an object ({cls.__name__})", value)
        refuse_repeated_key(value, where)
        unknown = sorted(set(value) - known)
        if unknown:
            raise FactsFormatError(f"{where}: unknown field {unknown[0]!r} of {cls.__name__}")
        missing = sorted(required - set(value))
        if missing:
            raise FactsFormatError(f"{where}: no {missing[0]!r} ({cls.__name__})")
        if not decoders:
            decoders.update({spec.name: decoder_for(hints[spec.name]) for spec in fields})
        decoded = cls(
            **{name: decoders[name](item, f"{where}.{name}") for name, item in value.items()}
        )
        problem = None if implausible is None else implausible(decoded)
        if problem is not None:
            place, why = problem
            raise FactsFormatError(f"{where}.{place}: {why}")
        return decoded

    return decode_dataclass
