"""Which GPUs on the PCI bus are this host's, and this container's, to use.

sysfs shows every GPU of the machine, but two kinds are not meant to be used here:

- a GPU bound to a driver that holds a device for a guest: vfio-pci and its variant
  drivers such as nvgrace-gpu-vfio-pci (Documentation/driver-api/vfio.rst and
  drivers/vfio/pci/ in the kernel tree), pci-stub ("reserve PCI devices for assignment
  to guests", drivers/pci/pci-stub.c) or Xen's pciback (drivers/xen/xen-pciback/). It is
  passed through to a VM: the host's nvidia driver never numbers it, nor does CUDA.
- inside a container, a GPU bound to nvidia that is absent from /proc/driver/nvidia/gpus:
  libnvidia-container mounts only the assigned GPUs' folders there (mount_procfs_gpu in
  NVIDIA/libnvidia-container src/nvc_mount.c) and only their /dev/nvidiaN, while sysfs
  still shows every GPU of the host. CUDA in the container enumerates only those given.

A GPU with no driver, or with another host driver (nouveau), IS meant for this host: the
nvidia driver should hold it and does not, which is a fault of the node, not a choice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import field

from nodecheck.checks.node.pci import PciDevice
from nodecheck.checks.record import record

CUDA_DRIVER = "nvidia"
GUEST_DRIVERS = ("pci-stub", "pciback")


def holds_for_a_guest(driver: str) -> bool:
    """Whether this driver holds a device for a VM (vfio-pci, a vfio variant, pci-stub,
    pciback) rather than drive it on the host."""
    return "vfio" in driver or driver in GUEST_DRIVERS


def not_meant_here(gpu: PciDevice, exposed: set[str] | None) -> str | None:
    """Why a GPU on the bus is not this host's (or this container's) to use; None when it
    is. `exposed`: the bus ids in /proc/driver/nvidia/gpus (None: not known)."""
    if gpu.driver is not None and holds_for_a_guest(gpu.driver):
        return f"bound to {gpu.driver}, not the nvidia driver (passed through to a VM?)"
    if gpu.driver == CUDA_DRIVER and exposed is not None and gpu.bdf not in exposed:
        return "not assigned to this container (absent from /proc/driver/nvidia/gpus)"
    return None


@record
class GpuAssignment:
    """The GPUs on the bus (bus order), sorted by who may use them.

    `host`: all but those passed through to a VM, the GPUs the host's driver numbers
    (Slurm's GPU indices count these). `here`: of those, the ones this process may use
    (all of `host` outside a container), which CUDA enumerates; a dead GPU meant for this
    host stays in both, for whoever reads them to refuse. `left_out`: bus id -> why a GPU
    is not meant here.
    """

    host: list[PciDevice]
    here: list[PciDevice]
    left_out: dict[str, str] = field(default_factory=dict)


def assign_gpus(gpus: Iterable[PciDevice], exposed: set[str] | None) -> GpuAssignment:
    """Sort the GPUs on the bus by not_meant_here."""
    host, here, left_out = [], [], {}
    for gpu in gpus:
        if gpu.driver is None or not holds_for_a_guest(gpu.driver):
            host.append(gpu)
        reason = not_meant_here(gpu, exposed)
        if reason is None:
            here.append(gpu)
        else:
            left_out[gpu.bdf] = reason
    return GpuAssignment(host, here, left_out)
