"""`nodecheck npd --class CLASS`: a node-problem-detector custom plugin, one per fault class.

For clusters that already run node-problem-detector (NPD) and want nodecheck's verdicts
as node conditions without giving nodecheck any RBAC: NPD's custom-plugin-monitor runs
this command per rule and NPD itself patches the condition
(deploy/kubernetes/npd/nodecheck-plugin-monitor.json names one rule per class, with the
condition types of agent/kubernetes/fault_classes.py, the same the agent's own reporter sets).

The plugin protocol (kubernetes/node-problem-detector
pkg/custompluginmonitor/plugin/plugin.go, `run`): exit 0 is OK, 1 a problem, anything
else unknown; stdout, trimmed, is the condition's message, cut at the plugin config's
`max_output_length` bytes (80 when unset: pkg/custompluginmonitor/types/config.go,
defaultMaxOutputLength). NPD cuts in the middle of a UTF-8 character; this plugin cuts
first, on whole characters, to the length it is told (`--max-output`), so what NPD
shows is what was written.

The verdict comes from the agent's results file when it is fresh (agent/findings.py
reads and dates it, the same rules as `slurm health-check`), else from the class's quick
checks run here within a budget, never the benchmarks. A finding's class is its own
(agent/findings.py: the check's declaration, or the result's where the evidence says):
a GPU lost under gpu_throttle is a hardware finding. Exit 1 when a finding of the class
fails on the node's own evidence (a job's failing finding, a variable a user set, is a
warning: NPD's condition would keep any node from scheduling), 2 when one could not
determine (or nothing of the class was judged: absence is never a pass), else 0; a
warning is said in the message, exit 0 (a warning is an Event in the agent's reporter,
not a condition).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from nodecheck.agent.findings import (
    Finding,
    ResultsUnusableError,
    findings_of_named,
    fresh_results,
)
from nodecheck.agent.kubernetes.fault_classes import ClassVerdict, checks_of, class_verdict
from nodecheck.checks.printable import one_line
from nodecheck.checks.record import record
from nodecheck.checks.result import FaultClass, Result, Status

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_UNKNOWN = 2


@record
class Verdict:
    """What the plugin says: its exit status and its one line."""

    exit_status: int
    message: str


def judge(fault_class: FaultClass, findings: Sequence[Finding], source: str) -> Verdict:
    """The class's verdict from every finding of the node (those of other classes are
    ignored). `source` says where the findings came from, at the message's end."""
    mine = [f for f in findings if f.fault_class is fault_class]
    by_status: dict[Status, list[Finding]] = {status: [] for status in Status}
    for finding in mine:
        by_status[finding.status_against_node].append(finding)
    failing, errors, warnings = (
        by_status[Status.FAIL],
        by_status[Status.ERROR],
        by_status[Status.WARN],
    )
    judged = [f for f in mine if f.status is not Status.SKIP]
    # The agent's reporter judges its conditions with the same function.
    verdict = class_verdict(f.status_against_node for f in mine)

    def more(of: list[Finding], what: str) -> str:
        return f" (+{len(of) - 1} more {what})" if len(of) > 1 else ""

    if verdict is ClassVerdict.FAILING:
        message = f"{fault_class.value} fail: {failing[0].line()}{more(failing, 'failing')}"
        return Verdict(EXIT_PROBLEM, f"{message}; {source}")
    if errors:
        message = f"{fault_class.value} unknown: {errors[0].line()}{more(errors, 'undetermined')}"
        return Verdict(EXIT_UNKNOWN, f"{message}; {source}")
    if verdict is ClassVerdict.UNDETERMINED:  # nothing judged: absence is never a pass
        checks = sorted({f.check for f in mine})
        what = f"only skipped: {', '.join(checks)}" if checks else "no check of it ran"
        return Verdict(EXIT_UNKNOWN, f"{fault_class.value} unknown: {what}; {source}")
    judged_checks = len({f.check for f in judged})
    if warnings:
        message = f"{fault_class.value} ok, warn: {warnings[0].line()}{more(warnings, 'warning')}"
        return Verdict(EXIT_OK, f"{message}; {source}")
    return Verdict(EXIT_OK, f"{fault_class.value} ok: {judged_checks} checks; {source}")


def npd_verdict(
    *,
    fault_class: FaultClass,
    results_file: Path | None,
    max_age_s: float,
    enabled: Sequence[str],
    run_quick_checks: Callable[[Sequence[str], float], list[tuple[str, list[Result]]]],
    budget_s: float,
    now: Callable[[], float] = time.time,
) -> Verdict:
    """The verdict for one class: from the agent's fresh results, else from its quick
    checks (`enabled`, those of the class the configuration enables) run within budget_s.
    The callable is the node's side, so the whole run is exercised on replicas."""
    declared = set(checks_of(fault_class))
    mine = [name for name in enabled if name in declared]
    if not mine:
        return Verdict(EXIT_UNKNOWN, f"{fault_class.value} unknown: every check of it is disabled")
    try:
        if results_file is None:
            raise ResultsUnusableError("no results file configured")
        findings = list(fresh_results(results_file, now(), max_age_s, mine).findings)
        source = "agent results"
    except ResultsUnusableError as why:
        ran = run_quick_checks(mine, budget_s)
        findings = [f for name, results in ran for f in findings_of_named(name, results)]
        source = f"own run ({why})"
    return judge(fault_class, findings, source)


def run_npd(
    *,
    fs: Any,
    nvml: Any,
    config_path: Path | None,
    nvml_timeout_s: float | None,
    fault_class: FaultClass,
    budget_s: float,
    max_age_s: float,
    max_output_bytes: int,
) -> Verdict:
    """`nodecheck npd` on this node: the verdict, its message already cut for NPD. A bad
    configuration is unknown too, said on stdout (NPD shows nothing else of it)."""
    from nodecheck.agent.config import DEFAULT_PATH, ConfigError, load_config
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.registry import load_checks
    from nodecheck.checks.runner import run_checks

    registered = load_checks()
    try:
        config = load_config(config_path or DEFAULT_PATH, set(registered))
    except ConfigError as err:
        message = f"{fault_class.value} unknown: bad configuration: {err}"
        return Verdict(EXIT_UNKNOWN, one_line(message, max_output_bytes))
    if nvml_timeout_s is not None:
        config = replace(config, nvml_timeout_s=nvml_timeout_s)
    enabled = [name for name in registered if config.check(name).enabled]

    def run_quick_checks(names: Sequence[str], budget: float) -> list[tuple[str, list[Result]]]:
        # They run at once, each within the budget (run_checks' deadlines), as
        # `slurm health-check` runs its own.
        checks = [
            replace(registered[name], timeout_s=min(registered[name].timeout_s, budget))
            for name in names
        ]
        context = CheckContext(
            fs=fs, nvml=nvml, kernel_log=config.kernel_log, config=config.check_config()
        )
        return [(run.check.name, run.results) for run in run_checks(checks, context)]

    verdict = npd_verdict(
        fault_class=fault_class,
        results_file=config.results_file,
        max_age_s=max_age_s,
        enabled=enabled,
        run_quick_checks=run_quick_checks,
        budget_s=budget_s,
    )
    return replace(verdict, message=one_line(verdict.message, max_output_bytes))
