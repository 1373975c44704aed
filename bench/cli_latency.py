"""Wall time of `nodecheck --help`, `check --json`, `check --facts` and `tune --format json`
on the 8-GPU replica node.

    .venv/bin/python -m bench.cli_latency [--runs 15]

Prints a table: median, fastest and slowest of several runs of the installed
console script, against the goals (`--help` and `check --json`
150 ms, `check --facts` 100 ms, `tune` 300 ms). `check` runs every check, the GPU ones
through the fake NVML of tests/fake_nvml; `check --facts` judges a capture of the same
node (taken once with `nodecheck capture`), reading neither the tree nor NVML; `tune`
reads the inventory and the variables of every GPU process, as an engineer's
`nodecheck tune` does before a launch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def time_runs(command: list[str], runs: int, extra_env: dict[str, str]) -> list[float]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), "HOME": "/nonexistent", **extra_env}
    subprocess.run(command, capture_output=True, env=env, check=False)  # warm the page cache
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, env=env, check=False)
        timings.append(time.perf_counter() - started)
        if done.returncode not in (0, 1):
            sys.exit(f"{' '.join(command)} exited {done.returncode}: {done.stderr.decode()}")
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="nodecheck-bench-", dir=shm if shm.is_dir() else None))
    try:
        build_node(dgx_h100(), root)
        library = build_fake_nvml(root / "fake-nvml")
        scenario = write_scenario(dgx_healthy(), root / "nvml-scenario.json")
        nodecheck = nodecheck_command()
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
        capture = root / "capture.json"
        subprocess.run(
            [nodecheck, *roots, "capture", "-o", str(capture)],
            env={"PATH": os.environ.get("PATH", "/usr/bin"), "FAKE_NVML_SCENARIO": str(scenario)},
            check=True,
            capture_output=True,
        )
        cases = [
            ("nodecheck --help", [nodecheck, "--help"], 0.150),
            (
                "nodecheck check --json (8-GPU replica)",
                [nodecheck, *roots, "check", "--json"],
                0.150,
            ),
            (
                "nodecheck check --facts (its capture)",
                [nodecheck, "check", "--json", "--facts", str(capture)],
                0.100,
            ),
            (
                "nodecheck tune --format json (8-GPU replica)",
                [nodecheck, *roots, "tune", "--format", "json"],
                0.300,
            ),
        ]
        header = ("command", "runs", "median ms", "min ms", "max ms", "goal ms")
        print(
            f"{header[0]:<44} {header[1]:>4} {header[2]:>10} "
            + " ".join(f"{h:>8}" for h in header[3:])
            + "  ok"
        )
        for label, command, goal in cases:
            timings = time_runs(command, runs, {"FAKE_NVML_SCENARIO": str(scenario)})
            median = statistics.median(timings)
            print(
                f"{label:<44} {runs:>4} {median * 1e3:>10.1f} {min(timings) * 1e3:>8.1f} "
                f"{max(timings) * 1e3:>8.1f} {goal * 1e3:>8.0f}  {'yes' if median < goal else 'NO'}"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
