"""The benchmarks, run for real on the CPU (real torch, real gloo), and their job safety
against the fake NVML. Each run starts a child process that imports torch (~2 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nodecheck.checks.bench.child.protocol import parse_line
from nodecheck.checks.bench.child_runner import run_child
from nodecheck.checks.bench.gate import ForeignProcessWatch, Refusal
from nodecheck.checks.bench.state import BenchState
from nodecheck.checks.config import BenchOptions, CheckConfig
from nodecheck.checks.node.processes import parse_ns_pids, parse_process_group
from nodecheck.checks.registry import load_benchmarks
from nodecheck.checks.result import Result, Status
from nodecheck.checks.runner import run_checks
from tests.conftest import Node
from tests.fixtures.nvml_scenarios import Scenario, dgx_healthy, modified


def idle_dgx() -> Scenario:
    """The healthy DGX with its job gone: every GPU idle."""
    scenario = dgx_healthy()
    scenario["gpus"][0]["processes"] = []
    scenario["gpus"][0]["utilization"] = {"gpu": 0, "memory": 0}
    return scenario


def bench(node: Node, name: str, tmp_path: Path, **options: object) -> list[Result]:
    settings = {"device": "cpu", "duration_s": 0.6, "idle_window_s": 0.0, **options}
    settings.setdefault("state_dir", tmp_path / "state")
    Path(str(settings["state_dir"])).mkdir(exist_ok=True)  # one it is given must exist
    bench_options = BenchOptions(**settings)  # type: ignore[arg-type]
    context = node.context(config=CheckConfig(bench=bench_options))
    [run] = run_checks([load_benchmarks()[name]], context)
    assert run.completed, run.results
    return run.results


def sample_values(result: Result, metric: str) -> dict[str, float]:
    return {
        ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())): s.value
        for s in result.samples
        if s.metric.name == metric
    }


@pytest.fixture
def cpu_node(build: Callable[..., Node]) -> Node:
    """No GPU and no driver: the gate has nothing to wait for."""
    return build("cpu-only")


def test_matmul_on_cpu(cpu_node: Node, tmp_path: Path) -> None:
    [first] = bench(cpu_node, "matmul", tmp_path, dtype="fp32")
    assert first.status is Status.OK, first
    tflops = first.details["tflops"]
    assert isinstance(tflops, float) and 0.001 < tflops < 50  # two CPU cores, fp32
    shapes = first.details["shapes"]
    assert isinstance(shapes, list) and len(shapes) == 2
    for shape in shapes:
        assert shape["iterations"] >= 3 and shape["median_tflops"] <= shape["max_tflops"]
    assert tflops == max(shape["median_tflops"] for shape in shapes)
    ran = "+".join("x".join(map(str, shape["shape"])) for shape in shapes)
    assert sample_values(first, "nodecheck_bench_matmul_flops_per_second") == {
        f"bus_id=,dtype=fp32,gpu=,model=cpu,shape={ran}": tflops * 1e12
    }
    assert first.details["baseline_tflops"] is None  # a first run has none
    # The second run is judged against the first: the same machine, about the same rate.
    [second] = bench(cpu_node, "matmul", tmp_path, dtype="fp32")
    assert second.details["baseline_tflops"] == tflops
    ratio = second.details["tflops"] / tflops  # type: ignore[operator]
    # Another process on a shared 2-core machine can take most of it from one run and not
    # the other (0.38x was seen): only a broken measure (a unit off by 1000) is this far.
    assert 0.1 < ratio < 10.0
    assert f"{ratio:.2f}x its baseline" in second.summary
    expected = Status.OK if ratio >= 0.9 else Status.WARN if ratio >= 0.8 else Status.FAIL
    assert second.status is expected


@pytest.mark.parametrize("processes", [2, 3])
def test_allreduce_with_gloo(cpu_node: Node, tmp_path: Path, processes: int) -> None:
    [result] = bench(cpu_node, "allreduce", tmp_path, processes=processes, duration_s=1.0)
    assert result.status is Status.OK, result
    assert result.details["world_size"] == processes and result.details["backend"] == "gloo"
    rows = result.details["payloads"]
    assert isinstance(rows, list) and [row["bytes"] for row in rows] == [1 << 20, 8 << 20, 32 << 20]
    factor = 2 * (processes - 1) / processes  # nccl-tests: busbw = algbw x 2(n-1)/n
    for row in rows:
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)
        assert 0 < row["busbw_worst_gbps"] <= row["busbw_gbps"]
        assert row["iterations"] >= 5 and row["busbw_cv"] >= 0
    busbw = sample_values(result, "nodecheck_bench_allreduce_bus_bandwidth_bytes_per_second")
    labels = f"algorithm=gloo,model=cpu,payload_bytes=33554432,ranks={processes}"
    assert busbw[labels] == pytest.approx(rows[-1]["busbw_gbps"] * 1e9)


def test_h2d_on_cpu(cpu_node: Node, tmp_path: Path) -> None:
    [result] = bench(cpu_node, "h2d", tmp_path, duration_s=0.4)
    assert result.status is Status.OK, result
    for direction in ("h2d", "d2h"):
        assert result.details[f"{direction}_bytes_per_second"] > 1e8  # type: ignore[operator]
    assert result.details["cpus"] == sorted(os.sched_getaffinity(0))


# -- isolation ------------------------------------------------------------------------


def test_child_past_its_deadline_is_killed(cpu_node: Node, tmp_path: Path) -> None:
    started = time.monotonic()
    [result] = bench(cpu_node, "matmul", tmp_path, duration_s=60, timeout_s=3.0)
    assert time.monotonic() - started < 15
    assert result.status is Status.ERROR
    assert result.summary == "matmul failed: did not finish within 3 s; killed"
    assert result.details["cause"] == "timeout"


def test_the_whole_process_group_goes(tmp_path: Path) -> None:
    """all_reduce's ranks are grandchildren: a deadline kills them with the launcher."""
    groups: list[int] = []
    spec = {"benchmark": "allreduce", "device": "cpu", "processes": 2, "duration_s": 60}
    outcome = run_child(spec, 4.0, on_start=groups.append)
    assert outcome.cause == "timeout"
    time.sleep(0.2)
    assert living_members(groups[0]) == []


def living_members(group: int) -> list[int]:
    """Processes of a process group that are not zombies (a killed rank whose parent,
    also killed, left it for init to reap is a zombie: dead, just not yet reaped)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == group and state != "Z":
            alive.append(int(entry.name))
    return alive


def test_a_crashed_child_is_an_error_with_its_cause() -> None:
    """The OOM killer's SIGKILL, as the parent sees it."""
    spec = {"benchmark": "matmul", "device": "cpu", "dtype": "fp32", "duration_s": 60}

    def kill_soon(pid: int) -> None:
        threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()

    outcome = run_child(spec, 30.0, on_start=kill_soon)
    assert outcome.cause == "crash"
    assert outcome.error == (
        "the benchmark process was killed by SIGKILL (out of memory? see the kernel log for "
        "the OOM killer)"
    )


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU")
def test_an_exception_in_the_child_is_an_error(dgx: Node, tmp_path: Path) -> None:
    """--device cuda where torch has no GPU: each GPU's exception comes back as its result."""
    results = bench(dgx, "matmul", tmp_path, device="cuda", gpus=(1, 2), force=True)
    assert [(r.status, r.subject) for r in results] == [
        (Status.ERROR, "gpu 0000:1a:00.0"),
        (Status.ERROR, "gpu 0000:3a:00.0"),
    ]
    for result in results:
        assert result.summary.startswith("matmul failed: ")
        assert "CUDA" in result.summary or "cuda" in result.summary


# -- job safety -----------------------------------------------------------------------


def test_a_job_arriving_stops_the_run(dgx: Node, tmp_path: Path) -> None:
    """A compute process appears on GPU 2 one second in: the CPU matmul (60 s) stops."""
    scenario = modified(
        idle_dgx(), gpu=2, processes=[{"pid": 31337, "used_memory": 1 << 30, "after_s": 1.0}]
    )
    node = dgx.with_scenario(scenario, tmp_path / "job.json")
    started = time.monotonic()
    [result] = bench(node, "matmul", tmp_path, duration_s=60)
    elapsed = time.monotonic() - started
    assert result.status is Status.SKIP
    assert result.summary == "not run: pid 31337 appeared on GPU 2 (0000:3a:00.0)"
    assert elapsed < 5  # the process shows at 1 s; the watch polls every 0.25 s
    assert sample_values(result, "nodecheck_bench_skips_total") == {"reason=foreign_process": 1}


def test_the_gate(dgx: Node, tmp_path: Path) -> None:
    """Healthy DGX: pid 5151 trains on GPU 0, so nothing runs, unless forced."""
    [busy] = bench(dgx, "h2d", tmp_path)
    assert busy.status is Status.SKIP
    assert busy.summary == "not run: GPU 0 (0000:18:00.0) is in use by pid 5151 (python3)"
    assert "--force" in busy.remedy
    [forced] = bench(dgx, "h2d", tmp_path, force=True, duration_s=0.3)
    assert forced.status is Status.OK, forced  # 5151 was there before: tolerated

    scenario = modified(idle_dgx(), gpu=3, utilization={"gpu": 40, "memory": 10})
    node = dgx.with_scenario(scenario, tmp_path / "util.json")
    [hot] = bench(node, "h2d", tmp_path, idle_window_s=0.3)
    assert hot.summary == "not run: GPU 3 (0000:3c:00.0) is 40% busy (limit 5%)"
    counts = sample_values(hot, "nodecheck_bench_skips_total")
    assert counts == {"reason=gpu_busy": 2}


def test_maintenance_file_and_lock(
    cpu_node: Node, copy_node: Callable[[Node], Node], tmp_path: Path
) -> None:
    node = copy_node(cpu_node)
    note = node.root / "run" / "nodecheck" / "maintenance"
    note.parent.mkdir(parents=True)
    note.write_text("firmware update, ticket OPS-1234\n")
    [result] = bench(node, "matmul", tmp_path)
    assert result.summary == (
        f"not run: maintenance file {note} is present: firmware update, ticket OPS-1234"
    )
    note.unlink()
    with BenchState(tmp_path / "state").exclusive_run("cpu-box"):
        [result] = bench(node, "matmul", tmp_path)
    assert result.status is Status.SKIP and "another benchmark is running" in result.summary


def test_a_rank_that_dies_fails_the_run_at_once(tmp_path: Path) -> None:
    """A payload no rank can allocate: every rank dies at start. The launcher sees it and
    fails the run with the exit status, instead of waiting in init until the deadline."""
    spec = {
        "benchmark": "allreduce",
        "device": "cpu",
        "processes": 2,
        "duration_s": 1,
        "payloads": [1 << 62],
    }
    outcome = run_child(spec, 60.0)
    assert outcome.cause == "exception" and outcome.seconds < 30
    assert outcome.error is not None and "exited with status 1" in outcome.error
    assert "RuntimeError" in outcome.stderr_tail or "Error" in outcome.stderr_tail


def test_the_child_dies_with_nodecheck(build: Callable[..., Node], tmp_path: Path) -> None:
    """SIGTERM to `nodecheck bench` (or Ctrl-C): the benchmark, in its own session and
    so out of reach of the terminal, goes too instead of holding the GPUs."""
    node = build("cpu-only")
    command = [sys.executable, "-m", "nodecheck.agent", *node.cli_args, "bench", "matmul"]
    command += ["--device", "cpu", "--duration", "60", "--state-dir", str(tmp_path)]
    cli = subprocess.Popen(command, env={**os.environ, **node.env})
    try:
        child = wait_for_child(cli.pid)
        cli.send_signal(signal.SIGTERM)
        # Generous: on a loaded 2-core machine the interpreter's exit alone can take seconds.
        cli.wait(60)
        deadline = time.monotonic() + 30
        while pid_alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(child)
    finally:
        cli.kill()


def wait_for_child(parent: int) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            if ppid == parent and b"nodecheck.checks.bench.child" in cmdline:
                return int(entry.name)
        time.sleep(0.05)
    raise AssertionError("the benchmark child never started")


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_the_watch_knows_its_own(dgx: Node, tmp_path: Path) -> None:
    """Real processes: one in the benchmark's process group (ours), one outside it."""
    ours = subprocess.Popen(["sleep", "30"], start_new_session=True)
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        scenario = idle_dgx()
        scenario["gpus"][1]["processes"] = [{"pid": ours.pid, "used_memory": 1 << 20}]
        node = dgx.with_scenario(scenario, tmp_path / "ours.json")
        live = Node(Path("/"), node.nvml_library, node.scenario)  # the real /proc
        stopped: list[Refusal] = []
        options = BenchOptions(watch_interval_s=0.05)
        watch = ForeignProcessWatch(live.context(), options, stopped.append)
        watch.start(ours.pid)
        time.sleep(0.3)
        watch.close()
        assert stopped == []

        scenario["gpus"][2]["processes"] = [{"pid": stranger.pid, "used_memory": 1 << 20}]
        node = dgx.with_scenario(scenario, tmp_path / "stranger.json")
        live = Node(Path("/"), node.nvml_library, node.scenario)
        watch = ForeignProcessWatch(live.context(), options, stopped.append)
        watch.start(ours.pid)
        time.sleep(0.3)
        watch.close()
        [refusal] = stopped
        assert refusal == Refusal(
            "foreign_process", f"pid {stranger.pid} (sleep) appeared on GPU 2 (0000:3a:00.0)"
        )
    finally:
        ours.kill()
        stranger.kill()
        ours.wait()
        stranger.wait()


def test_process_parsers() -> None:
    stat = "4242 (python3 (train)) S 1 4242 4242 0 -1 4194560 5 0 0 0"
    assert parse_process_group(stat) == 4242
    assert parse_ns_pids("Name:\tpython\nNSpid:\t812\t7\nNSsid:\t1\n") == [812, 7]
    assert parse_ns_pids("Name:\tpython\n") == []
    assert parse_line(b'{"progress": 0.5}') == {"progress": 0.5}
    assert parse_line(b"NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>") is None
    assert parse_line(b"[1, 2]") is None
