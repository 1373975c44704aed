"""The test cluster itself: it comes up, runs a job, drains and returns a node, and
applies settings; and the parsers of what scontrol and sinfo print."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.fixtures.slurm_cluster import (
    SlurmCluster,
    missing_reason,
    parse_drain_reasons,
    parse_node,
    start_cluster,
)

# Slurm 22.05.8's `scontrol show node vm`, as seen here (abridged to the lines used;
# scontrol ends some lines with a space).
IDLE = "\n".join(
    [
        "NodeName=vm Arch=x86_64 CoresPerSocket=1 ",
        "   CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.55",
        "   NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8",
        "   State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A",
        "   Partitions=debug ",
        "",
    ]
)
DRAINED = "\n".join(
    [
        "NodeName=vm Arch=x86_64 CoresPerSocket=1 ",
        "   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A",
        "   Partitions=debug ",
        "   Reason=nodecheck: xid gpu0: Xid 79 [slurm=x] [root@2026-12-01T15:52:43]",
        "",
    ]
)
DOWN = "\n".join(
    [
        "NodeName=gpu-7 Arch=x86_64 CoresPerSocket=1 ",
        "   State=DOWN*+DRAIN+NOT_RESPONDING ThreadsPerCore=1",
        "   Reason=Not responding [slurm@2026-11-30T01:02:03]",
        "",
    ]
)


def test_parse_idle_node() -> None:
    state = parse_node(IDLE)
    assert (state.name, state.state, state.flags) == ("vm", "IDLE", frozenset())
    assert state.idle and not state.drained
    assert state.reason is None and state.reason_user is None


def test_parse_drained_node_keeps_the_whole_reason() -> None:
    state = parse_node(DRAINED)
    assert state.drained and not state.idle
    assert state.reason == "nodecheck: xid gpu0: Xid 79 [slurm=x]"
    assert (state.reason_user, state.reason_time) == ("root", "2026-12-01T15:52:43")


def test_parse_down_node() -> None:
    state = parse_node(DOWN)
    assert state.state == "DOWN" and state.flags == {"DRAIN", "NOT_RESPONDING"}
    assert state.reason == "Not responding" and state.reason_user == "slurm"


def test_parse_refuses_other_output() -> None:
    try:
        parse_node("Node vm not found\n")
    except ValueError:
        return
    raise AssertionError("parsed something that is not scontrol's node output")


def test_parse_drain_reasons() -> None:
    assert parse_drain_reasons("vm|nodecheck: a | b\ngpu-7|Not responding\n") == {
        "vm": "nodecheck: a | b",
        "gpu-7": "Not responding",
    }


def test_cluster_comes_up_and_runs_a_job(slurm_cluster: SlurmCluster) -> None:
    listed = slurm_cluster.run("sinfo", "-h", "-N", "-n", slurm_cluster.node, "-o", "%N %T").stdout
    assert listed.split() == [slurm_cluster.node, "idle"]
    ran = slurm_cluster.run("srun", "-N1", "hostname", timeout=120)
    assert ran.stdout.strip() == socket.gethostname()


def test_drain_shows_its_reason_and_undrain_or_resume_returns_the_node(
    slurm_cluster: SlurmCluster,
) -> None:
    node = slurm_cluster.node
    for returning in ("UNDRAIN", "RESUME"):
        reason = f"nodecheck: harness drain before {returning}"
        slurm_cluster.run(
            "scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"
        )
        state = slurm_cluster.wait_for(
            lambda: s if (s := slurm_cluster.node_state()).drained else None, 60, "the drain"
        )
        assert state.reason == reason and state.reason_user == "root"
        assert slurm_cluster.drain_reasons() == {node: reason}
        slurm_cluster.run("scontrol", "update", f"NodeName={node}", f"State={returning}")
        back = slurm_cluster.wait_idle()
        assert back.reason is None
        assert slurm_cluster.drain_reasons() == {}


def test_reconfigure_reaches_slurmd(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A HealthCheckProgram set by `reconfigure` runs on the node; `program` gives it the
    cluster's Slurm (slurmd itself passes SLURMD_NODENAME alone)."""
    tmp_path.chmod(0o755)
    marker = tmp_path / "ran"
    script = (
        f'scontrol show node "$SLURMD_NODENAME" > {marker}.new '
        f'&& echo "$MARKED" >> {marker}.new && mv {marker}.new {marker}'
    )
    program = slurm_cluster.program("health-check", "/bin/sh", "-c", script, env={"MARKED": "a b"})
    slurm_cluster.reconfigure(HealthCheckProgram=str(program), HealthCheckInterval=2)
    slurm_cluster.wait_for(marker.exists, 120, "the health-check program to run")
    shown = marker.read_text()
    assert parse_node(shown).name == slurm_cluster.node
    assert shown.splitlines()[-1] == "a b"
    slurm_cluster.reset()
    assert slurm_cluster.config()["HealthCheckProgram"] == "(null)"


def test_missing_binaries_skip_naming_the_install_step(tmp_path: Path) -> None:
    reason = missing_reason(path=str(tmp_path))
    assert reason is not None and "slurmctld" in reason and "munged" in reason
    assert "make test" in reason and "apt-get install slurmctld slurmd slurm-client munge" in reason


def test_stop_ends_every_daemon_and_removes_the_folder() -> None:
    why = missing_reason()
    if why is not None:
        pytest.skip(why)
    cluster = start_cluster()
    try:
        assert cluster.node_state().idle
        ran = cluster.run("srun", "-N1", "hostname", timeout=120)
        assert ran.stdout.strip() == socket.gethostname()
    finally:
        cluster.stop()
    assert set(cluster.pids) == {"munged", "slurmctld", "slurmd"}
    for name, pid in cluster.pids.items():
        # Reaped by stop(): the id names no process (or, reused, not this daemon).
        comm = Path(f"/proc/{pid}/comm")
        assert not comm.exists() or comm.read_text().strip() not in (name, "runuser"), name
    assert not cluster.folder.exists()
