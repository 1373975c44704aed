"""nodecheck's Slurm hooks on a real one-node cluster (tests/fixtures/slurm_cluster.py):
the health check drains a faulty node with its reason and returns it once healthy for
the hysteresis; an admin's drain is never touched; a failing or hanging scontrol
changes nothing; the task prolog's environment reaches the task; a prolog failure
drains the node and requeues the job.

The node is this machine; what nodecheck judges is a replica tree with the fake NVML
(tests/conftest.py's nodes), given to each hook through its wrapper program."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from nodecheck.agent.breaker import SLURM_WITHHELD_FILE, read_withheld
from tests.agent.test_slurm_task import hostile_job, installed_hook
from tests.conftest import Node
from tests.fixtures import nodes
from tests.fixtures.nodegen import build_node
from tests.fixtures.nvml_scenarios import dgx_healthy, write_scenario
from tests.fixtures.slurm_cluster import NodeState, SlurmCluster

NODECHECK = str(Path(sys.executable).parent / "nodecheck")


def _config(folder: Path, remediation: str = "", **slurm: int | str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    (folder / "state").mkdir(exist_ok=True)  # a state directory it is given must exist
    path = folder / "config.toml"
    lines = [
        "[agent]",
        f'state_dir = "{folder / "state"}"',
        'results_file = ""',  # no agent here: health-check runs the quick checks itself
        'listen = ""',
        "",
        "[slurm]",
        *(f"{key} = {value}" for key, value in slurm.items()),
        "",
        "[remediation]",
        remediation,
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _health_check(
    cluster: SlurmCluster,
    node: Node,
    folder: Path,
    *extra: str,
    name: str = "health-check",
    remediation: str = "",
    **slurm: int | str,
) -> tuple[Path, Path]:
    """A HealthCheckProgram judging `node`, counting its runs in a file (one line each,
    its exit status) and keeping its log lines in `folder`/log."""
    config = _config(folder, remediation, **slurm)
    runs = folder / f"{name}.runs"  # each program its own count; the state is shared
    command = " ".join(
        [NODECHECK, *node.cli_args, "slurm", "health-check", "--config", str(config), *extra]
    )
    log = folder / "log"
    script = f'{command} 2>>{log}; status=$?; echo "$status" >> {runs}; exit "$status"'
    return cluster.program(name, "/bin/sh", "-c", script, env=node.env), runs


def _runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _wait_runs(cluster: SlurmCluster, runs: Path, count: int) -> None:
    cluster.wait_for(lambda: _runs(runs) >= count, 180, f"{count} health-check runs")


def test_a_faulty_node_is_drained_and_returns_after_the_hysteresis(
    slurm_cluster: SlurmCluster,
    dgx_faulty: Node,
    dgx: Node,
    tmp_path: Path,
) -> None:
    program, _ = _health_check(slurm_cluster, dgx_faulty, tmp_path, undrain_after_runs=2)
    slurm_cluster.reconfigure(HealthCheckProgram=str(program), HealthCheckInterval=2)
    drained = slurm_cluster.wait_for(
        lambda: s if (s := slurm_cluster.node_state()).drained else None, 180, "the drain"
    )
    assert drained.reason is not None and drained.reason.startswith("nodecheck: ")
    assert slurm_cluster.drain_reasons()[slurm_cluster.node] == drained.reason
    # The fault clears (the healthy twin): two healthy runs in a row, then UNDRAIN.
    healthy, runs = _health_check(
        slurm_cluster, dgx, tmp_path, name="health-check-healthy", undrain_after_runs=2
    )
    slurm_cluster.reconfigure(HealthCheckProgram=str(healthy))
    back = slurm_cluster.wait_idle(180)
    assert back.reason is None and _runs(runs) >= 2
    # The first healthy run kept it out (the log says so: a second run may follow within
    # the interval, before a test could look at the node).
    assert "healthy 1 of 2 runs in a row" in (tmp_path / "log").read_text()


def test_the_nodes_configuration_and_a_jobs_variable_drain_nothing(
    slurm_cluster: SlurmCluster, fake_nvml_library: Path, tmp_path: Path
) -> None:
    """ACS on in two switch ports and a job's NCCL_P2P_DISABLE=1, no hardware fault: runs
    after runs exit 1 (reported) and the node stays in service, the log line naming
    why."""
    root = build_node(nodes.dgx_h100(misconfigured=True), tmp_path / "node")
    node = Node(root, fake_nvml_library, write_scenario(dgx_healthy(), root / "scenario.json"))
    program, runs = _health_check(slurm_cluster, node, tmp_path / "hc")
    slurm_cluster.reconfigure(HealthCheckProgram=str(program), HealthCheckInterval=2)
    _wait_runs(slurm_cluster, runs, 3)
    assert not slurm_cluster.node_state().drained
    assert set(runs.read_text().split()) == {"1"}
    log = (tmp_path / "hc" / "log").read_text()
    assert "do not take the node out of service (a job's setting, node-config: reported)" in log
    assert "action=nothing" in log and "action=drain" not in log


def test_a_failing_node_slurm_set_down_stays_out_when_slurmd_registers(
    slurm_cluster: SlurmCluster, dgx_faulty: Node, tmp_path: Path
) -> None:
    """The node DOWN as slurmctld marks one that stopped answering: the health check
    drains it (DRAIN holds on a DOWN node); slurmd registering again (ReturnToService=2
    would make it IDLE) leaves it drained with nodecheck's reason."""
    node = slurm_cluster.node
    slurm_cluster.run(
        "scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=Not responding"
    )
    program, _ = _health_check(slurm_cluster, dgx_faulty, tmp_path)
    # slurm.conf's default HealthCheckNodeState=ANY runs it on a DOWN node too.
    slurm_cluster.reconfigure(HealthCheckProgram=str(program), HealthCheckInterval=2)

    def drained_down() -> NodeState | None:
        state = slurm_cluster.node_state()
        return state if state.drained and (state.reason or "").startswith("nodecheck:") else None

    slurm_cluster.wait_for(drained_down, 180, "the drain of the DOWN node")
    # slurmd registers again on a reconfigure: ReturnToService=2 lifts DOWN, not DRAIN.
    slurm_cluster.reconfigure(HealthCheckProgram=None)
    back = slurm_cluster.wait_for(
        lambda: s if (s := slurm_cluster.node_state()).state != "DOWN" else None,
        180,
        "the registration",
    )
    assert back.drained and (back.reason or "").startswith("nodecheck: "), back


def test_a_node_rebooted_for_a_fault_stays_out_until_the_healthy_runs(
    slurm_cluster: SlurmCluster, dgx_faulty: Node, dgx: Node, tmp_path: Path
) -> None:
    """reboot_on_xid on a GPU fallen off the bus: nodecheck drains and asks Slurm for a
    reboot, which slurmctld issues through RebootProgram (a stand-in that writes a file;
    slurmd is then restarted as after a boot). Registered again, the node is still
    drained with nodecheck's reason; still faulty, it stays out and is not rebooted
    again; healthy, it returns after the healthy runs."""
    marker = tmp_path / "rebooted"
    reboot = slurm_cluster.program("reboot", "/bin/sh", "-c", f"echo rebooted >> {marker}")
    program, runs = _health_check(
        slurm_cluster, dgx_faulty, tmp_path, reboot_on_xid="true", undrain_after_runs=2
    )
    slurm_cluster.reconfigure(
        HealthCheckProgram=str(program),
        HealthCheckInterval=2,
        RebootProgram=str(reboot),
        ResumeTimeout=600,  # a reboot not back within it is DOWN: generous, for a loaded CI
    )
    try:
        _rebooted_and_back(slurm_cluster, marker, runs, dgx, tmp_path)
    finally:
        slurm_cluster.restart_slurmd()  # without the shim: the machine's own uptime again


def _rebooted_and_back(
    slurm_cluster: SlurmCluster, marker: Path, runs: Path, dgx: Node, tmp_path: Path
) -> None:
    slurm_cluster.reboot_when_asked(marker)

    def registered() -> NodeState | None:
        state = slurm_cluster.node_state()
        rebooting = {"REBOOT_REQUESTED", "REBOOT_ISSUED"} & state.flags
        return state if state.state != "DOWN" and not rebooting else None

    back = slurm_cluster.wait_for(registered, 180, "the registration after the reboot")
    assert back.drained, back
    assert (back.reason or "").startswith("nodecheck: gpu_count "), back
    assert (back.reason or "").endswith(" : reboot issued"), back
    seen = _runs(runs)
    _wait_runs(slurm_cluster, runs, seen + 2)  # still faulty: out, and no second reboot
    still = slurm_cluster.node_state()
    assert still.drained and not {"REBOOT_REQUESTED", "REBOOT_ISSUED"} & still.flags, still
    assert marker.read_text().splitlines() == ["rebooted"]
    healthy, _ = _health_check(
        slurm_cluster, dgx, tmp_path, name="health-check-healthy", undrain_after_runs=2
    )
    slurm_cluster.reconfigure(HealthCheckProgram=str(healthy))
    assert slurm_cluster.wait_idle(180).reason is None
    # The first healthy run kept it out (read from the log: a second run may follow
    # within the interval, before a test could look at the node).
    assert "healthy 1 of 2 runs in a row" in (tmp_path / "log").read_text()


def test_a_dry_run_drains_nothing_and_says_the_command(
    slurm_cluster: SlurmCluster, dgx_faulty: Node, tmp_path: Path
) -> None:
    program, runs = _health_check(
        slurm_cluster, dgx_faulty, tmp_path / "hc", remediation="dry_run = true"
    )
    slurm_cluster.reconfigure(HealthCheckProgram=str(program), HealthCheckInterval=2)
    _wait_runs(slurm_cluster, runs, 3)
    assert not slurm_cluster.node_state().drained
    log = (tmp_path / "hc" / "log").read_text()
    assert "dry_run=true" in log
    assert re.search(
        r"would drain with: \S*scontrol update NodeName=\S+ State=DRAIN 'Reason=nodecheck: ", log
    ), log


def test_a_drain_past_the_circuit_breaker_is_withheld_and_reported(
    slurm_cluster: SlurmCluster, dgx_faulty: Node, tmp_path: Path
) -> None:
    """Ten nodes in slurm.conf (this one and nine that no slurmd runs), one of them already
    drained with nodecheck's reason within the hour: the cap (a tenth of 10: 1) is reached,
    so the faulty node's drain is withheld, run after run, said in the log (`breaker=open`)
    and in the note the agent exports; the node stays in service."""
    ghost = "ghost1"
    slurm_cluster.run(
        "scontrol",
        "update",
        f"NodeName={ghost}",
        "State=DRAIN",
        "Reason=nodecheck: gpu_xid gpu 0000:1a:00.0: XID 48",
    )
    try:
        program, runs = _health_check(slurm_cluster, dgx_faulty, tmp_path / "hc")
        slurm_cluster.reconfigure(HealthCheckProgram=str(program), HealthCheckInterval=2)
        _wait_runs(slurm_cluster, runs, 2)
        assert not slurm_cluster.node_state().drained
        assert set(runs.read_text().split()) == {"1"}  # unhealthy, reported
        log = (tmp_path / "hc" / "log").read_text()
        assert "breaker=open" in log and "withheld, reported instead of a drain" in log
        assert "1 of 10 nodes drained by nodecheck in the last 3600 s, the cap 1" in log
        note = tmp_path / "hc" / "state" / SLURM_WITHHELD_FILE
        assert read_withheld(note) is True
    finally:
        slurm_cluster.run("scontrol", "update", f"NodeName={ghost}", "State=UNDRAIN")


@pytest.mark.parametrize("which", ["dgx", "dgx_faulty"])
def test_an_admins_drain_is_never_touched(
    slurm_cluster: SlurmCluster,
    which: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    node: Node = request.getfixturevalue(which)
    reason = "maintenance: fan 3 replaced"
    slurm_cluster.run(
        "scontrol", "update", f"NodeName={slurm_cluster.node}", "State=DRAIN", f"Reason={reason}"
    )
    program, runs = _health_check(slurm_cluster, node, tmp_path, undrain_after_runs=1)
    slurm_cluster.reconfigure(HealthCheckProgram=str(program), HealthCheckInterval=2)
    _wait_runs(slurm_cluster, runs, 3)
    state = slurm_cluster.node_state()
    assert state.drained and state.reason == reason


SCONTROL_FAULTS: dict[str, str] = {
    "fails": "echo 'slurm_load_node error: Unable to contact slurm controller' >&2; exit 1",
    "hangs": "sleep 120",
}


@pytest.mark.parametrize("fault", sorted(SCONTROL_FAULTS))
def test_an_scontrol_that_fails_or_hangs_changes_nothing(
    slurm_cluster: SlurmCluster, dgx_faulty: Node, tmp_path: Path, fault: str
) -> None:
    broken = tmp_path / "scontrol"
    tmp_path.chmod(0o755)
    broken.write_text(f"#!/bin/sh\n{SCONTROL_FAULTS[fault]}\n")
    broken.chmod(0o755)
    program, runs = _health_check(
        slurm_cluster, dgx_faulty, tmp_path / "hc", "--scontrol", str(broken), scontrol_timeout=2
    )
    slurm_cluster.reconfigure(HealthCheckProgram=str(program), HealthCheckInterval=2)
    _wait_runs(slurm_cluster, runs, 2)
    assert runs.read_text().split() == ["3"] * _runs(runs)  # could not determine, said so
    state = slurm_cluster.node_state()
    assert state.idle and state.reason is None


def _exports(lines: str) -> tuple[dict[str, str], list[str]]:
    exported: dict[str, str] = {}
    unset: list[str] = []
    for line in lines.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            exported[name] = value
        elif line.startswith("unset "):
            unset.append(line[len("unset ") :].strip())
    return exported, unset


@pytest.mark.parametrize("how", ["nodecheck", "shipped hook, hostile job"])
def test_the_task_prologs_environment_reaches_the_task(
    slurm_cluster: SlurmCluster, dgx: Node, tmp_path: Path, how: str
) -> None:
    """srun's task gets tune's exports for its local rank, and the unset takes effect;
    through the shipped hook also when the job's PYTHONPATH, PYTHONHOME, user site and
    working directory would break a Python started in them (slurmstepd gives TaskProlog
    the job's environment)."""
    args = [*dgx.cli_args, "slurm", "task-prolog"]
    expected = slurm_cluster.run(
        NODECHECK, *args, env={"SLURM_LOCALID": "0", "NCCL_P2P_DISABLE": "1"}
    ).stdout
    exported, unset = _exports(expected)
    assert exported and "NCCL_P2P_DISABLE" in unset
    job = ["--export=ALL,NCCL_P2P_DISABLE=1"]
    if how == "nodecheck":
        program = slurm_cluster.program("task-prolog", NODECHECK, *args, env=dgx.env)
    else:
        tmp_path.chmod(0o755)
        hook = installed_hook(tmp_path / "sbin", "nodecheck-task-prolog")
        program = slurm_cluster.program("task-prolog", str(hook), *dgx.cli_args, env=dgx.env)
        python = hostile_job(tmp_path / "job")
        job = [
            "--export=ALL,NCCL_P2P_DISABLE=1," + ",".join(f"{k}={v}" for k, v in python.items()),
            f"--chdir={tmp_path / 'job'}",
        ]
    slurm_cluster.reconfigure(TaskProlog=str(program))
    done = slurm_cluster.run("srun", "-N1", "-n1", *job, "env", timeout=120)
    task = dict(line.partition("=")[::2] for line in done.stdout.splitlines() if "=" in line)
    for name, value in exported.items():
        assert task.get(name) == value, name
    assert "NCCL_P2P_DISABLE" not in task


def test_each_task_gets_threads_and_a_gpu_of_its_own(
    slurm_cluster: SlurmCluster, dgx: Node
) -> None:
    """`srun --gpus-per-task=1 --cpus-per-task=1`: Slurm narrows SLURM_STEP_GPUS and
    CUDA_VISIBLE_DEVICES per task and binds each to its own CPU; the TaskProlog gives each
    task what `nodecheck slurm task-prolog` gives that task's environment: one thread
    (its CPUs, never the GPU rank's whole share of the node) and its own GPU's settings."""
    if slurm_cluster.gpus < 2:
        pytest.skip("the cluster has fewer than 2 GPUs (no CAP_MKNOD, or one CPU)")
    args = [*dgx.cli_args, "slurm", "task-prolog"]
    program = slurm_cluster.program("task-prolog", NODECHECK, *args, env=dgx.env)
    slurm_cluster.reconfigure(TaskProlog=str(program))
    shown = "echo TASK $SLURM_LOCALID $SLURM_STEP_GPUS $CUDA_VISIBLE_DEVICES; env"
    done = slurm_cluster.run(
        "srun",
        "-N1",
        "-n2",
        "--gpus-per-task=1",
        "--cpus-per-task=1",
        "--label",
        "/bin/sh",
        "-c",
        shown,
        timeout=120,
    )
    tasks: dict[str, dict[str, str]] = {}
    for line in done.stdout.splitlines():
        label, _, text = line.partition(": ")
        tasks.setdefault(label.strip(), {})
        if text.startswith("TASK "):
            _, local, step_gpus, visible = text.split()
            tasks[label.strip()] |= {"local": local, "step": step_gpus, "visible": visible}
        elif "=" in text:
            name, _, value = text.partition("=")
            tasks[label.strip()][name] = value
    assert sorted(t["step"] for t in tasks.values()) == ["0", "1"], done.stdout
    for task in tasks.values():
        environ = {
            "SLURM_LOCALID": task["local"],
            "SLURM_STEP_GPUS": task["step"],
            "CUDA_VISIBLE_DEVICES": task["visible"],
            "SLURM_CPUS_PER_TASK": "1",
        }
        expected, _ = _exports(slurm_cluster.run(NODECHECK, *args, env=environ).stdout)
        assert expected.get("OMP_NUM_THREADS") == "1", expected
        for name, value in expected.items():
            assert task.get(name) == value, (name, task.get(name), value)


def test_a_prolog_failure_drains_the_node_and_requeues_the_job(
    slurm_cluster: SlurmCluster, dgx_faulty: Node, dgx: Node, tmp_path: Path
) -> None:
    # The prolog records its failure in the health check's state folder.
    config = _config(tmp_path / "hc")
    program = slurm_cluster.program(
        "prolog",
        NODECHECK,
        *dgx_faulty.cli_args,
        "slurm",
        "prolog",
        "--config",
        str(config),
        env=dgx_faulty.env,
    )
    slurm_cluster.reconfigure(Prolog=str(program))
    tmp_path.chmod(0o755)
    submitted = slurm_cluster.run(
        "sbatch", "--requeue", "-N1", f"--output={tmp_path / 'job.out'}", "--wrap=hostname"
    ).stdout
    job = re.search(r"Submitted batch job (\d+)", submitted)
    assert job, submitted
    state = slurm_cluster.wait_for(
        lambda: s if (s := slurm_cluster.node_state()).drained else None, 180, "the drain"
    )
    assert state.reason is not None and "prolog" in state.reason.lower()

    def requeued() -> str | None:
        shown = slurm_cluster.run("scontrol", "show", "job", job.group(1)).stdout
        restarts = re.search(r"Restarts=(\d+)", shown)
        return shown if restarts and int(restarts.group(1)) >= 1 else None

    shown = slurm_cluster.wait_for(requeued, 180, "the job requeued")
    assert "JobState=COMPLETED" not in shown
    # health-check takes Slurm's "Prolog error" drain over: the prolog gone, the node
    # healthy (the healthy twin), it sets its own reason, then undrains after the runs.
    slurm_cluster.reconfigure(Prolog=None)
    healthy, runs = _health_check(slurm_cluster, dgx, tmp_path / "hc", undrain_after_runs=2)
    slurm_cluster.reconfigure(HealthCheckProgram=str(healthy), HealthCheckInterval=2)

    def taken_over() -> NodeState | None:
        state = slurm_cluster.node_state()
        return state if (state.reason or "").startswith("nodecheck:") else None

    taken = slurm_cluster.wait_for(taken_over, 180, "the takeover")
    assert taken.drained and "took over Slurm's 'Prolog error' drain" in str(taken.reason)
    assert f"the prolog failed job {job.group(1)} on gpu_" in str(taken.reason)
    back = slurm_cluster.wait_idle(180)
    assert back.reason is None and _runs(runs) >= 3


def test_an_admins_edit_of_nodecheck_s_reason_keeps_the_node_drained(
    slurm_cluster: SlurmCluster, dgx_faulty: Node, dgx: Node, tmp_path: Path
) -> None:
    """nodecheck drains the faulty node; an admin, as the same user (root), appends to
    its reason: however many healthy runs follow, the node stays drained, the admin's."""
    program, _ = _health_check(slurm_cluster, dgx_faulty, tmp_path, undrain_after_runs=1)
    slurm_cluster.reconfigure(HealthCheckProgram=str(program), HealthCheckInterval=2)
    drained = slurm_cluster.wait_for(
        lambda: s if (s := slurm_cluster.node_state()).drained else None, 180, "the drain"
    )
    edited = f"{drained.reason} -- RMA 4711, keep drained"
    slurm_cluster.run(
        "scontrol", "update", f"NodeName={slurm_cluster.node}", "State=DRAIN", f"Reason={edited}"
    )
    healthy, runs = _health_check(
        slurm_cluster, dgx, tmp_path, name="health-check-healthy", undrain_after_runs=1
    )
    slurm_cluster.reconfigure(HealthCheckProgram=str(healthy))
    _wait_runs(slurm_cluster, runs, 3)
    after = slurm_cluster.node_state()
    assert after.drained and after.reason == edited
    assert "drained for another reason" in (tmp_path / "log").read_text()
