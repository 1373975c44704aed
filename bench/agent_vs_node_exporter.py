"""The agent's /metrics against node_exporter's, under load and at rest, on this machine.

    .venv/bin/python -m bench.agent_vs_node_exporter [--seconds 10] [--idle 60]

Starts `nodecheck agent` on the 8-GPU replica with the fake NVML (so /metrics
carries a real node's worth of series) and Debian's prometheus-node-exporter,
each on loopback; loads each with wrk, 8 connections for 10 s; then leaves the
agent idle for a minute and reads its CPU time and RSS from /proc.

Goals: throughput at least 10x node_exporter's (with the server's
request deadlines and bounds in place), p99 no worse, RSS under 45 MB, idle CPU
under 0.5 % of a core. Prints the ratios. Needs wrk and
prometheus-node-exporter (apt-get install wrk prometheus-node-exporter).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.fake_nvml.build import build_fake_nvml
from tests.fixtures.nodegen import build_node
from tests.fixtures.nodes import dgx_h100
from tests.fixtures.nvml_scenarios import dgx_healthy, write_scenario

TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_serving(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{process.args!r} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} never answered")


def wrk(url: str, seconds: int) -> tuple[float, float]:
    """Requests per second and p99 latency in ms (wrk --latency, 8 connections, 1 thread)."""
    done = subprocess.run(
        ["wrk", "-t1", "-c8", f"-d{seconds}s", "--latency", url],
        capture_output=True,
        text=True,
        check=True,
    )
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", done.stdout).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"99%\s+([\d.]+)(us|ms|s)", done.stdout).groups()  # type: ignore[union-attr]
    p99 = float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    return rate, p99


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--idle", type=int, default=60)
    args = parser.parse_args()
    for tool in ("wrk", "prometheus-node-exporter"):
        if shutil.which(tool) is None:
            raise SystemExit(
                f"{tool} is not installed (apt-get install wrk prometheus-node-exporter)"
            )
    work = Path(tempfile.mkdtemp(prefix="nodecheck-bench-", dir="/dev/shm"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        root = build_node(dgx_h100(), work / "node")
        library = build_fake_nvml(work / "fake-nvml")
        scenario = write_scenario(dgx_healthy(), work / "scenario.json")
        agent_port, exporter_port = free_port(), free_port()
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nodecheck.agent",
                "--sysfs-root",
                str(root / "sys"),
                "--procfs-root",
                str(root / "proc"),
                "--rootfs",
                str(root),
                "--nvml-library",
                str(library),
                "agent",
                "--config",
                str(work / "none.toml"),
                "--listen",
                f"127.0.0.1:{agent_port}",
            ],
            env={**os.environ, "FAKE_NVML_SCENARIO": str(scenario)},
            stderr=subprocess.DEVNULL,
        )
        (work / "none.toml").write_text("")
        processes.append(agent)
        exporter = subprocess.Popen(
            ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{exporter_port}"],
            stderr=subprocess.DEVNULL,
        )
        processes.append(exporter)
        agent_url = f"http://127.0.0.1:{agent_port}/metrics"
        exporter_url = f"http://127.0.0.1:{exporter_port}/metrics"
        wait_until_serving(agent_url, agent)
        wait_until_serving(exporter_url, exporter)
        time.sleep(3)  # every check has run once
        with urllib.request.urlopen(agent_url) as response:
            series = sum(1 for line in response.read().decode().splitlines() if line[:1] != "#")
        agent_rate, agent_p99 = wrk(agent_url, args.seconds)
        exporter_rate, exporter_p99 = wrk(exporter_url, args.seconds)
        time.sleep(2)
        before, started = cpu_seconds(agent.pid), time.monotonic()
        time.sleep(args.idle)
        idle_cpu = (cpu_seconds(agent.pid) - before) / (time.monotonic() - started)
        rss = rss_bytes(agent.pid)
        print(f"agent /metrics: {series} series; wrk 1 thread, 8 connections, {args.seconds} s")
        print(f"{'measure':<34} {'agent':>10} {'node_exporter':>14} {'ratio':>7}  goal")
        print(
            f"{'requests per second':<34} {agent_rate:>10.0f} {exporter_rate:>14.0f} "
            f"{agent_rate / exporter_rate:>7.2f}  >= 10"
        )
        print(
            f"{'p99 latency, ms':<34} {agent_p99:>10.2f} {exporter_p99:>14.2f} "
            f"{agent_p99 / exporter_p99:>7.2f}  <= 1"
        )
        print(
            f"{'RSS, MB (after the load)':<34} {rss / 1e6:>10.1f} {'':>14} "
            f"{rss / 45e6:>7.2f}  <= 1 (45 MB)"
        )
        print(
            f"{f'idle CPU, % of a core ({args.idle} s)':<34} {idle_cpu * 100:>10.2f} {'':>14} "
            f"{idle_cpu * 100 / 0.5:>7.2f}  <= 1 (0.5 %)"
        )
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
