"""Wall time of the whole GPU health pass on the 8-GPU replica, through the fake NVML.

    .venv/bin/python -m bench.gpu_health_pass [--runs 51]

The seven NVML checks (gpu_count ... gpu_state) read the GPUs once per pass,
in parallel, through the real nvidia-ml-py and the fake libnvidia-ml built
from tests/fake_nvml. Two cases, as the agent and the CLI run them:

- warm: one NVML session kept open between passes (the agent), with the
  previous readings kept for rates;
- cold: a new session per pass, nvmlInit included.

The pass includes reading the GPUs on the PCI bus from sysfs (gpu_count and
gpu_xid join on them) and the kernel log; the NVML read alone has its own row.

Goal: median under 50 ms for the pass. The fake driver answers in
microseconds; on real GPUs NVML's own latency comes on top.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.gpu import GpuHistory, read_gpus
from nodecheck.checks.node.nvml import NvmlSession
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Status
from nodecheck.checks.runner import run_checks
from tests.fake_nvml.build import build_fake_nvml
from tests.fixtures.nodegen import build_node
from tests.fixtures.nodes import dgx_h100
from tests.fixtures.nvml_scenarios import dgx_healthy, write_scenario

GOAL_S = 0.050


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=51)
    runs = parser.parse_args().runs
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="nodecheck-bench-", dir=shm if shm.is_dir() else None))
    try:
        build_node(dgx_h100(), root)
        library = str(build_fake_nvml(root / "fake-nvml"))
        os.environ["FAKE_NVML_SCENARIO"] = str(write_scenario(dgx_healthy(), root / "s.json"))
        fs = NodeFS(sysfs=root / "sys", procfs=root / "proc", rootfs=root)
        checks = [c for name, c in load_checks().items() if name.startswith("gpu_")]
        warm_session = NvmlSession(library_path=library)
        history = GpuHistory()

        def one_pass(session: NvmlSession) -> float:
            context = CheckContext(fs=fs, environ={}, nvml=session, gpu_history=history)
            started = time.perf_counter()
            outcome = run_checks(checks, context)
            elapsed = time.perf_counter() - started
            bad = [r for run in outcome for r in run.results if r.status is not Status.OK]
            if bad:
                raise SystemExit(f"unexpected results on the healthy node: {bad[:3]}")
            return elapsed

        def timed_read(session: NvmlSession) -> float:
            started = time.perf_counter()
            read_gpus(session)
            return time.perf_counter() - started

        def cold_pass() -> float:
            """nvmlInit to nvmlShutdown, as one `nodecheck check` does."""
            session = NvmlSession(library_path=library)
            try:
                return one_pass(session)
            finally:
                session.close()

        one_pass(warm_session)  # imports and first init outside the timings
        cases = {
            "warm session (agent)": [one_pass(warm_session) for _ in range(runs)],
            "new session per pass (CLI)": [cold_pass() for _ in range(runs)],
            "of which: NVML read, 8 GPUs": [timed_read(warm_session) for _ in range(runs)],
        }
        print(f"{len(checks)} GPU checks, 8 GPUs, {runs} runs each")
        print(f"{'case':<30} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'goal ms':>8}  ok")
        for label, timings in cases.items():
            median = statistics.median(timings)
            print(
                f"{label:<30} {median * 1e3:>10.1f} {min(timings) * 1e3:>8.1f} "
                f"{max(timings) * 1e3:>8.1f} {GOAL_S * 1e3:>8.0f}  "
                f"{'yes' if median < GOAL_S else 'NO'}"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
