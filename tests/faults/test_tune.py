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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_cli import run
from tests.conftest import Node
from tests.fixtures import nodes
from tests.fixtures.nodegen import build_node
from tests.fixtures.nodes import two_gpu_box
from tests.fixtures.nvml_scenarios import modified
from tests.fixtures.nvml_scenarios import workstation as workstation_scenario

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
    "GLOO_SOCKET_IFNAME": "SENTINEL-gloo",
}
FALLEN_OFF = (
    "GPU 0000:bc:00.0 does not answer on the PCI bus (fallen off?): drain the node; CUDA will "
    "not see it, so local ranks after it would shift"
)
FIRST_GPU = "0000:01:00.0"  # the two-GPU box's first GPU: local rank 0
SECOND_GPU = "0000:02:00.0"
DGX_GPUS = [f"0000:{bus}:00.0" for bus in ("18", "1a", "3a", "3c", "9a", "9c", "ba", "bc")]


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
    # MASTER_ADDR, no IP literal, is said to be a host name; gloo's list is replaced.
    assert "MASTER_ADDR is a host name (not shown)" in output
    assert "GLOO_SOCKET_IFNAME" in output
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


def build_two_gpu_box(root: Path) -> Node:
    """The two-GPU box (rank 0 on CPU 0, rank 1 on CPU 1)."""
    build_node(two_gpu_box(cores=2), root)
    return Node(root)


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
    return build_two_gpu_box(tmp_path / "two-gpu-box")


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
        ("nouveau", f"GPU {FIRST_GPU} is bound to nouveau, not to nvidia: CUDA will not see"),
        (None, f"GPU {FIRST_GPU} has no driver bound (no "),
    ],
    ids=["nouveau", "no-driver"],
)
def test_a_dead_gpu_meant_for_this_host_gets_no_rank_silently(
    box: Node, tmp_path: Path, driver: str | None, reason: str
) -> None:
    """A GPU of this host bound to another host driver (nouveau) or to none: tune marks its
    rank with the reason and a note, and exec refuses that rank (exit 2) without starting
    the command."""
    bind_to(box, FIRST_GPU, driver)
    document = tune_json(box)
    assert document["ranks"][0]["refusal"].startswith(reason)
    assert "local ranks after it would shift" in document["ranks"][0]["refusal"]
    assert any(note.startswith(reason) for note in document["notes"])
    code, stderr, ran = exec_child(box, tmp_path, 0)
    assert code == 2 and not ran and reason in stderr


def without_driver_entry(node: Node, bdf: str) -> None:
    """A container's /proc/driver/nvidia/gpus: the GPUs it was not given are not there."""
    shutil.rmtree(node.root / "proc" / "driver" / "nvidia" / "gpus" / bdf)


LEFT_OUT_TAIL = (
    ": left out of the bindings (no local rank drives it); local ranks count only the 1 "
    "GPU(s) meant for this host and container, as CUDA does"
)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("vfio-pci", "bound to vfio-pci, not the nvidia driver (passed through to a VM?)"),
        (
            "nvgrace-gpu-vfio-pci",
            "bound to nvgrace-gpu-vfio-pci, not the nvidia driver (passed through to a VM?)",
        ),
        ("pci-stub", "bound to pci-stub, not the nvidia driver (passed through to a VM?)"),
        ("container", "not assigned to this container (absent from /proc/driver/nvidia/gpus)"),
    ],
    ids=["vfio-pci", "vfio-variant", "pci-stub", "container"],
)
def test_a_gpu_not_meant_for_this_host_is_left_out_and_ranks_count_the_rest(
    box: Node, tmp_path: Path, fault: str, reason: str
) -> None:
    """The first GPU passed through to a VM (vfio-pci, a vfio variant driver, pci-stub) or
    not given to this container: tune leaves it out with a note naming it and why, and
    local rank 0 drives the second GPU, as CUDA numbers it (also as CUDA_VISIBLE_DEVICES=0);
    no rank is refused or warned, nothing says to drain the node, exec runs rank 0 on the
    second GPU and names the GPU left out."""
    if fault == "container":
        without_driver_entry(box, FIRST_GPU)
    else:
        bind_to(box, FIRST_GPU, fault)
    note = f"GPU {FIRST_GPU} is {reason}{LEFT_OUT_TAIL}"
    for environ in ({}, {"CUDA_VISIBLE_DEVICES": "0"}):
        document = tune_json(box, env=environ)
        [rank] = document["ranks"]
        assert (rank["local_rank"], rank["gpu"]) == (0, SECOND_GPU)
        assert "refusal" not in rank and "warning" not in rank
        assert note in document["notes"]
        assert not [n for n in document["notes"] if "drain" in n or "shift" in n]
    code, stderr, ran = exec_child(box, tmp_path, 0)
    assert code == 0 and ran, stderr
    assert stderr.startswith(f"nodecheck exec: local rank 0 -> GPU {SECOND_GPU}, NUMA node 0")
    assert "warning" not in stderr
    assert f"not counted, not meant for this host or container: GPU {FIRST_GPU}" in stderr


@pytest.mark.parametrize(
    ("fault", "check_status", "tune_says"),
    [
        ("vfio-pci", "skip", "left out"),
        ("container", "skip", "left out"),
        ("nouveau", "fail", "refusal"),
        ("no-driver", "fail", "refusal"),
    ],
)
def test_gpu_count_and_tune_agree_on_whose_gpu_it_is(
    box: Node,
    fake_nvml_library: Path,
    tmp_path: Path,
    fault: str,
    check_status: str,
    tune_says: str,
) -> None:
    """The first GPU, which NVML does not enumerate, bound to vfio-pci, not given to this
    container, bound to nouveau or to no driver: gpu_count skips it exactly when tune leaves
    it out, and fails it exactly when tune refuses its rank and says to drain the node."""
    if fault == "container":
        without_driver_entry(box, FIRST_GPU)
    else:
        bind_to(box, FIRST_GPU, {"no-driver": None}.get(fault, fault))
    scenario = modified(workstation_scenario(), gpu=0, bus_id=SECOND_GPU)
    node = Node(box.root, fake_nvml_library).with_scenario(scenario, tmp_path / "nvml.json")
    done = run(*node.cli_args, "check", "--only", "gpu_count", "--json", env=node.env)
    assert "Traceback" not in done.stderr, done.stderr
    results = {r["subject"]: r for r in json.loads(done.stdout)["results"]}
    assert results[f"gpu {FIRST_GPU}"]["status"] == check_status
    document = tune_json(node)
    ranks = {rank["gpu"]: rank for rank in document["ranks"]}
    if tune_says == "left out":
        assert list(ranks) == [SECOND_GPU]
        assert results["node"]["status"] == "ok"
    else:
        assert list(ranks) == [FIRST_GPU, SECOND_GPU] and "refusal" in ranks[FIRST_GPU]
        assert results["node"]["status"] == "fail"
        assert "drain" in results[f"gpu {FIRST_GPU}"]["remedy"]


def test_in_a_container_ranks_count_only_its_gpus_and_slurm_indices_stay_the_hosts(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """A container given GPUs 4 and 5 of the eight (Pyxis under Slurm: SLURM_STEP_GPUS
    names them by the host's index, CUDA_VISIBLE_DEVICES counts from 0 inside): two ranks,
    on those two GPUs, with or without CUDA_VISIBLE_DEVICES; the six others are named in
    one note; no rank is refused."""
    node = copy_node(dgx)
    given = [DGX_GPUS[4], DGX_GPUS[5]]
    for bdf in DGX_GPUS:
        if bdf not in given:
            without_driver_entry(node, bdf)
    others = ", ".join(bdf for bdf in DGX_GPUS if bdf not in given)
    for environ in (
        {},
        {"SLURM_STEP_GPUS": "4,5"},
        {"SLURM_STEP_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0,1"},
        {"CUDA_VISIBLE_DEVICES": "0,1"},
    ):
        document = tune_json(node, env=environ)
        assert [rank["gpu"] for rank in document["ranks"]] == given, environ
        assert all("refusal" not in rank for rank in document["ranks"])
        assert (
            f"GPUs {others} are not assigned to this container (absent from "
            "/proc/driver/nvidia/gpus): left out of the bindings (no local rank drives them); "
            "local ranks count only the 2 GPU(s) meant for this host and container, as CUDA "
            "does"
        ) in document["notes"]


def test_a_dead_gpu_still_refused_next_to_one_passed_through(
    dgx_faulty: Node, copy_node: Callable[[Node], Node]
) -> None:
    """On the faulty replica (0000:bc:00.0 fell off the bus), GPU 0000:18:00.0 also bound to
    vfio-pci: seven ranks over the other GPUs; the dead GPU's rank (now 6) is still refused
    with the drain note, the GPU passed through gets no rank and no drain."""
    node = copy_node(dgx_faulty)
    bind_to(node, DGX_GPUS[0], "vfio-pci")
    document = tune_json(node)
    gpus = [rank["gpu"] for rank in document["ranks"]]
    assert gpus == DGX_GPUS[1:]
    assert document["ranks"][6]["refusal"] == FALLEN_OFF
    assert FALLEN_OFF in document["notes"]
    assert all("refusal" not in rank for rank in document["ranks"][:6])
    done = run(*node.cli_args, "exec", "--quiet", "--local-rank", "6", "--", "true")
    assert (done.returncode, done.stderr) == (2, f"nodecheck exec: local rank 6: {FALLEN_OFF}\n")


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
    """eval "$(nodecheck tune --local-rank 7)" in bash: nodecheck says the refusal on
    stderr and exits 2, and the evaluated text exports nothing and fails (status 2), saying
    so on the shell's stderr: `eval ... && CMD` does not start CMD."""
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
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == (
        f"nodecheck tune: local rank 7: {FALLEN_OFF}\n"
        "nodecheck tune: local rank 7 must not run here: stopping\n"
    )


def test_exec_warns_every_other_rank_of_the_gpu_off_the_bus(dgx_faulty: Node) -> None:
    """Local rank 2 on the faulty replica: its binding is right, but the node has a GPU off
    the bus; exec says so on stderr before anything else, even with --quiet (the binding
    itself then fails on this small machine, which is beside the point)."""
    done = run(*dgx_faulty.cli_args, "exec", "--quiet", "--local-rank", "2", "--", "true")
    assert done.stderr.startswith(f"nodecheck exec: warning: {FALLEN_OFF}\n"), done.stderr


@pytest.mark.parametrize(
    ("planted", "why"),
    [
        (
            "0-2147483647\n",
            "'0-2147483647' is implausible: CPU 2147483647 is beyond the 224 CPUs the kernel "
            "can have (0-223)",
        ),
        ("garbage\n", "expected a CPU list, got 'garbage'"),
    ],
    ids=["beyond_the_kernel", "not_a_list"],
)
def test_a_gpu_whose_local_cpulist_is_unusable_says_its_numa_node_stands_in(
    tmp_path: Path, planted: str, why: str
) -> None:
    """GPU 0000:3a:00.0 (local rank 2) of a DGX replica with an absurd or unparsable
    local_cpulist: its rank still gets NUMA node 0's share, and its note (JSON) and the
    text's notes name the GPU, the file and why, and that the node's CPUs stand in; the
    other ranks carry no such note."""
    node = Node(build_node(nodes.NODES["dgx-h100"](), tmp_path / "dgx"))
    gpu = DGX_GPUS[2]
    path = device_dir(node, gpu) / "local_cpulist"
    path.write_text(planted)
    said = (
        f"GPU {gpu}'s local CPUs cannot be used ({path.resolve()}: {why}): its rank gets the "
        "CPUs of its NUMA node 0 instead"
    )
    document = tune_json(node)
    ranks = {rank["gpu"]: rank for rank in document["ranks"]}
    assert ranks[gpu]["note"] == said
    assert (ranks[gpu]["numa_node"], ranks[gpu]["cpulist"]) == (0, "28-41,140-153")
    assert [g for g, rank in ranks.items() if "note" in rank] == [gpu]
    assert said in document["notes"]
    text = run(*node.cli_args, "tune", "--format", "text").stdout
    # The notes are wrapped, a long path broken anywhere: compared without whitespace.
    assert "".join(said.split()) in "".join(text.split())


def test_an_nvlink_domain_without_an_imex_channel_is_a_warning(tmp_path: Path) -> None:
    """A GB200 tray of an NVL72 rack's IMEX domain whose process sees no IMEX channel (never
    created, or not passed into the container): `tune` warns in its notes, in the JSON and
    as a shell comment, naming the device's major and how to make one."""
    spec = nodes.gb200_tray()
    del spec.files["/dev/nvidia-caps-imex-channels/channel0"]
    node = Node(build_node(spec, tmp_path / "tray"))
    document = tune_json(node)
    [warning] = [n for n in document["notes"] if n.startswith("warning: no IMEX channel")]
    assert "major 234 in /proc/devices" in warning and "NVreg_CreateImexChannel0=1" in warning
    [mnnvl] = [e for e in document["left_unset"] if e["names"] == ["NCCL_MNNVL_ENABLE"]]
    assert "names 18 nodes" in mnnvl["reason"]
    shell = run(*node.cli_args, "tune", "--format", "shell")
    assert shell.returncode == 0 and "# note: warning: no IMEX channel" in shell.stdout
