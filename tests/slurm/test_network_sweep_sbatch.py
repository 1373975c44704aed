"""deploy/slurm/nodecheck-network-sweep.sbatch: its own parts, on the one-node cluster.

`nodecheck bench network` is the command it runs; here a stand-in takes its place (named by
the script's NODECHECK variable) and records what each task was given, so that what is
tested is the script: its #SBATCH lines (whole nodes, one task per GPU), the refusal of an
allocation that may share its nodes, and the command line and variables each task gets.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.slurm_cluster import SlurmCluster

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "nodecheck-network-sweep.sbatch"

# What `nodecheck bench network` would be given, one file per task; its exit status is 1
# ("something named slow") so that the script's own status is seen to be the command's.
STAND_IN = """#!%(python)s
import json, os, socket, sys
keep = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID")
record = {"argv": sys.argv[1:], "host": socket.gethostname(),
          "env": {name: os.environ.get(name) for name in keep}}
with open(os.path.join(%(folder)r, os.environ["SLURM_PROCID"] + ".json"), "w") as out:
    json.dump(record, out)
sys.exit(1)
"""


def sbatch_lines() -> dict[str, str]:
    found = re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", SCRIPT.read_text(), re.M)
    return {name: value for name, value in found}


def test_the_script_parses_and_asks_for_whole_nodes_one_task_per_gpu() -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    lines = sbatch_lines()
    assert "exclusive" in lines and lines["mem"] == "0"  # whole nodes, all their memory
    assert lines["ntasks-per-node"] == lines["gpus-per-node"]  # one task per GPU
    assert int(lines["nodes"]) >= 2  # across nodes
    assert SCRIPT.stat().st_mode & 0o111


@pytest.mark.parametrize(
    ("slurm", "why"),
    [
        ({}, "not a Slurm job: submit it with sbatch (it never runs inside another job)"),
        (
            {"SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "0"},
            "run as a step of job 4711: submit it as a job of its own with sbatch",
        ),
    ],
)
def test_outside_a_job_of_its_own_it_refuses_in_one_line(slurm: dict[str, str], why: str) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        env={"PATH": "/usr/bin:/bin", **slurm},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr == f"nodecheck-network-sweep: {why}\n"


def _stand_in(tmp_path: Path) -> tuple[Path, Path]:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    command = tmp_path / "nodecheck"
    command.write_text(STAND_IN % {"python": sys.executable, "folder": str(tasks)})
    command.chmod(0o755)
    return command, tasks


def _sbatch(cluster: SlurmCluster, tmp_path: Path, *options: str) -> tuple[int, str]:
    command, _ = _stand_in(tmp_path)
    output = tmp_path / "sweep.out"
    exports = (
        f"ALL,NODECHECK={command},NODECHECK_STATE_DIR={tmp_path / 'state'},"
        "NODECHECK_SWEEP_OPTIONS=--device cpu --payload-mib 1"
    )
    done = cluster.run(
        "sbatch",
        "--wait",
        "--nodes=1",
        "--ntasks-per-node=2",
        "--gpus-per-node=2",  # the cluster's node has two gres/gpu
        f"--output={output}",
        f"--export={exports}",
        *options,
        str(SCRIPT),
        timeout=180,
        check=False,
    )
    job = re.search(r"Submitted batch job (\d+)", done.stdout)
    assert job, done.stdout + done.stderr
    state = cluster.run("scontrol", "show", "job", job[1]).stdout
    exit_code = re.search(r"\bExitCode=(\d+):\d+", state)
    assert exit_code, state
    return int(exit_code[1]), output.read_text() if output.exists() else ""


def test_a_sweep_runs_one_task_per_gpu_with_the_state_dir_and_options(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    exit_code, output = _sbatch(slurm_cluster, tmp_path)
    # The command's own status: 1 is "a node or link named slow".
    assert exit_code == 1, output
    assert "nodecheck-network-sweep: exit 1" in output
    tasks = sorted((tmp_path / "tasks").glob("*.json"))
    records = [json.loads(path.read_text()) for path in tasks]
    assert [r["env"]["SLURM_PROCID"] for r in records] == ["0", "1"], output
    assert {r["env"]["SLURM_NTASKS"] for r in records} == {"2"}
    assert sorted(r["env"]["SLURM_LOCALID"] for r in records) == ["0", "1"]
    assert {r["env"]["SLURM_STEP_ID"] for r in records} == {"0"}  # a step of its own job
    for task in records:
        assert task["argv"] == [
            "bench",
            "network",
            "--state-dir",
            str(tmp_path / "state"),
            "--device",
            "cpu",
            "--payload-mib",
            "1",
        ]


def test_an_allocation_that_may_share_its_nodes_is_refused(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """--oversubscribe on the command line overrides the script's --exclusive: the job could
    share its node with a user's job, so nothing runs."""
    exit_code, output = _sbatch(slurm_cluster, tmp_path, "--oversubscribe")
    assert exit_code == 2, output
    assert re.search(r"job \d+ may share its nodes \(OverSubscribe=\w+\)", output), output
    assert list((tmp_path / "tasks").iterdir()) == []


def test_sbatch_accepts_the_script_as_written(slurm_cluster: SlurmCluster) -> None:
    """sbatch --test-only takes its #SBATCH lines on this cluster (its node has two GPUs:
    the per-node counts are given on the command line, as a site gives its own)."""
    done = slurm_cluster.run(
        "sbatch",
        "--test-only",
        "--nodes=1",
        "--ntasks-per-node=2",
        "--gpus-per-node=2",
        str(SCRIPT),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "to start at" in done.stderr, done.stderr
