"""slurm health-check's parts on literals: the scontrol parser, the decision, the results
file's freshness and damage, the hysteresis, the bounded scontrol runs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from nodecheck.agent.breaker import SLURM_WITHHELD_FILE, BreakerReading, read_withheld
from nodecheck.agent.config import DEFAULT_POLICY, RemediationSettings, SlurmSettings
from nodecheck.agent.findings import (
    Finding,
    ResultsUnusableError,
    StoredRun,
    check_document,
    document_text,
    fresh_results,
)
from nodecheck.agent.slurm.actions import drain_argv, reboot_argv, run_action, undrain_argv
from nodecheck.agent.slurm.breaker import REASON_TIME_FORMAT, read_breaker
from nodecheck.agent.slurm.health import (
    EXIT_HEALTHY,
    EXIT_UNDETERMINED,
    EXIT_UNHEALTHY,
    REASON_MAX_BYTES,
    HealthCheckRun,
    SlurmAction,
    decide,
    health_check,
    log_run,
    slurm_reason,
)
from nodecheck.agent.slurm.hook_failure import (
    HOOK_FAILURE_FILE,
    HookFailure,
    behind,
    load_hook_failure,
    save_hook_failure,
)
from nodecheck.agent.slurm.hysteresis import (
    Hysteresis,
    Observation,
    load_hysteresis,
    next_hysteresis,
    save_hysteresis,
)
from nodecheck.agent.slurm.ownership import (
    DRAIN_RECORD_FILE,
    REBOOT_ISSUED_SUFFIX,
    DrainRecord,
    load_drain_record,
    save_drain_record,
    with_time_learned,
)
from nodecheck.checks.node.boot import BootMoment, read_boot_moment
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.slurm_state import (
    SlurmNodeState,
    SlurmStateError,
    parse_scontrol_node,
    parse_scontrol_nodes,
    read_slurm_node,
    run_bounded_command,
)
from nodecheck.checks.registry import Check
from nodecheck.checks.result import Action, FaultClass, Origin, Result, Status
from nodecheck.checks.runner import CheckRun

# scontrol show node, as Slurm 22.05 prints it (Debian bookworm's slurm-client).
DRAINED_BY_NODECHECK = """\
NodeName=gpu01 Arch=x86_64 CoresPerSocket=56
   CPUAlloc=0 CPUEfctv=224 CPUTot=224 CPULoad=0.31
   AvailableFeatures=(null)
   ActiveFeatures=(null)
   Gres=gpu:8
   NodeAddr=gpu01 NodeHostName=gpu01 Version=22.05.8
   OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)
   RealMemory=2000000 AllocMem=0 FreeMem=1900000 Sockets=2 Boards=1
   State=IDLE+DRAIN ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu
   BootTime=2026-12-01T09:00:00 SlurmdStartTime=2026-12-01T09:01:00
   LastBusyTime=2026-12-01T14:00:00
   CfgTRES=cpu=224,mem=2000000M,billing=224
   AllocTRES=
   CapWatts=n/a
   CurrentWatts=0 AveWatts=0
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
   Reason=nodecheck: gpu_xid gpu 0000:3a:00.0: XID 79 off the bus [root@2026-12-01T15:00:00]
"""

IDLE = """\
NodeName=gpu01 Arch=x86_64 CoresPerSocket=56
   State=IDLE ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu
"""

DOWN_NOT_RESPONDING = """\
NodeName=gpu01 CoresPerSocket=56
   State=DOWN*+DRAIN ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Reason=Not responding [slurm@2026-12-01T15:00:00]
"""

SETTINGS = SlurmSettings()
NOW = 1_800_000_000.0
BOOT = "0d3e5c1a-7b2f-4e8d-9c6a-5f4b3a2e1d0c"


def this_boot(procfs: Path, boot_id: str = BOOT) -> Callable[[], BootMoment]:
    """This boot's clock, as health-check reads it, under a procfs root whose boot_id is
    `boot_id` (written again on each call, so a test can give the node a new boot)."""
    path = procfs / "sys" / "kernel" / "random" / "boot_id"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(boot_id + "\n")
    return lambda: read_boot_moment(NodeFS(procfs=procfs))


def state(
    base: str = "IDLE",
    *flags: str,
    reason: str | None = None,
    user: str | None = None,
    not_responding: bool = False,
) -> SlurmNodeState:
    return SlurmNodeState("gpu01", base, frozenset(flags), not_responding, reason, user, None)


class Acted(list[SlurmAction]):
    """A stand-in for scontrol's actions: each one asked for, recorded, done."""

    def __call__(self, action: SlurmAction, reason: str) -> tuple[bool, str]:
        self.append(action)
        return True, ""


def one_node() -> list[SlurmNodeState]:
    """The cluster as the circuit breaker reads it: this node alone, in service."""
    return [state()]


OURS = state("IDLE", "DRAIN", reason="nodecheck: gpu_count node: 7 of 8 GPUs", user="root")
# nodecheck's record of the drain it set (agent/slurm/ownership.py): OURS is nodecheck's.
OWNED = DrainRecord(str(OURS.reason))
ADMIN = state("IDLE", "DRAIN", reason="ADMIN SHUTDOWN for cabling", user="alice")
FAIL = Finding("gpu_xid", Status.FAIL, "gpu 0000:3a:00.0", "XID 79 GPU has fallen off the bus")
REBOOT = Finding("gpu_xid", Status.FAIL, "gpu 0000:3a:00.0", "XID 79", action=Action.REBOOT)
ERROR = Finding("pcie_acs", Status.ERROR, "node", "cannot read config space")
OK = Finding("cpu", Status.OK, "node", "all CPUs use the performance governor", Action.NONE)
# A job's environment failing (a variable a user set): the job's problem, not the node's.
JOB_FAIL = Finding(
    "nccl_env",
    Status.FAIL,
    "node",
    "NCCL_P2P_DISABLE=1 set in the job",
    Action.FIX_JOB_ENVIRONMENT,
    FaultClass.NODE_CONFIG,
    Origin.JOB,
)


def run_decide(
    node: SlurmNodeState | None,
    findings: list[Finding],
    healthy_runs: int = 0,
    since: float | None = None,
    settings: SlurmSettings = SETTINGS,
    problem: str = "",
    policy: RemediationSettings = DEFAULT_POLICY,
) -> tuple[SlurmAction, str, int]:
    decision = decide(
        node,
        problem,
        findings,
        Hysteresis(healthy_runs, since),
        settings,
        OWNED,
        NOW,
        policy=policy,
    )
    return decision.action, decision.reason, decision.exit_status


# -- the parser ----------------------------------------------------------------------


def test_parses_a_drain_with_who_set_it_and_when() -> None:
    parsed = parse_scontrol_node(DRAINED_BY_NODECHECK, "gpu01")
    assert parsed.base == "IDLE"
    assert parsed.flags == frozenset({"DRAIN"})
    assert parsed.drained and not parsed.not_responding
    assert parsed.reason == "nodecheck: gpu_xid gpu 0000:3a:00.0: XID 79 off the bus"
    assert parsed.reason_user == "root"
    assert parsed.reason_time == "2026-12-01T15:00:00"


def test_parses_a_node_without_reason_and_a_not_responding_one() -> None:
    idle = parse_scontrol_node(IDLE, "gpu01")
    assert (idle.base, idle.flags, idle.reason, idle.reason_user) == (
        "IDLE",
        frozenset(),
        None,
        None,
    )
    down = parse_scontrol_node(DOWN_NOT_RESPONDING, "gpu01")
    assert down.base == "DOWN" and down.not_responding and down.drained
    assert down.reason == "Not responding" and down.reason_user == "slurm"


def test_a_reason_without_its_setter_keeps_no_user() -> None:
    text = IDLE.replace("   Partitions=gpu\n", "   Reason=nodecheck: typed by hand\n")
    parsed = parse_scontrol_node(text, "gpu01")
    assert parsed.reason == "nodecheck: typed by hand" and parsed.reason_user is None


def test_a_reason_holding_state_is_still_read() -> None:
    text = IDLE + "   Reason=nodecheck: c node: State=DOWN typed [root@2026-12-01T15:00:00]\n"
    parsed = parse_scontrol_node(text, "gpu01")
    assert parsed.base == "IDLE" and parsed.reason == "nodecheck: c node: State=DOWN typed"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Node gpu01 not found\n",
        IDLE.replace("NodeName=gpu01", "NodeName=gpu02"),
        IDLE + IDLE,
        IDLE.replace("State=IDLE", "State=idle?"),
        IDLE.replace("State=IDLE ", ""),
    ],
)
def test_refuses_what_is_not_one_record_of_the_node(text: str) -> None:
    with pytest.raises(SlurmStateError):
        parse_scontrol_node(text, "gpu01")


# -- the decision -------------------------------------------------------------------


def test_a_failure_drains_with_nodecheck_reason() -> None:
    action, reason, status = run_decide(state(), [OK, FAIL])
    assert action is SlurmAction.DRAIN
    assert reason == "nodecheck: gpu_xid gpu 0000:3a:00.0: XID 79 GPU has fallen off the bus"
    assert status == EXIT_UNHEALTHY


def test_a_draining_node_with_jobs_is_drained_too() -> None:
    assert run_decide(state("MIXED"), [FAIL])[0] is SlurmAction.DRAIN


def test_error_never_drains_by_default_but_may() -> None:
    assert run_decide(state(), [OK, ERROR])[:1] == (SlurmAction.NOTHING,)
    assert run_decide(state(), [ERROR])[2] == EXIT_UNDETERMINED
    strict = SlurmSettings(drain_on_error=True)
    action, reason, _ = run_decide(state(), [OK, ERROR], settings=strict)
    assert action is SlurmAction.DRAIN and reason.startswith("nodecheck: pcie_acs node:")


def test_no_findings_is_no_pass() -> None:
    action, _, status = run_decide(state(), [])
    assert action is SlurmAction.NOTHING and status == EXIT_UNDETERMINED


def test_healthy_and_in_service_does_nothing() -> None:
    assert run_decide(state(), [OK], healthy_runs=5) == (SlurmAction.NOTHING, "", EXIT_HEALTHY)


@pytest.mark.parametrize(
    "node",
    [
        state("DOWN", reason="cabling, back Monday", user="alice"),
        state("IDLE", not_responding=True, reason="moved racks", user="alice"),
        state("IDLE", "REBOOT_REQUESTED"),
        state("DOWN", "REBOOT_ISSUED"),
        state("IDLE", "MAINTENANCE"),
        state("IDLE", "POWERED_DOWN"),
        state("IDLE", "FAIL"),
        state("FUTURE"),
        state("UNKNOWN"),
        # Down with nodecheck's own reason: UNDRAIN would not bring it back, and it is
        # Slurm's (or an admin's) now.
        state("DOWN", "DRAIN", reason="nodecheck: gpu_count node: 7", user="root"),
    ],
)
def test_never_touches_a_node_slurm_or_an_admin_has(node: SlurmNodeState) -> None:
    assert run_decide(node, [FAIL])[0] is SlurmAction.NOTHING
    assert run_decide(node, [OK], healthy_runs=100, since=0)[0] is SlurmAction.NOTHING


@pytest.mark.parametrize(
    "node",
    [
        state("DOWN"),
        state("DOWN", "NOT_RESPONDING", reason="Not responding", user="slurm"),
        state("IDLE", not_responding=True, reason="Not responding", user="slurm"),
        state("DOWN", reason="Node unexpectedly rebooted", user="slurm"),
    ],
)
def test_a_failing_node_down_by_slurm_s_doing_is_drained_to_stay_out(
    node: SlurmNodeState,
) -> None:
    """Not responding, restarted, slurmd registering (it runs the health check first):
    failing, the node gets nodecheck's DRAIN, which a DOWN node keeps, so registration
    does not return it to service; healthy, Slurm returns it as usual."""
    action, reason, status = run_decide(node, [FAIL])
    assert (action, status) == (SlurmAction.DRAIN, EXIT_UNHEALTHY)
    assert reason.startswith("nodecheck: gpu_xid ")
    assert run_decide(node, [OK], healthy_runs=100, since=0)[0] is SlurmAction.NOTHING
    # Drained already (by nodecheck, when it went down): it stays so.
    ours = replace(node, flags=node.flags | {"DRAIN"}, reason=OURS.reason, reason_user="root")
    assert run_decide(ours, [STILL_7_OF_8])[0] is SlurmAction.NOTHING


@pytest.mark.parametrize(
    "node",
    [state("INVAL"), state("IDLE", "BLOCKED"), state("MIXED", "DRAIN", "POWER_DRAIN_X")],
)
def test_a_state_nodecheck_does_not_know_is_left_alone(node: SlurmNodeState) -> None:
    """A well-formed state or flag nodecheck does not know (a later Slurm's): no drain,
    no undrain, and the log line says which."""
    for findings, runs in (([FAIL], 0), ([OK], 10)):
        decision = decide(node, "", findings, Hysteresis(runs), SETTINGS, OWNED, NOW)
        assert decision.action is SlurmAction.NOTHING
        assert "is no state nodecheck knows, not touching it" in decision.why


def test_an_admin_drain_stays_through_healthy_and_unhealthy_runs() -> None:
    """NHC #134: an admin's reason is never overwritten, nor resumed."""
    for findings in ([FAIL], [OK], [ERROR], [REBOOT]):
        for runs in (0, 1, 1000):
            action, _, _ = run_decide(
                ADMIN,
                findings,
                healthy_runs=runs,
                since=0,
                settings=SlurmSettings(reboot_on_xid=True, drain_on_error=True),
            )
            assert action is SlurmAction.NOTHING


def test_a_nodecheck_prefix_set_by_another_user_is_not_ours() -> None:
    spoofed = state("IDLE", "DRAIN", reason="nodecheck: looks like ours", user="mallory")
    assert run_decide(spoofed, [OK], healthy_runs=100, since=0)[0] is SlurmAction.NOTHING
    unsigned = state("IDLE", "DRAIN", reason="nodecheck: looks like ours", user=None)
    assert run_decide(unsigned, [OK], healthy_runs=100, since=0)[0] is SlurmAction.NOTHING


def test_an_unreadable_state_changes_nothing() -> None:
    for findings in ([FAIL], [OK]):
        action, _, status = run_decide(None, findings, healthy_runs=100, problem="scontrol hung")
        assert action is SlurmAction.NOTHING and status == EXIT_UNDETERMINED


def test_undrains_ours_only_after_n_healthy_runs() -> None:
    assert run_decide(OURS, [OK], healthy_runs=2)[0] is SlurmAction.NOTHING
    action, _, status = run_decide(OURS, [OK], healthy_runs=3)
    assert action is SlurmAction.UNDRAIN and status == EXIT_HEALTHY
    assert (
        run_decide(OURS, [OK], healthy_runs=1, settings=SlurmSettings(undrain_after_runs=1))[0]
        is SlurmAction.UNDRAIN
    )


def test_undrains_ours_after_m_seconds_healthy_when_configured() -> None:
    timed = SlurmSettings(undrain_after_runs=1000, undrain_after_s=600)
    assert run_decide(OURS, [OK], healthy_runs=2, since=NOW - 599, settings=timed)[0] is (
        SlurmAction.NOTHING
    )
    assert run_decide(OURS, [OK], healthy_runs=2, since=NOW - 600, settings=timed)[0] is (
        SlurmAction.UNDRAIN
    )


# The fault OURS's reason names, still there.
STILL_7_OF_8 = Finding("gpu_count", Status.FAIL, "node", "7 of 8 GPUs")


def test_ours_stays_drained_while_not_healthy() -> None:
    for findings in ([STILL_7_OF_8], [STILL_7_OF_8, FAIL], [ERROR], []):
        assert run_decide(OURS, findings, healthy_runs=100, since=0)[0] is SlurmAction.NOTHING


def test_a_new_fault_on_a_node_nodecheck_drained_rewrites_its_reason() -> None:
    """The GPUs are back, an XID is not: the reason names the XID now."""
    action, reason, status = run_decide(OURS, [FAIL], healthy_runs=0)
    assert (action, status) == (SlurmAction.DRAIN, EXIT_UNHEALTHY)
    assert reason == "nodecheck: gpu_xid gpu 0000:3a:00.0: XID 79 GPU has fallen off the bus"


def test_ownership_is_the_recorded_reason_and_time_not_the_user() -> None:
    """An admin, as root, edits nodecheck's reason, or sets the same text again (a new
    time): the node is theirs; nodecheck's own, unedited, is its to undrain."""
    stamped = replace(OURS, reason_time="2026-12-01T15:00:00")
    owned = with_time_learned(stamped, OWNED)
    assert owned == DrainRecord(str(OURS.reason), "2026-12-01T15:00:00")
    edited = replace(stamped, reason=f"{OURS.reason} -- RMA 4711, keep drained")
    again = replace(stamped, reason_time="2026-12-02T08:00:00")
    for node in (stamped, edited, again):
        decision = decide(node, "", [OK], Hysteresis(100, 0), SETTINGS, owned, NOW)
        expected = SlurmAction.UNDRAIN if node is stamped else SlurmAction.NOTHING
        assert decision.action is expected, decision.why
    # No record at all (another tool, an older nodecheck): not nodecheck's.
    assert decide(OURS, "", [OK], Hysteresis(100, 0), SETTINGS, None, NOW).action is (
        SlurmAction.NOTHING
    )


@pytest.mark.parametrize("reason", ["Prolog error", "Epilog error"])
def test_a_prolog_or_epilog_errors_drain_is_taken_over(reason: str) -> None:
    """Slurm's drain for a failure of nodecheck's hook: healthy, nodecheck sets its own
    reason (naming the job and the finding) and counts healthy runs anew; failing, the
    reason names the fault. Another hook's failure, none of nodecheck's recorded, is left
    alone."""
    hook = state("IDLE", "DRAIN", reason=reason, user="slurm")
    failure = HookFailure(
        reason.split(maxsplit=1)[0].lower(), NOW, "4242", "gpu_count node: 7 of 8"
    )
    decision = decide(hook, "", [OK], Hysteresis(100, 0), SETTINGS, None, NOW, hook_failure=failure)
    assert decision.action is SlurmAction.DRAIN and decision.takeover
    assert decision.reason == (
        f"nodecheck: took over Slurm's {reason!r} drain: undrained after the healthy runs; "
        f"the {failure.hook} failed job 4242 on gpu_count node: 7 of 8"
    )
    failing = decide(hook, "", [FAIL], Hysteresis(), SETTINGS, None, NOW, hook_failure=failure)
    assert failing.action is SlurmAction.DRAIN and failing.reason.startswith("nodecheck: gpu_xid")
    others = decide(hook, "", [OK], Hysteresis(100, 0), SETTINGS, None, NOW)
    assert others.action is SlurmAction.NOTHING and "not touching it" in others.why


def test_a_hook_failure_is_behind_the_drain_slurm_set_at_that_time() -> None:
    """The drain's time (scontrol's, slurmctld's local time) within MATCH_S of the
    recorded failure, for that hook's reason; anything else, or a time that cannot be
    read, is no match."""
    failed_at = time.mktime(time.strptime("2026-12-01T15:00:00", REASON_TIME_FORMAT))
    prolog = HookFailure("prolog", failed_at, "12", "gpu_count node: 7 of 8")
    later = failed_at + 7200.0

    def drained(reason: str, at: str | None) -> SlurmNodeState:
        return replace(state("IDLE", "DRAIN", reason=reason, user="slurm"), reason_time=at)

    assert behind(prolog, drained("Prolog error", "2026-12-01T15:00:02"), later)
    assert behind(prolog, drained("Prolog/Epilog failure", "2026-12-01T15:00:02"), later)
    assert behind(prolog, drained("Prolog error", "2026-12-01T14:59:00"), later)
    assert not behind(prolog, drained("Prolog error", "2026-12-01T14:58:59"), later)
    assert behind(prolog, drained("Prolog error", "2026-12-01T15:02:00"), later)
    assert not behind(prolog, drained("Prolog error", "2026-12-01T15:02:01"), later)
    assert not behind(prolog, drained("Epilog error", "2026-12-01T15:00:02"), later)
    assert not behind(prolog, drained("Prolog error", "2026-12-01T15:20:00"), later)
    assert not behind(prolog, drained("Prolog error", None), later)
    assert not behind(prolog, drained("Prolog error", "yesterday"), later)
    assert not behind(None, drained("Prolog error", "2026-12-01T15:00:02"), later)


def test_a_hooks_record_no_drain_followed_is_dropped(tmp_path: Path) -> None:
    """The prolog failed, but the node was resumed before health-check ran: the record is
    dropped once the drain would have shown, so that a later "Prolog error" of a site's
    own Prolog is never taken for nodecheck's; a damaged record is none."""
    hook_file = tmp_path / HOOK_FAILURE_FILE
    now = time.mktime(time.strptime("2026-12-01T15:00:00", REASON_TIME_FORMAT))

    def run_at(at: float, node: SlurmNodeState) -> HealthCheckRun:
        return health_check(
            node="gpu01",
            results_file=None,
            hysteresis_file=tmp_path / "h.json",
            settings=SETTINGS,
            run_quick_checks=lambda budget: [("cpu", [Result(Status.OK, "node", "fine")])],
            read_state=lambda: node,
            read_fleet=one_node,
            act=Acted(),
            read_clock=this_boot(tmp_path / "proc"),
            now=lambda: at,
        )

    save_hook_failure(hook_file, HookFailure("prolog", now, "77", "gpu_xid gpu x: XID 79"))
    run_at(now + 5, state())  # slurmctld may not have drained it yet: kept
    assert load_hook_failure(hook_file) is not None
    run_at(now + 300, state())  # the drain would have shown: dropped
    assert not hook_file.exists()
    hook_file.write_text('{"hook": ["prolog"], "at": 1, "job": "1", "reason": "x"}\n')
    assert load_hook_failure(hook_file) is None
    later = replace(
        state("IDLE", "DRAIN", reason="Prolog error", user="slurm"),
        reason_time="2026-12-01T15:05:00",
    )
    taken = run_at(now + 360, later)
    assert taken.decision.action is SlurmAction.NOTHING and "not touching it" in (
        taken.decision.why
    )


def test_a_takeover_over_a_whole_run_drops_the_hooks_record(tmp_path: Path) -> None:
    """The record the prolog left, matched by the drain's time: taken over, and dropped;
    the next run counts healthy runs towards the undrain of nodecheck's own drain."""
    hysteresis_file = tmp_path / "h.json"
    hook_file = tmp_path / HOOK_FAILURE_FILE
    now = time.mktime(time.strptime("2026-12-01T15:00:00", REASON_TIME_FORMAT))
    save_hook_failure(hook_file, HookFailure("prolog", now - 5, "77", "gpu_xid gpu x: XID 79"))
    slurms = replace(
        state("IDLE", "DRAIN", reason="Prolog error", user="slurm"),
        reason_time="2026-12-01T14:59:58",
    )
    acted = Acted()
    run = health_check(
        node="gpu01",
        results_file=None,
        hysteresis_file=hysteresis_file,
        settings=SETTINGS,
        run_quick_checks=lambda budget: [("cpu", [Result(Status.OK, "node", "fine")])],
        read_state=lambda: slurms,
        read_fleet=one_node,
        act=acted,
        read_clock=this_boot(tmp_path / "proc"),
        now=lambda: now,
    )
    assert acted == [SlurmAction.DRAIN] and run.decision.takeover, run.decision.why
    assert "the prolog failed job 77 on gpu_xid gpu x: XID 79" in run.decision.reason
    assert not hook_file.exists()
    assert load_drain_record(tmp_path / DRAIN_RECORD_FILE) == DrainRecord(run.decision.reason)


def test_alternate_runs_never_resume() -> None:
    """NHC #95: drained and resumed on alternate runs. The streak restarts on every bad run."""
    hysteresis = Hysteresis()
    actions = []
    for findings in [[OK], [FAIL], [OK], [ERROR], [OK], [OK], [FAIL], [OK], []] * 3:
        healthy = bool(findings) and all(f.status is Status.OK for f in findings)
        hysteresis = next_hysteresis(hysteresis, Observation(healthy, NOW, NOW))
        actions.append(decide(OURS, "", findings, hysteresis, SETTINGS, OWNED, NOW).action)
    assert SlurmAction.UNDRAIN not in actions
    for _ in range(3):  # and three in a row do
        hysteresis = next_hysteresis(hysteresis, Observation(True, NOW, NOW))
    assert decide(OURS, "", [OK], hysteresis, SETTINGS, OWNED, NOW).action is SlurmAction.UNDRAIN


def test_reboot_class_xid_reboots_only_when_enabled() -> None:
    assert run_decide(state(), [REBOOT])[0] is SlurmAction.DRAIN
    action, reason, _ = run_decide(
        state(), [FAIL, REBOOT], settings=SlurmSettings(reboot_on_xid=True)
    )
    assert action is SlurmAction.REBOOT and reason.startswith("nodecheck: gpu_xid")
    rebooting = SlurmSettings(reboot_on_xid=True)
    assert run_decide(state(), [FAIL], settings=rebooting)[0] is SlurmAction.DRAIN


def test_a_reboot_keeps_the_node_out_until_the_healthy_runs(tmp_path: Path) -> None:
    """reboot_on_xid through a whole reboot, as slurmctld shows the node at each step
    (SchedMD/slurm node_mgr.c): the request stamps the reason anew, the issue appends
    " : reboot issued" with another time, the registration keeps the drain. The drain
    stays nodecheck's throughout; still failing after the reboot, the node stays drained
    and is neither rebooted again nor given a rewritten reason; healthy, it is undrained
    after the hysteresis, counted from the new boot. An admin's edit after the reboot
    makes the drain theirs."""
    hysteresis_file = tmp_path / "h.json"
    record_file = tmp_path / DRAIN_RECORD_FILE
    settings = SlurmSettings(reboot_on_xid=True, undrain_after_runs=2)
    clock = this_boot(tmp_path / "proc")
    reason = slurm_reason(REBOOT)

    def run(node: SlurmNodeState, findings: list[Finding]) -> tuple[Acted, HealthCheckRun]:
        acted = Acted()
        outcome = health_check(
            node="gpu01",
            results_file=None,
            hysteresis_file=hysteresis_file,
            settings=settings,
            run_quick_checks=lambda budget: [
                (f.check, [Result(f.status, f.subject, f.summary, action=f.action)])
                for f in findings
            ],
            read_state=lambda: node,
            read_fleet=one_node,
            act=acted,
            read_clock=clock,
        )
        return acted, outcome

    def shown(base: str, *flags: str, text: str, at: str) -> SlurmNodeState:
        return replace(state(base, *flags, reason=text, user="slurm"), reason_time=at)

    acted, _ = run(state(), [REBOOT])
    assert acted == [SlurmAction.REBOOT]
    assert load_drain_record(record_file) == DrainRecord(reason, rebooting=True)
    requested = shown("IDLE", "DRAIN", "REBOOT_REQUESTED", text=reason, at="T1")
    acted, outcome = run(requested, [REBOOT])
    assert acted == [] and "not touching it" in outcome.decision.why
    issued_reason = reason + REBOOT_ISSUED_SUFFIX
    issued = shown("DOWN", "DRAIN", "REBOOT_ISSUED", text=issued_reason, at="T2")
    clock = this_boot(tmp_path / "proc", "7c1e2b4a-9d3f-4a6e-8b5c-2f1d0e9a8b7c")  # a new boot
    acted, _ = run(issued, [REBOOT])
    assert acted == []
    assert load_drain_record(record_file) == DrainRecord(issued_reason, "T2")
    registered = shown("IDLE", "DRAIN", text=issued_reason, at="T2")
    for _ in range(3):  # the fault survived the reboot: out, not rebooted again
        acted, outcome = run(registered, [REBOOT])
        assert acted == [], outcome.decision.why
        assert "drained by nodecheck, still not healthy" in outcome.decision.why
    acted, outcome = run(registered, [OK])
    assert acted == [] and "healthy 1 of 2 runs" in outcome.decision.why
    acted, _ = run(registered, [OK])
    assert acted == [SlurmAction.UNDRAIN]
    # The same reboot, then an admin's note on the reason: theirs, never undrained.
    run(state(), [REBOOT])
    run(issued, [REBOOT])
    edited = shown("IDLE", "DRAIN", text=issued_reason + " -- RMA 4711", at="T3")
    for _ in range(3):
        acted, outcome = run(edited, [OK])
        assert acted == [] and "drained for another reason" in outcome.decision.why


def test_a_job_origin_failure_never_drains_and_the_node_counts_healthy(tmp_path: Path) -> None:
    """A failure from a job's environment (a variable any user can set) is no verdict on
    the node: it never drains, nor reboots, whatever the settings; the node is healthy
    with it, and a node failure beside it still drains with the node's reason."""
    everything = SlurmSettings(reboot_on_xid=True, drain_on_error=True)
    assert run_decide(state(), [OK, JOB_FAIL]) == (SlurmAction.NOTHING, "", EXIT_HEALTHY)
    assert run_decide(state(), [JOB_FAIL], settings=everything)[0] is SlurmAction.NOTHING
    job_reboot = Finding(
        "nccl_env", Status.FAIL, "node", "x", Action.REBOOT, FaultClass.NODE_CONFIG, Origin.JOB
    )
    assert run_decide(state(), [job_reboot], settings=everything)[0] is SlurmAction.NOTHING
    action, reason, status = run_decide(state(), [JOB_FAIL, FAIL])
    assert action is SlurmAction.DRAIN and reason.startswith("nodecheck: gpu_xid ")
    assert status == EXIT_UNHEALTHY
    # Drained by nodecheck: healthy runs with the job's failure count towards the undrain.
    assert run_decide(OURS, [OK, JOB_FAIL], healthy_runs=3)[0] is SlurmAction.UNDRAIN
    # Over a whole run: nccl_env's registered declaration (origin job) decides, and the
    # healthy run is counted and undrains.
    acted = Acted()

    record_ours(tmp_path / "h.json")
    run = health_check(
        node="gpu01",
        results_file=None,
        hysteresis_file=tmp_path / "h.json",
        settings=SlurmSettings(undrain_after_runs=1, reboot_on_xid=True),
        run_quick_checks=lambda budget: [
            ("cpu", [Result(Status.OK, "node", "fine")]),
            ("nccl_env", [Result(Status.FAIL, "node", "NCCL_P2P_DISABLE=1 set in the job")]),
        ],
        read_state=lambda: OURS,
        read_fleet=one_node,
        act=acted,
        read_clock=this_boot(tmp_path / "proc"),
    )
    assert acted == [SlurmAction.UNDRAIN], run.decision.why
    assert run.decision.exit_status == EXIT_HEALTHY
    assert load_hysteresis(tmp_path / "h.json", BOOT).healthy_runs == 1


# The node's own evidence of each class, failing.
ACS_ON = Finding(
    "pcie_acs",
    Status.FAIL,
    "bridge 0000:16:00.0",
    "ACS redirects peer-to-peer traffic through the root complex",
    Action.FIX_NODE_CONFIG,
    FaultClass.NODE_CONFIG,
)
LINK_X8 = Finding(
    "pcie_link",
    Status.FAIL,
    "gpu 0000:3a:00.0",
    "PCIe link x8 32 GT/s (max x16 32 GT/s)",
    Action.INSPECT_HARDWARE,
    FaultClass.GPU_PERFORMANCE,
)


def test_the_nodes_configuration_never_drains_and_is_reported() -> None:
    """ACS on (often a fleet-wide BIOS default): exit 1 and the log line say it, the node
    stays in service, whatever the settings; beside a hardware fault, the drain names
    the hardware."""
    everything = SlurmSettings(reboot_on_xid=True, drain_on_error=True)
    decision = decide(state(), "", [OK, ACS_ON], Hysteresis(), everything, OWNED, NOW)
    assert decision.action is SlurmAction.NOTHING
    assert decision.exit_status == EXIT_UNHEALTHY
    assert "1 failing that do not take the node out of service (node-config" in decision.why
    assert "pcie_acs bridge 0000:16:00.0" in decision.why
    action, reason, _ = run_decide(state(), [ACS_ON, FAIL])
    assert action is SlurmAction.DRAIN and reason.startswith("nodecheck: gpu_xid ")
    # Drained by nodecheck for the GPU, the GPU fixed, ACS still on: healthy, undrained.
    assert run_decide(OURS, [OK, ACS_ON], healthy_runs=3)[0] is SlurmAction.UNDRAIN


def test_a_performance_failure_drains_unless_turned_off() -> None:
    action, reason, status = run_decide(state(), [LINK_X8])
    assert action is SlurmAction.DRAIN and reason.startswith("nodecheck: pcie_link gpu ")
    off = RemediationSettings(performance=False)
    action, _, status = run_decide(state(), [LINK_X8], policy=off)
    assert (action, status) == (SlurmAction.NOTHING, EXIT_UNHEALTHY)
    # Turned off, it does not hold a node nodecheck drained for another fault either.
    assert run_decide(OURS, [LINK_X8], healthy_runs=3, policy=off)[0] is SlurmAction.UNDRAIN
    # On: the node stays out, its reason now the link's.
    action, reason, _ = run_decide(OURS, [LINK_X8], healthy_runs=3)
    assert action is SlurmAction.DRAIN and reason.startswith("nodecheck: pcie_link gpu ")


def test_a_dry_run_says_the_command_and_runs_nothing(tmp_path: Path) -> None:
    acted = Acted()

    run = health_check(
        node="gpu01",
        results_file=None,
        hysteresis_file=tmp_path / "h.json",
        settings=SETTINGS,
        run_quick_checks=lambda budget: [
            ("gpu_count", [Result(Status.FAIL, "node", "7 of 8 GPUs")]),
        ],
        read_state=state,
        read_fleet=one_node,
        act=acted,
        read_clock=this_boot(tmp_path / "proc"),
        policy=RemediationSettings(dry_run=True),
        command_of=lambda action, reason: shlex.join(drain_argv("scontrol", "gpu01", reason)),
    )
    assert acted == []
    assert run.dry_run and run.done and run.decision.action is SlurmAction.DRAIN
    assert run.decision.exit_status == EXIT_UNHEALTHY
    assert (
        "dry run ([remediation] dry_run): would drain with: scontrol update NodeName=gpu01 "
        "State=DRAIN 'Reason=nodecheck: gpu_count node: 7 of 8 GPUs'" in run.decision.why
    )


def test_a_failure_whose_action_is_reboot_reboots_when_enabled(tmp_path: Path) -> None:
    """What reboots is a node failure's action, not its check's name: gpu_count's lost
    GPU asking for a reboot reboots (its reason, though another failure comes first);
    without reboot_on_xid it drains on the first failure."""
    lost = Finding("gpu_count", Status.FAIL, "node", "7 of 8 GPUs", Action.REBOOT)
    rebooting = SlurmSettings(reboot_on_xid=True)
    action, reason, status = run_decide(state(), [FAIL, lost], settings=rebooting)
    assert (action, reason) == (SlurmAction.REBOOT, "nodecheck: gpu_count node: 7 of 8 GPUs")
    assert status == EXIT_UNHEALTHY
    action, reason, _ = run_decide(state(), [FAIL, lost])
    assert action is SlurmAction.DRAIN and reason.startswith("nodecheck: gpu_xid ")
    # A failure that asks for something else is drained, reboot_on_xid or not.
    reset = Finding("gpu_xid", Status.FAIL, "gpu 0000:3a:00.0", "XID 48", Action.RESET_GPU)
    assert run_decide(state(), [reset], settings=rebooting)[0] is SlurmAction.DRAIN
    # Over a whole run: the result's own action (the evidence decided it) is read.
    acted: list[tuple[SlurmAction, str]] = []

    def act(action: SlurmAction, reason: str) -> tuple[bool, str]:
        acted.append((action, reason))
        return True, ""

    result = Result(Status.FAIL, "gpu 0000:3a:00.0", "XID 79", action=Action.REBOOT)
    run = health_check(
        node="gpu01",
        results_file=None,
        hysteresis_file=tmp_path / "h.json",
        settings=rebooting,
        run_quick_checks=lambda budget: [("gpu_xid", [result])],
        read_state=state,
        read_fleet=one_node,
        act=act,
        read_clock=this_boot(tmp_path / "proc"),
    )
    assert acted == [(SlurmAction.REBOOT, "nodecheck: gpu_xid gpu 0000:3a:00.0: XID 79")]
    assert run.decision.exit_status == EXIT_UNHEALTHY and run.done


def test_the_reason_is_one_line_cut_to_what_slurm_keeps() -> None:
    long = Finding("gpu_xid", Status.FAIL, "gpu 0000:3a:00.0", "é" * 300 + "\nsecond line\x07")
    reason = slurm_reason(long)
    assert len(reason.encode("utf-8")) <= REASON_MAX_BYTES
    assert reason.startswith("nodecheck: gpu_xid gpu 0000:3a:00.0: é") and reason.endswith("...")
    assert "\n" not in reason
    short = slurm_reason(Finding("c", Status.FAIL, "node", "a\nb\x07c"))
    assert short == "nodecheck: c node: a b\\x07c"  # a BEL shown escaped (checks/printable.py)


def test_the_actions_argv() -> None:
    assert drain_argv("scontrol", "gpu01", "nodecheck: x y: z") == [
        "scontrol",
        "update",
        "NodeName=gpu01",
        "State=DRAIN",
        "Reason=nodecheck: x y: z",
    ]
    assert undrain_argv("scontrol", "gpu01") == [
        "scontrol",
        "update",
        "NodeName=gpu01",
        "State=UNDRAIN",
    ]
    # Neither ASAP nor nextstate: either clears DRAIN when the node registers again.
    assert reboot_argv("scontrol", "gpu01", "nodecheck: x") == [
        "scontrol",
        "reboot",
        "reason=nodecheck: x",
        "gpu01",
    ]


# -- the results file ---------------------------------------------------------------


def stored_run(
    name: str,
    finished_at: float,
    interval_s: float,
    findings: tuple[Finding, ...],
    benchmark: bool = False,
) -> StoredRun:
    """A check's latest run as the agent keeps it, its results meaning what `findings`
    say (each one's action, class and origin set on its result)."""
    check = Check(name, lambda ctx: [], interval_s, 1.0, name, benchmark=benchmark)
    results = [
        Result(
            f.status,
            f.subject,
            f.summary,
            f.remedy,
            action=f.action,
            fault_class=f.fault_class,
            origin=f.origin,
        )
        for f in findings
    ]
    return StoredRun(CheckRun(check, results, 0.0, True), finished_at, interval_s)


def write_results(path: Path, written_at: float, finished_at: float, *findings: Finding) -> Path:
    by_check: dict[str, list[Finding]] = {}
    for finding in findings or (OK,):
        by_check.setdefault(finding.check, []).append(finding)
    runs = [stored_run(name, finished_at, 60.0, tuple(f)) for name, f in by_check.items()]
    runs.append(stored_run("gpu_bench", finished_at - 86400 * 3, 86400.0, (FAIL,), True))
    path.write_text(document_text(check_document("gpu01", runs, written_at)))
    return path


def fresh_findings(
    path: Path, now: float, max_age_s: float, expected: set[str] | None = None
) -> list[Finding]:
    return list(fresh_results(path, now, max_age_s, expected or ()).findings)


def test_fresh_results_are_judged_without_the_benchmarks(tmp_path: Path) -> None:
    path = write_results(tmp_path / "r.json", NOW - 10, NOW - 20, OK, ERROR)
    assert fresh_findings(path, NOW, 300) == [OK, ERROR]


def test_stale_results_are_refused(tmp_path: Path) -> None:
    path = write_results(tmp_path / "r.json", NOW - 301, NOW - 301)
    with pytest.raises(ResultsUnusableError, match="301 s old"):
        fresh_findings(path, NOW, 300)
    # The file is new but a check's result is old: that check is stuck.
    path = write_results(tmp_path / "r.json", NOW - 1, NOW - 361)
    with pytest.raises(ResultsUnusableError, match="cpu's result"):
        fresh_findings(path, NOW, 300)
    path = write_results(tmp_path / "r.json", NOW + 3600, NOW)
    with pytest.raises(ResultsUnusableError, match="future"):
        fresh_findings(path, NOW, 300)


def test_missing_or_damaged_results_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ResultsUnusableError, match="no results file"):
        fresh_findings(tmp_path / "absent.json", NOW, 300)
    good = json.loads(write_results(tmp_path / "r.json", NOW, NOW).read_text())
    assert [c["check"] for c in good["checks"]] == ["cpu", "gpu_bench"]
    benchmark_rows = [r for r in good["results"] if r["check"] == "gpu_bench"]
    damaged = {
        "truncated": ((tmp_path / "r.json").read_text()[:50], "not JSON"),
        "schema": (json.dumps({**good, "schema": "nodecheck.check/v1"}), "schema 'nodecheck"),
        "status": (json.dumps(good).replace('"ok"', '"fine"'), r"\.status: 'fine'"),
        "no results": (json.dumps({**good, "results": benchmark_rows}), "no results for 'cpu'"),
        "only benchmarks": (
            json.dumps({**good, "checks": good["checks"][1:], "results": benchmark_rows}),
            "none of the quick checks",
        ),
        "NaN time": (
            json.dumps(good).replace(f'"written_at": {NOW}', '"written_at": NaN'),
            "written_at: not a finite number",
        ),
        "binary": ("\xff\xfe", "cannot read"),
    }
    for name, (text, why) in damaged.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(text.encode("latin-1") if name == "binary" else text.encode())
        with pytest.raises(ResultsUnusableError, match=why):
            fresh_findings(path, NOW, 300)
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ResultsUnusableError, match="directory"):
        fresh_findings(tmp_path / "dir.json", NOW, 300)


# -- the hysteresis -----------------------------------------------------------------


def test_hysteresis_survives_runs_and_damage_resets_it(tmp_path: Path) -> None:
    path = tmp_path / "state" / "slurm_health.json"
    assert load_hysteresis(path, BOOT) == Hysteresis()
    save_hysteresis(path, Hysteresis(2, 400.0, NOW - 60), BOOT)
    assert load_hysteresis(path, BOOT) == Hysteresis(2, 400.0, NOW - 60)
    healthy, failing = Observation(True, 460.0, NOW), Observation(False, 460.0, NOW)
    assert next_hysteresis(load_hysteresis(path, BOOT), healthy) == Hysteresis(
        2 + 1, 400.0, NOW - 60
    )
    assert next_hysteresis(load_hysteresis(path, BOOT), failing) == Hysteresis()
    # Another boot's clock readings mean nothing on this one: its streak is not carried.
    assert load_hysteresis(path, BOOT.replace("0d3e", "9f9f")) == Hysteresis()
    for text in ("{", '{"healthy_runs": -1, "healthy_since": null}', '{"healthy_runs": true}'):
        path.write_text(text)
        assert load_hysteresis(path, BOOT) == Hysteresis()


# -- scontrol, bounded ----------------------------------------------------------------


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "scontrol"
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_a_hanging_scontrol_is_killed_at_its_deadline(tmp_path: Path) -> None:
    hanging = script(tmp_path, "print('NodeName=gpu01', flush=True)\ntime.sleep(600)")
    started = time.monotonic()
    with pytest.raises(SlurmStateError, match=r"did not finish within 0\.5 s"):
        read_slurm_node("gpu01", hanging, timeout_s=0.5)
    assert time.monotonic() - started < 30  # killed, not waited for
    outcome = run_action([hanging, "update"], 0.5)
    assert not outcome.done and "did not finish" in outcome.problem


def test_a_failing_or_flooding_scontrol_is_an_error(tmp_path: Path) -> None:
    failing = script(
        tmp_path,
        "sys.stderr.write('slurm_load_node error: Unable to contact slurm controller\\n')"
        "\nsys.exit(1)",
    )
    with pytest.raises(SlurmStateError, match="exited 1: slurm_load_node error"):
        read_slurm_node("gpu01", failing)
    assert not run_action([failing, "update"], 5).done
    flooding = script(tmp_path, "sys.stdout.write('x' * (1 << 20))")
    with pytest.raises(SlurmStateError, match="wrote over"):
        run_bounded_command([flooding], 5)
    with pytest.raises(SlurmStateError, match="cannot run"):
        read_slurm_node("gpu01", str(tmp_path / "absent"))


def test_reads_the_state_through_scontrol(tmp_path: Path) -> None:
    answer = script(tmp_path, f"sys.stdout.write({DRAINED_BY_NODECHECK!r})")
    assert read_slurm_node("gpu01", answer).reason_user == "root"


# -- one run, with the node's side given ----------------------------------------------


def test_a_run_without_fresh_results_runs_the_checks_and_acts(tmp_path: Path) -> None:
    acted: list[tuple[SlurmAction, str]] = []
    budgets: list[float] = []

    def checks(budget_s: float) -> list[tuple[str, list[Result]]]:
        budgets.append(budget_s)
        return [("gpu_count", [Result(Status.FAIL, "node", "7 of 8 GPUs")])]

    def act(action: SlurmAction, reason: str) -> tuple[bool, str]:
        acted.append((action, reason))
        return True, ""

    run = health_check(
        node="gpu01",
        results_file=tmp_path / "absent.json",
        hysteresis_file=tmp_path / "h.json",
        settings=SlurmSettings(budget_s=7),
        run_quick_checks=checks,
        read_state=state,
        read_fleet=one_node,
        act=act,
        read_clock=this_boot(tmp_path / "proc"),
    )
    assert budgets == [7]  # no other run held the lock: none of it was spent waiting
    assert run.source.startswith("own run (no results file")
    assert acted == [(SlurmAction.DRAIN, "nodecheck: gpu_count node: 7 of 8 GPUs")]
    assert run.decision.exit_status == EXIT_UNHEALTHY
    assert load_hysteresis(tmp_path / "h.json", BOOT) == Hysteresis()


def test_a_failed_action_is_undetermined(tmp_path: Path) -> None:
    write_results(tmp_path / "r.json", time.time(), time.time(), FAIL)
    run = health_check(
        node="gpu01",
        results_file=tmp_path / "r.json",
        hysteresis_file=tmp_path / "h.json",
        settings=SETTINGS,
        run_quick_checks=lambda budget: pytest.fail("fresh results: no checks run"),
        read_state=state,
        read_fleet=one_node,
        act=lambda action, reason: (False, "scontrol exited 1"),
        read_clock=this_boot(tmp_path / "proc"),
    )
    assert run.source == "agent results"
    assert run.decision.action is SlurmAction.DRAIN and not run.done
    assert run.decision.exit_status == EXIT_UNDETERMINED and run.problem == "scontrol exited 1"


def test_results_of_an_agent_that_could_not_see_are_judged_again_here(tmp_path: Path) -> None:
    """The agent ran without root's reads (no snapshot): nvswitch_sxid's `skip` for a
    kernel log closed to it is no verdict on the node, so a drained node is never
    undrained on it; health-check (root, under slurmd) runs the checks itself."""
    unseen = Result(
        Status.SKIP,
        "node",
        "NVSwitch SXids not watched: the kernel log is closed to this process",
        details={"cause": "unprivileged"},
    )
    check = Check("nvswitch_sxid", lambda ctx: [], 60.0, 1.0, "nvswitch_sxid")
    runs = [
        stored_run("cpu", NOW - 20, 60.0, (OK,)),
        StoredRun(CheckRun(check, [unseen], 0.0, True), NOW - 20, 60.0),
    ]
    path = tmp_path / "r.json"
    path.write_text(document_text(check_document("gpu01", runs, NOW - 10)))
    [finding] = [f for f in fresh_findings(path, NOW, 300) if f.check == "nvswitch_sxid"]
    assert finding.unseen and finding.status is Status.SKIP
    own: list[float] = []

    def run_quick_checks(budget: float) -> list[tuple[str, list[Result]]]:
        own.append(budget)
        return [("cpu", [Result(Status.OK, "node", "fine")])]

    run = health_check(
        node="gpu01",
        results_file=path,
        hysteresis_file=tmp_path / "h.json",
        settings=SETTINGS,
        run_quick_checks=run_quick_checks,
        read_state=lambda: OURS,
        read_fleet=one_node,
        act=Acted(),
        read_clock=this_boot(tmp_path / "proc"),
        now=lambda: NOW,
    )
    assert own and run.source == ("own run (the agent could not read what nvswitch_sxid need)"), (
        run.source
    )


# -- the configuration ----------------------------------------------------------------


def test_the_slurm_settings_are_read_and_checked() -> None:
    from nodecheck.agent.config import DEFAULT_RESULTS_FILE, ConfigError, parse_config

    where = Path("/etc/nodecheck/config.toml")
    default = parse_config("", where, set())
    assert default.slurm == SlurmSettings() and default.results_file == DEFAULT_RESULTS_FILE
    text = (
        '[agent]\nresults_file = "/run/x/results.json"\n'
        "[slurm]\nresults_max_age = 120\nbudget = 10\nscontrol_timeout = 2\n"
        "drain_on_error = true\nundrain_after_runs = 5\nundrain_after = 900\n"
        "reboot_on_xid = true\n"
    )
    config = parse_config(text, where, set())
    assert config.results_file == Path("/run/x/results.json")
    assert config.slurm == SlurmSettings(120, 10, 2, True, 5, 900, True)
    assert parse_config('[agent]\nresults_file = ""\n', where, set()).results_file is None
    for bad, key in [
        ("[slurm]\nbudget = 60\n", "slurm.budget"),  # past HealthCheckTimeout's 60 s
        ("[slurm]\nundrain_after_runs = 0\n", "slurm.undrain_after_runs"),
        ("[slurm]\nundrain_after_runs = 2.5\n", "slurm.undrain_after_runs"),
        ("[slurm]\nresults_max_age = nan\n", "slurm.results_max_age"),
        ("[slurm]\ndrain_on_error = 1\n", "slurm.drain_on_error"),
        ("[slurm]\nresume = true\n", "slurm.resume"),
        ('[agent]\nresults_file = "results.json"\n', "agent.results_file"),
    ]:
        with pytest.raises(ConfigError) as raised:
            parse_config(bad, where, set())
        assert f": {key}: " in str(raised.value), bad
    shown = parse_config(config.show(), where, set())
    assert shown.slurm == config.slurm and shown.results_file == config.results_file


def test_the_remediation_settings_are_read_and_checked() -> None:
    from nodecheck.agent.config import ConfigError, parse_config

    where = Path("/etc/nodecheck/config.toml")
    assert parse_config("", where, set()).remediation == RemediationSettings(True, False)
    text = (
        "[remediation]\nperformance = false\ndry_run = true\nbreaker_fraction = 0.25\n"
        "breaker_nodes = 8\nbreaker_window = 600\n"
    )
    config = parse_config(text, where, set())
    assert config.remediation == RemediationSettings(False, True, 0.25, 8, 600.0)
    assert parse_config(config.show(), where, set()).remediation == config.remediation
    for bad, key in [
        ("[remediation]\nperformance = 0\n", "remediation.performance"),
        ('[remediation]\ndry_run = "yes"\n', "remediation.dry_run"),
        ("[remediation]\nconfig = false\n", "remediation.config"),
        ("[remediation]\nbreaker_fraction = 0\n", "remediation.breaker_fraction"),
        ("[remediation]\nbreaker_fraction = 1.5\n", "remediation.breaker_fraction"),
        ("[remediation]\nbreaker_nodes = 0\n", "remediation.breaker_nodes"),
        ("[remediation]\nbreaker_window = 10\n", "remediation.breaker_window"),
    ]:
        with pytest.raises(ConfigError) as raised:
            parse_config(bad, where, set())
        assert f"config.toml:2: {key}: " in str(raised.value), (bad, str(raised.value))


@pytest.mark.parametrize(
    ("shown", "base", "flags"),
    [
        ("IDLE+DRAIN+NOT_RESPONDING", "IDLE", {"DRAIN", "NOT_RESPONDING"}),
        ("MIXED+NOT_RESPONDING", "MIXED", {"NOT_RESPONDING"}),
        ("DOWN+DRAIN+NOT_RESPONDING", "DOWN", {"DRAIN", "NOT_RESPONDING"}),
    ],
)
def test_scontrol_s_not_responding_flag_is_hands_off(
    shown: str, base: str, flags: set[str]
) -> None:
    """scontrol writes a node that does not answer as +NOT_RESPONDING (sinfo as "*"):
    never drained or undrained, whatever its reason and its runs."""
    text = IDLE.replace("State=IDLE", f"State={shown}")
    text += "   Reason=nodecheck: gpu_xid gpu 0000:3a:00.0: XID 79 [root@2026-12-01T15:00:00]\n"
    parsed = parse_scontrol_node(text, "gpu01")
    assert (parsed.base, set(parsed.flags), parsed.not_responding) == (base, flags, True)
    assert run_decide(parsed, [FAIL])[0] is SlurmAction.NOTHING
    assert run_decide(parsed, [OK], healthy_runs=100, since=0)[0] is SlurmAction.NOTHING


def test_a_reboot_slurm_will_not_do_drains_instead(tmp_path: Path) -> None:
    """reboot_on_xid, but no RebootProgram (scontrol reboot fails): the node that needs a
    reboot must not stay in service: it is drained with the same reason."""
    write_results(tmp_path / "r.json", time.time(), time.time(), REBOOT)
    acted: list[SlurmAction] = []

    def act(action: SlurmAction, reason: str) -> tuple[bool, str]:
        acted.append(action)
        return (False, "RebootProgram not set") if action is SlurmAction.REBOOT else (True, "")

    run = health_check(
        node="gpu01",
        results_file=tmp_path / "r.json",
        hysteresis_file=tmp_path / "h.json",
        settings=SlurmSettings(reboot_on_xid=True),
        run_quick_checks=lambda budget: pytest.fail("fresh results: no checks run"),
        read_state=state,
        read_fleet=one_node,
        act=act,
        read_clock=this_boot(tmp_path / "proc"),
    )
    assert acted == [SlurmAction.REBOOT, SlurmAction.DRAIN]
    assert run.decision.action is SlurmAction.DRAIN and run.done
    assert run.decision.reason == "nodecheck: gpu_xid gpu 0000:3a:00.0: XID 79"
    assert "RebootProgram not set" in run.problem


def test_results_without_every_quick_check_are_no_healthy_run(tmp_path: Path) -> None:
    """An agent just started has its fast checks' results only: what it has not judged
    yet is not healthy, so health-check judges the node itself."""
    write_results(tmp_path / "r.json", time.time(), time.time(), OK)
    fresh = fresh_findings(tmp_path / "r.json", time.time(), 300, expected={"cpu"})
    assert fresh == [OK]
    with pytest.raises(ResultsUnusableError, match="has no result of gpu_xid yet"):
        fresh_findings(tmp_path / "r.json", time.time(), 300, expected={"cpu", "gpu_xid"})


# -- the hysteresis's clock and memory, over whole runs ---------------------------------

HEALTHY_CHECKS: list[tuple[str, list[Result]]] = [("cpu", [Result(Status.OK, "node", "fine")])]


def record_ours(hysteresis_file: Path) -> None:
    """nodecheck's record that it drained OURS, beside the count, where it can be made."""
    with contextlib.suppress(OSError):
        save_drain_record(hysteresis_file.with_name(DRAIN_RECORD_FILE), OWNED)


def healthy_run(
    tmp_path: Path,
    settings: SlurmSettings,
    read_clock: Callable[[], BootMoment],
    wall: float,
    hysteresis_file: Path | None = None,
) -> tuple[HealthCheckRun, list[SlurmAction]]:
    """One run on a node nodecheck drained (its record of the drain beside the count), its
    checks healthy; what it decided and did."""
    acted = Acted()
    hysteresis_file = hysteresis_file or tmp_path / "state" / "h.json"
    record_ours(hysteresis_file)

    run = health_check(
        node="gpu01",
        results_file=None,
        hysteresis_file=hysteresis_file,
        settings=settings,
        run_quick_checks=lambda budget: HEALTHY_CHECKS,
        read_state=lambda: OURS,
        read_fleet=one_node,
        act=acted,
        read_clock=read_clock,
        now=lambda: wall,
    )
    return run, acted


def test_a_wall_clock_step_does_not_shorten_undrain_after(tmp_path: Path) -> None:
    """Two healthy runs, the wall clock stepped an hour on between them (date -s, an NTP
    step): undrain_after = 600 is measured on this boot's clock, which did not move."""
    timed = SlurmSettings(undrain_after_runs=1000, undrain_after_s=600)
    clock = this_boot(tmp_path / "proc")
    first, acted = healthy_run(tmp_path, timed, clock, wall=NOW)
    assert first.decision.action is SlurmAction.NOTHING and acted == []
    second, acted = healthy_run(tmp_path, timed, clock, wall=NOW + 3600 + 2)
    assert second.decision.action is SlurmAction.NOTHING and acted == []
    assert "healthy 2 of 1000 runs in a row (since " in second.decision.why
    saved = json.loads((tmp_path / "state" / "h.json").read_text())
    assert saved["boot_id"] == BOOT and saved["healthy_since_wall"] == NOW  # for the log


def test_undrain_after_counts_on_the_boot_clock_and_restarts_on_a_new_boot(
    tmp_path: Path,
) -> None:
    timed = SlurmSettings(undrain_after_runs=1000, undrain_after_s=0.2)
    first, _ = healthy_run(tmp_path, timed, this_boot(tmp_path / "proc"), wall=NOW)
    assert first.decision.action is SlurmAction.NOTHING
    started = time.clock_gettime(time.CLOCK_BOOTTIME)

    def boot_clock_past(seconds: float) -> None:
        deadline = time.monotonic() + 60
        while time.clock_gettime(time.CLOCK_BOOTTIME) < started + seconds:
            assert time.monotonic() < deadline, "CLOCK_BOOTTIME did not advance"
            time.sleep(0.05)

    boot_clock_past(0.3)
    # The node rebooted meanwhile: the streak's time on the old boot's clock means nothing.
    rebooted = this_boot(tmp_path / "proc", BOOT.replace("0d3e", "77aa"))
    second, acted = healthy_run(tmp_path, timed, rebooted, wall=NOW + 1)
    assert second.decision.action is SlurmAction.NOTHING and acted == []
    assert "healthy 1 of 1000 runs in a row" in second.decision.why
    started = time.clock_gettime(time.CLOCK_BOOTTIME)
    boot_clock_past(0.3)
    third, acted = healthy_run(tmp_path, timed, rebooted, wall=NOW + 2)
    assert acted == [SlurmAction.UNDRAIN], third.decision.why
    assert third.decision.why.startswith("healthy: healthy for ")


def test_a_run_that_cannot_save_its_count_never_undrains_on_it(tmp_path: Path) -> None:
    """undrain_after_runs = 1, but the count's file is a folder: the healthy run is
    counted nowhere, so it undrains nothing, says why, and could not determine."""
    (tmp_path / "state" / "h.json").mkdir(parents=True)
    clock = this_boot(tmp_path / "proc")
    run, acted = healthy_run(tmp_path, SlurmSettings(undrain_after_runs=1), clock, wall=NOW)
    assert acted == []
    assert run.decision.action is SlurmAction.NOTHING
    assert run.decision.exit_status == EXIT_UNDETERMINED
    assert "this healthy run could not be saved (cannot save " in run.decision.why
    assert "not undraining on a count it cannot keep" in run.decision.why
    assert run.problem.startswith(f"cannot save {tmp_path / 'state' / 'h.json'}: ")


def test_a_state_folder_it_cannot_use_proves_no_drain_nodecheck_s(tmp_path: Path) -> None:
    """The state's folder is a regular file: neither the count nor the record of the drain
    can be read, so the drain is not provably nodecheck's: left alone, and said."""
    (tmp_path / "state").write_text("not a folder\n")
    clock = this_boot(tmp_path / "proc")
    run, acted = healthy_run(tmp_path, SlurmSettings(undrain_after_runs=1), clock, wall=NOW)
    assert acted == [] and run.decision.action is SlurmAction.NOTHING
    assert "drained for another reason" in run.decision.why
    assert run.problem.startswith(f"cannot lock {tmp_path / 'state' / 'h.json.lock'}: ")


@pytest.mark.parametrize("planted", ["fifo", "directory"])
def test_a_lock_file_that_is_no_regular_file_is_refused_without_waiting(
    tmp_path: Path, planted: str
) -> None:
    """Someone made the lock file a FIFO (an open of it would block for ever, fifo(7)) or
    a folder: the run refuses that lock at once, saves nothing and undrains nothing. It
    runs in a thread so that a regression fails here instead of hanging the suite."""
    lock = tmp_path / "state" / "h.json.lock"
    lock.parent.mkdir()
    if planted == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    clock = this_boot(tmp_path / "proc")
    outcome: list[tuple[HealthCheckRun, list[SlurmAction]]] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            healthy_run(tmp_path, SlurmSettings(undrain_after_runs=1), clock, wall=NOW)
        ),
        daemon=True,
    )
    worker.start()
    worker.join(120)
    if worker.is_alive():
        # Unblock the hung open so that the thread ends, then fail.
        with contextlib.suppress(OSError):
            os.close(os.open(lock, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("health-check blocked opening the planted lock file")
    (run, acted) = outcome[0]
    assert acted == [] and run.decision.exit_status == EXIT_UNDETERMINED
    assert run.problem.startswith(f"cannot lock {lock}: "), run.problem
    assert not (tmp_path / "state" / "h.json").exists()


def test_a_run_that_cannot_tell_its_boot_never_undrains(tmp_path: Path) -> None:
    clock = this_boot(tmp_path / "proc", "not a uuid")
    run, acted = healthy_run(tmp_path, SlurmSettings(undrain_after_runs=1), clock, wall=NOW)
    assert acted == [] and run.decision.exit_status == EXIT_UNDETERMINED
    assert "cannot tell this boot from another" in run.problem and "not a boot id" in run.problem


def test_a_failure_still_drains_where_nothing_can_be_saved(tmp_path: Path) -> None:
    """No lock and no state (the folder a regular file): a node in service that fails is
    drained all the same; the count it could not reset was never there to remove."""
    (tmp_path / "state").write_text("not a folder\n")
    acted: list[tuple[SlurmAction, str]] = []

    def act(action: SlurmAction, reason: str) -> tuple[bool, str]:
        acted.append((action, reason))
        return True, ""

    run = health_check(
        node="gpu01",
        results_file=None,
        hysteresis_file=tmp_path / "state" / "h.json",
        settings=SETTINGS,
        run_quick_checks=lambda budget: [("gpu_count", [Result(Status.FAIL, "node", "7 of 8")])],
        read_state=state,
        read_fleet=one_node,
        act=act,
        read_clock=this_boot(tmp_path / "proc"),
    )
    assert acted == [(SlurmAction.DRAIN, "nodecheck: gpu_count node: 7 of 8")]
    assert run.decision.exit_status == EXIT_UNHEALTHY
    assert run.problem.endswith("; removed h.json instead: no healthy run is counted")


# -- the circuit breaker -------------------------------------------------------------------


def fleet(drained_recently: int, drained_long_ago: int, total: int) -> list[SlurmNodeState]:
    """`total` nodes: some drained by nodecheck a minute ago, some a week ago, one by an
    admin, the rest in service."""
    recent = time.strftime(REASON_TIME_FORMAT, time.localtime(NOW - 60))
    old = time.strftime(REASON_TIME_FORMAT, time.localtime(NOW - 7 * 86400))
    nodes = []
    for index in range(total):
        name = f"gpu{index + 2:03d}"
        if index < drained_recently:
            reason, when = "nodecheck: gpu_xid gpu 0000:3a:00.0: XID 79", recent
        elif index < drained_recently + drained_long_ago:
            reason, when = "nodecheck: gpu_count node: 7 of 8 GPUs", old
        elif index == drained_recently + drained_long_ago:
            reason, when = "cabling", recent
        else:
            nodes.append(SlurmNodeState(name, "IDLE", frozenset(), False, None, None, None))
            continue
        nodes.append(
            SlurmNodeState(name, "IDLE", frozenset({"DRAIN"}), False, reason, "root", when)
        )
    return nodes


def test_the_breaker_counts_nodecheck_s_drains_within_its_window() -> None:
    tenth = RemediationSettings()  # 10 % of the nodes, at most 50, within the hour
    assert read_breaker(fleet(2, 5, 20), tenth, "nodecheck:", NOW) == BreakerReading(2, 20, 2)
    assert read_breaker(fleet(2, 5, 20), tenth, "nodecheck:", NOW).open
    assert not read_breaker(fleet(1, 5, 20), tenth, "nodecheck:", NOW).open
    wider = RemediationSettings(breaker_fraction=0.2)
    assert not read_breaker(fleet(2, 5, 20), wider, "nodecheck:", NOW).open
    few = RemediationSettings(breaker_fraction=1.0, breaker_nodes=2)
    assert read_breaker(fleet(2, 0, 100), few, "nodecheck:", NOW).cap == 2
    # One node alone: the first drain goes through, never a second at once.
    assert read_breaker(one_node(), tenth, "nodecheck:", NOW) == BreakerReading(0, 1, 1)
    # A reason whose time cannot be read counts.
    unread = [replace(node, reason_time="yesterday") for node in fleet(2, 0, 20)]
    assert read_breaker(unread, tenth, "nodecheck:", NOW).out_recently == 2


@pytest.mark.parametrize("open_or_unreadable", ["open", "unreadable"])
def test_a_drain_past_the_breaker_is_withheld_and_reported(
    open_or_unreadable: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    acted = Acted()

    def read_fleet() -> list[SlurmNodeState]:
        if open_or_unreadable == "unreadable":
            raise SlurmStateError("scontrol show node did not finish within 5 s")
        return [state(), *fleet(2, 0, 19)]

    run = health_check(
        node="gpu01",
        results_file=None,
        hysteresis_file=tmp_path / "h.json",
        settings=SETTINGS,
        run_quick_checks=lambda budget: [("gpu_count", [Result(Status.FAIL, "node", "7 of 8")])],
        read_state=state,
        read_fleet=read_fleet,
        act=acted,
        read_clock=this_boot(tmp_path / "proc"),
        now=lambda: NOW,
    )
    assert acted == [] and run.decision.action is SlurmAction.NOTHING
    assert run.decision.withheld and run.decision.exit_status == EXIT_UNHEALTHY
    assert "withheld, reported instead of a drain: " in run.decision.why
    if open_or_unreadable == "open":
        assert "2 of 20 nodes drained by nodecheck in the last 3600 s, the cap 2" in (
            run.decision.why
        )
    else:
        assert "could not be read for the circuit breaker" in run.decision.why
    caplog.set_level(logging.INFO, logger="nodecheck.agent.slurm.health")
    log_run("gpu01", run)
    assert "breaker=open" in caplog.records[-1].getMessage()
    # Said beside the count for the agent's nodecheck_remediation_withheld, until a run
    # is not held back (here: the fleet read again, the cap not reached).
    withheld = tmp_path / SLURM_WITHHELD_FILE
    assert read_withheld(withheld) is True
    assert withheld.stat().st_mode & 0o777 == 0o644  # root's note, read by the agent's user
    assert json.loads(withheld.read_text())["why"] == run.decision.why
    again = health_check(
        node="gpu01",
        results_file=None,
        hysteresis_file=tmp_path / "h.json",
        settings=SETTINGS,
        run_quick_checks=lambda budget: [("gpu_count", [Result(Status.FAIL, "node", "7 of 8")])],
        read_state=state,
        read_fleet=lambda: [state(), *fleet(1, 0, 19)],
        act=acted,
        read_clock=this_boot(tmp_path / "proc"),
        now=lambda: NOW,
    )
    assert acted == [SlurmAction.DRAIN] and not again.decision.withheld
    assert read_withheld(withheld) is False


def test_every_node_of_scontrol_show_node_is_read() -> None:
    text = (
        DRAINED_BY_NODECHECK
        + IDLE.replace("gpu01", "gpu02")
        + DOWN_NOT_RESPONDING.replace("gpu01", "gpu03")
    )
    nodes = parse_scontrol_nodes(text)
    assert [(n.name, n.base, n.drained) for n in nodes] == [
        ("gpu01", "IDLE", True),
        ("gpu02", "IDLE", False),
        ("gpu03", "DOWN", True),
    ]
    assert nodes[0].reason_time == "2026-12-01T15:00:00"
    with pytest.raises(SlurmStateError):
        parse_scontrol_nodes("garbage\n" + IDLE)
