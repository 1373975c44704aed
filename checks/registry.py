"""Checks register themselves here, the way node_exporter collectors do from init().

A check is a function `run(ctx) -> Iterable[Result]` in a module named after
what it reads, decorated with `@register(...)`. `load_checks()` imports every
module of the check packages, so adding a check is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nodecheck.checks.context import CheckContext
from nodecheck.checks.result import Result

CheckFunction = Callable[[CheckContext], Iterable[Result]]

# Packages whose every module is a check.
CHECK_PACKAGES = ("nodecheck.checks.host", "nodecheck.checks.gpu")


@dataclass(frozen=True)
class Check:
    name: str
    run: CheckFunction
    interval_s: float
    timeout_s: float
    description: str


_REGISTRY: dict[str, Check] = {}


def register(
    name: str, *, interval_s: float, timeout_s: float
) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check; its docstring's first line is its description."""

    def decorate(function: CheckFunction) -> CheckFunction:
        if name in _REGISTRY and _REGISTRY[name].run is not function:
            raise ValueError(f"check {name!r} registered twice")
        description = (function.__doc__ or name).strip().splitlines()[0]
        _REGISTRY[name] = Check(name, function, interval_s, timeout_s, description)
        return function

    return decorate


def load_checks() -> dict[str, Check]:
    """Every registered check by name, importing the check packages first."""
    for package_name in CHECK_PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package_name}.{module.name}")
    return dict(sorted(_REGISTRY.items()))


def checks_in(package: str) -> dict[str, Check]:
    """The registered checks whose module is in `package` ("nodecheck.checks.gpu")."""
    return {
        name: check
        for name, check in load_checks().items()
        if check.run.__module__.startswith(package + ".")
    }
