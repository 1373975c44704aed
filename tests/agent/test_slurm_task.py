"""`nodecheck slurm task-prolog`: its lines, read back as slurmstepd reads them, give each
task the environment `nodecheck tune --local-rank N` gives it; and the srun --cpu-bind
option `tune` prints binds each task to its numactl CPUs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from nodecheck.agent.launch.tune_view import (
    cpus_of_cpu_bind,
    render_shell,
    render_text,
    srun_binding,
)
from nodecheck.agent.slurm.task import MAX_LINE, export_line, task_prolog_lines
from nodecheck.checks.node.cpulist import parse_cpulist
from nodecheck.tuning.plan import TuneOptions, make_plan
from tests.agent.test_cli import NODECHECK, run
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
    # Said on stderr (slurmd's log), never printed into the job's output.
    assert printed == []
    assert "nodecheck task-prolog: kept your NCCL_DEBUG (see nodecheck tune)" in prolog.stderr
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
    assert slurmstepd_applies(beyond.stdout, {}) == ({}, [])
    assert "local rank 8: this node has 8 GPU rank(s), 0-7: nothing set" in beyond.stderr
    # A node without GPUs (TaskProlog= is the whole cluster's): nothing, and no failure.
    cpu_only = build_node(nodes.NODES["cpu-only"](), tmp_path / "cpu-only")
    node = Node(cpu_only)
    done = run(*node.cli_args, "slurm", "task-prolog", env={"SLURM_LOCALID": "0"})
    assert (done.returncode, done.stdout) == (0, ""), done.stderr


def test_the_help_says_the_exit_status_a_task_gets(dgx: Node, dgx_faulty: Node) -> None:
    """--help tells the exit status as the command gives it (and docs/slurm.md): 2 for a
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


HOOK = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "nodecheck-slurm-hook"


def installed_hook(folder: Path, name: str) -> Path:
    """The shipped hook installed as docs/slurm.md says: under `name`, its PYTHON= line set
    to the interpreter of nodecheck's virtualenv (this one)."""
    text = HOOK.read_text()
    [line] = [line for line in text.splitlines() if line.startswith("PYTHON=")]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text.replace(line, f"PYTHON={shlex.quote(sys.executable)}"))
    path.chmod(0o755)
    return path


# A job's LD_PRELOAD library that kills any Python it is loaded into (a profiler or an
# allocator built against another libc would crash it), and leaves other programs, the
# hook's /bin/sh among them, alone.
PRELOAD_THAT_KILLS_PYTHON = r"""
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void kill_python(void) {
    char exe[4096] = {0};
    if (readlink("/proc/self/exe", exe, sizeof exe - 1) > 0 && strstr(exe, "python")) {
        static const char said[] = "the job's LD_PRELOAD library was loaded\n";
        write(2, said, sizeof said - 1);
        _exit(3);
    }
}
"""


def hostile_job(folder: Path) -> dict[str, str]:
    """A job's environment and working directory (`folder`) that break any Python started
    in them: a click.py that exits first on its PYTHONPATH, in its working directory and
    in its user site, a PYTHONHOME with no Python in it, and an LD_PRELOAD library that
    kills a Python (compiled here with cc)."""
    planted = 'raise SystemExit("the job\'s click.py was imported")\n'
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    user_site = folder / "userbase" / "lib" / version / "site-packages"
    for where in (folder / "pythonpath", folder, user_site):
        where.mkdir(parents=True, exist_ok=True)
        (where / "click.py").write_text(planted)
    source = folder / "preload.c"
    source.write_text(PRELOAD_THAT_KILLS_PYTHON)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(folder / "preload.so"), str(source)],
        check=True,
        timeout=120,
    )
    return {
        "PYTHONPATH": str(folder / "pythonpath"),
        "PYTHONHOME": str(folder / "no-python-here"),
        "PYTHONUSERBASE": str(folder / "userbase"),
        "LD_PRELOAD": str(folder / "preload.so"),
    }


def run_hook(
    hook: Path, node: Node, cwd: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """The hook as Slurm runs it (no arguments: the node's roots, and `args`, are this
    test's)."""
    return subprocess.run(
        [str(hook), *node.cli_args, *args],
        cwd=cwd,
        env={**CLEAN_ENVIRON, "PATH": os.environ["PATH"], **node.env, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_task_prolog_hook_runs_isolated_from_the_job_s_python(
    dgx: Node, dgx_faulty: Node, tmp_path: Path
) -> None:
    """slurmstepd runs TaskProlog in the job's environment: the shipped hook's lines and
    exit status are those of a clean run, whatever the job's PYTHONPATH, PYTHONHOME, user
    site and working directory hold, and the job's own variables still count."""
    job = tmp_path / "job"
    python = hostile_job(job)
    broken = subprocess.run(
        [*NODECHECK, "--help"],
        cwd=job,
        env={**CLEAN_ENVIRON, **python},
        capture_output=True,
        text=True,
        check=False,
    )
    assert broken.returncode != 0  # the environment does break an unisolated Python
    isolated = subprocess.run(
        [sys.executable, "-I", "-c", "pass"],
        cwd=job,
        env={**CLEAN_ENVIRON, **python},
        capture_output=True,
        text=True,
        check=False,
    )
    # -I alone does not keep the job's LD_PRELOAD library out: the hook drops it.
    assert isolated.returncode == 3 and "LD_PRELOAD library was loaded" in isolated.stderr
    hook = installed_hook(tmp_path / "sbin", "nodecheck-task-prolog")
    task = {"SLURM_LOCALID": "3", "NCCL_P2P_DISABLE": "1"}
    done = run_hook(hook, dgx, job, {**python, **task})
    clean = run(*dgx.cli_args, "slurm", "task-prolog", env=task)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == clean.stdout and "unset NCCL_P2P_DISABLE" in done.stdout
    lost = run_hook(hook, dgx_faulty, job, {**python, "SLURM_LOCALID": "7"})
    assert lost.returncode == 2, lost.stdout + lost.stderr
    assert lost.stdout.startswith("print nodecheck task-prolog: must not run here: local rank 7")


def test_the_root_hooks_run_isolated_too(dgx_faulty: Node, tmp_path: Path) -> None:
    """The same file as Prolog and Epilog (slurmd's, as root): judged as a clean run
    judges, with the same hostile environment; under a name it does not know, it says so."""
    job = tmp_path / "job"
    python = hostile_job(job)
    config = tmp_path / "config.toml"  # a failure is recorded in its state folder
    config.write_text(f'[agent]\nstate_dir = "{tmp_path}"\n')
    for name, hook in (("prolog", "nodecheck-prolog"), ("epilog", "nodecheck-epilog")):
        installed = installed_hook(tmp_path / "sbin", hook)
        done = run_hook(installed, dgx_faulty, job, python, "--config", str(config))
        assert done.returncode == 1, done.stderr
        assert f"nodecheck {name}: node unusable: gpu_count " in done.stderr
        assert "click.py" not in done.stderr and "LD_PRELOAD" not in done.stderr
    unknown = run_hook(installed_hook(tmp_path / "sbin", "nodecheck"), dgx_faulty, job, {})
    assert unknown.returncode == 2
    assert "install it as nodecheck-health-check, nodecheck-prolog," in unknown.stderr


def test_the_documented_slurm_conf_names_the_hooks_it_installs(tmp_path: Path) -> None:
    """Each program the slurm.conf lines of docs/slurm.md name is the shipped hook under
    that name, and runs the subcommand the line's comment says."""
    readme = (HOOK.parents[2] / "docs" / "slurm.md").read_text()
    lines = re.findall(
        r"^\w+=/usr/local/sbin/(nodecheck-[\w-]+) +# (nodecheck slurm [\w-]+)$", readme, re.M
    )
    assert len(lines) == 4, lines
    for name, command in lines:
        hook = installed_hook(tmp_path, name)
        shown = subprocess.run(
            [str(hook), "--help"], capture_output=True, text=True, timeout=60, check=False
        )
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith(f"Usage: {command} "), shown.stdout


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


@pytest.mark.parametrize(
    ("affinity", "per_task", "threads"),
    [
        (None, None, "14"),  # no affinity known: tune's binding, 28 CPUs (14 cores)
        (frozenset(range(7)), "7", "3"),  # srun --cpus-per-task=7: 7 CPUs, 3 cores' worth
        (frozenset(range(56)), "7", "3"),  # a wider affinity, SLURM_CPUS_PER_TASK=7
        (frozenset(range(112)), None, "14"),  # more than the rank's: the binding's stands
    ],
)
def test_a_task_s_threads_come_from_its_own_cpus(
    dgx: Node,
    affinity: frozenset[int] | None,
    per_task: str | None,
    threads: str,
) -> None:
    """srun --gpus-per-task=1 --cpus-per-task=N: each task's OMP_NUM_THREADS from its N
    CPUs (the affinity slurmstepd applied, SLURM_CPUS_PER_TASK), said on stderr."""
    from tests.tuning.test_plan import plan_for

    environ = {"SLURM_LOCALID": "3", **({"SLURM_CPUS_PER_TASK": per_task} if per_task else {})}
    lines, notes, code = task_prolog_lines(plan_for(dgx, environ), 3, environ, affinity)
    assert code == 0 and f"export OMP_NUM_THREADS={threads}" in lines
    assert not any(line.startswith("print ") for line in lines)
    said = [n for n in notes if "threads from the task's" in n]
    assert bool(said) is (threads != "14"), notes
