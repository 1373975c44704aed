"""`nodecheck slurm prolog` and `nodecheck slurm epilog`: the gate before a job and the
checks after it.

Slurm drains a node whose Prolog or Epilog exits non-zero, and requeues the job of a
failed Prolog (held, unless SchedulerParameters=nohold_on_prolog_fail): Slurm's
doc/html/prolog_epilog.shtml, https://slurm.schedmd.com/prolog_epilog.html. The same
page asks that they "be designed to be as short as possible and should not call Slurm
commands (e.g. squeue, scontrol, sacctmgr, etc)": a Prolog that hangs on a busy
slurmctld holds the job and the node. So neither calls Slurm: the exit status is the
whole answer, and the reason goes to stderr, which slurmd logs. The readable drain
reason (`nodecheck: <check> <subject>: <summary>`) is `slurm health-check`'s to write.

Which results stop a job is `unusable_results`, a pure function of the results: only
what makes the node unusable for any job (a GPU lost, a drain-class XID, uncorrectable
memory the driver wants recovered, fewer GPUs than expected). A degraded node (a PCIe
link at x8, ACS on, NVLinks down) still runs jobs, slower: it passes with a line on
stderr, as does anything that could not be determined (`error`): failing a job
because a reading hung would drain healthy nodes (mej/nhc#161).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TextIO

# Light on purpose: the CLI reads the budgets below when it builds its options.
from nodecheck.checks.record import record
from nodecheck.checks.result import Result, Status

if TYPE_CHECKING:
    from nodecheck.checks.context import CheckContext

# The checks whose `fail` means "no job can use this node": gpu_count fails for a GPU
# on the bus that NVML or CUDA lost and for fewer GPUs than expected; gpu_xid for an
# XID whose NVIDIA action (reset, reboot, the driver's recovery action) is not done;
# gpu_memory_errors for uncorrectable ECC with a recovery action pending, a failed row
# remap or too many retired pages (NVIDIA's GPU memory error management,
# https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/). Other checks' failures
# (gpu_pcie, gpu_nvlink, pcie_acs, nccl_env) make a node slow, not unusable.
UNUSABLE_WHEN_FAILED = ("gpu_count", "gpu_xid", "gpu_memory_errors")
# What the prolog runs: the checks above, nothing slower.
PROLOG_CHECKS = UNUSABLE_WHEN_FAILED
EXIT_PASS = 0
EXIT_UNUSABLE = 1
# Said by the epilog on every run, so an operator reading slurmd's log knows why.
NO_BENCHMARKS_HERE = (
    "benchmarks are not run in the epilog: they take minutes on the GPUs while the next "
    "job waits for the epilog (the node stays COMPLETING, an EpilogTimeout drains it); "
    "the agent runs them when every GPU has been idle through its idle window, and stops "
    "one within a second when a job's process appears"
)


@record
class Finding:
    """One result a gate reports: the check, its subject, its status and summary."""

    check: str
    subject: str
    status: Status
    summary: str

    def line(self) -> str:
        return f"{self.check} {self.subject}: {self.summary}"


def findings(results: Iterable[tuple[str, Result]]) -> list[Finding]:
    return [Finding(name, r.subject, r.status, r.summary) for name, r in results]


def unusable_results(results: Sequence[Finding]) -> list[Finding]:
    """The results that make the node unusable for a job (the gate fails on them)."""
    return [f for f in results if f.status is Status.FAIL and f.check in UNUSABLE_WHEN_FAILED]


def noted_results(results: Sequence[Finding]) -> list[Finding]:
    """The results the gate lets pass but says: every other warn, error and fail."""
    unusable = unusable_results(results)
    return [
        f
        for f in results
        if f.status in (Status.WARN, Status.ERROR, Status.FAIL) and f not in unusable
    ]


@record
class GateOutcome:
    """What a gate decided: its exit status and the lines for stderr."""

    code: int
    lines: tuple[str, ...]


def judge_gate(command: str, results: Sequence[Finding]) -> GateOutcome:
    """The exit status and stderr lines of `nodecheck slurm <command>` for these results."""
    unusable = unusable_results(results)
    lines = [f"nodecheck {command}: node unusable: {f.line()}" for f in unusable]
    lines += [
        f"nodecheck {command}: passing despite {f.status.value}: {f.line()}"
        for f in noted_results(results)
    ]
    if not results:
        # Absence is never a pass, but it is no reason to drain either: said.
        lines.append(f"nodecheck {command}: passing, but no check gave a result")
    return GateOutcome(EXIT_UNUSABLE if unusable else EXIT_PASS, tuple(lines))


def run_gate(
    command: str, context: CheckContext, names: Sequence[str] | None, budget_s: float
) -> GateOutcome:
    """Run the checks (`names`; None: every quick check, never a benchmark) on the node,
    each within `budget_s` (they run side by side, so the whole run is within it too),
    and judge what they said. A check past the budget is abandoned as an `error` result
    (a hung reading says nothing about the job), and never costs the others theirs: a
    lost GPU that slows one check still fails the gate through the checks that finished."""
    from dataclasses import replace

    from nodecheck.checks.registry import load_checks
    from nodecheck.checks.runner import run_checks

    available = load_checks()
    selected = [available[n] for n in names] if names is not None else list(available.values())
    bounded = [replace(check, timeout_s=min(check.timeout_s, budget_s)) for check in selected]
    runs = run_checks(bounded, context)
    return judge_gate(command, findings((run.check.name, r) for run in runs for r in run.results))


def say(outcome: GateOutcome, stream: TextIO | None = None) -> None:
    """The lines on stderr, control characters escaped: a summary carries what the node
    said (a process name, a kernel log line), which must not start a line of its own."""
    from nodecheck.checks.printable import printable

    for line in outcome.lines:
        print(printable(line), file=stream or sys.stderr, flush=True)
