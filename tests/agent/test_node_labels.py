"""[labels]: the operator's names for a node's place in the fleet, validated with file,
line and key, and exported once per scrape as nodecheck_node_info (a real agent, SIGHUP)."""

from __future__ import annotations

import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodecheck.agent.config import (
    MAX_NODE_LABELS,
    RESERVED_NODE_LABELS,
    AgentConfig,
    ConfigError,
    load_config,
    parse_config,
)
from nodecheck.agent.daemon.exporter import (
    CachedExposition,
    ResultCollector,
    exposition,
    make_registry,
)
from nodecheck.agent.daemon.scheduler import ResultStore
from nodecheck.checks.registry import load_benchmarks, load_checks
from nodecheck.checks.result import MetricSpec
from tests.agent.test_daemon import RunningAgent, running_agent, wait_for
from tests.conftest import Node
from tests.fixtures.nvml_scenarios import dgx_faulty, dgx_healthy

CHECKS = set(load_checks())
GOOD = """\
[agent]
listen = "127.0.0.1:19410"

[labels]
cluster = "c1"
partition = "gpu"
rack = "r07"
Row_2 = "hall B, row 2 \\"west\\""
"""


def test_labels_read_and_shown(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(GOOD)
    config = load_config(path, CHECKS)
    assert config.labels == {
        "cluster": "c1",
        "partition": "gpu",
        "rack": "r07",
        "Row_2": 'hall B, row 2 "west"',
    }
    shown = config.show()
    assert '[labels]\nRow_2 = "hall B, row 2 \\"west\\""\ncluster = "c1"\n' in shown
    assert parse_config(shown, path, CHECKS) == config  # show() reads back the same
    assert AgentConfig().labels == {} and "\n[labels]\n" in AgentConfig().show()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[labels]\ncluster = "c1"\n"9rack" = "r1"\n', "c.toml:3: labels.9rack: not a Prometheus"),
        ('[labels]\n"rack-id" = "r1"\n', "c.toml:2: labels.rack-id: not a Prometheus label name"),
        ('[labels]\n__rack = "r1"\n', "c.toml:2: labels.__rack: names starting with __ are"),
        ('[labels]\ninstance = "n1"\n', "c.toml:2: labels.instance: 'instance' is a label"),
        ('\n[labels]\njob = "n1"\n', "c.toml:3: labels.job: 'job' is a label"),
        ('[labels]\ngpu = "0"\n', "c.toml:2: labels.gpu: 'gpu' is a label nodecheck's series"),
        # Prometheus Operator's target labels (a ServiceMonitor's, a PodMonitor's).
        *[
            (f'[labels]\n{name} = "x"\n', f"c.toml:2: labels.{name}: '{name}' is a label")
            for name in ("namespace", "pod", "container", "service", "endpoint", "node")
        ],
        ("[labels]\nrack = 7\n", "c.toml:2: labels.rack: expected a string, got an integer 7"),
        ("[labels]\nrack = true\n", "c.toml:2: labels.rack: expected a string, got true"),
        ('[labels]\nrack = ["a"]\n', "c.toml:2: labels.rack: expected a string, got an array"),
        ("[labels.rack]\nid = 1\n", "c.toml:1: labels.rack: expected a string, got a table"),
        ('[labels]\nrack = ""\n', "c.toml:2: labels.rack: empty: leave the label out"),
        (f'[labels]\nrack = "{"r" * 129}"\n', "c.toml:2: labels.rack: at most 128 characters, got"),
        ('[labels]\nrack = "r\\u0007"\n', "c.toml:2: labels.rack: only printable characters"),
        ('[labels]\nrack = "r\\n1"\n', "c.toml:2: labels.rack: only printable characters"),
        ('labels = "c1"\n', "c.toml:1: labels: expected a table, got a string"),
        (
            "[labels]\n" + "".join(f'l{n} = "v"\n' for n in range(MAX_NODE_LABELS + 1)),
            f"c.toml:1: labels: at most {MAX_NODE_LABELS} labels, got {MAX_NODE_LABELS + 1}",
        ),
    ],
)
def test_bad_labels_name_file_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, CHECKS)
    assert str(caught.value).startswith(str(tmp_path / message)), str(caught.value)


def test_sixteen_labels_are_allowed(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[labels]\n" + "".join(f'l{n} = "v{n}"\n' for n in range(MAX_NODE_LABELS)))
    assert len(load_config(path, CHECKS).labels) == MAX_NODE_LABELS


def test_no_label_of_nodecheck_s_series_can_be_set() -> None:
    """A node label named like a label of one of nodecheck's series would clash when the
    fleet's rules join nodecheck_node_info onto it: every MetricSpec's labels are reserved,
    and the exporter's own (check, subject, status, version, python)."""
    load_checks()
    load_benchmarks()
    used = {"check", "subject", "status", "version", "python"}
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("nodecheck.checks."):
            for value in vars(module).values():
                for candidate in value.values() if isinstance(value, dict) else [value]:
                    if isinstance(candidate, MetricSpec):
                        used |= set(candidate.labels)
    assert {"shape", "algorithm", "ranks", "benchmark", "payload_bytes"} <= used
    assert used - RESERVED_NODE_LABELS == set()


def rendered(labels: dict[str, str]) -> str:
    registry = make_registry(ResultCollector(ResultStore(), "test", lambda: True, lambda: labels))
    return exposition(registry).decode()


def test_the_info_series_once_per_scrape() -> None:
    text = rendered({"rack": "r07", "cluster": 'c "1"\\'})
    assert text.count("# TYPE nodecheck_node_info gauge") == 1
    series = [line for line in text.splitlines() if line.startswith("nodecheck_node_info")]
    assert series == ['nodecheck_node_info{cluster="c \\"1\\"\\\\",rack="r07"} 1.0']
    # Always present, even without labels: a join on it never loses a node.
    assert "\nnodecheck_node_info 1.0\n" in rendered({})


def test_the_cached_exposition_follows_the_labels() -> None:
    """A reload changes the labels without any new result: the cache must see it."""
    labels = {"rack": "r07"}
    store = ResultStore()
    registry = make_registry(ResultCollector(store, "test", lambda: True, lambda: labels))
    cached = CachedExposition(registry, store, lambda: dict(labels))
    assert 'nodecheck_node_info{rack="r07"} 1.0' in cached().decode()
    labels["rack"] = "r08"
    assert 'nodecheck_node_info{rack="r08"} 1.0' in cached().decode()


def info_series(metrics: str) -> list[str]:
    return re.findall(r"^nodecheck_node_info(?:\{.*\})? 1\.0$", metrics, re.MULTILINE)


@pytest.fixture
def agent(build: Callable[..., Node]) -> Iterator[RunningAgent]:
    work = Path(tempfile.mkdtemp(prefix="nodecheck-labels-"))
    node = build("dgx-h100").with_scenario(dgx_healthy(), work / "scenario.json")
    try:
        with running_agent(node, work / "agent", benchmarks=False) as running:
            yield running
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_real_agent_exports_its_labels_and_a_reload_changes_them(agent: RunningAgent) -> None:
    assert info_series(agent.metrics()) == ["nodecheck_node_info 1.0"]
    plain = agent.config.read_text()
    agent.config.write_text(plain + '\n[labels]\ncluster = "c1"\nrack = "r07"\n')
    agent.process.send_signal(signal.SIGHUP)
    labelled = ['nodecheck_node_info{cluster="c1",rack="r07"} 1.0']
    wait_for(lambda: info_series(agent.metrics()) == labelled, 60, "the labels after SIGHUP")
    agent.config.write_text(plain + '\n[labels]\ncluster = "c1"\nrack = "r08"\n')
    agent.process.send_signal(signal.SIGHUP)
    moved = ['nodecheck_node_info{cluster="c1",rack="r08"} 1.0']
    wait_for(lambda: info_series(agent.metrics()) == moved, 60, "the new rack after SIGHUP")
    # A bad label is refused whole: the series keeps the labels in force.
    agent.config.write_text(plain + '\n[labels]\ninstance = "x"\n')
    agent.process.send_signal(signal.SIGHUP)
    wait_for(
        lambda: "nodecheck_config_last_reload_successful 0.0" in agent.metrics(), 60, "refusal"
    )
    assert info_series(agent.metrics()) == moved


def gauge(metrics: str, name: str) -> float:
    [value] = re.findall(rf"^{name} (\S+)$", metrics, re.MULTILINE)
    return float(value)


def failing_by_status(metrics: str) -> set[str]:
    """The checks with a fail status series at 1 on some subject, in the same scrape
    (prometheus_client writes the labels sorted: check, status, subject)."""
    pattern = r'^nodecheck_check_status\{check="([^"]+)",status="fail",subject="[^"]*"\} 1\.0$'
    return set(re.findall(pattern, metrics, re.MULTILINE))


def failing_from_the_node(metrics: str) -> set[str]:
    """The checks with a verdict series of the node's own evidence failing, in the same
    scrape: what nodecheck_checks_failing counts (a job's failure does not)."""
    lines = re.findall(r"^nodecheck_check_verdict\{([^}]*)\} 1\.0$", metrics, re.MULTILINE)
    return {
        re.search(r'check="([^"]+)"', labels).group(1)  # type: ignore[union-attr]
        for labels in lines
        if 'status="fail"' in labels and 'origin="node"' in labels
    }


def ready(agent: RunningAgent) -> bool:
    return any("READY=1" in note for note in agent.notifications)


def test_the_failing_checks_and_the_start_time_of_a_faulty_agent(
    build: Callable[..., Node],
) -> None:
    """The faulty DGX fails several checks: nodecheck_checks_failing counts those failing
    from the node's own evidence, one per check however many subjects fail, as the
    verdict series of the same scrape say; the
    start time is the agent's, between its launch and its first answer, and stays put."""
    work = Path(tempfile.mkdtemp(prefix="nodecheck-failing-"))
    node = build("dgx-h100-faulty").with_scenario(dgx_faulty(), work / "scenario.json")
    try:
        launched = time.time()
        with running_agent(node, work / "agent", benchmarks=False) as running:
            wait_for(lambda: ready(running), 120, "the agent's first pass")
            answered = time.time()
            metrics = running.metrics()
            failing = failing_by_status(metrics)
            assert {"pcie_acs", "gpu_memory_errors", "gpu_xid"} <= failing, failing
            node_failing = failing_from_the_node(metrics)
            # A job's NCCL_P2P_DISABLE=1 fails nccl_env, but the node's checks alone count.
            assert node_failing <= failing and "nccl_env" not in node_failing
            assert gauge(metrics, "nodecheck_checks_failing") == len(node_failing)
            started = gauge(metrics, "nodecheck_agent_start_time_seconds")
            assert launched <= started <= answered
            assert "# TYPE nodecheck_checks_failing gauge" in metrics
            assert "# TYPE nodecheck_agent_start_time_seconds gauge" in metrics
            later = running.metrics()
            assert gauge(later, "nodecheck_agent_start_time_seconds") == started
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_healthy_agent_fails_no_check(agent: RunningAgent) -> None:
    """0, not absent, when nothing fails: the fleet rule reads one series per node."""
    wait_for(lambda: ready(agent), 120, "the agent's first pass")
    metrics = agent.metrics()
    assert gauge(metrics, "nodecheck_checks_failing") == len(failing_by_status(metrics)) == 0
