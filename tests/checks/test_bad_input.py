"""Missing, empty, garbage and unreadable files: an `error` result naming the path, never a crash
and never a pass."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from nodecheck.checks.result import Status
from tests.conftest import Node, by_status

GPU = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
DSP = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0"
CPU5 = "sys/devices/system/cpu/cpu5/topology"
NOBODY = 65534

CASES = [
    # (file under the node, new content or None to delete, check, subject, words in the summary)
    (f"{GPU}/current_link_width", "", "pcie_link", "gpu 0000:18:00.0", "an empty file"),
    (f"{GPU}/max_link_speed", "fast\n", "pcie_link", "gpu 0000:18:00.0", "'fast'"),
    (f"{GPU}/current_link_speed", None, "pcie_link", "gpu 0000:18:00.0", "missing"),
    (f"{GPU}/class", "display\n", "pcie_link", "pci 0000:18:00.0", "expected a class code"),
    (f"{GPU}/numa_node", "zero\n", "numa", "gpu 0000:18:00.0", "expected an integer"),
    (f"{DSP}/config", None, "pcie_acs", "bridge 0000:17:00.0", "missing"),
    (f"{DSP}/config", "\x00" * 100, "pcie_acs", "bridge 0000:17:00.0", "100 bytes"),
    (
        "sys/devices/system/node/node1/meminfo",
        "garbage\n",
        "numa",
        "numa 1",
        "expected a MemTotal line",
    ),
    (f"{CPU5}/thread_siblings_list", "x-y\n", "cpu", "node", "cpu5"),
    ("proc/sys/kernel/numa_balancing", "on\n", "numa", "node", "expected a number"),
]


@pytest.mark.parametrize(
    ("relative", "content", "check", "subject", "words"),
    CASES,
    ids=[
        f"{case[0].rsplit('/', 1)[-1]}-{'deleted' if case[1] is None else 'bad'}" for case in CASES
    ],
)
def test_bad_file_is_an_error_naming_it(
    dgx: Node,
    copy_node: Callable[[Node], Node],
    relative: str,
    content: str | None,
    check: str,
    subject: str,
    words: str,
) -> None:
    node = copy_node(dgx)
    path = node.root / relative
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    results = node.results(check)
    errors = [r for r in by_status(results, Status.ERROR) if r.subject == subject]
    assert errors, [(r.status, r.subject, r.summary) for r in results]
    summary = errors[0].summary
    assert path.name in summary and words in summary, summary
    # The rest of the node is still judged.
    assert len(by_status(results, Status.OK)) > 1


def test_missing_tree_gives_no_pass(tmp_path: Path) -> None:
    """An empty sysfs: nothing is judged healthy."""
    (tmp_path / "sys").mkdir()
    (tmp_path / "proc").mkdir()
    node = Node(tmp_path)
    results = node.results("cpu", "pcie_link", "pcie_acs", "numa")
    assert by_status(results, Status.OK) == []
    assert by_status(results, Status.ERROR)  # no CPU could be read


def _results_as_nobody(node: Node, check: str) -> list[tuple[str, str, str]]:
    """Run a check as an unprivileged user (root reads any file), in a forked child.

    The child drops to nobody after the modules are loaded, so it needs no
    access to the interpreter's files, only to the node tree.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            rows = [(r.status.value, r.subject, r.summary) for r in node.results(check)]
            with os.fdopen(write_end, "w") as pipe:
                json.dump(rows, pipe)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return [tuple(row) for row in json.loads(data)]


def test_unreadable_file_is_an_error_naming_it(dgx: Node, scratch_dir: Path) -> None:
    # The scratch folder is private to its owner: share a folder inside it.
    scratch_dir.chmod(0o755)
    shared = Path(tempfile.mkdtemp(prefix="unreadable-", dir=scratch_dir))
    try:
        shared.chmod(0o755)
        shutil.copytree(dgx.root, shared / "node", symlinks=True)
        node = Node(shared / "node")
        node.root.chmod(0o755)  # copied from pytest's private folder
        path = node.root / GPU / "current_link_width"
        path.chmod(0o000)
        rows = _results_as_nobody(node, "pcie_link")
    finally:
        shutil.rmtree(shared)
    errors = [row for row in rows if row[1] == "gpu 0000:18:00.0"]
    assert errors and errors[0][0] == "error"
    assert str(path) in errors[0][2] and "permission denied" in errors[0][2]
    assert sum(1 for row in rows if row[0] == "ok") > 10
