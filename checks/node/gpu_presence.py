"""Whether each NVIDIA GPU on the PCI bus still answers configuration requests: the
first dword of its `config` file (vendor and device ids), read now.

A device that no longer answers (fallen off the bus) reads as all ones: a request that
no function claims completes with all-1s data (PCI Express Base Specification,
"Unsupported Request" / master abort handling), and the kernel's own presence test,
pci_device_is_present() in drivers/pci/pci.c, reads the vendor id and treats all ones
(and all zeros) as "not there". The `vendor` attribute of sysfs is cached at
enumeration, so it still says 0x10de; only the `config` file reads the device now. The
first 64 bytes of config space are readable without root.
"""

from __future__ import annotations

import struct
from dataclasses import field

from nodecheck.checks.node.fs import ReadError
from nodecheck.checks.node.pci import PciDevice
from nodecheck.checks.node.pci_config import read_config
from nodecheck.checks.record import record

# What pci_bus_generic_read_dev_vendor_id() (drivers/pci/probe.c) takes for "no device"
# in the first dword of config space (vendor id in the low 16 bits, device id above).
NO_DEVICE_IDS = (0xFFFFFFFF, 0x00000000, 0x0000FFFF, 0xFFFF0000)


def answers_config_reads(config: bytes) -> bool | None:
    """Whether the first dword of config space shows a device; None: fewer than 4 bytes."""
    if len(config) < 4:
        return None
    (ids,) = struct.unpack_from("<I", config, 0)
    return ids not in NO_DEVICE_IDS


@record
class GpuPresence:
    """`answers` None: not known, `problem` says why (the file could not be read, or
    held fewer than 4 bytes); `path` is the config file read."""

    path: str
    answers: bool | None
    problem: str = ""


@record
class GpuPresences:
    by_bus_id: dict[str, GpuPresence] = field(default_factory=dict)


def read_gpu_presence(gpu: PciDevice) -> GpuPresence:
    path = gpu.attr("config")
    try:
        answers = answers_config_reads(read_config(path))
    except ReadError as err:
        return GpuPresence(str(path), None, str(err))
    if answers is None:
        return GpuPresence(str(path), None, f"{path} holds fewer than 4 bytes")
    return GpuPresence(str(path), answers)


def read_gpu_presences(gpus: list[PciDevice]) -> GpuPresences:
    return GpuPresences({gpu.bdf: read_gpu_presence(gpu) for gpu in gpus})
