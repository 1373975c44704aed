"""Replica nodes, built once per test session from tests/fixtures/nodes.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.nvml import NvmlSession
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Result, Status
from nodecheck.checks.runner import CheckRun, run_checks
from tests.fake_nvml.build import build_fake_nvml
from tests.fixtures import nodes
from tests.fixtures.nodegen import build_node
from tests.fixtures.nvml_scenarios import SCENARIOS, Scenario, write_scenario

# A calling environment with nothing audited in it, so results do not depend
# on the shell the tests run from.
CLEAN_ENVIRON = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}


SCENARIO_VARIABLE = "FAKE_NVML_SCENARIO"
# Short, so tests of a hung NVML call take a second, not five.
NVML_DEADLINE_S = 1.0


@dataclass(frozen=True)
class Node:
    """A replica tree, the fake NVML scenario that goes with it, and how to run checks on it.

    With `nvml_library` None (the live node) the system's NVML is used.
    """

    root: Path
    nvml_library: Path | None = None
    scenario: Path | None = None

    @property
    def fs(self) -> NodeFS:
        return NodeFS(sysfs=self.root / "sys", procfs=self.root / "proc", rootfs=self.root)

    @property
    def cli_args(self) -> list[str]:
        args = [
            "--sysfs-root",
            str(self.root / "sys"),
            "--procfs-root",
            str(self.root / "proc"),
            "--rootfs",
            str(self.root),
        ]
        if self.nvml_library is not None:
            args += ["--nvml-library", str(self.nvml_library), "--nvml-timeout", "2"]
        return args

    @property
    def env(self) -> dict[str, str]:
        """What a `nodecheck` subprocess needs in its environment for this node."""
        return {SCENARIO_VARIABLE: str(self.scenario)} if self.scenario else {}

    def with_scenario(self, scenario: Scenario, path: Path) -> Node:
        """This node with another NVML scenario, written to `path`."""
        return replace(self, scenario=write_scenario(scenario, path))

    def nvml(self, deadline_s: float = NVML_DEADLINE_S) -> NvmlSession:
        """A fresh NVML session on this node's scenario (the fake reads it at nvmlInit)."""
        if self.scenario is not None:
            os.environ[SCENARIO_VARIABLE] = str(self.scenario)
        library = None if self.nvml_library is None else str(self.nvml_library)
        return NvmlSession(deadline_s=deadline_s, library_path=library)

    def context(self, environ: Mapping[str, str] | None = None, **options: Any) -> CheckContext:
        options.setdefault("nvml", self.nvml())
        return CheckContext(fs=self.fs, environ=dict(environ or CLEAN_ENVIRON), uid=1000, **options)

    def run(
        self, *names: str, environ: Mapping[str, str] | None = None, **options: Any
    ) -> list[CheckRun]:
        checks = load_checks()
        selected = [checks[name] for name in names] if names else list(checks.values())
        return run_checks(selected, self.context(environ, **options))

    def results(
        self, *names: str, environ: Mapping[str, str] | None = None, **options: Any
    ) -> list[Result]:
        runs = self.run(*names, environ=environ, **options)
        return [result for run in runs for result in run.results]


def by_status(results: list[Result], *statuses: Status) -> list[Result]:
    return [result for result in results if result.status in statuses]


@pytest.fixture(scope="session")
def scratch_dir() -> Iterator[Path]:
    """Where node trees are written: memory-backed when the machine has /dev/shm, since a
    tree is thousands of small files and a disk makes each build and copy take seconds."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="nodecheck-tests-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def fake_nvml_library(scratch_dir: Path) -> Path:
    """The fake libnvidia-ml.so.1, compiled once per session from tests/fake_nvml."""
    return build_fake_nvml(scratch_dir / "fake-nvml")


@pytest.fixture(scope="session")
def build(scratch_dir: Path, fake_nvml_library: Path) -> Callable[..., Node]:
    """Build a named node from nodes.NODES (optionally as a non-root reader sees it),
    with its NVML scenario from nvml_scenarios.SCENARIOS."""
    cache: dict[tuple[str, bool], Node] = {}

    def make(name: str, *, unprivileged: bool = False) -> Node:
        key = (name, unprivileged)
        if key not in cache:
            spec = replace(nodes.NODES[name](), unprivileged=unprivileged)
            root = scratch_dir / f"{name}{'-unprivileged' if unprivileged else ''}"
            build_node(spec, root)
            scenario = write_scenario(SCENARIOS[name](), root / "nvml-scenario.json")
            cache[key] = Node(root, fake_nvml_library, scenario)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def dgx(build: Callable[..., Node]) -> Node:
    """(a) the healthy 8-GPU node."""
    return build("dgx-h100")


@pytest.fixture(scope="session")
def dgx_faulty(build: Callable[..., Node]) -> Node:
    """(b) the same node with faults."""
    return build("dgx-h100-faulty")


@pytest.fixture(scope="session")
def workstation(build: Callable[..., Node]) -> Node:
    """(c) the one-GPU workstation."""
    return build("workstation")


@pytest.fixture
def copy_node(scratch_dir: Path) -> Iterator[Callable[[Node], Node]]:
    """A private copy of a node that a test may damage."""
    copies: list[Path] = []

    def copy(node: Node) -> Node:
        root = Path(tempfile.mkdtemp(dir=scratch_dir)) / node.root.name
        shutil.copytree(node.root, root, symlinks=True)
        copies.append(root.parent)
        scenario = root / node.scenario.name if node.scenario else None
        return Node(root, node.nvml_library, scenario)

    yield copy
    for path in copies:
        shutil.rmtree(path, ignore_errors=True)


LIVE = Node(Path("/"))

UPDATE_GOLDEN_VARIABLE = "NODECHECK_UPDATE_GOLDEN"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help=f"rewrite tests/golden/ instead of comparing with it (or {UPDATE_GOLDEN_VARIABLE}=1)",
    )


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    """Whether the golden files are rewritten (`pytest --update-golden`, or
    NODECHECK_UPDATE_GOLDEN=1) rather than compared."""
    option = bool(request.config.getoption("--update-golden"))
    return option or os.environ.get(UPDATE_GOLDEN_VARIABLE, "") == "1"
