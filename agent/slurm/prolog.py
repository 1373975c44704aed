"""`nodecheck slurm prolog` and `nodecheck slurm epilog`: the gate before a job and the
checks after it.

Slurm drains a node whose Prolog or Epilog exits non-zero, and requeues the job of a
failed Prolog (held, unless SchedulerParameters=nohold_on_prolog_fail): Slurm's
doc/html/prolog_epilog.shtml, https://slurm.schedmd.com/prolog_epilog.html. The same
page asks that they "be designed to be as short as possible and should not call Slurm
commands (e.g. squeue, scontrol, sacctmgr, etc)": a Prolog that hangs on a busy
slurmctld holds the job and the node. So neither calls Slurm: the exit status is the
whole answer, and the reason goes to stderr, which slurmd logs. A failure is also
recorded in the state folder (agent/slurm/hook_failure.py), from which `slurm
health-check` takes Slurm's "Prolog error" drain over and writes the readable reason
(`nodecheck: <check> <subject>: <summary>`).

Which results stop a job is `unusable_results`, a pure function of the findings: only
what makes the node unusable for any job, a GPU hardware failure on the node's own
evidence (a GPU lost, a drain-class XID, uncorrectable memory the driver wants
recovered, fewer GPUs than expected). The prolog runs the checks that declare
themselves a gate (checks/registry.py, `gate`: quick, and able to find such a failure).
A degraded node (a PCIe link at x8, ACS on, NVLinks down) still runs jobs, slower: it
passes with a line on stderr, as does anything that could not be determined (`error`):
failing a job because a reading hung would drain healthy nodes (mej/nhc#161). So does a
job's own failing finding (a variable a user set): nothing a user sets drains a node.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

# Light on purpose: the CLI reads the budgets below when it builds its options.
from nodecheck.checks.record import record
from nodecheck.checks.result import FaultClass, Status

if TYPE_CHECKING:
    from nodecheck.agent.findings import Finding
    from nodecheck.checks.context import CheckContext

EXIT_PASS = 0
EXIT_UNUSABLE = 1
# Said by the epilog on every run, so an operator reading slurmd's log knows why.
NO_BENCHMARKS_HERE = (
    "benchmarks are not run in the epilog: they take minutes on the GPUs while the next "
    "job waits for the epilog (the node stays COMPLETING, an EpilogTimeout drains it); "
    "the agent runs them when every GPU has been idle through its idle window, and stops "
    "one within a second when a job's process appears"
)


def gate_checks() -> tuple[str, ...]:
    """What the prolog runs: the checks that declare themselves a gate, nothing slower."""
    from nodecheck.checks.registry import load_checks

    return tuple(name for name, check in load_checks().items() if check.gate)


def not_the_jobs(finding: Finding, job_gpus: Collection[str] | None) -> bool:
    """A finding about one GPU the job was not given (`job_gpus`: the bus ids of those it
    was; None: not known, every GPU counts)."""
    if job_gpus is None or not finding.subject.startswith("gpu "):
        return False
    return finding.subject.removeprefix("gpu ") not in job_gpus


def unusable_results(
    results: Sequence[Finding],
    gates: Collection[str] | None = None,
    job_gpus: Collection[str] | None = None,
) -> list[Finding]:
    """The findings that make the node unusable for a job (the gate fails on them): a GPU
    hardware failure on the node's own evidence, from a check that declares itself a gate
    (`gates`: their names, None for the registered ones). Another check's hardware
    failure (NVLinks down, a recovery action gpu_state reads) leaves the GPUs usable,
    slower or until the next reset: the epilog, which runs every quick check, says it
    and passes, and `slurm health-check` drains for it. With `job_gpus` (the prolog's,
    from SLURM_JOB_GPUS), a fault of a GPU the job was not given does not stop it: the
    job never touches that GPU, and health-check drains the node for it."""
    gated = set(gate_checks() if gates is None else gates)
    return [
        f
        for f in results
        if f.node_failing
        and f.fault_class is FaultClass.GPU_HARDWARE
        and f.check in gated
        and not not_the_jobs(f, job_gpus)
    ]


def noted_results(
    results: Sequence[Finding], job_gpus: Collection[str] | None = None
) -> list[Finding]:
    """The results the gate lets pass but says: every other warn, error and fail."""
    unusable = unusable_results(results, job_gpus=job_gpus)
    return [
        f
        for f in results
        if f.status in (Status.WARN, Status.ERROR, Status.FAIL) and f not in unusable
    ]


@record
class GateOutcome:
    """What a gate decided: its exit status, the lines for stderr and, failing, the first
    finding it failed on ("<check> <subject>: <summary>")."""

    code: int
    lines: tuple[str, ...]
    failed_on: str = ""


def judge_gate(
    command: str, results: Sequence[Finding], job_gpus: Collection[str] | None = None
) -> GateOutcome:
    """The exit status and stderr lines of `nodecheck slurm <command>` for these results
    (`job_gpus`: the bus ids of the job's GPUs, when known)."""
    unusable = unusable_results(results, job_gpus=job_gpus)
    lines = [f"nodecheck {command}: node unusable: {f.line()}" for f in unusable]
    lines += [
        f"nodecheck {command}: passing despite {f.status.value}"
        + (" (not one of the job's GPUs)" if not_the_jobs(f, job_gpus) else "")
        + f": {f.line()}"
        for f in noted_results(results, job_gpus)
    ]
    if not results:
        # Absence is never a pass, but it is no reason to drain either: said.
        lines.append(f"nodecheck {command}: passing, but no check gave a result")
    if not unusable:
        return GateOutcome(EXIT_PASS, tuple(lines))
    return GateOutcome(EXIT_UNUSABLE, tuple(lines), unusable[0].line())


def record_failure(
    config_path: Path | None,
    command: str,
    outcome: GateOutcome,
    environ: Mapping[str, str],
    now: float,
) -> str:
    """Record a failed gate in the configuration's state folder (`config_path` None: the
    default file, else the embedded defaults) for health-check's takeover of the drain
    it causes; what could not be recorded, or "". The job is SLURM_JOB_ID, which Prolog
    and Epilog get. The configuration is read only now, and is never a reason to fail:
    a gate that exited 2 on a bad one would have Slurm drain every node it runs on."""
    from nodecheck.agent.config import DEFAULT_PATH, ConfigError, load_config
    from nodecheck.agent.slurm.hook_failure import (
        HOOK_FAILURE_FILE,
        HookFailure,
        save_hook_failure,
    )
    from nodecheck.checks.registry import load_checks

    not_taken_over = "slurm health-check will not take Slurm's drain over"
    try:
        config = load_config(config_path or DEFAULT_PATH, set(load_checks()))
    except ConfigError as err:
        return f"nodecheck {command}: bad configuration ({err}): {not_taken_over}"
    path = config.state_folder / HOOK_FAILURE_FILE
    job = environ.get("SLURM_JOB_ID", "") or environ.get("SLURM_JOBID", "")
    try:
        save_hook_failure(path, HookFailure(command, now, job, outcome.failed_on))
    except OSError as err:
        return f"nodecheck {command}: cannot record the failure in {path} ({err}): {not_taken_over}"
    return ""


def job_gpu_bus_ids(context: CheckContext, environ: Mapping[str, str]) -> frozenset[str] | None:
    """The bus ids of the GPUs SLURM_JOB_GPUS gives the job (Slurm sets it in the
    prolog's environment: indices of the host's GPUs in bus order, as
    tuning/bindings.py's slurm_gpus reads them); None when it is not set, not a list, or
    the GPUs cannot be read (then every GPU counts)."""
    from nodecheck.checks.node.facts import PartUnavailableError
    from nodecheck.tuning.bindings import parse_gpu_indices, slurm_gpus

    if parse_gpu_indices(environ.get("SLURM_JOB_GPUS", "")) is None:
        return None
    try:
        host = context.part("pci_gpus")
    except PartUnavailableError:
        return None
    return frozenset(gpu.bdf for gpu in slurm_gpus(host, environ, "SLURM_JOB_GPUS"))


def run_gate(
    command: str,
    context: CheckContext,
    names: Sequence[str] | None,
    budget_s: float,
    environ: Mapping[str, str] | None = None,
) -> GateOutcome:
    """Run the checks (`names`; None: every quick check, never a benchmark) on the node,
    each within `budget_s` (they run side by side, so the whole run is within it too),
    and judge what they said. A check past the budget is abandoned as an `error` result
    (a hung reading says nothing about the job), and never costs the others theirs: a
    lost GPU that slows one check still fails the gate through the checks that finished."""
    from dataclasses import replace

    from nodecheck.agent.findings import findings_of
    from nodecheck.checks.registry import load_checks
    from nodecheck.checks.runner import run_checks

    available = load_checks()
    selected = [available[n] for n in names] if names is not None else list(available.values())
    bounded = [replace(check, timeout_s=min(check.timeout_s, budget_s)) for check in selected]
    runs = run_checks(bounded, context)
    job_gpus = job_gpu_bus_ids(context, environ) if environ is not None else None
    return judge_gate(command, [f for run in runs for f in findings_of(run)], job_gpus)


def say(outcome: GateOutcome, stream: TextIO | None = None) -> None:
    """The lines on stderr, control characters escaped: a summary carries what the node
    said (a process name, a kernel log line), which must not start a line of its own."""
    from nodecheck.checks.printable import printable

    for line in outcome.lines:
        print(printable(line), file=stream or sys.stderr, flush=True)
