"""Variables to remove: what the nccl_env and torch_alloc checks flag, wherever it was
found (the calling environment, NCCL's config files, the environment of jobs on the GPUs).

The judging is the checks' own (checks/host/nccl_env.py, checks/host/torch_alloc.py),
so `tune` and `check` never disagree about a setting.
"""

from __future__ import annotations

from nodecheck.checks.context import CheckContext
from nodecheck.checks.host.nccl_env import gid_index_findings, judge_setting, node_facts
from nodecheck.checks.host.torch_alloc import judge_alloc_setting
from nodecheck.checks.node.variables import CALLING_ENVIRONMENT, Setting
from nodecheck.checks.result import Status
from nodecheck.checks.settings_audit import Finding, remedy_for
from nodecheck.tuning.recommendation import Recommendation

FLAGGED = (Status.WARN, Status.FAIL)


def _findings(ctx: CheckContext, setting: Setting) -> list[Finding]:
    name = setting.name.strip()
    if name.startswith("PYTORCH_"):
        return judge_alloc_setting(setting)
    findings = judge_setting(setting, node_facts(ctx.inventory))
    if name == "NCCL_IB_GID_INDEX":
        findings += gid_index_findings(ctx, setting)
    return findings


def removals(ctx: CheckContext) -> list[Recommendation]:
    """One removal per flagged (name, value), naming every place it was found, worst first."""
    grouped: dict[tuple[str, str], tuple[list[Finding], list[Setting]]] = {}
    for setting in ctx.variables.settings:
        findings = [f for f in _findings(ctx, setting) if f.status in FLAGGED]
        if not findings:
            continue
        found, settings = grouped.setdefault((setting.name, setting.value), ([], []))
        found += [f for f in findings if f not in found]
        settings.append(setting)
    entries = []
    for (name, value), (findings, settings) in grouped.items():
        worst = max(f.status.severity for f in findings)
        replacement = next((f.replacement for f in findings if f.replacement), None)
        remedies = list(dict.fromkeys(remedy_for(s, replacement) for s in settings))
        check = "torch_alloc" if name.strip().startswith("PYTORCH_") else "nccl_env"
        entries.append(
            (
                -worst,
                Recommendation(
                    name.strip(),
                    None,
                    "; ".join(f.reason for f in findings),
                    f"the {check} check; to fix: " + "; ".join(remedies),
                    # Only a flagged value in the calling environment is this shell's to unset.
                    value if any(s.source == CALLING_ENVIRONMENT for s in settings) else None,
                    tuple(s.where for s in settings),
                    value,
                    Status.FAIL.value if worst == Status.FAIL.severity else Status.WARN.value,
                    replacement=replacement,
                ),
            )
        )
    return [entry for _, entry in sorted(entries, key=lambda e: (e[0], e[1].name))]
