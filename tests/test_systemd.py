"""The systemd units: `systemd-analyze verify` clean, and the agent's exposure 2.5 or better."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNITS = sorted((ROOT / "systemd").iterdir())
pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze (systemd) is not installed"
)


def installed_units(tmp_path: Path) -> list[Path]:
    """The units with ExecStart pointing at this checkout's command, which verify requires
    to exist (the shipped units say /usr/local/bin/nodecheck)."""
    command = Path(sys.executable).with_name("nodecheck")
    assert command.exists()
    copies = []
    for unit in UNITS:
        copy = tmp_path / unit.name
        copy.write_text(unit.read_text().replace("/usr/local/bin/nodecheck", str(command)))
        copies.append(copy)
    return copies


def test_units_verify_clean(tmp_path: Path) -> None:
    units = installed_units(tmp_path)
    done = subprocess.run(
        ["systemd-analyze", "verify", *map(str, units)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


def test_the_agent_unit_is_locked_down(tmp_path: Path) -> None:
    [agent] = [u for u in installed_units(tmp_path) if u.name == "nodecheck.service"]
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(agent)],
        capture_output=True,
        text=True,
        check=False,
    )
    match = re.search(r"Overall exposure level for nodecheck.service: ([\d.]+)", done.stdout)
    assert match, done.stdout + done.stderr
    assert float(match.group(1)) <= 2.5


def test_the_network_facing_unit_never_runs_as_root() -> None:
    agent = (ROOT / "systemd" / "nodecheck.service").read_text()
    assert "DynamicUser=yes" in agent and "CapabilityBoundingSet=\n" in agent
    snapshot = (ROOT / "systemd" / "nodecheck-snapshot.service").read_text()
    assert "PrivateNetwork=yes" in snapshot and "IPAddressDeny=any" in snapshot
