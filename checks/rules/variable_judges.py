"""Which judge each variable goes to: the one dispatch of the nccl_env and torch_alloc
checks and of `tune`'s removals (tuning/red_flags.py), so `check` and `tune` never
disagree about a setting.

The PYTORCH_ variables are the allocator's (torch_alloc, allocator_settings); every
other audited variable is NCCL's (nccl_env, nccl_settings), NCCL_IB_GID_INDEX judged
against the RoCE ports' GID tables as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import PartUnavailableError, Unread
from nodecheck.checks.node.net import PortGidTypes
from nodecheck.checks.node.variables import Setting, Variables
from nodecheck.checks.record import record
from nodecheck.checks.result import NODE, Result, Status
from nodecheck.checks.rules.allocator_settings import judge_alloc_setting
from nodecheck.checks.rules.job_versions import UNKNOWN_TORCH, JobTorch, job_torch
from nodecheck.checks.rules.nccl_settings import (
    GID_INDEX,
    NcclFacts,
    gid_index_findings,
    judge_setting,
    nccl_facts,
)
from nodecheck.checks.settings_audit import SettingJudgement

if TYPE_CHECKING:
    # Types only: `check` imports no reader it does not run.
    from nodecheck.checks.node.job_versions import JobVersions

NCCL_ENV = "nccl_env"
TORCH_ALLOC = "torch_alloc"
ROCE_GIDS = "roce_gids"  # the part holding the RoCE ports' GID tables
JOB_VERSIONS = "job_versions"  # the job's torch and NCCL, where they were read
# What stands in for the GID tables where no setting names a GID index: they are read
# only then (a RoCE port's table has up to 256 entries, each a file).
GIDS_NOT_READ = Unread("the GID tables were not read: no setting names a GID index", "not read")


@record
class VariableFacts:
    """What the variable judges need beside the Setting itself."""

    nccl: NcclFacts
    gid_tables: list[PortGidTypes] | Unread = GIDS_NOT_READ
    # The torch that reads each setting (its version decides some options' limits).
    torch: JobTorch = UNKNOWN_TORCH


def judging_check(name: str) -> str:
    """The check whose judge a variable goes to: torch_alloc or nccl_env."""
    return TORCH_ALLOC if name.strip().startswith("PYTORCH_") else NCCL_ENV


def allocator_judge(torch: JobTorch) -> Callable[[Setting], list[SettingJudgement]]:
    """torch_alloc's judge: the allocator's rules, for the variables that are its, by the
    version of the torch that reads each."""

    def judge(setting: Setting) -> list[SettingJudgement]:
        if judging_check(setting.name) != TORCH_ALLOC:
            return []
        return judge_alloc_setting(setting, torch.for_source(setting.source))

    return judge


def nccl_judge(facts: VariableFacts) -> Callable[[Setting], list[SettingJudgement]]:
    """nccl_env's judge: NCCL's rules over `facts`, for the variables that are its."""

    def judge(setting: Setting) -> list[SettingJudgement]:
        if judging_check(setting.name) != NCCL_ENV:
            return []
        findings = judge_setting(setting, facts.nccl)
        if setting.name.strip() == GID_INDEX:
            findings += gid_index_findings(setting, facts.nccl, facts.gid_tables)
        return findings

    return judge


def judge_variable(setting: Setting, facts: VariableFacts) -> tuple[str, list[SettingJudgement]]:
    """The check a variable is judged by, and that check's findings for it."""
    check = judging_check(setting.name)
    if check == TORCH_ALLOC:
        return check, allocator_judge(facts.torch)(setting)
    return check, nccl_judge(facts)(setting)


def names_gid_index(variables: Variables) -> bool:
    return any(setting.name.strip() == GID_INDEX for setting in variables.settings)


def job_torch_of(ctx: CheckContext) -> JobTorch:
    """The job's torch from the `job_versions` part (unknown where it is unread).
    nodecheck's own Python's torch is not read: it is never the job's, and a check that
    judges a setting by the job's torch says nothing of it (`tune` says it beside)."""
    try:
        versions: JobVersions | None = ctx.part(JOB_VERSIONS)
    except PartUnavailableError:
        versions = None
    return JobTorch(job_torch(versions, None), versions)


def variable_facts(ctx: CheckContext, torch_settings: bool = True) -> VariableFacts:
    """The facts the judges take, from the context's parts: the inventory's network facts,
    the job's torch (where the allocator's settings are judged too: `torch_settings`), and
    the GID tables where a setting names a GID index (why not, if they are unread)."""
    facts = nccl_facts(ctx.inventory)
    torch = job_torch_of(ctx) if torch_settings else UNKNOWN_TORCH
    if not names_gid_index(ctx.variables):
        return VariableFacts(facts, torch=torch)
    try:
        tables: list[PortGidTypes] = ctx.part(ROCE_GIDS)
    except PartUnavailableError as err:
        return VariableFacts(facts, err.unread, torch)
    return VariableFacts(facts, tables, torch)


def source_problems(variables: Variables) -> list[Result]:
    """A source that could not be read (for a reason other than permissions) or was read
    only in part: what it holds is undetermined, an `error` naming the path."""
    return [
        Result(Status.ERROR, NODE, f"cannot audit all of {problem}", details={"source": problem})
        for problem in variables.problems
    ]
