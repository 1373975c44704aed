"""Whether the node is a virtual machine, and the evidence.

ACS is required inside a VM (NCCL troubleshooting guide, "PCI Access Control
Services"), so ACS findings depend on this. Evidence, strongest first: the
`hypervisor` CPU flag that x86 hypervisors set (CPUID leaf 1, ECX bit 31), the
DMI vendor and product, and `<sysfs>/hypervisor/type` (Xen).
"""

from __future__ import annotations

from nodecheck.checks.node.cpu import read_cpuinfo
from nodecheck.checks.node.fs import NodeFS, ReadError, read_optional_text

VM_DMI_MARKERS = (
    "QEMU",
    "KVM",
    "VMware",
    "VirtualBox",
    "innotek",
    "Xen",
    "Amazon EC2",
    "Google Compute Engine",
    "Virtual Machine",  # Hyper-V and Azure: "Microsoft Corporation" / "Virtual Machine"
    "OpenStack",
    "Bochs",
    "Firecracker",
)


def detect_virtualization(fs: NodeFS) -> str | None:
    """A short reason when this looks like a VM, else None (bare metal)."""
    try:
        flags = read_cpuinfo(fs).get("flags", "").split()
    except ReadError:
        flags = []
    if "hypervisor" in flags:
        return "the CPU reports the hypervisor flag"
    for name in ("sys_vendor", "product_name"):
        try:
            value = read_optional_text(fs.sys("class", "dmi", "id", name))
        except ReadError:
            value = None
        if value and any(marker.lower() in value.lower() for marker in VM_DMI_MARKERS):
            return f"DMI {name} is {value!r}"
    try:
        hypervisor = read_optional_text(fs.sys("hypervisor", "type"))
    except ReadError:
        hypervisor = None
    if hypervisor:
        return f"{fs.sys('hypervisor', 'type')} is {hypervisor!r}"
    return None
