"""`nodecheck slurm task-prolog`, for slurm.conf's TaskProlog=: this task's `tune`
environment, applied as `nodecheck exec` applies it (the job's own working values kept),
in the lines slurmstepd reads back from a task prolog's stdout: every job gets it with
no change to its scripts.

The protocol (Slurm's doc/html/prolog_epilog.shtml, https://slurm.schedmd.com/prolog_epilog.html,
and its parser, `_proc_stdout` in src/slurmd/slurmstepd/task.c of SchedMD/slurm):
  - `export NAME=value` sets NAME in the task's environment. The value is everything
    after the first '=' up to the end of the line, taken literally: no shell quoting is
    undone, so a value is written as it is, never shell-quoted (quotes would reach the
    task). Spaces before '=' are dropped; spaces after it are part of the value.
  - `unset NAME` removes NAME.
  - `print ...` writes the rest of the line to the task's stdout, into the job's output
    files: nodecheck prints nothing there (a job's output is its user's data); its
    warnings go to the task prolog's stderr, which slurmd logs, and only a refusal (a
    rank that must not run, its task cancelled) is a `print` line, the one thing the
    user must read.
  - anything else is ignored; stdout is read with fgets into a 4096-byte buffer, so a
    longer line would be cut and its rest read as a line of its own.
The task prolog runs as the job's user, in the task's environment (its SLURM_LOCALID,
and CUDA_VISIBLE_DEVICES / SLURM_STEP_GPUS as Slurm's gres plugin set them), once per
task before it starts. The CPU binding is not set here: that is srun's --cpu-bind
(`nodecheck tune` prints the option that equals its numactl lines). The threads are the
task's own, though: slurmstepd applies the task's affinity before its TaskProlog
(src/slurmd/slurmstepd/task.c, exec_task: the task plugin's pre-launch, then the
TaskProlog), so the CPUs this process may run on, capped by SLURM_CPUS_PER_TASK, are the
task's (`srun --cpus-per-task=7 --gpus-per-task=1` gives each task 7, not the 56 CPUs of
its GPU's socket that tune's binding would give a rank).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from nodecheck.agent.launch.rank_exec import applied_environment
from nodecheck.agent.launch.tune_view import SHELL_NAME, refused_rank
from nodecheck.checks.node.variables import parse_count
from nodecheck.checks.printable import one_line
from nodecheck.tuning import pytorch
from nodecheck.tuning.plan import Plan, RankPlan

LOCAL_RANK_VARIABLE = "SLURM_LOCALID"
# fgets(buf, sizeof(buf) - 1, f) with char buf[4096]: at most 4094 characters and the
# newline make one line.
MAX_LINE = 4094
EXIT_MUST_NOT_RUN = 2


class TaskPrologError(Exception):
    """Why no environment can be given: printed as a `print` line, and a non-zero exit."""


def local_rank_of_task(option: int | None, environ: Mapping[str, str]) -> int:
    """The task's local rank: the option, else SLURM_LOCALID (slurmstepd sets it for every
    task; the other launchers' variables are not a Slurm task's)."""
    if option is not None:
        return option
    value = environ.get(LOCAL_RANK_VARIABLE)
    if value is None:
        raise TaskPrologError(
            f"{LOCAL_RANK_VARIABLE} is not set: run as slurm.conf's TaskProlog, or pass "
            "--local-rank N"
        )
    rank = parse_count(value)
    if rank is None:
        raise TaskPrologError(f"{LOCAL_RANK_VARIABLE} is not a local rank (a non-negative integer)")
    return rank


def export_line(name: str, value: str) -> str:
    """`export NAME=value` as slurmstepd reads it back, or ValueError for what it cannot
    carry: a name that is not a variable's, a value with a newline or another control
    character (it would end the line), or a line past fgets' buffer."""
    if not SHELL_NAME.match(name):
        raise ValueError(f"not a variable name: {name!r}")
    if not value.isprintable():
        raise ValueError(f"{name}: not a single-line printable value")
    line = f"export {name}={value}"
    if len(line) > MAX_LINE:
        raise ValueError(f"{name}: {len(line)} characters, past the {MAX_LINE} a line may hold")
    return line


def print_line(text: str) -> str:
    """A `print` line: shown on the task's stdout, one line within fgets' buffer."""
    return "print " + one_line(text, MAX_LINE - len("print "))


def task_cpu_count(environ: Mapping[str, str], affinity: Collection[int] | None) -> int | None:
    """How many CPUs the task has: its affinity's, capped by SLURM_CPUS_PER_TASK; None
    when neither says (the rank's binding from tune stands)."""
    counts = [len(affinity)] if affinity else []
    per_task = parse_count(environ.get("SLURM_CPUS_PER_TASK", ""))
    if per_task:
        counts.append(per_task)
    return min(counts) if counts else None


def with_task_threads(rank: RankPlan, cpus: int | None, environ: Mapping[str, str]) -> RankPlan:
    """The rank's thread counts from the task's `cpus` where it has fewer than the rank's
    binding: OMP_NUM_THREADS and the DataLoader's workers from that budget. The physical
    cores among them in the binding's proportion (a task's CPUs are whole cores as often
    as the binding's are)."""
    if cpus is None or cpus >= rank.budget.cpus:
        return rank
    binding = rank.budget
    cores = None
    if binding.cores and binding.cores < binding.cpus:
        cores = max(1, cpus * binding.cores // binding.cpus)
    budget = pytorch.cpu_budget(cpus, cores)
    others = [r for r in rank.env if r.name != "OMP_NUM_THREADS"]
    threads = pytorch.omp_threads(budget, environ).against(environ)
    return replace(
        rank, env=[*others, threads], budget=budget, dataloader=pytorch.dataloader(budget)
    )


def task_prolog_lines(
    plan: Plan,
    local_rank: int,
    environ: Mapping[str, str],
    affinity: Collection[int] | None = None,
) -> tuple[list[str], list[str], int]:
    """The lines for this task and the exit status: what `nodecheck exec` would apply to
    the task's environment (`environ`), as export and unset lines: its rank's `tune`
    environment, less what the job set itself and works (an advisory change, a value
    the checks only warn about: kept, and said in a print line, as exec does), and the
    variables the checks fail unset. With nothing of the job's own, the task's
    environment is `tune --format shell --local-rank N`'s, its threads from the task's
    own CPUs (`affinity`, this process's, and SLURM_CPUS_PER_TASK). Returns the stdout
    lines, the stderr lines (warnings and notes: never into the job's output) and the
    exit status. A rank that must not run (CUDA cannot drive its GPU, no CPU for it)
    gets no environment, a print line saying why and exit status 2: a failed task prolog
    cancels the task (Slurm's prolog_epilog.shtml), and the print line is what its user
    reads."""
    said = "nodecheck task-prolog"
    if not plan.ranks:
        # TaskProlog= is the whole cluster's: a CPU-only node's tasks run as they are.
        return [], [], 0
    if plan.rank(local_rank) is None:
        # More tasks than GPUs (a CPU step in a GPU job): nothing of tune's fits it, and
        # it is no reason to cancel the task.
        visible = len(plan.ranks)
        return (
            [],
            [
                f"{said}: local rank {local_rank}: this node has {visible} GPU rank(s), "
                f"0-{visible - 1}: nothing set"
            ],
            0,
        )
    refusal = refused_rank(plan, local_rank)
    if refusal:
        return [print_line(f"{said}: must not run here: {refusal}")], [], EXIT_MUST_NOT_RUN
    rank = plan.rank(local_rank)
    assert rank is not None
    notes = [
        f"{said}: warning: {problem}"
        for problem in dict.fromkeys(p for p in (*plan.unusable, rank.warning) if p)
    ]
    cpus = task_cpu_count(environ, affinity)
    tasked = with_task_threads(rank, cpus, environ)
    if tasked is not rank:
        notes.append(
            f"{said}: threads from the task's {cpus} CPU(s) (its affinity, "
            f"SLURM_CPUS_PER_TASK), not the rank's {rank.budget.cpus}: {tasked.budget.split()}"
        )
    lines = []
    env, changed, removed, kept = applied_environment(plan, tasked, environ)
    for name in changed:
        try:
            lines.append(export_line(name, env[name]))
        except ValueError as err:
            notes.append(f"{said}: not exported: {err}")
    lines += [f"unset {name}" for name in removed if SHELL_NAME.match(name)]
    if kept:
        notes.append(f"{said}: kept your {', '.join(kept)} (see nodecheck tune)")
    return lines, notes, 0
