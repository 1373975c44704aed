"""Faults in the files of the node: every read is bounded, names its path, and is plausible.

Each test names its outcome. The files are real (FIFOs from os.mkfifo, sockets
bound by the test, symlink loops, 17 MiB environments); the commands are real
`nodecheck` subprocesses under a deadline and an address-space cap, so that a
regression fails the test instead of hanging it or exhausting the machine.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.cpulist import NR_CPUS_MAX, cpu_id_bound, parse_cpulist
from nodecheck.checks.node.fs import (
    ImplausibleValueError,
    NodeFS,
    ReadError,
    list_dir,
    read_bytes,
    read_prefix,
    read_text,
    reading,
    reads_in_flight,
)
from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.pci import (
    parse_link_speed,
    parse_link_width,
    parse_numa_node,
    read_pci_device,
)
from nodecheck.checks.node.pci_config import ConfigSpaceError, parse_acs
from nodecheck.checks.node.variables import ENVIRON_LIMIT, read_variables
from nodecheck.checks.registry import Check, load_checks
from nodecheck.checks.result import NODE, Result, Status
from nodecheck.checks.runner import CheckRun, UnfinishedError, run_bounded, run_checks
from tests.conftest import CLEAN_ENVIRON, Node
from tests.fixtures.nodegen import GEN5_X16, PORT_DOWNSTREAM, Device, config_space

GPU = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
SWITCH_PORT = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0"
HOST_CHECKS = ("pcie_acs", "pcie_link", "numa", "nccl_env", "torch_alloc", "cpu", "rdma_ports")
# A generous bound for anything that must not hang: the checks' own deadlines are 10-15 s.
BOUND_S = 60.0
# The address space a `nodecheck` subprocess may take: a few hundred MiB is what it
# uses; a CPU list expanded to two billion integers needs tens of GiB.
MEMORY_CAP = 2 << 30
NODECHECK = [sys.executable, "-m", "nodecheck.agent"]


def cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def nodecheck(
    node: Node, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`nodecheck` on a node tree, bounded in time and memory (a hang or a blow-up fails)."""
    environ = dict(CLEAN_ENVIRON, PATH=os.environ["PATH"], **node.env, **(env or {}))
    if "PYTHONPATH" in os.environ:
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(
        [*NODECHECK, *node.cli_args, *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=BOUND_S,
        check=False,
        preexec_fn=cap_memory,
    )


@contextlib.contextmanager
def address_space_cap(extra: int = 1 << 30) -> Iterator[None]:
    """Lower this process's address-space limit to what it uses plus `extra` for the block:
    an allocation past it raises MemoryError instead of taking the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    used = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    cap = used + extra if hard == resource.RLIM_INFINITY else min(used + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]


def everything(results: Iterable[Result]) -> str:
    return "\n".join(f"{r.status.value} {r.subject} {r.summary} {r.details}" for r in results)


# --- the reads themselves -------------------------------------------------------------


def raised_within(seconds: float, function: Callable[[], object]) -> BaseException | None:
    """What `function()` raised, run on a daemon thread; fails the test (leaving the thread
    behind) when it has not returned within `seconds`, so a read that blocks cannot hang
    the suite."""
    raised: list[BaseException | None] = []

    def work() -> None:
        try:
            function()
            raised.append(None)
        except BaseException as err:
            raised.append(err)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(seconds)
    assert raised, f"still running after {seconds} s"
    return raised[0]


def test_fifo_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    """A FIFO in place of a file: ReadError "a FIFO, not a file" naming it, in well under
    the bound (a blocking read would wait for a writer forever)."""
    fifo = tmp_path / "numa_node"
    os.mkfifo(fifo)
    err = raised_within(15, lambda: read_text(fifo))
    assert isinstance(err, ReadError) and err.reason == "a FIFO, not a file"
    assert err.path == str(fifo) and str(fifo) in str(err)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda path: path.mkdir(), "a directory, not a file"),
        (lambda path: path.symlink_to(path), "a symlink loop"),
        (lambda path: path.symlink_to("/dev/null"), "a character device, not a file"),
        (lambda path: path.write_bytes(b"1" * (2 << 20)), "larger than 1 MiB"),
        (lambda path: path.write_bytes(b"\x00\x01\xfe\xff"), "binary content, not text"),
        (lambda path: path.write_bytes(b"0x10de\x00junk"), "binary content, not text"),
    ],
    ids=["directory", "symlink-loop", "char-device", "huge", "not-utf8", "nul"],
)
def test_a_file_that_is_not_text_is_a_named_error(
    tmp_path: Path, make: Callable[[Path], None], words: str
) -> None:
    """Each kind of damage is a ReadError with a plain reason and the path, never a hang,
    a MemoryError or an OSError."""
    path = tmp_path / "attribute"
    make(path)
    with pytest.raises(ReadError, match=words) as caught:
        read_text(path)
    assert caught.value.path == str(path)


def test_socket_is_refused_naming_it(tmp_path: Path) -> None:
    """A Unix socket in place of a file (open gives ENXIO): a ReadError naming it."""
    path = tmp_path / "vendor"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(ReadError) as caught:
            read_text(path)
    assert caught.value.path == str(path) and "socket" in caught.value.reason


def test_unreadable_file_is_permission_denied(tmp_path: Path) -> None:
    """A file this reader may not open: "permission denied" (not as root: root may)."""
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    path = tmp_path / "config"
    path.write_bytes(b"x")
    path.chmod(0)
    with pytest.raises(ReadError, match="permission denied"):
        read_bytes(path)


def test_a_long_file_is_cut_and_says_so(tmp_path: Path) -> None:
    """read_prefix takes at most `limit` bytes and reports that the file went on;
    read_bytes refuses the same file by name."""
    path = tmp_path / "environ"
    path.write_bytes(b"A" * 5000)
    cut = read_prefix(path, 4096)
    assert cut.truncated and len(cut.data) == 4096
    whole = read_prefix(path, 5000)
    assert not whole.truncated and len(whole.data) == 5000
    with pytest.raises(ReadError, match="larger than 4 KiB"):
        read_bytes(path, 4096)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (os.mkfifo, "not a directory"),
        (lambda path: path.write_text("0000:18:00.0\n"), "not a directory"),
        (lambda path: path.symlink_to(path), "a symlink loop"),
    ],
    ids=["fifo", "file", "symlink-loop"],
)
def test_listing_a_directory_that_is_not_one_is_a_named_error(
    tmp_path: Path, make: Callable[[Path], None], words: str
) -> None:
    """list_dir on a FIFO, a file or a loop: a ReadError naming it, at once."""
    path = tmp_path / "devices"
    make(path)
    err = raised_within(15, lambda: list_dir(path))
    assert isinstance(err, ReadError) and words in err.reason and err.path == str(path)


# --- a read that blocks in the kernel: the runner names it -------------------------------

# How to make a real read(2) block without a wedged device: there is none that a test can
# set up unprivileged (a FIFO is what fs.py now refuses before reading, and FUSE or NFS are
# not available on CI). So the registry is tested as fs.py's reads use it (its own entries
# during a read, none after), and the runner's message with a check that registers a read
# of a real sysfs path the way read_prefix does, then blocks.

RELEASE = threading.Event()


def test_reads_in_flight_are_registered_and_cleared(tmp_path: Path) -> None:
    """While a thread reads, the registry holds its path; afterwards nothing."""
    seen: list[list[str]] = []
    path = tmp_path / "config"
    path.write_bytes(b"x")
    with reading(path):
        seen.append([entry.path for entry in reads_in_flight()])
    read_bytes(path)
    assert seen == [[str(path)]]
    assert all(entry.path != str(path) for entry in reads_in_flight())


def test_runner_timeout_names_the_path_in_flight(dgx: Node) -> None:
    """A check stuck inside a read: `error` "did not finish within 0.5 s, stuck reading
    <path>", with the path in its details too; the other check is unaffected."""
    stuck = dgx.fs.sys("bus", "pci", "devices", "0000:3a:00.0", "config")

    def blocks(ctx: CheckContext) -> Iterable[Result]:
        with reading(stuck):
            RELEASE.wait(30)
        return [Result(Status.OK, NODE, "too late")]

    def healthy(ctx: CheckContext) -> Iterable[Result]:
        return [Result(Status.OK, NODE, f"{len(ctx.inventory.gpus)} GPUs")]

    checks = [
        Check("blocks", blocks, 60, 0.5, "blocks"),
        Check("healthy", healthy, 60, 10, "healthy"),
    ]
    try:
        blocked, fine = run_checks(checks, dgx.context())
    finally:
        RELEASE.set()
    [result] = blocked.results
    assert result.status is Status.ERROR
    assert f"did not finish within 0.5 s, stuck reading {stuck}" in result.summary
    assert result.details["stuck_reading"] == [str(stuck)]
    assert fine.completed and fine.results[0].summary == "8 GPUs"


def test_bounded_command_read_names_the_path_in_flight(dgx: Node) -> None:
    """What `inventory` and `tune` run their reads under: past its deadline,
    UnfinishedError naming the read in flight, instead of waiting forever."""
    stuck = dgx.fs.sys("bus", "pci", "devices", "0000:3a:00.0", "config")
    release = threading.Event()

    def blocks() -> int:
        with reading(stuck):
            release.wait(30)
        return 0

    started = time.monotonic()
    try:
        with pytest.raises(UnfinishedError, match=f"stuck reading {stuck}"):
            run_bounded(blocks, "reading the node", 0.5)
    finally:
        release.set()
    assert time.monotonic() - started < 15
    assert run_bounded(lambda: len(read_inventory(dgx.fs).gpus), "reading", 30) == 8


# --- CPU lists and the values the kernel can mean ------------------------------------------


@pytest.mark.parametrize(
    "text", ["0-2147483647", "0-8192", "8192", "0-3,9000", "0-99999999999:2/4"]
)
def test_cpulist_beyond_the_kernel_is_refused_before_it_is_expanded(text: str) -> None:
    """A range past NR_CPUS's maximum (8192) is ImplausibleValueError at once, without
    building a set of that size (under a cap, so that a regression is a MemoryError here
    rather than the machine's memory gone)."""
    started = time.monotonic()
    with address_space_cap(), pytest.raises(ImplausibleValueError, match="beyond the 8192 CPUs"):
        parse_cpulist(text)
    assert time.monotonic() - started < 15


def test_cpulist_is_bounded_by_the_possible_cpus(dgx: Node) -> None:
    """The replica's `possible` is 0-223: CPU 224 is beyond it, 223 is not."""
    bound = cpu_id_bound(dgx.fs)
    assert bound == 224
    assert parse_cpulist("0-223", bound) == frozenset(range(224))
    with pytest.raises(ImplausibleValueError, match="CPU 224 is beyond the 224 CPUs"):
        parse_cpulist("0-224", bound)
    assert cpu_id_bound(NodeFS(sysfs=Path("/nonexistent"))) == NR_CPUS_MAX


@pytest.mark.parametrize(
    ("parse", "text", "error"),
    [
        (parse_numa_node, "99999999999999999999", ValueError),
        (parse_numa_node, "1024", ImplausibleValueError),
        (parse_numa_node, "-2", ImplausibleValueError),
        (parse_link_speed, "100000000000000000000000000.0 GT/s PCIe", ValueError),
        (parse_link_speed, "7.0 GT/s PCIe", ImplausibleValueError),
        (parse_link_speed, "0.0 GT/s PCIe", ImplausibleValueError),
        (parse_link_width, "-16", ValueError),
        (parse_link_width, "64", ImplausibleValueError),
        (parse_link_width, "4294967295", ValueError),
    ],
)
def test_values_the_kernel_cannot_mean_are_refused(
    parse: Callable[[str], object], text: str, error: type[Exception]
) -> None:
    """numa_node is -1..1023, PCIe speeds are the generations' rates, widths x1..x32."""
    with pytest.raises(error):
        parse(text)


def bridge_config() -> bytearray:
    device = Device(
        "0000:17:00.0", 0x1000, 0xC030, 0x060400, GEN5_X16, "pcieport", PORT_DOWNSTREAM, 0
    )
    return bytearray(config_space(device, 0x16, 0x18, 0x18))


def _zeros() -> bytes:
    return bytes(4096)


def _standard_loop() -> bytes:
    config = bridge_config()
    head = config[0x34]
    config[head + 1] = head  # the first capability's next pointer back at itself
    return bytes(config)


def _standard_into_header() -> bytes:
    config = bridge_config()
    config[0x34] = 0x10
    return bytes(config)


def _extended_below_0x100() -> bytes:
    config = bridge_config()
    header = struct.unpack_from("<I", config, 0x100)[0]
    struct.pack_into("<I", config, 0x100, (header & 0xFFFFF) | 0x040 << 20)
    return bytes(config)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (_zeros, "vendor id 0x0000"),
        (_standard_loop, "capability list loops"),
        (_standard_into_header, "outside the capability area"),
        (_extended_below_0x100, "outside the extended space"),
        (lambda: bytes(bridge_config()[:1]), "not even a vendor id"),
    ],
    ids=["zeros", "loop", "into-header", "extended-below-0x100", "one-byte"],
)
def test_implausible_config_space_is_an_error_not_no_acs(
    config: Callable[[], bytes], words: str
) -> None:
    """A config space no device has is ConfigSpaceError, never "no ACS capability"."""
    with pytest.raises(ConfigSpaceError, match=words):
        parse_acs(config())


def test_zeroed_switch_port_config_is_an_error_naming_device_and_file(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """pcie_acs on a switch port whose config space reads as zeros: `error` for that
    bridge naming the file, not ok "no ACS capability"; the other bridges unchanged."""
    node = copy_node(dgx)
    before = node.results("pcie_acs")
    config = node.root / SWITCH_PORT / "config"
    config.write_bytes(bytes(4096))
    after = node.results("pcie_acs")
    [error] = [r for r in after if r.subject == "bridge 0000:17:00.0"]
    assert error.status is Status.ERROR
    assert "config" in error.summary and "vendor id 0x0000" in error.summary
    assert [r for r in after if r.subject != error.subject] == [
        r for r in before if r.subject != error.subject
    ]


def test_dangling_device_link_is_a_problem_naming_it(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """A `bus/pci/devices/<bdf>` link to nothing: a problem naming the link, no crash."""
    node = copy_node(dgx)
    link = node.root / "sys/bus/pci/devices/0000:18:00.0"
    link.unlink()
    link.symlink_to("../../../devices/pci0000:15/gone")
    device = read_pci_device(node.fs, "0000:18:00.0")
    assert device.vendor is None and str(link) in device.problems["device"]
    results = node.results("pcie_link")
    assert any(
        r.status is Status.ERROR and r.subject == "pci 0000:18:00.0" and str(link) in r.summary
        for r in results
    ), everything(results)


DIRECTORIES = [
    # (a directory of the node, what replaces it, the check that must say so, words)
    ("sys/bus/pci/devices", "file", "pcie_link", "cannot list the PCI devices"),
    ("sys/bus/pci/devices", "fifo", "pcie_acs", "cannot list the PCI devices"),
    ("sys/devices/system/node", "file", "numa", "cannot list the NUMA nodes"),
    ("sys/class/net", "fifo", "nccl_env", "cannot list the node's net devices"),
    ("sys/class/infiniband", "loop", "nccl_env", "cannot list the node's rdma devices"),
    ("sys/class/infiniband/mlx5_0/ports", "file", "nccl_env", "cannot read ports"),
    ("sys/bus/pci/devices/0000:18:00.0", "file", "pcie_link", "0000:18:00.0: not a directory"),
]


@pytest.mark.parametrize(
    ("relative", "replacement", "check", "words"),
    DIRECTORIES,
    ids=[f"{r.rsplit('/', 1)[-1]}-{k}" for r, k, _, _ in DIRECTORIES],
)
def test_directory_that_is_not_one_is_a_named_error(
    dgx: Node,
    copy_node: Callable[[Node], Node],
    relative: str,
    replacement: str,
    check: str,
    words: str,
) -> None:
    """A sysfs directory that is a file, a FIFO or a symlink loop: the check that needs it
    says `error` naming it, no check crashes or hangs."""
    node = copy_node(dgx)
    path = node.root / relative
    real = Path(os.path.realpath(path))
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(real)
    if replacement == "file":
        path.write_text("0000:18:00.0\n")
    elif replacement == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(path.name)
    started = time.monotonic()
    runs = node.run(*HOST_CHECKS)
    assert time.monotonic() - started < BOUND_S
    assert all(run.completed for run in runs), [run.results for run in runs if not run.completed]
    [run] = [run for run in runs if run.check.name == check]
    assert any(
        r.status is Status.ERROR and words in r.summary and str(path) in r.summary
        for r in run.results
    ), everything(run.results)


# --- environments and NCCL's files ---------------------------------------------------------


def test_flag_after_two_mib_of_environment_is_found(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """A 3 MiB `environ` with NCCL_P2P_DISABLE=1 at its end: the flag is found (fail),
    and nothing says the environment was cut."""
    node = copy_node(dgx)
    environ = node.root / "proc/5151/environ"
    padding = b"".join(b"FILLER_%07d=%s\0" % (n, b"x" * 1000) for n in range(3200))
    environ.write_bytes(environ.read_bytes() + padding + b"NCCL_P2P_DISABLE=1\0")
    assert environ.stat().st_size > 3 << 20
    results = node.results("nccl_env")
    flagged = [r for r in results if "NCCL_P2P_DISABLE" in r.summary + str(r.details)]
    assert flagged and flagged[0].status is Status.FAIL, everything(results)
    assert "not read" not in everything(results)


def test_environment_past_the_bound_is_cut_and_said(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """An `environ` longer than 16 MiB: `error` naming the pid and the file, saying the
    variables past 16 MiB were not read; what came before is still audited."""
    node = copy_node(dgx)
    environ = node.root / "proc/5151/environ"
    with environ.open("ab") as file:
        file.write(b"NCCL_P2P_DISABLE=1\0")
        chunk = b"F=" + b"y" * (1 << 20) + b"\0"
        for _ in range(ENVIRON_LIMIT // len(chunk) + 1):
            file.write(chunk)
    assert environ.stat().st_size > ENVIRON_LIMIT
    results = node.results("nccl_env")
    cut = [r for r in results if "not read" in r.summary]
    assert cut and cut[0].status is Status.ERROR, everything(results)
    assert "pid 5151" in cut[0].summary and str(environ) in cut[0].summary
    assert "past 16 MiB" in cut[0].summary
    assert any("NCCL_P2P_DISABLE" in r.summary + str(r.details) for r in results)


@pytest.mark.parametrize(
    ("make", "words"),
    [(lambda path: path.mkdir(), "a directory"), (os.mkfifo, "a FIFO")],
    ids=["directory", "fifo"],
)
def test_environ_that_is_not_a_file_says_what_it_is(
    dgx: Node, copy_node: Callable[[Node], Node], make: Callable[[Path], None], words: str
) -> None:
    """An `environ` that is a directory or a FIFO: `error` naming it as such, never
    "not readable (run as root)"."""
    node = copy_node(dgx)
    environ = node.root / "proc/5151/environ"
    environ.unlink()
    make(environ)
    started = time.monotonic()
    results = node.results("nccl_env", "torch_alloc")
    assert time.monotonic() - started < BOUND_S
    named = [r for r in results if str(environ) in r.summary]
    assert {r.status for r in named} == {Status.ERROR}, everything(results)
    assert all(words in r.summary for r in named) and len(named) == 2
    assert "run as root" not in everything(results)


def test_nccl_conf_file_that_is_a_fifo_is_named(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """$NCCL_CONF_FILE naming a FIFO: nccl_env `error` "a FIFO" naming it, at once."""
    node = copy_node(dgx)
    fifo = node.root / "tmp" / "nccl.fifo"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    started = time.monotonic()
    results = node.results(
        "nccl_env", environ={**CLEAN_ENVIRON, "NCCL_CONF_FILE": "/tmp/nccl.fifo"}
    )
    assert time.monotonic() - started < BOUND_S
    assert any(
        r.status is Status.ERROR and str(fifo) in r.summary and "a FIFO" in r.summary
        for r in results
    ), everything(results)


def test_nccl_conf_file_cannot_escape_the_root_filesystem(
    dgx: Node, copy_node: Callable[[Node], Node], tmp_path: Path
) -> None:
    """NCCL_CONF_FILE=/../<outside> and a symlink to an absolute path both stay under
    --rootfs, as chroot would: the host's file of that name is never read."""
    node = copy_node(dgx)
    root = node.root
    # A file beside the root, which "/../" would reach if `..` were not stopped.
    outside = root.parent / "escape.conf"
    outside.write_text("NCCL_P2P_DISABLE=1\n")
    assert node.fs.host(f"/../{outside.name}") == root / outside.name
    assert node.fs.host("/a/../../b/./c") == root / "b" / "c"
    results = node.results(
        "nccl_env", environ={**CLEAN_ENVIRON, "NCCL_CONF_FILE": f"/../{outside.name}"}
    )
    assert "NCCL_P2P_DISABLE" not in everything(results)
    # A symlink in the tree to an absolute path continues inside the tree.
    (root / "etc" / "nccl.conf").unlink()
    (root / "etc" / "nccl.conf").symlink_to(str(outside))
    inside = root / str(outside).lstrip("/")
    inside.parent.mkdir(parents=True, exist_ok=True)
    inside.write_text("NCCL_DEBUG=INFO\n")
    assert node.fs.host("/etc/nccl.conf") == inside
    text = everything(node.results("nccl_env"))
    assert "NCCL_DEBUG" in text and "NCCL_P2P_DISABLE" not in text
    # A loop is named, not followed forever.
    (root / "etc" / "loop").symlink_to("/etc/loop")
    with pytest.raises(ReadError, match="a symlink loop"):
        node.fs.host("/etc/loop")
    results = node.results("nccl_env", environ={**CLEAN_ENVIRON, "NCCL_CONF_FILE": "/etc/loop"})
    assert any(r.status is Status.ERROR and "symlink loop" in r.summary for r in results)


def test_home_directory_from_passwd_stays_under_rootfs(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """A home of /../../<outside> in <rootfs>/etc/passwd: ~/.nccl.conf is read inside the
    root filesystem, the outside file never."""
    node = copy_node(dgx)
    # Joined naively, "/.." is the directory above the tree, where this file waits.
    outside = node.root.parent / ".nccl.conf"
    outside.write_text("NCCL_P2P_DISABLE=1\n")
    (node.root / "etc" / "passwd").write_text("alice:x:1000:1000::/..:/bin/sh\n")
    variables = read_variables(node.fs, CLEAN_ENVIRON, 1000)
    assert not [s for s in variables.settings if s.name == "NCCL_P2P_DISABLE"]
    inside = node.root / ".nccl.conf"
    inside.write_text("NCCL_DEBUG=INFO\n")
    variables = read_variables(node.fs, CLEAN_ENVIRON, 1000)
    assert [s.where for s in variables.settings if s.name == "NCCL_DEBUG"] == ["/.nccl.conf line 1"]


# --- whole commands on damaged trees, bounded in time and memory ---------------------------

HUGE_CPULIST = "0-2147483647\n"
CPUSET = "sys/fs/cgroup/job/cpuset.cpus.effective"
CPULIST_FILES = [
    "sys/devices/system/node/node0/cpulist",
    "sys/devices/system/cpu/cpu5/topology/thread_siblings_list",
    f"{GPU}/local_cpulist",
]
SECOND_GPU = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:02.0/0000:1a:00.0"
FIRST_NIC = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0"
# Values no kernel prints, each in a file a check needs: (file, content, words of the error).
IMPLAUSIBLE = [
    (f"{SECOND_GPU}/numa_node", "99999999999999999999\n", "expected an integer"),
    (f"{SECOND_GPU}/current_link_speed", "1" + "0" * 26 + ".0 GT/s PCIe\n", "a link speed"),
    (f"{FIRST_NIC}/max_link_width", "-16\n", "a lane count"),
    (f"{FIRST_NIC}/current_link_speed", "7.0 GT/s PCIe\n", "no PCIe generation runs at 7"),
]


@pytest.fixture(scope="module")
def damaged(build: Callable[..., Node], scratch_dir: Path) -> Iterator[Callable[[str], Node]]:
    """The 8-GPU replica with one kind of damage, built once per kind for this module."""
    made: dict[str, Node] = {}

    def make(kind: str) -> Node:
        if kind not in made:
            source = build("dgx-h100")
            root = scratch_dir / f"reads-{kind}" / source.root.name
            shutil.copytree(source.root, root, symlinks=True)
            if kind == "fifo":
                path = root / GPU / "numa_node"
                path.unlink()
                os.mkfifo(path)
            elif kind == "cpulists":
                for relative in CPULIST_FILES:
                    (root / relative).write_text(HUGE_CPULIST)
                for relative, content, _ in IMPLAUSIBLE:
                    (root / relative).write_text(content)
                # And the cpuset of a cgroup v2 job this process runs in.
                (root / "proc/self").mkdir()
                (root / "proc/self/cgroup").write_text("0::/job\n")
                (root / CPUSET).parent.mkdir(parents=True)
                (root / CPUSET).write_text(HUGE_CPULIST)
            made[kind] = Node(root, source.nvml_library, root / source.scenario.name)  # type: ignore[union-attr]
        return made[kind]

    yield make
    for node in made.values():
        shutil.rmtree(node.root.parent, ignore_errors=True)


def test_check_with_a_fifo_in_sysfs_names_it_and_does_not_wait(
    damaged: Callable[[str], Node],
) -> None:
    """`nodecheck check` with a FIFO as a GPU's numa_node: finishes well within the
    checks' deadlines, numa `error` names the FIFO, no check times out."""
    node = damaged("fifo")
    started = time.monotonic()
    done = nodecheck(node, "check", "--json")
    elapsed = time.monotonic() - started
    no_traceback(done)
    assert done.returncode in (1, 3), done.stderr[-3000:]
    assert "a FIFO, not a file" in done.stdout and "numa_node" in done.stdout
    assert "did not finish" not in done.stdout, done.stdout[-3000:]
    assert elapsed < BOUND_S


@pytest.mark.parametrize("command", [["tune", "--format", "json"], ["inventory", "--json"]])
def test_tune_and_inventory_with_a_fifo_in_sysfs_finish(
    damaged: Callable[[str], Node], command: list[str]
) -> None:
    """`tune` and `inventory` with the FIFO: they finish (they used to hang forever)."""
    done = nodecheck(damaged("fifo"), *command)
    no_traceback(done)
    assert done.returncode == 0, done.stderr[-3000:]


def test_tune_with_nccl_conf_file_a_fifo_finishes(
    damaged: Callable[[str], Node], tmp_path: Path
) -> None:
    """`tune` with NCCL_CONF_FILE naming a FIFO: it finishes, no traceback."""
    node = damaged("fifo")
    fifo = node.root / "nccl-conf.fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    done = nodecheck(node, "tune", "--format", "json", env={"NCCL_CONF_FILE": "/nccl-conf.fifo"})
    no_traceback(done)
    assert done.returncode == 0, done.stderr[-3000:]


def test_check_with_huge_cpulists_is_an_error_naming_each_file(
    damaged: Callable[[str], Node],
) -> None:
    """`nodecheck check` with 0-2147483647 in a node's, a core's and a GPU's CPU list, a
    numa_node of 99999999999999999999, a link of 1e26 GT/s, of 7 GT/s and of x-16: under
    a 2 GiB address-space cap it finishes, and each file is named as implausible."""
    node = damaged("cpulists")
    done = nodecheck(node, "check", "--json")
    no_traceback(done)
    assert done.returncode in (1, 3), done.stderr[-3000:]
    for relative in CPULIST_FILES:
        assert relative.rsplit("/", 1)[-1] in done.stdout
    assert done.stdout.count("beyond the 224 CPUs") >= len(CPULIST_FILES), done.stdout[-3000:]
    for relative, _, words in IMPLAUSIBLE:
        bdf, name = relative.rsplit("/", 2)[-2:]
        assert any(
            f"{bdf}/{name}" in line and words in line for line in done.stdout.splitlines()
        ), (relative, done.stdout[-3000:])


@pytest.mark.parametrize("command", [["tune", "--format", "json"], ["inventory", "--json"]])
def test_tune_and_inventory_with_huge_cpulists_finish_within_memory(
    damaged: Callable[[str], Node], command: list[str]
) -> None:
    """`tune` and `inventory` with the same values (and the job's cpuset, for tune)
    finish under the memory cap; tune logs the cpuset it could not use, by path."""
    done = nodecheck(damaged("cpulists"), *command)
    no_traceback(done)
    assert done.returncode == 0, done.stderr[-3000:]
    if command[0] == "tune":
        assert "event=bad_cpuset" in done.stderr and CPUSET in done.stderr, done.stderr[-3000:]


# --- the matrix: many files of the 8-GPU replica, every kind of damage ----------------------

ALL_KINDS = ("missing", "empty", "huge", "binary", "directory", "fifo", "loop", "unreadable")
ANY_CHECK = frozenset(HOST_CHECKS)
# path -> (the kinds of damage that make it unreadable or meaningless, the checks whose
# results may change). Missing is left out where absence has a meaning (numa_node on a
# kernel without NUMA); empty where empty is valid (a memory-only node's cpulist).
MATRIX: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    f"{GPU}/current_link_width": (frozenset(ALL_KINDS), frozenset({"pcie_link"})),
    f"{GPU}/max_link_speed": (frozenset(ALL_KINDS), frozenset({"pcie_link"})),
    f"{GPU}/numa_node": (frozenset(ALL_KINDS) - {"missing"}, frozenset({"numa"})),
    f"{GPU}/local_cpulist": (frozenset(ALL_KINDS) - {"missing", "empty"}, frozenset({"numa"})),
    # Without its class the GPU is no longer known as a GPU: every check that counts
    # GPUs may change; cpu does not.
    f"{GPU}/class": (frozenset(ALL_KINDS), ANY_CHECK - {"cpu", "torch_alloc"}),
    f"{GPU}/vendor": (frozenset(ALL_KINDS), ANY_CHECK - {"cpu", "torch_alloc"}),
    f"{SWITCH_PORT}/config": (frozenset(ALL_KINDS) - {"binary"}, frozenset({"pcie_acs"})),
    # Missing, it is read from the node's cpumap, which says the same.
    "sys/devices/system/node/node1/cpulist": (
        frozenset(ALL_KINDS) - {"empty", "missing"},
        frozenset({"numa"}),
    ),
    "sys/devices/system/node/node1/meminfo": (frozenset(ALL_KINDS), frozenset({"numa"})),
    # Missing, these two are read as the kernel means: core_cpus_list says the same, and
    # kernels without `online` have the cpuN directories (a note, not an error).
    "sys/devices/system/cpu/cpu5/topology/thread_siblings_list": (
        frozenset(ALL_KINDS) - {"empty", "missing"},
        frozenset({"cpu"}),
    ),
    "sys/devices/system/cpu/online": (
        frozenset(ALL_KINDS) - {"empty", "missing"},
        frozenset({"cpu", "numa"}),
    ),
    "proc/sys/kernel/numa_balancing": (frozenset(ALL_KINDS) - {"missing"}, frozenset({"numa"})),
    "sys/class/infiniband/mlx5_0/ports/1/state": (
        frozenset(ALL_KINDS),
        frozenset({"nccl_env", "rdma_ports"}),
    ),
    "sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error": (
        frozenset(ALL_KINDS),
        frozenset({"rdma_ports"}),
    ),
    "etc/nccl.conf": (
        frozenset({"huge", "directory", "fifo", "loop", "unreadable"}),
        frozenset({"nccl_env", "torch_alloc"}),
    ),
    "proc/{gpu_pid}/environ": (
        frozenset({"huge", "directory", "fifo", "loop", "unreadable"}),
        frozenset({"nccl_env", "torch_alloc"}),
    ),
}
# How each kind of damage is named: a plain reason, not an errno's strerror.
WORDS = {
    "missing": ("missing",),
    "empty": ("an empty file", "only 0 bytes"),
    "huge": ("larger than", "longer than"),
    "binary": ("binary content",),
    "directory": ("a directory, not a file",),
    "fifo": ("a FIFO, not a file",),
    "loop": ("a symlink loop",),
    "unreadable": ("permission denied",),
}
# More than any bound a file of this kind is read to (16 MiB for an environment).
HUGE_BYTES = {"proc/{gpu_pid}/environ": ENVIRON_LIMIT + 1}
# The replicas, and the process holding a GPU in each.
MATRIX_NODES = {"dgx-h100": 5151, "dgx-h100-faulty": 4242}


def damage(path: Path, kind: str, size: int) -> None:
    """Replace the file at `path` (already moved away) with one kind of damage."""
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "huge":
        with path.open("wb") as file:
            file.truncate(size)  # sparse: zeros, cheap to make
            file.seek(0)
            file.write(b"1" * min(size, 1 << 16))
    elif kind == "binary":
        path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xde\xad\xbe\xef\xff\xfe")
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "unreadable":
        path.write_text("1\n")
        path.chmod(0)


def results_by_check(runs: list[CheckRun]) -> dict[str, list[tuple[str, str, str]]]:
    return {
        run.check.name: [(r.status.value, r.subject, r.summary) for r in run.results]
        for run in runs
    }


@pytest.fixture(scope="module")
def matrix_nodes(build: Callable[..., Node], scratch_dir: Path) -> Iterator[dict[str, Node]]:
    """One private copy of each replica for the whole matrix: each case damages a file and
    restores it."""
    copies = {}
    for name in MATRIX_NODES:
        source = build(name)
        root = scratch_dir / "reads-matrix" / source.root.name
        shutil.copytree(source.root, root, symlinks=True)
        scenario = root / source.scenario.name  # type: ignore[union-attr]
        copies[name] = Node(root, source.nvml_library, scenario)
    yield copies
    shutil.rmtree(scratch_dir / "reads-matrix", ignore_errors=True)


CASES = [
    (name, relative, kind)
    for name in MATRIX_NODES
    for relative, (kinds, _) in MATRIX.items()
    for kind in ALL_KINDS
    if kind in kinds
]


@pytest.mark.parametrize(
    ("name", "relative", "kind"),
    CASES,
    ids=[f"{n}-{r.rsplit('/', 1)[-1]}-{k}" for n, r, k in CASES],
)
def test_damaged_file_is_a_named_error_and_nothing_else_changes(
    matrix_nodes: dict[str, Node], name: str, relative: str, kind: str
) -> None:
    """Each file damaged each way: all host checks finish within the bound, none crashes,
    the file is named in an `error`, and the checks that do not read it say what they
    said before."""
    if kind == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    node = matrix_nodes[name]
    checks = load_checks()
    selected = [checks[check] for check in HOST_CHECKS]
    baseline = results_by_check(run_checks(selected, node.context()))
    given = node.root / relative.format(gpu_pid=MATRIX_NODES[name])
    path = Path(os.path.realpath(given))
    saved = path.with_name(path.name + ".saved")
    os.rename(path, saved)
    try:
        damage(path, kind, HUGE_BYTES.get(relative, 2 << 20))
        started = time.monotonic()
        runs = run_checks(selected, node.context())
        elapsed = time.monotonic() - started
    finally:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        elif os.path.lexists(path):
            path.unlink()
        os.rename(saved, path)
    assert elapsed < BOUND_S
    assert all(run.completed for run in runs), [r.results for r in runs if not r.completed]
    causes = [r.details.get("cause") for run in runs for r in run.results]
    assert "exception" not in causes and "timeout" not in causes
    # The file by the name it was damaged under, its real path, or, for a PCI device's
    # attribute, its name under bus/pci/devices/<bdf>; with the damage in plain words.
    names = {given, path, node.root / "sys/bus/pci/devices" / path.parent.name / path.name}
    errors = [r for run in runs for r in run.results if r.status is Status.ERROR]
    assert any(
        any(str(name) in line for name in names) and any(word in line for word in WORDS[kind])
        for line in everything(errors).splitlines()
    ), everything(r for run in runs for r in run.results)
    _, may_change = MATRIX[relative]
    after = results_by_check(runs)
    for check in HOST_CHECKS:
        if check not in may_change:
            assert after[check] == baseline[check], check
