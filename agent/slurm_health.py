"""`nodecheck slurm health-check`: Slurm's HealthCheckProgram, with drain and resume an
operator can trust.

Each run: the node's health (the agent's latest results when fresh, else the quick checks
run here under a hard budget, never the benchmarks), the node's Slurm state (scontrol show
node, bounded), the hysteresis state (healthy runs in a row, since when: slurm_hysteresis,
whose lock the whole run holds), then one action decided by `decide`, a pure function:
drain, undrain, reboot or nothing, with why. One log line says what it did and why.

The rules, against NHC's failures (mej/nhc #134, #95, #161):
- a state that cannot be read (scontrol fails, hangs, answers nonsense) changes nothing;
- a node that is down, not responding, rebooting, powered down, in maintenance or drained
  for a reason not nodecheck's (by prefix and by the user who set it) is never touched;
- `fail` drains with "nodecheck: <check> <subject>: <summary>"; `error` does not unless
  configured; a reboot-class XID may ask for `scontrol reboot ASAP` (off by default);
- UNDRAIN (never RESUME, which also clears DOWN) only a node nodecheck drained, after N
  healthy runs in a row or M seconds healthy (on this boot's clock, which no one can
  step): one healthy run between failing ones never returns the node to service, and a
  run that cannot save its count never undrains on it.

Exit status (slurmd only logs a HealthCheckProgram's non-zero exit with its output: "Any
action to be taken must be explicitly performed by the program", slurm.conf.5): 0 healthy,
1 unhealthy (whatever was done about it), 3 could not determine (the state unreadable, an
scontrol action failed, the results undetermined, a healthy run it could not save, another
run holding the lock past the budget).
"""

from __future__ import annotations

import enum
import json
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from nodecheck.agent.config import SlurmSettings
from nodecheck.agent.slurm_hysteresis import Hysteresis
from nodecheck.checks.node.boot import BootMoment
from nodecheck.checks.node.slurm_state import SlurmNodeState
from nodecheck.checks.printable import one_line
from nodecheck.checks.record import record
from nodecheck.checks.result import Result, Status

log = logging.getLogger(__name__)

RESULTS_SCHEMA = "nodecheck.results/v1"
RESULTS_LIMIT = 8 << 20  # bytes; an 8-GPU node's results are tens of kB
REASON_PREFIX = "nodecheck:"
# Slurm's accounting keeps a node event's reason as a MySQL tinytext, 255 bytes
# (SchedMD/slurm src/plugins/accounting_storage/mysql/accounting_storage_mysql.c,
# event_table_fields): a longer reason is cut there, so it is cut here first, whole
# characters, on one line.
REASON_MAX_BYTES = 255
# gpu_xid's metric: 1 while an XID's action is pending, labelled with the action.
XID_ACTION_PENDING = "nodecheck_gpu_xid_action_pending"

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNDETERMINED = 3


# -- the results ----------------------------------------------------------------------


@record
class Finding:
    """One judged result as health-check needs it."""

    check: str
    status: Status
    subject: str
    summary: str
    reboot: bool = False  # a reboot-class XID whose reboot is still pending


def wants_reboot(result: Result) -> bool:
    return result.status is Status.FAIL and any(
        sample.metric.name == XID_ACTION_PENDING
        and sample.labels.get("action") == "reboot"
        and sample.value == 1
        for sample in result.samples
    )


def findings_of(check: str, results: Iterable[Result]) -> list[Finding]:
    return [Finding(check, r.status, r.subject, r.summary, wants_reboot(r)) for r in results]


@record
class StoredCheck:
    """One check's latest run in the results file."""

    check: str
    finished_at: float  # wall clock
    interval_s: float
    findings: tuple[Finding, ...]
    benchmark: bool = False


def results_text(hostname: str, checks: Sequence[StoredCheck], written_at: float) -> str:
    """The results file: nodecheck.results/v1, each check's run with its time."""
    document = {
        "schema": RESULTS_SCHEMA,
        "hostname": hostname,
        "written_at": written_at,
        "checks": [
            {
                "check": stored.check,
                "finished_at": stored.finished_at,
                "interval_s": stored.interval_s,
                "benchmark": stored.benchmark,
                "results": [
                    {
                        "status": f.status.value,
                        "subject": f.subject,
                        "summary": f.summary,
                        "reboot": f.reboot,
                    }
                    for f in stored.findings
                ],
            }
            for stored in checks
        ],
    }
    return json.dumps(document, indent=1) + "\n"


class ResultsUnusableError(Exception):
    """The results file cannot be judged from: missing, unreadable, damaged or stale."""


def _field(mapping: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise ResultsUnusableError(f"{where}: no {key}")
    value = mapping[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise ResultsUnusableError(
            f"{where}.{key}: {type(value).__name__}, not {kinds[0].__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ResultsUnusableError(f"{where}.{key}: not a finite number")
    return value


def parse_results(text: str) -> tuple[float, list[StoredCheck]]:
    """(written_at, the checks) of a results file's text; ResultsUnusableError naming the field."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ResultsUnusableError(f"not JSON: {err}") from None
    schema = _field(document, "schema", str, "the document")
    if schema != RESULTS_SCHEMA:
        raise ResultsUnusableError(f"schema {schema[:60]!r}, not {RESULTS_SCHEMA}")
    written_at = float(_field(document, "written_at", (int, float), "the document"))
    checks = []
    for index, entry in enumerate(_field(document, "checks", list, "the document")):
        where = f"checks[{index}]"
        findings = []
        for number, result in enumerate(_field(entry, "results", list, where)):
            at = f"{where}.results[{number}]"
            status_text = _field(result, "status", str, at)
            try:
                status = Status(status_text)
            except ValueError:
                raise ResultsUnusableError(f"{at}.status: {status_text[:20]!r}") from None
            findings.append(
                Finding(
                    _field(entry, "check", str, where),
                    status,
                    _field(result, "subject", str, at),
                    _field(result, "summary", str, at),
                    _field(result, "reboot", bool, at),
                )
            )
        if not findings:  # absence is never a pass
            raise ResultsUnusableError(f"{where}: no results")
        interval = float(_field(entry, "interval_s", (int, float), where))
        if interval <= 0:
            raise ResultsUnusableError(f"{where}.interval_s: not positive")
        checks.append(
            StoredCheck(
                _field(entry, "check", str, where),
                float(_field(entry, "finished_at", (int, float), where)),
                interval,
                tuple(findings),
                _field(entry, "benchmark", bool, where),
            )
        )
    if not checks:
        raise ResultsUnusableError("no check in it")
    return written_at, checks


@record
class FreshResults:
    """The agent's results file as judged: when the agent wrote it (its `written_at`,
    which tells one version of the file from the next) and the quick checks' findings."""

    written_at: float
    findings: tuple[Finding, ...]


def fresh_findings(
    path: Path, now: float, max_age_s: float, expected: Collection[str] = ()
) -> list[Finding]:
    """fresh_results' findings."""
    return list(fresh_results(path, now, max_age_s, expected).findings)


def fresh_results(
    path: Path, now: float, max_age_s: float, expected: Collection[str] = ()
) -> FreshResults:
    """The agent's results file when it is fresh: written within
    max_age_s, and each check run within its interval plus max_age_s (a check stuck for
    longer is stale, not healthy); ResultsUnusableError saying why not otherwise. Only the quick
    checks are judged, as when health-check runs them itself: not the benchmarks'. Every
    check of `expected` (those health-check would run) must be there: an agent that has
    just started has only its fast checks' results, and what it has not judged yet is no
    healthy run."""
    from nodecheck.agent.config import UnreadableFileError, read_text_file

    try:
        text = read_text_file(path, RESULTS_LIMIT)
    except UnreadableFileError as err:
        if err.missing:
            raise ResultsUnusableError(f"no results file at {path}") from None
        raise ResultsUnusableError(f"cannot read {path}: {err.reason}") from None
    written_at, checks = parse_results(text)
    age = now - written_at
    if age > max_age_s:
        raise ResultsUnusableError(f"{path} is {age:.0f} s old (at most {max_age_s:g} s)")
    if age < -60:  # one clock, but NTP may step it back a little
        raise ResultsUnusableError(f"{path} is dated {-age:.0f} s in the future")
    chosen = [c for c in checks if not c.benchmark]
    if not chosen:
        raise ResultsUnusableError(f"{path} holds none of the quick checks")
    missing = sorted(set(expected) - {c.check for c in chosen})
    if missing:
        raise ResultsUnusableError(f"{path} has no result of {', '.join(missing)} yet")
    for stored in chosen:
        check_age = now - stored.finished_at
        if check_age > stored.interval_s + max_age_s:
            raise ResultsUnusableError(
                f"{stored.check}'s result in {path} is {check_age:.0f} s old "
                f"(it runs every {stored.interval_s:g} s)"
            )
    return FreshResults(written_at, tuple(f for stored in chosen for f in stored.findings))


# -- the decision ------------------------------------------------------------------------


class Action(str, enum.Enum):
    NOTHING = "nothing"
    DRAIN = "drain"
    UNDRAIN = "undrain"
    REBOOT = "reboot"


@record
class Decision:
    action: Action
    why: str
    reason: str = ""  # the Slurm reason a drain or reboot sets
    exit_status: int = EXIT_HEALTHY


# States nodecheck never acts on: Slurm or an admin has the node (scontrol.1, sinfo.1).
HANDS_OFF_BASES = frozenset({"DOWN", "ERROR", "FUTURE", "UNKNOWN"})
HANDS_OFF_FLAGS = frozenset(
    {
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "REBOOT",
        "MAINTENANCE",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWER_DOWN",
        "POWERING_UP",
        "POWER_UP",
        "FAIL",
        "REBOOT_CANCELED",
        "PLANNED",
        "INVALID_REG",
    }
)


def slurm_reason(finding: Finding) -> str:
    """nodecheck: <check> <subject>: <summary>, on one line, cut to REASON_MAX_BYTES."""
    said = f"{REASON_PREFIX} {finding.check} {finding.subject}: {finding.summary}"
    return one_line(said, REASON_MAX_BYTES)


def is_ours(state: SlurmNodeState, own_user: str) -> bool:
    """A reason nodecheck set: its prefix, and set by nodecheck's user (the prefix alone
    can be typed by anyone, NHC #134)."""
    return (
        state.reason is not None
        and state.reason.startswith(REASON_PREFIX)
        and state.reason_user == own_user
    )


def _with_status(findings: Sequence[Finding], status: Status) -> list[Finding]:
    return [f for f in findings if f.status is status]


def _since(hysteresis: Hysteresis) -> str:
    """When the streak began by the wall clock, for the log line (never for the interval)."""
    if hysteresis.healthy_since_wall is None:
        return ""
    try:
        moment = time.localtime(hysteresis.healthy_since_wall)
    except (OverflowError, OSError, ValueError):  # a saved time past what C's time_t holds
        return ""
    return f" (since {time.strftime('%Y-%m-%dT%H:%M:%S%z', moment)})"


def decide(
    state: SlurmNodeState | None,
    state_problem: str,
    findings: Sequence[Finding],
    hysteresis: Hysteresis,
    settings: SlurmSettings,
    own_user: str,
    now: float,
    unkept: str = "",
) -> Decision:
    """The one action for this run. `state` None: it could not be read (state_problem
    says why). `hysteresis` already counts this run; `now` and its times are on this
    boot's clock. `unkept`: why this healthy run could not be saved ("" when it was):
    it never undrains on a count it could not keep, and it cannot determine (exit 3)."""
    failing = _with_status(findings, Status.FAIL)
    errors = _with_status(findings, Status.ERROR)
    if not findings:  # absence is never a pass
        errors = [Finding("health-check", Status.ERROR, "node", "no result at all")]
    unhealthy = bool(failing) or (settings.drain_on_error and bool(errors))
    exit_status = EXIT_UNHEALTHY if failing else EXIT_UNDETERMINED if errors else EXIT_HEALTHY
    if unkept and exit_status == EXIT_HEALTHY:
        exit_status = EXIT_UNDETERMINED
    culprit = (failing or errors)[0] if failing or errors else None
    health = "healthy"
    if culprit is not None:
        count = f"{len(failing)} failing" if failing else f"{len(errors)} undetermined"
        health = f"{count}, first {culprit.check} {culprit.subject}: {culprit.summary[:160]}"

    def nothing(why: str, status: int = exit_status) -> Decision:
        return Decision(Action.NOTHING, f"{health}; {why}", exit_status=status)

    if state is None:
        return nothing(
            f"the Slurm state is unknown, changing nothing: {state_problem}", EXIT_UNDETERMINED
        )
    flags = state.flags
    if state.base in HANDS_OFF_BASES or state.not_responding or flags & HANDS_OFF_FLAGS:
        shown = (
            state.base
            + ("*" if state.not_responding else "")
            + "".join(f"+{f}" for f in sorted(flags))
        )
        return nothing(f"the node is {shown}: not touching it")
    if state.drained:
        if not is_ours(state, own_user):
            by = f" by {state.reason_user}" if state.reason_user else ""
            return nothing(f"drained for another reason ({state.reason!r}{by}): not touching it")
        if failing or errors:
            return nothing("drained by nodecheck, still not healthy")
        if unkept:
            return nothing(
                f"drained by nodecheck; this healthy run could not be saved ({unkept}): "
                "not undraining on a count it cannot keep"
            )
        runs_due = hysteresis.healthy_runs >= settings.undrain_after_runs
        since = hysteresis.healthy_since
        time_due = (
            settings.undrain_after_s > 0
            and since is not None
            and now - since >= settings.undrain_after_s
        )
        if runs_due or time_due:
            held = (
                f"{hysteresis.healthy_runs} healthy runs in a row"
                if runs_due
                else (f"healthy for {now - (since or now):.0f} s")
            )
            return Decision(
                Action.UNDRAIN, f"healthy: {held}, undraining", exit_status=EXIT_HEALTHY
            )
        return nothing(
            f"drained by nodecheck, healthy {hysteresis.healthy_runs} of "
            f"{settings.undrain_after_runs} runs in a row{_since(hysteresis)} before undraining"
        )
    if not unhealthy or culprit is None:
        return nothing("in service, nothing to do")
    reason = slurm_reason(culprit)
    rebooting = [f for f in failing if f.reboot]
    if settings.reboot_on_xid and rebooting:
        reason = slurm_reason(rebooting[0])
        return Decision(
            Action.REBOOT, f"{health}; a reboot-class XID: rebooting ASAP", reason, exit_status
        )
    return Decision(Action.DRAIN, f"{health}; draining", reason, exit_status)


# -- one run -----------------------------------------------------------------------------


@record
class HealthCheckRun:
    """What one run found and did, for its log line and exit status."""

    source: str  # "agent results" or "own run (<why the results were not used>)"
    decision: Decision
    done: bool  # the action succeeded (or was nothing)
    problem: str = ""


def own_findings(
    run_quick_checks: Callable[[float], list[tuple[str, list[Result]]]], budget_s: float
) -> list[Finding]:
    return [f for name, results in run_quick_checks(budget_s) for f in findings_of(name, results)]


def health_check(
    *,
    node: str,
    results_file: Path | None,
    hysteresis_file: Path,
    settings: SlurmSettings,
    own_user: str,
    run_quick_checks: Callable[[float], list[tuple[str, list[Result]]]],
    read_state: Callable[[], SlurmNodeState],
    act: Callable[[Action, str], tuple[bool, str]],
    read_clock: Callable[[], BootMoment],
    now: Callable[[], float] = time.time,
    expected: Collection[str] = (),
) -> HealthCheckRun:
    """One HealthCheckProgram run, whole under the hysteresis lock (slurm_hysteresis),
    waited for within [slurm] budget: another run holding it longer changes nothing
    here. The callables are the node's side (the checks, scontrol, this boot's clock)
    so that the whole run is exercised with real files and a stand-in scontrol; `now`
    is the wall clock, for the results' age and the log, never for an interval."""
    from nodecheck.agent.slurm_hysteresis import HysteresisBusyError, HysteresisLock, lock_path

    lock: HysteresisLock | None = None
    unlocked = ""
    try:
        lock = HysteresisLock(hysteresis_file, settings.budget_s)
    except HysteresisBusyError as busy:
        decision = Decision(
            Action.NOTHING, f"{busy}: changing nothing", exit_status=EXIT_UNDETERMINED
        )
        return HealthCheckRun("not judged", decision, True, str(busy))
    except OSError as err:
        # No lock, so no count may be saved: the node is still judged, and a failure
        # still drains it, but nothing rests on the count.
        unlocked = f"cannot lock {lock_path(hysteresis_file)}: {err.strerror or err}"
    # The wait for the lock is part of the run's budget.
    budget_s = settings.budget_s - (lock.waited_s if lock is not None else 0.0)
    try:
        findings, source, results_at = findings_and_source(
            results_file, settings, expected, run_quick_checks, budget_s, now()
        )
        return _judge_and_act(
            findings,
            source,
            results_at,
            unlocked,
            hysteresis_file=hysteresis_file,
            settings=settings,
            own_user=own_user,
            read_state=read_state,
            act=act,
            read_clock=read_clock,
            now=now,
        )
    finally:
        if lock is not None:
            lock.release()


def findings_and_source(
    results_file: Path | None,
    settings: SlurmSettings,
    expected: Collection[str],
    run_quick_checks: Callable[[float], list[tuple[str, list[Result]]]],
    budget_s: float,
    now: float,
) -> tuple[list[Finding], str, float | None]:
    """What this run judges: the agent's results when fresh, else the quick checks run
    here within `budget_s`; where they came from; the results' written_at (None: own run)."""
    try:
        if results_file is None:
            raise ResultsUnusableError("no results file configured")
        fresh = fresh_results(results_file, now, settings.results_max_age_s, expected)
        return list(fresh.findings), "agent results", fresh.written_at
    except ResultsUnusableError as why:
        return own_findings(run_quick_checks, budget_s), f"own run ({why})", None


def _judge_and_act(
    findings: list[Finding],
    source: str,
    results_at: float | None,
    unkept: str,
    *,
    hysteresis_file: Path,
    settings: SlurmSettings,
    own_user: str,
    read_state: Callable[[], SlurmNodeState],
    act: Callable[[Action, str], tuple[bool, str]],
    read_clock: Callable[[], BootMoment],
    now: Callable[[], float],
) -> HealthCheckRun:
    """Count this run (or reset the count), read the Slurm state, decide and act.
    `unkept`: why nothing may be saved ("" when it may)."""
    from nodecheck.agent.slurm_hysteresis import (
        Hysteresis,
        Observation,
        already_counted,
        forget_hysteresis,
        load_hysteresis,
        next_hysteresis,
        save_hysteresis,
    )
    from nodecheck.checks.node.fs import ReadError
    from nodecheck.checks.node.slurm_state import SlurmStateError

    healthy = bool(findings) and not any(f.status in (Status.FAIL, Status.ERROR) for f in findings)
    boot_id, at = "", 0.0
    try:
        moment = read_clock()
        boot_id, at = moment.boot_id, moment.seconds
    except ReadError as err:
        unkept = unkept or f"cannot tell this boot from another: {err}"
    previous = load_hysteresis(hysteresis_file, boot_id) if boot_id else Hysteresis()
    observation = Observation(healthy, at, now(), results_at)
    hysteresis = next_hysteresis(previous, observation)
    if not unkept:
        try:
            save_hysteresis(hysteresis_file, hysteresis, boot_id)
        except OSError as err:
            unkept = f"cannot save {hysteresis_file}: {err.strerror or err}"
    problem = unkept
    if unkept and not healthy:
        # The reset must not be lost, or the next healthy run would add to the count from
        # before this failure: the count is removed instead (unlink needs no free space).
        try:
            forget_hysteresis(hysteresis_file)
            problem += f"; removed {hysteresis_file.name} instead: no healthy run is counted"
        except OSError as err:
            problem += (
                f"; cannot remove {hysteresis_file.name} either ({err.strerror or err}): the "
                f"count from before this failure stays in it; remove {hysteresis_file} once "
                "it can be"
            )
    state: SlurmNodeState | None = None
    state_problem = ""
    try:
        state = read_state()
    except SlurmStateError as err:
        state_problem = str(err)
    decision = decide(
        state,
        state_problem,
        findings,
        hysteresis,
        settings,
        own_user,
        at,
        unkept=unkept if healthy else "",
    )
    if already_counted(previous, observation):
        decision = replace(
            decision,
            why=f"{decision.why}; the same agent results as the last counted run: "
            "not counted again",
        )
    if decision.action is Action.NOTHING:
        return HealthCheckRun(source, decision, True, problem)
    done, action_problem = act(decision.action, decision.reason)
    if not done and decision.action is Action.REBOOT:
        # A reboot Slurm will not do (no RebootProgram, scontrol failing) must not leave
        # a node that needs one in service: it is drained instead, with the same reason.
        rebooting = action_problem
        decision = replace(
            decision, action=Action.DRAIN, why=f"{decision.why}; the reboot failed, draining"
        )
        done, action_problem = act(decision.action, decision.reason)
        action_problem = f"reboot: {rebooting}" + (
            f"; drain: {action_problem}" if action_problem else ""
        )
    if not done:
        decision = replace(decision, exit_status=EXIT_UNDETERMINED)
    return HealthCheckRun(
        source, decision, done, "; ".join(p for p in (action_problem, problem) if p)
    )


# -- the command ---------------------------------------------------------------------------


def node_name(environ: dict[str, str]) -> str:
    """The node's Slurm name: SLURMD_NODENAME where slurmd sets it, else the short host
    name (slurmd's default NodeName, slurm.conf.5)."""
    import socket

    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def own_user_name() -> str:
    """nodecheck's user as scontrol prints a reason's setter: the name, else the uid."""
    import os
    import pwd

    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def log_run(node: str, run: HealthCheckRun) -> None:
    decision = run.decision
    level = logging.INFO if decision.exit_status == EXIT_HEALTHY and run.done else logging.WARNING
    message = "event=slurm_health node=%s action=%s done=%s source=%r why=%r"
    values: list[object] = [
        node,
        decision.action.value,
        str(run.done).lower(),
        run.source,
        decision.why,
    ]
    if decision.reason:
        message += " reason=%r"
        values.append(decision.reason)
    if run.problem:
        message += " problem=%r"
        values.append(run.problem)
    log.log(level, message, *values)


def run_health_check(
    *,
    fs: Any,
    nvml: Any,
    config: Any,
    node: str,
    scontrol: str,
) -> int:
    """`nodecheck slurm health-check` on this node; its exit status."""
    from nodecheck.agent import slurm_actions, slurm_hysteresis
    from nodecheck.checks.config import BenchOptions, CheckConfig
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.node.boot import read_boot_moment
    from nodecheck.checks.node.slurm_state import read_slurm_node
    from nodecheck.checks.registry import load_checks
    from nodecheck.checks.runner import run_checks

    settings: SlurmSettings = config.slurm
    state_dir = config.state_dir or BenchOptions().state_dir

    enabled = [name for name in load_checks() if config.check(name).enabled]

    def run_quick_checks(budget_s: float) -> list[tuple[str, list[Result]]]:
        # Every quick check the configuration enables, each within the budget: they run
        # at once, so the budget bounds them all (run_checks' deadlines).
        checks = [
            replace(check, timeout_s=min(check.timeout_s, budget_s))
            for name, check in load_checks().items()
            if name in enabled
        ]
        check_config = CheckConfig(
            expected_gpus=config.expected_gpus, nvml_timeout_s=config.nvml_timeout_s
        )
        context = CheckContext(fs=fs, nvml=nvml, kernel_log=config.kernel_log, config=check_config)
        return [(run.check.name, run.results) for run in run_checks(checks, context)]

    def act(action: Action, reason: str) -> tuple[bool, str]:
        argv = {
            Action.DRAIN: lambda: slurm_actions.drain_argv(scontrol, node, reason),
            Action.UNDRAIN: lambda: slurm_actions.undrain_argv(scontrol, node),
            Action.REBOOT: lambda: slurm_actions.reboot_argv(scontrol, node, reason),
        }[action]()
        outcome = slurm_actions.run_action(argv, settings.scontrol_timeout_s)
        return outcome.done, outcome.problem

    run = health_check(
        node=node,
        results_file=config.results_file,
        hysteresis_file=Path(state_dir) / slurm_hysteresis.HYSTERESIS_FILE,
        settings=settings,
        own_user=own_user_name(),
        run_quick_checks=run_quick_checks,
        read_state=lambda: read_slurm_node(node, scontrol, settings.scontrol_timeout_s),
        act=act,
        read_clock=lambda: read_boot_moment(fs),
        expected=enabled,
    )
    log_run(node, run)
    return run.decision.exit_status
