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
  for a reason not nodecheck's is never touched; nodecheck's is the exact reason it set,
  with the time slurmctld stamped on it (agent/slurm/ownership.py), never "any reason
  with its prefix set by root": an admin's edit of it hands the node to the admin for
  good; a new fault on a node nodecheck drained rewrites its reason;
- a drain Slurm set for a failed Prolog or Epilog ("Prolog error", "Epilog error") is
  taken over when nodecheck's own hook recorded that failure at that time
  (agent/slurm/hook_failure.py): its reason rewritten to nodecheck's, and undrained like
  nodecheck's own after the healthy runs (the count starts again at the takeover);
  another hook's failure is left to whoever runs that hook;
- a failure that takes the node out of service ([remediation], RemediationSettings: the
  node's own evidence of a GPU hardware fault, or of a GPU performance fault unless that
  is turned off) drains with "nodecheck: <check> <subject>: <summary>"; the node's
  configuration (ACS on, a governor) and a job's variables never do: they are reported
  (the log line, exit status 1); `error` does not unless configured; a failure whose
  action is a reboot (an XID's catalog resolution, a lost GPU, a fatal SXid) may drain
  and ask for `scontrol reboot` (off by default): the drain outlives the reboot, and the
  node comes back to service only after the healthy runs (agent/slurm/actions.py);
- [remediation] dry_run: the log line says what would have been run, and nothing is;
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
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from nodecheck.agent.config import DEFAULT_POLICY, RemediationSettings, SlurmSettings
from nodecheck.agent.findings import (
    Finding,
    ResultsUnusableError,
    findings_of_named,
    fresh_results,
)
from nodecheck.agent.slurm.hook_failure import (
    HOOK_FAILURE_FILE,
    HOOK_FAILURE_REASONS,
    HookFailure,
    behind,
    forget_hook_failure,
    load_hook_failure,
    outlived,
)
from nodecheck.agent.slurm.hysteresis import Hysteresis
from nodecheck.agent.slurm.ownership import (
    DRAIN_RECORD_FILE,
    REBOOT_ISSUED_SUFFIX,
    DrainRecord,
    forget_drain_record,
    load_drain_record,
    owns,
    save_drain_record,
    with_time_learned,
)
from nodecheck.checks.lazy_logging import INFO, WARNING, get_logger
from nodecheck.checks.node.boot import BootMoment
from nodecheck.checks.node.slurm_state import SlurmNodeState
from nodecheck.checks.printable import one_line
from nodecheck.checks.record import record
from nodecheck.checks.result import Action, FaultClass, Result, Status

log = get_logger(__name__)

REASON_PREFIX = "nodecheck:"
# Slurm's accounting keeps a node event's reason as a MySQL tinytext, 255 bytes
# (SchedMD/slurm src/plugins/accounting_storage/mysql/accounting_storage_mysql.c,
# event_table_fields): a longer reason is cut there, so it is cut here first, whole
# characters, on one line.
REASON_MAX_BYTES = 255
EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNDETERMINED = 3


# -- the decision ------------------------------------------------------------------------


class SlurmAction(str, enum.Enum):
    """What one health-check run does to the node in Slurm."""

    NOTHING = "nothing"
    DRAIN = "drain"
    UNDRAIN = "undrain"
    REBOOT = "reboot"


@record
class Decision:
    action: SlurmAction
    why: str
    reason: str = ""  # the Slurm reason a drain or reboot sets
    exit_status: int = EXIT_HEALTHY
    takeover: bool = False  # a Prolog or Epilog error's drain made nodecheck's: count anew
    withheld: bool = False  # a drain the circuit breaker held back (agent/slurm/breaker.py)


# The reasons Slurm itself gives a node it marks DOWN or NOT_RESPONDING (slurmctld's
# node_mgr.c: "Not responding"; ReturnToService=0's "Node unexpectedly rebooted"), or
# none: a failing node down for one of them is drained so it stays out when it registers.
SLURMS_OWN_DOWN_REASONS = frozenset({None, "Not responding", "Node unexpectedly rebooted"})
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


# The states nodecheck acts in: a base state a node in service has, and the flags that go
# with one (scontrol.1 and sinfo.1's NODE STATE CODES; Slurm 22.05's
# node_state_flag_string). A state or flag it does not know (one a later Slurm adds, such
# as BLOCKED, or INVAL) leaves the node alone, saying so: acting on a state it cannot
# read is acting blind.
ACTED_ON_BASES = frozenset({"IDLE", "ALLOCATED", "MIXED", "COMPLETING"})
ACTED_ON_FLAGS = frozenset(
    {"DRAIN", "COMPLETING", "RESERVED", "CLOUD", "DYNAMIC_NORM", "NOT_RESPONDING"}
)


def slurm_reason(finding: Finding) -> str:
    """nodecheck: <check> <subject>: <summary>, on one line, cut to REASON_MAX_BYTES."""
    return one_line(f"{REASON_PREFIX} {finding.line()}", REASON_MAX_BYTES)


def takeover_reason(state: SlurmNodeState, failure: HookFailure) -> str:
    job = f" job {failure.job}" if failure.job else " a job"
    return one_line(
        f"{REASON_PREFIX} took over Slurm's {state.reason!r} drain: undrained after the "
        f"healthy runs; the {failure.hook} failed{job} on {failure.reason}",
        REASON_MAX_BYTES,
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


def _why_not(finding: Finding, policy: RemediationSettings) -> str:
    """Why a failing finding leaves the node in service, for the log line."""
    if not finding.node_failing:
        return "a job's setting"
    if finding.fault_class is FaultClass.GPU_PERFORMANCE and not policy.performance:
        return "gpu-performance with [remediation] performance = false"
    return finding.fault_class.value


def decide(
    state: SlurmNodeState | None,
    state_problem: str,
    findings: Sequence[Finding],
    hysteresis: Hysteresis,
    settings: SlurmSettings,
    owned: DrainRecord | None,
    now: float,
    unkept: str = "",
    policy: RemediationSettings = DEFAULT_POLICY,
    hook_failure: HookFailure | None = None,
) -> Decision:
    """The one action for this run. `state` None: it could not be read (state_problem
    says why). `hysteresis` already counts this run; `now` and its times are on this
    boot's clock. `unkept`: why this healthy run could not be saved ("" when it was):
    it never undrains on a count it could not keep, and it cannot determine (exit 3).
    `owned`: the drain nodecheck recorded setting (None: none). `policy`: which failures
    take the node out of service. `hook_failure`: the failure of nodecheck's Prolog or
    Epilog that a "Prolog error" or "Epilog error" drain is Slurm's reason for (None:
    none is, agent/slurm/hook_failure.py's `behind`)."""
    # Only what the policy names takes the node out of service: the node's own evidence
    # of a hardware (or performance) fault. The rest of what fails (the node's
    # configuration, a job's variable) is reported: exit 1 and the log line.
    failing = [f for f in findings if policy.takes_out_of_service(f)]
    reported = [f for f in findings if f.status is Status.FAIL and f not in failing]
    errors = _with_status(findings, Status.ERROR)
    if not findings:  # absence is never a pass
        errors = [Finding("health-check", Status.ERROR, "node", "no result at all")]
    unhealthy = bool(failing) or (settings.drain_on_error and bool(errors))
    exit_status = (
        EXIT_UNHEALTHY
        if failing or any(f.node_failing for f in reported)
        else EXIT_UNDETERMINED
        if errors
        else EXIT_HEALTHY
    )
    if unkept and exit_status == EXIT_HEALTHY:
        exit_status = EXIT_UNDETERMINED
    culprit = (failing or errors)[0] if failing or errors else None
    health = "healthy"
    if culprit is not None:
        count = f"{len(failing)} failing" if failing else f"{len(errors)} undetermined"
        health = f"{count}, first {culprit.check} {culprit.subject}: {culprit.summary[:160]}"
    if reported:
        first = reported[0]
        kinds = ", ".join(sorted({_why_not(f, policy) for f in reported}))
        not_taking = (
            f"{len(reported)} failing that do not take the node out of service "
            f"({kinds}: reported), first {first.check} {first.subject}: "
            f"{first.summary[:160]}"
        )
        health = not_taking if culprit is None else f"{health}; {not_taking}"

    def nothing(why: str, status: int = exit_status) -> Decision:
        return Decision(SlurmAction.NOTHING, f"{health}; {why}", exit_status=status)

    if state is None:
        return nothing(
            f"the Slurm state is unknown, changing nothing: {state_problem}", EXIT_UNDETERMINED
        )
    flags = state.flags
    shown = (
        state.base + ("*" if state.not_responding else "") + "".join(f"+{f}" for f in sorted(flags))
    )
    if (
        (state.base == "DOWN" or state.not_responding)
        and state.reason in SLURMS_OWN_DOWN_REASONS
        and not flags & HANDS_OFF_FLAGS
        and not flags - ACTED_ON_FLAGS
        and failing
        and culprit is not None
    ):
        # Down by Slurm's own doing (not responding, restarted, slurmd registering, which
        # runs this program before it registers), and failing: DRAIN now, which a DOWN
        # node keeps, so that ReturnToService's IDLE after registration stays drained
        # instead of taking jobs. Healthy, or drained already, Slurm returns it as usual.
        if state.drained and owns(state, owned):
            return nothing(f"the node is {shown}, drained by nodecheck: it stays out")
        if not state.drained:
            return Decision(
                SlurmAction.DRAIN,
                f"{health}; the node is {shown} ({state.reason or 'no reason'}): draining so "
                "that it stays out once slurmd registers",
                slurm_reason(culprit),
                exit_status,
            )
    if state.base in HANDS_OFF_BASES or state.not_responding or flags & HANDS_OFF_FLAGS:
        return nothing(f"the node is {shown}: not touching it")
    unknown = ({state.base} - ACTED_ON_BASES) | (flags - ACTED_ON_FLAGS)
    if unknown:
        return nothing(
            f"the node is {shown}: {', '.join(sorted(unknown))} is no state nodecheck "
            "knows, not touching it"
        )
    if state.drained:
        if not owns(state, owned) and state.reason in HOOK_FAILURE_REASONS:
            if hook_failure is None:
                return nothing(
                    f"drained by Slurm for {state.reason!r}, and no failure of nodecheck's "
                    "own Prolog or Epilog is recorded at that time (another hook's, or one "
                    "that could not say): not touching it"
                )
            reason = (
                slurm_reason(culprit)
                if failing and culprit
                else takeover_reason(state, hook_failure)
            )
            return Decision(
                SlurmAction.DRAIN,
                f"{health}; drained by Slurm for {state.reason!r}: taking it over, "
                "nodecheck's reason set, healthy runs counted from now",
                reason,
                exit_status,
                takeover=True,
            )
        if not owns(state, owned):
            by = f" by {state.reason_user}" if state.reason_user else ""
            return nothing(f"drained for another reason ({state.reason!r}{by}): not touching it")
        named = (state.reason or "").removesuffix(REBOOT_ISSUED_SUFFIX)
        if failing and not any(slurm_reason(f) == named for f in failing):
            # Another fault than the one the reason names: the reason says it now
            # (NHC re-drains with the new note: helpers/node-mark-offline).
            return Decision(
                SlurmAction.DRAIN,
                f"{health}; drained by nodecheck for a fault that cleared: the reason "
                "names the new one",
                slurm_reason(failing[0]),
                exit_status,
            )
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
                SlurmAction.UNDRAIN, f"healthy: {held}, undraining", exit_status=EXIT_HEALTHY
            )
        return nothing(
            f"drained by nodecheck, healthy {hysteresis.healthy_runs} of "
            f"{settings.undrain_after_runs} runs in a row{_since(hysteresis)} before undraining"
        )
    if not unhealthy or culprit is None:
        return nothing("in service, nothing to do")
    reason = slurm_reason(culprit)
    rebooting = [f for f in failing if f.action is Action.REBOOT]
    if settings.reboot_on_xid and rebooting:
        reason = slurm_reason(rebooting[0])
        return Decision(
            SlurmAction.REBOOT,
            f"{health}; {rebooting[0].check} asks for a reboot: draining, rebooting once idle",
            reason,
            exit_status,
        )
    return Decision(SlurmAction.DRAIN, f"{health}; draining", reason, exit_status)


# -- one run -----------------------------------------------------------------------------


@record
class HealthCheckRun:
    """What one run found and did, for its log line and exit status."""

    source: str  # "agent results" or "own run (<why the results were not used>)"
    decision: Decision
    done: bool  # the action succeeded (or was nothing, or a dry run's)
    problem: str = ""
    dry_run: bool = False  # the action was only said


def own_findings(
    run_quick_checks: Callable[[float], list[tuple[str, list[Result]]]], budget_s: float
) -> list[Finding]:
    return [
        f for name, results in run_quick_checks(budget_s) for f in findings_of_named(name, results)
    ]


def health_check(
    *,
    node: str,
    results_file: Path | None,
    hysteresis_file: Path,
    settings: SlurmSettings,
    run_quick_checks: Callable[[float], list[tuple[str, list[Result]]]],
    read_state: Callable[[], SlurmNodeState],
    read_fleet: Callable[[], Sequence[SlurmNodeState]],
    act: Callable[[SlurmAction, str], tuple[bool, str]],
    read_clock: Callable[[], BootMoment],
    now: Callable[[], float] = time.time,
    expected: Collection[str] = (),
    policy: RemediationSettings = DEFAULT_POLICY,
    command_of: Callable[[SlurmAction, str], str] | None = None,
) -> HealthCheckRun:
    """One HealthCheckProgram run, whole under the hysteresis lock (slurm_hysteresis),
    waited for within [slurm] budget: another run holding it longer changes nothing
    here. The callables are the node's side (the checks, scontrol, this boot's clock)
    so that the whole run is exercised with real files and a stand-in scontrol; `now`
    is the wall clock, for the results' age and the log, never for an interval. The
    record of nodecheck's drain (agent/slurm/ownership.py) is kept beside the count.
    `policy`: what takes the node out of service, and whether this is a dry run, in
    which `act` is never called and the log line says what `command_of` would have run."""
    from nodecheck.agent.slurm.hysteresis import HysteresisBusyError, HysteresisLock, lock_path

    lock: HysteresisLock | None = None
    unlocked = ""
    try:
        lock = HysteresisLock(hysteresis_file, settings.budget_s)
    except HysteresisBusyError as busy:
        decision = Decision(
            SlurmAction.NOTHING, f"{busy}: changing nothing", exit_status=EXIT_UNDETERMINED
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
            read_state=read_state,
            read_fleet=read_fleet,
            act=act,
            read_clock=read_clock,
            now=now,
            policy=policy,
            command_of=command_of,
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
        unseen = sorted({f.check for f in fresh.findings if f.unseen})
        if unseen:
            # An agent without root's reads (no snapshot): what it could not see is no
            # verdict, and health-check, slurmd's and root, sees it itself.
            raise ResultsUnusableError(f"the agent could not read what {', '.join(unseen)} need")
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
    read_state: Callable[[], SlurmNodeState],
    read_fleet: Callable[[], Sequence[SlurmNodeState]],
    act: Callable[[SlurmAction, str], tuple[bool, str]],
    read_clock: Callable[[], BootMoment],
    now: Callable[[], float],
    policy: RemediationSettings,
    command_of: Callable[[SlurmAction, str], str] | None,
) -> HealthCheckRun:
    """Count this run (or reset the count), read the Slurm state, decide and act.
    `unkept`: why nothing may be saved ("" when it may)."""
    from nodecheck.agent.slurm.hysteresis import (
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

    # Healthy for the count that undrains: nothing the policy takes the node out for, and
    # nothing undetermined (a node drained for a GPU, its GPU replaced, with ACS still on
    # is healthy here: the ACS finding never drained it).
    healthy = bool(findings) and not any(
        policy.takes_out_of_service(f) or f.status is Status.ERROR for f in findings
    )
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
    record_file = hysteresis_file.with_name(DRAIN_RECORD_FILE)
    owned, record_problem = _owned_drain(record_file, state)
    hook_file = hysteresis_file.with_name(HOOK_FAILURE_FILE)
    hook_failure = load_hook_failure(hook_file)
    if state is not None and outlived(hook_failure, state, now()):
        dropped = _forget_hook_failure(hook_file)
        problem = "; ".join(p for p in (problem, dropped) if p)
        hook_failure = None
    problem = "; ".join(p for p in (problem, record_problem) if p)
    decision = decide(
        state,
        state_problem,
        findings,
        hysteresis,
        settings,
        owned,
        at,
        unkept=unkept if healthy else "",
        policy=policy,
        hook_failure=hook_failure
        if state is not None and behind(hook_failure, state, now())
        else None,
    )
    if already_counted(previous, observation):
        decision = replace(
            decision,
            why=f"{decision.why}; the same agent results as the last counted run: "
            "not counted again",
        )
    if decision.action in (SlurmAction.DRAIN, SlurmAction.REBOOT) and (
        state is not None and not state.drained
    ):
        # A node leaving service: the fleet-wide cap first.
        decision = _past_the_breaker(decision, read_fleet, policy, now())
    if not unkept:  # else the state folder cannot be written, said already
        noted = _note_withheld(hysteresis_file, decision, now())
        problem = "; ".join(p for p in (problem, noted) if p)
    if decision.action is SlurmAction.NOTHING:
        return HealthCheckRun(source, decision, True, problem)
    if policy.dry_run:
        command = command_of(decision.action, decision.reason) if command_of else ""
        would = f"dry run ([remediation] dry_run): would {decision.action.value}" + (
            f" with: {command}" if command else ""
        )
        decision = replace(decision, why=f"{decision.why}; {would}")
        return HealthCheckRun(source, decision, True, problem, dry_run=True)
    done, action_problem = act(decision.action, decision.reason)
    if not done and decision.action is SlurmAction.REBOOT:
        # A reboot Slurm will not do (no RebootProgram, scontrol failing) must not leave
        # a node that needs one in service: it is drained instead, with the same reason.
        rebooting = action_problem
        decision = replace(
            decision, action=SlurmAction.DRAIN, why=f"{decision.why}; the reboot failed, draining"
        )
        done, action_problem = act(decision.action, decision.reason)
        action_problem = f"reboot: {rebooting}" + (
            f"; drain: {action_problem}" if action_problem else ""
        )
    if not done:
        decision = replace(decision, exit_status=EXIT_UNDETERMINED)
    else:
        kept = _keep_drain_record(record_file, hysteresis_file, decision)
        if decision.takeover:
            kept = "; ".join(p for p in (kept, _forget_hook_failure(hook_file)) if p)
        action_problem = "; ".join(p for p in (action_problem, kept) if p)
    return HealthCheckRun(
        source, decision, done, "; ".join(p for p in (action_problem, problem) if p)
    )


def _past_the_breaker(
    decision: Decision,
    read_fleet: Callable[[], Sequence[SlurmNodeState]],
    policy: RemediationSettings,
    now: float,
) -> Decision:
    """`decision` when the circuit breaker lets it through, else nothing done, reported:
    the breaker open, or the cluster's nodes unreadable (it cannot tell)."""
    from nodecheck.agent.slurm.breaker import read_breaker
    from nodecheck.checks.node.slurm_state import SlurmStateError

    try:
        reading = read_breaker(read_fleet(), policy, REASON_PREFIX, now)
    except SlurmStateError as err:
        held = f"the cluster's nodes could not be read for the circuit breaker ({err})"
    else:
        if not reading.open:
            return decision
        held = f"the circuit breaker is open: {reading.says(policy.breaker_window_s)}"
    return replace(
        decision,
        action=SlurmAction.NOTHING,
        why=f"{decision.why}; withheld, reported instead of a {decision.action.value}: {held}",
        reason="",
        withheld=True,
    )


def _note_withheld(hysteresis_file: Path, decision: Decision, now: float) -> str:
    """Beside the count, whether this run's drain was withheld (the agent exports it);
    what could not be saved, or ""."""
    from nodecheck.agent.breaker import SLURM_WITHHELD_FILE, note_withheld

    path = hysteresis_file.with_name(SLURM_WITHHELD_FILE)
    try:
        note_withheld(path, decision.withheld, decision.why, now)
    except OSError as err:
        return f"cannot update {path}: {err.strerror or err}"
    return ""


def _owned_drain(record_file: Path, state: SlurmNodeState | None) -> tuple[DrainRecord | None, str]:
    """The record of nodecheck's drain as the node's state bears it out: its time learned
    at the first read after the drain; dropped when the node no longer carries it (someone
    undrained it, edited the reason or drained it again: theirs now, for good). A state
    that could not be read changes nothing. And what could not be saved or removed."""
    owned = load_drain_record(record_file)
    if state is None or owned is None:
        return owned, ""
    try:
        learned = with_time_learned(state, owned)
        if learned is not None:
            save_drain_record(record_file, learned)
            return learned, ""
        if not owns(state, owned):
            forget_drain_record(record_file)
            return None, ""
    except OSError as err:
        return owned, f"cannot update {record_file}: {err.strerror or err}"
    return owned, ""


def _forget_hook_failure(hook_file: Path) -> str:
    """The hook's failure taken over: dropped, so that a later drain of Slurm's is matched
    only by a later failure; what could not be, or ""."""
    try:
        forget_hook_failure(hook_file)
    except OSError as err:
        return f"cannot remove {hook_file}: {err.strerror or err}"
    return ""


def _keep_drain_record(record_file: Path, hysteresis_file: Path, decision: Decision) -> str:
    """After a done action: a drain's reason recorded as nodecheck's (a takeover's count
    started again), a reboot's too (its drain, marked rebooting), an undrain's record
    dropped; what could not be, or ""."""
    from nodecheck.agent.slurm.hysteresis import forget_hysteresis

    try:
        if decision.action is SlurmAction.DRAIN:
            save_drain_record(record_file, DrainRecord(decision.reason))
            if decision.takeover:
                forget_hysteresis(hysteresis_file)
        elif decision.action is SlurmAction.REBOOT:
            # Drained first (act), so the node stays out through the reboot.
            save_drain_record(record_file, DrainRecord(decision.reason, rebooting=True))
        elif decision.action is SlurmAction.UNDRAIN:
            forget_drain_record(record_file)
    except OSError as err:
        return (
            f"cannot record the drain in {record_file} ({err.strerror or err}): nodecheck "
            "will not undrain it"
            if decision.action in (SlurmAction.DRAIN, SlurmAction.REBOOT)
            else f"cannot remove {record_file}: {err.strerror or err}"
        )
    return ""


# -- the command ---------------------------------------------------------------------------


def node_name(environ: dict[str, str]) -> str:
    """The node's Slurm name: SLURMD_NODENAME where slurmd sets it, else the short host
    name (slurmd's default NodeName, slurm.conf.5)."""
    import socket

    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def log_run(node: str, run: HealthCheckRun) -> None:
    decision = run.decision
    level = INFO if decision.exit_status == EXIT_HEALTHY and run.done else WARNING
    message = "event=slurm_health node=%s action=%s done=%s source=%r why=%r"
    values: list[object] = [
        node,
        decision.action.value,
        str(run.done).lower(),
        run.source,
        decision.why,
    ]
    if run.dry_run:
        message += " dry_run=true"
    if decision.withheld:
        message += " breaker=open"
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
    from nodecheck.agent.slurm import actions as slurm_actions
    from nodecheck.agent.slurm import hysteresis as slurm_hysteresis
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.node.boot import read_boot_moment
    from nodecheck.checks.node.slurm_state import read_slurm_node, read_slurm_nodes
    from nodecheck.checks.registry import load_checks
    from nodecheck.checks.runner import run_checks

    settings: SlurmSettings = config.slurm
    state_dir = config.state_folder

    enabled = [name for name in load_checks() if config.check(name).enabled]

    def run_quick_checks(budget_s: float) -> list[tuple[str, list[Result]]]:
        # Every quick check the configuration enables, each within the budget: they run
        # at once, so the budget bounds them all (run_checks' deadlines).
        checks = [
            replace(check, timeout_s=min(check.timeout_s, budget_s))
            for name, check in load_checks().items()
            if name in enabled
        ]
        context = CheckContext(
            fs=fs, nvml=nvml, kernel_log=config.kernel_log, config=config.check_config()
        )
        return [(run.check.name, run.results) for run in run_checks(checks, context)]

    def argvs_of(action: SlurmAction, reason: str) -> list[list[str]]:
        drain = slurm_actions.drain_argv(scontrol, node, reason)
        if action is SlurmAction.DRAIN:
            return [drain]
        if action is SlurmAction.UNDRAIN:
            return [slurm_actions.undrain_argv(scontrol, node)]
        # A reboot: the drain first, which the reboot leaves in place (actions.py).
        return [drain, slurm_actions.reboot_argv(scontrol, node, reason)]

    def act(action: SlurmAction, reason: str) -> tuple[bool, str]:
        for argv in argvs_of(action, reason):
            outcome = slurm_actions.run_action(argv, settings.scontrol_timeout_s)
            if not outcome.done:
                return False, outcome.problem
        return True, ""

    def command_of(action: SlurmAction, reason: str) -> str:
        import shlex

        return " && ".join(shlex.join(argv) for argv in argvs_of(action, reason))

    run = health_check(
        node=node,
        results_file=config.results_file,
        hysteresis_file=Path(state_dir) / slurm_hysteresis.HYSTERESIS_FILE,
        settings=settings,
        run_quick_checks=run_quick_checks,
        read_state=lambda: read_slurm_node(node, scontrol, settings.scontrol_timeout_s),
        read_fleet=lambda: read_slurm_nodes(scontrol, settings.scontrol_timeout_s),
        act=act,
        read_clock=lambda: read_boot_moment(fs),
        expected=enabled,
        policy=config.remediation,
        command_of=command_of,
    )
    log_run(node, run)
    return run.decision.exit_status
