"""Fault matrix, the command line: no input makes `nodecheck` print a traceback or
"internal error", hang, or take NaN, infinity or a 20-digit count as a value. Each bad
invocation is a usage error (exit 2) naming the option or the file."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.agent.test_cli import NODECHECK, run
from tests.checks.test_bench import pid_alive, wait_for_child
from tests.conftest import CLEAN_ENVIRON, SCENARIO_VARIABLE, Node
from tests.fixtures.agent_process import start_agent

MFU = ["mfu", "--seqlen", "4096", "--global-batch", "1024", "--gpu-model", "H100-SXM"]
MFU_OK = ["--params", "70e9", "--iter-time", "12.5", "--gpus", "512"]


def mfu(**changes: str) -> list[str]:
    """`nodecheck mfu` with one figure changed (--params=..., as given)."""
    figures = dict(zip(MFU_OK[::2], MFU_OK[1::2], strict=True))
    figures.update({f"--{name.replace('_', '-')}": value for name, value in changes.items()})
    return [*MFU, *(part for pair in figures.items() for part in pair)]


# (argv, what stderr must name). @FIFO@, @NOT_UTF8@, @DEEP@ are replaced by real files.
BAD_INVOCATIONS: list[tuple[list[str], str]] = [
    (["--nvml-timeout", "nan", "check"], "--nvml-timeout"),
    (["--nvml-timeout", "inf", "check"], "--nvml-timeout"),
    (["--nvml-timeout", "-1", "check"], "--nvml-timeout"),
    (["--nvml-timeout", "1e999", "check"], "--nvml-timeout"),
    (["check", "--nvml-timeout", "nan"], "--nvml-timeout"),
    (["--nvml-library", "@FIFO@", "check"], "@FIFO@: a FIFO, not a regular file"),
    (["--nvml-library", "/dev/null", "check"], "/dev/null: a character device"),
    (["--sysfs-root", "/dev/null", "check"], "--sysfs-root /dev/null: not a directory"),
    (["--procfs-root", "/bin/ls", "check"], "--procfs-root"),
    (["check", "--expected-gpus", "99999999999"], "--expected-gpus"),
    (["check", "--expected-gpus", "-1"], "--expected-gpus"),
    (["check", "--expected-gpus", "8.5"], "--expected-gpus"),
    (["check", "--kernel-log", "@FIFO@"], "@FIFO@: a FIFO, not a log file or /dev/kmsg"),
    (["check", "--kernel-log", "/"], "--kernel-log"),
    (["check", "--only", "nope"], "unknown check nope"),
    (["check", "--only", "cpu,nope"], "unknown check nope (checks: cpu, gpu_count"),
    (["check", "--only", ""], "--only"),
    (["check", "--skip", "cpu,,numa"], "--skip"),
    (
        ["check", "--only", "gpu_count", "--skip", "gpu_count"],
        "--only gpu_count --skip gpu_count: no check left to run",
    ),
    (["check", "--only", "cpu,numa", "--skip", "numa", "--skip", "cpu"], "no check left to run"),
    (mfu(params="nan"), "--params"),
    (mfu(params="inf"), "--params"),
    (mfu(params="1e999"), "--params"),
    (mfu(params="0"), "--params"),
    (mfu(iter_time="nan"), "--iter-time"),
    (mfu(iter_time="0"), "--iter-time"),
    (mfu(iter_time="1e-300"), "--iter-time"),
    (mfu(iter_time="-inf"), "--iter-time"),
    (mfu(gpus="99999999999999"), "--gpus"),
    ([*mfu(), "--seqlen", "99999999999999999999"], "--seqlen"),
    ([*mfu(), "--global-batch", "0"], "--global-batch"),
    (
        [*mfu(), "--gpu-model", "H999"],
        "--gpu-model H999: no peak rate known for this model (known: GH200, H100-PCIe, H100-SXM",
    ),
    ([*mfu(), "--gpu-model", "V100"], "--dtype bf16: the V100 has no dense bf16 peak"),
    (["bench", "matmul", "--duration", "nan"], "--duration"),
    (["bench", "matmul", "--duration", "inf"], "--duration"),
    (["bench", "matmul", "--idle-window", "nan"], "--idle-window"),
    (["bench", "matmul", "--warn-below", "nan"], "--warn-below"),
    (["bench", "matmul", "--fail-below", "nan"], "--fail-below"),
    (["bench", "matmul", "--warn-below", "0"], "--warn-below"),
    (["bench", "matmul", "--memory-fraction", "nan"], "--memory-fraction"),
    (["bench", "matmul", "--gpus", "-1"], "--gpus"),
    (["bench", "matmul", "--gpus", "99999"], "--gpus"),
    (["bench", "matmul", "--gpus", "\u0661"], "--gpus"),
    (["bench", "matmul", "--gpus", ","], "--gpus"),
    (["bench", "matmul", "--state-dir", "/bin/ls"], "--state-dir"),
    (["tune", "--nodes", "99999999999"], "--nodes"),
    (["tune", "--local-rank", "99999999999"], "--local-rank"),
    (["exec", "--local-rank", "99999999999", "--", "true"], "--local-rank"),
    (["agent", "--listen", "garbage"], "--listen"),
    (["agent", "--listen", ":99999"], "--listen"),
    (["agent", "--listen", ":0"], "--listen"),
    (["agent", "--listen", "a:b:1"], "--listen"),
    (["agent", "--listen", "[::1:1"], "--listen"),
    (["agent", "--snapshot", "@FIFO@"], "@FIFO@: a FIFO, not a snapshot file"),
    (["agent", "--snapshot", "/"], "--snapshot"),
    (["agent", "--config", "/dev/zero"], "/dev/zero: a character device"),
    (["agent", "--config", "@FIFO@"], "@FIFO@: a FIFO, not a regular file"),
    (["agent", "--config", "@NOT_UTF8@"], "@NOT_UTF8@:2: not UTF-8 text"),
    (["agent", "--config", "@DEEP@"], "@DEEP@:1: nested too deeply"),
    (["config", "show", "--config", "/dev/zero"], "/dev/zero: a character device"),
    (["config", "show", "--config", "@FIFO@"], "@FIFO@: a FIFO"),
    (["config", "check", "/bin/ls"], "/bin/ls:1: not UTF-8 text"),
    (["config", "check", "@FIFO@"], "@FIFO@: a FIFO"),
    (["config", "check", "@DEEP@"], "@DEEP@:1: nested too deeply"),
    (["config", "check", "@NOT_UTF8@"], "@NOT_UTF8@:2: not UTF-8"),
    (["config", "check", "/nonexistent.toml"], "/nonexistent.toml: no such file"),
    (["snapshot", "--output", "/"], "--output"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    work = tmp_path_factory.mktemp("bad-files")
    fifo = work / "fifo"
    os.mkfifo(fifo)
    not_utf8 = work / "latin1.toml"
    not_utf8.write_bytes(b"# a comment\n# \xe9quipe\n")
    deep = work / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    yield {"@FIFO@": str(fifo), "@NOT_UTF8@": str(not_utf8), "@DEEP@": str(deep)}


@pytest.mark.parametrize(
    ("argv", "named"), BAD_INVOCATIONS, ids=[" ".join(argv) for argv, _ in BAD_INVOCATIONS]
)
def test_a_bad_invocation_is_a_usage_error_naming_what_is_wrong(
    build: Callable[..., Node], files: dict[str, str], argv: list[str], named: str
) -> None:
    """Exit 2; stderr names the option or the file; no traceback, no "internal error";
    nothing on stdout. On the CPU-only replica, so a command that wrongly runs is quick."""
    node = build("cpu-only")
    for placeholder, path in files.items():
        argv = [path if arg == placeholder else arg for arg in argv]
        named = named.replace(placeholder, path)
    done = run(*node.cli_args, *argv, env=node.env)
    assert done.returncode == 2, (done.returncode, done.stdout[-300:], done.stderr[-500:])
    assert named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert done.stdout == ""


# Output paths (checks/node/output.py): a command writing a file is given these.
OUTPUT_OPTIONS = {"capture": ["capture", "-o"], "snapshot": ["snapshot", "--output"]}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a Unix socket's address has at most 107 bytes (unix(7)),
    and a parametrized test's tmp_path can be longer."""
    with tempfile.TemporaryDirectory(prefix="nc-") as folder:
        yield Path(folder)


def put_in_place(kind: str, path: Path, stack: contextlib.ExitStack) -> str:
    """Make `kind` at `path`; what the refusal must say."""
    if kind == "a FIFO with no reader":
        os.mkfifo(path)
        return "a FIFO with no reader"
    if kind == "a dangling symlink":
        path.symlink_to(path.parent / "gone.json")
        return f"a symlink to {path.parent / 'gone.json'}, which does not exist"
    if kind == "a symlink loop":
        path.symlink_to(path.name)
        return "a symlink loop"
    if kind == "a socket":
        listener = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        listener.bind(str(path))
        return "a socket, not a file nodecheck may replace or write through"
    raise AssertionError(kind)


@pytest.mark.parametrize("command", list(OUTPUT_OPTIONS))
@pytest.mark.parametrize(
    "kind", ["a FIFO with no reader", "a dangling symlink", "a symlink loop", "a socket"]
)
def test_an_output_path_that_is_no_file_is_refused_and_left_as_it_was(
    build: Callable[..., Node], short_dir: Path, command: str, kind: str
) -> None:
    """capture -o and snapshot --output replaced a FIFO, a symlink or a socket with a
    regular file and said they succeeded. Now: exit 2 naming the path and why, at once
    (a FIFO no one reads is not waited on), the thing in place untouched."""
    node = build("cpu-only")
    path = short_dir / "out"
    with contextlib.ExitStack() as stack:
        says = put_in_place(kind, path, stack)
        before = os.lstat(path)
        done = run(*node.cli_args, *OUTPUT_OPTIONS[command], str(path), env=node.env)
        after = os.lstat(path)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.startswith(f"nodecheck: cannot write {path}: "), done.stderr
    assert says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert sorted(p.name for p in short_dir.iterdir()) == ["out"]


@pytest.mark.parametrize(
    "argv",
    [
        [*OUTPUT_OPTIONS["capture"], "@MISSING@/capture.json"],
        [*OUTPUT_OPTIONS["snapshot"], "@MISSING@/snapshot.json"],
        ["bench", "h2d", "--device", "cpu", "--idle-window", "0", "--state-dir", "@MISSING@"],
    ],
    ids=["capture -o", "snapshot --output", "bench --state-dir"],
)
def test_an_output_folder_that_does_not_exist_is_refused_not_created(
    build: Callable[..., Node], tmp_path: Path, argv: list[str]
) -> None:
    """snapshot --output and bench --state-dir made the folders they were given, anywhere
    (as root); capture -o refused. One rule now: exit 2 naming the folder, nothing made."""
    node = build("cpu-only")
    missing = tmp_path / "no" / "such"
    done = run(
        *node.cli_args, *(arg.replace("@MISSING@", str(missing)) for arg in argv), env=node.env
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert f"{missing}: no such directory" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_no_arguments_shows_the_help_and_succeeds() -> None:
    """Today: exit 2 (click's missing-command error)."""
    done = run()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: nodecheck") and "Commands:" in done.stdout


def test_python_dash_m_nodecheck_runs_the_command() -> None:
    """`nodecheck` is a namespace package; its __main__ comes from main/ (pyproject)."""
    done = subprocess.run(
        [sys.executable, "-m", "nodecheck", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",  # not the checkout: the installed package
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nodecheck, version ")


@pytest.mark.parametrize(
    "argv",
    [
        ["config", "show", "--config", "CONFIG", "--log-level", "debug"],
        ["config", "--log-level", "info", "show", "--config", "CONFIG"],
        ["--log-level", "error", "config", "show", "--config", "CONFIG"],
        ["config", "check", "CONFIG", "--log-level", "debug"],
    ],
)
def test_config_commands_take_the_global_options(tmp_path: Path, argv: list[str]) -> None:
    """docs/commands.md says every command takes --log-level; today config show|check refuse it."""
    config = tmp_path / "c.toml"
    config.write_text("[agent]\nexpected_gpus = 8\n")
    done = run(*[str(config) if arg == "CONFIG" else arg for arg in argv])
    assert done.returncode == 0, done.stderr
    assert "expected_gpus = 8" in done.stdout or done.stdout == f"{config}: ok\n"


def test_an_impossible_mfu_says_so() -> None:
    """An iteration 1000 times too fast: HFU 37108 %. Today printed without a word."""
    done = run(*mfu(iter_time="0.0125"))
    assert done.returncode == 1, done.stderr
    assert "MFU: 27831.3% of the H100 SXM's 989 TFLOPS" in done.stdout
    assert "HFU: 37108.4% (with the recomputation)" in done.stdout
    assert done.stderr == (
        "nodecheck: HFU 37108%: impossible, above the H100 SXM's peak; check --params, "
        "--global-batch, --seqlen, --iter-time and --gpus\n"
    )
    as_json = run(*mfu(iter_time="0.0125"), "--json")
    assert as_json.returncode == 1

    def no_nan(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    document = json.loads(as_json.stdout, parse_constant=no_nan)
    assert document["plausible"] is False and "impossible" in document["warning"]
    fine = json.loads(run(*mfu(), "--json").stdout, parse_constant=no_nan)
    assert fine["plausible"] is True and fine["warning"] is None


def test_mfu_help_names_its_source() -> None:
    """Not "the seed's formula": the book and the chapter."""
    done = run("mfu", "--help")
    assert done.returncode == 0
    assert "seed" not in done.stdout
    assert "Machine Learning Engineering" in done.stdout and "stas00/ml-engineering" in done.stdout


def test_an_exception_in_the_log_stays_on_one_line() -> None:
    """A log record with an exception, and a thread that dies of one: each one key=value
    line (journald splits a multi-line traceback into unrelated entries)."""
    program = (
        "import logging, threading\n"
        "from nodecheck.agent.logs import configure_logging\n"
        "configure_logging('debug')\n"
        "try:\n"
        "    raise OSError('disk\\non fire')\n"
        "except OSError as err:\n"
        "    logging.getLogger('nodecheck.test').debug('event=caught', exc_info=err)\n"
        "def crash():\n"
        "    raise ValueError('in a thread')\n"
        "worker = threading.Thread(target=crash, name='worker')\n"
        "worker.start()\n"
        "worker.join()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith("level=debug logger=nodecheck.test event=caught exception=OSError")
    assert "error='disk\\non fire' at=<string>:5:<module>" in lines[0]
    assert lines[1].startswith("level=error logger=nodecheck event=thread_crashed thread=worker")
    assert "exception=ValueError error='in a thread'" in lines[1]


@contextlib.contextmanager
def inside_nvml_init(node: Node, argv: list[str], work: Path) -> Iterator[subprocess.Popen[str]]:
    """`nodecheck ARGV` on `node`, yielded once it is inside nvmlInit, mid-run: its NVML
    scenario is a FIFO, which the fake NVML opens at init; the open returns when this end
    opens it for writing (a non-blocking open for writing fails with ENXIO until a reader
    has it open, fifo(7)), and the read then blocks while this end stays open and silent.
    An honest "the command is running its checks", with no guess at the machine's speed;
    the NVML deadline (8 s, the most) bounds how long the command would wait there."""
    fifo = work / "scenario.fifo"
    os.mkfifo(fifo)
    process = subprocess.Popen(
        [*NODECHECK, *node.cli_args, *argv, "--nvml-timeout", "8"],
        env={**CLEAN_ENVIRON, "PATH": os.environ["PATH"], SCENARIO_VARIABLE: str(fifo)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    writer = None
    try:
        deadline = time.monotonic() + 60
        while writer is None:
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as err:
                if err.errno != errno.ENXIO:
                    raise
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the command never initialised NVML"
                time.sleep(0.02)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=60)
        if writer is not None:
            os.close(writer)


@pytest.mark.parametrize(
    ("stop", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_a_stopped_check_exits_128_plus_the_signal(
    build: Callable[..., Node], tmp_path: Path, stop: signal.Signals, status: int
) -> None:
    """Ctrl-C in the middle of `nodecheck check` was "Aborted!" and exit 1, the status of
    an unhealthy node. Now 130 (143 for SIGTERM), one line, no traceback."""
    with inside_nvml_init(build("workstation"), ["check"], tmp_path) as process:
        process.send_signal(stop)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == status, stderr
    assert stderr == f"nodecheck: interrupted by {stop.name}\n"
    assert stdout == ""


def test_an_interrupted_capture_leaves_no_file(build: Callable[..., Node], tmp_path: Path) -> None:
    """`capture -o FILE` interrupted while reading NVML: exit 130, and neither FILE nor a
    temporary file beside it."""
    out = tmp_path / "out"
    out.mkdir()
    argv = ["capture", "-o", str(out / "node.json")]
    with inside_nvml_init(build("workstation"), argv, tmp_path) as process:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert stderr == "nodecheck: interrupted by SIGINT\n"
    assert list(out.iterdir()) == []


def test_an_interrupted_bench_exits_130_and_takes_its_child(
    build: Callable[..., Node], tmp_path: Path
) -> None:
    """Ctrl-C while the benchmark child runs (it is there: found in /proc): exit 130 with
    one line, the child gone with it, nothing recorded in the state directory."""
    node = build("cpu-only")
    state = tmp_path / "state"
    state.mkdir()  # a --state-dir given must exist
    argv = ["bench", "matmul", "--device", "cpu", "--duration", "60", "--state-dir", str(state)]
    process = subprocess.Popen(
        [*NODECHECK, *node.cli_args, *argv],
        env={**os.environ, **node.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        child = wait_for_child(process.pid)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
        deadline = time.monotonic() + 30
        while pid_alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr
    assert stderr.splitlines()[-1] == "nodecheck: interrupted by SIGINT"
    assert "Traceback" not in stderr and stdout == ""
    assert not pid_alive(child)
    assert not [path.name for path in state.iterdir() if path.name.startswith(".")]
    assert not (state / "benchmarks.json").exists()


def test_ctrl_c_stops_the_agent_cleanly(build: Callable[..., Node], tmp_path: Path) -> None:
    """SIGINT to a running agent is a stop like SIGTERM: exit 0 (a guard: it was)."""
    node = build("cpu-only")
    config = tmp_path / "config.toml"
    config.write_text(f'[agent]\nlisten = ""\nresults_file = "{tmp_path / "results.json"}"\n')
    log = tmp_path / "agent.log"
    process = start_agent(node.cli_args, config, {**os.environ, **node.env}, log)
    try:
        deadline = time.monotonic() + 60
        while "event=ready" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "event=stopping" in log.read_text() and "Traceback" not in log.read_text()
