"""`nodecheck agent` judges the RDMA port counters by their rate across its passes: the
same counters that one reading only exports warn once they rise between two readings."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nodecheck.checks.registry import load_checks
from tests.agent.test_daemon import RunningAgent, free_port, get, wait_for
from tests.conftest import Node
from tests.fixtures.agent_process import start_agent

COUNTERS = "sys/class/infiniband/mlx5_2/ports/1/counters"


def rdma_result(agent: RunningAgent, subject: str) -> dict[str, Any] | None:
    for result in agent.results()["results"]:
        if result["check"] == "rdma_ports" and result["subject"] == subject:
            found: dict[str, Any] = result
            return found
    return None


def test_the_agent_warns_on_rising_port_counters(
    dgx: Node, copy_node: Callable[[Node], Node], tmp_path: Path
) -> None:
    node = copy_node(dgx)
    port = free_port()
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    (tmp_path / "state").mkdir()  # a state directory it is given must exist
    others = "".join(
        f"\n[checks.{name}]\nenabled = false\n" for name in load_checks() if name != "rdma_ports"
    )
    config = tmp_path / "config.toml"
    config.write_text(
        f'[agent]\nlisten = "127.0.0.1:{port}"\ntextfile_dir = "{textfile}"\n'
        f'state_dir = "{tmp_path / "state"}"\n\n[checks.rdma_ports]\ninterval = 1\n'
        f"{others}\n[benchmarks]\nenabled = false\n"
    )
    log = tmp_path / "agent.log"
    process = start_agent(node.cli_args, config, {**node.env, "PATH": "/usr/bin:/bin"}, log)
    agent = RunningAgent(process, port, config, textfile)
    try:

        def serving() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return get(f"{agent.url}/healthz")[0] == 200
            except OSError:
                return False

        wait_for(serving, 60, "the agent to serve")
        first = wait_for(lambda: rdma_result(agent, "rdma mlx5_2/1"), 60, "a first reading")
        assert first["status"] == "ok"
        metrics = agent.metrics()
        assert 'nodecheck_rdma_port_symbol_errors_total{device="mlx5_2"' in metrics
        errors = node.root / COUNTERS / "symbol_error"

        def warned() -> dict[str, Any] | None:
            # Errors keep coming: each pass sees a higher count than the one before, so a
            # loaded machine polling late still finds the warning (symbol_error saturates
            # only at 65535, far beyond what this loop writes in its minute).
            errors.write_text(f"{int(errors.read_text()) + 1}\n")
            result = rdma_result(agent, "rdma mlx5_2/1")
            return result if result and result["status"] == "warn" else None

        result = wait_for(warned, 60, "the errors to be judged")
        assert "symbol errors" in result["summary"] and "per minute" in result["summary"]
        exported = re.compile(
            r'nodecheck_rdma_port_symbol_errors_total\{device="mlx5_2",[^}]*\} ([0-9.]+)'
        )

        def counted() -> bool:
            match = exported.search(agent.metrics())
            return match is not None and float(match.group(1)) > 0

        wait_for(counted, 30, "the errors exported")
    finally:
        process.kill()
        process.wait()
