"""Privilege separation: the root snapshot, and the agent serving checks from it."""

from __future__ import annotations

import json
import time
from pathlib import Path

from nodecheck.agent.snapshot import from_snapshot, results_from_snapshot
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Status
from nodecheck.checks.runner import run_checks
from tests.agent.test_cli import run
from tests.conftest import Node


def test_snapshot_round_trip(dgx_faulty: Node, tmp_path: Path) -> None:
    """What root saw (ACS on two switch ports, the job's NCCL_P2P_DISABLE) reaches the
    unprivileged agent whole: statuses, remedies and metric samples."""
    output = tmp_path / "snapshot.json"
    done = run(*dgx_faulty.cli_args, "snapshot", "--output", str(output), env=dgx_faulty.env)
    assert done.returncode == 0, done.stderr
    assert output.stat().st_mode & 0o777 == 0o644  # the agent reads it as another user
    direct = {r.subject: r for r in dgx_faulty.results("pcie_acs")}
    served = {r.subject: r for r in results_from_snapshot(output, "pcie_acs")}
    assert set(served) == set(direct)
    for subject, result in direct.items():
        mine = served[subject]
        assert (mine.status, mine.summary, mine.remedy) == (
            result.status,
            result.summary,
            result.remedy,
        )
        assert [(s.metric, s.value, dict(s.labels)) for s in mine.samples] == [
            (s.metric, s.value, dict(s.labels)) for s in result.samples
        ]
    check = from_snapshot(load_checks()["nccl_env"], output)
    [run_] = run_checks([check], dgx_faulty.context())
    assert any("NCCL_P2P_DISABLE=1" in r.summary and r.status is Status.FAIL for r in run_.results)


def test_missing_or_stale_snapshot_is_undetermined(tmp_path: Path) -> None:
    [missing] = results_from_snapshot(tmp_path / "none.json", "pcie_acs")
    assert missing.status is Status.ERROR
    assert missing.remedy == "systemctl enable --now nodecheck-snapshot.timer"
    old = tmp_path / "old.json"
    old.write_text(
        json.dumps(
            {
                "schema": "nodecheck.snapshot/v1",
                "hostname": "n",
                "taken_at": 0,
                "runs": {
                    "pcie_acs": [
                        {
                            "status": "ok",
                            "subject": "node",
                            "summary": "fine",
                            "remedy": "",
                            "details": {},
                            "samples": [],
                        }
                    ]
                },
            }
        )
    )
    results = results_from_snapshot(old, "pcie_acs", now=time.time())
    assert [r.status for r in results] == [Status.OK, Status.ERROR]
    assert "min old" in results[1].summary
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{")
    [bad] = results_from_snapshot(garbage, "pcie_acs")
    assert bad.status is Status.ERROR and bad.summary.startswith("cannot read the snapshot")
