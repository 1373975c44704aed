"""CPU time of the agent's Kubernetes reporter thread while it has nothing to send,
against the API double of tests/fixtures/kube_api.py.

    .venv/bin/python -m bench.kube_reporter_idle [--seconds 5]

Prints a table: the reporter thread's CPU seconds (user + system, from
/proc/self/task/TID/stat) over a few seconds in each phase, against the goal that it
sleeps when it has nothing to do (a busy loop on a zero timeout uses the whole phase;
the goal is a tenth of it):
- before the first results (it must wait for them, not poll);
- steady, healthy, with a 1 s heartbeat;
- with the API server hung (every call times out, 0.5 s): it backs off.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from nodecheck.agent.config import KubernetesSettings
from nodecheck.agent.findings import findings_of_named
from nodecheck.agent.kubernetes.reporter import KubernetesReporter
from nodecheck.checks.result import Result, Status
from tests.fixtures.kube_api import KubeApiDouble

RBAC = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "rbac.yaml"
GOAL_SHARE = 0.1


def reporter_cpu(reporter: KubernetesReporter) -> float:
    """The thread's utime + stime (proc(5): fields 14 and 15, in clock ticks)."""
    thread = reporter._thread
    assert thread is not None and thread.native_id is not None
    stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    seconds = parser.parse_args().seconds
    work = Path(tempfile.mkdtemp(prefix="nodecheck-kube-bench-"))
    api = KubeApiDouble(RBAC, work)
    api.start()
    api.add_node("n1")
    (work / "token").write_text("token-1\n")
    settings = KubernetesSettings(
        enabled=True,
        taint=True,
        node_name="n1",
        api_server=api.url,
        token_file=work / "token",
        ca_file=api.cert,
        resend_interval_s=1.0,
        timeout_s=0.5,
        token_reread_s=1.0,
    )
    reporter = KubernetesReporter.from_settings(settings, {})
    reporter.start()
    healthy = [("gpu_count", findings_of_named("gpu_count", [Result(Status.OK, "node", "8 GPUs")]))]
    rows = []

    def phase(name: str) -> None:
        start = reporter_cpu(reporter)
        time.sleep(seconds)
        rows.append((name, reporter_cpu(reporter) - start))

    try:
        phase("before the first results")
        reporter.update(healthy)
        phase("healthy, 1 s heartbeat")
        with api.hung():
            reporter.update(healthy)
            phase("API server hung")
    finally:
        reporter.stop()
        api.stop()
    goal = GOAL_SHARE * seconds
    print(f"{'phase':<28} {'cpu s':>7} {'goal s':>7}  verdict")
    for name, used in rows:
        print(f"{name:<28} {used:>7.3f} {goal:>7.2f}  {'ok' if used <= goal else 'OVER'}")


if __name__ == "__main__":
    main()
