"""The inventory read from the replica nodes and from this machine."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.pci import read_nvidia_gpus
from tests.conftest import LIVE, Node


def test_dgx_inventory(dgx: Node) -> None:
    inventory = read_inventory(dgx.fs)
    assert inventory.hostname == "dgx-h100-01"
    assert [g.bdf for g in inventory.gpus] == [
        "0000:18:00.0", "0000:1a:00.0", "0000:3a:00.0", "0000:3c:00.0",
        "0000:9a:00.0", "0000:9c:00.0", "0000:ba:00.0", "0000:bc:00.0",
    ]  # fmt: skip
    # NVSwitches carry NVIDIA's vendor id but are bridges, not GPUs.
    assert len(inventory.nvswitches) == 4
    assert [inventory.numa_node_of(g) for g in inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inventory.gpus[0].parents == ("0000:15:01.0", "0000:16:00.0", "0000:17:00.0")
    assert inventory.gpus[0].host_bridge == "pci0000:15"
    assert inventory.gpus[0].driver == "nvidia"
    names = [n.name for n in inventory.nics]
    assert names == [f"mlx5_{i}" for i in range(9)] + ["eno1"]
    mlx5_0 = inventory.nics[0]
    assert (mlx5_0.pci.bdf, mlx5_0.rate_gbps, mlx5_0.state) == ("0000:19:00.0", 400.0, "ACTIVE")
    assert [i.name for i in mlx5_0.interfaces] == ["ibp25s0"]
    assert inventory.nics[8].link_layer == "Ethernet"
    assert [format_cpulist(n.cpus) for n in inventory.numa_nodes] == [
        "0-55,112-167",
        "56-111,168-223",
    ]
    assert inventory.numa_nodes[0].memory_bytes == 1008 * 2**30
    assert (len(inventory.cpu.packages), len(inventory.cpu.cores)) == (2, 112)
    assert inventory.cpu.threads_per_core == 2
    assert inventory.cpu.cpus[112].siblings == {0, 112}
    virtual = {i.name for i in inventory.interfaces if i.virtual}
    assert virtual == {"lo", "docker0"}


def test_workstation_audio_function_is_not_a_gpu(workstation: Node) -> None:
    inventory = read_inventory(workstation.fs)
    assert [g.bdf for g in inventory.gpus] == ["0000:01:00.0"]
    assert "0000:01:00.1" in inventory.pci
    assert inventory.gpus[0].numa_node == -1
    assert inventory.numa_node_of(inventory.gpus[0]) == 0


def test_live_machine_inventory_reads_without_problems() -> None:
    inventory = read_inventory(LIVE.fs)
    assert inventory.cpu.cpus, "no CPU read from the live sysfs"
    problems = {bdf: d.problems for bdf, d in inventory.pci.items() if d.problems}
    assert problems == {}
    # Every physical interface maps to a PCI function, through any bus in between
    # (virtio-net sits under 0000:00:03.0/virtio2/net/eth0).
    for interface in inventory.interfaces:
        if not interface.virtual and interface.pci_bdf is not None:
            assert interface.pci_bdf in inventory.pci


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-h100-faulty", "workstation", "cpu-only"])
def test_gpu_only_read_matches_the_inventory(build: Callable[..., Node], name: str) -> None:
    """The GPU checks' lighter read finds the same GPUs, read the same way."""
    node = build(name)
    assert read_nvidia_gpus(node.fs) == read_inventory(node.fs).gpus
