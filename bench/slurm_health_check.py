"""Wall time of `nodecheck slurm health-check` on the 8-GPU replica node: judging the
agent's fresh results, and running the quick checks itself (no results file).

    .venv/bin/python -m bench.slurm_health_check [--runs 10]

Prints a table: median, fastest and slowest of several runs of the installed console
script, against the goals (under 0.3 s from fresh results, under 10 s when it
runs the checks). Without Slurm, health-check is pointed at a stand-in `scontrol` on
PATH that answers `show node` from a file (an idle node) and records any `update`; the
GPU checks run through the fake NVML of tests/fake_nvml. The fresh results are written
before each run as the agent writes them: the replica's own check results.
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

from bench.cli_latency import nodecheck_command
from nodecheck.agent.daemon.results_file import stored_document
from nodecheck.agent.findings import StoredRun
from nodecheck.checks.config import DEFAULT_NVML_TIMEOUT_S
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.nvml import NvmlSession
from nodecheck.checks.registry import load_checks
from nodecheck.checks.runner import run_checks
from tests.fake_nvml.build import build_fake_nvml
from tests.fixtures.nodegen import build_node
from tests.fixtures.nodes import dgx_h100
from tests.fixtures.nvml_scenarios import dgx_healthy, write_scenario

IDLE_NODE = """\
NodeName=gpu01 Arch=x86_64 CoresPerSocket=56
   State=IDLE ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug
"""

STAND_IN = """#!/bin/sh
# scontrol without Slurm: `show node` from a file, every other call recorded.
here=$(dirname "$0")
case "$1" in
  show) cat "$here/node.txt" ;;
  *) echo "$@" >> "$here/calls.log" ;;
esac
"""


def agent_results(root: Path, library: Path, scenario: Path) -> list[StoredRun]:
    """The replica's check results, as the agent stores them."""
    os.environ["FAKE_NVML_SCENARIO"] = str(scenario)
    fs = NodeFS(sysfs=root / "sys", procfs=root / "proc", rootfs=root)
    nvml = NvmlSession(deadline_s=DEFAULT_NVML_TIMEOUT_S, library_path=str(library))
    runs = run_checks(list(load_checks().values()), CheckContext(fs=fs, nvml=nvml))
    nvml.close()
    now = time.time()
    return [StoredRun(run, now, run.check.interval_s) for run in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="nodecheck-bench-", dir=shm if shm.is_dir() else None))
    try:
        node = root / "node"
        build_node(dgx_h100(), node)
        library = build_fake_nvml(root / "fake-nvml")
        scenario = write_scenario(dgx_healthy(), root / "nvml-scenario.json")
        slurm = root / "slurm"
        slurm.mkdir()
        (slurm / "node.txt").write_text(IDLE_NODE)
        (slurm / "scontrol").write_text(STAND_IN)
        (slurm / "scontrol").chmod(0o755)
        stored = agent_results(node, library, scenario)
        results = root / "results.json"
        config = root / "config.toml"
        (root / "state").mkdir()  # a state directory it is given must exist
        config.write_text(f'[agent]\nstate_dir = "{root / "state"}"\nresults_file = "{results}"\n')
        command = [
            nodecheck_command(),
            "--sysfs-root",
            f"{node}/sys",
            "--procfs-root",
            f"{node}/proc",
            "--rootfs",
            str(node),
            "--nvml-library",
            str(library),
            "slurm",
            "health-check",
            "--config",
            str(config),
            "--node",
            "gpu01",
        ]
        env = {
            "PATH": f"{slurm}:{os.environ.get('PATH', '/usr/bin')}",
            "HOME": "/nonexistent",
            "FAKE_NVML_SCENARIO": str(scenario),
        }

        def fresh() -> None:
            results.write_text(stored_document("gpu01", stored))

        def missing() -> None:
            results.unlink(missing_ok=True)

        cases = [
            ("slurm health-check, fresh agent results", fresh, "agent results", 0.3),
            ("slurm health-check, runs the checks itself", missing, "own run", 10.0),
        ]
        header = ("case", "runs", "median ms", "min ms", "max ms", "goal ms")
        print(
            f"{header[0]:<44} {header[1]:>4} {header[2]:>10} "
            + " ".join(f"{h:>8}" for h in header[3:])
            + "  ok"
        )
        for label, prepare, source, goal in cases:
            timings = []
            for _ in range(runs + 1):  # the first warms the page cache
                prepare()
                started = time.perf_counter()
                done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
                timings.append(time.perf_counter() - started)
                if done.returncode != 0 or f"source='{source}" not in done.stderr:
                    sys.exit(f"{label}: exited {done.returncode}: {done.stderr}")
            timings = timings[1:]
            median = statistics.median(timings)
            print(
                f"{label:<44} {runs:>4} {median * 1e3:>10.1f} {min(timings) * 1e3:>8.1f} "
                f"{max(timings) * 1e3:>8.1f} {goal * 1e3:>8.0f}  {'yes' if median < goal else 'NO'}"
            )
        if (slurm / "calls.log").exists():
            sys.exit(f"the healthy replica was acted on: {(slurm / 'calls.log').read_text()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
