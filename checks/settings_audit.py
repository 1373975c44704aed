"""Auditing variables: judge each setting, group equal findings, say where each was found.

Shared by the checks that audit environment variables (nccl_env, torch_alloc).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from nodecheck.checks.node.variables import Setting, Variables
from nodecheck.checks.record import record
from nodecheck.checks.result import NODE, Action, MetricSpec, Origin, Result, Sample, Status

FLAGGED = MetricSpec(
    "nodecheck_env_flagged_settings",
    "gauge",
    "NCCL/CUDA/torch variables flagged by the last audit, by check and severity",
    ("check", "severity"),
)


@record
class SettingJudgement:
    status: Status
    reason: str
    # The value that fixes it where removing the variable would lose something
    # (NCCL_DEBUG=INFO -> WARN: unset, NCCL logs nothing); None: remove it.
    replacement: str | None = None


def remedy_for(setting: Setting, replacement: str | None = None) -> str:
    name = setting.name.strip()
    if replacement is not None:
        fixed = f"{name}={replacement}"
        if setting.source.kind == "file":
            return f"change line {setting.line} of {setting.source.label} to {fixed}"
        if setting.source.kind == "process":
            return f"set {fixed} in the launch environment of {setting.source.label}"
        return f"export {fixed}"
    if setting.source.kind == "file":
        return f"remove line {setting.line} ({name}) from {setting.source.label}"
    if setting.source.kind == "process":
        return f"remove {setting.name} from the launch environment of {setting.source.label}"
    return f"unset {setting.name}"


def origin_of(settings: list[Setting]) -> Origin:
    """The node's when a node-wide file sets it (every job gets it); a job's otherwise:
    a variable in a launch environment, NCCL_CONF_FILE or ~/.nccl.conf is what a user set,
    and never takes the node out of service."""
    return Origin.NODE if any(s.source.node_wide for s in settings) else Origin.JOB


def audit(
    variables: Variables,
    judge: Callable[[Setting], list[SettingJudgement]],
    check_name: str,
) -> tuple[list[Result], list[Sample]]:
    """Judge every setting; the same finding from many sources becomes one result."""
    grouped: dict[tuple[str, str, Status, str, str | None], list[Setting]] = {}
    for setting in variables.settings:
        for finding in judge(setting):
            key = (setting.name, setting.value, finding.status, finding.reason, finding.replacement)
            grouped.setdefault(key, []).append(setting)
    results = []
    for (name, value, status, reason, replacement), settings in grouped.items():
        places = [setting.where for setting in settings]
        shown = ", ".join(places[:3]) + (f" and {len(places) - 3} more" if len(places) > 3 else "")
        # Removing (or replacing) a setting is the fix for what it does wrong, not for
        # what could not be told about it (an error).
        judged = status in (Status.WARN, Status.FAIL)
        remedies = (
            list(dict.fromkeys(remedy_for(s, replacement) for s in settings)) if judged else []
        )
        origin = origin_of(settings)
        results.append(
            Result(
                status,
                NODE,
                f"{name.strip()}={value.strip()}: {reason} (found in {shown})",
                "; ".join(remedies[:3]) + ("; ..." if len(remedies) > 3 else ""),
                {"variable": name, "value": value, "found_in": places},
                action=(
                    Action.FIX_NODE_CONFIG if origin is Origin.NODE else Action.FIX_JOB_ENVIRONMENT
                ),
                origin=origin,
            )
        )
    counts = {
        severity: sum(1 for r in results if r.status is severity)
        for severity in (Status.FAIL, Status.WARN)
    }
    samples = [
        Sample(FLAGGED, count, {"check": check_name, "severity": severity.value})
        for severity, count in counts.items()
    ]
    return sorted(results, key=lambda r: -r.status.severity), samples


def sources_summary(variables: Variables) -> tuple[str, dict[str, object]]:
    labels = [source.label for source in variables.sources]
    processes = sum(1 for source in variables.sources if source.kind == "process")
    text = f"{len(labels)} source(s): " + ", ".join(
        label for label in labels if not label.startswith("pid ")
    )
    if processes:
        text += f", {processes} GPU process(es)"
    if variables.unreadable:
        text += f"; {len(variables.unreadable)} process(es) or file(s) not readable"
        if os.geteuid() != 0:  # root was refused too: no advice to give
            text += " (run as root to audit other users' jobs)"
    return text, {"sources": labels, "unreadable": variables.unreadable}
