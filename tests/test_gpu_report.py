"""`make gpu` (tools/gpu_report.py) on a machine without an NVIDIA GPU: it says so at
once, writes a report that says so, runs nothing and exits non-zero. And without a CUDA
build of torch: it says which torch it found, runs what needs no torch, and marks the
benchmarks as not run."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools import gpu_report

ROOT = Path(__file__).resolve().parent.parent


def test_without_a_gpu_it_says_so_and_fails_at_once(tmp_path: Path) -> None:
    """No nvidia-smi on PATH (no NVIDIA driver): exit 2 within seconds, nothing run."""
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    output = tmp_path / "gpu-report"
    environ = {"PATH": str(empty_path), "HOME": str(tmp_path)}
    if "PYTHONPATH" in os.environ:
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tools.gpu_report", "--output", str(output)],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 60  # quick: no step was started
    assert done.stderr.startswith(
        "gpu_report: no NVIDIA GPU on this machine, nothing run: nvidia-smi not found on PATH"
    )
    report = (output / "report.md").read_text()
    assert "**no NVIDIA GPU on this machine: nothing was run**" in report
    assert sorted(p.name for p in output.iterdir()) == ["report.md"]  # no step's log
    assert "Traceback" not in done.stderr


def test_torch_without_cuda_is_named_and_never_imported_here() -> None:
    """This venv's torch is the CPU build (make test installs it): the probe, run in a
    subprocess, names the version it found and says it has no CUDA; torch never enters
    the report tool's own process."""
    version = importlib.metadata.version("torch")
    if "+cpu" not in version:
        pytest.skip(f"this venv's torch is {version}, not the CPU build")
    imported_before = "torch" in sys.modules  # by another test of this process, if any
    found = gpu_report.torch_cuda(sys.executable)
    assert found == gpu_report.TorchCuda(False, f"torch {version} has no CUDA (a CPU build)")
    assert ("torch" in sys.modules) == imported_before


def test_a_python_without_torch_is_said_plainly(tmp_path: Path) -> None:
    """A Python that cannot import torch at all (a fresh venv): not usable, and the probe
    names that Python and the import error."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")],
        check=True,
        timeout=120,
    )
    python = str(tmp_path / "bare" / "bin" / "python")
    found = gpu_report.torch_cuda(python)
    assert not found.usable
    assert found.description == (
        f"no torch importable by {python}: ModuleNotFoundError: No module named 'torch'"
    )


def test_on_a_gpu_machine_without_cuda_torch_the_benchmarks_are_marked_not_run(
    tmp_path: Path,
) -> None:
    """nvidia-smi lists a GPU (a stand-in script: this machine has none) and the venv's
    torch is the CPU build: the report says which torch it found and what to install, the
    steps that need no torch are run (cut short here by a 1 s step timeout), the
    benchmark step is marked "not run" with the reason and leaves no log, and the exit
    status is 1, never a pass."""
    version = importlib.metadata.version("torch")
    if "+cpu" not in version:
        pytest.skip(f"this venv's torch is {version}, not the CPU build")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-0)";;\n'
        "*) echo 570.00;; esac\n"
    )
    smi.chmod(0o755)
    output = tmp_path / "gpu-report"
    environ = {"PATH": f"{fake_bin}:/usr/bin:/bin", "HOME": str(tmp_path)}
    if "PYTHONPATH" in os.environ:
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    done = subprocess.run(
        [sys.executable, "-m", "tools.gpu_report", "--output", str(output), "--step-timeout", "1"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    no_cuda = f"torch {version} has no CUDA (a CPU build)"
    assert f"gpu_report: torch: {no_cuda}\n" in done.stderr
    assert f"gpu_report: bench-accuracy: not run: {no_cuda}\n" in done.stderr
    report = (output / "report.md").read_text()
    assert f"NOT RUN: bench-accuracy ({no_cuda})**" in report
    assert f"- torch: {no_cuda}: {gpu_report.BRING_CUDA_TORCH}\n" in report
    assert f"| bench-accuracy | `-m bench.bench_accuracy --device cuda` | not run: {no_cuda} |" in (
        report
    )
    assert sorted(p.name for p in output.iterdir()) == [
        "gpu-side-by-side.log",
        "pytest-gpu.log",
        "report.md",
    ]
