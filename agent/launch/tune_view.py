"""How `nodecheck tune` prints a plan: a table with reasons, bash exports, a systemd
EnvironmentFile, or the nodecheck.tune/v1 JSON document."""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from typing import Any

from nodecheck.checks.node.variables import CALLING_ENVIRONMENT
from nodecheck.checks.printable import printable, text_table
from nodecheck.tuning.bindings import RankBinding
from nodecheck.tuning.plan import Plan, RankPlan
from nodecheck.tuning.recommendation import Action, Recommendation

TUNE_SCHEMA = "nodecheck.tune/v1"
WRAP = 96
# Characters a systemd EnvironmentFile value may hold unquoted (systemd.exec(5),
# src/basic/env-file.c: whitespace, quotes, backslashes and '$' need quoting).
ENV_FILE_SAFE = re.compile(r"^[A-Za-z0-9_.,:=/+@%^-]*$")
SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _lines(lines: list[str]) -> str:
    """The lines, each escaped (printable()): names, values and process names found on the
    node (any user's job) pass through here, so a newline in one cannot start a command in
    sourced shell output, a variable in an EnvironmentFile, or an escape sequence on a
    terminal."""
    return "\n".join(printable(line) for line in lines) + "\n"


def _selected(plan: Plan, local_rank: int | None) -> list[RankPlan]:
    if local_rank is None:
        return plan.ranks
    rank = plan.rank(local_rank)
    return [rank] if rank is not None else []


def refused_rank(plan: Plan, local_rank: int | None) -> str:
    """Why the asked local rank must not run, as `nodecheck exec` refuses it (CUDA cannot
    drive its GPU, or it has no CPU to run on): "local rank N: why". "" when no rank is
    asked or it can run (an unknown rank is a usage error before this)."""
    rank = plan.rank(local_rank) if local_rank is not None else None
    reason = "" if rank is None else rank.refusal or rank.error
    return f"local rank {local_rank}: {reason}" if reason else ""


# What `tune --format shell --local-rank N` prints last for a rank that must not run: a
# launcher doing `eval "$(nodecheck tune --local-rank $LOCAL_RANK)"` loses nodecheck's
# exit status (eval returns its last command's), so the evaluated text itself fails with
# nodecheck's status 2, stopping a `set -e` script or an `eval ... || exit`. A subshell's
# exit, never `exit`: evaluated by hand in an interactive shell, it must not close it.
FAIL_WHEN_EVALUATED = "(exit 2)"


def _shared_rank_env(ranks: list[RankPlan]) -> tuple[dict[str, str], list[str]]:
    """Rank variables every selected rank gives the same value (safe to export once), and
    the names that differ between ranks."""
    values: dict[str, set[str]] = {}
    for rank in ranks:
        for recommendation in rank.env:
            if recommendation.value is not None:
                values.setdefault(recommendation.name, set()).add(recommendation.value)
    same = {name: next(iter(v)) for name, v in values.items() if len(v) == 1}
    return same, sorted(name for name, v in values.items() if len(v) > 1)


def exported(plan: Plan, local_rank: int | None) -> dict[str, str]:
    """What the shell and env formats set."""
    ranks = _selected(plan, local_rank)
    same, _ = _shared_rank_env(ranks)
    return {**plan.environment(None), **same}


def _rank_command(rank: RankPlan) -> str:
    """How to launch the rank, or why not to."""
    if rank.refusal or rank.error:
        return f"do not run it here (nodecheck exec refuses): {rank.refusal or rank.error}"
    command = f"{shlex.join(rank.binding.numactl())} CMD  (or: nodecheck exec -- CMD)"
    return f"{command}; warning: {rank.warning}" if rank.warning else command


def _budget_comments(ranks: list[RankPlan]) -> list[str]:
    """How each rank's CPUs are split, once where every rank's split is the same."""
    splits = {
        rank.local_rank: f"{rank.budget.split()}; DataLoader(num_workers="
        f"{rank.dataloader.num_workers}, pin_memory=True) in the script"
        for rank in ranks
    }
    if len(set(splits.values())) == 1 and len(splits) > 1:
        return [f"# every rank's CPU budget: {next(iter(splits.values()))}"]
    return [f"# rank {number}'s CPU budget: {split}" for number, split in splits.items()]


def _header(plan: Plan, local_rank: int | None) -> list[str]:
    ranks = _selected(plan, local_rank)
    lines = [f"# nodecheck tune for {plan.hostname}"]
    if local_rank is not None and ranks:
        rank = ranks[0]
        node = rank.binding.numa_node
        lines[0] += (
            f", local rank {local_rank}: GPU {rank.binding.gpu}, "
            f"NUMA node {'?' if node is None else node}, CPUs {rank.cpulist or 'none'}"
        )
    for rank in ranks:
        lines.append(f"# rank {rank.local_rank}: {_rank_command(rank)}")
    srun = srun_binding(plan)
    if srun and local_rank is None:
        lines.append(f"# or with srun (Slurm binds each task): srun {srun} CMD")
    lines += _budget_comments([rank for rank in ranks if not rank.error])
    lines += [f"# note: {note}" for note in plan.notes]
    _, differing = _shared_rank_env(ranks)
    if differing:
        lines.append(
            f"# {', '.join(differing)} differ between ranks: use --local-rank N, or nodecheck exec"
        )
    return lines


def _removal_comment(removal: Recommendation) -> str:
    fix = removal.source.split("to fix: ", 1)[-1]
    return f"# {removal.name}={removal.flagged_value}: {fix}"


def render_shell(plan: Plan, local_rank: int | None) -> str:
    """`export` lines bash can source; red flags are unset, those in files are named. For a
    local rank that must not run: nothing exported, the reason on the shell's stderr, and
    a failing last command."""
    lines = _header(plan, local_rank)
    refusal = refused_rank(plan, local_rank)
    if refusal:
        lines += [
            f"# local rank {local_rank} must not run here: nothing is exported, and this "
            "fails when evaluated (status 2, as nodecheck tune and exec exit)",
            # The reason is in the comments above and on nodecheck's own stderr: said once.
            "echo "
            + shlex.quote(f"nodecheck tune: local rank {local_rank} must not run here: stopping")
            + " >&2",
            FAIL_WHEN_EVALUATED,
        ]
        return _lines(lines)
    values = exported(plan, local_rank)
    for rank in _selected(plan, local_rank) if local_rank is not None else []:
        # Sourced with eval "$(nodecheck tune --local-rank N)", comments go unseen: say it
        # on the shell's stderr.
        problems = [*plan.unusable, rank.warning]
        for problem in dict.fromkeys(problem for problem in problems if problem):
            lines.append(f"echo {shlex.quote(f'nodecheck tune: {problem}')} >&2")
    lines += [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    unset = {removal.name for removal in unsets(plan, values)}
    for removal in plan.removals:
        # One exported above replaces this shell's value; one found in a file or another
        # job still needs its own fix, which the comment gives.
        if removal.name in unset:
            lines.append(f"unset {removal.name}  # {textwrap.shorten(removal.reason, 90)}")
        if removal.found_in != (CALLING_ENVIRONMENT.label,):
            lines.append(_removal_comment(removal))
    return _lines(lines)


def unsets(plan: Plan, values: dict[str, str]) -> list[Recommendation]:
    """The flagged variables the shell output unsets: those set in the calling
    environment that no exported value (`values`) replaces."""
    return [
        removal
        for removal in plan.removals
        if removal.name not in values
        and removal.current is not None
        and SHELL_NAME.match(removal.name)
    ]


def srun_binding(plan: Plan) -> str:
    """The srun options that bind each task's CPUs and memory as the ranks' numactl lines
    do, or why there are none. srun(1): `--cpu-bind=mask_cpu:<mask_for_task_0>,...` (hex
    masks, local task N gets the Nth; `map_cpu:<cpu_for_task_0>,...` where each task has
    one CPU) and `--mem-bind=map_mem:<numa_node_for_task_0>,...`
    (https://slurm.schedmd.com/srun.html); Slurm's local task N is SLURM_LOCALID N, the
    same local rank."""
    if not plan.ranks or any(not rank.binding.cpus for rank in plan.ranks):
        return ""  # a rank without CPUs has no binding (its own line says why)
    masks = cpu_bind_values(plan)
    kind = "map_cpu" if all(len(rank.binding.cpus) == 1 for rank in plan.ranks) else "mask_cpu"
    options = f"--ntasks-per-node={len(plan.ranks)} --cpu-bind={kind}:{','.join(masks)}"
    nodes = [rank.binding.membind for rank in plan.ranks]
    if all(node is not None for node in nodes):
        options += f" --mem-bind=map_mem:{','.join(str(node) for node in nodes)}"
    return options


def _node_column(binding: RankBinding) -> str:
    """The rank's NUMA node, and where its memory goes when elsewhere."""
    if binding.numa_node is None:
        return "-"
    if binding.memory_unbound:
        return f"{binding.numa_node} (memory unbound)"
    if binding.membind != binding.numa_node:
        return f"{binding.numa_node} (memory {binding.membind})"
    return str(binding.numa_node)


def cpu_bind_values(plan: Plan) -> list[str]:
    """Each rank's CPUs as srun's --cpu-bind list takes them, in local rank order: its one
    CPU's number where every rank has one CPU (map_cpu), else its hex mask (mask_cpu, bit
    N for CPU N)."""
    if all(len(rank.binding.cpus) == 1 for rank in plan.ranks):
        return [str(rank.binding.cpus[0]) for rank in plan.ranks]
    return [hex(sum(1 << cpu for cpu in set(rank.binding.cpus))) for rank in plan.ranks]


def cpus_of_cpu_bind(value: str) -> list[frozenset[int]]:
    """The CPU set of each task in a --cpu-bind=map_cpu:/mask_cpu: option, as srun(1)
    reads it (a mask is hexadecimal, "0x" optional): what checks `srun_binding`."""
    kind, _, listed = value.removeprefix("--cpu-bind=").partition(":")
    if kind == "map_cpu":
        return [frozenset({int(cpu)}) for cpu in listed.split(",")]
    if kind != "mask_cpu":
        raise ValueError(f"not a map_cpu or mask_cpu binding: {value!r}")
    sets = []
    for mask in listed.split(","):
        bits = int(mask, 16)
        sets.append(frozenset(n for n in range(bits.bit_length()) if bits >> n & 1))
    return sets


def env_file_value(value: str) -> str:
    """The value as EnvironmentFile= reads it back; values are single-line by construction
    (tuning keeps only printable values), and a control character is refused."""
    if not value.isprintable():
        raise ValueError(f"not a single-line printable value: {value!r}")
    if ENV_FILE_SAFE.match(value):
        return value
    escaped = re.sub(r'(["\\`$])', r"\\\1", value)
    return f'"{escaped}"'


def render_env(plan: Plan, local_rank: int | None) -> str:
    """A file for systemd's EnvironmentFile= (one NAME=value a line). For a local rank that
    must not run, comments only: systemd cannot be made to fail on a file's content, so
    the exit status (2) is what a unit's ExecStartPre or a script must check."""
    lines = [*_header(plan, local_rank), "# for EnvironmentFile= in a unit (systemd.exec(5))"]
    if refused_rank(plan, local_rank):
        lines.append(
            f"# local rank {local_rank} must not run here: nothing to set (nodecheck tune exits 2)"
        )
        return _lines(lines)
    values = exported(plan, local_rank)
    lines += [f"{name}={env_file_value(value)}" for name, value in values.items()]
    for removal in plan.removals:
        if removal.name not in values:
            lines.append(
                _removal_comment(removal) + f" (in a unit: UnsetEnvironment={removal.name})"
            )
        elif removal.found_in != (CALLING_ENVIRONMENT.label,):
            lines.append(_removal_comment(removal))  # set above; its other places need a fix
    return _lines(lines)


def _recommendation_json(recommendation: Recommendation) -> dict[str, Any]:
    return {
        "name": recommendation.name,
        "value": recommendation.value,
        "action": recommendation.action.value,
        # Only an audited variable's value (or nodecheck's own) is ever shown; another one
        # the caller set is only said to be set.
        "current": recommendation.current,
        "is_set": recommendation.is_set,
        "reason": recommendation.reason,
        "source": recommendation.source,
        "advisory": recommendation.advisory,
        **(
            {
                "found_in": list(recommendation.found_in),
                "flagged_value": recommendation.flagged_value,
                "replacement": recommendation.replacement,
            }
            if recommendation.found_in
            else {}
        ),
    }


def _rank_status(rank: RankPlan) -> str:
    """As a check's result: error (no CPU to run on), fail (CUDA cannot drive its GPU),
    warn (it runs, but see its warning), ok."""
    if rank.error:
        return "error"
    if rank.refusal:
        return "fail"
    return "warn" if rank.warning else "ok"


def tune_document(plan: Plan, local_rank: int | None) -> dict[str, Any]:
    ranks = _selected(plan, local_rank)
    return {
        "schema": TUNE_SCHEMA,
        "hostname": plan.hostname,
        "env": plan.environment(None),
        "ranks": [
            {
                "local_rank": rank.local_rank,
                "gpu": rank.binding.gpu,
                "numa_node": rank.binding.numa_node,
                # The node --membind names: a memory-only node for a CPU-only one.
                "membind": rank.binding.membind,
                "cpus": list(rank.binding.cpus),
                "cpulist": rank.cpulist,
                # A rank without CPUs has no command line: it is an error, and says why.
                "numactl": rank.binding.numactl() if rank.binding.cpus else None,
                "status": _rank_status(rank),
                "env": {r.name: r.value for r in rank.env if r.value is not None},
                "nics": list(rank.nics.nics),
                "nic_relation": rank.nics.relation,
                # Storage ports as near as the rank's own NICs: named, never given as equals.
                "also_near": list(rank.nics.also_near),
                "dataloader": None
                if rank.error
                else {
                    "num_workers": rank.dataloader.num_workers,
                    "pin_memory": rank.dataloader.pin_memory,
                },
                # How the rank's CPUs are shared: OMP_NUM_THREADS (the process's own
                # thread included) + workers + the pin-memory thread.
                "cpu_budget": None
                if rank.error
                else {
                    "cpus": rank.budget.cpus,
                    "intra_op_threads": rank.budget.intra_op,
                    "dataloader_workers": rank.budget.workers,
                    "pin_memory_thread": rank.budget.pin_thread,
                    "split": rank.budget.split(),
                },
                "recommendations": [_recommendation_json(r) for r in rank.env],
                **({"note": rank.binding.note} if rank.binding.note else {}),
                **({"refusal": rank.refusal} if rank.refusal else {}),
                **({"error": rank.error} if rank.error else {}),
                **({"warning": rank.warning} if rank.warning else {}),
            }
            for rank in ranks
        ],
        "recommendations": [_recommendation_json(r) for r in plan.env],
        "unset": [_recommendation_json(r) for r in plan.removals],
        "left_unset": [
            {
                "names": list(left.names),
                "reason": left.reason,
                "source": left.source,
                "set_now": list(left.found),
                "verdict": left.verdict,
            }
            for left in plan.left_unset
        ],
        "notes": plan.notes,
        # The job's torch and NCCL that the renamed variables and version-dependent
        # defaults follow: the version read ("" where the job's is not known), where from,
        # and what was seen elsewhere (nodecheck's own Python, the node's libraries).
        "versions": {
            evidence.project.lower(): {
                "version": evidence.text if evidence.known is not None else None,
                "from": evidence.origin if evidence.known is not None else None,
                "known": evidence.known is not None,
                "seen_elsewhere": list(evidence.elsewhere),
            }
            for evidence in (plan.torch, plan.nccl)
        },
        "code_hints": [
            {"title": h.title, "code": h.code, "reason": h.reason, "source": h.source}
            for h in plan.code_hints
        ],
    }


def render_json(plan: Plan, local_rank: int | None) -> str:
    return json.dumps(tune_document(plan, local_rank), indent=2)


def _explained(head: str, reason: str, source: str) -> list[str]:
    lines = [f"  {head}"]
    lines += textwrap.wrap(reason, WRAP, initial_indent=" " * 10, subsequent_indent=" " * 10)
    lines += textwrap.wrap(f"[{source}]", WRAP, initial_indent=" " * 10, subsequent_indent=" " * 11)
    return lines


def _recommendation_head(recommendation: Recommendation, shown_value: str | None = None) -> str:
    action = recommendation.action
    value = shown_value if shown_value is not None else recommendation.value
    head = f"{action.value:<7} {recommendation.name}"
    if action is Action.UNSET:
        return head
    head += f"={value}"
    if action is Action.CHANGE:
        now = (
            "set by the caller, nodecheck sets this"
            if recommendation.current_hidden
            else f"now {recommendation.current}"
        )
        head += f"  ({now}"
        head += "; it works, so nodecheck exec keeps it)" if recommendation.advisory else ")"
    return head


def render_text(plan: Plan, local_rank: int | None) -> str:
    ranks = _selected(plan, local_rank)
    lines = [f"nodecheck tune: {plan.hostname}"]
    if ranks:
        gpus = [rank.binding.gpu for rank in plan.ranks]
        # CUDA_VISIBLE_DEVICES may name the GPUs out of bus order: CUDA counts them as named.
        order = "PCI bus order" if gpus == sorted(gpus) else "CUDA_VISIBLE_DEVICES's order"
        lines[0] += f", {len(plan.ranks)} GPU rank(s); local rank N drives the Nth GPU in {order}"
        rows = [
            [
                str(rank.local_rank),
                rank.binding.gpu
                + (
                    " (unusable: do not run)"
                    if rank.refusal
                    else " (error: no CPU, do not run)"
                    if rank.error
                    else ""
                ),
                _node_column(rank.binding),
                rank.cpulist or "-",
                ", ".join(f"{r.name}={r.value}" for r in rank.env),
                "-" if rank.error else str(rank.dataloader.num_workers),
                f"{rank.nics.nics[0]} ({rank.nics.relation})" if rank.nics.nics else "-",
            ]
            for rank in ranks
        ]
        lines += ["", *text_table(["RANK", "GPU", "NUMA", "CPUS", "ENV", "WORKERS", "NIC"], rows)]
        lines += ["", "Bind each rank (or launch it with `nodecheck exec -- CMD`):"]
        for rank in ranks:
            lines += textwrap.wrap(
                f"rank {rank.local_rank}: {_rank_command(rank)}",
                WRAP,
                initial_indent="  ",
                subsequent_indent="    ",
                break_on_hyphens=False,
            )
        srun = srun_binding(plan)
        if srun and local_rank is None:
            # One line, unwrapped: it is copied as it is.
            lines += [
                "  or with srun, Slurm binding each task the same way:",
                f"    srun {srun} CMD",
            ]
    if plan.env:
        lines += ["", "Environment for every rank:"]
        for recommendation in plan.env:
            lines += _explained(
                _recommendation_head(recommendation), recommendation.reason, recommendation.source
            )
    if ranks and ranks[0].env:
        lines += ["", "Each rank's own (the ENV column):"]
        for recommendation in ranks[0].env:
            shown = "<ENV>" if len(ranks) > 1 else None
            lines += _explained(
                _recommendation_head(recommendation, shown),
                recommendation.reason,
                recommendation.source,
            )
        hint = ranks[0].dataloader
        lines += _explained(
            "DataLoader(..., num_workers=<WORKERS>, pin_memory=True)  (in the training script)",
            hint.reason,
            hint.source,
        )
    if plan.code_hints:
        lines += ["", "In the training script:"]
        for code_hint in plan.code_hints:
            explained = _explained(code_hint.title, code_hint.reason, code_hint.source)
            lines += [explained[0], f"          {code_hint.code}", *explained[1:]]
    if plan.removals:
        lines += ["", "Remove (flagged by the checks):"]
        for removal in plan.removals:
            verb = "unset " if removal.replacement is None else "change"
            to = "" if removal.replacement is None else f" to {removal.replacement}"
            lines += _explained(
                f"{verb}  {removal.name}={removal.flagged_value}{to}  "
                f"(found in {', '.join(removal.found_in)})",
                removal.reason,
                removal.source,
            )
    if plan.left_unset:
        lines += ["", "Left unset on purpose:"]
        for left in plan.left_unset:
            reason = left.reason
            if left.found:
                reason += f" (set now: {'; '.join(left.found)})"
            if left.verdict:
                reason += f"; {left.verdict}"
            lines += _explained(", ".join(left.names), reason, left.source)
    if plan.notes:
        lines += ["", "Notes:"]
        for note in plan.notes:
            lines += textwrap.wrap(note, WRAP, initial_indent="  - ", subsequent_indent="    ")
    return _lines(lines)


RENDERERS = {
    "text": render_text,
    "shell": render_shell,
    "env": render_env,
    "json": render_json,
}
