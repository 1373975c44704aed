"""The reporter's calls, one report at a time (`report_once`, what its thread runs after
each run of the checks), over real HTTPS against the API double authorizing from
deploy/kubernetes/rbac.yaml: the taint's ownership and scope, what a failed read or a
refused Event changes, when the conditions are patched. The whole agent against the
double: tests/kubernetes/test_reporter.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodecheck.agent.config import KubernetesSettings
from nodecheck.agent.kube_api import KubeClient
from nodecheck.agent.kubernetes import CheckFindings, KubernetesReporter
from nodecheck.agent.slurm_health import Finding
from nodecheck.checks.result import Status
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
    """One run's results: (check, status, subject, summary) per finding, grouped by check."""
    by_check: dict[str, list[Finding]] = {}
    for check, status, subject, summary in findings:
        by_check.setdefault(check, []).append(Finding(check, Status(status), subject, summary))
    return list(by_check.items())


# pcie_acs cannot read the ACS bits unprivileged, behind a PCIe switch: always `error`.
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


def reporter(api: KubeApiDouble, tmp_path: Path, resend_s: float = 300) -> KubernetesReporter:
    """A reporter as the agent makes one (tainting on); resend_s 0: every report is a
    heartbeat, so each one reads the node and plans the taint again."""
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
        timeout_s=10,
    )
    client = KubeClient(api.url, token, api.cert, 10, 60)
    return KubernetesReporter(settings, NODE, client)


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
