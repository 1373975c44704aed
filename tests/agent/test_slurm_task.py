"""`nodecheck slurm task-prolog`: its lines, read back as slurmstepd reads them, give each
task the environment `nodecheck tune --local-rank N` gives it; and the srun --cpu-bind
option `tune` prints binds each task to its numactl CPUs."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from nodecheck.agent.slurm_task import MAX_LINE, export_line
from nodecheck.agent.tune_view import cpus_of_cpu_bind, render_shell, render_text, srun_binding
from nodecheck.checks.node.cpulist import parse_cpulist
from nodecheck.tuning.plan import TuneOptions, make_plan
from tests.agent.test_cli import run
from tests.conftest import CLEAN_ENVIRON, Node
from tests.fixtures import nodes
from tests.fixtures.nodegen import build_node


def slurmstepd_applies(output: str, environ: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The task's environment after a task prolog printed `output`, and what it printed,
    as _proc_stdout in SchedMD/slurm src/slurmd/slurmstepd/task.c reads it: `export `
    then the name (spaces around it dropped), '=', and the rest of the line taken
    literally; `unset NAME`; `print ...` to the task's stdout; anything else ignored."""
    env, printed = dict(environ), []
    for line in output.split("\n"):
        if line.startswith("print "):
            printed.append(line[6:].lstrip())
        elif line.startswith("export "):
            name, equal, value = line[7:].lstrip().partition("=")
            if equal:
                env[name.rstrip()] = value
        elif line.startswith("unset "):
            name = line[6:].strip()
            if name:
                env.pop(name, None)
    return env, printed


def sourced(shell_output: str, environ: dict[str, str]) -> dict[str, str]:
    """The environment bash has after evaluating `tune --format shell` output."""
    done = subprocess.run(
        ["bash", "-c", 'eval "$(cat)" && env -0'],
        input=shell_output,
        capture_output=True,
        text=True,
        env=environ,
        check=True,
        timeout=30,
    )
    pairs = (entry.partition("=") for entry in done.stdout.split("\0") if entry)
    # bash's own variables are not the plan's.
    return {name: value for name, _, value in pairs if name not in ("PWD", "SHLVL", "_", "OLDPWD")}


def task_environ(**extra: str) -> dict[str, str]:
    environ = dict(CLEAN_ENVIRON, PATH=os.environ["PATH"], **extra)
    if "PYTHONPATH" in os.environ:
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return environ


@pytest.mark.parametrize("local_rank", range(8))
def test_each_task_gets_tunes_environment_for_its_rank(dgx: Node, local_rank: int) -> None:
    # A flagged variable in the job's environment: tune unsets it, so must the task prolog.
    job = {"NCCL_P2P_DISABLE": "1", "SLURM_LOCALID": str(local_rank)}
    prolog = run(*dgx.cli_args, "slurm", "task-prolog", env=job)
    assert prolog.returncode == 0, prolog.stdout + prolog.stderr
    assert "unset NCCL_P2P_DISABLE" in prolog.stdout.splitlines()
    tune = run(*dgx.cli_args, "tune", "--format", "shell", "--local-rank", str(local_rank), env=job)
    assert tune.returncode == 0, tune.stderr
    environ = task_environ(**job)
    task_env, printed = slurmstepd_applies(prolog.stdout, environ)
    assert printed == []
    assert task_env == sourced(tune.stdout, environ)
    assert "NCCL_P2P_DISABLE" not in task_env
    assert task_env["OMP_NUM_THREADS"] == "14"
    assert task_env["NCCL_IB_HCA"].startswith("=mlx5_0:1,")  # '=' kept: exact match


def test_a_job_s_own_working_values_are_kept_as_exec_keeps_them(dgx: Node) -> None:
    # NCCL_DEBUG=INFO is only warned about: exec keeps it, and so does the task prolog,
    # saying so; NCCL_P2P_DISABLE=1 on NVLink fails: unset.
    job = {"SLURM_LOCALID": "2", "NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1"}
    prolog = run(*dgx.cli_args, "slurm", "task-prolog", env=job)
    assert prolog.returncode == 0, prolog.stdout + prolog.stderr
    task_env, printed = slurmstepd_applies(prolog.stdout, task_environ(**job))
    assert task_env["NCCL_DEBUG"] == "INFO" and "NCCL_P2P_DISABLE" not in task_env
    assert printed == ["nodecheck task-prolog: kept your NCCL_DEBUG (see nodecheck tune)"]
    assert task_env["OMP_NUM_THREADS"] == "14"


def test_a_task_s_gpu_comes_from_cuda_visible_devices(dgx: Node) -> None:
    # As Slurm's gres plugin gives a task GPUs 4-7 (global indices): local rank 1 drives
    # the second of them, as tune says for the same environment.
    job = {"SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "4,5,6,7", "SLURM_STEP_GPUS": "4,5,6,7"}
    prolog = run(*dgx.cli_args, "slurm", "task-prolog", env=job)
    assert prolog.returncode == 0, prolog.stdout + prolog.stderr
    tune = run(*dgx.cli_args, "tune", "--format", "shell", "--local-rank", "1", env=job)
    environ = task_environ(**job)
    assert slurmstepd_applies(prolog.stdout, environ)[0] == sourced(tune.stdout, environ)


def test_a_rank_that_must_not_run_gets_nothing_and_fails(dgx_faulty: Node) -> None:
    done = run(*dgx_faulty.cli_args, "slurm", "task-prolog", env={"SLURM_LOCALID": "7"})
    assert done.returncode == 2
    env, printed = slurmstepd_applies(done.stdout, {})
    assert env == {}
    assert printed and printed[0].startswith(
        "nodecheck task-prolog: must not run here: local rank 7"
    )


def test_no_rank_fails_and_no_gpu_for_it_sets_nothing(dgx: Node, tmp_path: Path) -> None:
    missing = run(*dgx.cli_args, "slurm", "task-prolog")
    assert missing.returncode == 2
    assert missing.stdout.startswith("print nodecheck task-prolog: SLURM_LOCALID is not set")
    bad = run(*dgx.cli_args, "slurm", "task-prolog", env={"SLURM_LOCALID": "x1"})
    assert bad.returncode == 2 and "not a local rank" in bad.stdout
    # More tasks than GPUs: the task runs as it is, told why nothing was set.
    beyond = run(*dgx.cli_args, "slurm", "task-prolog", env={"SLURM_LOCALID": "8"})
    assert beyond.returncode == 0, beyond.stdout
    assert slurmstepd_applies(beyond.stdout, {}) == (
        {},
        ["nodecheck task-prolog: local rank 8: this node has 8 GPU rank(s), 0-7: nothing set"],
    )
    # A node without GPUs (TaskProlog= is the whole cluster's): nothing, and no failure.
    cpu_only = build_node(nodes.NODES["cpu-only"](), tmp_path / "cpu-only")
    node = Node(cpu_only)
    done = run(*node.cli_args, "slurm", "task-prolog", env={"SLURM_LOCALID": "0"})
    assert (done.returncode, done.stdout) == (0, ""), done.stderr


def test_the_help_says_the_exit_status_a_task_gets(dgx: Node, dgx_faulty: Node) -> None:
    """--help tells the exit status as the command gives it (and the README): 2 for a
    rank that must not run, 0 for a task beyond the node's GPUs. It once said 2 for both."""
    shown = " ".join(run("slurm", "task-prolog", "--help").stdout.split())
    assert "Exit status 2, with nothing exported, for a rank that must not run here" in shown
    assert (
        "a task beyond the node's GPUs, or on a node without GPUs, gets nothing set and "
        "exit status 0" in shown
    )
    lost = run(*dgx_faulty.cli_args, "slurm", "task-prolog", env={"SLURM_LOCALID": "7"})
    beyond = run(*dgx.cli_args, "slurm", "task-prolog", env={"SLURM_LOCALID": "8"})
    assert (lost.returncode, beyond.returncode) == (2, 0), lost.stdout + beyond.stdout
    assert "export " not in lost.stdout + beyond.stdout


def test_export_lines_carry_values_literally() -> None:
    line = export_line("NCCL_IB_HCA", "=mlx5_0:1, 'quoted' $HOME")
    assert line == "export NCCL_IB_HCA==mlx5_0:1, 'quoted' $HOME"
    assert slurmstepd_applies(line, {})[0] == {"NCCL_IB_HCA": "=mlx5_0:1, 'quoted' $HOME"}
    with pytest.raises(ValueError, match="single-line"):
        export_line("A", "one\nexport LD_PRELOAD=/tmp/x.so")
    with pytest.raises(ValueError, match="not a variable name"):
        export_line("A B", "1")
    with pytest.raises(ValueError, match="past the"):
        export_line("A", "x" * MAX_LINE)


def test_srun_cpu_bind_equals_the_numactl_binding(dgx: Node) -> None:
    plan = make_plan(dgx.context(), TuneOptions())
    options = srun_binding(plan)
    cpu_bind = next(o for o in options.split() if o.startswith("--cpu-bind="))
    assert cpu_bind.startswith("--cpu-bind=mask_cpu:0x")
    numactl_cpus = [
        frozenset(parse_cpulist(rank.binding.numactl()[1].removeprefix("--physcpubind=")))
        for rank in plan.ranks
    ]
    assert len(numactl_cpus) == 8 and all(len(cpus) == 28 for cpus in numactl_cpus)
    assert cpus_of_cpu_bind(cpu_bind) == numactl_cpus
    assert "--ntasks-per-node=8" in options.split()
    assert "--mem-bind=map_mem:0,0,0,0,1,1,1,1" in options.split()
    # Shown where the numactl lines are: tune's text and its shell comments.
    assert f"    srun {options} CMD" in render_text(plan, None).splitlines()
    assert f"# or with srun (Slurm binds each task): srun {options} CMD" in render_shell(plan, None)


def test_one_cpu_each_is_a_map_cpu_binding(dgx: Node) -> None:
    plan = make_plan(dgx.context(), TuneOptions())
    one_each = replace(
        plan,
        ranks=[
            replace(rank, binding=replace(rank.binding, cpus=(rank.binding.cpus[0],)))
            for rank in plan.ranks
        ],
    )
    cpu_bind = next(o for o in srun_binding(one_each).split() if o.startswith("--cpu-bind="))
    assert cpu_bind == "--cpu-bind=map_cpu:0,14,28,42,56,70,84,98"
    assert cpus_of_cpu_bind(cpu_bind) == [frozenset(r.binding.cpus) for r in one_each.ranks]


def test_cpu_bind_lists_read_as_srun_reads_them() -> None:
    assert cpus_of_cpu_bind("--cpu-bind=map_cpu:3,17") == [frozenset({3}), frozenset({17})]
    assert cpus_of_cpu_bind("--cpu-bind=mask_cpu:0x3,c") == [frozenset({0, 1}), frozenset({2, 3})]
    with pytest.raises(ValueError):
        cpus_of_cpu_bind("--cpu-bind=rank")


def test_no_srun_binding_for_a_rank_without_cpus(dgx: Node) -> None:
    plan = make_plan(dgx.context(), TuneOptions())
    first = plan.ranks[0]
    broken = replace(
        plan, ranks=[replace(first, binding=replace(first.binding, cpus=(), error="no CPU"))]
    )
    assert srun_binding(broken) == ""
    assert "or with srun" not in render_text(broken, None)


def test_a_plan_that_fails_never_cancels_the_task(
    dgx: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tuning is advice: a node that cannot be planned (a read that fails, a plan that
    raises) gets a `print` line and exit 0, never the non-zero exit that cancels the task."""
    from click.testing import CliRunner

    from nodecheck.agent.cli import cli
    from nodecheck.tuning import plan as plan_module

    def broken(*_: object) -> object:
        raise OSError("EIO on a NIC attribute")

    monkeypatch.setattr(plan_module, "make_plan", broken)
    done = CliRunner().invoke(
        cli, [*dgx.cli_args, "slurm", "task-prolog"], env={"SLURM_LOCALID": "0"}
    )
    assert done.exit_code == 0, done.output
    assert done.output.startswith("print nodecheck task-prolog: no tuning (OSError: EIO")
    assert "export " not in done.output
