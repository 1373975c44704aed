"""The project's own files install what the tests need: `pip install -e '.[test]'` alone
lets pytest start, and `make demo` works as the README says.

The venv the suite runs in also holds torch (the `bench` extra, from `make test`), which
brings packages of its own (filelock, jinja2, ...). A pytest plugin that imported one of
them without its distribution declaring it would load here and fail on a machine that
installed only the test extra: cloudcoil's plugin imports filelock, which cloudcoil
declares only in its own `test` extra. So the plugins are imported here with every
distribution outside the test extra's requirement closure hidden.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, entry_points
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]


def requirement_closure(root: str, extras: set[str]) -> set[str]:
    """The installed distributions `root[extras]` needs, transitively (canonical names)."""
    seen: set[str] = set()
    pending: list[tuple[str, set[str]]] = [(root, extras)]
    while pending:
        name, wanted = pending.pop()
        key = canonicalize_name(name)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue  # a requirement whose marker held but is not installed: pip's concern
        seen.add(key)
        for line in requires:
            requirement = Requirement(line)
            environments = [{"extra": extra} for extra in wanted | {""}]
            marker = requirement.marker
            if marker is not None and not any(marker.evaluate(env) for env in environments):
                continue
            child = canonicalize_name(requirement.name)
            if child not in seen or requirement.extras:
                pending.append((requirement.name, set(requirement.extras)))
    return seen


# Run in a fresh interpreter: a finder first on sys.meta_path refuses any top-level module
# that only a distribution outside the closure provides, then each plugin is imported.
PLUGIN_IMPORTER = """
import importlib, importlib.abc, json, sys
from importlib.metadata import packages_distributions
from packaging.utils import canonicalize_name
allowed = set(json.loads(sys.argv[1]))
plugins = json.loads(sys.argv[2])
providers = packages_distributions()

class OutsideTheTestExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        dists = {canonicalize_name(d) for d in providers.get(name.partition(".")[0], [])}
        if dists and not dists & allowed:
            raise ModuleNotFoundError(f"{name}: only in {sorted(dists)}, not in the test extra")
        return None

sys.meta_path.insert(0, OutsideTheTestExtra())
failures = {}
for plugin in plugins:
    try:
        importlib.import_module(plugin)
    except Exception as err:
        failures[plugin] = f"{type(err).__name__}: {err}"
print(json.dumps(failures))
"""


def test_pytest_plugins_load_with_the_test_extra_alone() -> None:
    allowed = requirement_closure("nodecheck", {"test"})
    assert "pytest" in allowed and "bcrypt" in allowed  # the closure is what pyproject says
    assert "torch" not in allowed  # the bench extra is not the test extra
    plugins = [
        point.value.partition(":")[0]
        for point in entry_points(group="pytest11")
        if point.dist is not None and canonicalize_name(point.dist.name) in allowed
    ]
    assert plugins, "no pytest plugin among the test extra's distributions"
    done = subprocess.run(
        [sys.executable, "-c", PLUGIN_IMPORTER, json.dumps(sorted(allowed)), json.dumps(plugins)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout) == {}


def test_make_demo_succeeds_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """`make demo` shows the faulty replica's table (its check exits 1, by design), ends
    with exit 0, and removes the replica it built (18 MB a run otherwise)."""
    environ = dict(os.environ, TMPDIR=str(tmp_path))
    # -o: the venv exists (the suite runs in it); never reinstall it from a test.
    done = subprocess.run(
        ["make", "--no-print-directory", "-s", "-o", ".venv/bin/.installed", "demo"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Error" not in done.stderr
    assert "nodecheck dgx-h100-07: FAIL" in done.stdout
    assert "exit status 1" in done.stderr  # the check's own status, said
    assert list(tmp_path.iterdir()) == []


def test_the_demo_takes_its_options_in_any_order(tmp_path: Path) -> None:
    """`--dest DIR --expect-status 1` as well as the other way round: `--expect-status`
    after `--dest` went to `nodecheck check`, which refused it (exit 2)."""
    dest = tmp_path / "replica"
    done = subprocess.run(
        [sys.executable, "-m", "tests.fixtures.demo", "--dest", str(dest), "--expect-status", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "exit status 1, as expected of this replica" in done.stderr
    assert "nodecheck dgx-h100-07: FAIL" in done.stdout
    assert any(dest.iterdir())  # --dest keeps the replica


def test_a_python_whose_venv_fails_is_named_and_leaves_no_half_made_venv(tmp_path: Path) -> None:
    """Debian's python3 without python3-venv: `python3 -m venv DIR` makes DIR/bin, prints
    "ensurepip is not available" and exits 1. The interpreter here has its venv, so a
    stand-in plays only that: any other use runs the real one. make removes the half-made
    venv and installs the package, or, as here where it is installed, says which packages
    it checked, never leaving a venv without pip for the next make to trust."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for package in ("python3-venv", f"python{version}-venv"):
        if subprocess.run(["dpkg", "-s", package], capture_output=True, check=False).returncode:
            pytest.skip(f"{package} is not installed: make would install it")
    python = tmp_path / "python3"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = venv ]; then\n'
        '  mkdir -p "$3/bin"\n'
        "  echo 'The virtual environment was not created successfully because ensurepip is "
        "not available.' >&2\n"
        "  exit 1\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    venv = tmp_path / "venv"
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            f"VENV={venv}",
            f"PYTHON={python}",
            f"{venv}/bin/.installed",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    assert f"python3-venv and python{version}-venv are installed" in done.stderr
    assert not venv.exists()
