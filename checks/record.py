"""`@record`: an immutable dataclass, made at half the import cost of a frozen one.

Facts, results and options are immutable values. `@dataclass(frozen=True)` makes them
so by generating four methods per class from source text (`__init__` that bypasses
assignment, `__setattr__`, `__delattr__`, `__hash__`), each compiled at import: with
ninety such classes that was a third of `nodecheck check --facts` (about 16 of its
120 ms, measured with bench/cli_latency.py). A record is an ordinary dataclass
(`dataclasses.fields`, `replace`, the codec, `==` and `repr` see no difference) whose
only generated method is `__init__`; `__eq__`, `__repr__`, `__hash__`, `__setattr__`
and `__delattr__` are shared functions that read the class's field names instead:

- a field is assigned once, by `__init__` (or `__post_init__` for an `init=False`
  field); assigning it again, or deleting it, raises FrozenInstanceError as a frozen
  dataclass does;
- `==` compares the same class's compared fields as a tuple, `repr` shows the `repr`
  fields as a dataclass does, and the hash is that of the fields a frozen dataclass
  hashes (`compare`, or `hash=True`).

Type checkers treat `@record` as `@dataclass(frozen=True)` (PEP 681,
`typing.dataclass_transform`), so an assignment is caught before it runs.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
elif sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # pragma: no cover - Python 3.10: only type checkers read the marker

    def dataclass_transform(**_: object) -> Callable[[T], T]:
        return lambda decorated: decorated


T = TypeVar("T")


def _assign_once(self: object, name: str, value: object) -> None:
    # As a frozen dataclass: no field assigned twice, and nothing but the fields at all.
    if name in self.__dict__ or name not in type(self).__dataclass_fields__:  # type: ignore[attr-defined]
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _no_delete(self: object, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _hash_of_fields(self: Any) -> int:
    values = self.__dict__
    return hash(tuple([values[name] for name in type(self).__record_hashed__]))


def _equal_fields(self: Any, other: Any) -> Any:
    # As a dataclass compares: the same class, then the tuples of the compared fields
    # (a tuple compares an item with itself as equal, NaN included).
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = type(self).__record_compared__
    mine, theirs = self.__dict__, other.__dict__
    return tuple([mine[name] for name in names]) == tuple([theirs[name] for name in names])


def _repr_fields(self: Any) -> str:
    values = self.__dict__
    shown = ", ".join(f"{name}={values[name]!r}" for name in type(self).__record_shown__)
    return f"{type(self).__qualname__}({shown})"


@overload
def record(cls: type[T], /) -> type[T]: ...


@overload
def record(*, frozen: bool = True) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: type[T] | None = None, /, *, frozen: bool = True) -> Any:
    """`cls` as an immutable dataclass (see the module's docstring); `@record(frozen=False)`
    for one whose fields a reader fills in as it goes (an Inventory, a GpuReading), made as
    cheaply and unhashable, as a dataclass with `eq` is."""

    def make(cls: type[T]) -> type[T]:
        for base in cls.__mro__[1:]:
            if getattr(base, "__record_frozen__", frozen) != frozen:
                # As dataclasses refuse: a frozen record's fields would change through a
                # mutable subclass, or a mutable one's be assign-once.
                raise TypeError(f"{cls.__name__}: cannot mix frozen and mutable records")
        # The methods the class writes itself are kept, as a dataclass keeps them (a
        # class that writes __eq__ gets __hash__ = None from Python: not its own).
        own = set(cls.__dict__)
        if cls.__dict__.get("__hash__", False) is None and "__eq__" in cls.__dict__:
            own.discard("__hash__")
        made: Any = dataclasses.dataclass(cls, repr=False, eq=False)
        fields = dataclasses.fields(made)
        made.__record_frozen__ = frozen
        made.__record_compared__ = tuple(spec.name for spec in fields if spec.compare)
        made.__record_shown__ = tuple(spec.name for spec in fields if spec.repr)
        shared: dict[str, object] = {"__eq__": _equal_fields, "__repr__": _repr_fields}
        if frozen:
            made.__record_hashed__ = tuple(
                spec.name for spec in fields if (spec.compare if spec.hash is None else spec.hash)
            )
            shared.update(
                __setattr__=_assign_once, __delattr__=_no_delete, __hash__=_hash_of_fields
            )
        else:
            shared["__hash__"] = None  # mutable and compared by value: unhashable
        for name, method in shared.items():
            if name not in own:
                setattr(made, name, method)
        return made  # type: ignore[no-any-return]

    return make if cls is None else make(cls)
