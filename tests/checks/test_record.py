"""@record against a real @dataclass(frozen=True) (and @record(frozen=False) against a
plain @dataclass): the same equality, hashing, repr, immutability, replace, pickling."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import pickle
from collections.abc import Callable

import pytest

from nodecheck.checks.record import record


@record
class Link:
    width: int
    speed: float = 0.0
    note: str = dataclasses.field(default="", compare=False, repr=False)
    lanes: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class FrozenLink:
    width: int
    speed: float = 0.0
    note: str = dataclasses.field(default="", compare=False, repr=False)
    lanes: tuple[int, ...] = ()


@record(frozen=False)
class Reading:
    index: int
    errors: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PlainReading:
    index: int
    errors: dict[str, str] = dataclasses.field(default_factory=dict)


CASES = [(8, 16.0, "a", (0, 1)), (8, 16.0, "b", (0, 1)), (16, 32.0, "", ()), (8, math.nan, "", ())]


def test_equality_and_hash_are_a_frozen_dataclass_s() -> None:
    mine = [Link(*case) for case in CASES]
    theirs = [FrozenLink(*case) for case in CASES]
    pairs = list(zip(mine, theirs, strict=True))
    for a, fa in pairs:
        for b, fb in pairs:
            assert (a == b) == (fa == fb), (a, b)
            if fa == fb:
                assert hash(a) == hash(b)
    # Two NaNs are unequal, one NaN is equal to itself (tuples compare identity first).
    assert (Link(8, math.nan) == Link(8, math.nan)) == (
        FrozenLink(8, math.nan) == FrozenLink(8, math.nan)
    )
    assert (Link(8, float("nan")) != Link(8, float("nan"))) == (
        FrozenLink(8, float("nan")) != FrozenLink(8, float("nan"))
    )
    assert Link(8) != FrozenLink(8)  # type: ignore[comparison-overlap]  # another class
    assert len({Link(8, 16.0, "a"), Link(8, 16.0, "b")}) == 1  # `note` is not compared


def test_repr_is_a_dataclass_s() -> None:
    for case in CASES:
        assert repr(Link(*case)) == repr(FrozenLink(*case)).replace("FrozenLink", "Link")
    assert repr(Reading(3, {"x": "y"})) == repr(PlainReading(3, {"x": "y"})).replace(
        "PlainReading", "Reading"
    )


def test_a_frozen_record_cannot_change() -> None:
    link = Link(8)
    attempts: list[Callable[[], object]] = [
        lambda: setattr(link, "width", 16),
        lambda: delattr(link, "width"),
        lambda: setattr(link, "other", 1),  # nothing but its fields, as a frozen dataclass
    ]
    for attempt in attempts:
        with pytest.raises(dataclasses.FrozenInstanceError):
            attempt()
    assert dataclasses.replace(link, width=16) == Link(16)
    assert link.width == 8


def test_copies_and_pickles_as_a_dataclass() -> None:
    link = Link(8, 16.0, "n", (1, 2))
    assert copy.copy(link) == link and copy.deepcopy(link) == link
    assert pickle.loads(pickle.dumps(link)) == link
    reading = Reading(1, {"a": "b"})
    assert pickle.loads(pickle.dumps(reading)) == reading


def test_a_mutable_record_changes_and_is_unhashable() -> None:
    reading = Reading(1)
    reading.index = 2
    reading.errors["x"] = "y"
    assert reading == Reading(2, {"x": "y"})
    with pytest.raises(TypeError):
        hash(reading)
    with pytest.raises(TypeError):
        hash(PlainReading(1))


def test_a_record_keeps_the_methods_its_class_writes() -> None:
    @record
    class Custom:
        x: int

        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return 42

        def __repr__(self) -> str:
            return "custom"

    assert Custom(1) == Custom(2) and hash(Custom(1)) == 42 and repr(Custom(1)) == "custom"

    @record
    class OnlyEq:  # noqa: PLW1641 - the record gives it a hash, as a frozen dataclass would
        x: int

        def __eq__(self, other: object) -> bool:
            return isinstance(other, OnlyEq)

    # Python gives a class that writes __eq__ `__hash__ = None`; the record's hash is kept.
    assert hash(OnlyEq(1)) == hash(OnlyEq(1))


def test_frozen_and_mutable_records_do_not_mix() -> None:
    with pytest.raises(TypeError, match="cannot mix frozen and mutable records"):

        @record(frozen=False)
        class Loose(Link):  # type: ignore[misc]  # mypy refuses it too
            extra: int = 0

    @record
    class Wider(Link):
        extra: int = 0

    wider = Wider(8, extra=1)
    assert wider.extra == 1 and wider != Link(8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        wider.extra = 2  # type: ignore[misc]


def test_post_init_sets_derived_fields_as_a_frozen_dataclass_does() -> None:
    @record
    class Derived:
        x: int
        double: int = dataclasses.field(init=False, default=0)

        def __post_init__(self) -> None:
            object.__setattr__(self, "double", self.x * 2)

    assert Derived(3).double == 6 and Derived(3) == Derived(3)


@record
class Made:
    index: int
    errors: list[str] = dataclasses.field(default_factory=list)
    label: str = "x"
    seen: dict[str, int] = dataclasses.field(default_factory=dict, init=False)
    double: int = dataclasses.field(default=0, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "double", self.index * 2)


@dataclasses.dataclass(frozen=True)
class FrozenMade:
    index: int
    errors: list[str] = dataclasses.field(default_factory=list)
    label: str = "x"
    seen: dict[str, int] = dataclasses.field(default_factory=dict, init=False)
    double: int = dataclasses.field(default=0, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "double", self.index * 2)


def test_init_is_a_dataclass_s() -> None:
    """Parameters, defaults, factories (a new value each time), init=False fields and
    __post_init__, the signature, the docstring and the errors of a dataclass."""
    calls: list[tuple[tuple[object, ...], dict[str, object]]] = [
        ((3,), {}),
        ((3, ["e"]), {"label": "y"}),
        ((), {"index": 4, "errors": []}),
    ]
    for args, kwargs in calls:
        mine, theirs = Made(*args, **kwargs), FrozenMade(*args, **kwargs)  # type: ignore[arg-type]
        assert list(vars(mine).items()) == list(vars(theirs).items())
    assert Made(1).errors is not Made(1).errors
    assert str(inspect.signature(Made)) == str(inspect.signature(FrozenMade))
    assert Made.__doc__ == (FrozenMade.__doc__ or "").replace("FrozenMade", "Made")
    assert Made.__doc__.startswith("Made(index: 'int', errors: 'list[str]' = <factory>")
    assert dataclasses.replace(Made(1), index=5).double == 10
    bad_calls: list[Callable[[type], object]] = [
        lambda cls: cls(),
        lambda cls: cls(1, [], "y", 4),
        lambda cls: cls(1, seen={}),
        lambda cls: cls(1, index=2),
    ]
    for bad in bad_calls:
        with pytest.raises(TypeError) as mine_error:
            bad(Made)
        with pytest.raises(TypeError) as their_error:
            bad(FrozenMade)
        assert str(mine_error.value) == str(their_error.value).replace("FrozenMade", "Made")


def test_fields_an_init_cannot_make_are_refused() -> None:
    with pytest.raises(TypeError, match="non-default argument 'y' follows default argument"):

        @record
        class Unordered:
            x: int = 0
            y: int  # type: ignore[misc]  # mypy refuses it too

    with pytest.raises(TypeError, match="no kw_only field"):

        @record
        class KeywordOnly:
            x: int = dataclasses.field(kw_only=True)

    with pytest.raises(TypeError, match="no InitVar"):

        @record
        class WithInitVar:
            x: dataclasses.InitVar[int]
