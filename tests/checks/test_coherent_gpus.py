"""The nvidia driver's numa_status, on literal strings as nv-procfs.c prints them."""

from __future__ import annotations

from nodecheck.checks.node.coherent_gpus import parse_numa_status


def test_numa_status_of_an_onlined_gpu() -> None:
    text = "Node:      2\nStatus:    online\nAddress:   40000000000\nSize:      2f00000000\n"
    assert parse_numa_status(text) == (2, "online")


def test_numa_status_before_the_memory_is_onlined() -> None:
    assert parse_numa_status("Node:      -1\nStatus:    offline\n") == (None, "offline")
    assert parse_numa_status("garbage") == (None, "")
