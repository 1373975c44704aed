"""`nodecheck agent` with [kubernetes] on, as a real process on a replica of the 8-GPU node
and the fake NVML, against the API double (tests/fixtures/kube_api.py) that authorizes
from deploy/kubernetes/rbac.yaml: conditions, events and the taint as a cluster sees them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.agent.test_daemon import free_port, get, wait_for
from tests.conftest import Node
from tests.fixtures.agent_process import start_agent
from tests.fixtures.kube_api import KubeApiDouble

ROOT = Path(__file__).resolve().parent.parent.parent
RBAC = ROOT / "deploy" / "kubernetes" / "rbac.yaml"
NODE = "gpu-node-1"
TAINT_KEY = "nodecheck.io/unhealthy"
OWNERSHIP = "nodecheck.io/taint"
HARDWARE, PERFORMANCE, CONFIG = (
    "NodecheckGpuHardware",
    "NodecheckGpuPerformance",
    "NodecheckNodeConfig",
)
ADMIN_TAINT = {"key": "example.com/maintenance", "value": "disk", "effect": "NoSchedule"}
# What a cordon is on a real cluster: spec.unschedulable, and the taint the node lifecycle
# controller adds for it (kubernetes pkg/controller/nodelifecycle, UnschedulableTaint).
CORDON_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
GPU_A, GPU_B = "0000:18:00.0", "0000:1a:00.0"
# The agent's first pass on the 8-GPU replica takes seconds; a loaded 2-core machine many more.
DEADLINE_S = 120

CONFIG_TEXT = """\
[agent]
listen = "127.0.0.1:{port}"
state_dir = "{work}/state"
results_file = "{work}/results.json"
expected_gpus = 8
nvml_timeout = 2

[checks.pcie_link]
interval = 1        # the test's fault is a link width written into the replica

[checks.gpu_xid]
interval = 3600

[kubernetes]
enabled = true
taint = {taint}
node_name = "{node}"
api_server = "{url}"
token_file = "{work}/token"
ca_file = "{ca}"
resend_interval = {resend}
taint_after = 1     # short holds: the test waits for each step, not for 30 s and 5 min
clear_after = 2
timeout = 2
token_reread = 1
"""


@dataclass
class KubeAgent:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def double(tmp_path: Path) -> Iterator[KubeApiDouble]:
    api = KubeApiDouble(RBAC, tmp_path)
    api.start()
    api.add_node(NODE)
    try:
        yield api
    finally:
        api.stop()


@contextlib.contextmanager
def kube_agent(
    node: Node, work: Path, api: KubeApiDouble, *, taint: bool, resend_s: float = 2
) -> Iterator[KubeAgent]:
    work.mkdir(parents=True, exist_ok=True)
    token = work / "token"
    if not token.exists():
        token.write_text(sorted(api.tokens)[0] + "\n")
    (work / "state").mkdir(exist_ok=True)  # a state directory it is given must exist
    port = free_port()
    config = work / "config.toml"
    config.write_text(
        CONFIG_TEXT.format(
            port=port,
            work=work,
            taint=str(taint).lower(),
            node=NODE,
            url=api.url,
            ca=api.cert,
            resend=resend_s,
        )
    )
    log = work / f"agent-{time.monotonic_ns()}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    process = start_agent(node.cli_args, config, {**env, **node.env}, log)
    agent = KubeAgent(process, port, log)
    try:

        def serving() -> bool:
            if process.poll() is not None:
                pytest.fail(f"the agent died: {agent.log_text()}")
            try:
                return get(f"http://127.0.0.1:{port}/healthz")[0] == 200
            except OSError:
                return False

        wait_for(serving, DEADLINE_S, "the agent to serve")
        yield agent
        assert "Traceback" not in agent.log_text()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait()


def set_link_width(node: Node, bus_id: str, width: int) -> None:
    (node.root / "sys" / "bus" / "pci" / "devices" / bus_id / "current_link_width").write_text(
        f"{width}\n"
    )


def condition(api: KubeApiDouble, kind: str) -> dict[str, Any]:
    return api.conditions(NODE).get(kind, {})


def status_of(api: KubeApiDouble) -> dict[str, str]:
    conditions = api.conditions(NODE)
    return {
        kind: conditions.get(kind, {}).get("status", "") for kind in (HARDWARE, PERFORMANCE, CONFIG)
    }


def ours(api: KubeApiDouble) -> list[dict[str, Any]]:
    return [t for t in api.taints(NODE) if t["key"] == TAINT_KEY]


def status_patches(api: KubeApiDouble) -> int:
    return api.count("PATCH", "/status", 200)


def others_untouched(api: KubeApiDouble, before: dict[str, Any]) -> None:
    """The kubelet's and the other detector's conditions, the admin's taint and cordon."""
    node = api.node(NODE)
    conditions = {c["type"]: c for c in node["status"]["conditions"]}
    for kind in ("Ready", "MemoryPressure", "KernelDeadlock"):
        assert conditions[kind] == before[kind]
    assert node["spec"]["unschedulable"] is True
    assert ADMIN_TAINT in node["spec"]["taints"] and CORDON_TAINT in node["spec"]["taints"]


def cordon_and_taint(node: dict[str, Any]) -> None:
    node["spec"]["unschedulable"] = True
    node["spec"]["taints"] = [{**CORDON_TAINT}, {**ADMIN_TAINT}]


@pytest.fixture
def dgx_copy(dgx: Node, copy_node: Callable[[Node], Node]) -> Node:
    return copy_node(dgx)


def test_conditions_events_and_taint_follow_the_fault(
    dgx_copy: Node, double: KubeApiDouble, tmp_path: Path
) -> None:
    double.admin_change(NODE, cordon_and_taint)
    theirs = {c["type"]: c for c in double.node(NODE)["status"]["conditions"]}
    with kube_agent(dgx_copy, tmp_path / "agent", double, taint=True) as agent:
        # A healthy node: the three conditions False, no taint of ours.
        wait_for(
            lambda: status_of(double) == {HARDWARE: "False", PERFORMANCE: "False", CONFIG: "False"},
            DEADLINE_S,
            "three False conditions",
        )
        assert condition(double, PERFORMANCE)["reason"] == "NoFailingCheck"
        assert "pcie_link" in condition(double, PERFORMANCE)["message"]
        assert not ours(double)
        others_untouched(double, theirs)

        # Heartbeats: resent unchanged, lastTransitionTime kept.
        first = condition(double, HARDWARE)
        count = status_patches(double)
        wait_for(lambda: status_patches(double) >= count + 2, DEADLINE_S, "two heartbeats")
        later = condition(double, HARDWARE)
        assert later["lastTransitionTime"] == first["lastTransitionTime"]
        assert later["lastHeartbeatTime"] > first["lastHeartbeatTime"]

        # A link trained at x8: GpuPerformance True, our taint, one event. Another writer
        # adds a taint between the agent's read and its write: a 409, a retry, both kept.
        late_taint = {"key": "example.com/late", "value": "x", "effect": "PreferNoSchedule"}
        double.before_node_patch = lambda node: node["spec"]["taints"].append({**late_taint})
        set_link_width(dgx_copy, GPU_A, 8)
        wait_for(
            lambda: condition(double, PERFORMANCE).get("status") == "True",
            DEADLINE_S,
            "GpuPerformance True",
        )
        performance = condition(double, PERFORMANCE)
        assert performance["reason"] == "PcieLinkFailed"
        assert GPU_A in performance["message"] and "x8 of x16" in performance["message"]
        assert len(performance["message"]) <= 1024
        assert status_of(double)[HARDWARE] == "False"
        wait_for(lambda: ours(double), DEADLINE_S, "our taint")
        assert ours(double) == [
            {"key": TAINT_KEY, "value": "gpu-performance", "effect": "NoSchedule"}
        ]
        assert double.count("PATCH", f"/nodes/{NODE}", 409) >= 1
        taints = double.taints(NODE)
        assert ADMIN_TAINT in taints and late_taint in taints
        annotation = double.node(NODE)["metadata"]["annotations"][OWNERSHIP]
        assert '"fingerprint"' in annotation and "gpu-performance" in annotation
        others_untouched(double, theirs)

        def link_events() -> list[dict[str, Any]]:
            return [e for e in double.events if e["reason"] == "PcieLinkFailed"]

        wait_for(link_events, DEADLINE_S, "an event for the link")
        count = status_patches(double)
        wait_for(lambda: status_patches(double) >= count + 2, DEADLINE_S, "two heartbeats")
        assert len(link_events()) == 1, "a standing finding is announced once"
        event = link_events()[0]
        assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node"
        assert (
            event["involvedObject"]["name"] == NODE and event["metadata"]["namespace"] == "default"
        )
        assert GPU_A in event["message"]

        # An admin removes our taint: not applied again while the fault stays the same.
        double.admin_change(
            NODE,
            lambda node: node["spec"].update(
                taints=[t for t in node["spec"]["taints"] if t["key"] != TAINT_KEY]
            ),
        )
        gets = double.count("GET", f"/nodes/{NODE}", 200)
        count = status_patches(double)
        wait_for(
            lambda: (
                status_patches(double) >= count + 3
                and double.count("GET", f"/nodes/{NODE}", 200) >= gets + 3
            ),
            DEADLINE_S,
            "three reports",
        )
        assert not ours(double)
        assert "removed by someone else" in agent.log_text()

        # The fault changes (a second GPU): the taint is applied again.
        set_link_width(dgx_copy, GPU_B, 8)
        wait_for(
            lambda: GPU_B in condition(double, PERFORMANCE).get("message", ""),
            DEADLINE_S,
            "the second GPU",
        )
        wait_for(lambda: ours(double), DEADLINE_S, "our taint again")

        # Healed: False again, our taint and annotation gone, the admin's left alone.
        set_link_width(dgx_copy, GPU_A, 16)
        set_link_width(dgx_copy, GPU_B, 16)
        wait_for(
            lambda: condition(double, PERFORMANCE).get("status") == "False",
            DEADLINE_S,
            "GpuPerformance False",
        )
        wait_for(lambda: not ours(double), DEADLINE_S, "our taint removed")
        wait_for(
            lambda: OWNERSHIP not in double.node(NODE)["metadata"]["annotations"],
            DEADLINE_S,
            "the annotation removed",
        )
        others_untouched(double, theirs)
        # True -> False: a transition (heartbeats of seconds lie between the two).
        assert (
            condition(double, PERFORMANCE)["lastTransitionTime"] > performance["lastTransitionTime"]
        )
    assert double.violations == []


def test_a_condition_set_before_a_restart_clears_after_it(
    dgx_copy: Node, double: KubeApiDouble, tmp_path: Path
) -> None:
    set_link_width(dgx_copy, GPU_A, 8)
    with kube_agent(dgx_copy, tmp_path / "agent", double, taint=True, resend_s=300):
        wait_for(
            lambda: condition(double, PERFORMANCE).get("status") == "True",
            DEADLINE_S,
            "GpuPerformance True",
        )
        wait_for(lambda: ours(double), DEADLINE_S, "our taint")
    # The fault clears while no agent runs; the next agent's first report clears it,
    # though nothing changed in what that agent saw (a long resend_interval: no heartbeat).
    set_link_width(dgx_copy, GPU_A, 16)
    patches = len(double.status_patches)
    with kube_agent(dgx_copy, tmp_path / "agent", double, taint=True, resend_s=300):
        wait_for(
            lambda: condition(double, PERFORMANCE).get("status") == "False",
            DEADLINE_S,
            "GpuPerformance False",
        )
        first = double.status_patches[patches]["status"]["conditions"]
        assert {c["type"] for c in first} == {HARDWARE, PERFORMANCE, CONFIG}
        wait_for(lambda: not ours(double), DEADLINE_S, "our taint removed after the restart")
    assert double.violations == []


def test_a_forbidden_call_is_logged_and_the_agent_goes_on(dgx_copy: Node, tmp_path: Path) -> None:
    # The shipped RBAC without `patch` on nodes: the taint cannot be written.
    documents = list(yaml.safe_load_all(RBAC.read_text()))
    for document in documents:
        for rule in (document or {}).get("rules") or []:
            if rule.get("resources") == ["nodes"] or "nodes" in rule.get("resources", []):
                rule["verbs"] = [verb for verb in rule["verbs"] if verb != "patch"]
    rbac = tmp_path / "rbac.yaml"
    rbac.write_text(yaml.safe_dump_all(documents))
    api = KubeApiDouble(rbac, tmp_path)
    api.start()
    api.add_node(NODE)
    try:
        set_link_width(dgx_copy, GPU_A, 8)
        with kube_agent(dgx_copy, tmp_path / "agent", api, taint=True) as agent:
            wait_for(
                lambda: condition(api, PERFORMANCE).get("status") == "True",
                DEADLINE_S,
                "GpuPerformance True",
            )
            wait_for(
                lambda: "call=patch_node " in agent.log_text(), DEADLINE_S, "the refusal logged"
            )
            line = next(
                line for line in agent.log_text().splitlines() if "call=patch_node " in line
            )
            assert "event=kubernetes_call_failed" in line and "403 Forbidden" in line
            assert "cannot patch resource" in line
            assert agent.log_text().count("call=patch_node ") == 1, "logged once while it lasts"
            assert get(f"http://127.0.0.1:{agent.port}/healthz")[0] == 200
            assert not ours(api)
            assert api.count("PATCH", f"/nodes/{NODE}", 403) >= 1
            # [kubernetes] is not changed by a reload (the reporter holds its client): said.
            config = tmp_path / "agent" / "config.toml"
            config.write_text(config.read_text().replace("taint = true", "taint = false"))
            agent.process.send_signal(signal.SIGHUP)
            wait_for(
                lambda: "event=reload_failed" in agent.log_text(), DEADLINE_S, "the reload refused"
            )
            assert "kubernetes: changes take a restart" in agent.log_text()
        assert api.violations == []
    finally:
        api.stop()


def test_a_hung_api_server_delays_no_check_and_a_rotated_token_is_used(
    dgx_copy: Node, double: KubeApiDouble, tmp_path: Path
) -> None:
    with kube_agent(dgx_copy, tmp_path / "agent", double, taint=False) as agent:
        url = f"http://127.0.0.1:{agent.port}"
        wait_for(lambda: status_of(double)[PERFORMANCE] == "False", DEADLINE_S, "the conditions")

        def pcie_link_finished() -> float:
            """When pcie_link last finished, from the agent's results file."""
            document = json.loads((tmp_path / "agent" / "results.json").read_text())
            return float(
                next(c["finished_at"] for c in document["checks"] if c["check"] == "pcie_link")
            )

        with double.hung():
            # A fault while the API server does not answer: the checks still run every
            # second and the scrape answers; the calls time out (2 s) and are logged.
            set_link_width(dgx_copy, GPU_A, 8)
            start = pcie_link_finished()
            wait_for(lambda: pcie_link_finished() >= start + 5, DEADLINE_S, "five more runs")
            started = time.monotonic()
            assert get(f"{url}/metrics")[0] == 200
            assert time.monotonic() - started < 5
            wait_for(
                lambda: "timed out after 2 s" in agent.log_text(), DEADLINE_S, "the timeout logged"
            )
        wait_for(
            lambda: status_of(double)[PERFORMANCE] == "True",
            DEADLINE_S,
            "the condition after the hang",
        )

        # The token is rotated: the old one refused, the file holds the new one.
        double.tokens = {"token-2"}
        (tmp_path / "agent" / "token").write_text("token-2\n")
        count = status_patches(double)
        wait_for(
            lambda: status_patches(double) >= count + 2, DEADLINE_S, "heartbeats with the new token"
        )
    assert double.violations == []
    assert ours(double) == [], "taint is off"
