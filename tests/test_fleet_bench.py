"""bench/fleet_rules.py on a small fleet: a real Prometheus scraping 20 simulated nodes
(each the replica agent's /metrics plus benchmark series) finds exactly the planted
stragglers, leaves the stale node out, names the failing rack, and has data for every panel
of the fleet dashboard. Correctness only: the timing is the bench's, at 1,000 nodes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="Debian's prometheus package (make test installs it)",
)


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.fleet_rules", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


# 20 nodes, scraped and evaluated every 2 s: correctness only, never timing.
SMALL_FLEET = (
    *("--nodes", "20", "--interval", "2", "--scrape-interval", "2"),
    *("--regression-days", "0.01"),
)


def test_the_rules_find_exactly_the_planted_stragglers() -> None:
    done = run_bench(
        *SMALL_FLEET,
        "--evaluations",
        "2",
        "--history-hours",
        "1",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "found exactly those; every dashboard panel has data" in done.stdout
    # 1 straggler of each kind and 1 stale node in 20; the table has both groups.
    assert "planted: 3 stragglers, 1 stale nodes" in done.stdout
    # Every shipped group is in the table, the node alerts' too.
    for group in ("nodecheck-fleet ", "nodecheck-fleet-nodes ", "nodecheck-fleet-alerts "):
        assert group in done.stdout
    assert "nodecheck-verdicts " in done.stdout and "nodecheck-rdma " in done.stdout


def test_a_rule_that_misses_the_planted_straggler_is_noticed(tmp_path: Path) -> None:
    """The bench's check can fail: with every node's matmul score inflated by 10 %, the
    planted GPU at 0.85 scores 0.94, goes unfound, and the bench says so and exits 1."""
    from bench import fleet_rules

    rules = tmp_path / "fleet_rules.yml"
    score = (
        "min by (cluster, instance) "
        "(instance_gpu:nodecheck_bench_matmul_flops_per_second:ratio_to_median)"
    )
    text = fleet_rules.FLEET_RULES.read_text()
    assert score in text
    rules.write_text(text.replace(score, f"{score} * 1.1"))
    done = run_bench(
        *SMALL_FLEET,
        "--evaluations",
        "1",
        "--history-hours",
        "0",
        "--rules",
        str(rules),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "MISMATCH" in done.stdout and "stragglers found" in done.stdout
