"""Whether CUDA can drive a GPU meant for this host (checks/node/gpu_assignment.py leaves
out those passed through to a VM or not given to this container): it must answer on the
PCI bus and be bound to the nvidia driver. Read from sysfs only, so `nodecheck tune` stays
fast and never loads NVML.

A device that no longer answers configuration requests (fallen off the bus) reads as
all ones: a request that no function claims completes with all-1s data (PCI Express
Base Specification, "Unsupported Request" / master abort handling), and the kernel's
own presence test, pci_device_is_present() in drivers/pci/pci.c, reads the vendor id
and treats all ones (and all zeros) as "not there". The `vendor` attribute of sysfs is
cached at enumeration, so it still says 0x10de; only the `config` file reads the
device now.
"""

from __future__ import annotations

import struct

from nodecheck.checks.node.fs import ReadError
from nodecheck.checks.node.gpu_assignment import CUDA_DRIVER
from nodecheck.checks.node.pci import PciDevice
from nodecheck.checks.node.pci_config import read_config

# What pci_bus_generic_read_dev_vendor_id() (drivers/pci/probe.c) takes for "no device"
# in the first dword of config space (vendor id in the low 16 bits, device id above).
NO_DEVICE_IDS = (0xFFFFFFFF, 0x00000000, 0x0000FFFF, 0xFFFF0000)


def answers_config_reads(config: bytes) -> bool | None:
    """Whether the first dword of config space shows a device; None: fewer than 4 bytes."""
    if len(config) < 4:
        return None
    (ids,) = struct.unpack_from("<I", config, 0)
    return ids not in NO_DEVICE_IDS


def usability_problem(gpu: PciDevice) -> tuple[str, bool]:
    """Why CUDA cannot drive this GPU ("" when it can), and whether that is certain (False:
    the config space could not be read, so it is not known whether the GPU answers)."""
    path = gpu.attr("config")
    try:
        answers = answers_config_reads(read_config(path))
    except ReadError as err:
        return f"could not tell whether GPU {gpu.bdf} answers on the PCI bus: {err}", False
    if answers is None:
        return (
            f"could not tell whether GPU {gpu.bdf} answers on the PCI bus: {path} holds "
            "fewer than 4 bytes",
            False,
        )
    if not answers:
        return (
            f"GPU {gpu.bdf} does not answer on the PCI bus (fallen off?): drain the node; "
            "CUDA will not see it, so local ranks after it would shift",
            True,
        )
    if gpu.driver is None:
        return (
            f"GPU {gpu.bdf} has no driver bound (no {gpu.attr('driver')} link): CUDA will "
            "not see it, so local ranks after it would shift; load the nvidia driver or "
            "drain the node",
            True,
        )
    if gpu.driver != CUDA_DRIVER:
        return (
            f"GPU {gpu.bdf} is bound to {gpu.driver}, not to nvidia: CUDA will not see it "
            f"here, so local ranks after it would shift; blacklist {gpu.driver} or drain "
            "the node",
            True,
        )
    return "", True
