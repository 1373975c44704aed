"""The sweep's wall time on 8 simulated nodes, against one whole-job all_reduce of the same
payload.

    sudo .venv/bin/python -m bench.network_sweep [--payload-mib 1] [--duration 0.5]

8 network namespaces on a bridge (tests/fixtures/netns.py), one `nodecheck bench network
--device cpu` rank in each (gloo over their veths), run twice per case: healthy, and with
one node's veth held to 50 Mbit/s by tbf. Each run reports, from rank 0's report, the
whole-job all_reduce's wall time (warm-up and timed iterations) and the sweep's (its pair
groups created, then its rounds), and the rounds it took: the sweep's overhead is its wall
time over the whole job's. Every measurement runs for `--duration` (as the node
benchmarks, time-bounded), so a sweep takes about its rounds times that, plus its pair
groups' creation and each round's gathering: the rows say how much those add, and how
many rounds each case took. Needs root and iproute2.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tests.fixtures.netns import INSIDE, SimulatedNodes, unavailable
from tests.fixtures.network_ranks import NODECHECK, rank_env, start, wait_all

NODES = 8
PORT = 29500
SLOW_RATE = "50mbit"


def one_run(nodes: SimulatedNodes, payload_mib: int, duration: float) -> dict:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory(prefix="nodecheck-sweep-bench-") as directory:
        return _run_in(nodes, payload_mib, duration, Path(directory))


def _run_in(nodes: SimulatedNodes, payload_mib: int, duration: float, state: Path) -> dict:  # type: ignore[type-arg]
    processes = []
    for index in range(NODES):
        (state / str(index)).mkdir()
        argv = [
            *NODECHECK, "bench", "network", "--device", "cpu", "--payload-mib",
            str(payload_mib), "--duration", str(duration), "--sweep", "always", "--json",
            "--warn-below", "0.1", "--fail-below", "0.05", "--idle-window", "0",
            "--node-name", f"node-{index}", "--state-dir", str(state / str(index)),
        ]  # fmt: skip
        env = rank_env(index, NODES, nodes.address(0), PORT, GLOO_SOCKET_IFNAME=INSIDE)
        processes.append(start(nodes.command(index, argv, env)))
    runs = wait_all(processes, 600)
    if runs[0].stdout == "":
        raise SystemExit(f"rank 0 reported nothing: {runs[0].stderr.strip()}")
    report: dict = json.loads(runs[0].stdout)  # type: ignore[type-arg]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--payload-mib", type=int, default=1)
    parser.add_argument("--duration", type=float, default=0.5)
    args = parser.parse_args()
    reason = unavailable()
    if reason is not None:
        raise SystemExit(f"cannot run: {reason}")
    nodes = SimulatedNodes(NODES)
    rows = []
    try:
        nodes.create()
        for case in ("healthy", f"node-5 at {SLOW_RATE}"):
            nodes.clear()
            if case != "healthy":
                nodes.slow_node(5, SLOW_RATE)
            report = one_run(nodes, args.payload_mib, args.duration)
            whole = report["payloads"][-1]["wall_s"]
            sweep = report["sweep"]
            named = [row["node"] for row in report["results"] if row["culprit"] != "none"]
            rows.append((case, whole, sweep["wall_s"], sweep["rounds_run"], named))
    finally:
        nodes.remove()
    print(
        f"{NODES} simulated nodes, {args.payload_mib} MiB per rank, gloo over veth, "
        f"--duration {args.duration} s per measurement"
    )
    print(f"{'case':<22} {'whole job s':>11} {'sweep s':>8} {'rounds':>6} {'overhead':>8}  named")
    for case, whole, sweep_s, rounds, named in rows:
        print(
            f"{case:<22} {whole:>11.2f} {sweep_s:>8.2f} {rounds:>6} {sweep_s / whole:>7.1f}x  "
            f"{', '.join(named) or '-'}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
