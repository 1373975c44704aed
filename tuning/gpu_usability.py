"""Whether CUDA can drive a GPU meant for this host (checks/node/gpu_assignment.py leaves
out those passed through to a VM or not given to this container): it must answer on the
PCI bus and be bound to the nvidia driver. Judged from sysfs facts only (the gpu_presence
part, checks/node/gpu_presence.py, says why all ones in config space mean "not there"),
so `nodecheck tune` stays fast and never loads NVML.
"""

from __future__ import annotations

from nodecheck.checks.node.gpu_assignment import CUDA_DRIVER
from nodecheck.checks.node.gpu_presence import GpuPresence
from nodecheck.checks.node.pci import PciDevice


def usability_problem(gpu: PciDevice, presence: GpuPresence | None) -> tuple[str, bool]:
    """Why CUDA cannot drive this GPU ("" when it can), and whether that is certain (False:
    the config space could not be read, so it is not known whether the GPU answers).
    `presence` is the GPU's config-space reading (the gpu_presence part)."""
    if presence is None or presence.answers is None:
        why = "its config space was not read" if presence is None else presence.problem
        return f"could not tell whether GPU {gpu.bdf} answers on the PCI bus: {why}", False
    if not presence.answers:
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
