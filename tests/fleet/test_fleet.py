"""The fleet view end to end: a real Prometheus scrapes eight agents on loopback with the
shipped rules, and the fleet's judgements name the right node.

Eight agents, each a real `nodecheck agent` on a replica node and the fake NVML, in two
racks. Six measure what a healthy H100 node measures; one measures its matmul 15 % below
that on every GPU (its rates file: the benchmark double plays it), so within the node
every GPU equals its peers and only the fleet can see it; one is the faulty DGX (XIDs,
failing checks, and a job on GPU 3, so the gate never lets it benchmark).
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Node
from tests.fixtures.fleet import (
    HEALTHY_RATES,
    FleetAgent,
    FleetNode,
    RunningPrometheus,
    firing_alerts,
    query,
    rule_files,
    running_fleet,
    running_prometheus,
    wait_for,
)
from tests.fixtures.nvml_scenarios import dgx_healthy

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="Debian's prometheus package (make test installs it)",
)

PLANTED = "n03"
FAULTY = "n07"
SLOWDOWN = 0.85
BENCHMARKS = {"matmul", "allreduce", "h2d"}
# Generous: eight agents and Prometheus on two loaded cores; each wait ends as soon as
# its condition holds.
DEADLINE_S = 240


@dataclass
class Fleet:
    server: RunningPrometheus
    agents: list[FleetAgent]

    @property
    def prometheus(self) -> str:
        return self.server.url

    def member(self, name: str) -> FleetAgent:
        [member] = [m for m in self.agents if m.spec.name == name]
        return member

    def instance(self, name: str) -> str:
        return self.member(name).instance

    @property
    def benchmarking(self) -> set[str]:
        return {m.instance for m in self.agents if m.spec.name != FAULTY}

    def query(self, expr: str) -> list[dict[str, Any]]:
        return query(self.prometheus, expr)


def labels_of(index: int) -> dict[str, str]:
    return {"cluster": "c1", "partition": "gpu", "rack": "r01" if index < 4 else "r02"}


@pytest.fixture(scope="module")
def fleet(build: Callable[..., Node]) -> Iterator[Fleet]:
    work = Path(tempfile.mkdtemp(prefix="nodecheck-fleet-"))
    idle = dgx_healthy()
    idle["gpus"][0].update(processes=[], utilization={"gpu": 0, "memory": 0})
    healthy = build("dgx-h100").with_scenario(idle, work / "idle-scenario.json")
    specs = []
    for index in range(8):
        name = f"n{index + 1:02d}"
        if name == FAULTY:
            specs.append(FleetNode(name, build("dgx-h100-faulty"), labels_of(index)))
            continue
        rates = dict(HEALTHY_RATES)
        if name == PLANTED:
            rates["matmul_tflops"] = HEALTHY_RATES["matmul_tflops"] * SLOWDOWN
        specs.append(FleetNode(name, healthy, labels_of(index), rates))
    try:
        with running_fleet(specs, work / "agents") as agents:
            targets = [member.instance for member in agents]
            rules = rule_files(work / "rules")
            with running_prometheus(targets, rules, work / "prometheus") as server:
                yield Fleet(server, agents)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def scores(fleet: Fleet) -> dict[tuple[str, str], float]:
    return {
        (s["metric"]["instance"], s["metric"]["benchmark"]): float(s["value"][1])
        for s in fleet.query("instance:nodecheck_bench_ratio_to_fleet_median:min")
    }


def every_score(fleet: Fleet) -> dict[tuple[str, str], float]:
    """The scores once every benchmarking node has one for every benchmark, else {}."""
    found = scores(fleet)
    wanted = {(instance, benchmark) for instance in fleet.benchmarking for benchmark in BENCHMARKS}
    return found if wanted <= set(found) else {}


def test_the_info_series_carries_each_nodes_labels(fleet: Fleet) -> None:
    def all_info() -> list[dict[str, Any]]:
        series = fleet.query("nodecheck_node_info == 1")
        return series if len(series) == len(fleet.agents) else []

    series = wait_for(all_info, DEADLINE_S, "an info series from every agent")
    seen = {s["metric"]["instance"]: s["metric"] for s in series}
    for index, member in enumerate(fleet.agents):
        labels = seen[member.instance]
        assert {k: labels.get(k) for k in ("cluster", "partition", "rack")} == labels_of(index)


def test_the_benchmark_series_carry_what_makes_them_comparable(fleet: Fleet) -> None:
    """The class labels reach Prometheus; the operator's labels ride only on the info series."""

    def every_gpu() -> list[dict[str, Any]]:
        series = fleet.query("nodecheck_bench_matmul_flops_per_second")
        return series if len(series) == 8 * len(fleet.benchmarking) else []

    matmul = wait_for(every_gpu, DEADLINE_S, "matmul series from every benchmarking node")
    shapes = {s["metric"]["shape"] for s in matmul}
    assert shapes == {"8192x8192x8192+12288x12288x12288"}  # the child's shapes, in run order
    assert {(s["metric"]["model"], s["metric"]["dtype"]) for s in matmul} == {
        ("NVIDIA H100 80GB HBM3", "bf16")
    }
    allreduce = wait_for(
        lambda: fleet.query("nodecheck_bench_allreduce_bus_bandwidth_bytes_per_second"),
        DEADLINE_S,
        "all_reduce series",
    )
    assert {(s["metric"]["algorithm"], s["metric"]["ranks"]) for s in allreduce} == {("nvls", "8")}
    assert not fleet.query('{__name__=~"nodecheck_bench_.*", rack!=""}')


def test_each_node_is_scored_against_the_fleet(fleet: Fleet) -> None:
    """The planted node's matmul score is its slowdown; every other score is about 1."""
    found = wait_for(lambda: every_score(fleet), DEADLINE_S, "a score for every node")
    planted = fleet.instance(PLANTED)
    assert {instance for instance, _ in found} == fleet.benchmarking  # the faulty one: none
    assert found[(planted, "matmul")] == pytest.approx(SLOWDOWN, abs=0.03)
    others = {key: value for key, value in found.items() if key != (planted, "matmul")}
    assert all(value == pytest.approx(1.0, abs=0.03) for value in others.values()), others


def test_the_straggler_alert_names_the_planted_node_and_no_other(fleet: Fleet) -> None:
    planted = fleet.instance(PLANTED)

    def planted_fires() -> list[dict[str, Any]]:
        return [
            alert
            for alert in firing_alerts(fleet.prometheus, "NodecheckFleetStraggler")
            if alert["labels"].get("instance") == planted
        ]

    [alert] = wait_for(planted_fires, DEADLINE_S, "NodecheckFleetStraggler for the planted node")
    assert alert["labels"]["benchmark"] == "matmul"
    assert alert["annotations"].get("description")  # it says what to look at first
    # Judged once the whole fleet is scored: what fires now, and everything that fired
    # at any evaluation since Prometheus started (ALERTS keeps each firing as a series).
    wait_for(lambda: every_score(fleet), DEADLINE_S, "a score for every node")
    firing = {
        (a["labels"].get("instance"), a["labels"].get("benchmark"))
        for a in firing_alerts(fleet.prometheus, "NodecheckFleetStraggler")
    }
    assert firing == {(planted, "matmul")}
    ever = fleet.query(
        'max_over_time(ALERTS{alertname="NodecheckFleetStraggler",alertstate="firing"}[1h])'
    )
    assert {(s["metric"].get("instance"), s["metric"].get("benchmark")) for s in ever} == {
        (planted, "matmul")
    }


def test_only_the_faulty_node_counts_as_failing(fleet: Fleet) -> None:
    faulty = fleet.instance(FAULTY)

    def failing() -> set[str]:
        series = fleet.query("instance:nodecheck_checks_failing:bool")
        if len(series) < len(fleet.agents):
            return set()
        return {s["metric"]["instance"] for s in series if float(s["value"][1]) == 1}

    assert wait_for(failing, DEADLINE_S, "node_failing for every node") == {faulty}


def test_every_fleet_dashboard_panel_returns_data(fleet: Fleet) -> None:
    from tests.fixtures.dashboards import fleet_dashboard_queries

    # The panels' data needs the benchmarks' scores and the faulty node's results.
    wait_for(lambda: every_score(fleet), DEADLINE_S, "a score for every node")
    queries = fleet_dashboard_queries()
    assert queries
    for title, expr in queries:
        wait_for(functools.partial(fleet.query, expr), DEADLINE_S, f"data for panel {title!r}")


# The two tests below change the fleet (an agent killed, a target dropped): they run last,
# in file order, after every test above has judged the whole fleet.

SECOND_IN_RACK = "n08"  # rack r02, beside the faulty n07
DROPPED = "n01"


def test_a_second_failing_node_in_a_rack_is_a_shared_fault(fleet: Fleet) -> None:
    """The faulty node alone is one of four in rack r02 (not more than 0.25); its agent's
    neighbour going down makes two of four, a shared fault of that rack and of no other
    rack or partition (two of eight in the partition)."""
    assert not firing_alerts(fleet.prometheus, "NodecheckSharedFault")
    victim = fleet.member(SECOND_IN_RACK)
    victim.agent.process.kill()
    victim.agent.process.wait()

    [alert] = wait_for(
        lambda: firing_alerts(fleet.prometheus, "NodecheckSharedFault"),
        DEADLINE_S,
        "NodecheckSharedFault for rack r02",
    )
    assert (alert["labels"].get("cluster"), alert["labels"].get("rack")) == ("c1", "r02")
    assert "partition" not in alert["labels"]
    # The description names both failing nodes, the downed one by the rack it last had.
    description = alert["annotations"]["description"]
    assert victim.instance in description and fleet.instance(FAULTY) in description
    assert fleet.instance(PLANTED) not in description


def test_a_node_dropped_from_the_scrape_stopped_reporting(fleet: Fleet) -> None:
    dropped = fleet.instance(DROPPED)
    kept = [m.instance for m in fleet.agents if m.instance != dropped]
    fleet.server.scrape(kept)
    wait_for(lambda: fleet.server.targets() == set(kept), DEADLINE_S, "the reload")

    def stopped() -> set[str]:
        alerts = firing_alerts(fleet.prometheus, "NodecheckNodeStoppedReporting")
        return {a["labels"]["instance"] for a in alerts}

    # Only the dropped node: the agent that is down is still a target (NodecheckAgentDown's).
    assert wait_for(stopped, DEADLINE_S, "NodecheckNodeStoppedReporting") == {dropped}
