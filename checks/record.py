"""`@record`: an immutable dataclass, made at a fraction of the import cost of a frozen one.

Facts, results and options are immutable values. `@dataclass(frozen=True)` makes them
so by generating four methods per class from source text (`__init__` that bypasses
assignment, `__setattr__`, `__delattr__`, `__hash__`), each compiled at import: with
ninety such classes that was a third of `nodecheck check --facts`. A record is an
ordinary dataclass (`dataclasses.fields`, `replace`, the codec, `==` and `repr` see no
difference) for which nothing is compiled, and

- its fields are collected as `dataclasses.dataclass(init=False, repr=False, eq=False)`
  collects them, the same Field objects, class attributes and parameters, without the
  checks for ClassVar, InitVar and KW_ONLY (regular expressions over every annotation,
  a quarter of a record's cost) where none of those words is in an annotation, and by
  dataclasses itself where one is (_as_dataclass);
- `__init__` is the code of one function of this module, `_init_template`, given the
  class's `__init__` parameters (the fields, in order) and their defaults, so keywords,
  defaults, the errors for a missing or unknown argument and `inspect.signature` are a
  dataclass's. It hands its arguments to a function made for the class, which stores
  them in the instance's `__dict__` (no `__setattr__` per field: half the cost of
  making an instance), calls a `default_factory` for a field not given and for an
  `init=False` one, and then `__post_init__` where the class has one. InitVar and
  keyword-only fields are refused;
- `__eq__`, `__repr__`, `__hash__`, `__setattr__` and `__delattr__` are shared functions
  that read the class's field names. A field is assigned once, by `__init__` (or
  `__post_init__` for an `init=False` field); assigning it again, or deleting it,
  raises FrozenInstanceError as a frozen dataclass does. `==` compares the same
  class's compared fields as a tuple, `repr` shows the `repr` fields as a dataclass
  does, and the hash is that of the fields a frozen dataclass hashes (`compare`, or
  `hash=True`);
- a class without a docstring gets a dataclass's (its name and `__init__`'s
  signature), made when it is first read.

Type checkers treat `@record` as `@dataclass(frozen=True)` (PEP 681,
`typing.dataclass_transform`), so an assignment is caught before it runs.
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
import inspect  # dataclasses imports it: free
import sys
import types
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


class _Factory:
    """The default of an `__init__` parameter whose field has a default_factory."""

    def __repr__(self) -> str:
        return "<factory>"  # as a dataclass shows it in the signature


_FACTORY = _Factory()


def _fill(arguments: dict[str, Any]) -> None:
    raise NotImplementedError  # each record's __init__ has its own (_make_init)


def _init_template(self: object) -> None:
    # Every record's __init__ is this code given the fields as its parameters: what it
    # does refers to no parameter, so no class needs code compiled for it.
    _fill(locals())


def _filler(
    steps: list[tuple[str, Callable[[], object] | None, bool]], post_init: bool, assign: bool
) -> Callable[[dict[str, Any]], None]:
    """What `__init__` does with its arguments (the parameters by name, `self` among
    them). `steps` are the fields it makes, in order: name, default_factory, whether
    `__init__` takes it."""
    if not (post_init or assign) and all(factory is None and taken for _, factory, taken in steps):

        def store(arguments: dict[str, Any]) -> None:
            arguments.pop("self").__dict__.update(arguments)

        return store

    def fill(arguments: dict[str, Any]) -> None:
        self = arguments["self"]
        stored = self.__dict__
        for name, factory, taken in steps:
            value = arguments[name] if taken else _FACTORY
            if value is _FACTORY and factory is not None:
                value = factory()
            if assign:
                setattr(self, name, value)
            else:
                stored[name] = value
        if post_init:
            self.__post_init__()

    return fill


def _make_init(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> Callable[..., None]:
    """`cls.__init__` as a dataclass generates it (see the module's docstring)."""
    taken = [spec for spec in fields if spec.init]
    defaults: list[object] = []
    for spec in taken:
        if spec.kw_only is True:
            raise TypeError(f"{cls.__name__}.{spec.name}: a record takes no kw_only field")
        if spec.default is not dataclasses.MISSING:
            defaults.append(spec.default)
        elif spec.default_factory is not dataclasses.MISSING:
            defaults.append(_FACTORY)
        elif defaults:
            raise TypeError(f"non-default argument {spec.name!r} follows default argument")
    # Fields with a plain default that __init__ does not take keep the class attribute,
    # as a dataclass leaves them; the others are stored or made in field order.
    steps = [
        (
            spec.name,
            None if spec.default_factory is dataclasses.MISSING else spec.default_factory,
            spec.init,
        )
        for spec in fields
        if spec.init or spec.default_factory is not dataclasses.MISSING
    ]
    # A mutable record that writes its own __setattr__ gets its fields through it.
    setter: object = cls.__setattr__
    assign = setter is not object.__setattr__ and setter is not _assign_once
    fill = _filler(steps, hasattr(cls, "__post_init__"), assign)
    names = ("self", *(spec.name for spec in taken))
    if "self" in names[1:]:
        raise TypeError(f"{cls.__name__}: a record has no field named self")
    code = _init_template.__code__.replace(
        co_argcount=len(names), co_nlocals=len(names), co_varnames=names, co_name="__init__"
    )
    qualname = f"{cls.__qualname__}.__init__"
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=qualname)
    scope = {"_fill": fill, "__builtins__": builtins, "__name__": cls.__module__}
    init = types.FunctionType(code, scope, "__init__", tuple(defaults) or None)
    init.__qualname__ = qualname
    init.__annotations__ = {spec.name: spec.type for spec in taken}
    init.__annotations__["return"] = None
    return init


@dataclasses.dataclass(init=False, repr=False, eq=False)
class _Made:
    """What `dataclasses.dataclass(cls, init=False, repr=False, eq=False)` gives every
    record alike: its parameters, and the mark of a real field."""

    field: int


_PARAMS = _Made.__dataclass_params__  # type: ignore[attr-defined]
_FIELD_MARK = _Made.__dataclass_fields__["field"]._field_type  # type: ignore[attr-defined]
# Annotations dataclasses reads a meaning in (a pseudo-field, a marker): such a class is
# made by dataclasses itself.
_SPECIAL = ("ClassVar", "InitVar", "KW_ONLY")


def _as_dataclass(cls: type) -> Any:
    """`dataclasses.dataclass(cls, init=False, repr=False, eq=False)`: the same fields,
    class attributes and `__match_args__`, made without its per-field checks where they
    cannot apply (a quarter of a record's import cost): every annotation a string (`from
    __future__ import annotations`) naming no ClassVar, InitVar or KW_ONLY, and every
    dataclass base a record. Any other class is made by dataclasses."""
    annotations = inspect.get_annotations(cls)
    fields: dict[str, dataclasses.Field[Any]] = {}
    for base in cls.__mro__[-1:0:-1]:
        inherited = base.__dict__.get("__dataclass_fields__")
        if inherited is not None:
            if base.__dict__.get("__dataclass_params__") is not _PARAMS:
                return dataclasses.dataclass(cls, init=False, repr=False, eq=False)
            fields.update(inherited)
    own = []
    for name, kind in annotations.items():
        if type(kind) is not str or any(word in kind for word in _SPECIAL):
            return dataclasses.dataclass(cls, init=False, repr=False, eq=False)
        default: Any = getattr(cls, name, dataclasses.MISSING)
        if isinstance(default, dataclasses.Field):
            spec = default
        elif isinstance(default, types.MemberDescriptorType):
            return dataclasses.dataclass(cls, init=False, repr=False, eq=False)
        else:
            spec = dataclasses.field(default=default)
        spec.name = name
        spec.type = kind
        spec._field_type = _FIELD_MARK  # type: ignore[attr-defined]
        if spec.kw_only is dataclasses.MISSING:
            spec.kw_only = False
        if spec.default.__class__.__hash__ is None:  # as dataclasses refuses a list
            raise ValueError(
                f"mutable default {type(spec.default)} for field {name} is not allowed: "
                "use default_factory"
            )
        own.append(spec)
    for spec in own:
        fields[spec.name] = spec
        if isinstance(cls.__dict__.get(spec.name), dataclasses.Field):
            if spec.default is dataclasses.MISSING:
                delattr(cls, spec.name)
            else:
                setattr(cls, spec.name, spec.default)
    for name, value in cls.__dict__.items():
        if isinstance(value, dataclasses.Field) and name not in annotations:
            raise TypeError(f"{name!r} is a field but has no type annotation")
    made: dict[str, object] = {"__dataclass_params__": _PARAMS, "__dataclass_fields__": fields}
    if "__match_args__" not in cls.__dict__:
        made["__match_args__"] = tuple(spec.name for spec in fields.values() if spec.init)
    if "__replace__" in _Made.__dict__ and "__replace__" not in cls.__dict__:
        made["__replace__"] = _Made.__dict__["__replace__"]  # Python 3.13: copy.replace
    for name, value in made.items():
        setattr(cls, name, value)
    abc.update_abstractmethods(cls)
    return cls


class _SignatureDoc:
    """A dataclass's docstring for a class without one (its name and `__init__`'s
    signature), made when first read: inspect.signature is not cheap."""

    def __init__(self) -> None:
        self.text: str | None = None

    def __get__(self, instance: object, owner: type) -> str:
        if self.text is None:
            try:
                shown = str(inspect.signature(owner)).replace(" -> None", "")
            except (TypeError, ValueError):
                shown = ""
            self.text = owner.__name__ + shown
        return self.text


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
        # A dataclass without a docstring computes one from inspect.signature: given
        # when read instead (_SignatureDoc).
        documented = bool(cls.__dict__.get("__doc__"))
        if not documented:
            cls.__doc__ = "-"
        made = _as_dataclass(cls)
        fields = dataclasses.fields(made)
        if len(made.__dataclass_fields__) != len(fields):  # a ClassVar, or an InitVar
            for spec in made.__dataclass_fields__.values():
                # What its __init__ does not make: refused rather than ignored.
                if isinstance(spec.type, dataclasses.InitVar) or (
                    isinstance(spec.type, str) and spec.type.split("[")[0].endswith("InitVar")
                ):
                    raise TypeError(f"{cls.__name__}.{spec.name}: a record takes no InitVar")
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
        if "__init__" not in own:
            made.__init__ = _make_init(made, fields)
        if not documented:
            made.__doc__ = _SignatureDoc()
        return made  # type: ignore[no-any-return]

    return make if cls is None else make(cls)
