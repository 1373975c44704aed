"""Checks register themselves here, the way node_exporter collectors do from init().

A check is a function `run(ctx) -> Iterable[Result]` in a module named after
what it reads, decorated with `@register(...)`. `load_checks()` imports every
module of the check packages, so adding a check is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable

from nodecheck.checks.context import CheckContext
from nodecheck.checks.record import record
from nodecheck.checks.result import Result

CheckFunction = Callable[[CheckContext], Iterable[Result]]

# Packages whose every module is a check.
CHECK_PACKAGES = ("nodecheck.checks.host", "nodecheck.checks.gpu")


@record
class Check:
    """A registered check and what it declares beside itself: the parts of the facts it
    judges (`needs`), whether those are complete only as root (the unprivileged agent
    takes them from the root snapshot), which CheckConfig fields it reads, its interval
    and its timeout."""

    name: str
    run: CheckFunction
    interval_s: float
    timeout_s: float
    description: str
    needs: tuple[str, ...] = ()
    root: bool = False
    options: tuple[str, ...] = ()

    @property
    def nvml(self) -> bool:
        """Whether it judges what NVML says (the agent gives it the NVML session)."""
        from nodecheck.checks.node.facts import PARTS

        return any(PARTS[name].nvml for name in self.needs)


_REGISTRY: dict[str, Check] = {}
# Benchmarks are checks too, kept apart: `nodecheck check` never runs them;
# `nodecheck bench` and the agent's benchmark schedule do, one at a time.
_BENCHMARKS: dict[str, Check] = {}
BENCH_PACKAGE = "nodecheck.checks.bench"


def _register_into(
    registry: dict[str, Check],
    name: str,
    interval_s: float,
    timeout_s: float,
    needs: tuple[str, ...],
    root: bool,
    options: tuple[str, ...],
) -> Callable[[CheckFunction], CheckFunction]:
    from nodecheck.checks.node.facts import PARTS

    unknown = [part for part in needs if part not in PARTS]
    if unknown:
        raise ValueError(f"check {name!r} needs unknown facts {unknown} (parts: {list(PARTS)})")

    def decorate(function: CheckFunction) -> CheckFunction:
        if name in registry and registry[name].run is not function:
            raise ValueError(f"check {name!r} registered twice")
        description = (function.__doc__ or name).strip().splitlines()[0]
        registry[name] = Check(
            name, function, interval_s, timeout_s, description, needs, root, options
        )
        return function

    return decorate


def register(
    name: str,
    *,
    interval_s: float,
    timeout_s: float,
    needs: tuple[str, ...],
    root: bool = False,
    options: tuple[str, ...] = (),
) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check; its docstring's first line is its description. `needs` names
    the parts of the facts it judges; `root` that they are complete only as root;
    `options` the CheckConfig fields it reads."""
    return _register_into(_REGISTRY, name, interval_s, timeout_s, needs, root, options)


def register_benchmark(
    name: str,
    *,
    interval_s: float,
    timeout_s: float,
    needs: tuple[str, ...] = ("gpus", "pci_gpus", "hostname"),
    options: tuple[str, ...] = ("bench",),
) -> Callable[[CheckFunction], CheckFunction]:
    """Register a benchmark (a check that runs only when asked for, or on its own schedule).
    A benchmark measures the live node (a child process on its GPUs): never a capture."""
    return _register_into(_BENCHMARKS, name, interval_s, timeout_s, needs, False, options)


def load_benchmarks() -> dict[str, Check]:
    """Every registered benchmark by name, importing the benchmark modules first.

    Only the package's modules are imported, never its `child` subpackage,
    which is the benchmark process and imports torch.
    """
    package = importlib.import_module(BENCH_PACKAGE)
    for module in pkgutil.iter_modules(package.__path__):
        if not module.ispkg:
            importlib.import_module(f"{BENCH_PACKAGE}.{module.name}")
    return dict(_BENCHMARKS)


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


class UnknownCheckError(ValueError):
    """Names that are no registered check."""

    def __init__(self, unknown: list[str], known: list[str]) -> None:
        super().__init__(f"unknown check {', '.join(unknown)} (checks: {', '.join(known)})")
        self.unknown = unknown


class NothingSelectedError(ValueError):
    """A selection that leaves no check to run: nothing judged is no verdict."""


def select_checks(
    available: dict[str, Check], only: Iterable[str], skip: Iterable[str]
) -> list[Check]:
    """The checks of `available` that `only` (all when empty) keeps and `skip` leaves out,
    in registry order. UnknownCheckError for a name that is no check; NothingSelectedError
    when none is left (absence is never a pass)."""
    wanted, unwanted = set(only), set(skip)
    unknown = sorted((wanted | unwanted) - set(available))
    if unknown:
        raise UnknownCheckError(unknown, list(available))
    selected = [
        check
        for name, check in available.items()
        if (not wanted or name in wanted) and name not in unwanted
    ]
    if not selected:
        raise NothingSelectedError("no check left to run")
    return selected
