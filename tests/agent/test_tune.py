"""`nodecheck tune` output as bash, systemd and programs read it, and `nodecheck exec`
applying a rank's binding and environment to a real child process on this machine."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodecheck.agent.launch.rank_exec import (
    LocalRank,
    applied_environment,
    local_rank_from,
    prepare,
    rank_plan_for,
)
from nodecheck.agent.launch.tune_view import env_file_value, render_env
from nodecheck.tuning.plan import Plan, TuneOptions, make_plan
from nodecheck.tuning.recommendation import Recommendation
from tests.agent.test_cli import NODECHECK, run
from tests.conftest import CLEAN_ENVIRON, Node
from tests.faults.test_tune import build_two_gpu_box
from tests.fixtures.graft import placed_gpus_spec
from tests.fixtures.nodegen import add_mig_instances, build_node
from tests.fixtures.nodes import SECRET
from tests.fixtures.pinned_facts import JOB_TORCH_2_13, TORCH_2_13, with_parts

ENVIRONMENT_D_GENERATOR = Path(
    "/usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator"
)
# The child of `nodecheck exec` reports what it was given.
REPORT = (
    "import json, os, sys\n"
    "maps = open('/proc/self/numa_maps').readline().split()\n"
    "json.dump({'affinity': sorted(os.sched_getaffinity(0)), 'policy': maps[1],\n"
    "           'env': dict(os.environ)}, open(sys.argv[1], 'w'))\n"
)


def subprocess_env(**extra: str) -> dict[str, str]:
    """A clean environment for a child, as `run` builds it (nothing from a Slurm or GPU job
    this test suite may itself run in)."""
    environ = dict(CLEAN_ENVIRON, PATH=os.environ["PATH"], **extra)
    if "PYTHONPATH" in os.environ:
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return environ


def document(node: Node, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = run(*node.cli_args, "tune", "--format", "json", *args, env=env)
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def test_json_document(dgx: Node) -> None:
    doc = document(dgx)
    assert doc["schema"] == "nodecheck.tune/v1" and doc["hostname"] == "dgx-h100-01"
    ranks = doc["ranks"]
    assert isinstance(ranks, list) and len(ranks) == 8
    assert [r["numa_node"] for r in ranks] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [r["nics"][0] for r in ranks] == [f"mlx5_{i}" for i in range(8)]
    cpus = [set(r["cpus"]) for r in ranks]
    assert len(set().union(*cpus)) == 8 * 28  # 14 cores each, with their SMT siblings
    assert ranks[5]["numactl"] == ["numactl", "--physcpubind=70-83,182-195", "--membind=1"]
    assert ranks[5]["env"] == {"OMP_NUM_THREADS": "14"}
    assert ranks[5]["dataloader"] == {"num_workers": 2, "pin_memory": True}
    budget = ranks[5]["cpu_budget"]
    assert (budget["cpus"], budget["intra_op_threads"], budget["dataloader_workers"]) == (28, 14, 2)
    assert budget["pin_memory_thread"] == 1 and "= 17 of the rank's 28 CPU(s)" in budget["split"]
    assert [hint["title"] for hint in doc["code_hints"]] == [
        "garbage collection at the same step on every rank",
        "torchrun's own binding, the built-in alternative to nodecheck exec",
    ]
    assert "gc.disable()" in doc["code_hints"][0]["code"]
    assert "--numa-binding" in doc["code_hints"][1]["code"]
    # RDMA rails: NCCL's sockets only bootstrap, over the default route's eno1; gloo too.
    assert doc["env"]["NCCL_SOCKET_IFNAME"] == "eno1" and doc["env"]["GLOO_SOCKET_IFNAME"] == "eno1"
    recommendation = doc["recommendations"][0]
    assert set(recommendation) >= {
        "name",
        "value",
        "action",
        "current",
        "reason",
        "source",
        "advisory",
    }
    assert [r["local_rank"] for r in document(dgx, "--local-rank", "6")["ranks"]] == [6]


def test_faulty_node_shows_the_red_flags_as_unset(dgx_faulty: Node) -> None:
    doc = document(dgx_faulty)
    unset = {entry["name"]: entry for entry in doc["unset"]}
    assert set(unset) == {"NCCL_P2P_DISABLE", "PYTORCH_CUDA_ALLOC_CONF"}
    assert {entry["action"] for entry in unset.values()} == {"unset"}
    assert unset["NCCL_P2P_DISABLE"]["found_in"] == ["pid 4242 (python3)"]
    done = run(*dgx_faulty.cli_args, "tune", "--format", "text")
    assert "unset   NCCL_P2P_DISABLE=1  (found in pid 4242 (python3))" in done.stdout
    # Other variables of the job's environment are never read out, let alone printed.
    assert SECRET not in done.stdout + done.stderr


def test_text_is_a_table_with_reasons(dgx: Node) -> None:
    done = run(
        *dgx.cli_args, "tune", "--format", "text", "--nodes", "16", env={"NCCL_DEBUG": "INFO"}
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "  RANK  GPU           NUMA  CPUS            ENV                 WORKERS  NIC" in out
    assert (
        "  7     0000:bc:00.0  1     98-111,210-223  OMP_NUM_THREADS=14  2        mlx5_7 (PIX)"
        in out
    )
    assert "In the training script:" in out and "gc.disable() before the loop" in out
    assert "  set     NCCL_IB_QPS_PER_CONNECTION" not in out  # advice: the fabric decides
    assert "  change  NCCL_DEBUG=WARN  (now INFO; it works, so nodecheck exec keeps it)" in out
    assert "Left unset on purpose:" in out and "  NCCL_ALGO, NCCL_PROTO" in out


def test_hostile_values_stay_inert(
    dgx_faulty: Node, copy_node: Callable[[Node], Node], tmp_path: Path
) -> None:
    """A job on the GPUs whose environment holds a newline and a command: sourcing the
    shell output runs nothing, and the EnvironmentFile gains no variable."""
    node = copy_node(dgx_faulty)
    marker = tmp_path / "ran"
    evil = f"NCCL_ALGO=Ring\ntouch {marker}\nLD_PRELOAD=/tmp/evil.so\n"
    (node.root / "proc" / "4242" / "environ").write_bytes(
        b"PATH=/usr/bin\0" + evil.encode() + b"\0NCCL_P2P_DISABLE=1\0"
    )
    shell = run(*node.cli_args, "tune", "--format", "shell")
    assert shell.returncode == 0, shell.stderr
    script = tmp_path / "tune.sh"
    script.write_text(shell.stdout)
    sourced = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", f"source {script}"],
        capture_output=True,
        check=False,
    )
    assert sourced.returncode == 0 and not marker.exists(), sourced.stderr
    assert "\\ntouch" in shell.stdout  # shown, escaped, in a comment
    env_file = run(*node.cli_args, "tune", "--format", "env").stdout
    assert all(
        line.startswith("#") or line.split("=")[0].isidentifier() for line in env_file.splitlines()
    )
    assert not any(line.startswith("LD_PRELOAD") for line in env_file.splitlines())
    assert "LD_PRELOAD" not in systemd_reads(env_file, tmp_path)


def test_shell_output_sourced_in_bash(dgx_faulty: Node, tmp_path: Path) -> None:
    """bash sources the exports; the environment it ends with is the JSON's, for rank 3."""
    calling = {"OMP_NUM_THREADS": "1", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eno1"}
    done = run(*dgx_faulty.cli_args, "tune", "--local-rank", "3", env=calling)  # a pipe: shell
    assert done.returncode == 0, done.stderr
    script = tmp_path / "tune.sh"
    script.write_text(done.stdout)
    shell = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", f"source {script} && env -0"],
        env={"PATH": os.environ["PATH"], **calling},
        capture_output=True,
        check=True,
    )
    after = dict(entry.split("=", 1) for entry in shell.stdout.decode().split("\0") if entry)
    doc = document(dgx_faulty, "--local-rank", "3", env=calling)
    expected = {**doc["env"], **doc["ranks"][0]["env"]}
    assert {name: after.get(name) for name in expected} == expected
    assert expected["NCCL_SOCKET_IFNAME"] == "eno1" and expected["OMP_NUM_THREADS"] == "14"
    assert after["NCCL_DEBUG"] == "WARN"  # INFO becomes WARN: unset, NCCL logs nothing
    assert (
        "# rank 3's CPU budget: OMP_NUM_THREADS=14 (the training process's own thread and 13 "
        "more) + 2 DataLoader worker(s) + 1 pin-memory thread = 17 of the rank's 28 CPU(s) "
        "(intra-op threads at most one per physical core, 14: two on one core share its "
        "execution units; the SMT siblings take the workers and the pin-memory thread); "
        "DataLoader(num_workers=2, pin_memory=True) in the script"
    ) in done.stdout.splitlines()
    every = run(*dgx_faulty.cli_args, "tune", env=calling).stdout.splitlines()
    assert sum("CPU budget" in line for line in every) == 1
    assert any(line.startswith("# every rank's CPU budget: OMP_NUM_THREADS=14") for line in every)


def test_env_output_read_by_systemd(dgx: Node, tmp_path: Path) -> None:
    """systemd's own env-file parser (via its environment.d generator) reads the file."""
    done = run(*dgx.cli_args, "tune", "--format", "env", "--nodes", "16", "--local-rank", "0")
    assert done.returncode == 0, done.stderr
    parsed = systemd_reads(done.stdout, tmp_path)
    doc = document(dgx, "--nodes", "16", "--local-rank", "0")
    expected = {**doc["env"], **doc["ranks"][0]["env"]}
    assert {name: parsed.get(name) for name in expected} == expected


def test_env_file_quoting_survives_systemd(tmp_path: Path) -> None:
    awkward = 'a b "c" \\d `e` #f ;g'
    plan = Plan("n", [Recommendation("AWKWARD", awkward, "r", "s")], [], [], [], [])
    assert systemd_reads(render_env(plan, None), tmp_path)["AWKWARD"] == awkward
    assert env_file_value("a$HOME") == '"a\\$HOME"'  # no expansion by EnvironmentFile=
    with pytest.raises(ValueError, match="not a single-line"):
        env_file_value("a\nB=c")


def systemd_reads(text: str, tmp_path: Path) -> dict[str, str]:
    assert ENVIRONMENT_D_GENERATOR.exists(), "the systemd package is missing: run make"
    directory = tmp_path / "config" / "environment.d"
    directory.mkdir(parents=True)
    (directory / "50-nodecheck.conf").write_text(text)
    out = subprocess.run(
        [str(ENVIRONMENT_D_GENERATOR)],
        env={"XDG_CONFIG_HOME": str(tmp_path / "config")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # It prints each variable as NAME=value, a value with other characters in double
    # quotes with \ before each of "\`$ (systemd's SHELL_NEED_ESCAPE).
    parsed = {}
    for line in filter(None, out.splitlines()):
        name, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r'\\(["\\`$])', r"\1", value[1:-1])
        parsed[name] = value
    return parsed


def test_bad_local_rank(dgx: Node, build: Callable[..., Node]) -> None:
    done = run(*dgx.cli_args, "tune", "--local-rank", "8")
    assert done.returncode == 2
    assert done.stderr == "nodecheck: --local-rank 8: this node has 8 GPU rank(s), 0-7\n"
    cpu_only = build("cpu-only")
    done = run(*cpu_only.cli_args, "tune", "--format", "text")
    assert done.returncode == 0 and "no NVIDIA GPU on this node" in done.stdout


# nodecheck exec -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def box(scratch_dir: Path) -> Node:
    """Two GPUs on one NUMA node with this machine's first two CPUs: rank 0 gets CPU 0,
    rank 1 CPU 1, and both can be applied here."""
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")
    if not Path("/sys/devices/system/node/node0").is_dir():
        pytest.skip("needs NUMA node 0 for --membind=0")
    root = scratch_dir / "two-gpu-box"
    return Node(root) if root.exists() else build_two_gpu_box(root)


@pytest.fixture
def numactl() -> Iterator[str]:
    path = shutil.which("numactl")
    assert path is not None, "numactl is missing: run make (it installs the Debian packages)"
    yield path


def exec_report(
    node: Node, tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    report = tmp_path / "report.json"
    done = run(
        *node.cli_args, "exec", *args, "--", sys.executable, "-c", REPORT, str(report), env=env
    )
    assert done.returncode == 0, done.stderr
    parsed: dict[str, object] = json.loads(report.read_text())
    return done, parsed


@pytest.mark.parametrize("rank", [0, 1])
def test_exec_binds_the_child(box: Node, numactl: str, tmp_path: Path, rank: int) -> None:
    """The child runs on its rank's CPU with memory bound to node 0 and the rank's
    environment. A value the checks fail (P2P off between two GPUs) is removed; one they
    only warn about (NCCL_DEBUG=INFO, often set on purpose) is the user's to keep."""
    calling = {"NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1"}
    done, child = exec_report(box, tmp_path, env={"LOCAL_RANK": str(rank), **calling})
    assert child["affinity"] == [rank]
    assert child["policy"] == "bind:0"  # numactl --membind=0
    env = child["env"]
    assert isinstance(env, dict)
    # exec reads CMD's environment (this venv's torch); tune is told it with --python.
    doc = document(box, "--local-rank", str(rank), "--python", sys.executable, env=calling)
    expected = {**doc["env"], **doc["ranks"][0]["env"], "NCCL_DEBUG": "INFO"}  # kept
    assert {name: env.get(name) for name in expected} == expected
    assert expected["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "NCCL_P2P_DISABLE" not in env and env["NCCL_DEBUG"] == "INFO"
    assert f"local rank {rank} -> GPU" in done.stderr and "through numactl" in done.stderr
    assert "unset NCCL_P2P_DISABLE" in done.stderr and "kept your NCCL_DEBUG" in done.stderr
    # One CPU for the rank: how its budget was split, and the DataLoader line for the script.
    assert (
        "CPU budget: OMP_NUM_THREADS=1 (the training process's own thread alone) + no "
        "DataLoader worker (too few CPUs: batches load in the process) = 1 of the rank's 1 "
        "CPU(s): DataLoader(num_workers=0, pin_memory=True) in the script"
    ) in done.stderr
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


def test_exec_widens_a_narrowed_affinity(box: Node, numactl: str, tmp_path: Path) -> None:
    """Started on CPU 0 only (srun --cpu-bind, taskset): rank 1 still runs on CPU 1."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            *(*NODECHECK, *box.cli_args, "exec", "--local-rank", "1"),
            *("--", sys.executable, "-c", REPORT, str(report)),
        ],
        env=subprocess_env(),
        preexec_fn=lambda: os.sched_setaffinity(0, {0}),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text())["affinity"] == [1]


def test_exec_without_numactl(box: Node, tmp_path: Path) -> None:
    """numactl not on PATH: the CPU affinity alone, and it says so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "nodecheck.agent", *box.cli_args),
            *("exec", "--local-rank", "1", "--", "python3", "-c", REPORT, str(report)),
        ],
        env={
            "PATH": str(bin_dir),
            **({"PYTHONPATH": p} if (p := os.environ.get("PYTHONPATH")) else {}),
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    child = json.loads(report.read_text())
    assert child["affinity"] == [1] and child["policy"] != "bind:0"
    assert "numactl is not installed: CPU affinity only" in done.stderr


def test_exec_rank_from_slurm(box: Node, numactl: str, tmp_path: Path) -> None:
    """Plain srun: its SLURM_LOCALID, handed on as LOCAL_RANK (torch reads that one)."""
    done, child = exec_report(box, tmp_path, "--quiet", env={"SLURM_LOCALID": "1"})
    assert child["affinity"] == [1]
    env = child["env"]
    assert isinstance(env, dict) and env["LOCAL_RANK"] == "1"
    assert "warning" not in done.stderr


@pytest.mark.parametrize(
    "variable",
    ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"],
)
def test_exec_under_mpirun_in_a_batch_step_takes_the_mpi_rank(
    box: Node, numactl: str, tmp_path: Path, variable: str
) -> None:
    """mpirun inside sbatch: every rank carries the batch step's SLURM_LOCALID=0; the MPI
    launcher's own variable is the rank's, and the disagreement is said, naming both."""
    done, child = exec_report(box, tmp_path, "--quiet", env={"SLURM_LOCALID": "0", variable: "1"})
    assert child["affinity"] == [1]
    env = child["env"]
    assert isinstance(env, dict) and env["LOCAL_RANK"] == "1"
    assert (
        f"nodecheck exec: warning: local rank 1 from {variable}, but SLURM_LOCALID=0 says "
        "otherwise (an mpirun inside a Slurm batch step hands it the step's SLURM_LOCALID)"
    ) in done.stderr


def test_local_rank_order_and_its_warnings() -> None:
    assert local_rank_from(None, {"LOCAL_RANK": "3", "SLURM_LOCALID": "3"}) == LocalRank(
        3, "LOCAL_RANK"
    )
    taken = local_rank_from(None, {"LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "5"})
    assert (taken.rank, taken.source) == (2, "LOCAL_RANK")
    assert taken.warning == (
        "local rank 2 from LOCAL_RANK, but OMPI_COMM_WORLD_LOCAL_RANK=5 says otherwise"
    )
    given = local_rank_from(4, {"SLURM_LOCALID": "0"})
    assert (given.rank, given.source) == (4, "--local-rank") and "SLURM_LOCALID=0" in given.warning
    # a stray value in a variable not taken does not stop the launch
    assert local_rank_from(1, {"LOCAL_RANK": "x"}).rank == 1
    assert local_rank_from(None, {"LOCAL_RANK": "1", "SLURM_LOCALID": "y"}).rank == 1


@pytest.mark.parametrize(
    ("args", "env", "code", "message"),
    [
        ([], {"LOCAL_RANK": "0"}, 2, "no command"),
        (["--", "true"], {}, 2, "no local rank: pass --local-rank N"),
        (["--", "true"], {"LOCAL_RANK": "one"}, 2, "LOCAL_RANK is set but is not a local rank"),
        (["--local-rank", "2", "--", "true"], {}, 2, "no GPU for local rank 2: this node has 2"),
        (["--local-rank", "0", "--", "no-such-command-x"], {}, 127, "command not found"),
    ],
)
def test_exec_errors(
    box: Node, args: list[str], env: dict[str, str], code: int, message: str
) -> None:
    done = run(*box.cli_args, "exec", *args, env=env)
    assert done.returncode == code, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["file without the execute bit", "directory"])
@pytest.mark.parametrize("named", ["by path", "on PATH"])
def test_exec_of_something_that_cannot_be_run_is_126(
    box: Node, tmp_path: Path, kind: str, named: str
) -> None:
    """Found but not runnable: 126 "cannot be run: <why>", as the help promises and a shell
    says; it was 127 "command not found". A directory on PATH is passed over, as execvp
    does: still 127 there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    target = bin_dir / "train"
    if kind == "directory":
        target.mkdir()
    else:
        target.write_text("#!/bin/sh\necho should not run\n")
        target.chmod(0o644)
    command = str(target) if named == "by path" else "train"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = run(*box.cli_args, "exec", "--local-rank", "0", "--", command, env=env)
    why = "a directory" if kind == "directory" else "no execute permission"
    if named == "on PATH" and kind == "directory":
        assert done.returncode == 127, done.stderr
        assert done.stderr == "nodecheck exec: train: command not found\n"
        return
    assert done.returncode == 126, done.stderr
    shown = f"{target}: {why}" if named == "on PATH" else why
    assert done.stderr == f"nodecheck exec: {command}: cannot be run: {shown}\n"
    assert done.stdout == ""


def test_exec_on_a_node_without_gpus(build: Callable[..., Node]) -> None:
    done = run(*build("cpu-only").cli_args, "exec", "--local-rank", "0", "--", "true")
    assert done.returncode == 2
    assert done.stderr == (
        "nodecheck exec: no GPU for local rank 0: no NVIDIA GPU on this node: no ranks to "
        "bind, and no GPU settings\n"
    )


def test_exec_under_torchrun(box: Node, numactl: str, tmp_path: Path) -> None:
    """torchrun --no-python ... nodecheck exec -- CMD: each worker bound to its own CPU."""
    pytest.importorskip("torch")
    nodecheck = Path(sys.executable).with_name("nodecheck")
    assert nodecheck.exists()
    reports = tmp_path / "reports"
    reports.mkdir()
    child = (
        "import json, os\n"
        "json.dump({'affinity': sorted(os.sched_getaffinity(0)), 'env': dict(os.environ)},\n"
        f"          open('{reports}/' + os.environ['LOCAL_RANK'] + '.json', 'w'))\n"
    )
    done = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
            *("--nproc-per-node", "2", "--no-python", str(nodecheck), *box.cli_args),
            *("exec", "--quiet", "--", sys.executable, "-c", child),
        ],
        env=subprocess_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for rank in (0, 1):
        seen = json.loads((reports / f"{rank}.json").read_text())
        assert seen["affinity"] == [rank]
        assert seen["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert seen["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_exec_keeps_what_the_user_set_and_works(dgx: Node) -> None:
    """exec replaces what the checks fail and fills in what is unset; a working choice of
    the user's (an interface, a protocol workaround, debug logging) stays."""
    calling = {
        "NCCL_SOCKET_IFNAME": "=ibp25s0",  # works, though not the default route's eno1
        "NCCL_PROTO": "^LL128",  # NCCL's documented workaround for a suspected bug
        "NCCL_DEBUG": "INFO",
        "NCCL_P2P_DISABLE": "1",  # fails: 8 NVLink GPUs
        "OMP_NUM_THREADS": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:true",  # torch would abort
        "NCCL_IB_HCA": "mlx5",  # a prefix (a warning): the user's
    }
    plan = make_plan(
        with_parts(dgx.context(calling), torch_version=TORCH_2_13, job_versions=JOB_TORCH_2_13),
        TuneOptions(),
    )
    rank = plan.rank(2)
    assert rank is not None
    env, changed, removed, kept = applied_environment(plan, rank, calling)
    assert env["NCCL_SOCKET_IFNAME"] == "=ibp25s0" and env["NCCL_PROTO"] == "^LL128"
    assert env["NCCL_DEBUG"] == "INFO" and "NCCL_P2P_DISABLE" not in env
    assert env["OMP_NUM_THREADS"] == "14"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert removed == ["NCCL_P2P_DISABLE"]
    # The working interface is no advice to weigh at all: tune keeps it, as check passes it.
    assert sorted(kept) == ["NCCL_DEBUG", "NCCL_IB_HCA", "NCCL_PROTO"]
    assert "NCCL_SOCKET_IFNAME" not in changed
    assert env["NCCL_IB_HCA"] == "mlx5"
    assert {"CUDA_DEVICE_ORDER", "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF"} <= set(changed)
    # gloo goes where the kept NCCL_SOCKET_IFNAME goes, not to nodecheck's own eno1: the
    # user may have chosen ibp25s0 because eno1 does not reach the other nodes.
    assert env["GLOO_SOCKET_IFNAME"] == "ibp25s0" and "GLOO_SOCKET_IFNAME" in changed
    # An interface that does not exist is no choice to keep.
    broken = {**calling, "NCCL_SOCKET_IFNAME": "eth9"}
    plan = make_plan(
        with_parts(dgx.context(broken), torch_version=TORCH_2_13, job_versions=JOB_TORCH_2_13),
        TuneOptions(),
    )
    env, *_ = applied_environment(plan, plan.ranks[0], broken)
    assert env["NCCL_SOCKET_IFNAME"] == "eno1"
    # An allocator setting torch accepts is the user's too: exec does not add to it.
    own = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    plan = make_plan(
        with_parts(dgx.context(own), torch_version=TORCH_2_13, job_versions=JOB_TORCH_2_13),
        TuneOptions(),
    )
    env, changed, _, kept = applied_environment(plan, plan.ranks[0], own)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"
    assert "PYTORCH_CUDA_ALLOC_CONF" in kept and "PYTORCH_ALLOC_CONF" not in [*env, *changed]


# Bindings that can always run, through the commands ------------------------------------


@pytest.fixture(scope="module")
def no_cpu_info(scratch_dir: Path) -> Node:
    """Two GPUs on a node whose devices/system/cpu could not be read at all."""
    root = scratch_dir / "no-cpu-info"
    if not root.exists():
        build_node(placed_gpus_spec([0, 1]), root)
        shutil.rmtree(root / "sys" / "devices" / "system" / "cpu")
    return Node(root)


def test_tune_never_prints_an_empty_binding(no_cpu_info: Node) -> None:
    """Every rank is an error with its reason in JSON, text and shell; nothing says
    `--physcpubind=` with nothing after it, or OMP_NUM_THREADS=0."""
    doc = document(no_cpu_info)
    assert [r["status"] for r in doc["ranks"]] == ["error", "error"]
    for rank in doc["ranks"]:
        assert rank["cpus"] == [] and rank["numactl"] is None and rank["env"] == {}
        assert rank["dataloader"] is None
        assert rank["error"].startswith("no CPU to bind it to: no online CPU could be read")
    outputs = [json.dumps(doc)]
    for output_format in ("text", "shell", "env"):
        done = run(*no_cpu_info.cli_args, "tune", "--format", output_format)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        outputs.append(done.stdout)
        # Each rank's error once, on its own line: not again among the notes.
        assert done.stdout.count("no CPU to bind it to") == 2, done.stdout
        assert "do not run it here (nodecheck exec refuses): no CPU to bind it to" in done.stdout
    for output in outputs:
        assert not re.search(r"physcpubind=(?![0-9])", output), output
        assert "OMP_NUM_THREADS=0" not in output and '"OMP_NUM_THREADS": "0"' not in output


@pytest.mark.parametrize("output_format", ["shell", "env", "json", "text"])
def test_tune_for_a_rank_that_must_not_run_exits_2(no_cpu_info: Node, output_format: str) -> None:
    """--local-rank N naming a rank exec refuses (here: no CPU to run on) exits 2 with the
    reason on stderr, in every format; shell and env output set nothing for it."""
    done = run(*no_cpu_info.cli_args, "tune", "--format", output_format, "--local-rank", "1")
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("nodecheck tune: local rank 1: no CPU to bind it to: no online CPU")
    lines = done.stdout.splitlines()
    if output_format == "shell":
        assert [x for x in lines if not x.startswith("#")] == [
            "echo 'nodecheck tune: local rank 1 must not run here: stopping' >&2",
            "(exit 2)",
        ]
        assert any(x.startswith("# rank 1: do not run it here") for x in lines)
    if output_format == "env":
        assert all(x.startswith("#") for x in lines), lines
    if output_format == "json":
        assert [r["status"] for r in json.loads(done.stdout)["ranks"]] == ["error"]


def evaluated(tune_output: str, tmp_path: Path, launcher: str) -> subprocess.CompletedProcess[str]:
    """bash running `launcher`, in which `nodecheck_tune` prints `tune_output` (as the
    command substitution of a launcher script gets it)."""
    script = tmp_path / "tune.sh"
    script.write_text(tune_output)
    return subprocess.run(
        [
            "bash",
            "--noprofile",
            "--norc",
            "-c",
            f"nodecheck_tune() {{ cat {script}; }}; {launcher}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_launcher_evaluating_tune_stops_at_a_rank_that_must_not_run(
    no_cpu_info: Node, dgx_faulty: Node, tmp_path: Path
) -> None:
    """`eval "$(nodecheck tune --local-rank $LOCAL_RANK)"` loses nodecheck's status; the
    evaluated text fails by itself: a `set -e` launcher stops before its command (saying
    so on its stderr; the reason is in the comments and on nodecheck's stderr), `eval ...
    || exit` sees 2, and the shell itself is not exited.
    Also for the rank of the GPU that fell off the bus (CUDA cannot drive it); a rank
    that can run evaluates to 0 and the launcher goes on."""
    marker = tmp_path / "launched"
    launcher = f'set -e; eval "$(nodecheck_tune)"; touch {marker}'
    for node, rank, reason in (
        (no_cpu_info, "0", "no CPU to bind it to"),
        (dgx_faulty, "7", "GPU 0000:bc:00.0 does not answer on the PCI bus"),
    ):
        done = run(*node.cli_args, "tune", "--format", "shell", "--local-rank", rank)
        assert done.returncode == 2, done.stderr
        stopped = evaluated(done.stdout, tmp_path, launcher)
        assert stopped.returncode == 2 and not marker.exists(), stopped.stderr
        assert stopped.stderr == f"nodecheck tune: local rank {rank} must not run here: stopping\n"
        assert (
            f"# rank {rank}: do not run it here (nodecheck exec refuses): {reason}" in done.stdout
        )
        checked = evaluated(done.stdout, tmp_path, 'eval "$(nodecheck_tune)"; echo "status $?"')
        assert checked.stdout == "status 2\n", checked
    runs = run(*dgx_faulty.cli_args, "tune", "--format", "shell", "--local-rank", "3")
    assert runs.returncode == 0, runs.stderr
    launched = evaluated(runs.stdout, tmp_path, launcher)
    assert launched.returncode == 0 and marker.exists(), launched.stderr


def test_exec_refuses_a_rank_without_cpus(no_cpu_info: Node, tmp_path: Path) -> None:
    """exit 2 and one line saying why; the command never starts (it used to die in
    sched_setaffinity with exit 1, or run numactl --physcpubind= with nothing)."""
    started = tmp_path / "started"
    done = run(
        *no_cpu_info.cli_args,
        *("exec", "--local-rank", "1", "--", sys.executable, "-c"),
        *(f"open({str(started)!r}, 'w')",),
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("nodecheck exec: local rank 1: no CPU to bind it to: no online CPU")
    assert not started.exists()


def test_tune_keeps_each_rank_inside_a_cpuset_mounted_elsewhere(tmp_path: Path) -> None:
    """A Slurm step whose cgroup2 is mounted at /cgroup/unified (mountinfo), with /sys/fs/
    cgroup holding a wider decoy: every rank stays inside the step's CPUs 1,2,5."""
    root = tmp_path / "slurm-node"
    spec = placed_gpus_spec([0, 1])
    step = "uid_2008/job_15389/step_0"
    spec.proc_files |= {
        "self/mountinfo": "41 25 0:38 / /cgroup/unified rw,relatime - cgroup2 none rw\n",
        "self/cgroup": f"0::/{step}\n",
    }
    spec.files |= {
        "/cgroup/unified/cgroup.controllers": "cpuset cpu memory\n",
        f"/cgroup/unified/{step}/cpuset.cpus.effective": "1-2,5\n",
        f"/sys/fs/cgroup/{step}/cpuset.cpus.effective": "0-7\n",
    }
    build_node(spec, root)
    ranks = document(Node(root))["ranks"]
    assert [r["cpus"] for r in ranks] == [[1, 2], [5]]
    assert [r["status"] for r in ranks] == ["ok", "ok"]


def test_exec_refuses_a_memory_node_this_machine_lacks(numactl: str, tmp_path: Path) -> None:
    """A tree read with --sysfs-root whose rank 1 is bound to a NUMA node this process may
    not allocate on (not in /proc/self/status Mems_allowed_list): one line and exit 1, the
    command never started (numactl used to print its whole usage text)."""
    status = Path("/proc/self/status").read_text()
    [mems] = [line.split(":", 1)[1] for line in status.splitlines() if "Mems_allowed_list" in line]
    missing = max(int(part) for part in re.split(r"[,-]", mems.strip())) + 1
    if missing >= len(os.sched_getaffinity(0)):
        pytest.skip(f"needs CPU {missing} in this process's affinity")
    root = tmp_path / "far-node"
    # One CPU a socket: the GPU on node `missing` gets CPU `missing`, which exists here.
    build_node(placed_gpus_spec([0, missing], sockets=missing + 1, cores=1), root)
    started = tmp_path / "started"
    done = run(
        *Node(root).cli_args,
        *("exec", "--local-rank", "1", "--", sys.executable, "-c"),
        *(f"open({str(started)!r}, 'w')",),
    )
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("nodecheck exec: local rank 1: numactl cannot apply this binding")
    assert f"--membind={missing} names a NUMA node this process may not allocate on" in line
    assert not started.exists()


# CUDA_VISIBLE_DEVICES by UUID, twice, or naming no GPU: tune and exec on the replica ----

# GPU 5 of the 8-GPU replica, 0000:9c:00.0 on NUMA node 1, as its information file names it.
GPU5_UUID = "GPU-6f0c0005-1b2e-4d5c-9a7b-00000000009c"
NODE1_CPULIST = "56-111,168-223"


def test_tune_binds_a_gpu_named_by_uuid_next_to_it(dgx: Node) -> None:
    doc = document(dgx, env={"CUDA_VISIBLE_DEVICES": GPU5_UUID})
    [rank] = doc["ranks"]
    assert (rank["gpu"], rank["numa_node"], rank["cpulist"]) == ("0000:9c:00.0", 1, NODE1_CPULIST)
    assert rank["numactl"] == ["numactl", f"--physcpubind={NODE1_CPULIST}", "--membind=1"]
    assert rank["status"] == "ok" and rank["nics"][0] == "mlx5_5"
    assert any("is GPU 0000:9c:00.0, by its UUID" in note for note in doc["notes"])


def test_exec_binds_a_rank_named_by_a_uuid_prefix_next_to_its_gpu(dgx: Node, numactl: str) -> None:
    """exec's command line for the rank (in-process: the replica's CPUs are not this
    machine's, so the child could not be started on them here)."""
    environ = {"CUDA_VISIBLE_DEVICES": "GPU-6f0c0005", "PATH": os.environ["PATH"]}
    plan = make_plan(with_parts(dgx.context(environ), torch_version=TORCH_2_13), TuneOptions())
    launch = prepare(plan, rank_plan_for(plan, 0), ["true"], environ)
    assert launch.argv == [numactl, f"--physcpubind={NODE1_CPULIST}", "--membind=1", "--", "true"]
    assert "local rank 0 -> GPU 0000:9c:00.0, NUMA node 1" in launch.summary
    assert launch.warnings == ()


def test_exec_warns_the_ranks_before_an_unknown_entry(dgx: Node) -> None:
    environ = {"CUDA_VISIBLE_DEVICES": f"{GPU5_UUID},GPU-deadbeef", "PATH": os.environ["PATH"]}
    plan = make_plan(with_parts(dgx.context(environ), torch_version=TORCH_2_13), TuneOptions())
    launch = prepare(plan, rank_plan_for(plan, 0), ["true"], environ)
    assert launch.warnings == (
        "CUDA_VISIBLE_DEVICES entry 2 ('GPU-deadbeef') is the UUID of no GPU here: CUDA stops "
        "there and sees only the 1 GPU(s) before it (local rank 0); a rank past them has no "
        "GPU (nodecheck exec refuses such a rank)",
    )


STOPPED = (
    "CUDA_VISIBLE_DEVICES entry 2 ('GPU-deadbeef') is the UUID of no GPU here: CUDA stops "
    "there and sees only the 1 GPU(s) before it (local rank 0); a rank past them has no GPU"
)
TWICE = (
    "CUDA_VISIBLE_DEVICES names GPU 0000:9c:00.0 twice, {}: CUDA then enumerates no GPU at "
    "all (the driver as PyTorch models it, torch/cuda/__init__.py: a repeated device leaves an "
    "empty set), and were it to enumerate both, two ranks would drive one GPU bound to the "
    "same CPUs; name each GPU once: no ranks to bind"
)


@pytest.mark.parametrize(
    ("visible", "rank", "message"),
    [
        ("5,5", 0, TWICE.format("entry 1 ('5') and entry 2 ('5')")),
        ("5,5", 1, TWICE.format("entry 1 ('5') and entry 2 ('5')")),
        (
            f"GPU-6f0c0005,{GPU5_UUID}",
            0,
            TWICE.format(f"entry 1 ('GPU-6f0c0005') and entry 2 ('{GPU5_UUID}')"),
        ),
        (
            "GPU-deadbeef",
            0,
            "CUDA_VISIBLE_DEVICES entry 1 ('GPU-deadbeef') is the UUID of no GPU here: CUDA "
            "stops there and sees no GPU: no ranks to bind",
        ),
        (
            "GPU-6f0c000",
            0,
            "CUDA_VISIBLE_DEVICES entry 1 ('GPU-6f0c000') begins the UUIDs of GPUs "
            "0000:18:00.0, 0000:1a:00.0, 0000:3a:00.0, 0000:3c:00.0, 0000:9a:00.0, "
            "0000:9c:00.0, 0000:ba:00.0, 0000:bc:00.0, and CUDA needs enough of a UUID to name "
            "one GPU: CUDA stops there and sees no GPU: no ranks to bind",
        ),
    ],
)
def test_exec_refuses_a_gpu_named_twice_or_no_gpu_at_all(
    dgx: Node, visible: str, rank: int, message: str
) -> None:
    done = run(
        *dgx.cli_args,
        *("exec", "--local-rank", str(rank), "--", "true"),
        env={"CUDA_VISIBLE_DEVICES": visible},
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"nodecheck exec: no GPU for local rank {rank}: {message}\n"


def assert_rank_1_refused(node: Node, env: dict[str, str], stop: str) -> None:
    """`exec` and `tune --local-rank 1` exit 2 with one line saying where CUDA stopped."""
    done = run(*node.cli_args, "exec", "--local-rank", "1", "--", "true", env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"nodecheck exec: no GPU for local rank 1: this node has 1 visible (local ranks 0-0): "
        f"{stop}\n"
    )
    done = run(*node.cli_args, "tune", "--local-rank", "1", env=env)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"nodecheck: --local-rank 1: this node has 1 GPU rank(s), 0-0: {stop}\n"


def test_exec_and_tune_refuse_a_rank_past_an_unknown_entry(dgx: Node) -> None:
    env = {"CUDA_VISIBLE_DEVICES": f"{GPU5_UUID},GPU-deadbeef"}
    assert_rank_1_refused(dgx, env, STOPPED)
    doc = document(dgx, env=env)
    [rank] = doc["ranks"]
    assert rank["status"] == "warn" and rank["warning"].startswith(STOPPED)


MIG_A = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
MIG_B = "MIG-0f9e8d7c-0000-5000-8000-000000000001"
SECOND_MIG = (
    f"CUDA_VISIBLE_DEVICES entry 2 ('{MIG_B}') is a second MIG device, and CUDA enumerates "
    'one MIG device per process (NVIDIA\'s MIG user guide, "CUDA Device Enumeration"), '
    "entry 1's: CUDA stops there and sees only the 1 GPU(s) before it (local rank 0); a rank "
    "past them has no GPU"
)


def test_exec_and_tune_refuse_rank_1_on_a_second_mig_device(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """CUDA_VISIBLE_DEVICES=MIG-a,MIG-b: CUDA enumerates MIG-a only, so rank 1's
    torch.cuda.set_device(1) fails: exec and tune refuse it as they refuse an index list's
    rank past its GPUs; rank 0 runs on GPU 5 (whose MIG instances the driver lists), warned."""
    node = copy_node(dgx)
    add_mig_instances(node.root, minor=5, count=2)
    env = {"CUDA_VISIBLE_DEVICES": f"{MIG_A},{MIG_B}"}
    assert_rank_1_refused(node, env, SECOND_MIG)
    environ = {**env, "PATH": os.environ["PATH"]}
    plan = make_plan(with_parts(node.context(environ), torch_version=TORCH_2_13), TuneOptions())
    launch = prepare(plan, rank_plan_for(plan, 0), ["true"], environ)
    assert "local rank 0 -> GPU 0000:9c:00.0, NUMA node 1" in launch.summary
    [warning] = launch.warnings  # with the MIG note: GPU 5 holds two instances
    assert warning.endswith(f"; {SECOND_MIG} (nodecheck exec refuses such a rank)")


def test_exec_refuses_a_uuid_prefix_that_may_be_ambiguous(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """GPU 7's information file is empty: GPU-6f0c0001 begins GPU 1's UUID and may begin
    GPU 7's unknown one: could not determine, never a guessed GPU (exit 2)."""
    node = copy_node(dgx)
    (node.root / "proc/driver/nvidia/gpus/0000:bc:00.0/information").write_text("")
    env = {"CUDA_VISIBLE_DEVICES": "GPU-6f0c0001"}
    done = run(*node.cli_args, "exec", "--local-rank", "0", "--", "true", env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "nodecheck exec: no GPU for local rank 0: nodecheck cannot tell which GPU "
        "CUDA_VISIBLE_DEVICES entry 1 ('GPU-6f0c0001') names: it begins GPU 0000:1a:00.0's "
        "UUID, but the UUID of GPU 0000:bc:00.0 is not known"
    )
    assert done.stderr.count("\n") == 1


def test_exec_help_lists_every_exit_status() -> None:
    done = run("exec", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "1 when the kernel refuses the rank's CPUs or numactl could not apply" in text
    assert "126 when CMD cannot be run; 127 when CMD is not found" in text


def test_smt_siblings_by_default_and_left_out_when_told(dgx: Node) -> None:
    """Each rank gets its cores' SMT siblings unless --no-smt-siblings; --with-smt-siblings
    still says the default."""
    default = document(dgx)["ranks"][0]
    assert default["cpulist"] == "0-13,112-125" and default["env"] == {"OMP_NUM_THREADS": "14"}
    assert document(dgx, "--with-smt-siblings")["ranks"][0]["cpulist"] == "0-13,112-125"
    lean = document(dgx, "--no-smt-siblings")["ranks"][0]
    assert lean["cpulist"] == "0-13" and lean["env"] == {"OMP_NUM_THREADS": "11"}
    assert lean["cpu_budget"]["split"].endswith("= 14 of the rank's 14 CPU(s)")


def test_a_debug_level_in_nccl_conf_is_changed_not_removed(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """NCCL_DEBUG=INFO in /etc/nccl.conf: the table says change it to WARN there, and the
    shell output, which exports WARN for this shell, still names the file's line to fix."""
    node = copy_node(dgx)
    (node.root / "etc" / "nccl.conf").write_text("NCCL_DEBUG=INFO\n")
    text = run(*node.cli_args, "tune", "--format", "text").stdout
    assert "  change  NCCL_DEBUG=INFO to WARN  (found in /etc/nccl.conf" in text
    shell = run(*node.cli_args, "tune", "--format", "shell").stdout
    lines = shell.splitlines()
    assert "export NCCL_DEBUG=WARN" in lines
    [comment] = [line for line in lines if line.startswith("# NCCL_DEBUG=INFO:")]
    assert "/etc/nccl.conf" in comment and "WARN" in comment
