"""Variables to remove: what the nccl_env and torch_alloc checks flag, wherever it was
found (the calling environment, NCCL's config files, the environment of jobs on the GPUs).

The judging is the checks' own, through their one dispatch (checks/rules/
variable_judges.py), so `tune` and `check` never disagree about a setting.
"""

from __future__ import annotations

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.variables import CALLING_ENVIRONMENT, Setting
from nodecheck.checks.result import Status
from nodecheck.checks.rules.variable_judges import judge_variable, variable_facts
from nodecheck.checks.settings_audit import SettingJudgement, remedy_for
from nodecheck.tuning.recommendation import Recommendation

FLAGGED = (Status.WARN, Status.FAIL)


def removals(ctx: CheckContext) -> list[Recommendation]:
    """One removal per flagged (name, value), naming every place it was found, worst first."""
    facts = variable_facts(ctx)
    grouped: dict[tuple[str, str], tuple[str, list[SettingJudgement], list[Setting]]] = {}
    for setting in ctx.variables.settings:
        check, judged = judge_variable(setting, facts)
        findings = [f for f in judged if f.status in FLAGGED]
        if not findings:
            continue
        _, found, settings = grouped.setdefault((setting.name, setting.value), (check, [], []))
        found += [f for f in findings if f not in found]
        settings.append(setting)
    entries = []
    for (name, value), (check, findings, settings) in grouped.items():
        worst = max(f.status.severity for f in findings)
        replacement = next((f.replacement for f in findings if f.replacement), None)
        remedies = list(dict.fromkeys(remedy_for(s, replacement) for s in settings))
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
