"""`make gpu`: every check that needs a real NVIDIA GPU, run in one go, in one report.

    python -m tools.gpu_report [--output gpu-report] [--step-timeout 1800]

Steps, each run even when an earlier one failed:

1. `pytest -m gpu`: the checks on the real GPUs, against nvidia-smi
   (tests/checks/test_gpu_real.py);
2. `python -m tools.gpu_side_by_side`: what nodecheck reads next to nvidia-smi;
3. `python -m bench.bench_accuracy --device cuda`: the benchmarks against references.
   It needs a CUDA build of torch in this Python: `make test` installs the CPU build
   for the tests, so bring one first (`.venv/bin/pip install torch`, the CUDA build for
   the driver). Whether the torch found has CUDA is asked in a subprocess (this tool
   never imports torch); without it, that step is marked "not run" with the reason
   and the others run anyway.

Writes OUTPUT/report.md (the machine: hostname, kernel, `nvidia-smi -L`, the driver, the
torch found and whether it has CUDA; each step's command, exit status and duration) and
each step's whole output as OUTPUT/<step>.log. Exit status: 0 when every step passed, 1
when one failed or could not run, 2 when there is no NVIDIA GPU here (nothing is run:
nvidia-smi is missing, fails or lists none).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXIT_OK, EXIT_FAILED, EXIT_NO_GPU = 0, 1, 2
# nvidia-smi can hang on a GPU that fell off the bus; it answers in well under a second
# on a healthy machine.
NVIDIA_SMI_TIMEOUT_S = 60
# Importing torch and initialising CUDA takes seconds; far longer on a loaded machine.
TORCH_PROBE_TIMEOUT_S = 300
BRING_CUDA_TORCH = (
    "bring a CUDA build of torch into the venv first: .venv/bin/pip install torch "
    "(the CUDA build for your driver)"
)
# Run by the Python under test: what torch it imports, and whether that torch has CUDA.
TORCH_PROBE = (
    "import json, torch; print(json.dumps({'version': torch.__version__, "
    "'cuda': torch.version.cuda, 'available': torch.cuda.is_available()}))"
)


@dataclass(frozen=True)
class Step:
    name: str  # also the log's file name
    argv: list[str]
    needs_cuda_torch: bool = False


@dataclass(frozen=True)
class TorchCuda:
    """The torch a Python imports and whether it can use CUDA here."""

    usable: bool
    description: str  # "torch 2.13.0+cpu has no CUDA (a CPU build)", for the report


@dataclass(frozen=True)
class Outcome:
    step: Step
    exit_status: int | None  # None: killed at the step timeout, or not run
    duration_s: float
    log: Path | None  # None: not run
    not_run: str = ""  # why the step was not run

    @property
    def passed(self) -> bool:
        return self.exit_status == 0


def steps(python: str) -> list[Step]:
    return [
        Step("pytest-gpu", [python, "-m", "pytest", "-m", "gpu", "-v", "-rs"]),
        Step("gpu-side-by-side", [python, "-m", "tools.gpu_side_by_side"]),
        Step(
            "bench-accuracy",
            [python, "-m", "bench.bench_accuracy", "--device", "cuda"],
            needs_cuda_torch=True,
        ),
    ]


def torch_cuda(python: str, timeout_s: float = TORCH_PROBE_TIMEOUT_S) -> TorchCuda:
    """Whether `python` imports a torch that can use CUDA, asked in a subprocess: torch
    (and CUDA's initialisation) never enters this process."""
    try:
        done = subprocess.run(
            [python, "-c", TORCH_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return TorchCuda(False, f"{python} did not import torch within {timeout_s:g} s")
    except OSError as err:
        return TorchCuda(False, f"cannot run {python}: {err.strerror}")
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        last = lines[-1] if lines else f"exit status {done.returncode}"
        return TorchCuda(False, f"no torch importable by {python}: {last}")
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
        version, cuda, available = str(found["version"]), found["cuda"], found["available"]
    except (IndexError, ValueError, KeyError, TypeError):
        return TorchCuda(False, f"{python}: torch's answer could not be read: {done.stdout!r}")
    if cuda is None:
        return TorchCuda(False, f"torch {version} has no CUDA (a CPU build)")
    if available is not True:
        return TorchCuda(
            False,
            f"torch {version} is built for CUDA {cuda} but torch.cuda.is_available() is "
            "False here (a driver older than that CUDA, or no GPU device visible)",
        )
    return TorchCuda(True, f"torch {version}, CUDA {cuda}, torch.cuda.is_available() is True")


def nvidia_smi(*args: str) -> tuple[int | None, str]:
    """(exit status, output) of nvidia-smi; (None, why) when it is missing or hangs."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return None, "nvidia-smi not found on PATH (no NVIDIA driver installed)"
    try:
        done = subprocess.run(
            [program, *args],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi {' '.join(args)} did not answer in {NVIDIA_SMI_TIMEOUT_S} s"
    return done.returncode, (done.stdout + done.stderr).strip()


def find_gpus() -> tuple[list[str], str]:
    """The `nvidia-smi -L` lines ("GPU 0: NVIDIA H200 (UUID: GPU-...)"), and why there are
    none when there are none."""
    status, output = nvidia_smi("-L")
    if status is None:
        return [], output
    gpus = [line for line in output.splitlines() if line.startswith("GPU ")]
    if status != 0 or not gpus:
        return [], f"nvidia-smi -L exited {status}: {output or 'no output'}"
    return gpus, ""


def driver_version() -> str:
    status, output = nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    return output.splitlines()[0].strip() if status == 0 and output else f"unknown ({output})"


def run_step(step: Step, output: Path, timeout_s: float) -> Outcome:
    log = output / f"{step.name}.log"
    started = time.monotonic()
    with log.open("w") as sink:
        sink.write(f"$ {' '.join(step.argv)}\n")
        sink.flush()
        process = subprocess.Popen(
            step.argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            status: int | None = process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)  # the step and everything it started
            process.wait()
            status = None
            sink.write(f"\ngpu_report: killed after {timeout_s:g} s\n")
    return Outcome(step, status, time.monotonic() - started, log)


def machine_lines(gpus: list[str], driver: str, torch: TorchCuda) -> list[str]:
    advice = "" if torch.usable else f": {BRING_CUDA_TORCH}"
    return [
        f"- host: {platform.node()}, kernel {platform.release()}, {platform.machine()}",
        f"- Python {platform.python_version()} ({sys.executable})",
        f"- driver: {driver}",
        f"- torch: {torch.description}{advice}",
        "- `nvidia-smi -L`:",
        "",
        "```",
        *gpus,
        "```",
    ]


def verdict_of(outcomes: list[Outcome]) -> str:
    failed = [o.step.name for o in outcomes if not o.passed and not o.not_run]
    not_run = [f"{o.step.name} ({o.not_run})" for o in outcomes if o.not_run]
    parts = [f"FAILED: {', '.join(failed)}"] if failed else []
    parts += [f"NOT RUN: {', '.join(not_run)}"] if not_run else []
    return "; ".join(parts) or "every step passed"


def render_report(gpus: list[str], driver: str, torch: TorchCuda, outcomes: list[Outcome]) -> str:
    lines = ["# nodecheck on a real GPU", "", f"**{verdict_of(outcomes)}**", "", "## Machine", ""]
    lines += machine_lines(gpus, driver, torch)
    lines += ["", "## Steps", "", "| step | command | exit status | duration | output |"]
    lines.append("|---|---|---|---|---|")
    for outcome in outcomes:
        command = " ".join(outcome.step.argv[1:])
        if outcome.log is None:
            lines.append(f"| {outcome.step.name} | `{command}` | not run: {outcome.not_run} | | |")
            continue
        status = "killed (timeout)" if outcome.exit_status is None else str(outcome.exit_status)
        lines.append(
            f"| {outcome.step.name} | `{command}` | {status} | {outcome.duration_s:.1f} s "
            f"| [{outcome.log.name}]({outcome.log.name}) |"
        )
    return "\n".join(lines) + "\n"


def run_steps(python: str, output: Path, timeout_s: float, torch: TorchCuda) -> list[Outcome]:
    """Every step in turn; one that needs a CUDA torch this Python lacks is not run."""
    outcomes = []
    for step in steps(python):
        if step.needs_cuda_torch and not torch.usable:
            outcomes.append(Outcome(step, None, 0.0, None, not_run=torch.description))
            print(f"gpu_report: {step.name}: not run: {torch.description}", file=sys.stderr)
            continue
        print(f"gpu_report: {step.name}: {' '.join(step.argv)}", file=sys.stderr, flush=True)
        outcome = run_step(step, output, timeout_s)
        outcomes.append(outcome)
        verdict = "passed" if outcome.passed else f"FAILED (exit {outcome.exit_status})"
        print(f"gpu_report: {step.name}: {verdict} in {outcome.duration_s:.1f} s", file=sys.stderr)
    return outcomes


def no_gpu_report(why: str) -> str:
    return (
        "# nodecheck on a real GPU\n\n"
        f"**no NVIDIA GPU on this machine: nothing was run** ({why})\n\n"
        f"- host: {platform.node()}, kernel {platform.release()}, {platform.machine()}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "gpu-report", help="report folder")
    parser.add_argument(
        "--step-timeout", type=float, default=1800.0, help="seconds each step may take"
    )
    args = parser.parse_args(argv)
    output: Path = args.output
    output.mkdir(parents=True, exist_ok=True)
    report = output / "report.md"
    gpus, why = find_gpus()
    if not gpus:
        report.write_text(no_gpu_report(why))
        print(f"gpu_report: no NVIDIA GPU on this machine, nothing run: {why}", file=sys.stderr)
        print(f"gpu_report: wrote {report}", file=sys.stderr)
        return EXIT_NO_GPU
    driver = driver_version()
    torch = torch_cuda(sys.executable)
    print(f"gpu_report: torch: {torch.description}", file=sys.stderr, flush=True)
    if not torch.usable:
        print(f"gpu_report: {BRING_CUDA_TORCH}", file=sys.stderr, flush=True)
    outcomes = run_steps(sys.executable, output, args.step_timeout, torch)
    report.write_text(render_report(gpus, driver, torch, outcomes))
    print(f"gpu_report: wrote {report}", file=sys.stderr)
    return EXIT_OK if all(o.passed for o in outcomes) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
