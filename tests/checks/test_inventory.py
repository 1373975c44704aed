"""The inventory read from the replica nodes and from this machine."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from nodecheck.checks.node.cgroup import read_allowed_cpus
from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.pci import read_nvidia_gpus
from nodecheck.checks.node.topology import Relation
from tests.conftest import LIVE, Node
from tests.fixtures.graft import placed_gpus_spec
from tests.fixtures.nodegen import build_node


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


# --- a device whose firmware gives no NUMA node (numa_node -1) ------------------------------


def placed_node(tmp_path: Path, numa_nodes: list[int], **layout: int) -> NodeFS:
    root = tmp_path / "placed-gpus"
    build_node(placed_gpus_spec(numa_nodes, **layout), root)
    return NodeFS(sysfs=root / "sys", procfs=root / "proc", rootfs=root)


def test_minus_one_is_the_only_listed_node_with_cpus_whatever_its_number(tmp_path: Path) -> None:
    """hwloc's offline-cpu0-node0 capture: node 0 has no directory (offline, no memory)
    though its CPUs' cpuN/node0 links name it, and node 1 is the only node. A GPU at -1 is
    near node 1, never node 0 (which cannot be bound to), nor "no node"."""
    fs = placed_node(tmp_path, [-1, 1], sockets=2, cores=4)
    shutil.rmtree(fs.sysfs / "devices" / "system" / "node" / "node0")
    inventory = read_inventory(fs)
    assert {node.number: node.listed for node in inventory.numa_nodes} == {0: False, 1: True}
    assert inventory.cpu_node_numbers == {1}
    gpu, other = inventory.gpus
    assert inventory.numa_node_of(gpu) == 1
    # Both near node 1, on different host bridges: NODE, not SYS.
    assert inventory.relation(gpu, other) is Relation.NODE


def test_memory_only_nodes_do_not_make_minus_one_unknown(tmp_path: Path) -> None:
    """A one-socket Grace Hopper: node 0 has the CPUs, nodes 1-2 are GPU memory (no CPU).
    A device at -1 is near node 0, the only node with CPUs; with two CPU nodes it stays
    unknown."""
    fs = placed_node(tmp_path, [-1, -1], sockets=1, cores=4, memory_only_nodes=2)
    inventory = read_inventory(fs)
    assert [node.number for node in inventory.numa_nodes] == [0, 1, 2]
    assert inventory.cpu_node_numbers == {0}
    first, second = inventory.gpus
    assert [inventory.numa_node_of(gpu) for gpu in inventory.gpus] == [0, 0]
    assert inventory.relation(first, second) is Relation.NODE
    two = read_inventory(placed_node(tmp_path / "two", [-1, -1], sockets=2, cores=4))
    assert two.cpu_node_numbers == {0, 1}
    assert [two.numa_node_of(gpu) for gpu in two.gpus] == [None, None]
    assert two.relation(*two.gpus) is Relation.SYS


def test_topology_ids_are_read_once_per_core_and_package(
    dgx: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """core_id once per thread siblings list and physical_package_id once per package list
    (as hwloc's look_sysfscpu), plus one CPU that reads its own to check the firmware
    agrees; every CPU still gets the id its own file holds."""
    from nodecheck.checks.node import cpu as cpu_module

    read: list[str] = []
    real_read_id = cpu_module._read_id

    def counted(path: str) -> int | None:
        read.append(os.path.basename(path))
        return real_read_id(path)

    monkeypatch.setattr(cpu_module, "_read_id", counted)
    topology = read_inventory(dgx.fs).cpu
    assert len(topology.cores) == 112 and len(topology.packages) == 2
    assert read.count("core_id") == 112 + 1
    assert read.count("physical_package_id") == 2 + 1
    cpu_dir = dgx.root / "sys/devices/system/cpu"
    for number, cpu in topology.cpus.items():
        assert cpu.core == int((cpu_dir / f"cpu{number}/topology/core_id").read_text())
        ids = (cpu_dir / f"cpu{number}/topology/physical_package_id").read_text()
        assert cpu.package == int(ids)


def test_device_links_resolve_as_realpath(tmp_path: Path, dgx: Node) -> None:
    """A device's directory is where its `bus/pci/devices` link leads, whatever the link:
    the kernel's relative one, an absolute one, a link to a link, or a directory."""
    from nodecheck.checks.node.pci import read_pci_devices

    tree = tmp_path / "node"
    shutil.copytree(dgx.root / "sys", tree / "sys", symlinks=True)
    listing = tree / "sys/bus/pci/devices"
    real = {bdf: os.path.realpath(listing / bdf) for bdf in os.listdir(listing)}
    relative, absolute, chained, directory = sorted(real)[:4]
    (listing / absolute).unlink()
    (listing / absolute).symlink_to(real[absolute])
    (listing / chained).unlink()
    (tree / "elsewhere").symlink_to(os.path.relpath(real[chained], tree))
    (listing / chained).symlink_to("../../../../elsewhere")
    (listing / directory).unlink()
    shutil.copytree(real[directory], listing / directory, symlinks=True)
    real[directory] = str(listing / directory)
    devices = read_pci_devices(NodeFS(sysfs=tree / "sys", procfs=tree / "proc", rootfs=tree))
    assert os.readlink(listing / relative).startswith("../")
    assert {bdf: str(device.sysfs_dir) for bdf, device in devices.items()} == real
