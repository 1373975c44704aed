"""PyTorch caching-allocator settings (`PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_ALLOC_CONF`).

The rules are checks/rules/allocator_settings.py (torch aborts at the first CUDA
allocation on an option it does not know), reached through the dispatch `tune`
shares (checks/rules/variable_judges.py); this check puts their findings into results.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.registry import register
from nodecheck.checks.result import NODE, Action, FaultClass, Origin, Result, Status
from nodecheck.checks.rules.allocator_settings import (
    both_names_disagree,
    expandable_segments_advice,
)
from nodecheck.checks.rules.variable_judges import (
    JOB_VERSIONS,
    allocator_judge,
    job_torch_of,
    source_problems,
)
from nodecheck.checks.settings_audit import audit, sources_summary


@register(
    "torch_alloc",
    fault_class=FaultClass.NODE_CONFIG,
    action=Action.FIX_JOB_ENVIRONMENT,
    origin=Origin.JOB,
    interval_s=300,
    timeout_s=15,
    needs=("variables", JOB_VERSIONS, "torch_version"),
    root=True,
)
def check_torch_alloc(ctx: CheckContext) -> Iterator[Result]:
    """PyTorch allocator settings: options torch rejects, and expandable segments."""
    variables = ctx.variables
    yield from source_problems(variables)
    results, samples = audit(variables, allocator_judge(job_torch_of(ctx)), "torch_alloc")
    results += both_names_disagree(variables.settings)
    yield from results
    summary, details = sources_summary(variables)
    text, remedy = expandable_segments_advice(variables.settings)
    yield Result(Status.OK, NODE, f"{text}; audited {summary}", remedy, details, tuple(samples))
