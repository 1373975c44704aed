"""The nvidia driver's numa_status, on literal strings as nv-procfs.c prints them."""

from __future__ import annotations

from pathlib import Path

from nodecheck.checks.node.coherent_gpus import CoherentGpus, parse_numa_status, read_coherent_gpus
from nodecheck.checks.node.fs import NodeFS


def test_numa_status_of_an_onlined_gpu() -> None:
    text = "Node:      2\nStatus:    online\nAddress:   40000000000\nSize:      2f00000000\n"
    assert parse_numa_status(text) == (2, "online")


def test_numa_status_before_the_memory_is_onlined() -> None:
    assert parse_numa_status("Node:      -1\nStatus:    offline\n") == (None, "offline")
    assert parse_numa_status("garbage") == (None, "")


def test_a_driver_folder_that_cannot_be_listed_is_a_problem_not_no_gpu(tmp_path: Path) -> None:
    """No folder: no coherent GPU. A folder that cannot be listed (here a file in its
    place; EACCES or EIO alike): the reading says why, never "none"."""
    fs = NodeFS(sysfs=tmp_path / "sys", procfs=tmp_path / "proc", rootfs=tmp_path)
    assert read_coherent_gpus(fs) == CoherentGpus({})
    driver = tmp_path / "proc" / "driver" / "nvidia"
    driver.mkdir(parents=True)
    (driver / "gpus").write_text("not a folder")
    reading = read_coherent_gpus(fs)
    assert reading.by_bus_id == {} and reading.problem is not None
    assert "gpus" in reading.problem
