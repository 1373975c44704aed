"""The shipped Alertmanager configuration end to end: two real agents, a real Prometheus
with the shipped rules, Debian's prometheus-alertmanager with monitoring/alertmanager.yml,
and a webhook server in the test standing in for the receivers.

One agent runs on the healthy DGX replica, one on the faulty one (tests/fixtures/nodes.py:
XID 79 and a GPU off the bus, which ask for a reboot, and warnings besides, such as a row
remap pending on GPU 0). The faulty node's reboot reaches the pager; its warnings fire in
Prometheus but Alertmanager holds them back (inhibited by the reboot), so no ticket goes
out for them; the healthy node pages nobody.

The Alertmanager configuration is a copy of the shipped one with two changes only: each
receiver's URL points at the test's webhook server, and group_wait and group_interval are
1 s, so a group goes out within seconds instead of minutes. Routes, receivers' names,
grouping and inhibitions are the shipped ones. The alert rules are the shipped ones too:
the alerts this test needs (NodecheckRebootNeeded, NodecheckGpuResetNeeded) have no `for`.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Node
from tests.fixtures.fleet import (
    MONITORING,
    FleetAgent,
    FleetNode,
    RunningAlertmanager,
    RunningPrometheus,
    prometheus_alerts,
    query,
    rule_files,
    running_alertmanager,
    running_fleet,
    running_prometheus,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("prometheus-alertmanager") is None,
    reason="Debian's prometheus and prometheus-alertmanager packages (make test installs them)",
)

HEALTHY = "healthy"
FAULTY = "faulty"
LABELS = {"cluster": "c1"}
# Generous: agents, Prometheus and Alertmanager on two loaded cores; each wait ends as
# soon as its condition holds.
DEADLINE_S = 240
# The alerts that silence a node's warnings (monitoring/alertmanager.yml's inhibit_rules).
INHIBITING = {"NodecheckRebootNeeded", "NodecheckGpuNotAnswering"}


class Webhook:
    """An HTTP server on loopback that keeps every notification POSTed to it, with the
    path it came to (/<receiver name>, as the configuration copy sets it)."""

    def __init__(self) -> None:
        self.notifications: list[tuple[str, dict[str, Any]]] = []
        lock = threading.Lock()
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # not to the test's output

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._lock = lock

    def alerts(self) -> list[tuple[str, dict[str, Any]]]:
        """Each alert of every notification so far, with the path it was posted to."""
        with self._lock:
            return [(path, alert) for path, body in self.notifications for alert in body["alerts"]]

    @contextlib.contextmanager
    def serving(self) -> Iterator[Webhook]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
            thread.join()


def alertmanager_config(webhook: str, path: Path) -> Path:
    """The shipped configuration with each receiver's URL at `webhook`/<its name> and
    group_wait and group_interval at 1s wherever a route sets them; nothing else changed."""
    config = yaml.safe_load((MONITORING / "alertmanager.yml").read_text())
    for receiver in config["receivers"]:
        # A receiver of another kind would notify a real service from the test.
        assert set(receiver) == {"name", "webhook_configs"}, receiver
        for webhook_config in receiver["webhook_configs"]:
            webhook_config["url"] = f"{webhook}/{receiver['name']}"
    routes = [config["route"]]
    while routes:
        route = routes.pop()
        for key in ("group_wait", "group_interval"):
            if key in route:
                route[key] = "1s"
        routes.extend(route.get("routes", []))
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Stack:
    agents: list[FleetAgent]
    prometheus: RunningPrometheus
    alertmanager: RunningAlertmanager
    webhook: Webhook

    def instance(self, name: str) -> str:
        [member] = [m for m in self.agents if m.spec.name == name]
        return member.instance

    def firing(self, instance: str) -> list[dict[str, Any]]:
        """What Prometheus fires now for `instance`."""
        alerts = prometheus_alerts(self.prometheus.url)
        return [
            a for a in alerts if a["state"] == "firing" and a["labels"].get("instance") == instance
        ]


@pytest.fixture(scope="module")
def stack(build: Callable[..., Node]) -> Iterator[Stack]:
    work = Path(tempfile.mkdtemp(prefix="nodecheck-alertmanager-"))
    specs = [
        FleetNode(HEALTHY, build("dgx-h100"), LABELS, benchmarks=False),
        FleetNode(FAULTY, build("dgx-h100-faulty"), LABELS, benchmarks=False),
    ]
    try:
        with Webhook().serving() as webhook, running_fleet(specs, work / "agents") as agents:
            # Scraped only once every check has a first result: the faulty node's reboot
            # and its warnings then reach Alertmanager together, as on a running node.
            for member in agents:
                wait_for(member.ready, DEADLINE_S, f"agent {member.spec.name} to be ready")
            config = alertmanager_config(webhook.url, work / "alertmanager.yml")
            with running_alertmanager(config, work / "alertmanager") as alertmanager:
                targets = [member.instance for member in agents]
                rules = rule_files(work / "rules")
                with running_prometheus(
                    targets, rules, work / "prometheus", alertmanager.address
                ) as prometheus:
                    yield Stack(agents, prometheus, alertmanager, webhook)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def reboot_pages(stack: Stack) -> list[tuple[str, dict[str, Any]]]:
    faulty = stack.instance(FAULTY)
    return [
        (path, alert)
        for path, alert in stack.webhook.alerts()
        if alert["labels"]["alertname"] == "NodecheckRebootNeeded"
        and alert["labels"].get("instance") == faulty
    ]


def warnings_firing(stack: Stack) -> list[dict[str, Any]]:
    """The faulty node's warnings that fire in Prometheus, once its GPU reset warning (the
    row remap pending on GPU 0, no `for`) is among them."""
    warnings = [
        alert["labels"]
        for alert in stack.firing(stack.instance(FAULTY))
        if alert["labels"]["severity"] == "warning"
    ]
    names = {labels["alertname"] for labels in warnings}
    return warnings if "NodecheckGpuResetNeeded" in names else []


def flushed_twice(stack: Stack, alert: dict[str, Any]) -> bool:
    """Whether Alertmanager's dispatcher has flushed the group holding `alert` twice (its
    debug log: msg=flushing, each alert as name[first 7 digits of its fingerprint][state]).
    One group's flushes run one after the other, so a second one means the first has been
    through the whole notification pipeline (inhibition, then the receiver)."""
    mark = f"{alert['labels']['alertname']}[{alert['fingerprint'][:7]}]"
    lines = stack.alertmanager.log.read_text().splitlines()
    return sum(1 for line in lines if "msg=flushing" in line and mark in line) >= 2


def warnings_sent(stack: Stack) -> list[dict[str, str]]:
    """The faulty node's warnings that reached a receiver."""
    faulty = stack.instance(FAULTY)
    return [
        alert["labels"]
        for _, alert in stack.webhook.alerts()
        if alert["labels"].get("instance") == faulty and alert["labels"]["severity"] == "warning"
    ]


def in_alertmanager(stack: Stack, labels: dict[str, str]) -> dict[str, Any] | None:
    """Alertmanager's alert with exactly these labels, in whatever state."""
    found = [alert for alert in stack.alertmanager.alerts() if alert["labels"] == labels]
    return found[0] if found else None


def settled(stack: Stack) -> list[dict[str, str]]:
    """The faulty node's warnings, once the pager has its reboot and Alertmanager has
    flushed the group of each warning twice (so whatever it would send for them has been
    sent)."""
    wait_for(partial(reboot_pages, stack), DEADLINE_S, "the faulty node's reboot page")
    warnings: list[dict[str, str]]
    warnings = wait_for(partial(warnings_firing, stack), DEADLINE_S, "the faulty node's warnings")
    for labels in warnings:
        alert = wait_for(partial(in_alertmanager, stack, labels), DEADLINE_S, f"{labels}")
        wait_for(partial(flushed_twice, stack, alert), DEADLINE_S, f"two flushes of {labels}")
    return warnings


def test_the_pager_gets_the_faulty_nodes_reboot(stack: Stack) -> None:
    pages = wait_for(
        lambda: [p for p in reboot_pages(stack) if p[1]["labels"]["check"] == "gpu_xid"],
        DEADLINE_S,
        "NodecheckRebootNeeded for the faulty node's XID 79",
    )
    assert {path for path, _ in pages} == {"/pager"}
    # The GPU off the bus; a notification sent again for its group repeats it.
    assert {alert["labels"]["subject"] for _, alert in pages} == {"gpu 0000:bc:00.0"}
    _, alert = pages[0]
    assert alert["status"] == "firing"
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["summary"]
    # Every reboot alert of the node went to the pager only.
    assert {path for path, _ in reboot_pages(stack)} == {"/pager"}


def test_the_faulty_nodes_warnings_fire_but_are_inhibited(stack: Stack) -> None:
    """Prometheus fires them, Alertmanager holds them as suppressed by the node's reboot,
    and no receiver gets them."""
    warnings = settled(stack)
    assert warnings_sent(stack) == []
    faulty = stack.instance(FAULTY)
    held = stack.alertmanager.alerts()
    sources = {
        alert["fingerprint"]
        for alert in held
        if alert["labels"]["alertname"] in INHIBITING
        and alert["labels"]["severity"] == "critical"
        and alert["labels"].get("instance") == faulty
    }
    assert sources
    for labels in warnings:
        [alert] = [alert for alert in held if alert["labels"] == labels]
        status = alert["status"]
        assert status["state"] == "suppressed", (labels, status)
        assert status["inhibitedBy"], (labels, status)
        assert set(status["inhibitedBy"]) <= sources, (labels, status)
        assert status["silencedBy"] == []
    # Where the GPU reset warning would have gone: the hardware team's tickets.
    [reset] = [
        a
        for a in held
        if a["labels"] in warnings and a["labels"]["alertname"] == "NodecheckGpuResetNeeded"
    ]
    assert [r["name"] for r in reset["receivers"]] == ["hardware-tickets"]


def test_the_healthy_node_pages_nobody(stack: Stack) -> None:
    settled(stack)
    healthy = stack.instance(HEALTHY)
    # Prometheus has judged the healthy node (scraped, its verdicts in) and never fired
    # anything critical for it since it started; nothing critical of it reached a receiver.
    assert query(stack.prometheus.url, f'up{{instance="{healthy}"}} == 1')
    assert query(stack.prometheus.url, f'nodecheck_check_verdict{{instance="{healthy}"}}')
    ever = query(
        stack.prometheus.url,
        f'max_over_time(ALERTS{{instance="{healthy}",severity="critical"}}[1h])',
    )
    assert ever == []
    paged = [
        alert["labels"]
        for _, alert in stack.webhook.alerts()
        if alert["labels"].get("instance") == healthy and alert["labels"]["severity"] == "critical"
    ]
    assert paged == []


def test_the_copy_changes_only_the_urls_and_the_group_timers(tmp_path: Path) -> None:
    def normalised(path: Path) -> str:
        text = json.dumps(yaml.safe_load(path.read_text()), sort_keys=True)
        text = re.sub(r'"url": "[^"]*"', '"url": ""', text)
        return re.sub(r'"group_(wait|interval)": "[^"]*"', r'"group_\1": ""', text)

    copy = alertmanager_config("http://127.0.0.1:1", tmp_path / "alertmanager.yml")
    assert "http://127.0.0.1:1/pager" in copy.read_text()
    assert normalised(copy) == normalised(MONITORING / "alertmanager.yml")
