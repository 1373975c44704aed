"""The reporter's calls, one report at a time (`report_once`, what its thread runs after
each run of the checks), over real HTTPS against the API double authorizing from
deploy/kubernetes/rbac.yaml: the taint's ownership and scope, what a failed read or a
refused Event changes, when the conditions are patched. The whole agent against the
double: tests/kubernetes/test_reporter.py."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodecheck.agent.config import DEFAULT_POLICY, KubernetesSettings, RemediationSettings
from nodecheck.agent.findings import Finding, findings_of_named
from nodecheck.agent.kubernetes import reporter as reporter_module
from nodecheck.agent.kubernetes.api import KubeClient
from nodecheck.agent.kubernetes.reporter import CheckFindings, KubernetesReporter
from nodecheck.checks.result import Result, Status
from tests.fixtures.kube_api import KubeApiDouble

ROOT = Path(__file__).resolve().parent.parent.parent
RBAC = ROOT / "deploy" / "kubernetes" / "rbac.yaml"
NODE = "gpu-node-1"
TAINT_KEY = "nodecheck.io/unhealthy"
OWNERSHIP = "nodecheck.io/taint"
PERFORMANCE = "NodecheckGpuPerformance"
GPU_A = "gpu 0000:18:00.0"
EARLIER = "2026-01-01T00:00:00Z"


def run(*findings: tuple[str, str, str, str]) -> list[CheckFindings]:
    """One run's results: (check, status, subject, summary) per finding, grouped by check,
    each with its meaning as the registered check declares it."""
    by_check: dict[str, list[Finding]] = {}
    for check, status, subject, summary in findings:
        by_check.setdefault(check, []).extend(
            findings_of_named(check, [Result(Status(status), subject, summary)])
        )
    return list(by_check.items())


# A check of another class that cannot determine for ever (a switch port whose config
# space the kernel cannot read): `error` on every run.
ACS_ERROR = ("pcie_acs", "error", "bridge 0000:17:00.0", "config space unreadable")
HEALTHY = (
    ("gpu_count", "ok", "node", "8 GPUs"),
    ("pcie_link", "ok", GPU_A, "x16 of x16"),
    ("numa", "ok", "node", "balancing off"),
    ACS_ERROR,
)
LINK_FAILS = (*HEALTHY[:1], ("pcie_link", "fail", GPU_A, "x8 of x16"), *HEALTHY[2:])
LINK_ERRORS = (*HEALTHY[:1], ("pcie_link", "error", GPU_A, "unreadable"), *HEALTHY[2:])


def serve(rbac: Path, workdir: Path) -> KubeApiDouble:
    api = KubeApiDouble(rbac, workdir)
    api.start()
    api.add_node(NODE)
    return api


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApiDouble]:
    double = serve(RBAC, tmp_path)
    try:
        yield double
    finally:
        double.stop()


def reporter(
    api: KubeApiDouble,
    tmp_path: Path,
    resend_s: float = 300,
    holds_s: tuple[float, float] = (0, 0),
    clock: Callable[[], float] = time.monotonic,
    policy: RemediationSettings = DEFAULT_POLICY,
) -> KubernetesReporter:
    """A reporter as the agent makes one (tainting on); resend_s 0: every report is a
    heartbeat, so each one reads the node and plans the taint again. `holds_s`: its
    taint_after and clear_after, none by default (each report acts on what it sees)."""
    token = tmp_path / "token"
    token.write_text(sorted(api.tokens)[0] + "\n")
    settings = KubernetesSettings(
        enabled=True,
        taint=True,
        node_name=NODE,
        api_server=api.url,
        token_file=token,
        ca_file=api.cert,
        resend_interval_s=resend_s,
        taint_after_s=holds_s[0],
        clear_after_s=holds_s[1],
        timeout_s=10,
    )
    client = KubeClient(api.url, token, api.cert, 10, 60)
    return KubernetesReporter(settings, NODE, client, clock, policy)


def ours(api: KubeApiDouble) -> list[dict[str, Any]]:
    return [t for t in api.taints(NODE) if t["key"] == TAINT_KEY]


def annotation(api: KubeApiDouble) -> str | None:
    value = api.node(NODE)["metadata"]["annotations"].get(OWNERSHIP)
    return str(value) if value is not None else None


def untaint(node: dict[str, Any]) -> None:
    """kubectl taint nodes NODE nodecheck.io/unhealthy:NoSchedule-"""
    node["spec"]["taints"] = [
        t for t in node["spec"]["taints"] if (t["key"], t["effect"]) != (TAINT_KEY, "NoSchedule")
    ]


def test_a_check_of_another_class_erroring_for_ever_does_not_keep_the_taint(
    api: KubeApiDouble, tmp_path: Path
) -> None:
    agent = reporter(api, tmp_path)
    assert agent.report_once(run(*LINK_FAILS))
    assert ours(api) == [{"key": TAINT_KEY, "value": "gpu-performance", "effect": "NoSchedule"}]
    recorded = annotation(api)
    # The tainted fault's own check cannot determine: kept, it may still stand.
    assert agent.report_once(run(*LINK_ERRORS))
    assert ours(api) and annotation(api) == recorded
    # The link is back; pcie_acs (node-config) still errors, as it always will: removed.
    assert agent.report_once(run(*HEALTHY))
    assert ours(api) == [] and annotation(api) is None
    assert api.violations == []


def test_the_taint_follows_the_remediation_policy_and_its_dry_run(
    api: KubeApiDouble, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ACS on (the node's configuration) never taints; a PCIe link at x8 (performance)
    taints unless [remediation] performance is off; a dry run writes nothing and logs
    what it would have written."""
    acs_on = (*HEALTHY[:3], ("pcie_acs", "fail", "bridge 0000:16:00.0", "ACS on"))
    assert reporter(api, tmp_path).report_once(run(*acs_on))
    assert ours(api) == []
    quiet = reporter(api, tmp_path, policy=RemediationSettings(performance=False))
    assert quiet.report_once(run(*LINK_FAILS))
    assert ours(api) == []
    caplog.set_level(logging.INFO, logger="nodecheck.agent.kubernetes.reporter")
    dry = reporter(api, tmp_path, policy=RemediationSettings(dry_run=True))
    assert dry.report_once(run(*LINK_FAILS))
    assert ours(api) == [] and annotation(api) is None
    said = [r.getMessage() for r in caplog.records if "event=kubernetes_taint" in r.getMessage()]
    assert said and "dry_run=true" in said[-1] and "fault=gpu-performance" in said[-1]
    assert reporter(api, tmp_path).report_once(run(*LINK_FAILS))
    assert ours(api) == [{"key": TAINT_KEY, "value": "gpu-performance", "effect": "NoSchedule"}]
    assert api.violations == []


def tainted_by_nodecheck(seconds_ago: float) -> Callable[[dict[str, Any]], None]:
    """An admin's change that leaves a node as nodecheck's taint of `seconds_ago` does."""

    def change(node: dict[str, Any]) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))
        node["metadata"]["annotations"][OWNERSHIP] = json.dumps(
            {"fingerprint": "f", "class": "gpu-hardware", "applied_at": stamp}
        )
        node["spec"]["taints"] = [
            {"key": TAINT_KEY, "value": "gpu-hardware", "effect": "NoSchedule"}
        ]

    return change


def test_the_taint_waits_behind_the_circuit_breaker(
    api: KubeApiDouble,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twenty nodes, two tainted by nodecheck ten minutes ago and one two hours ago: the
    default cap (a tenth: 2) is reached within the hour, so this node's taint is held back,
    said in the log and by `withheld`, and decided again at the next report; a cap the
    count is under lets it through. The nodes are read in pages; more than the pages
    allowed, or a list the API server refuses, holds the taint back as well."""
    for index in range(2, 21):
        api.add_node(f"gpu-node-{index}")
    api.admin_change("gpu-node-2", tainted_by_nodecheck(600))
    api.admin_change("gpu-node-3", tainted_by_nodecheck(600))
    api.admin_change("gpu-node-4", tainted_by_nodecheck(7200))
    caplog.set_level(logging.INFO, logger="nodecheck.agent.kubernetes.reporter")
    monkeypatch.setattr(reporter_module, "BREAKER_PAGE", 3)  # seven pages
    held = reporter(api, tmp_path, resend_s=0)
    assert held.report_once(run(*LINK_FAILS))
    assert ours(api) == [] and annotation(api) is None and held.withheld
    said = [r.getMessage() for r in caplog.records if "action=withheld" in r.getMessage()]
    assert said and "breaker=open" in said[-1]
    assert "2 of 20 nodes tainted by nodecheck in the last 3600 s, the cap 2" in said[-1]
    assert held.report_once(run(*LINK_FAILS)) and ours(api) == []  # asked again: still held
    monkeypatch.setattr(reporter_module, "BREAKER_PAGES", 6)  # the seventh page unread
    caplog.clear()
    wider = RemediationSettings(breaker_fraction=0.5)
    assert reporter(api, tmp_path, policy=wider).report_once(run(*LINK_FAILS))
    assert ours(api) == [] and "more than 18 nodes" in caplog.text
    monkeypatch.setattr(reporter_module, "BREAKER_PAGES", 7)
    through = reporter(api, tmp_path, policy=wider)
    assert through.report_once(run(*LINK_FAILS))
    assert ours(api) == [{"key": TAINT_KEY, "value": "gpu-performance", "effect": "NoSchedule"}]
    assert not through.withheld
    pages = api.count("GET", "/api/v1/nodes")
    assert pages == 7 + 7 + 6 + 7, pages
    assert api.violations == []


def test_a_refused_list_holds_the_taint_back(tmp_path: Path) -> None:
    """An RBAC without `list` on nodes (an older install's): the breaker cannot count,
    so the taint waits, and the refusal is logged; the conditions go on."""
    rbac = tmp_path / "rbac.yaml"
    rbac.write_text(RBAC.read_text().replace('["get", "list", "patch"]', '["get", "patch"]'))
    api = serve(rbac, tmp_path)
    try:
        agent = reporter(api, tmp_path)
        assert agent.report_once(run(*LINK_FAILS))
        assert ours(api) == [] and agent.withheld
        assert api.conditions(NODE)[PERFORMANCE]["status"] == "True"
        assert api.count("GET", "/api/v1/nodes", 403) == 1
    finally:
        api.stop()


def test_an_error_run_does_not_forget_that_an_admin_removed_the_taint(
    api: KubeApiDouble, tmp_path: Path
) -> None:
    agent = reporter(api, tmp_path)
    assert agent.report_once(run(*LINK_FAILS))
    api.admin_change(NODE, untaint)
    assert agent.report_once(run(*LINK_ERRORS))  # one run the link could not be read
    assert annotation(api) is not None, "the fault may stand: the admin's removal is kept"
    assert agent.report_once(run(*LINK_FAILS))
    assert ours(api) == [], "the same fault: not applied again"
    # The fault clears for sure: now the annotation goes.
    assert agent.report_once(run(*HEALTHY))
    assert annotation(api) is None
    assert api.violations == []


def test_an_admins_edit_of_our_taint_and_a_noexecute_with_our_key_are_left_alone(
    api: KubeApiDouble, tmp_path: Path
) -> None:
    agent = reporter(api, tmp_path, resend_s=0)
    assert agent.report_once(run(*LINK_FAILS))
    edited = {"key": TAINT_KEY, "value": "investigating", "effect": "NoSchedule"}
    evict = {"key": TAINT_KEY, "value": "rma", "effect": "NoExecute"}

    def admin_edits(node: dict[str, Any]) -> None:
        untaint(node)
        node["spec"]["taints"] += [{**edited}, {**evict}]

    api.admin_taints += [edited, evict]
    api.admin_change(NODE, admin_edits)
    for _ in range(2):  # heartbeats: each reads the node and plans the taint again
        assert agent.report_once(run(*LINK_FAILS))
    assert ours(api) == [edited, evict]
    # The fault clears: ours (key and NoSchedule) goes, the admin's NoExecute stays.
    api.admin_taints.remove(edited)
    assert agent.report_once(run(*HEALTHY))
    assert ours(api) == [evict] and annotation(api) is None
    assert agent.report_once(run(*LINK_FAILS))  # a new fault: ours beside the admin's
    assert ours(api) == [evict, {**edited, "value": "gpu-performance"}]
    assert api.violations == []


def test_events_carry_the_node_name_as_uid_for_kubectl_describe(
    api: KubeApiDouble, tmp_path: Path
) -> None:
    agent = reporter(api, tmp_path)
    assert agent.report_once(run(*LINK_FAILS))
    [event] = [e for e in api.events if e["reason"] == "PcieLinkFailed"]
    assert event["involvedObject"]["uid"] == NODE != api.node(NODE)["metadata"]["uid"]
    assert api.violations == []


def test_a_failed_first_read_after_a_start_patches_no_transition(
    api: KubeApiDouble, tmp_path: Path
) -> None:
    # What an agent before the restart left: the conditions, True for the link, since EARLIER.
    before = {
        "NodecheckGpuHardware": ("False", "NoFailingCheck"),
        PERFORMANCE: ("True", "PcieLinkFailed"),
        "NodecheckNodeConfig": ("Unknown", "CouldNotDetermine"),
    }

    def left_by_the_last_agent(node: dict[str, Any]) -> None:
        for kind, (status, reason) in before.items():
            node["status"]["conditions"].append(
                {
                    "type": kind,
                    "status": status,
                    "reason": reason,
                    "message": "m",
                    "lastHeartbeatTime": EARLIER,
                    "lastTransitionTime": EARLIER,
                }
            )

    api.admin_change(NODE, left_by_the_last_agent)
    api.fail_gets = 1
    agent = reporter(api, tmp_path)
    assert agent.report_once(run(*LINK_FAILS)) is False, "incomplete: retried"
    assert api.status_patches == [], "no patch before the node was read"
    assert agent.report_once(run(*LINK_FAILS))
    conditions = api.conditions(NODE)
    assert {kind: conditions[kind]["lastTransitionTime"] for kind in before} == dict.fromkeys(
        before, EARLIER
    )
    assert conditions[PERFORMANCE]["lastHeartbeatTime"] > EARLIER
    assert api.violations == []


def test_a_refused_event_delays_nothing_else(tmp_path: Path) -> None:
    # The shipped RBAC without `create` on events: every Event is refused (403).
    documents = list(yaml.safe_load_all(RBAC.read_text()))
    for document in documents:
        for rule in (document or {}).get("rules") or []:
            if "events" in rule.get("resources", []):
                rule["verbs"] = [verb for verb in rule["verbs"] if verb != "create"]
    rbac = tmp_path / "rbac.yaml"
    rbac.write_text(yaml.safe_dump_all(documents))
    api = serve(rbac, tmp_path)
    try:
        agent = reporter(api, tmp_path)
        assert agent.report_once(run(*LINK_FAILS)), "complete: no retry of the conditions"
        assert api.count("POST", "/events", 403) == 1
        gets = api.count("GET", f"/nodes/{NODE}")
        assert agent.report_once(run(*LINK_FAILS))
        assert api.count("GET", f"/nodes/{NODE}") == gets, "nothing due: the node not re-read"
        assert api.count("POST", "/events", 403) == 1, "the Event waits for its own retry"
        assert api.violations == []
    finally:
        api.stop()


def test_a_changed_message_alone_waits_for_the_heartbeat(
    api: KubeApiDouble, tmp_path: Path
) -> None:
    agent = reporter(api, tmp_path)
    first = (*HEALTHY[:1], ("pcie_link", "fail", GPU_A, "x8 of x16, 3 runs"), *HEALTHY[2:])
    again = (*HEALTHY[:1], ("pcie_link", "fail", GPU_A, "x8 of x16, 4 runs"), *HEALTHY[2:])
    assert agent.report_once(run(*first))
    assert len(api.status_patches) == 1
    assert agent.report_once(run(*again))
    assert len(api.status_patches) == 1, "the same status and reason: not patched"
    # Another failing check of the class: the reason changes, patched with today's message.
    worse = (*again, ("gpu_throttle", "fail", "gpu 0000:1a:00.0", "HW slowdown"))
    assert agent.report_once(run(*worse))
    assert len(api.status_patches) == 2
    performance = api.conditions(NODE)[PERFORMANCE]
    assert performance["reason"] == "SeveralChecksFailed" and "4 runs" in performance["message"]
    assert api.violations == []


class Clock:
    """The reporter's monotonic clock, moved by the test: simulated runs, no waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


TAINTED = [{"key": TAINT_KEY, "value": "gpu-performance", "effect": "NoSchedule"}]
DEFAULT_HOLDS = (
    KubernetesSettings().taint_after_s,  # 30 s
    KubernetesSettings().clear_after_s,  # 300 s
)


def test_a_fault_flapping_every_run_is_one_taint_and_one_condition_change(
    api: KubeApiDouble, tmp_path: Path
) -> None:
    """60 runs 5 s apart, the link failing every other one, with the default holds: the
    taint applied once (once the fault stood 30 s) and never removed, GpuPerformance True
    from the first run and never False: one taint write and one status patch in all.
    (Before: a taint write and a status patch each way every run, 60 of each.)"""
    clock = Clock()
    agent = reporter(api, tmp_path, holds_s=DEFAULT_HOLDS, clock=clock)
    for number in range(60):
        assert agent.report_once(run(*(LINK_FAILS if number % 2 == 0 else HEALTHY)))
        clock.now += 5
    assert api.count("PATCH", f"/nodes/{NODE}", 200) == 1
    assert ours(api) == TAINTED
    assert len(api.status_patches) == 1
    assert api.conditions(NODE)[PERFORMANCE]["status"] == "True"
    assert api.violations == []


def test_a_steady_fault_taints_after_its_hold_and_clears_after_the_longer_one(
    api: KubeApiDouble, tmp_path: Path
) -> None:
    """The default holds, a run every 5 s: GpuPerformance True at the first failing run,
    the taint once the fault stood 30 s; healed, both stay until no run failed for 300 s
    (the heartbeat between says so in the message), then the condition is False and the
    taint and its annotation are gone."""
    clock = Clock()
    agent = reporter(api, tmp_path, holds_s=DEFAULT_HOLDS, clock=clock)
    started = clock.now
    while clock.now - started < 30:
        assert agent.report_once(run(*LINK_FAILS))
        assert ours(api) == [], f"tainted after {clock.now - started:g} s"
        assert api.conditions(NODE)[PERFORMANCE]["status"] == "True"
        clock.now += 5
    assert agent.report_once(run(*LINK_FAILS))
    assert ours(api) == TAINTED
    clock.now += 5
    healed = clock.now
    while clock.now - healed < 300:
        assert agent.report_once(run(*HEALTHY))
        assert ours(api) == TAINTED, f"untainted {clock.now - healed:g} s after healing"
        assert api.conditions(NODE)[PERFORMANCE]["status"] == "True"
        clock.now += 5
    held = api.conditions(NODE)[PERFORMANCE]["message"]  # the heartbeat at 300 s
    assert held.startswith("now False (NoFailingCheck) for ") and "x8 of x16" in held
    assert agent.report_once(run(*HEALTHY))
    assert ours(api) == [] and annotation(api) is None
    assert api.conditions(NODE)[PERFORMANCE]["status"] == "False"
    assert api.violations == []
