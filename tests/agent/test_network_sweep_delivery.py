"""Where a cross-node sweep's verdict goes besides Slurm (test_slurm_network_sweep.py): the
agent's exposition (`nodecheck_bench_network_*` and the verdict the alert rules read), the
alerts themselves (promtool), the Kubernetes condition and node-problem-detector's plugin;
all through the network_sweep check's one result, no check named outside its module."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nodecheck.agent.daemon.exporter import ResultCollector, exposition, make_registry
from nodecheck.agent.daemon.scheduler import ResultStore
from nodecheck.agent.findings import findings_of
from nodecheck.agent.kubernetes.npd import EXIT_OK, EXIT_PROBLEM, judge
from nodecheck.agent.kubernetes.reporter import judge_classes
from nodecheck.checks.config import BenchOptions, CheckConfig
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import FaultClass
from nodecheck.checks.runner import CheckRun, run_checks
from tests.agent.test_one_contract import _alerts_firing, needs_promtool
from tests.checks.test_network_sweep import HEALTHY, SLOW_LINK, SLOW_NODE, named_before, record
from tests.conftest import Node


def _run(node: Node, state_dir: Path, text: str) -> CheckRun:
    (state_dir / "network.json").write_text(text)
    # The sweep before named this node too: a node is failed only on two in a row.
    (state_dir / "network.previous.json").write_text(named_before(time.time()))
    config = CheckConfig(bench=BenchOptions(state_dir=state_dir))
    [run] = run_checks([load_checks()["network_sweep"]], node.context(config=config))
    return run


def _scrape(run: CheckRun) -> str:
    store = ResultStore()
    store.put(run, 300.0)
    return exposition(make_registry(ResultCollector(store, "test", lambda: True))).decode()


def test_the_agent_exports_the_sweep_per_node(dgx: Node, tmp_path: Path) -> None:
    text = _scrape(_run(dgx, tmp_path, record(SLOW_NODE)))
    assert (
        'nodecheck_bench_network_bus_bandwidth_bytes_per_second{backend="nccl",nodes="8",'
        'payload_bytes="67108864",ranks="8",statistic="median"} 3.1e+08'
    ) in text
    assert 'nodecheck_bench_network_pair_bus_bandwidth_bytes_per_second{backend="nccl",' in text
    assert 'nodecheck_bench_network_verdict{confidence="high",culprit="node",peer=""} 2.0' in text
    assert "nodecheck_bench_network_last_sweep_timestamp_seconds " in text
    assert "nodecheck_bench_network_expected_bus_bandwidth_bytes_per_second{" in text
    assert 'nodecheck_exposition_dropped_samples{check="network_sweep"} 0.0' in text
    assert (
        'nodecheck_check_verdict{action="investigate",check="network_sweep",'
        'class="gpu-performance",origin="node",status="fail",subject="node"} 1.0'
    ) in text


@pytest.mark.parametrize(
    ("template", "age_s", "alerts"),
    [
        (SLOW_NODE, 600.0, {"NodecheckInvestigationNeeded"}),
        (SLOW_LINK, 600.0, {"NodecheckHardwareInspectionNeeded"}),
        (SLOW_NODE, 4 * 86400.0, set()),  # stale: judges nothing, flags nothing
        (HEALTHY, 600.0, set()),
    ],
)
@needs_promtool
def test_the_alert_rules_take_the_verdict_by_its_action(
    dgx: Node, tmp_path: Path, template: str, age_s: float, alerts: set[str]
) -> None:
    run = _run(dgx, tmp_path, record(template, finished_at=time.time() - age_s))
    assert _alerts_firing(tmp_path, _scrape(run)) == alerts


def test_kubernetes_and_npd_see_a_gpu_performance_fault(dgx: Node, tmp_path: Path) -> None:
    slow = findings_of(_run(dgx, tmp_path, record(SLOW_NODE)))
    states = {state.type: state for state in judge_classes([("network_sweep", slow)])}
    assert states["NodecheckGpuPerformance"].status == "True"
    assert judge(FaultClass.GPU_PERFORMANCE, slow, "test").exit_status == EXIT_PROBLEM
    healthy = findings_of(_run(dgx, tmp_path, record(HEALTHY)))
    states = {state.type: state for state in judge_classes([("network_sweep", healthy)])}
    assert states["NodecheckGpuPerformance"].status == "False"
    assert judge(FaultClass.GPU_PERFORMANCE, healthy, "test").exit_status == EXIT_OK
