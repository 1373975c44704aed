"""Fault matrix, exposition: bad samples from a check or the root snapshot cost that
sample (left out, logged once, counted), never the scrape; the exposition always
passes `promtool check metrics`; a bad snapshot is an `error` naming the file."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodecheck.agent.daemon.exporter import CachedExposition, ResultCollector, make_registry
from nodecheck.agent.daemon.results_file import served_document
from nodecheck.agent.daemon.scheduler import ResultStore
from nodecheck.agent.daemon.snapshot import results_from_snapshot
from nodecheck.agent.web.server import serve
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import SCHEMA, NodeFacts, load
from nodecheck.checks.registry import Check
from nodecheck.checks.result import NODE, MetricSpec, Result, Sample, Status
from nodecheck.checks.runner import CheckRun
from tests.agent.test_daemon import free_port, wait_for
from tests.conftest import Node

NEEDS_PROMTOOL = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="Debian's prometheus package (make test installs it)"
)
GOOD = MetricSpec("nodecheck_fault_good_bytes", "gauge", "a good family", ("device",))


def promtool_problems(text: str) -> str:
    done = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return str(response.read().decode())


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        family.name: [(s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
    }


def dropped_count(text: str, check: str) -> float:
    for labels, value in families(text)["nodecheck_exposition_dropped_samples"]:
        if labels == {"check": check}:
            return value
    raise AssertionError(f"no nodecheck_exposition_dropped_samples for {check}")


def bad(name: str, kind: str = "gauge", labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, kind, "a bad family", labels)


# Each: what a check hands in that Prometheus cannot take as it is.
BAD_SAMPLES: list[tuple[str, Any]] = [
    ("a string value", Sample(GOOD, "12", {"device": "s"})),  # type: ignore[arg-type]
    ("a None value", Sample(GOOD, None, {"device": "n"})),  # type: ignore[arg-type]
    ("an int too large for a float", Sample(GOOD, 10**400, {"device": "big"})),
    ("an undeclared label", Sample(GOOD, 1.0, {"device": "u", "other": "x"})),
    ("a label value not UTF-8", Sample(GOOD, 1.0, {"device": "\udcff"})),
    ("a label value that is a list", Sample(GOOD, 1.0, {"device": ["x"]})),  # type: ignore[dict-item]
    ("the agent's own family", Sample(bad("nodecheck_check_status", labels=("check",)), 1.0, {})),
    ("the build info name", Sample(bad("nodecheck_build_info"), 1.0)),
    ("the good family with other labels", Sample(bad("nodecheck_fault_good_bytes"), 1.0)),
    (
        "the good family as a counter",
        Sample(MetricSpec("nodecheck_fault_good_bytes", "counter", "x", ("device",)), 1.0),
    ),
    ("a metric name with a space", Sample(bad("nodecheck_bad name"), 1.0)),
    ("camelCase", Sample(bad("nodecheck_badName"), 1.0)),
    ("a colon", Sample(bad("nodecheck_bad:name"), 1.0)),
    ("no nodecheck_ prefix", Sample(bad("node_load1"), 1.0)),
    ("a gauge ending in _total", Sample(bad("nodecheck_fault_total"), 1.0)),
    ("a counter without _total", Sample(bad("nodecheck_fault_events", "counter"), 1.0)),
    ("a _count suffix", Sample(bad("nodecheck_fault_count"), 1.0)),
    ("a non-base unit", Sample(bad("nodecheck_fault_milliseconds"), 1.0)),
    ("an abbreviated unit", Sample(bad("nodecheck_fault_ms"), 1.0)),
    ("the type in the name", Sample(bad("nodecheck_fault_gauge"), 1.0)),
    ("a histogram kind", Sample(bad("nodecheck_fault_seconds", "histogram"), 1.0)),
    ("a label name with a dash", Sample(bad("nodecheck_fault_a", labels=("bad-label",)), 1.0)),
    ("a reserved label name", Sample(bad("nodecheck_fault_b", labels=("__name__",)), 1.0)),
    ("the le label", Sample(bad("nodecheck_fault_c", labels=("le",)), 1.0)),
    ("a label name twice", Sample(bad("nodecheck_fault_d", labels=("x", "x")), 1.0)),
    ("no help", Sample(MetricSpec("nodecheck_fault_e", "gauge", ""), 1.0)),
    ("help not UTF-8", Sample(MetricSpec("nodecheck_fault_f", "gauge", "\ud800"), 1.0)),
    ("a negative counter", Sample(MetricSpec("nodecheck_fault_g_total", "counter", "x"), -1.0)),
    ("not a Sample at all", "nodecheck_fault_h 1"),
]


def stored(store: ResultStore, name: str, samples: list[Any]) -> None:
    def run(ctx: object) -> list[Result]:
        return []

    check = Check(name, run, 60.0, 10.0, "a fault")
    result = Result(Status.OK, "gpu 0000:01:00.0", "fine", samples=tuple(samples))
    store.put(CheckRun(check, [result], 0.01, True), 60.0)


@pytest.fixture
def exporter() -> Iterator[tuple[ResultStore, str]]:
    """A real server on loopback over a store the test fills."""
    store = ResultStore()
    registry = make_registry(ResultCollector(store, "test", lambda: True))
    port = free_port()
    server = serve(
        f"127.0.0.1:{port}", CachedExposition(registry, store, lambda: 0), dict, lambda: True
    )
    try:
        yield store, f"http://127.0.0.1:{port}/metrics"
    finally:
        server.shutdown()
        server.server_close()


@NEEDS_PROMTOOL
def test_bad_samples_cost_only_themselves_and_the_scrape_passes_promtool(
    exporter: tuple[ResultStore, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Every bad sample of the table is left out, counted in
    nodecheck_exposition_dropped_samples{check} and logged once; the good samples of the
    same check and of the others are scraped, and promtool finds nothing to say."""
    store, url = exporter
    good = [Sample(GOOD, 7.0, {"device": "a"}), Sample(GOOD, math.nan, {"device": "nan"})]
    stored(store, "fault_check", [sample for _, sample in BAD_SAMPLES] + good)
    stored(store, "other_check", [Sample(GOOD, 3.0, {"device": "b"})])
    with caplog.at_level("WARNING", logger="nodecheck.agent.daemon.exporter"):
        text = scrape(url)
        store.put(store.all()[0].run, 60.0)  # a new generation: rendered again
        assert dropped_count(scrape(url), "fault_check") == len(BAD_SAMPLES)
    assert promtool_problems(text) == ""
    series = families(text)
    assert sorted(labels["device"] for labels, _ in series["nodecheck_fault_good_bytes"]) == [
        "a",
        "b",
        "nan",
    ]
    assert dropped_count(text, "fault_check") == len(BAD_SAMPLES)
    assert dropped_count(text, "other_check") == 0
    assert [labels for labels, _ in series["nodecheck_build_info"]] == [
        {"version": "test", "python": sys.version.split()[0]}
    ]
    lines = [r.getMessage() for r in caplog.records if "event=sample_dropped" in r.getMessage()]
    assert len(lines) == len(BAD_SAMPLES)  # once each, though rendered twice
    assert all(line.startswith("event=sample_dropped check=fault_check metric=") for line in lines)


@NEEDS_PROMTOOL
def test_a_subject_not_utf8_keeps_its_status_series(exporter: tuple[ResultStore, str]) -> None:
    """A subject no UTF-8 can carry (a lone surrogate) is escaped in the status series,
    never the end of the scrape."""
    store, url = exporter

    def run(ctx: object) -> list[Result]:
        return []

    check = Check("fault_subject", run, 60.0, 10.0, "a fault")
    store.put(CheckRun(check, [Result(Status.FAIL, "gpu \udcff", "broken")], 0.0, True), 60.0)
    text = scrape(url)
    assert promtool_problems(text) == ""
    [(labels, value)] = [
        (labels, value)
        for labels, value in families(text)["nodecheck_check_status"]
        if labels["check"] == "fault_subject" and labels["status"] == "fail"
    ]
    assert labels["subject"] == "gpu \\udcff" and value == 1


def snapshot(parts: Any = None, taken_at: Any = None) -> dict[str, Any]:
    """A nodecheck.facts/v1 document, as `nodecheck snapshot` writes one."""
    return {
        "schema": SCHEMA,
        "nodecheck_version": "test",
        "roots": {},
        "taken_at": time.time() if taken_at is None else taken_at,
        "parts": {"hostname": {"value": "n"}} if parts is None else parts,
    }


def write_json(path: Path, document: Any) -> Path:
    path.write_text(json.dumps(document))
    return path


def made(make: Callable[[], None], path: Path) -> Path:
    make()
    return path


def hostname_probe(ctx: CheckContext) -> list[Result]:
    return [Result(Status.OK, NODE, f"the node is {ctx.hostname}")]


# A root check judging one part of the snapshot.
PROBE = Check("probe", hostname_probe, 60.0, 10.0, "a probe", needs=("hostname",), root=True)


def served(path: Path) -> list[Result]:
    """PROBE judged over the snapshot at `path`, by an agent that reads nothing itself."""
    return results_from_snapshot(PROBE, path, CheckContext(facts=NodeFacts(0.0, {})))


# Each: a snapshot file the agent must refuse, and what the error says.
BAD_SNAPSHOTS: list[tuple[str, Callable[[Path], Path], str]] = [
    ("empty", lambda p: (p.write_bytes(b""), p)[1], "not JSON"),
    ("not UTF-8", lambda p: (p.write_bytes(b'{"schema": "\xff"}'), p)[1], "not UTF-8 (byte 12)"),
    ("binary", lambda p: (p.write_bytes(os.urandom(64) + b"\0"), p)[1], "not"),
    ("a list", lambda p: write_json(p, []), "(no schema)"),
    ("another schema", lambda p: write_json(p, {**snapshot(), "schema": "x"}), "not a nodecheck"),
    (
        "the results an older nodecheck wrote",
        lambda p: write_json(p, {**snapshot(), "schema": "nodecheck.snapshot/v1"}),
        "is a 'nodecheck.snapshot/v1' document, not a nodecheck.facts/v1 capture",
    ),
    (
        "a newer schema",
        lambda p: write_json(p, {**snapshot(), "schema": "nodecheck.facts/v2"}),
        "newer than this nodecheck reads",
    ),
    (
        "taken_at NaN",
        lambda p: write_json(p, snapshot(taken_at=math.nan)),
        "taken_at: NaN is not a number",
    ),
    (
        "taken_at the codec's NaN",
        lambda p: write_json(p, snapshot(taken_at="NaN")),
        "taken_at: NaN is not a number",
    ),
    (
        "taken_at Infinity",
        lambda p: write_json(p, snapshot(taken_at=math.inf)),
        "taken_at: Infinity is not a finite number",
    ),
    ("taken_at negative", lambda p: write_json(p, snapshot(taken_at=-5)), "-5.0 is no time"),
    ("taken_at a string", lambda p: write_json(p, snapshot(taken_at="now")), "found a string"),
    ("taken_at true", lambda p: write_json(p, snapshot(taken_at=True)), "found a boolean"),
    ("taken_at null", lambda p: write_json(p, {**snapshot(), "taken_at": None}), "found null"),
    ("no parts", lambda p: write_json(p, {"schema": SCHEMA, "taken_at": 1.0}), "parts: expected"),
    ("parts a list", lambda p: write_json(p, snapshot([])), "parts: expected an object"),
    (
        "an unknown part",
        lambda p: write_json(p, snapshot({"bogus": {"value": 1}})),
        "parts.bogus: no such part",
    ),
    (
        "a part neither read nor unread",
        lambda p: write_json(p, snapshot({"hostname": 3})),
        'parts.hostname: expected {"value": ...} or {"unread": ...}',
    ),
    (
        "a damaged value",
        lambda p: write_json(p, snapshot({"hostname": {"value": 3}})),
        "parts.hostname.value: expected a string, found a number",
    ),
    (
        "JSON nested deeper than the parser goes",
        lambda p: (p.write_text("[" * 100_000), p)[1],
        "nested too deeply",
    ),
    ("huge", lambda p: (p.write_bytes(b" " * (17 << 20)), p)[1], "over 16777216 bytes"),
    ("a directory", lambda p: made(p.mkdir, p), "it is a directory"),
    ("a FIFO", lambda p: made(lambda: os.mkfifo(p), p), "it is a FIFO"),
    ("a symlink loop", lambda p: made(lambda: p.symlink_to(p), p), "Too many levels of symbolic"),
]


@pytest.mark.parametrize(
    ("fault", "make", "says"), BAD_SNAPSHOTS, ids=[fault for fault, _, _ in BAD_SNAPSHOTS]
)
def test_a_bad_snapshot_is_one_error_naming_the_file(
    tmp_path: Path, fault: str, make: Callable[[Path], Path], says: str
) -> None:
    """Not a capture, another or a newer schema, wrong types, NaN times, non-UTF-8, huge,
    a FIFO, a directory, a symlink loop: one `error` result naming the file and what is
    wrong, at once (a FIFO never blocks the check)."""
    path = make(tmp_path / "snapshot.json")
    outcome: list[list[Result]] = []
    reader = threading.Thread(target=lambda: outcome.append(served(path)), daemon=True)
    reader.start()
    reader.join(30)
    if not outcome and os.path.exists(path) and path.is_fifo():
        with open(path, "wb"):  # unblock the reader stuck in open()
            pass
    assert outcome, "results_from_snapshot did not return within 30 s"
    [result] = outcome[0]
    assert result.status is Status.ERROR
    assert result.summary.startswith(f"cannot read the snapshot {path}: "), result.summary
    assert says in result.summary, result.summary


def test_a_good_snapshot_is_judged(tmp_path: Path) -> None:
    """The same document undamaged: the check's own result, nothing else."""
    path = write_json(tmp_path / "snapshot.json", snapshot())
    assert [(r.status, r.summary) for r in served(path)] == [(Status.OK, "the node is n")]


def test_unreadable_snapshot_is_an_error(tmp_path: Path) -> None:
    """A snapshot the agent may not read: `error` naming the file."""
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    path = write_json(tmp_path / "snapshot.json", snapshot())
    path.chmod(0)
    [result] = served(path)
    assert result.status is Status.ERROR and "Permission denied" in result.summary


def test_a_snapshot_from_the_future_cannot_be_judged_fresh(tmp_path: Path) -> None:
    """taken_at a day ahead (a clock stepped back, a forged file): one `error` saying the
    age cannot be told, as for a stale one; nothing judged from its facts."""
    path = write_json(tmp_path / "snapshot.json", snapshot(taken_at=time.time() + 86400))
    [result] = served(path)
    assert result.status is Status.ERROR
    assert result.summary.startswith(f"the snapshot {path} is dated 24 h in the future (")
    assert result.summary.endswith("probe is not judged from it")


@NEEDS_PROMTOOL
def test_an_agent_serving_root_checks_from_a_snapshot_passes_promtool(
    build: Callable[..., Node], tmp_path: Path
) -> None:
    """The agent on the healthy DGX, serving the root checks from the faulty twin's
    snapshot (its job's NCCL_P2P_DISABLE=1, ACS on two switch ports): a real scrape
    passes promtool and carries the snapshot's failures with the checks' own families;
    the agent lives. (A snapshot carries facts, no samples: it cannot inject a family.)"""
    from tests.agent.test_cli import run

    faulty, node = build("dgx-h100-faulty"), build("dgx-h100")
    path = tmp_path / "snapshot.json"
    done = run(*faulty.cli_args, "snapshot", "--output", str(path), env=faulty.env)
    assert done.returncode == 0, done.stderr
    assert "runs" not in json.loads(path.read_text())  # facts, not results
    assert load(path).has("variables")
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(f'[agent]\nlisten = "127.0.0.1:{port}"\n')
    log_path = tmp_path / "agent.log"
    with open(log_path, "wb") as log_file:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nodecheck.agent",
                *node.cli_args,
                "agent",
                "--config",
                str(config),
                "--snapshot",
                str(path),
            ],
            env={**os.environ, **node.env},
            stderr=log_file,
        )
    url = f"http://127.0.0.1:{port}/metrics"
    try:

        def scraped() -> str | None:
            assert agent.poll() is None, log_path.read_text()
            try:
                text = scrape(url)
            except OSError:
                return None
            served_all = all(f'check="{name}"' in text for name in ("pcie_acs", "nccl_env"))
            return text if served_all else None

        text = wait_for(scraped, 60, "pcie_acs and nccl_env in the exposition")
        assert promtool_problems(text) == ""
        statuses = families(text)["nodecheck_check_status"]

        def failing(check: str) -> float:
            return sum(
                value
                for labels, value in statuses
                if labels["check"] == check and labels["status"] == "fail"
            )

        assert failing("nccl_env") >= 1  # the healthy node's own processes have none
        assert failing("pcie_acs") == 2
        assert "Traceback" not in log_path.read_text()
    finally:
        agent.terminate()
        agent.wait(10)


def test_results_that_cannot_be_rendered_are_a_500_not_a_dead_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A check whose details nest too deep for the JSON encoder: /results answers 500
    and logs one key=value line; /metrics and the connection survive."""
    store = ResultStore()
    nested: dict[str, Any] = {}
    for _ in range(5000):
        nested = {"a": nested}

    def run(ctx: object) -> list[Result]:
        return []

    check = Check("fault_details", run, 60.0, 10.0, "a fault")
    store.put(CheckRun(check, [Result(Status.OK, NODE, "fine", details=nested)], 0.0, True), 60.0)
    registry = make_registry(ResultCollector(store, "test", lambda: True))
    port = free_port()
    server = serve(
        f"127.0.0.1:{port}",
        CachedExposition(registry, store, lambda: 0),
        lambda: served_document(store, "host"),
        lambda: True,
    )
    try:
        with caplog.at_level("ERROR", logger="nodecheck.agent.daemon.exporter"):
            with pytest.raises(urllib.error.HTTPError) as raised:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/results", timeout=10)
            assert raised.value.code == 500
        assert [r.getMessage().split(" ", 1)[0] for r in caplog.records] == ["event=request_failed"]
        assert 'check="fault_details"' in scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
        server.server_close()


def test_a_snapshot_that_is_no_regular_file_is_never_opened(tmp_path: Path) -> None:
    """A FIFO (a writer blocked on it would be woken) or a device node (/dev/null) as the
    snapshot: one `error` naming it, without opening it (stat first: opening a device
    has side effects). (Before: opened, then refused.)"""
    from tests.faults.test_config import BlockedWriter

    fifo_path = tmp_path / "snapshot.json"
    writer = BlockedWriter(fifo_path)
    try:
        [result] = served(fifo_path)
        assert result.status is Status.ERROR
        assert result.summary == f"cannot read the snapshot {fifo_path}: it is a FIFO"
        assert not writer.opened.wait(2), "the FIFO was opened"
    finally:
        writer.release()
    [result] = served(Path("/dev/null"))
    assert result.summary == "cannot read the snapshot /dev/null: it is a character device"
