"""Layers point one way: checks/ imports nothing above it, tuning/ imports checks/, agent/ both;
inside agent/, each group imports only what it talks to."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Below the layers, inside checks/: the checks, the NVML checks and the benchmarks are
# judged results, not rules; tuning shares the rules (checks/rules/) and the facts
# (checks/node/), never a check module; nor do the rules and the context import them.
CHECK_MODULES = ("nodecheck.checks.host", "nodecheck.checks.gpu", "nodecheck.checks.bench")
AGENT_GROUPS = (
    "nodecheck.agent.cli",
    "nodecheck.agent.launch",
    "nodecheck.agent.daemon",
    "nodecheck.agent.web",
    "nodecheck.agent.slurm",
    "nodecheck.agent.kubernetes",
)
FORBIDDEN = {
    "checks": ("nodecheck.agent", "nodecheck.tuning"),
    "tuning": ("nodecheck.agent", *CHECK_MODULES),
    "checks/rules": CHECK_MODULES,
    "checks/node": CHECK_MODULES,
    "checks/context.py": ("nodecheck.checks.bench",),
    # Inside agent/, grouped by what each part talks to: the web server knows nothing of
    # what it serves; Slurm and Kubernetes read findings, never the daemon's insides or
    # each other (Slurm's task prolog gives a job what exec does: launch/); the daemon
    # drives the web server and the Kubernetes reporter, never a command; the shared
    # modules (findings, config, logs) none of the groups but web's parsers, which the
    # configuration validates its files with.
    "agent/web": (
        *(g for g in AGENT_GROUPS if g != "nodecheck.agent.web"),
        "nodecheck.agent.findings",
    ),
    "agent/slurm": (
        "nodecheck.agent.daemon",
        "nodecheck.agent.web",
        "nodecheck.agent.kubernetes",
        "nodecheck.agent.cli",
    ),
    # What a job's launch is given (tune's renderings, exec, the task prolog's
    # environment): read by the tune and exec commands and by Slurm's task prolog.
    "agent/launch": tuple(g for g in AGENT_GROUPS if g != "nodecheck.agent.launch"),
    "agent/kubernetes": (
        "nodecheck.agent.daemon",
        "nodecheck.agent.web",
        "nodecheck.agent.slurm",
        "nodecheck.agent.cli",
        "nodecheck.agent.launch",
    ),
    "agent/daemon": ("nodecheck.agent.cli", "nodecheck.agent.slurm", "nodecheck.agent.launch"),
    "agent/findings.py": AGENT_GROUPS,
    "agent/logs.py": AGENT_GROUPS,
    "agent/interruption.py": AGENT_GROUPS,
    "agent/breaker.py": AGENT_GROUPS,
    "agent/state_files.py": AGENT_GROUPS,
    "agent/config.py": tuple(g for g in AGENT_GROUPS if g != "nodecheck.agent.web"),
}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, `from package import module` as package.module too."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def offenders(root: Path, layer: str, forbidden: tuple[str, ...]) -> set[str]:
    """`path imports module` for each import under root/layer (a folder or a file) of
    a module in `forbidden`."""
    where = root / layer
    files = [where] if where.is_file() else sorted(where.rglob("*.py"))
    assert files, f"nothing to check under {where}"
    return {
        f"{path.relative_to(root)} imports {name}"
        for path in files
        for name in imported_modules(path)
        if _within(name, forbidden)
    }


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer: str) -> None:
    assert offenders(ROOT, layer, FORBIDDEN[layer]) == set()


@pytest.mark.parametrize(
    "line",
    [
        "from nodecheck.checks.host.nccl_env import judge_setting",
        "from nodecheck.checks.host import nccl_env",
        "import nodecheck.checks.host.torch_alloc",
        "from nodecheck.checks import bench",
        "    from nodecheck.checks.gpu.xid import judge_gpu",
    ],
)
def test_tuning_importing_a_check_is_caught(tmp_path: Path, line: str) -> None:
    """The layer rule itself: a tuning module that imports a check module, however it
    spells the import (even inside a function), is an offender."""
    module = tmp_path / "tuning" / "red_flags.py"
    module.parent.mkdir()
    body = line if not line.startswith(" ") else "def removals() -> None:\n" + line
    module.write_text(f"from __future__ import annotations\n\n{body}\n")
    found = offenders(tmp_path, "tuning", FORBIDDEN["tuning"])
    assert found
    assert all(f.startswith("tuning/red_flags.py imports nodecheck.checks.") for f in found)
    # The rules and the facts stay importable from tuning.
    module.write_text("from nodecheck.checks.rules.nccl_settings import judge_setting\n")
    assert offenders(tmp_path, "tuning", FORBIDDEN["tuning"]) == set()


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
