"""The inventory read from the replica nodes and from this machine."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nodecheck.checks.node.cgroup import read_allowed_cpus
from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.checks.node.fs import NodeFS
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


def cgroup_tree(tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> NodeFS:
    fs = NodeFS(sysfs=tmp_path / "sys", procfs=tmp_path / "proc", rootfs=tmp_path)
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text(proc_cgroup)
    for path, text in files.items():
        target = tmp_path / "sys" / "fs" / "cgroup" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return fs


def test_cpuset_of_a_slurm_step_v1(tmp_path: Path) -> None:
    fs = cgroup_tree(
        tmp_path,
        "12:cpuset:/slurm/uid_1000/job_42/step_0\n4:memory:/slurm/uid_1000/job_42/step_0\n",
        {
            "cpuset/cpuset.effective_cpus": "0-223\n",
            "cpuset/slurm/uid_1000/job_42/step_0/cpuset.effective_cpus": "0-13,112-125\n",
        },
    )
    assert read_allowed_cpus(fs) == frozenset(range(14)) | frozenset(range(112, 126))


def test_cpuset_v2_falls_back_to_the_nearest_ancestor_with_one(tmp_path: Path) -> None:
    """cpuset.cpus.effective exists only where the cpuset controller is enabled."""
    fs = cgroup_tree(
        tmp_path,
        "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
        {
            "cpuset.cpus.effective": "0-223\n",
            "system.slice/slurmstepd.scope/job_42/cpuset.cpus.effective": "56-69\n",
            "system.slice/slurmstepd.scope/job_42/step_0/user/task_0/cgroup.procs": "4242\n",
        },
    )
    assert read_allowed_cpus(fs) == frozenset(range(56, 70))


def test_no_cpuset_to_read(tmp_path: Path, dgx: Node) -> None:
    assert read_allowed_cpus(dgx.fs) is None  # a replica tree has no /proc/self
    fs = cgroup_tree(tmp_path, "0::/\n", {})  # cgroup2 without the cpuset controller
    assert read_allowed_cpus(fs) is None


def test_live_cpuset_holds_this_process() -> None:
    allowed = read_allowed_cpus(LIVE.fs)
    if allowed is None:
        pytest.skip("no cpuset on this machine")
    assert os.sched_getaffinity(0) <= allowed
