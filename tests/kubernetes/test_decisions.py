"""The reporter's pure decisions on literal inputs: conditions from findings, the
lastTransitionTime rule, the taint and its ownership, event deduplication, messages."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodecheck.agent.config import ConfigError, KubernetesSettings, parse_config
from nodecheck.agent.findings import Finding, findings_of, findings_of_named
from nodecheck.agent.kubernetes.fault_classes import class_verdict
from nodecheck.agent.kubernetes.npd import judge
from nodecheck.agent.kubernetes.reporter import (
    OWNERSHIP_ANNOTATION,
    TAINT_KEY,
    ConditionHold,
    ConditionState,
    EventMemory,
    Fault,
    FaultHold,
    KubernetesReporter,
    TaintStep,
    camel_case,
    condition_patch,
    event_body,
    fault_of,
    judge_classes,
    listed,
    plan_taint,
    taint_patch,
)
from nodecheck.checks.result import FaultClass, Origin, Result, Status
from tests.conftest import Node

NOW = "2026-12-01T10:00:00Z"
EARLIER = "2026-11-30T08:00:00Z"


def finding(
    check: str,
    status: str,
    subject: str = "node",
    summary: str = "text",
    origin: Origin | None = None,
) -> Finding:
    """A check's finding, its meaning (class, action, origin) as the registered check
    declares it unless `origin` says otherwise; a name no check has: Check's defaults."""
    [found] = findings_of_named(check, [Result(Status(status), subject, summary, origin=origin)])
    return found


def by_type(states: list[ConditionState]) -> dict[str, tuple[str, str]]:
    return {s.type: (s.status, s.reason) for s in states}


def test_one_condition_per_class_true_unknown_false() -> None:
    states = judge_classes(
        [
            ("gpu_xid", [finding("gpu_xid", "fail", "gpu 0000:bc:00.0", "XID 79")]),
            ("gpu_count", [finding("gpu_count", "ok")]),
            ("pcie_link", [finding("pcie_link", "error", "gpu 0000:18:00.0", "unreadable")]),
            ("gpu_throttle", [finding("gpu_throttle", "warn")]),
            ("numa", [finding("numa", "warn", "node", "balancing on")]),
            ("cpu", [finding("cpu", "ok")]),
        ]
    )
    assert by_type(states) == {
        "NodecheckGpuHardware": ("True", "GpuXidFailed"),
        "NodecheckGpuPerformance": ("Unknown", "CouldNotDetermine"),
        "NodecheckNodeConfig": ("False", "NoFailingCheck"),
    }
    hardware, performance, config = states
    assert hardware.message == "gpu_xid gpu 0000:bc:00.0: XID 79"
    assert performance.message == "pcie_link gpu 0000:18:00.0: unreadable"
    assert config.message == "no failing check (cpu, numa); 1 warning(s), reported as events"


def test_several_failing_checks_and_a_class_that_did_not_run() -> None:
    states = judge_classes(
        [
            ("gpu_xid", [finding("gpu_xid", "fail")]),
            ("gpu_nvlink", [finding("gpu_nvlink", "fail"), finding("gpu_nvlink", "error")]),
            ("cpu", [finding("cpu", "skip")]),
        ]
    )
    assert by_type(states) == {
        "NodecheckGpuHardware": ("True", "SeveralChecksFailed"),
        # No check of the class ran: absence is never a pass.
        "NodecheckGpuPerformance": ("Unknown", "CouldNotDetermine"),
        # Only skipped: nothing judged, Unknown as `nodecheck npd` says (exit 2).
        "NodecheckNodeConfig": ("Unknown", "CouldNotDetermine"),
    }
    assert "no check of class gpu-performance ran" in states[1].message
    assert states[2].message == "nothing judged: cpu skipped"


def test_a_check_without_a_class_still_counts() -> None:
    # No registered check of that name: read the careful way, as hardware.
    states = judge_classes([("some_new_check", [finding("some_new_check", "fail")])])
    assert states[0].type == "NodecheckGpuHardware"
    assert states[0].status == "True" and states[0].reason == "SomeNewCheckFailed"


def test_a_finding_is_judged_under_its_own_class() -> None:
    """gpu_throttle declares gpu-performance; a result of it that says hardware is a
    hardware fault, in that condition and the taint's value."""
    [lost] = findings_of_named(
        "gpu_throttle",
        [Result(Status.FAIL, "gpu 3", "GPU lost", fault_class=FaultClass.GPU_HARDWARE)],
    )
    checks = [("gpu_throttle", [lost])]
    assert by_type(judge_classes(checks)) == {
        "NodecheckGpuHardware": ("True", "GpuThrottleFailed"),
        "NodecheckGpuPerformance": ("Unknown", "CouldNotDetermine"),
        "NodecheckNodeConfig": ("Unknown", "CouldNotDetermine"),
    }
    fault = fault_of(checks)
    assert fault is not None and fault.fault_class is FaultClass.GPU_HARDWARE


def test_a_jobs_failing_finding_is_a_warning_event_not_a_condition_or_taint() -> None:
    """nccl_env judges the job's environment (origin job): what a user sets never makes
    a condition True or taints the node; it is still announced, a Warning Event."""
    job = finding("nccl_env", "fail", "node", "NCCL_P2P_DISABLE=1")
    assert job.origin is Origin.JOB and job.status is Status.FAIL
    checks = [("nccl_env", [job]), ("numa", [finding("numa", "ok")])]
    [hardware, performance, config] = judge_classes(checks)
    assert (config.status, config.reason) == ("False", "NoFailingCheck")
    assert config.message == "no failing check (nccl_env, numa); 1 warning(s), reported as events"
    assert "True" not in (hardware.status, performance.status)
    assert fault_of(checks) is None
    assert plan_taint(node([]), fault_of(checks), True, NONE, NOW).writes is False
    [due] = EventMemory().due(checks, 1000.0)
    assert due == job
    body = event_body(due, "n1", NOW)
    assert body["type"] == "Warning" and body["message"] == "nccl_env node: NCCL_P2P_DISABLE=1"
    # The same setting from the node's own /etc/nccl.conf: a fault of the node's
    # configuration, its condition True, and still no taint ([remediation]: configuration
    # never takes a node out of service).
    from_the_node = [("nccl_env", [finding("nccl_env", "fail", origin=Origin.NODE)])]
    assert judge_classes(from_the_node)[2].status == "True"
    assert fault_of(from_the_node) is None


def test_message_cut_to_1024_characters_saying_how_many_were_left_out() -> None:
    parts = [f"gpu_xid gpu {index}: " + "x" * 100 for index in range(20)]
    text = listed(parts)
    assert len(text) <= 1024
    assert text.startswith(parts[0] + "; " + parts[1])
    kept = text.count("gpu_xid")
    assert text.endswith(f"(+{20 - kept} more)")
    one_long = listed(["y" * 5000])
    assert len(one_long) == 1024 and one_long.endswith("y…")
    cut_first = listed(["y" * 5000, "z"])
    assert len(cut_first) <= 1024 and cut_first.endswith("… (+1 more)")
    assert listed(["a", "b"]) == "a; b"


def test_camel_case() -> None:
    assert camel_case("gpu_memory_errors") == "GpuMemoryErrors"
    assert camel_case("h2d") == "H2d"
    assert camel_case("gpu-hardware") == "GpuHardware"


def test_last_transition_time_kept_only_while_the_status_stands() -> None:
    states = [
        ConditionState("NodecheckGpuHardware", "True", "GpuXidFailed", "m"),
        ConditionState("NodecheckGpuPerformance", "False", "NoFailingCheck", "m"),
        ConditionState("NodecheckNodeConfig", "Unknown", "CouldNotDetermine", "m"),
    ]
    on_node: dict[str, dict[str, Any]] = {
        "NodecheckGpuHardware": {"status": "True", "lastTransitionTime": EARLIER},
        "NodecheckGpuPerformance": {"status": "True", "lastTransitionTime": EARLIER},
    }
    patch = condition_patch(states, on_node, NOW)
    assert list(patch) == ["status"] and list(patch["status"]) == ["conditions"]
    sent = {c["type"]: c for c in patch["status"]["conditions"]}
    assert sent["NodecheckGpuHardware"]["lastTransitionTime"] == EARLIER  # unchanged
    assert sent["NodecheckGpuPerformance"]["lastTransitionTime"] == NOW  # True -> False
    assert sent["NodecheckNodeConfig"]["lastTransitionTime"] == NOW  # new
    assert all(c["lastHeartbeatTime"] == NOW for c in sent.values())


FAULT = Fault(FaultClass.GPU_HARDWARE, "aaaa")
NONE: frozenset[str] = frozenset()  # no check could not determine
ADMIN = {"key": "example.com/maintenance", "effect": "NoSchedule"}
OURS = {"key": TAINT_KEY, "value": "gpu-hardware", "effect": "NoSchedule"}


def node(taints: list[dict[str, Any]], fingerprint: str | None = None) -> dict[str, Any]:
    annotations = {"other": "x"}
    if fingerprint is not None:
        annotations[OWNERSHIP_ANNOTATION] = json.dumps({"fingerprint": fingerprint})
    return {
        "metadata": {"resourceVersion": "42", "annotations": annotations},
        "spec": {"taints": taints, "unschedulable": True},
    }


def test_taint_applied_beside_the_admins_with_the_resource_version() -> None:
    plan = plan_taint(node([ADMIN]), FAULT, True, NONE, NOW)
    assert plan.action == "applied" and plan.taints == [ADMIN, OURS]
    assert json.loads(plan.annotation or "")["fingerprint"] == "aaaa"
    patch = taint_patch(node([ADMIN]), plan)
    assert patch["metadata"]["resourceVersion"] == "42"
    assert patch["spec"] == {"taints": [ADMIN, OURS]}  # no unschedulable: never cordons
    assert set(patch["metadata"]["annotations"]) == {OWNERSHIP_ANNOTATION}


def test_taint_the_admin_removed_is_not_applied_again_until_the_fault_changes() -> None:
    removed = node([ADMIN], fingerprint="aaaa")
    assert plan_taint(removed, FAULT, True, NONE, NOW).writes is False
    changed = plan_taint(removed, Fault(FaultClass.GPU_HARDWARE, "bbbb"), True, NONE, NOW)
    assert changed.action == "applied" and changed.taints == [ADMIN, OURS]


def test_taint_removed_only_when_ours() -> None:
    mine = plan_taint(node([ADMIN, OURS], fingerprint="aaaa"), None, True, NONE, NOW)
    assert mine.action == "removed" and mine.taints == [ADMIN] and mine.annotation == ""
    assert taint_patch(node([]), mine)["metadata"]["annotations"] == {OWNERSHIP_ANNOTATION: None}
    # Our key without our annotation: someone else's, never removed or replaced.
    foreign = plan_taint(node([ADMIN, OURS]), None, True, NONE, NOW)
    assert foreign.writes is False and foreign.action == "left_alone"
    assert plan_taint(node([OURS]), FAULT, True, NONE, NOW).writes is False
    # Gone already: only the annotation is forgotten.
    gone = plan_taint(node([ADMIN], fingerprint="aaaa"), None, True, NONE, NOW)
    assert gone.taints is None and gone.annotation == ""


def test_taint_kept_while_a_check_cannot_determine_and_removed_when_turned_off() -> None:
    tainted = node([OURS], fingerprint="aaaa")
    assert plan_taint(tainted, None, True, frozenset({"gpu_xid"}), NOW).writes is False
    off = plan_taint(tainted, FAULT, False, NONE, NOW)
    assert off.action == "removed" and off.taints == []
    assert plan_taint(node([]), FAULT, False, NONE, NOW).writes is False


def test_taint_follows_a_changed_class() -> None:
    plan = plan_taint(
        node([OURS], fingerprint="aaaa"), Fault(FaultClass.NODE_CONFIG, "cccc"), True, NONE, NOW
    )
    assert plan.taints == [{**OURS, "value": "node-config"}]


def test_fault_fingerprint_by_failing_findings() -> None:
    one = [("pcie_link", [finding("pcie_link", "fail", "gpu a"), finding("pcie_link", "warn")])]
    same = [("pcie_link", [finding("pcie_link", "fail", "gpu a", "other words")])]
    two = [
        (
            "pcie_link",
            [finding("pcie_link", "fail", "gpu a"), finding("pcie_link", "fail", "gpu b")],
        )
    ]
    with_hw = [*one, ("gpu_xid", [finding("gpu_xid", "fail")])]
    assert fault_of([("pcie_link", [finding("pcie_link", "warn")])]) is None
    first = fault_of(one)
    assert first is not None and first.fault_class is FaultClass.GPU_PERFORMANCE
    assert first == fault_of(same)  # a summary's words are not the fault
    assert fault_of(two) != first
    hardware = fault_of(with_hw)
    assert hardware is not None and hardware.fault_class is FaultClass.GPU_HARDWARE


def test_events_once_per_finding_again_hourly_and_after_clearing() -> None:
    memory = EventMemory(reannounce_s=3600)
    warn = [("numa", [finding("numa", "warn", "node", "balancing"), finding("numa", "ok")])]
    due = memory.due(warn, 1000.0)
    assert [(f.check, f.status) for f in due] == [("numa", Status.WARN)]
    memory.sent(due[0], 1000.0)
    assert memory.due(warn, 1010.0) == []
    assert len(memory.due(warn, 1000.0 + 3600)) == 1
    assert memory.due([("numa", [finding("numa", "ok")])], 1020.0) == []
    assert len(memory.due(warn, 1030.0)) == 1  # cleared, then back: new


def test_event_body() -> None:
    body = event_body(finding("gpu_xid", "fail", "gpu 1", "XID 79"), "n1", NOW)
    # uid = the node's name: what `kubectl describe node` searches events by.
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "n1",
        "uid": "n1",
    }
    assert body["type"] == "Warning" and body["reason"] == "GpuXidFailed"
    assert body["metadata"]["namespace"] == "default" and body["message"] == "gpu_xid gpu 1: XID 79"
    warn = event_body(finding("numa", "warn"), "n1", NOW)
    assert warn["reason"] == "NumaWarning"


def test_a_message_shows_what_the_node_said_escaped() -> None:
    """`kubectl describe node` and `kubectl get events` print a condition's and an event's
    message as it is: a newline from the node reaches them as a space (a finding is one
    line, Finding.line), an escape sequence escaped."""
    said = "eth0\nFAIL forged \x1b]0;pwned\x07\u202e"
    shown = "nccl_env node: eth0 FAIL forged \\x1b]0;pwned\\x07\\u202e"
    # A setting from the node's /etc/nccl.conf: a node's failure, in the condition.
    said_by_node = finding("nccl_env", "fail", summary=said, origin=Origin.NODE)
    [_, _, config] = judge_classes([("nccl_env", [said_by_node])])
    assert config.status == "True" and config.message == shown
    assert event_body(said_by_node, "n1", NOW)["message"] == shown


CONFIG = Path("/etc/nodecheck/agent.toml")


def test_kubernetes_section_defaults_and_errors_name_file_line_key() -> None:
    assert parse_config("", CONFIG, set()).kubernetes == KubernetesSettings()
    assert KubernetesSettings().enabled is False and KubernetesSettings().taint is False
    # The hysteresis: a fault stands 30 s before the taint, clear 5 minutes before it goes.
    assert (KubernetesSettings().taint_after_s, KubernetesSettings().clear_after_s) == (30, 300)
    held = parse_config("[kubernetes]\ntaint_after = 0\nclear_after = 600\n", CONFIG, set())
    assert (held.kubernetes.taint_after_s, held.kubernetes.clear_after_s) == (0, 600)
    parsed = parse_config(
        '[kubernetes]\nenabled = true\ntaint = true\nnode_name = "gpu-7"\n'
        'api_server = "https://10.0.0.1:6443"\nresend_interval = 60\n',
        CONFIG,
        set(),
    ).kubernetes
    assert (parsed.enabled, parsed.taint, parsed.node_name, parsed.resend_interval_s) == (
        True,
        True,
        "gpu-7",
        60.0,
    )
    cases = [
        ("[kubernetes]\n\ntoken_reread = 120\n", "agent.toml:3: kubernetes.token_reread"),
        ("[kubernetes]\ntimeout = 0\n", "agent.toml:2: kubernetes.timeout"),
        ('[kubernetes]\napi_server = "http://x:80"\n', "agent.toml:2: kubernetes.api_server"),
        ('[kubernetes]\nnode_name = "Node_1"\n', "agent.toml:2: kubernetes.node_name"),
        ('[kubernetes]\ntoken_file = "token"\n', "agent.toml:2: kubernetes.token_file"),
        ("[kubernetes]\nenabled = 1\n", "agent.toml:2: kubernetes.enabled"),
        ("[kubernetes]\ncordon = true\n", "agent.toml:2: kubernetes.cordon: unknown key"),
        ("[kubernetes]\ntaint_after = -1\n", "agent.toml:2: kubernetes.taint_after: .*0 to 3600"),
        ("[kubernetes]\nclear_after = nan\n", "agent.toml:2: kubernetes.clear_after"),
        ('[kubernetes]\n\nclear_after = "5m"\n', "agent.toml:3: kubernetes.clear_after"),
    ]
    for text, expected in cases:
        with pytest.raises(ConfigError, match=expected):
            parse_config(text, CONFIG, set())
    shown = parse_config("[kubernetes]\nenabled = true\n", CONFIG, set()).show()
    assert (
        parse_config(shown, CONFIG, set()).kubernetes
        == parse_config("[kubernetes]\nenabled = true\n", CONFIG, set()).kubernetes
    )


def test_reporter_needs_a_node_name_and_an_api_server() -> None:
    settings = KubernetesSettings(enabled=True)
    with pytest.raises(ConfigError, match="NODE_NAME"):
        KubernetesReporter.from_settings(settings, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        KubernetesReporter.from_settings(settings, {"NODE_NAME": "n1"})
    reporter = KubernetesReporter.from_settings(
        settings,
        {"NODE_NAME": "n1", "KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
    )
    assert reporter.node == "n1" and reporter.client.host == "fd00::1"


@pytest.mark.parametrize(
    ("statuses", "condition", "exit_status"),
    [
        (["skip", "skip"], "Unknown", 2),  # only skipped: absence is never a pass
        (["ok", "skip"], "False", 0),
        (["warn"], "False", 0),
        (["ok", "error"], "Unknown", 2),
        (["error", "fail"], "True", 1),
    ],
)
def test_the_agent_and_npd_give_a_class_the_same_verdict(
    statuses: list[str], condition: str, exit_status: int
) -> None:
    findings = [finding("cpu", status, f"cpu {index}") for index, status in enumerate(statuses)]
    assert (
        class_verdict(f.status for f in findings).value
        == {
            "True": "failing",
            "Unknown": "undetermined",
            "False": "healthy",
        }[condition]
    )
    [_, _, config] = judge_classes([("cpu", findings)])
    assert config.status == condition
    assert judge(FaultClass.NODE_CONFIG, findings, "agent results").exit_status == exit_status


def test_an_admins_noexecute_with_our_key_is_never_ours() -> None:
    evict = {"key": TAINT_KEY, "value": "rma", "effect": "NoExecute"}
    # Without the annotation, with it, the fault standing or gone: never written.
    assert plan_taint(node([evict]), None, True, NONE, NOW).writes is False
    assert plan_taint(node([evict], fingerprint="aaaa"), FAULT, True, NONE, NOW).writes is False
    removed = plan_taint(node([evict, OURS], fingerprint="aaaa"), None, True, NONE, NOW)
    assert removed.action == "removed" and removed.taints == [evict]
    applied = plan_taint(node([evict]), FAULT, True, NONE, NOW)
    assert applied.taints == [evict, OURS]
    recorded = json.loads(applied.annotation or "")
    assert recorded["taint"] == "nodecheck.io/unhealthy:NoSchedule"


def test_only_an_error_of_the_tainted_faults_checks_keeps_the_taint() -> None:
    fault = fault_of([("pcie_link", [finding("pcie_link", "fail", "gpu a")])])
    assert fault is not None and fault.checks == ("pcie_link",)
    applied = plan_taint(node([]), fault, True, NONE, NOW)
    tainted = node([{**OURS, "value": "gpu-performance"}])
    tainted["metadata"]["annotations"][OWNERSHIP_ANNOTATION] = applied.annotation
    assert plan_taint(tainted, None, True, frozenset({"pcie_acs"}), NOW).action == "removed"
    assert plan_taint(tainted, None, True, frozenset({"pcie_link"}), NOW).writes is False
    # An annotation naming only the class (no checks): the class's checks keep it.
    by_class = node([OURS])
    by_class["metadata"]["annotations"][OWNERSHIP_ANNOTATION] = json.dumps(
        {"fingerprint": "aaaa", "class": "gpu-hardware"}
    )
    assert plan_taint(by_class, None, True, frozenset({"gpu_xid"}), NOW).writes is False
    assert plan_taint(by_class, None, True, frozenset({"pcie_acs"}), NOW).action == "removed"
    # The admin removed it: an error of the fault's check keeps the annotation too.
    untainted = node([])
    untainted["metadata"]["annotations"][OWNERSHIP_ANNOTATION] = applied.annotation
    assert plan_taint(untainted, None, True, frozenset({"pcie_link"}), NOW).writes is False
    assert plan_taint(untainted, None, True, frozenset({"pcie_acs"}), NOW).action == "forgotten"


def test_a_condition_turns_worse_at_once_and_better_only_after_its_hold() -> None:
    """A check that errors every other run: Unknown at once, then held (not False) while
    errors keep coming; False once none came for 300 s. A failure while held: True at
    once; another reason at the same status waits like a better one."""
    hold = ConditionHold(300)
    fine = ConditionState("C", "False", "NoFailingCheck", "fine")
    unsure = ConditionState("C", "Unknown", "CouldNotDetermine", "x unreadable")
    failing = ConditionState("C", "True", "XFailed", "x broken")
    several = ConditionState("C", "True", "SeveralChecksFailed", "x and y broken")

    def shown(state: ConditionState, now: float) -> tuple[str, str]:
        [out] = hold.observe([state], now)
        return out.status, out.reason

    assert shown(fine, 0) == ("False", "NoFailingCheck")
    assert shown(unsure, 5) == ("Unknown", "CouldNotDetermine")
    for now in range(10, 60, 10):
        assert shown(fine, now) == ("Unknown", "CouldNotDetermine")
        assert shown(unsure, now + 5) == ("Unknown", "CouldNotDetermine")
    assert hold.due_at() is None  # the last run errored: nothing pends
    assert shown(fine, 100) == ("Unknown", "CouldNotDetermine")
    assert hold.due_at() == 400
    assert "now False (NoFailingCheck) for 299 s" in hold.observe([fine], 399)[0].message
    assert shown(fine, 400) == ("False", "NoFailingCheck")
    assert shown(failing, 405) == ("True", "XFailed")
    assert shown(several, 410) == ("True", "XFailed")
    assert shown(several, 710) == ("True", "SeveralChecksFailed")


def test_the_taint_waits_for_a_standing_fault_and_a_clear_hold() -> None:
    """A fault stands from its first sighting: APPLY once it stood 30 s, also when runs
    between were clear; CLEAR once clear for 300 s; HOLD between (the taint as it is)."""
    hold = FaultHold(30, 300)
    fault = Fault(FaultClass.GPU_PERFORMANCE, "f1")
    assert hold.observe(fault, 0) is TaintStep.HOLD and hold.due_at() == 30
    assert hold.observe(None, 10) is TaintStep.HOLD and hold.due_at() == 310
    assert hold.observe(fault, 20) is TaintStep.HOLD
    assert hold.observe(fault, 30) is TaintStep.APPLY and hold.due_at() is None
    assert hold.observe(None, 40) is TaintStep.HOLD
    assert hold.observe(None, 339) is TaintStep.HOLD
    assert hold.observe(None, 340) is TaintStep.CLEAR and hold.due_at() is None
    assert hold.observe(fault, 400) is TaintStep.HOLD, "a new fault waits again"
    assert FaultHold(0, 0).observe(fault, 0) is TaintStep.APPLY
    assert FaultHold(0, 0).observe(None, 0) is TaintStep.CLEAR


def test_an_unprivileged_healthy_node_has_every_condition_false(
    build: Callable[..., Node],
) -> None:
    """The healthy DGX read as the unprivileged DaemonSet reads it (config space cut to 64
    bytes): what it can never see is a `skip` saying so, and every condition is False,
    never Unknown for ever on a healthy node."""
    node = build("dgx-h100", unprivileged=True)
    runs = node.run()
    checks = [(run.check.name, findings_of(run)) for run in runs]
    [acs] = [f for name, found in checks if name == "pcie_acs" for f in found]
    assert acs.status is Status.SKIP
    assert {state.type: state.status for state in judge_classes(checks)} == {
        "NodecheckGpuHardware": "False",
        "NodecheckGpuPerformance": "False",
        "NodecheckNodeConfig": "False",
    }
