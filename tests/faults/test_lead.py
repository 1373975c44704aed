"""Faults found while merging the matrix: the benchmark watch, the kernel log's path under
--rootfs, and advice that only makes sense to a non-root reader."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nodecheck.checks.bench.gate import ForeignProcessWatch, Refusal
from nodecheck.checks.config import BenchOptions
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.cpulist import parse_cpulist
from nodecheck.checks.node.fs import ImplausibleValueError, NodeFS, ReadError
from nodecheck.checks.node.variables import Variables
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Status
from nodecheck.checks.runner import run_checks
from nodecheck.checks.settings_audit import sources_summary
from tests.conftest import Node
from tests.fixtures.nvml_scenarios import dgx_healthy

WAIT_S = 60.0
# GPU 0 of the 8-GPU replica, under its host bridge, root port and switch.
GPU_DIR = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"


def test_benchmark_watch_stops_when_one_gpu_goes_dark(dgx: Node, tmp_path: Path) -> None:
    """GPU 2's utilization call hangs while a benchmark runs: the watch can no longer see
    whether a job arrives on that GPU, so after its blind limit it stops the run, naming
    GPU 2 (before, a per-GPU problem was ignored and the run went on blind)."""
    scenario = dgx_healthy()
    for gpu in scenario["gpus"]:
        gpu["processes"] = []  # no job anywhere: only the dark GPU can stop the run
    scenario["gpus"][2]["hang"] = {"nvmlDeviceGetUtilizationRates": 0}
    node = dgx.with_scenario(scenario, tmp_path / "dark.json")
    stopped: list[Refusal] = []
    done = threading.Event()

    def stop(refusal: Refusal) -> None:
        stopped.append(refusal)
        done.set()

    watch = ForeignProcessWatch(node.context(), BenchOptions(), stop)
    watch.start(group=os.getpgrp())
    try:
        assert done.wait(WAIT_S), "the watch never stopped the run"
    finally:
        watch.close()
    [refusal] = stopped
    assert refusal.reason == "nvml_unavailable"
    assert refusal.text.startswith("lost sight of GPU 2 (0000:"), refusal.text
    assert "NVML did not answer" in refusal.text


def test_a_kernel_log_path_that_loops_under_rootfs_is_an_error(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """<rootfs>/dev/kmsg a symlink loop (resolved inside --rootfs as chroot would):
    gpu_xid says the kernel log cannot be read, an `error` naming it, never a crash."""
    node = copy_node(dgx)
    kmsg = node.root / "dev" / "kmsg"
    kmsg.parent.mkdir(exist_ok=True)
    if kmsg.exists() or kmsg.is_symlink():
        kmsg.unlink()
    kmsg.symlink_to("/dev/kmsg")  # absolute: inside --rootfs, it points at itself
    [run] = node.run("gpu_xid")
    assert run.completed, run.results
    causes = [result.details.get("cause") for result in run.results]
    assert "exception" not in causes
    errors = [result for result in run.results if result.status is Status.ERROR]
    assert errors, [(r.status, r.summary) for r in run.results]
    assert any("kmsg" in result.summary for result in errors)


@pytest.mark.skipif(os.geteuid() != 0, reason="what root is told")
def test_root_is_not_told_to_run_as_root() -> None:
    """A process environment root could not read (EPERM from a hardened kernel): the
    audit counts it, and tells root nothing about running as root."""
    variables = Variables(unreadable=["/proc/4242/environ"])
    text, details = sources_summary(variables)
    assert "1 process(es) or file(s) not readable" in text
    assert "run as root" not in text
    assert details["unreadable"] == ["/proc/4242/environ"]


def test_nccl_conf_on_the_live_root_is_audited(tmp_path: Path) -> None:
    """The default roots (/, as on a real node) and NCCL_CONF_FILE naming a real file: the
    file is read and judged (a "//tmp/..." path once made both env checks crash)."""
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_P2P_DISABLE=1\n")
    assert NodeFS().host("/etc/nccl.conf") == Path("/etc/nccl.conf")
    context = CheckContext(fs=NodeFS(), environ={"NCCL_CONF_FILE": str(conf)}, uid=1000)
    checks = load_checks()
    runs = run_checks([checks["nccl_env"], checks["torch_alloc"]], context)
    assert all(run.completed for run in runs), [r.summary for run in runs for r in run.results]
    flagged = [r for r in runs[0].results if "NCCL_P2P_DISABLE" in r.summary]
    assert flagged and f"{conf} line 1" in flagged[0].summary, flagged


def test_a_gpu_process_that_exits_mid_audit_is_no_error(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """A process that held a GPU a moment ago is gone by the time its environment is read
    (a DataLoader worker): nothing to audit, and no `error` that would flap on every busy
    node. Its siblings are still audited."""
    node = copy_node(dgx)
    before = node.results("nccl_env", "torch_alloc")
    assert not [r for r in before if r.status is Status.ERROR]
    job = node.root / "proc" / "5151"  # holds /dev/nvidia0 in the replica
    assert any("nvidia" in os.readlink(fd) for fd in (job / "fd").iterdir())
    (job / "environ").unlink()
    after = node.results("nccl_env", "torch_alloc")
    assert not [r for r in after if r.status is Status.ERROR], [r.summary for r in after]


@pytest.mark.parametrize(
    ("command", "variable"),
    [(["exec", "--", "true"], "LOCAL_RANK"), (["tune", "--format", "json"], "SLURM_JOB_NUM_NODES")],
)
def test_a_five_thousand_digit_count_is_no_internal_error(
    dgx: Node, command: list[str], variable: str
) -> None:
    """int() refuses over 4300 digits: a launcher variable of 5000 is not a number to
    nodecheck (exec: exit 2 naming the variable; tune: a note), never "internal error"."""
    value = "9" * 5000
    done = subprocess.run(
        [sys.executable, "-m", "nodecheck.agent", *dgx.cli_args, *command],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "HOME": "/nonexistent", variable: value},
        timeout=120,
        check=False,
    )
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert value not in done.stdout + done.stderr
    assert done.returncode == (2 if command[0] == "exec" else 0), done.stderr
    assert variable in done.stdout + done.stderr


def test_a_megabyte_cpulist_is_refused_without_expanding_it() -> None:
    """1 MiB of "0-8191," (a sysfs file's most): each range is plausible, together they
    name 8192 CPUs 150,000 times over. Refused as soon as they pass the bound, so the
    parse is cheap (expanding them took about a minute)."""
    text = "0-8191," * ((1 << 20) // 7)
    with pytest.raises(ImplausibleValueError, match="more than the 8192 CPUs"):
        parse_cpulist(text)
    with pytest.raises(ImplausibleValueError, match="CPU ranges"):
        parse_cpulist(",".join(["0"] * 9000))
    assert parse_cpulist("0-8191") == frozenset(range(8192))


def test_an_unreadable_gid_type_is_an_error_not_not_roce(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """NCCL_IB_GID_INDEX=3 and the RoCE port's gid_attrs/types/3 cannot be read: could
    not tell, an `error` naming the port and the file with no remedy (it used to say the
    GID is "not RoCE v2" and to remove the variable)."""
    node = copy_node(dgx)
    port = node.root / "sys" / "class" / "infiniband" / "mlx5_8" / "ports" / "1"
    types = (port / "gid_attrs" / "types").resolve()
    (types / "3").unlink()
    (types / "3").mkdir()
    results = node.results("nccl_env", environ={"NCCL_IB_GID_INDEX": "3"})
    errors = [r for r in results if r.status is Status.ERROR]
    assert len(errors) == 1, [(r.status, r.summary) for r in results]
    assert "cannot tell whether GID index 3 is RoCE v2 on mlx5_8 port 1" in errors[0].summary
    assert "types/3" in errors[0].summary and errors[0].remedy == ""
    assert not [r for r in results if r.status is Status.WARN]


def test_a_read_stuck_since_before_a_check_is_not_blamed_for_its_timeout() -> None:
    """A read stuck for good in an earlier run's abandoned thread is not named as the cause
    of every later timeout: only reads that began within the timed-out check's window."""
    from nodecheck.checks.node.fs import reading
    from nodecheck.checks.runner import stuck_paths

    entered, release = threading.Event(), threading.Event()

    def stuck() -> None:
        with reading("/sys/bus/pci/devices/0000:3a:00.0/config"):
            entered.set()
            release.wait(60)

    thread = threading.Thread(target=stuck, daemon=True)
    thread.start()
    try:
        assert entered.wait(30)
        began = time.monotonic()
        assert stuck_paths(None, since=began - 30) == ["/sys/bus/pci/devices/0000:3a:00.0/config"]
        assert stuck_paths(None, since=began + 1) == []
    finally:
        release.set()
        thread.join(30)


def test_a_node_file_that_is_no_file_is_never_opened(tmp_path: Path) -> None:
    """Device nodes and FIFOs are refused by their kind before they are opened (opening
    /dev/watchdog arms it). Seen from a FIFO's writer, blocked in open() until a reader
    opens it: refused reads leave it blocked."""
    from nodecheck.checks.node.fs import ReadError, read_prefix

    fifo = tmp_path / "numa_node"
    os.mkfifo(fifo)
    opened = threading.Event()

    def writer() -> None:
        with open(fifo, "wb"):  # returns once some reader has opened the FIFO
            opened.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for _ in range(3):
            with pytest.raises(ReadError, match="a FIFO, not a file"):
                read_prefix(fifo)
        assert not opened.wait(2), "nodecheck opened the FIFO"
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # let the writer go
        thread.join(30)


UNREADABLE_AS_NOBODY = {
    # file -> the check that must name it, "permission denied", in an `error`
    f"{GPU_DIR}/current_link_width": "pcie_link",
    f"{GPU_DIR}/numa_node": "numa",
    f"{GPU_DIR.replace('17:00.0/0000:18', '17:02.0/0000:1a')}/local_cpulist": "numa",
    "sys/devices/system/node/node1/meminfo": "numa",
    "sys/devices/system/cpu/cpu5/topology/thread_siblings_list": "cpu",
    "proc/sys/kernel/numa_balancing": "numa",
    "sys/class/infiniband/mlx5_0/ports/1/state": "nccl_env",
    "etc/nccl.conf": "nccl_env",
}


@pytest.mark.skipif(os.geteuid() != 0, reason="drops root's privileges to read as nobody")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux)")
def test_files_unreadable_to_a_user_are_errors_naming_them(dgx: Node) -> None:
    """The "unreadable" column of the read matrix, which root cannot see (root reads any
    mode): a real `nodecheck check` as nobody (setpriv) on a replica whose files are mode
    0. Each file is an `error` naming it with "permission denied"; another user's job
    environment is counted with the advice to run as root; nothing crashes."""
    base = Path(tempfile.mkdtemp(prefix="nodecheck-nobody-"))
    try:
        base.chmod(0o755)
        root = base / dgx.root.name
        shutil.copytree(dgx.root, root, symlinks=True)
        for relative in [*UNREADABLE_AS_NOBODY, "proc/5151/environ"]:
            path = Path(os.path.realpath(root / relative))
            if not path.exists():
                path.write_text("\n")
            path.chmod(0)
        host_checks = ["pcie_link", "numa", "cpu", "nccl_env", "torch_alloc", "pcie_acs"]
        done = subprocess.run(
            [
                *("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
                *(sys.executable, "-m", "nodecheck.agent"),
                *("--sysfs-root", str(root / "sys"), "--procfs-root", str(root / "proc")),
                *("--rootfs", str(root), "check", "--json"),
                *(f"--only={name}" for name in host_checks),
            ],
            capture_output=True,
            text=True,
            env={"PATH": os.environ["PATH"], "HOME": "/nonexistent"},
            timeout=120,
            check=False,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    results = json.loads(done.stdout)["results"]
    assert not [r for r in results if r["details"].get("cause") in ("exception", "timeout")]
    errors = [r for r in results if r["status"] == "error"]
    for relative, check in UNREADABLE_AS_NOBODY.items():
        named = [
            r
            for r in errors
            if r["check"] == check
            and "permission denied" in r["summary"]
            and Path(relative).name in r["summary"]
        ]
        assert named, (relative, [(r["check"], r["summary"]) for r in errors])
    audit = [r for r in results if r["check"] == "nccl_env" and r["subject"] == "node"]
    assert any("run as root to audit other users' jobs" in r["summary"] for r in audit), audit


def test_nesting_is_measured_outside_strings_and_comments() -> None:
    """The depth check before tomllib refuses only real nesting: dots and brackets in
    strings, multi-line strings and comments, and floats, are not keys."""
    from nodecheck.agent.config import MAX_NESTING, nesting_problem

    dots = ".".join(["a"] * (MAX_NESTING + 10))
    brackets = "[" * (MAX_NESTING + 10)
    valid = (
        f"# {dots} {brackets}\n"
        f'[agent]\nstate_dir = "/var/{dots}"\n'
        f"kernel_log = '/{dots}'\n"
        f'x = """\n{dots}\n{brackets}\n"""\n'
        f"y = '''{brackets}'''\n"
        f'z = "a \\" {dots}"\n'
        "[benchmarks]\nwarn_below = 0.9\nfail_below = 0.8\n"
    )
    assert nesting_problem(valid) is None
    assert nesting_problem(f"[checks.numa]\nenabled.{dots} = true\n") == (
        2,
        f"nested too deeply: a key of more than {MAX_NESTING} levels",
    )
    assert nesting_problem(f"[{dots}]\n") is not None
    assert nesting_problem(f"a = {brackets}\n") is not None
    assert nesting_problem("a = " + "{b = " * (MAX_NESTING + 1) + "1" + "}" * 40) is not None


def test_a_trailing_nul_after_a_cpulist_is_padding(tmp_path: Path) -> None:
    """Linux 5.14+'s bin_attribute cpulists can end with their string's NUL ("0-31\\n\\0",
    seen in a real Kunpeng 920 capture): read as the list, not as binary content."""
    from nodecheck.checks.node.fs import read_text

    cpulist = tmp_path / "cpulist"
    cpulist.write_bytes(b"0-31\n\x00")
    assert read_text(cpulist) == "0-31"
    cpulist.write_bytes(b"0-\x0031\n")
    with pytest.raises(ReadError, match="binary content"):
        read_text(cpulist)


def test_numa_on_a_node_without_gpus_still_gives_a_verdict(
    build: Callable[..., Node], copy_node: Callable[[Node], Node]
) -> None:
    """A healthy NUMA machine without GPUs (and without numa_balancing) used to give no
    result at all, "check numa returned no result", an `error`."""
    node = copy_node(build("cpu-only"))
    (node.root / "proc" / "sys" / "kernel" / "numa_balancing").unlink(missing_ok=True)
    [run] = node.run("numa")
    assert run.completed, run.results
    assert [r.status for r in run.results if r.subject == "node"] == [Status.OK]
