"""Checks register themselves here, the way node_exporter collectors do from init().

A check is a function `run(ctx) -> Iterable[Result]` in a module named after
what it reads, decorated with `@register(...)`. `load_checks()` imports every
module of the check packages, so adding a check is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import replace

from nodecheck.checks.context import CheckContext
from nodecheck.checks.record import record
from nodecheck.checks.result import Action, FaultClass, Origin, Result, Status

CheckFunction = Callable[[CheckContext], Iterable[Result]]

# Packages whose every module is a check.
CHECK_PACKAGES = ("nodecheck.checks.host", "nodecheck.checks.gpu")


@record
class Check:
    """A registered check and what it declares beside itself: what its findings mean
    (their fault class, the action a warning or failure asks for, whether the evidence
    is the node's or a job's), whether it gates a job (`gate`: its failures can make the
    node unusable for any job, and it is quick: Slurm's prolog runs it), the parts of the
    facts it judges (`needs`), whether those are complete only as root (the unprivileged
    agent takes them from the root snapshot), which CheckConfig fields it reads, its
    interval and its timeout."""

    name: str
    run: CheckFunction
    interval_s: float
    timeout_s: float
    description: str
    needs: tuple[str, ...] = ()
    root: bool = False
    options: tuple[str, ...] = ()
    # register() requires a declaration; a Check made directly (a test's) that declares
    # none is read the careful way: hardware, and a person looks.
    fault_class: FaultClass = FaultClass.GPU_HARDWARE
    action: Action = Action.INVESTIGATE
    origin: Origin = Origin.NODE
    gate: bool = False
    benchmark: bool = False  # registered with register_benchmark

    def meant(self, result: Result) -> Result:
        """`result` with its meaning whole: the result's own action, class and origin
        where it set them, else the check's. A result that asks for nothing (ok, skip)
        has the action none; one that could not determine (error), investigate."""
        if result.status in (Status.OK, Status.SKIP):
            action = Action.NONE
        elif result.status is Status.ERROR:
            action = result.action or Action.INVESTIGATE
        else:
            action = result.action or self.action
        fault_class = result.fault_class or self.fault_class
        origin = result.origin or self.origin
        if (action, fault_class, origin) == (result.action, result.fault_class, result.origin):
            return result
        return replace(result, action=action, fault_class=fault_class, origin=origin)

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


@record
class Meaning:
    """What a check declares its findings mean (Check's fields of the same names)."""

    fault_class: FaultClass
    action: Action
    origin: Origin = Origin.NODE
    gate: bool = False
    benchmark: bool = False


def _register_into(
    registry: dict[str, Check],
    name: str,
    interval_s: float,
    timeout_s: float,
    meaning: Meaning,
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
            name,
            function,
            interval_s,
            timeout_s,
            description,
            needs,
            root,
            options,
            meaning.fault_class,
            meaning.action,
            meaning.origin,
            meaning.gate,
            meaning.benchmark,
        )
        return function

    return decorate


def register(
    name: str,
    *,
    interval_s: float,
    timeout_s: float,
    fault_class: FaultClass,
    action: Action,
    origin: Origin = Origin.NODE,
    gate: bool = False,
    needs: tuple[str, ...],
    root: bool = False,
    options: tuple[str, ...] = (),
) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check; its docstring's first line is its description. `fault_class`,
    `action` and `origin` are what its warnings and failures mean unless a result says
    otherwise; `gate` that its failures can make the node unusable for a job (the
    prolog runs it); `needs` names the parts of the facts it judges; `root` that they
    are complete only as root; `options` the CheckConfig fields it reads."""
    meaning = Meaning(fault_class, action, origin, gate)
    return _register_into(_REGISTRY, name, interval_s, timeout_s, meaning, needs, root, options)


def unregister(name: str) -> None:
    """Forget a registered check (a test's own check, once the test is done)."""
    _REGISTRY.pop(name, None)


def register_benchmark(
    name: str,
    *,
    interval_s: float,
    timeout_s: float,
    needs: tuple[str, ...] = ("gpus", "pci_gpus", "hostname"),
    options: tuple[str, ...] = ("bench",),
) -> Callable[[CheckFunction], CheckFunction]:
    """Register a benchmark (a check that runs only when asked for, or on its own schedule).
    A benchmark measures the live node (a child process on its GPUs): never a capture.
    A benchmark below its peers, its history or its model's rate is slow, not broken: a
    person looks (a throttled clock, a link, a neighbour's job)."""
    meaning = Meaning(FaultClass.GPU_PERFORMANCE, Action.INVESTIGATE, benchmark=True)
    return _register_into(_BENCHMARKS, name, interval_s, timeout_s, meaning, needs, False, options)


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
