"""`make gpu` (tools/gpu_report.py) on a machine without an NVIDIA GPU: it says so at
once, writes a report that says so, runs nothing and exits non-zero."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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
