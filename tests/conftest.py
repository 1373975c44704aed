"""Replica nodes, built once per test session from tests/fixtures/nodes.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Result, Status
from nodecheck.checks.runner import CheckRun, run_checks
from tests.fixtures import nodes
from tests.fixtures.nodegen import build_node

# A calling environment with nothing audited in it, so results do not depend
# on the shell the tests run from.
CLEAN_ENVIRON = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}


@dataclass(frozen=True)
class Node:
    """A replica tree and how to run checks on it."""

    root: Path

    @property
    def fs(self) -> NodeFS:
        return NodeFS(sysfs=self.root / "sys", procfs=self.root / "proc", rootfs=self.root)

    @property
    def cli_args(self) -> list[str]:
        return [
            "--sysfs-root",
            str(self.root / "sys"),
            "--procfs-root",
            str(self.root / "proc"),
            "--rootfs",
            str(self.root),
        ]

    def context(self, environ: Mapping[str, str] | None = None) -> CheckContext:
        return CheckContext(fs=self.fs, environ=dict(environ or CLEAN_ENVIRON), uid=1000)

    def run(self, *names: str, environ: Mapping[str, str] | None = None) -> list[CheckRun]:
        checks = load_checks()
        selected = [checks[name] for name in names] if names else list(checks.values())
        return run_checks(selected, self.context(environ))

    def results(self, *names: str, environ: Mapping[str, str] | None = None) -> list[Result]:
        return [result for run in self.run(*names, environ=environ) for result in run.results]


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
def build(scratch_dir: Path) -> Callable[..., Node]:
    """Build a named node from nodes.NODES (optionally as a non-root reader sees it)."""
    cache: dict[tuple[str, bool], Node] = {}

    def make(name: str, *, unprivileged: bool = False) -> Node:
        key = (name, unprivileged)
        if key not in cache:
            spec = replace(nodes.NODES[name](), unprivileged=unprivileged)
            root = scratch_dir / f"{name}{'-unprivileged' if unprivileged else ''}"
            cache[key] = Node(build_node(spec, root))
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
        return Node(root)

    yield copy
    for path in copies:
        shutil.rmtree(path, ignore_errors=True)


LIVE = Node(Path("/"))
