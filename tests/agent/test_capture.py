"""`nodecheck capture`, and `check`, `inventory` and `tune` judging a capture with --facts."""

from __future__ import annotations

import dataclasses
import json
import os
import select
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodecheck.checks.node.facts import SCHEMA, Unread, load
from nodecheck.checks.registry import load_checks
from tests.agent.test_cli import NODECHECK, run, run_counting_imports
from tests.conftest import CLEAN_ENVIRON, Node
from tests.documents import untimed

# Roots that do not exist: a command judging a capture must not look at them.
NOWHERE = ["--sysfs-root", "/nonexistent/sys", "--procfs-root", "/nonexistent/proc"]
NOWHERE += ["--rootfs", "/nonexistent"]


def capture(node: Node, path: Path) -> Path:
    done = run(*node.cli_args, "capture", "-o", str(path), env=node.env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return path


@pytest.fixture(scope="module")
def faulty_capture(dgx_faulty: Node, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return capture(dgx_faulty, tmp_path_factory.mktemp("capture") / "dgx-faulty.json")


def results_by_check(document: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for result in document["results"]:
        grouped.setdefault(result["check"], []).append(result)
    return grouped


def test_check_of_a_capture_is_the_live_check(dgx_faulty: Node, faulty_capture: Path) -> None:
    """The faulty DGX with its fake NVML (one fault per GPU): `check --json` there, and
    `check --facts` of its capture with the roots pointing nowhere and no NVML library
    (nor scenario) at all, give the same results, hostname and status."""
    live = run(*dgx_faulty.cli_args, "check", "--json", env=dgx_faulty.env)
    assert live.returncode == 1, live.stderr
    judged = run(*NOWHERE, "check", "--json", "--facts", str(faulty_capture))
    assert judged.stderr == ""
    live_document, judged_document = json.loads(live.stdout), json.loads(judged.stdout)
    assert judged_document["hostname"] == live_document["hostname"] == "dgx-h100-07"
    live_results = results_by_check(live_document)
    judged_results = results_by_check(judged_document)
    assert set(judged_results) == set(live_results) == set(load_checks())
    compared = set(live_results)
    # The GPU checks judge NVML's readings, carried by the capture.
    assert {"gpu_memory_errors", "gpu_throttle", "gpu_nvlink", "gpu_xid"} <= compared
    # GPU 5's fake PCIe replay counter grows 30 a second from nvmlInit
    # (tests/fixtures/nvml_scenarios.py): pcie_aer shows it as evidence, read when each
    # process read NVML, so on a loaded machine the capture's and the live run's differ
    # by a count or two. Compared apart: both there, each as its own run read it.
    for document in (live_results, judged_results):
        for result in document["pcie_aer"]:
            replays = result["details"].pop("nvml_pcie_replays", None)
            if result["subject"] == "gpu 0000:9c:00.0":
                assert isinstance(replays, int) and replays >= 100
    for name in sorted(compared):
        assert judged_results[name] == live_results[name], name
    assert any(r["status"] == "fail" for name in compared for r in live_results[name])
    assert untimed(judged_document) == untimed(live_document)
    assert judged.returncode == live.returncode


def test_check_of_a_capture_applies_this_commands_options(
    dgx_faulty: Node, faulty_capture: Path
) -> None:
    """--expected-gpus is the judging side's: 7 GPUs answering in the capture, 9 expected
    here, fails as the live node does; --only selects checks."""
    args = ["check", "--json", "--only", "gpu_count", "--expected-gpus", "9"]
    live = json.loads(run(*dgx_faulty.cli_args, *args, env=dgx_faulty.env).stdout)
    judged = json.loads(run(*NOWHERE, *args, "--facts", str(faulty_capture)).stdout)
    assert {r["check"] for r in judged["results"]} == {"gpu_count"}
    assert judged["status"] == "fail"
    assert any("9 expected" in r["summary"] for r in judged["results"]), judged
    assert untimed(judged) == untimed(live)


def test_check_of_a_capture_imports_no_nvml(faulty_capture: Path) -> None:
    """Judging a capture never touches NVML: pynvml is not even imported."""
    done, heavy = run_counting_imports(
        [*NOWHERE, "check", "--json", "--facts", str(faulty_capture)], {}
    )
    assert heavy == set(), done.stderr[-500:]


@pytest.mark.parametrize("as_json", [True, False])
def test_inventory_of_a_capture_is_the_live_inventory(
    dgx_faulty: Node, faulty_capture: Path, as_json: bool
) -> None:
    """The inventory, text and JSON, NVML's view included, from the capture alone."""
    flags = ["--json"] if as_json else []
    live = run(*dgx_faulty.cli_args, "inventory", *flags, env=dgx_faulty.env)
    judged = run(*NOWHERE, "inventory", *flags, "--facts", str(faulty_capture))
    assert live.returncode == judged.returncode == 0, judged.stderr
    assert judged.stdout == live.stdout
    assert "dgx-h100-07" in judged.stdout and "570.124.06" in judged.stdout


@pytest.mark.parametrize("node_name", ["dgx-h100", "xe9680"])
def test_tune_of_a_capture_is_the_live_tune(
    build: Callable[..., Node], tmp_path: Path, node_name: str
) -> None:
    node = build(node_name)
    path = capture(node, tmp_path / "capture.json")
    args = ["tune", "--format", "json", "--nodes", "16"]
    live = run(*node.cli_args, *args, env=node.env)
    judged = run(*NOWHERE, *args, "--facts", str(path))
    assert live.returncode == judged.returncode == 0, judged.stderr
    assert untimed(json.loads(judged.stdout)) == untimed(json.loads(live.stdout))


def _rewrite(source: Path, change: Callable[[dict[str, Any]], object]) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        document = json.loads(source.read_text())
        change(document)
        path.write_text(json.dumps(document))
        return path

    return make


def _damage_hostname(document: dict[str, Any]) -> None:
    document["parts"]["inventory"]["value"]["hostname"] = 3


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _set(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda document: document.__setitem__(key, value)


REFUSED: list[tuple[str, Callable[[Path, Path], Path], str]] = [
    ("not JSON", lambda p, _: (p.write_text("{ nope"), p)[1], "is not JSON"),
    ("no file", lambda p, _: p, "No such file or directory"),
    ("a FIFO", lambda p, _: _fifo(p), "a FIFO, not a capture"),
    ("another schema", lambda p, s: _rewrite(s, _set("schema", "nodecheck.check/v1"))(p), "is a"),
    ("no schema", lambda p, s: _rewrite(s, lambda d: d.pop("schema"))(p), "(no schema)"),
    (
        "a newer schema",
        lambda p, s: _rewrite(s, _set("schema", "nodecheck.facts/v2"))(p),
        f"is a nodecheck.facts/v2 capture, newer than this nodecheck reads ({SCHEMA})",
    ),
    (
        "a damaged field",
        lambda p, s: _rewrite(s, _damage_hostname)(p),
        "parts.inventory.value.hostname: expected a string",
    ),
]


@pytest.mark.parametrize("command", [["check"], ["inventory"], ["tune", "--format", "json"]])
@pytest.mark.parametrize(("fault", "make", "says"), REFUSED, ids=[fault for fault, _, _ in REFUSED])
def test_a_file_that_is_no_usable_capture_is_refused(
    faulty_capture: Path,
    tmp_path: Path,
    command: list[str],
    fault: str,
    make: Callable[[Path, Path], Path],
    says: str,
) -> None:
    """Exit 2 and one line naming the file and what is wrong with it; no traceback."""
    path = make(tmp_path / "capture.json", faulty_capture)
    done = run(*NOWHERE, *command, "--facts", str(path))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith(f"nodecheck: --facts {path}"), done.stderr
    assert says in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


def _no_siblings(document: dict[str, Any]) -> None:
    cpus = document["parts"]["inventory"]["value"]["cpu"]["cpus"]
    cpus[sorted(cpus)[0]]["siblings"] = []  # a CPU that is no thread of its own core


@pytest.mark.parametrize("command", [["inventory"], ["tune", "--format", "json"]])
def test_a_capture_that_contradicts_itself_is_refused_not_crashed_on(
    faulty_capture: Path, tmp_path: Path, command: list[str]
) -> None:
    """Values that fit their types but not each other (an edited capture): exit 2 and one
    line naming the file, never "internal error" (exit 3, check's "undetermined")."""
    path = _rewrite(faulty_capture, _no_siblings)(tmp_path / "capture.json")
    done = run(*NOWHERE, *command, "--facts", str(path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"nodecheck: {path}: its facts contradict each other")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_capture_is_written_atomically_for_its_owner_only(dgx: Node, tmp_path: Path) -> None:
    """-o replaces the file whole (a new inode, no temporary left beside it), mode 0600
    whatever was there: a support bundle. Without -o the same document goes to stdout."""
    path = tmp_path / "bundle.json"
    path.write_text("old")
    path.chmod(0o644)
    before = path.stat().st_ino
    capture(dgx, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_ino != before
    assert [p.name for p in tmp_path.iterdir()] == ["bundle.json"]
    facts = load(path)
    assert facts.get("hostname") == "dgx-h100-01"
    assert not [name for name, value in facts.parts.items() if isinstance(value, Unread)]
    printed = run(*dgx.cli_args, "capture", env=dgx.env)
    assert printed.returncode == 0 and printed.stderr == ""
    assert json.loads(printed.stdout)["schema"] == SCHEMA
    assert set(json.loads(printed.stdout)["parts"]) == set(facts.parts)


def test_capture_cannot_write_is_a_usage_error(dgx: Node, tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "dir" / "bundle.json"
    done = run(*dgx.cli_args, "capture", "-o", str(target), env=dgx.env)
    assert done.returncode == 2
    assert done.stderr.startswith(f"nodecheck: cannot write {target}: ")
    assert "Traceback" not in done.stderr


def test_capture_writes_through_a_character_device_and_leaves_it_one(
    dgx: Node, tmp_path: Path
) -> None:
    """-o a device node: written through, never replaced by a 0600 file (as root, `-o
    /dev/null` turned /dev/null into a root-only file). A node of /dev/null's numbers
    (1:3, the kernel's Documentation/admin-guide/devices.txt) made here: the shared
    /dev/null is left alone."""
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.chmod(device, 0o666)  # past the umask
        with open(device, "wb"):
            pass
    except PermissionError:
        pytest.skip("making and opening a device node needs root (CAP_MKNOD, the cgroup's)")
    before = os.lstat(device)
    done = run(*dgx.cli_args, "capture", "-o", str(device), env=dgx.env)
    assert done.returncode == 0, done.stderr
    after = os.lstat(device)
    assert stat.S_ISCHR(after.st_mode) and stat.S_IMODE(after.st_mode) == 0o666
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]  # no temporary beside it
    # The summary goes to stderr when written through: stdout may be the device itself.
    assert done.stdout == "" and done.stderr.startswith(f"{device}: ") and "parts" in done.stderr


def test_capture_to_dev_stdout_is_the_document_on_stdout(dgx: Node) -> None:
    """-o /dev/stdout, a symlink to /proc/self/fd/1 (a pipe here): the document is written
    into the pipe, the symlink left as it is, the summary on stderr."""
    if not os.path.islink("/dev/stdout"):
        pytest.skip("/dev/stdout is no symlink here")
    done = run(*dgx.cli_args, "capture", "-o", "/dev/stdout", env=dgx.env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["schema"] == SCHEMA
    assert done.stderr.startswith("/dev/stdout: ") and done.stderr.count("\n") == 1
    assert os.path.islink("/dev/stdout")


@pytest.mark.parametrize("redirect", ["truncate", "append"])
def test_capture_to_dev_stdout_redirected_to_a_file_writes_into_it(
    dgx: Node, tmp_path: Path, redirect: str
) -> None:
    """`capture -o /dev/stdout > file` and `>> log`: the document goes into the shell's
    open file through its descriptor. The file behind /proc/self/fd/1 was once replaced
    (its earlier lines lost, its owner's file now root's 0600)."""
    log = tmp_path / "app.log"
    log.write_text("an earlier line\n")
    log.chmod(0o644)
    nobody = 65534
    if os.geteuid() == 0:
        os.chown(log, nobody, nobody)
    before = log.stat()
    environ = {**CLEAN_ENVIRON, "PATH": os.environ["PATH"], **dgx.env}
    mode = "ab" if redirect == "append" else "wb"
    with open(log, mode) as stdout:
        done = subprocess.run(
            [*NODECHECK, *dgx.cli_args, "capture", "-o", "/dev/stdout"],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            env=environ,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    after = log.stat()
    assert (after.st_ino, after.st_uid, stat.S_IMODE(after.st_mode)) == (
        before.st_ino,
        before.st_uid,
        0o644,
    )
    text = log.read_text()
    if redirect == "append":
        assert text.startswith("an earlier line\n")
        text = text.removeprefix("an earlier line\n")
    assert json.loads(text)["schema"] == SCHEMA
    assert done.stderr.startswith("/dev/stdout: ")


def test_a_symlink_another_user_planted_in_a_sticky_folder_is_not_followed(
    dgx: Node, tmp_path: Path
) -> None:
    """A user's symlink in /tmp-like folder (sticky, world-writable) to root's file:
    root's capture refuses it (exit 2) and the file is left whole; it was replaced by the
    capture, mode 0600, where fs.protected_symlinks is 0."""
    if os.geteuid() != 0:
        pytest.skip("needs root: another user's symlink, as root follows it")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "precious.conf"
    victim.write_text("keep me\n")
    link = shared / "capture.json"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)
    done = run(*dgx.cli_args, "capture", "-o", str(link), env=dgx.env)
    assert done.returncode == 2, done.stderr
    assert "not followed" in done.stderr and "uid 65534" in done.stderr
    assert victim.read_text() == "keep me\n"
    assert link.is_symlink()


def test_a_device_that_is_neither_null_nor_a_terminal_is_refused_unopened(
    dgx: Node, tmp_path: Path
) -> None:
    """-o a character device other than /dev/null or a terminal (a node of /dev/zero's
    numbers, 1:5, stands for /dev/watchdog, which an open arms): exit 2, the device left
    as it is, nothing written."""
    device = tmp_path / "zero"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    before = os.lstat(device)
    done = run(*dgx.cli_args, "capture", "-o", str(device), env=dgx.env)
    assert done.returncode == 2, done.stderr
    assert "(1:5) that is neither a terminal nor /dev/null" in done.stderr
    after = os.lstat(device)
    assert (after.st_ino, after.st_rdev, after.st_atime) == (
        before.st_ino,
        before.st_rdev,
        before.st_atime,
    )


def test_capture_through_a_symlink_replaces_its_target_and_keeps_the_link(
    dgx: Node, tmp_path: Path
) -> None:
    """-o a symlink to a file: the symlink stays, the file it names is replaced atomically
    (mode 0600), and stderr says so."""
    target = tmp_path / "bundles" / "today.json"
    target.parent.mkdir()
    target.write_text("old")
    target.chmod(0o644)
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    done = run(*dgx.cli_args, "capture", "-o", str(link), env=dgx.env)
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert load(target).get("hostname") == "dgx-h100-01"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert f"{link} is a symlink: replaced its target {target} atomically" in done.stderr
    assert done.stdout.startswith(f"{link}: ")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["bundles", "latest.json", "today.json"]


def read_fifo_while(reader: int, writing: threading.Thread) -> bytes:
    """Everything written into the FIFO whose read end is `reader` (opened non-blocking,
    before the writer started) until `writing` is over."""
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        select.select([reader], [], [], 1.0)
        try:
            chunk = os.read(reader, 1 << 16)
        except BlockingIOError:  # a writer, nothing written yet
            continue
        if chunk:
            chunks.append(chunk)
        elif not writing.is_alive():  # end of file, and no writer will come
            return b"".join(chunks)
        else:  # end of file until the writer opens it (fifo(7)): poll for it
            writing.join(0.05)
    raise AssertionError("the writer did not finish within 120 s")


def test_capture_writes_through_a_fifo_to_its_reader(dgx: Node, tmp_path: Path) -> None:
    """-o a FIFO someone reads: the document goes to the reader; the FIFO stays a FIFO."""
    fifo = tmp_path / "bundle.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # there before the writer opens
    done: list[subprocess.CompletedProcess[str]] = []
    try:
        writing = threading.Thread(
            target=lambda: done.append(run(*dgx.cli_args, "capture", "-o", str(fifo), env=dgx.env))
        )
        writing.start()
        received = read_fifo_while(reader, writing)
    finally:
        os.close(reader)
    assert done[0].returncode == 0, done[0].stderr
    assert json.loads(received)["schema"] == SCHEMA
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["bundle.fifo"]


def test_capture_records_what_it_could_not_read(
    dgx: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part whose reader fails (every real reader turns what it meets into problems,
    so one is made to raise here): the capture still exits 0 with the other parts,
    records that part as Unread, and names it on stderr in one line."""
    from click.testing import CliRunner

    from nodecheck.agent.cli import cli
    from nodecheck.checks.node import facts as facts_module

    def broken(sources: object, facts: object) -> None:
        raise OSError("DMI table unreadable")

    spec = facts_module.PARTS["virtualization"]
    monkeypatch.setitem(
        facts_module.PARTS, "virtualization", dataclasses.replace(spec, reader=broken)
    )
    path = tmp_path / "bundle.json"
    result = CliRunner().invoke(cli, [*dgx.cli_args, "capture", "-o", str(path)], env=dgx.env)
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "nodecheck capture: recorded as unread: virtualization "
        "(reading virtualization failed: OSError: DMI table unreadable)\n"
    )
    facts = load(path)
    assert isinstance(facts.parts["virtualization"], Unread)
    assert facts.get("hostname") == "dgx-h100-01"


def test_every_part_is_documented() -> None:
    """docs/facts.md has a row for every part a capture may hold (a new part is
    documented where its readers' users look)."""
    from nodecheck.checks.node.facts import PARTS

    text = (Path(__file__).parents[2] / "docs" / "facts.md").read_text()
    undocumented = [
        name for name, spec in PARTS.items() if spec.captured and f"| `{name}` |" not in text
    ]
    assert undocumented == []


def test_a_kernel_log_of_this_node_is_no_option_for_a_capture(
    faulty_capture: Path, tmp_path: Path
) -> None:
    """--kernel-log reads this node's log; the capture holds its own: a usage error."""
    log = tmp_path / "kern.log"
    log.write_text("Dec  1 10:00:00 host kernel: [    1.0] Linux version 6.8\n")
    done = run(*NOWHERE, "check", "--facts", str(faulty_capture), "--kernel-log", str(log))
    assert done.returncode == 2
    assert done.stderr == (
        "nodecheck: --kernel-log reads this node; a capture (--facts) holds its own\n"
    )
