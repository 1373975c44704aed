"""The shipped Alertmanager configuration (monitoring/alertmanager.yml): valid for amtool,
each kind of alert routed to its receiver, and every alert it names one the rules fire.
Its inhibitions are tested end to end (tests/fleet/test_alertmanager_e2e.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "monitoring" / "alertmanager.yml"
RULES = (ROOT / "monitoring" / "alerts.yml", ROOT / "monitoring" / "fleet_alerts.yml")
pytestmark = pytest.mark.skipif(
    shutil.which("amtool") is None,
    reason="amtool (Debian's prometheus-alertmanager; make test installs it)",
)


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["amtool", *args], capture_output=True, text=True, check=False)


def routes_test(receiver: str, labels: list[str]) -> subprocess.CompletedProcess[str]:
    """amtool's verdict on whether an alert with `labels` goes to `receiver`, and only there
    (it exits non-zero otherwise)."""
    return amtool(
        "config",
        "routes",
        "test",
        f"--config.file={CONFIG}",
        f"--verify.receivers={receiver}",
        *labels,
    )


def test_the_configuration_is_valid() -> None:
    done = amtool("check-config", str(CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        # A failure of the GPUs (NodecheckRebootNeeded after XID 79, say) pages.
        (["severity=critical", "class=gpu-hardware"], "pager"),
        (["alertname=NodecheckRebootNeeded", "severity=critical", "class=gpu-hardware"], "pager"),
        # Critical fleet alerts have no class: they page too.
        (["alertname=NodecheckFleetAgentsDown", "severity=critical", "cluster=c1"], "pager"),
        # Warnings of the GPUs and their links go to the hardware team.
        (["severity=warning", "class=gpu-performance"], "hardware-tickets"),
        (["severity=warning", "class=gpu-hardware"], "hardware-tickets"),
        # A node slower than its peers (a fleet alert, no class): the hardware team looks
        # first (its GPUs, their cooling, their links).
        (["alertname=NodecheckFleetStraggler", "severity=warning"], "hardware-tickets"),
        # The node's configuration, the agent, the fleet's other warnings: operations.
        (["severity=warning", "class=node-config"], "ops-tickets"),
        (["alertname=NodecheckAgentDown", "severity=warning"], "ops-tickets"),
        (["alertname=NodecheckFleetRegression", "severity=warning", "model=H100"], "ops-tickets"),
        # A job's setting, a class too small: information.
        (["severity=info"], "info-tickets"),
        (["alertname=NodecheckFleetClassTooSmall", "severity=info"], "info-tickets"),
        # No known severity: a ticket, never dropped.
        (["alertname=Unknown"], "ops-tickets"),
    ],
)
def test_each_alert_goes_to_its_receiver(labels: list[str], receiver: str) -> None:
    done = routes_test(receiver, labels)
    assert done.returncode == 0, f"{labels}: {done.stdout}{done.stderr}"
    assert done.stdout.strip() == receiver


def test_a_wrong_receiver_is_refused() -> None:
    """--verify.receivers fails where the alert goes elsewhere (the checks above can fail)."""
    done = routes_test("hardware-tickets", ["severity=warning", "class=node-config"])
    assert done.returncode != 0
    assert done.stdout.splitlines()[0] == "ops-tickets"


def test_every_alert_named_is_one_the_rules_fire() -> None:
    fired = set()
    for rules in RULES:
        for group in yaml.safe_load(rules.read_text())["groups"]:
            fired |= {rule["alert"] for rule in group["rules"] if "alert" in rule}
    named = set(re.findall(r"\bNodecheck[A-Za-z]+", CONFIG.read_text()))
    assert named
    assert named <= fired, named - fired
