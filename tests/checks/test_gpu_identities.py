"""The gpu_identities part: the nvidia driver's information file as it prints it (with
and without its UUID line), the replica's, and a tree with MIG instances and problems."""

from __future__ import annotations

from pathlib import Path

from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.gpu_identities import (
    DriverGpu,
    GpuIdentities,
    MigInstance,
    parse_gpu_information,
    read_gpu_identities,
)
from tests.conftest import Node

# nv_procfs_read_gpu_info's format (kernel-open/nvidia/nv-procfs.c), as a 570 driver
# prints it for an H100.
INFORMATION = (
    "Model: \t\t NVIDIA H100 80GB HBM3\n"
    "IRQ:   \t\t 305\n"
    "GPU UUID: \t GPU-5a88edbe-90c4-2449-8c43-70c57591cca1\n"
    "Video BIOS: \t 96.00.99.00.01\n"
    "Bus Type: \t PCIe\n"
    "DMA Size: \t 52 bits\n"
    "DMA Mask: \t 0xfffffffffffff\n"
    "Bus Location: \t 0000:9c:00.0\n"
    "Device Minor: \t 5\n"
    "GPU Firmware: \t 570.124.06\n"
    "GPU Excluded:\t No\n"
)
# The UUID line is printed only when rm_get_gpu_uuid gives one.
WITHOUT_UUID = "".join(line for line in INFORMATION.splitlines(True) if "UUID" not in line)


def test_the_information_file_with_and_without_its_uuid_line() -> None:
    assert parse_gpu_information(INFORMATION) == ("GPU-5a88edbe-90c4-2449-8c43-70c57591cca1", 5)
    assert parse_gpu_information(WITHOUT_UUID) == (None, 5)
    # The driver prints nothing when it cannot take its power reference.
    assert parse_gpu_information("") == (None, None)
    # A minor past nine digits is no minor the driver prints.
    assert parse_gpu_information("Device Minor: \t 12345678901\n") == (None, None)


def test_the_replica_s_gpus(dgx: Node) -> None:
    identities = read_gpu_identities(dgx.fs)
    assert identities.problem == "" and len(identities.by_bus_id) == 8
    assert identities.by_bus_id["0000:9c:00.0"] == DriverGpu(
        "0000:9c:00.0", "GPU-6f0c0005-1b2e-4d5c-9a7b-00000000009c", 5, ()
    )


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_mig_instances_and_each_problem_where_it_happened(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    gpus = proc / "driver" / "nvidia" / "gpus"
    caps = proc / "driver" / "nvidia" / "capabilities"
    write(gpus / "0000:01:00.0" / "information", WITHOUT_UUID.replace("\t 5", "\t 0"))
    write(gpus / "0000:02:00.0" / "information", INFORMATION.replace("\t 5", "\t 1"))
    for instance in ("gi1/access", "gi1/ci0/access", "gi2/access", "gi2/ci0/access"):
        write(caps / "gpu1" / "mig" / instance, "DeviceFileMinor: 21\nDeviceFileMode: 292\n")
    (gpus / "0000:03:00.0" / "information").mkdir(parents=True)  # not a file
    write(gpus / "0000:04:00.0" / "information", INFORMATION.replace("\t 5", "\t 3"))
    write(caps / "gpu3" / "mig", "")  # a file where a folder is: cannot be listed
    write(gpus / "0000:05:00.0" / "information", "")
    write(gpus / "README", "not a GPU\n")
    identities = read_gpu_identities(NodeFS(sysfs=tmp_path / "sys", procfs=proc))
    found = identities.by_bus_id
    assert list(found) == [f"0000:0{n}:00.0" for n in range(1, 6)]
    assert found["0000:01:00.0"] == DriverGpu("0000:01:00.0", None, 0, ())
    assert found["0000:01:00.0"].uuid_unknown_why == "its information file prints no GPU UUID line"
    assert found["0000:02:00.0"].mig_instances == (MigInstance(1, 0), MigInstance(2, 0))
    assert found["0000:02:00.0"].lists(MigInstance(2, 0))
    assert not found["0000:02:00.0"].lists(MigInstance(3, 0))
    assert found["0000:03:00.0"].uuid is None and found["0000:03:00.0"].mig_instances is None
    assert "information" in found["0000:03:00.0"].problem
    assert found["0000:04:00.0"].mig_instances is None
    assert "capabilities/gpu3/mig: not a directory" in found["0000:04:00.0"].mig_problem
    assert found["0000:05:00.0"].uuid_unknown_why.endswith("is empty (the driver printed nothing)")
    assert found["0000:05:00.0"].mig_problem == "its device minor is not known"


def test_no_driver_folder_is_no_gpu_and_an_unlistable_one_is_a_problem(tmp_path: Path) -> None:
    fs = NodeFS(sysfs=tmp_path / "sys", procfs=tmp_path / "proc")
    assert read_gpu_identities(fs) == GpuIdentities({})
    write(tmp_path / "proc" / "driver" / "nvidia" / "gpus", "")
    unlistable = read_gpu_identities(fs)
    assert unlistable.by_bus_id == {} and "not a directory" in unlistable.problem
