"""Runs the benchmark child: its own process group, a hard deadline, a stop on demand.

The child (`python -m nodecheck.checks.bench.child SPEC`) is the only process
that imports torch. It starts in a new session, so its ranks share its process
group and one killpg() ends them all. Whatever happens to it (a hang past the
deadline, a crash, the OOM killer, a CUDA error) comes back as a
`ChildOutcome`, never as an exception in the caller.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nodecheck.checks.lazy_logging import get_logger
from nodecheck.checks.record import record

CHILD_MODULE = "nodecheck.checks.bench.child"
# The benchmark's test double, as LD_LIBRARY_PATH is the fake NVML's: the module run in
# the child's place (tests/fixtures/fake_bench_child.py speaks the same protocol with
# configured rates, so a fleet of agents on machines without GPUs reports measurements).
# Everything around the measurement (gate, watch, deadline, judging, export) stays real.
CHILD_MODULE_VARIABLE = "NODECHECK_BENCH_CHILD_MODULE"
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# Only the test tree's modules may stand in for the child: a double in production would
# export configured rates as a node's measurements.
DOUBLE_PACKAGE = "tests."
# The checkout this module runs from (checks/bench/ -> the repository root): a test double
# runs only from its tests/ folder, which an installed nodecheck does not have.
CHECKOUT = Path(__file__).resolve().parents[2]
# Must match child/protocol.py (the child package imports torch: not imported here).
PARENT_VARIABLE = "NODECHECK_BENCH_PARENT"
REAP_TIMEOUT_S = 10.0
STDERR_TAIL = 2000

log = get_logger(__name__)


@record(frozen=False)
class ChildOutcome:
    result: dict[str, Any] | None = None
    error: str | None = None  # what went wrong, for the summary
    cause: str | None = None  # "timeout", "out of memory", "cuda error", "crash", "stopped"
    stderr_tail: str = ""
    seconds: float = 0.0


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env[PARENT_VARIABLE] = str(os.getpid())
    # CUDA numbers GPUs fastest-first unless told otherwise; NVML (and so
    # --gpus and every result) numbers them in PCI bus order.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.setdefault("PYTHONWARNINGS", "ignore")  # torch's import-time warnings
    return env


def child_module() -> str:
    """The module `python -m` runs as the child: the double named by the environment, when
    it is a dotted module name under `tests.` (where the doubles live), else the real child.
    Anything else is ignored, said once per run (the variable is set by whoever starts the
    agent, never by a job), so no setting runs foreign code as the benchmark. A run with a
    double says so, every time: its figures are configured rates, not measurements."""
    named = os.environ.get(CHILD_MODULE_VARIABLE)
    if named is None:
        return CHILD_MODULE
    if MODULE_NAME.fullmatch(named) is None or not named.startswith(DOUBLE_PACKAGE):
        log.warning(
            "event=bad_child_module variable=%s reason=%r",
            CHILD_MODULE_VARIABLE,
            "not the dotted name of a test double's module; the real benchmark child runs",
        )
        return CHILD_MODULE
    # The name alone is not enough: `python -m` looks in its working directory and on
    # PYTHONPATH first, where any tests/ folder may be. The module must be a file of this
    # checkout's tests/, and the child runs from the checkout (double_directory) so that
    # is the one it imports.
    source = CHECKOUT.joinpath(*named.split(".")).with_suffix(".py")
    if not (CHECKOUT / "tests" / "__init__.py").is_file() or not source.is_file():
        log.warning(
            "event=bad_child_module variable=%s reason=%r",
            CHILD_MODULE_VARIABLE,
            "no such test double in this nodecheck's own tests; the real benchmark child runs",
        )
        return CHILD_MODULE
    # The name is logged: checked above to be a test double's module, never anything else.
    log.warning(
        "event=bench_child_double module=%s reason=%r",
        named,
        "a test double runs in place of the benchmark: its figures are not measurements",
    )
    return named


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def run_child(
    spec: dict[str, Any],
    timeout_s: float,
    *,
    on_start: Callable[[int], None] | None = None,
    on_progress: Callable[[float], None] | None = None,
    stop: threading.Event | None = None,
) -> ChildOutcome:
    """Run the child to its end, its deadline, or `stop`; `on_start` gets its process group."""
    began = time.monotonic()
    outcome = ChildOutcome()
    module = child_module()
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", module, json.dumps(spec)],
            cwd=CHECKOUT if module != CHILD_MODULE else None,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=_child_env(),
            start_new_session=True,
        )
        if on_start is not None:
            on_start(process.pid)
        assert process.stdout is not None
        try:
            _read_until_done(process, outcome, began + timeout_s, on_progress, stop)
        finally:
            _kill(process)  # the whole group: ranks a crashed launcher left behind too
            try:
                process.wait(REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                # SIGKILL does not end a process stuck in the driver (D state).
                outcome.cause = outcome.cause or "timeout"
                outcome.error = (
                    f"the benchmark process {process.pid} did not die when killed "
                    "(stuck in the GPU driver?)"
                )
            process.stdout.close()
        stderr.seek(0)
        outcome.stderr_tail = stderr.read().decode(errors="replace")[-STDERR_TAIL:]
    outcome.seconds = time.monotonic() - began
    if outcome.cause is None and outcome.result is None:
        _explain_exit(process.returncode, outcome)
    return outcome


def _read_until_done(
    process: subprocess.Popen[bytes],
    outcome: ChildOutcome,
    deadline: float,
    on_progress: Callable[[float], None] | None,
    stop: threading.Event | None,
) -> None:
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    pending = b""
    timeout_s = deadline - time.monotonic()
    while True:
        if stop is not None and stop.is_set():
            outcome.cause = "stopped"
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            outcome.cause = "timeout"
            outcome.error = f"did not finish within {timeout_s:.0f} s; killed"
            return
        if not selector.select(min(remaining, 0.1)):
            continue
        chunk = os.read(process.stdout.fileno(), 65536)
        if not chunk:
            return  # the child closed stdout: it is done, one way or another
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            _take(line, outcome, on_progress)


def _take(line: bytes, outcome: ChildOutcome, on_progress: Callable[[float], None] | None) -> None:
    try:
        message = json.loads(line)
    except ValueError:
        return  # a library printing to stdout (NCCL_DEBUG=INFO): not ours to read
    if not isinstance(message, dict):
        return
    if "progress" in message and on_progress is not None:
        on_progress(float(message["progress"]))
    if "result" in message:
        outcome.result = message["result"]
    if "error" in message:
        outcome.error = str(message["error"])
        outcome.cause = str(message.get("cause") or "exception")


def _explain_exit(code: int | None, outcome: ChildOutcome) -> None:
    """A child that ended with neither a result nor an error line."""
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        outcome.cause = "crash"
        hint = " (out of memory? see the kernel log for the OOM killer)" if -code == 9 else ""
        outcome.error = f"the benchmark process was killed by {name}{hint}"
        return
    last = outcome.stderr_tail.strip().splitlines()[-1:] or ["no output"]
    outcome.cause = "crash"
    outcome.error = f"the benchmark process exited with status {code}: {last[0]}"
