"""The network_sweep check over `<state dir>/network.json`, records written literally as
`nodecheck bench network` writes them (version 1), on the DGX replica: each way there is no
record is its own outcome, a record of another node is refused, an old one judges nothing,
and only a fresh, confident verdict naming this node or its link fails it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nodecheck.checks.config import BenchOptions, CheckConfig
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import dumps, loads
from nodecheck.checks.node.network_sweep import RECORD_LIMIT, parse_network_sweep
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Action, FaultClass, Result, Status
from nodecheck.checks.runner import run_checks
from tests.conftest import CLEAN_ENVIRON, Node

HOST = "dgx-h100-01"  # the healthy replica's host name

# A node named slow in an 8-node NCCL sweep, its pairs 0.31 GB/s against 1.1 GB/s.
SLOW_NODE = """{"version": 1, "node": "%(node)s", "finished_at": %(finished_at)s,
 "backend": "nccl", "payload_bytes": 67108864, "nodes": 8, "ranks": 8,
 "whole_job": {"busbw_median": 3.1e8, "busbw_min": 2.9e8, "busbw_p10": 3.0e8,
               "busbw_p90": 3.2e8, "cv": 0.04},
 "expected_bytes_per_second": 1.1e9, "expected_source": "the run's median pair",
 "pairs": [{"peer": "node-4", "round": 1, "busbw_bytes_per_second": 3.1e8, "slow": true},
           {"peer": "node-5", "round": 2, "busbw_bytes_per_second": 3.0e8, "slow": true}],
 "verdict": {"status": "%(status)s", "culprit": "node", "peer": null,
             "confidence": "%(confidence)s",
             "message": "%(node)s slow: 0.31 GB/s in both its pairs, 1.1 GB/s elsewhere"}}
"""
# Both ends of a slow link: this node and node-6, 0.4 GB/s together, 1.1 GB/s with others.
SLOW_LINK = """{"version": 1, "node": "%(node)s", "finished_at": %(finished_at)s,
 "backend": "nccl", "payload_bytes": 1073741824, "nodes": 4, "ranks": 32,
 "whole_job": {"busbw_median": 4.0e8, "busbw_min": 3.8e8, "busbw_p10": 3.9e8,
               "busbw_p90": 4.1e8, "cv": 0.02},
 "expected_bytes_per_second": 4.5e10,
 "expected_source": "compute NICs 8 x 400 Gb/s, ring factor 2(n-1)/n",
 "pairs": [{"peer": "node-6", "round": 1, "busbw_bytes_per_second": 4.0e8, "slow": true},
           {"peer": "node-7", "round": 2, "busbw_bytes_per_second": 1.1e9, "slow": false}],
 "verdict": {"status": "fail", "culprit": "link", "peer": "node-6", "confidence": "%(confidence)s",
             "message": "link %(node)s - node-6 slow: 0.4 GB/s, 1.1 GB/s with node-7"}}
"""
# A healthy whole job: no sweep of pairs ran.
HEALTHY = """{"version": 1, "node": "%(node)s", "finished_at": %(finished_at)s,
 "backend": "gloo", "payload_bytes": 67108864, "nodes": 8, "ranks": 8,
 "whole_job": {"busbw_median": 1.2e9, "busbw_min": 1.0e9, "busbw_p10": 1.1e9,
               "busbw_p90": 1.3e9, "cv": 0.05},
 "expected_bytes_per_second": 1.1e9, "expected_source": null, "pairs": [],
 "verdict": {"status": "ok", "culprit": "none", "peer": null, "confidence": "high",
             "message": "whole job at expectation"}}
"""
# The whole job slow and nothing named.
NOBODY_NAMED = HEALTHY.replace('"status": "ok"', '"status": "fail"').replace(
    "whole job at expectation", "whole job 0.4x expectation, every pair alike"
)


def record(template: str, **values: object) -> str:
    filled: dict[str, object] = {
        "node": HOST,
        "finished_at": time.time() - 600,
        "status": "fail",
        "confidence": "high",
    }
    filled.update(values)
    return template % filled


def named_before(finished_at: float) -> str:
    """The record a sweep a day before `finished_at` left, naming this node as surely."""
    return record(SLOW_NODE, finished_at=finished_at - 86400)


def judge(
    node: Node, state_dir: Path, text: str | None, previous: str | None = None, **options: object
) -> Result:
    """network_sweep's one result on `node` with `text` as the record in `state_dir`, and
    `previous` as the one it replaced."""
    if text is not None:
        (state_dir / "network.json").write_text(text)
    if previous is not None:
        (state_dir / "network.previous.json").write_text(previous)
    config = CheckConfig(bench=BenchOptions(state_dir=state_dir, **options))  # type: ignore[arg-type]
    [result] = node.results("network_sweep", config=config)
    return result


def metrics(result: Result) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for sample in result.samples:
        found.setdefault(sample.metric.name, []).append((dict(sample.labels), sample.value))
    return found


def test_a_node_named_slow_fails_as_a_performance_finding(dgx: Node, tmp_path: Path) -> None:
    now = time.time()
    result = judge(dgx, tmp_path, record(SLOW_NODE, finished_at=now - 600), named_before(now))
    assert result.status is Status.FAIL
    assert result.fault_class is FaultClass.GPU_PERFORMANCE
    assert result.action is Action.INVESTIGATE
    assert "whole job 0.31 GB/s (expected 1.1 GB/s)" in result.summary
    assert f"{HOST} slow: 0.31 GB/s in both its pairs" in result.summary
    assert "rdma_ports" in result.remedy
    found = metrics(result)
    busbw = {
        labels["statistic"]: value
        for labels, value in found["nodecheck_bench_network_bus_bandwidth_bytes_per_second"]
    }
    assert busbw == {"median": 3.1e8, "min": 2.9e8, "p10": 3.0e8, "p90": 3.2e8}
    [(labels, _)] = found["nodecheck_bench_network_variation_ratio"]
    assert labels == {"backend": "nccl", "payload_bytes": "67108864", "nodes": "8", "ranks": "8"}
    assert found["nodecheck_bench_network_expected_bus_bandwidth_bytes_per_second"][0][1] == 1.1e9
    pairs = found["nodecheck_bench_network_pair_bus_bandwidth_bytes_per_second"]
    assert [(labels["peer"], labels["round"], value) for labels, value in pairs] == [
        ("node-4", "1", 3.1e8),
        ("node-5", "2", 3.0e8),
    ]
    assert [value for _, value in found["nodecheck_bench_network_pair_slow"]] == [1.0, 1.0]
    assert found["nodecheck_bench_network_verdict"] == [
        ({"culprit": "node", "peer": "", "confidence": "high"}, 2.0)
    ]
    [(_, finished)] = found["nodecheck_bench_network_last_sweep_timestamp_seconds"]
    assert time.time() - finished == pytest.approx(600, abs=60)


def test_a_slow_link_warns_both_ends_naming_the_far_one(dgx: Node, tmp_path: Path) -> None:
    # One pair measured once: an inspection, never a drain, however sure the record says.
    for confidence in ("low", "high"):
        result = judge(dgx, tmp_path, record(SLOW_LINK, confidence=confidence))
        assert result.status is Status.WARN
        assert result.action is Action.INSPECT_HARDWARE  # the link's cable and ports
        assert "between this node and node-6" in result.remedy
        assert f"link {HOST} - node-6 slow" in result.summary
        assert "a link, not the node: not failing it" in result.summary
        assert metrics(result)["nodecheck_bench_network_verdict"] == [
            ({"culprit": "link", "peer": "node-6", "confidence": confidence}, 1.0)
        ]


def test_one_sweep_alone_never_fails_the_node(dgx: Node, tmp_path: Path) -> None:
    now = time.time()
    alone = judge(dgx, tmp_path, record(SLOW_NODE, finished_at=now))
    assert alone.status is Status.WARN
    assert "named by one sweep: the next that names it again fails the node" in alone.summary
    # The sweep before named it over gloo, or unsure, or too long before, or is another
    # node's: still one sweep.
    for before in (
        record(SLOW_NODE, finished_at=now - 86400).replace(
            '"backend": "nccl"', '"backend": "gloo"'
        ),
        record(SLOW_NODE, finished_at=now - 86400, confidence="low"),
        record(SLOW_NODE, finished_at=now - 4 * 86400),
        record(SLOW_NODE, finished_at=now - 86400, node="dgx-h100-02"),
        record(HEALTHY, finished_at=now - 86400),
    ):
        assert judge(dgx, tmp_path, None, before).status is Status.WARN, before


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (record(SLOW_NODE, status="warn"), ""),
        (record(SLOW_NODE, confidence="low"), "low confidence: not failing the node on it"),
        (NOBODY_NAMED % {"node": HOST, "finished_at": time.time()}, "no node or link named"),
    ],
)
def test_what_the_sweep_does_not_lay_at_this_node_only_warns(
    dgx: Node, tmp_path: Path, text: str, why: str
) -> None:
    result = judge(dgx, tmp_path, text)
    assert result.status is Status.WARN
    assert why in result.summary
    assert metrics(result)["nodecheck_bench_network_verdict"][0][1] == 1.0


def test_a_healthy_sweep_passes(dgx: Node, tmp_path: Path) -> None:
    result = judge(dgx, tmp_path, record(HEALTHY))
    assert result.status is Status.OK
    assert result.remedy == ""
    found = metrics(result)
    assert "nodecheck_bench_network_pair_bus_bandwidth_bytes_per_second" not in found
    assert found["nodecheck_bench_network_verdict"][0][1] == 0.0


def test_no_record_is_no_sweep_never_a_pass(dgx: Node, tmp_path: Path) -> None:
    result = judge(dgx, tmp_path, None)
    assert result.status is Status.SKIP
    assert result.details["cause"] == "never_swept"
    assert str(tmp_path / "network.json") in result.summary
    assert result.samples == ()


def test_the_default_state_directory_is_the_nodes_own(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """nodecheck's own state directory is a path of the node: a replica's is under its
    root filesystem, never this machine's."""
    node = copy_node(dgx)
    default = CheckConfig().bench.state_dir
    folder = node.root / str(default).lstrip("/")
    folder.mkdir(parents=True)
    (folder / "network.json").write_text(record(SLOW_NODE))
    (folder / "network.previous.json").write_text(named_before(time.time()))
    [result] = node.results("network_sweep")
    assert result.status is Status.FAIL, result.summary


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"version": "1"}', "no integer 'version'"),
        ('{"version": 0}', "version 0 is no version"),
        (record(SLOW_NODE).replace('"backend": "nccl", ', ""), "no 'backend'"),
        (record(SLOW_NODE).replace('"cv": 0.04', '"cv": "low"'), "whole_job.cv: expected a number"),
        (record(SLOW_NODE).replace('"busbw_p90": 3.2e8', '"busbw_p90": NaN'), "NaN"),
        (record(SLOW_NODE).replace('3.1e8, "slow"', '-3.1e8, "slow"'), "pairs[0]"),
        (record(SLOW_NODE).replace('"status": "fail"', '"status": "bad"'), "verdict.status"),
        (record(SLOW_LINK).replace('"peer": "node-6", "conf', '"peer": null, "conf'), "far end"),
        (record(SLOW_NODE).replace('"nodes": 8', '"nodes": 8, "nodes": 9'), "given twice"),
        (record(SLOW_NODE).replace('"ranks": 8', '"ranks": 4'), "4 ranks on 8 nodes"),
    ],
)
def test_a_damaged_record_cannot_determine_and_says_where(
    dgx: Node, tmp_path: Path, text: str, named: str
) -> None:
    result = judge(dgx, tmp_path, text)
    assert result.status is Status.ERROR
    assert result.details["cause"] == "damaged"
    assert named in result.summary, result.summary
    assert result.samples == ()


def test_fields_a_same_version_writer_added_are_ignored() -> None:
    text = record(SLOW_NODE).replace('"nodes": 8', '"nodes": 8, "hosts": ["a"]')
    text = text.replace('"cv": 0.04', '"cv": 0.04, "busbw_p50": 3.1e8')
    reading = parse_network_sweep(text, "network.json")
    assert reading.outcome == "read" and reading.sweep is not None
    assert reading.sweep.whole_job.cv == 0.04


def test_a_newer_record_is_its_own_outcome(dgx: Node, tmp_path: Path) -> None:
    result = judge(dgx, tmp_path, '{"version": 2, "node": "' + HOST + '", "anything": []}')
    assert result.status is Status.ERROR
    assert result.details["cause"] == "newer_version"
    assert "version 2, written by a newer nodecheck" in result.summary
    assert "upgrade" in result.remedy


def test_an_unreadable_record_names_why(dgx: Node, tmp_path: Path) -> None:
    (tmp_path / "network.json").write_text(" " * (RECORD_LIMIT + 1))
    result = judge(dgx, tmp_path, None)
    assert (result.status, result.details["cause"]) == (Status.ERROR, "unreadable")
    assert "larger than 1 MiB" in result.summary
    (tmp_path / "network.json").unlink()
    os.mkfifo(tmp_path / "network.json")  # never opened: a writer would block on it
    result = judge(dgx, tmp_path, None)
    assert (result.status, result.details["cause"]) == (Status.ERROR, "unreadable")
    assert "a FIFO, not a file" in result.summary


def test_another_nodes_record_is_refused(dgx: Node, tmp_path: Path) -> None:
    result = judge(dgx, tmp_path, record(SLOW_NODE, node="dgx-h100-02"))
    assert result.status is Status.SKIP
    assert result.details["cause"] == "another_node"
    assert "record of node dgx-h100-02, not of this node (dgx-h100-01): refused" in result.summary
    assert result.samples == ()  # none of its figures is this node's


def test_a_gloo_sweep_warns_and_never_fails(dgx: Node, tmp_path: Path) -> None:
    """gloo measured the host's sockets and CPUs, not the GPUs' rails."""
    text = record(SLOW_NODE).replace('"backend": "nccl"', '"backend": "gloo"')
    result = judge(dgx, tmp_path, text)
    assert result.status is Status.WARN
    assert "measured over gloo: not failing the node on it" in result.summary


def test_the_slurm_node_name_of_the_host_is_this_node(dgx: Node, tmp_path: Path) -> None:
    """The sweep names nodes as Slurm does; a fully qualified name is the same node."""
    result = judge(
        dgx,
        tmp_path,
        record(SLOW_NODE, node=f"{HOST.upper()}.cluster.example"),
        named_before(time.time()),
    )
    assert result.status is Status.FAIL


def test_an_old_record_judges_nothing_but_its_rates_age(dgx: Node, tmp_path: Path) -> None:
    four_days = time.time() - 4 * 86400
    result = judge(dgx, tmp_path, record(SLOW_NODE, finished_at=four_days))
    assert result.status is Status.SKIP
    assert result.details["cause"] == "stale"
    assert "the last sweep is 4.0 days old, past network_max_age (3.0 days)" in result.summary
    found = metrics(result)
    assert "nodecheck_bench_network_verdict" not in found
    assert "nodecheck_bench_network_pair_slow" not in found
    assert found["nodecheck_bench_network_last_sweep_timestamp_seconds"] == [({}, four_days)]
    assert len(found["nodecheck_bench_network_pair_bus_bandwidth_bytes_per_second"]) == 2
    # A site that sweeps weekly says so.
    week = judge(dgx, tmp_path, None, named_before(four_days), network_max_age_s=8 * 86400.0)
    assert week.status is Status.FAIL


def test_a_record_from_the_future_cannot_be_aged(dgx: Node, tmp_path: Path) -> None:
    result = judge(dgx, tmp_path, record(SLOW_NODE, finished_at=time.time() + 3600))
    assert (result.status, result.details["cause"]) == (Status.SKIP, "future")
    assert "in the future" in result.summary
    # Minutes of skew between the writer's clock and this node's are no future.
    skewed = record(SLOW_NODE, finished_at=time.time() + 60)
    assert judge(dgx, tmp_path, skewed, named_before(time.time())).status is Status.FAIL


def test_a_capture_carries_the_record_and_judges_it_alike(dgx: Node, tmp_path: Path) -> None:
    (tmp_path / "network.json").write_text(record(SLOW_NODE))
    (tmp_path / "network.previous.json").write_text(named_before(time.time()))
    config = CheckConfig(bench=BenchOptions(state_dir=tmp_path))
    check = load_checks()["network_sweep"]
    live = dgx.context(environ=CLEAN_ENVIRON, config=config)
    [live_run] = run_checks([check], live)
    captured = live.facts.capture()  # type: ignore[attr-defined]
    (tmp_path / "network.json").unlink()
    (tmp_path / "network.previous.json").unlink()
    judged = CheckContext(facts=loads(dumps(captured)), config=config)
    [judged_run] = run_checks([check], judged)
    assert judged_run.results == live_run.results
    assert judged_run.results[0].status is Status.FAIL
