"""Faults around `nodecheck tune` and `nodecheck exec`: a caller's environment that holds
values nodecheck must never repeat, and GPUs CUDA cannot drive (fallen off the bus, bound
to vfio-pci or to no driver, a config space that cannot be read). Each test runs the real
command as a subprocess on a replica tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_cli import run
from tests.conftest import Node
from tests.fixtures.nodegen import build_node
from tests.fixtures.nodes import two_gpu_box

# Values a caller might hold in variables nodecheck does not audit (NCCL_*, TORCH_*,
# PYTORCH_*, CUDA_* are audited): none of them may appear in anything nodecheck prints.
SENTINELS = {
    "OMP_NUM_THREADS": "SENTINEL-omp",
    "SLURM_JOB_NUM_NODES": "SENTINEL-slurm-nodes",
    "SLURM_NNODES": "SENTINEL-slurm-nnodes",
    "WORLD_SIZE": "SENTINEL-world",
    "LOCAL_WORLD_SIZE": "SENTINEL-local-world",
    "SLURM_STEP_GPUS": "SENTINEL-step-gpus",
    "SLURM_JOB_GPUS": "SENTINEL-job-gpus",
    "MASTER_ADDR": "SENTINEL-master",
    "RANK": "SENTINEL-rank",
}
FALLEN_OFF = (
    "GPU 0000:bc:00.0 does not answer on the PCI bus (fallen off?): drain the node; CUDA will "
    "not see it, so local ranks after it would shift"
)
FIRST_GPU = "0000:01:00.0"  # the two-GPU box's first GPU: local rank 0


def leaked(text: str) -> list[str]:
    return [value for value in SENTINELS.values() if value in text]


def tune_json(node: Node, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = run(*node.cli_args, "tune", "--format", "json", *args, env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


@pytest.mark.parametrize("output_format", ["text", "shell", "env", "json"])
@pytest.mark.parametrize("rank_args", [[], ["--local-rank", "3"]], ids=["all-ranks", "rank-3"])
def test_tune_says_a_caller_variable_is_set_never_its_value(
    dgx: Node, output_format: str, rank_args: list[str]
) -> None:
    """OMP_NUM_THREADS, Slurm's and torchrun's sizes set to anything: tune says they are set
    and what it recommends, in every format, and no value of theirs appears anywhere."""
    done = run(*dgx.cli_args, "tune", "--format", output_format, *rank_args, env=SENTINELS)
    assert done.returncode == 0, done.stderr
    assert leaked(done.stdout + done.stderr) == []
    output = done.stdout.replace("\n    ", " ").replace("\n", " ")
    assert "SLURM_JOB_NUM_NODES, SLURM_NNODES, WORLD_SIZE, LOCAL_WORLD_SIZE set but not a" in output
    if output_format == "text":
        assert "OMP_NUM_THREADS=" in output and "(set by the caller, nodecheck sets this)" in output
    if output_format == "json":
        [omp] = json.loads(done.stdout)["ranks"][0]["recommendations"]
        assert omp["name"] == "OMP_NUM_THREADS" and omp["action"] == "change"
        assert omp["current"] is None and omp["is_set"] is True and omp["value"] == "14"


@pytest.mark.parametrize(
    "variable", ["LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"]
)
def test_exec_names_a_bad_launcher_rank_without_its_value(dgx: Node, variable: str) -> None:
    """A launcher's rank variable that is not a number: exit 2, naming the variable, never
    repeating what it holds."""
    done = run(*dgx.cli_args, "exec", "--", "true", env={variable: "SENTINEL-rank-value"})
    assert done.returncode == 2
    assert done.stderr == (
        f"nodecheck exec: {variable} is set but is not a local rank (a non-negative "
        "integer): pass --local-rank N\n"
    )


def test_tune_flags_the_gpu_that_fell_off_the_bus(dgx_faulty: Node) -> None:
    """GPU 0000:bc:00.0's config space reads all ones: its rank is marked "do not run" with
    the reason and the node gets the note, in JSON and text; the ranks before it are bound
    as before (CUDA numbers them the same)."""
    document = tune_json(dgx_faulty)
    ranks = {rank["gpu"]: rank for rank in document["ranks"]}
    assert ranks["0000:bc:00.0"]["refusal"] == FALLEN_OFF
    assert FALLEN_OFF in document["notes"]
    others = [rank for gpu, rank in ranks.items() if gpu != "0000:bc:00.0"]
    assert len(others) == 7 and all("refusal" not in rank for rank in others)
    assert all("warning" not in rank for rank in others)
    text = run(*dgx_faulty.cli_args, "tune", "--format", "text").stdout
    assert "0000:bc:00.0 (unusable: do not run)" in text
    assert "rank 7: do not run it here (nodecheck exec refuses): GPU 0000:bc:00.0" in text


def test_exec_refuses_the_rank_of_the_gpu_that_fell_off_the_bus(
    dgx_faulty: Node, tmp_path: Path
) -> None:
    """exec for local rank 7 on the faulty replica: exit 2 with the reason, and the command
    never starts."""
    started = tmp_path / "started"
    done = run(
        *dgx_faulty.cli_args,
        *("exec", "--local-rank", "7", "--", sys.executable, "-c"),
        *(f"open({str(started)!r}, 'w')",),
    )
    assert done.returncode == 2
    assert done.stderr == f"nodecheck exec: local rank 7: {FALLEN_OFF}\n"
    assert not started.exists()


@pytest.fixture
def box(tmp_path: Path) -> Node:
    """A private two-GPU box sized to this machine (rank 0 on CPU 0, rank 1 on CPU 1), for a
    test to damage."""
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")
    if not Path("/sys/devices/system/node/node0").is_dir():
        pytest.skip("needs NUMA node 0 for --membind=0")
    if shutil.which("numactl") is None:
        pytest.skip("numactl is missing: run make (it installs the Debian packages)")
    root = tmp_path / "two-gpu-box"
    build_node(two_gpu_box(cores=2), root)
    return Node(root)


def device_dir(node: Node, bdf: str) -> Path:
    return Path(os.path.realpath(node.root / "sys" / "bus" / "pci" / "devices" / bdf))


def exec_child(node: Node, tmp_path: Path, rank: int, *args: str) -> tuple[int, str, bool]:
    """(exit status, stderr, whether the command ran) of `exec` for `rank`."""
    started = tmp_path / f"started-{rank}"
    done = run(
        *node.cli_args,
        *("exec", "--local-rank", str(rank), *args, "--", sys.executable, "-c"),
        *(f"open({str(started)!r}, 'w')",),
    )
    return done.returncode, done.stderr, started.exists()


@pytest.mark.parametrize("pattern", [b"\xff", b"\x00"], ids=["all-ones", "all-zeros"])
def test_exec_refuses_a_dead_gpu_and_warns_the_ranks_after_it(
    box: Node, tmp_path: Path, pattern: bytes
) -> None:
    """The first GPU's config space reads all ones (or all zeros, which the kernel's
    pci_device_is_present() also takes for "no device"): rank 0 is refused; rank 1 runs,
    warned (even with --quiet) of the dead GPU and that CUDA's numbering skips it."""
    config = device_dir(box, FIRST_GPU) / "config"
    config.write_bytes(pattern * len(config.read_bytes()))
    code, stderr, ran = exec_child(box, tmp_path, 0)
    assert code == 2 and not ran
    assert f"local rank 0: GPU {FIRST_GPU} does not answer on the PCI bus" in stderr
    code, stderr, ran = exec_child(box, tmp_path, 1, "--quiet")
    assert code == 0 and ran, stderr
    dead = (
        f"GPU {FIRST_GPU} does not answer on the PCI bus (fallen off?): drain the node; CUDA "
        "will not see it, so local ranks after it would shift"
    )
    assert stderr == (
        f"nodecheck exec: warning: {dead}\n"
        f"nodecheck exec: warning: GPU {FIRST_GPU}, before this rank's GPU in bus order, "
        "cannot be driven by CUDA, which numbers the GPUs after it one lower: local rank 1 "
        f"may not be driving 0000:02:00.0; see the note on GPU {FIRST_GPU}\n"
    )


def bind_to(node: Node, bdf: str, driver: str | None) -> None:
    """Rebind the GPU in the tree: its `driver` link to that driver's directory, or none."""
    link = device_dir(node, bdf) / "driver"
    link.unlink()
    if driver is not None:
        target = node.root / "sys" / "bus" / "pci" / "drivers" / driver
        target.mkdir(exist_ok=True)
        link.symlink_to(os.path.relpath(target, link.parent))


@pytest.mark.parametrize(
    ("driver", "reason"),
    [
        ("vfio-pci", f"GPU {FIRST_GPU} is bound to vfio-pci (passed through to a VM), not to"),
        ("nouveau", f"GPU {FIRST_GPU} is bound to nouveau, not to nvidia: CUDA will not see"),
        (None, f"GPU {FIRST_GPU} has no driver bound (no "),
    ],
    ids=["vfio-pci", "nouveau", "no-driver"],
)
def test_a_gpu_cuda_cannot_use_gets_no_rank_silently(
    box: Node, tmp_path: Path, driver: str | None, reason: str
) -> None:
    """A GPU bound to vfio-pci, to another driver or to none: tune marks its rank with the
    reason and a note, and exec refuses that rank (exit 2) without starting the command."""
    bind_to(box, FIRST_GPU, driver)
    document = tune_json(box)
    assert document["ranks"][0]["refusal"].startswith(reason)
    assert "local ranks after it would shift" in document["ranks"][0]["refusal"]
    assert any(note.startswith(reason) for note in document["notes"])
    code, stderr, ran = exec_child(box, tmp_path, 0)
    assert code == 2 and not ran and reason in stderr


def damage(path: Path, kind: str) -> str:
    """Damage a config file; what the warning must say besides naming it."""
    path.unlink()
    if kind in ("empty", "short"):
        path.write_bytes(b"" if kind == "empty" else b"\xde\x10")
        return "holds fewer than 4 bytes"
    if kind == "directory":
        path.mkdir()
    elif kind == "symlink-loop":
        path.symlink_to(path.name)
    else:
        assert kind == "missing"
    return ""  # the reader's own words for it (checks/node/fs.py)


@pytest.mark.parametrize("kind", ["missing", "empty", "short", "directory", "symlink-loop"])
def test_an_unreadable_config_space_is_a_warning_never_a_pass(
    box: Node, tmp_path: Path, kind: str
) -> None:
    """The GPU's config file missing, empty, short, a directory or a symlink loop: whether
    the GPU answers is unknown, so tune says so naming the file (not silently fine, not
    refused), and exec warns on stderr and runs the command."""
    config = device_dir(box, FIRST_GPU) / "config"
    said = damage(config, kind)
    document = tune_json(box)
    warning = document["ranks"][0]["warning"]
    assert warning.startswith(f"could not tell whether GPU {FIRST_GPU} answers on the PCI bus: ")
    assert str(config) in warning and said in warning
    assert "refusal" not in document["ranks"][0]
    assert warning in document["notes"]
    code, stderr, ran = exec_child(box, tmp_path, 0, "--quiet")
    assert code == 0 and ran
    assert stderr == f"nodecheck exec: warning: {warning}\n"


def test_sourcing_tune_for_that_rank_says_so_on_stderr(dgx_faulty: Node) -> None:
    """eval "$(nodecheck tune --local-rank 7)" in bash: the comments are unseen, so the
    refusal is echoed to the shell's stderr (and the exports still apply)."""
    bash = shutil.which("bash")
    assert bash is not None
    command = " ".join(
        [sys.executable, "-m", "nodecheck.agent", *dgx_faulty.cli_args, "tune", "--local-rank", "7"]
    )
    done = subprocess.run(
        [bash, "-c", f'eval "$({command})" && echo "order=$CUDA_DEVICE_ORDER"'],
        capture_output=True,
        text=True,
        env={
            "PATH": os.environ["PATH"],
            **({"PYTHONPATH": p} if (p := os.environ.get("PYTHONPATH")) else {}),
        },
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "order=PCI_BUS_ID\n"
    assert done.stderr == f"nodecheck tune: {FALLEN_OFF}\n"


def test_exec_warns_every_other_rank_of_the_gpu_off_the_bus(dgx_faulty: Node) -> None:
    """Local rank 2 on the faulty replica: its binding is right, but the node has a GPU off
    the bus; exec says so on stderr before anything else, even with --quiet (the binding
    itself then fails on this small machine, which is beside the point)."""
    done = run(*dgx_faulty.cli_args, "exec", "--quiet", "--local-rank", "2", "--", "true")
    assert done.stderr.startswith(f"nodecheck exec: warning: {FALLEN_OFF}\n"), done.stderr
