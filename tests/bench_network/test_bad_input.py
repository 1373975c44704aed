"""What stops `nodecheck bench network`, each within a bound, on every rank, in one line.

Ranks on loopback (no namespace needed): a rendezvous one rank never joins, a payload that
does not fit one node's memory (that node's /proc/meminfo a literal file under
--procfs-root), and a rank killed in the sweep. Each rank exits 2 with one
line on stderr and no traceback, and no node writes a record.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from nodecheck.agent.cli import cli
from tests.fixtures.network_ranks import NODECHECK, rank_env, start, wait_all

pytest.importorskip("torch", reason="torch (the CPU build make test installs)")

# torch's import on a loaded 2-core machine, several ranks at once, and the bound itself.
STARTUP_S = 180.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _argv(state: Path, node: str, *extra: str) -> list[str]:
    (state / node).mkdir(parents=True, exist_ok=True)
    return [
        *NODECHECK, "bench", "network", "--device", "cpu", "--node-name", node,
        "--state-dir", str(state / node), "--idle-window", "0", *extra,
    ]  # fmt: skip


def _one_line_each(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _no_records(state: Path) -> None:
    assert not list(state.rglob("network.json"))


def test_a_rendezvous_that_never_completes(tmp_path: Path) -> None:
    port = _free_port()
    # Three ranks expected, two started: the third never joins.
    processes = [
        start(
            _argv(tmp_path, f"node-{rank}", "--payload-mib", "1", "--rendezvous-timeout", "3"),
            rank_env(rank, 3, "127.0.0.1", port),
        )
        for rank in range(2)
    ]
    began = time.monotonic()
    runs = wait_all(processes, STARTUP_S + 3)
    assert [run.code for run in runs] == [2, 2]
    for rank, run in enumerate(runs):
        line = _one_line_each(run.stderr)
        assert line.startswith(f"nodecheck bench network: node-{rank}: the rendezvous did not "
                               "complete within 3 s (3 ranks expected)"), line  # fmt: skip
        assert not run.stdout
    assert time.monotonic() - began < STARTUP_S + 3
    _no_records(tmp_path)


def test_a_payload_too_large_for_a_nodes_memory(tmp_path: Path) -> None:
    # node-1's memory: a literal meminfo with 1 GiB available; 1024 MiB needs two copies.
    procfs = tmp_path / "proc"
    procfs.mkdir()
    (procfs / "meminfo").write_text(
        "MemTotal:        2097152 kB\nMemFree:         1048576 kB\nMemAvailable:    1048576 kB\n"
    )
    port = _free_port()
    processes = []
    for rank in range(2):
        roots = ["--procfs-root", str(procfs)] if rank == 1 else []
        argv = _argv(tmp_path, f"node-{rank}", "--payload-mib", "1024", *roots)
        processes.append(start(argv, rank_env(rank, 2, "127.0.0.1", port)))
    runs = wait_all(processes, STARTUP_S)
    assert [run.code for run in runs] == [2, 2]
    for rank, run in enumerate(runs):
        assert _one_line_each(run.stderr) == (
            f"nodecheck bench network: node-{rank}: the payload of 1024 MiB does not fit "
            "node-1: 2048 MiB needed, 1024 MiB is its available memory"
        )
    _no_records(tmp_path)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _peers_connected(pid: int, master_port: int) -> int:
    """How many established TCP connections `pid` holds that are not the store's."""
    mine = _socket_inodes(pid)
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            ports = {int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)}
            if inode in mine and state == "01" and master_port not in ports:
                count += 1
    return count


def _child_of(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


# Long enough that the kill lands in the sweep's first round: 5 s a payload and a round.
RUN_LONG = ("--payload-mib", "1", "--duration", "5", "--sweep", "always",
            "--rendezvous-timeout", "30")  # fmt: skip


def test_a_rank_that_dies_mid_sweep(tmp_path: Path) -> None:
    port = _free_port()
    world = 3
    processes = [
        start(
            _argv(tmp_path, f"node-{rank}", *RUN_LONG),
            rank_env(rank, world, "127.0.0.1", port),
        )
        for rank in range(world)
    ]
    # Rank 2's torch child is in the sweep once gloo has connected it for its pair groups
    # too: two peers of the whole job's group, and one in each of the two pair groups it
    # is in (3 nodes: 3 rounds planned, their groups all made as the sweep starts; in
    # round 1 it measures with node-1 while node-0 sits the round out).
    deadline = time.monotonic() + STARTUP_S
    child = None
    while time.monotonic() < deadline:
        child = child or _child_of(processes[2].pid)
        if child is not None and _peers_connected(child, port) >= 2 * (world - 1):
            break
        assert processes[2].poll() is None, processes[2].communicate()
        time.sleep(0.05)
    else:
        pytest.fail("rank 2 never reached the sweep")
    os.kill(child, signal.SIGKILL)
    killed = time.monotonic()
    runs = wait_all(processes, STARTUP_S)
    # The others see the connection go at once (gloo), far within the 30 s timeout.
    assert time.monotonic() - killed < 30
    assert [run.code for run in runs] == [2, 2, 2]
    for rank in (0, 1):
        line = _one_line_each(runs[rank].stderr)
        assert line.startswith(f"nodecheck bench network: node-{rank}: a collective failed"), line
        assert not runs[rank].stdout
    assert _one_line_each(runs[2].stderr).startswith("nodecheck bench network: node-2: ")
    _no_records(tmp_path)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--payload-mib", "0"], "--payload-mib"),
        (["--payload-mib", "99999"], "--payload-mib"),
        (["--duration", "nan"], "--duration"),
        (["--rendezvous-timeout", "0"], "--rendezvous-timeout"),
        (["--sweep", "sometimes"], "--sweep"),
        (["--warn-below", "0.5", "--fail-below", "0.6"], "--fail-below"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], named: str) -> None:
    result = CliRunner().invoke(cli, ["bench", "network", *args])
    assert result.exit_code == 2 and named in result.output, result.output


def test_not_a_rank_is_one_line(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    run = wait_all([start(_argv(tmp_path, "node-0"), env)], STARTUP_S)[0]
    assert run.code == 2
    assert _one_line_each(run.stderr) == (
        "nodecheck bench network: node-0: set MASTER_ADDR and MASTER_PORT, or run under "
        "srun or torchrun"
    )


def test_bench_network_options_after_network_only() -> None:
    result = CliRunner().invoke(cli, ["bench", "--device", "cpu", "network"])
    assert result.exit_code == 2
    assert "network takes its own options after it" in result.output
