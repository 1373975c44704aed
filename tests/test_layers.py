"""Layers point one way: checks/ imports nothing above it, tuning/ imports checks/, agent/ both."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "checks": ("nodecheck.agent", "nodecheck.tuning"),
    "tuning": ("nodecheck.agent",),
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer: str) -> None:
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files
    offenders = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in imported_modules(path)
        if name.startswith(FORBIDDEN[layer])
    }
    assert offenders == set()


def test_no_grab_bag_modules() -> None:
    names = {
        path.stem
        for layer in ("agent", "checks", "tuning")
        for path in (ROOT / layer).rglob("*.py")
    }
    assert not names & {"utils", "helpers", "misc", "common"}


def test_torch_only_in_the_benchmark_process() -> None:
    """The CLI and the daemon never import torch: only the benchmark child does."""
    child = ROOT / "checks" / "bench" / "child"
    importers = {
        str(path.relative_to(ROOT))
        for layer in ("agent", "checks", "tuning")
        for path in (ROOT / layer).rglob("*.py")
        if any(name == "torch" or name.startswith("torch.") for name in imported_modules(path))
    }
    assert importers
    assert {path for path in importers if not (ROOT / path).is_relative_to(child)} == set()


def test_every_package_is_installed() -> None:
    """pyproject lists packages by hand (package-dir maps them under nodecheck.*): a
    folder missing from the list works in an editable install and breaks a real one."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        "nodecheck." + ".".join(init.parent.relative_to(ROOT).parts)
        for layer in ("agent", "checks", "tuning")
        for init in (ROOT / layer).rglob("__init__.py")
    }
    found.add("nodecheck")  # main/: the namespace itself, holding only __main__.py
    assert found == listed
