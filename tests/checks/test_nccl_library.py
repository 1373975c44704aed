"""The installed NCCL's version, read from the library's file name under the root
filesystem and from a pip wheel's metadata (never by loading NCCL or importing torch),
and what depends on it: GID discovery on RoCE from 2.21."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest

from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.nccl_library import read_nccl_libraries
from nodecheck.checks.node.net import AddressedInterfaces
from nodecheck.checks.result import Status
from nodecheck.tuning.bindings import pair_nics
from nodecheck.tuning.nccl import JobShape, gid_discovery_warning, nccl_advice
from tests.conftest import Node, by_status

LIB_DIR = "usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def xe(build: Callable[..., Node]) -> Node:
    """The XE9680 replica: its compute and storage ports are RoCE."""
    return build("xe9680")


def with_library(node: Node, name: str) -> None:
    """The files a libnccl2 package leaves: the real file, and the soname linking to it."""
    directory = node.root / LIB_DIR
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(b"\x7fELF")
    (directory / "libnccl.so.2").unlink(missing_ok=True)
    (directory / "libnccl.so.2").symlink_to(name)


def wheel(tmp_path: Path, name: str, version: str) -> list[metadata.Distribution]:
    """A pip-installed nvidia-nccl wheel's metadata, as pip writes it."""
    info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return list(metadata.distributions(path=[str(tmp_path)]))


def test_versions_from_file_names_and_wheel_metadata(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / LIB_DIR).mkdir(parents=True)
    (root / LIB_DIR / "libnccl.so.2.18.3").write_bytes(b"\x7fELF")
    (root / LIB_DIR / "libnccl.so.2").symlink_to("libnccl.so.2.18.3")  # the soname: no version
    (root / LIB_DIR / "libnccl_static.a").write_bytes(b"!<arch>")
    fs = NodeFS(root / "sys", root / "proc", root)
    found = read_nccl_libraries(fs, wheel(tmp_path / "site", "nvidia-nccl-cu12", "2.21.5"))
    assert [library.text for library in found.found] == [
        "NCCL 2.18.3 (/usr/lib/x86_64-linux-gnu/libnccl.so.2.18.3)",
        "NCCL 2.21.5 (pip package nvidia-nccl-cu12)",
    ]
    assert [library.version for library in found.without_gid_discovery] == [(2, 18, 3)]
    assert found.problems == ()
    # Another root's packages are not this Python's: none are read for it.
    assert read_nccl_libraries(fs).found == found.found[:1]


def test_an_unlistable_library_directory_is_an_error(
    xe: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(xe)
    (node.root / "usr/lib64").parent.mkdir(parents=True, exist_ok=True)
    (node.root / "usr/lib64").write_text("not a directory")
    results = node.results("nccl_env")
    [error] = [r for r in results if "NCCL library" in r.summary]
    assert error.status is Status.ERROR and "usr/lib64" in error.summary


def test_old_nccl_on_roce_without_a_gid_index_warns(
    xe: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(xe)
    with_library(node, "libnccl.so.2.18.3")
    results = node.results("nccl_env")
    [warning] = [r for r in by_status(results, Status.WARN) if "RoCE v2 GID" in r.summary]
    assert warning.summary.startswith("NCCL 2.18.3 (/usr/lib/x86_64-linux-gnu/libnccl.so.2.18.3)")
    assert "RoCE v2" in warning.remedy and "2.21" in warning.remedy
    # Told which GID to use, the old NCCL needs nothing more here (gid_index_findings
    # judges the index itself).
    told = node.results("nccl_env", environ={"NCCL_IB_GID_INDEX": "3"})
    assert not [r for r in told if "RoCE v2 GID itself" in r.summary]
    # 2.21 finds the GID itself; the version is in the check's details.
    with_library(node, "libnccl.so.2.21.5")
    (node.root / LIB_DIR / "libnccl.so.2.18.3").unlink()
    results = node.results("nccl_env")
    assert not [r for r in results if "RoCE v2 GID itself" in r.summary]
    [ok] = [r for r in results if r.status is Status.OK]
    assert ok.details["nccl_libraries"] == [
        "NCCL 2.21.5 (/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5)"
    ]


def test_tune_names_the_installed_version(xe: Node, copy_node: Callable[[Node], Node]) -> None:
    node = copy_node(xe)
    with_library(node, "libnccl.so.2.18.3")
    inventory = read_inventory(node.fs)
    libraries = read_nccl_libraries(node.fs)
    pairings = pair_nics(inventory, inventory.gpus)
    advice = nccl_advice(
        inventory, pairings, AddressedInterfaces(None), {}, JobShape(4), 8, libraries
    )
    [gid] = [item for item in advice.left_unset if item.names == ("NCCL_IB_GID_INDEX",)]
    assert "installed: NCCL 2.18.3" in gid.reason
    rails = [f"mlx5_{i}" for i in (0, 3, 4, 5, 6, 9, 10, 11)]  # each switch's CX-7
    assert f"on the RoCE rails ({', '.join(rails)})" in gid.reason
    warning = gid_discovery_warning(inventory, libraries, rails)
    assert warning is not None and warning in advice.notes
    assert "older than 2.21" in warning and "does not find the RoCE v2 GID" in warning


def test_tune_on_the_command_line_reads_the_version(
    xe: Node, copy_node: Callable[[Node], Node]
) -> None:
    """The plan reads the libraries itself: `tune --format json` names the version and
    warns about GID discovery before 2.21 on this RoCE node."""
    import json

    from tests.agent.test_cli import run

    node = copy_node(xe)
    with_library(node, "libnccl.so.2.18.3")
    done = run(*node.cli_args, "tune", "--format", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    [gid] = [item for item in doc["left_unset"] if item["names"] == ["NCCL_IB_GID_INDEX"]]
    assert "installed: NCCL 2.18.3" in gid["reason"]
    assert any("older than 2.21" in note for note in doc["notes"])
