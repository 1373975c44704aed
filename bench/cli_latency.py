"""Wall time of `nodecheck --help`, `check --json`, `check --facts` and `tune --format json`
on the 8-GPU replica node.

    .venv/bin/python -m bench.cli_latency [--runs 15] [--baseline REV]

Users install a wheel, so that is what the goals are for: the checkout is built
into a wheel and installed into a temporary virtual environment (no pip, no
editable install; a .pth file there names this environment's site-packages for
the dependencies, and a path in a .pth file does not run that folder's own .pth
files, so the editable install's import hook stays out). Each command is timed
through that environment's console script ("wheel" rows) and, for reference,
through this environment's editable one ("editable" rows), which no user runs:
its import hook (a .pth file) costs a bare interpreter about 12 ms at start-up,
most of it modules a command imports anyway (about 3 ms of `nodecheck --help`).

The runs of every install and command take turns (one run of each, then the next
round), so a machine that slows down for a while (a shared VM's neighbours: on the 2-CPU
VMs used here the same run's median drifts by a fifth within the hour) slows every row
alike. `--baseline REV` also builds the wheel of git revision REV and times it in the
same rounds ("baseline" rows): whether a change made a command slower is read from
those two rows, measured together, never from a table taken at another hour.

Prints a table: median, fastest and slowest of several runs of each, against
the goals, which the wheel rows are held to (`--help` 150 ms, `check --json`
120 ms, `check --facts` 100 ms, `tune` 300 ms). `check` runs every check, the
GPU ones through the fake NVML of tests/fake_nvml; `check --facts` judges a
capture of the same node (taken once with `nodecheck capture`), reading neither
the tree nor NVML; `tune` reads the inventory and the variables of every GPU
process, as an engineer's `nodecheck tune` does before a launch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from tests.fake_nvml.build import build_fake_nvml
from tests.fixtures.nodegen import build_node
from tests.fixtures.nodes import dgx_h100
from tests.fixtures.nvml_scenarios import dgx_healthy, write_scenario


def nodecheck_command() -> str:
    beside = Path(sys.executable).parent / "nodecheck"
    found = str(beside) if beside.exists() else shutil.which("nodecheck")
    if not found:
        sys.exit("nodecheck is not installed (make .venv/bin/.installed)")
    return found


CHECKOUT = Path(__file__).resolve().parent.parent


def install_wheel(dest: Path, checkout: Path = CHECKOUT) -> str:
    """`checkout` built into a wheel and installed into a new virtual environment
    under `dest`, as a user installs it; returns that environment's console script."""
    # A copy of what the wheel is built from (pyproject.toml, the files beside it and
    # the package folders), so setuptools' build/ folder lands in `dest`, not the checkout.
    source = dest / "source"
    source.mkdir(parents=True)
    pyproject = checkout / "pyproject.toml"
    for path in checkout.iterdir():
        if path.is_file():
            shutil.copy2(path, source / path.name)
    folders = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"]
    for folder in sorted(set(folders.values())):
        shutil.copytree(
            checkout / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    venv = dest / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    paths = sysconfig.get_paths()
    dependencies = dict.fromkeys([paths["purelib"], paths["platlib"]])
    Path(site, "nodecheck-dependencies.pth").write_text("".join(f"{p}\n" for p in dependencies))
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    subprocess.run(
        [*pip, "--no-deps", "--no-build-isolation", "--ignore-installed", str(source)], check=True
    )
    return str(venv / "bin" / "nodecheck")


def checkout_of(revision: str, dest: Path) -> Path:
    """The files of git revision `revision` of this checkout, under `dest`."""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(CHECKOUT), "archive", "--format=tar", revision],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        sys.exit(f"git archive {revision}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def time_rounds(
    commands: list[list[str]], runs: int, extra_env: dict[str, str]
) -> list[list[float]]:
    """Each command's wall times, `runs` of each, one run of every command per round."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), "HOME": "/nonexistent", **extra_env}
    for command in commands:  # warm the page cache
        subprocess.run(command, capture_output=True, env=env, check=False)
    timings: list[list[float]] = [[] for _ in commands]
    for _ in range(runs):
        for command, times in zip(commands, timings, strict=True):
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, env=env, check=False)
            times.append(time.perf_counter() - started)
            if done.returncode not in (0, 1):
                sys.exit(f"{' '.join(command)} exited {done.returncode}: {done.stderr.decode()}")
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument(
        "--baseline", metavar="REV", help="also time the wheel of this git revision (main~3)"
    )
    arguments = parser.parse_args()
    runs = arguments.runs
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="nodecheck-bench-", dir=shm if shm.is_dir() else None))
    try:
        build_node(dgx_h100(), root)
        library = build_fake_nvml(root / "fake-nvml")
        scenario = write_scenario(dgx_healthy(), root / "nvml-scenario.json")
        installs = [("wheel", install_wheel(root / "wheel")), ("editable", nodecheck_command())]
        if arguments.baseline:
            base = checkout_of(arguments.baseline, root / "baseline-checkout")
            installs.append(("baseline", install_wheel(root / "baseline", base)))
        roots = [
            "--sysfs-root",
            f"{root}/sys",
            "--procfs-root",
            f"{root}/proc",
            "--rootfs",
            str(root),
            "--nvml-library",
            str(library),
        ]
        # Each install judges a capture it wrote itself: an older one (the baseline) need
        # not read a newer capture's fields.
        for install, nodecheck in installs:
            subprocess.run(
                [nodecheck, *roots, "capture", "-o", str(root / f"capture-{install}.json")],
                env={
                    "PATH": os.environ.get("PATH", "/usr/bin"),
                    "FAKE_NVML_SCENARIO": str(scenario),
                },
                check=True,
                capture_output=True,
            )
        cases = [
            ("nodecheck --help", ["--help"], 0.150),
            ("nodecheck check --json (8-GPU replica)", [*roots, "check", "--json"], 0.120),
            (
                "nodecheck check --facts (its capture)",
                ["check", "--json", "--facts", str(root / "capture-{install}.json")],
                0.100,
            ),
            (
                "nodecheck tune --format json (8-GPU replica)",
                [*roots, "tune", "--format", "json"],
                0.300,
            ),
        ]
        if arguments.baseline:
            print(f"baseline: the wheel of {arguments.baseline}")
        header = ("command", "install", "runs", "median ms", "min ms", "max ms", "goal ms")
        print(
            f"{header[0]:<44} {header[1]:<8} {header[2]:>4} {header[3]:>10} "
            + " ".join(f"{h:>8}" for h in header[4:])
            + "  ok"
        )
        for label, command_arguments, goal in cases:
            rounds = time_rounds(
                [
                    [nodecheck, *(a.replace("{install}", install) for a in command_arguments)]
                    for install, nodecheck in installs
                ],
                runs,
                {"FAKE_NVML_SCENARIO": str(scenario)},
            )
            for (install, _), timings in zip(installs, rounds, strict=True):
                median = statistics.median(timings)
                # The goals are the wheel's; the editable install and the baseline are
                # shown for reference.
                ok = ("yes" if median <= goal else "NO") if install == "wheel" else "-"
                spread = f"{min(timings) * 1e3:>8.1f} {max(timings) * 1e3:>8.1f}"
                print(
                    f"{label:<44} {install:<8} {runs:>4} {median * 1e3:>10.1f} "
                    f"{spread} {goal * 1e3:>8.0f}  {ok}"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
