"""`nodecheck agent` as a real process on the faulty 8-GPU replica and the fake NVML,
scraped over HTTP, by promtool and by a real Prometheus."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodecheck.agent.breaker import SLURM_WITHHELD_FILE
from nodecheck.agent.daemon.scheduler import ResultStore, Scheduler
from nodecheck.checks.context import CheckContext
from nodecheck.checks.registry import Check
from nodecheck.checks.result import NODE, Result, Status
from tests.conftest import Node
from tests.fixtures.agent_process import start_agent
from tests.fixtures.nvml_scenarios import dgx_healthy, modified

ROOT = Path(__file__).resolve().parent.parent.parent
NEEDS_PROMETHEUS = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="Debian's prometheus package (make test installs it)",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@dataclass
class RunningAgent:
    process: subprocess.Popen[bytes]
    port: int
    config: Path
    textfile_dir: Path
    notifications: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def results(self) -> dict[str, Any]:
        status, body = get(f"{self.url}/results")
        assert status == 200
        document: dict[str, Any] = json.loads(body)
        return document

    def metrics(self) -> str:
        status, body = get(f"{self.url}/metrics")
        assert status == 200
        return body.decode()


def wait_for(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


CONFIG = """\
[agent]
listen = "127.0.0.1:{port}"
textfile_dir = "{textfile}"
state_dir = "{state}"
expected_gpus = 8
nvml_timeout = 2

[checks.gpu_xid]
interval = 3600     # only an NVML event can re-run it within the test

[checks.gpu_throttle]
interval = 1

[benchmarks]
enabled = {benchmarks}
device = "cpu"
duration = 0.5
idle_window = 0
"""


@contextlib.contextmanager
def running_agent(node: Node, work: Path, benchmarks: bool) -> Iterator[RunningAgent]:
    """`nodecheck agent` on `node`, serving, with systemd's notify socket and watchdog."""
    port = free_port()
    textfile = work / "textfile"
    textfile.mkdir(parents=True)
    (work / "state").mkdir()  # the folders it is given must exist
    config = work / "config.toml"
    config.write_text(
        CONFIG.format(
            port=port,
            textfile=textfile,
            state=work / "state",
            benchmarks="true" if benchmarks else "false",
        )
    )
    notify_path = work / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify_path))
    env = {**os.environ, **node.env, "NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "2000000"}
    # Its log goes to a file: a pipe nobody reads would block the agent once it filled.
    log = work / "agent.log"
    process = start_agent(node.cli_args, config, env, log)
    running = RunningAgent(process, port, config, textfile)

    def collect() -> None:
        while True:
            try:
                running.notifications.append(listener.recv(4096).decode())
            except OSError:
                return

    threading.Thread(target=collect, daemon=True).start()
    try:

        def serving() -> bool:
            if process.poll() is not None:
                pytest.fail(f"the agent died: {log.read_text()}")
            try:
                return get(f"{running.url}/healthz")[0] == 200
            except OSError:
                return False

        wait_for(serving, 60, "the agent to serve")
        yield running
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        listener.close()


@pytest.fixture(scope="module")
def agent(build: Callable[..., Node]) -> Iterator[RunningAgent]:
    """The agent on the DGX where GPU 3 falls off the bus (XID 79) 3 s after the agent's
    XID listener registered it: timed from the registration, not from NVML's start, since
    a GPU lost before it is registered can no longer be (GPU_IS_LOST), its XID would never
    be listened to, and gpu_xid (hourly) would not run again on a loaded machine.
    It runs no benchmark: a node with a lost GPU is never benchmarked, and a benchmark
    that had to finish before the loss would race it on a loaded machine."""
    work = Path(tempfile.mkdtemp(prefix="nodecheck-agent-"))
    scenario = modified(
        dgx_healthy(),
        gpu=3,
        timed_from="registration",
        xids=[{"xid": 79, "after_s": 3}],
        lost_after_s=3,
    )
    node = build("dgx-h100").with_scenario(scenario, work / "scenario.json")
    try:
        with running_agent(node, work / "agent", benchmarks=False) as running:
            yield running
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def healthy_agent(build: Callable[..., Node]) -> Iterator[RunningAgent]:
    """The agent on the healthy DGX, idle, with the benchmarks on (on the CPU): its
    benchmark series appear whenever the benchmarks are done, however slow the machine."""
    work = Path(tempfile.mkdtemp(prefix="nodecheck-healthy-agent-"))
    scenario = dgx_healthy()
    scenario["gpus"][0].update(processes=[], utilization={"gpu": 0, "memory": 0})
    node = build("dgx-h100").with_scenario(scenario, work / "scenario.json")
    try:
        with running_agent(node, work / "agent", benchmarks=True) as running:
            yield running
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_serves_every_check_and_tells_systemd(healthy_agent: RunningAgent) -> None:
    agent = healthy_agent
    ready = wait_for(lambda: [n for n in agent.notifications if "READY=1" in n], 60, "READY=1")
    assert "STATUS=" in ready[0]
    checks = {result["check"] for result in agent.results()["results"]}
    assert {"gpu_count", "gpu_xid", "pcie_acs", "nccl_env"} <= checks
    assert all(isinstance(r["age_seconds"], float) for r in agent.results()["results"])
    wait_for(lambda: any(n == "WATCHDOG=1" for n in agent.notifications), 30, "a watchdog ping")
    text = agent.metrics()
    assert 'nodecheck_check_status{check="gpu_count",status="ok",subject="node"} 1.0' in text
    assert "nodecheck_gpu_temperature_celsius{" in text
    assert "nodecheck_build_info{" in text


def test_an_xid_event_is_judged_at_once(agent: RunningAgent) -> None:
    """gpu_xid's interval is an hour; the NVML event brings it forward."""

    def failing() -> list[dict[str, Any]]:
        return [
            r
            for r in agent.results()["results"]
            if r["check"] == "gpu_xid"
            and r["subject"] == "gpu 0000:3c:00.0"
            and r["status"] == "fail"
        ]

    [result] = wait_for(failing, 60, "gpu_xid to fail GPU 3")
    assert "XID 79" in result["summary"] and result["remedy"] == "drain the node and reboot it"
    others = [
        r
        for r in agent.results()["results"]
        if r["check"] == "gpu_xid" and r["subject"] != "gpu 0000:3c:00.0"
    ]
    assert others and {r["status"] for r in others} == {"ok"}


@NEEDS_PROMETHEUS
@pytest.mark.parametrize("which", ["agent", "healthy_agent"])
def test_metrics_lint_clean(request: pytest.FixtureRequest, which: str) -> None:
    """Both agents: one with a lost GPU, one with the benchmarks' series."""
    agent: RunningAgent = request.getfixturevalue(which)
    done = subprocess.run(
        ["promtool", "check", "metrics"],
        input=agent.metrics(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


def test_a_slurm_drain_the_breaker_holds_back_is_exported(agent: RunningAgent) -> None:
    """`slurm health-check` notes in the state folder whether the circuit breaker withheld
    its drain (agent/breaker.py): the agent exports what the last run noted; a node where
    health-check never ran has no Slurm series."""
    state = agent.config.parent / "state"
    series = 'nodecheck_remediation_withheld{integration="slurm"}'
    assert series not in agent.metrics()
    note = state / SLURM_WITHHELD_FILE
    note.write_text('{"withheld": true, "at": 0, "why": "the circuit breaker is open"}\n')
    wait_for(lambda: f"{series} 1.0" in agent.metrics(), 60, "the withheld drain exported")
    note.write_text('{"withheld": false, "at": 0, "why": ""}\n')
    wait_for(lambda: f"{series} 0.0" in agent.metrics(), 60, "the cleared drain exported")
    note.unlink()


def test_textfile(agent: RunningAgent) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    path = agent.textfile_dir / "nodecheck.prom"
    wait_for(path.exists, 60, "the textfile")
    names = {family.name for family in text_string_to_metric_families(path.read_text())}
    assert {"nodecheck_check_status", "nodecheck_build_info"} <= names
    assert not [p for p in agent.textfile_dir.iterdir() if p.name.startswith(".")]


@pytest.fixture(scope="module")
def prometheus(agent: RunningAgent, healthy_agent: RunningAgent) -> Iterator[str]:
    """A real Prometheus scraping both agents every second, with the shipped alert rules."""
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus package (make test installs it)")
    work = Path(tempfile.mkdtemp(prefix="nodecheck-prometheus-"))
    port = free_port()
    config = work / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{ROOT / 'monitoring' / 'alerts.yml'}']\n"
        "scrape_configs:\n"
        "  - job_name: nodecheck\n    static_configs: [{targets: ["
        f"'127.0.0.1:{agent.port}', '127.0.0.1:{healthy_agent.port}']}}]\n"
    )
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def query(prometheus: str, expr: str) -> list[Any]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        status, body = get(url, 2)
    except OSError:
        return []
    result: list[Any] = json.loads(body)["data"]["result"] if status == 200 else []
    return result


def test_a_real_prometheus_scrapes_it(agent: RunningAgent, prometheus: str) -> None:
    failing = (
        'nodecheck_check_status{check="gpu_xid",subject="gpu 0000:3c:00.0",status="fail"} == 1'
    )
    [series] = wait_for(lambda: query(prometheus, failing), 60, "Prometheus to see GPU 3 failing")
    assert series["metric"]["job"] == "nodecheck"
    assert agent.process.poll() is None  # and the agent still serves


def test_the_alert_names_gpu_3_and_only_gpu_3(agent: RunningAgent, prometheus: str) -> None:
    def firing() -> list[dict[str, Any]]:
        try:
            status, body = get(f"{prometheus}/api/v1/alerts", 2)
        except OSError:
            return []
        alerts: list[dict[str, Any]] = json.loads(body)["data"]["alerts"] if status == 200 else []
        return [a for a in alerts if a["state"] == "firing"]

    def xid_alert() -> list[dict[str, Any]]:
        return [
            a
            for a in firing()
            if a["labels"]["alertname"] == "NodecheckRebootNeeded"
            and a["labels"]["check"] == "gpu_xid"
        ]

    # XID 79: NVIDIA's catalog asks for a reboot, and gpu_xid's verdict says so.
    [alert] = wait_for(xid_alert, 60, "NodecheckRebootNeeded to fire for gpu_xid")
    assert alert["labels"]["subject"] == "gpu 0000:3c:00.0"
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["description"].startswith("Drain 127.0.0.1:")
    about_gpus = {a["labels"].get("subject") for a in firing()} - {None, "node"}
    assert about_gpus == {"gpu 0000:3c:00.0"}  # the other seven GPUs stay healthy


def test_every_dashboard_panel_has_data(agent: RunningAgent, prometheus: str) -> None:
    dashboard = json.loads((ROOT / "monitoring" / "grafana" / "nodecheck.json").read_text())
    assert dashboard["uid"] == "nodecheck-node"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance"} <= variables
    exprs = [
        (panel["title"], target["expr"].replace("$instance", ".*"))
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]
    assert len(exprs) >= 8
    for title, expr in exprs:
        wait_for(functools.partial(query, prometheus, expr), 60, f"data for panel {title!r}")


def test_reload_keeps_the_old_config_when_the_new_one_is_bad(agent: RunningAgent) -> None:
    good = agent.config.read_text()
    try:
        agent.config.write_text(good + "\n[checks.nope]\n")
        agent.process.send_signal(signal.SIGHUP)
        wait_for(
            lambda: "nodecheck_config_last_reload_successful 0.0" in agent.metrics(), 60, "reload"
        )
        assert get(f"{agent.url}/healthz")[0] == 200
    finally:
        agent.config.write_text(good)
    agent.process.send_signal(signal.SIGHUP)
    wait_for(lambda: "nodecheck_config_last_reload_successful 1.0" in agent.metrics(), 60, "fix")


def test_sigterm_stops_it_promptly(agent: RunningAgent) -> None:
    """Last in this module: it ends the agent. docs/agent.md promises 2 s; the bound asserted
    is generous, since on a loaded machine the interpreter's exit alone can take seconds
    (an exit that hangs on a thread still fails it)."""
    started = time.monotonic()
    agent.process.send_signal(signal.SIGTERM)
    assert agent.process.wait(30) == 0
    assert time.monotonic() - started < 15
    assert any("STOPPING=1" in n for n in agent.notifications)
    # NVML let go of on the way out (a driver upgrade waits for every client to).
    assert "event=nvml_released outcome='closed'" in (agent.config.parent / "agent.log").read_text()


def test_a_hung_check_stalls_nothing() -> None:
    """One check never returns; the other keeps its schedule, and the hung one is reported
    once its timeout passes and is not started again meanwhile."""
    calls = {"quick": 0, "hung": 0}
    release = threading.Event()

    def quick(ctx: CheckContext) -> list[Result]:
        calls["quick"] += 1
        return [Result(Status.OK, NODE, "fine")]

    def hung(ctx: CheckContext) -> list[Result]:
        calls["hung"] += 1
        release.wait(30)
        return [Result(Status.OK, NODE, "late")]

    store = ResultStore()
    scheduler = Scheduler(
        [(Check("quick", quick, 0.1, 5, ""), 0.1), (Check("hung", hung, 0.1, 0.5, ""), 0.1)],
        CheckContext,
        store,
    )
    scheduler.start()

    def reported() -> dict[str, Any] | None:
        stored = {s.run.check.name: s.run for s in store.all()}
        return stored if calls["quick"] >= 5 and "hung" in stored else None

    try:
        stored = wait_for(reported, 60, "five quick runs and the hung check's report")
        assert calls["hung"] == 1  # not started again while the first run is stuck
    finally:
        scheduler.stop()
        release.set()
    assert stored["hung"].results[0].summary == "check hung did not finish within 0.5 s"


def test_the_journal_gets_a_line_per_status_change(caplog: pytest.LogCaptureFixture) -> None:
    """The agent logs at info by default: a check's run is an info line when its status
    changed (ok, ok, fail, fail, ok: three lines), every other run only at debug."""
    statuses = [Status.OK, Status.OK, Status.FAIL, Status.FAIL, Status.OK]
    calls = {"n": 0}

    def flipping(ctx: CheckContext) -> list[Result]:
        status = statuses[min(calls["n"], len(statuses) - 1)]
        calls["n"] += 1
        return [Result(status, NODE, status.value)]

    store = ResultStore()
    scheduler = Scheduler([(Check("flipping", flipping, 0.05, 5, ""), 0.05)], CheckContext, store)
    caplog.set_level("DEBUG", logger="nodecheck.agent.daemon.scheduler")
    scheduler.start()
    try:
        wait_for(lambda: calls["n"] >= len(statuses) + 1, 60, "six runs")
    finally:
        scheduler.stop()
    runs = [r for r in caplog.records if "event=check check=flipping" in r.getMessage()]
    info = [r.getMessage().split()[2] for r in runs if r.levelname == "INFO"]
    assert info[:3] == ["status=ok", "status=fail", "status=ok"], info
    assert len(info) == 3
    assert len(runs) > len(info)


def test_a_failing_turn_does_not_end_the_scheduler(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Something in the scheduler's own bookkeeping raises once (here: listing the stuck
    checks): one event=scheduler_loop_failed line, and the loop, its heartbeat (what the
    watchdog pings on) and the checks go on."""
    import nodecheck.agent.daemon.scheduler as scheduler_module

    real = scheduler_module._stuck_checks
    failures = {"left": 1}

    def flaky() -> set[str]:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("thread list changed size")
        return real()

    monkeypatch.setattr(scheduler_module, "_stuck_checks", flaky)
    calls = {"n": 0}

    def quick(ctx: CheckContext) -> list[Result]:
        calls["n"] += 1
        return [Result(Status.OK, NODE, "fine")]

    scheduler = Scheduler([(Check("quick", quick, 0.05, 5, ""), 0.05)], CheckContext, ResultStore())
    scheduler.start()
    try:
        wait_for(lambda: calls["n"] >= 3, 60, "three runs after the failed turn")
        assert scheduler.alive
    finally:
        scheduler.stop()
    assert failures["left"] == 0
    assert any("event=scheduler_loop_failed" in r.getMessage() for r in caplog.records)


def test_a_reload_keeps_the_schedule() -> None:
    """A new scheduler (SIGHUP) takes over the due times: the daily benchmark is not rerun
    by every reload."""

    def quick(ctx: CheckContext) -> list[Result]:
        return [Result(Status.OK, NODE, "fine")]

    daily = Check("daily", quick, 86400, 5, "")
    old = Scheduler([(daily, 86400)], CheckContext, ResultStore())
    old.jobs["daily"].due = time.monotonic() + 86000
    new = Scheduler([(daily, 86400)], CheckContext, ResultStore(), previous=old)
    assert new.jobs["daily"].due == old.jobs["daily"].due
