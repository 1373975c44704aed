"""NCCL, CUDA and torch.distributed variables that slow, hang or break training.

Sources: see nodecheck.checks.node.variables (calling environment, NCCL's
config files, the environment of every process holding a GPU). The rules are
checks/rules/nccl_settings.py, reached through the dispatch `tune` shares
(checks/rules/variable_judges.py); this check puts their findings into results.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.nccl_library import NcclLibraries
from nodecheck.checks.registry import register
from nodecheck.checks.result import NODE, Action, FaultClass, Origin, Result, Status
from nodecheck.checks.rules.nccl_settings import gid_discovery_results, inventory_problems
from nodecheck.checks.rules.variable_judges import (
    ROCE_GIDS,
    nccl_judge,
    source_problems,
    variable_facts,
)
from nodecheck.checks.settings_audit import audit, sources_summary


@register(
    "nccl_env",
    fault_class=FaultClass.NODE_CONFIG,
    # A variable is what a job or a user set (settings_audit.origin_of says which are
    # the node's own: /etc/nccl.conf).
    action=Action.FIX_JOB_ENVIRONMENT,
    origin=Origin.JOB,
    interval_s=300,
    timeout_s=15,
    needs=("variables", "inventory", ROCE_GIDS, "nccl_library"),
    root=True,
)
def check_nccl_env(ctx: CheckContext) -> Iterator[Result]:
    """NCCL, CUDA and torch.distributed variables that slow, hang or break jobs."""
    facts = variable_facts(ctx, torch_settings=False)  # the allocator's are torch_alloc's
    variables = ctx.variables
    yield from source_problems(variables)
    yield from inventory_problems(ctx.inventory)
    results, samples = audit(variables, nccl_judge(facts), "nccl_env")
    libraries: NcclLibraries = ctx.part("nccl_library")
    results += gid_discovery_results(libraries, facts.nccl, variables)
    results.sort(key=lambda r: -r.status.severity)
    summary, details = sources_summary(variables)
    details = {**details, "nccl_libraries": [library.text for library in libraries.found]}
    if not results:
        yield Result(
            Status.OK,
            NODE,
            f"no NCCL, CUDA or torch.distributed variable to flag in {summary}",
            details=details,
            samples=tuple(samples),
        )
        return
    # The counts and the list of sources ride on the first (worst) finding.
    first, *rest = results
    yield replace(first, details={**first.details, **details}, samples=tuple(samples))
    yield from rest
