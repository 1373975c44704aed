"""PCI devices from `<sysfs>/bus/pci/devices/*`.

Attribute meanings: Linux Documentation/ABI/testing/sysfs-bus-pci. Each entry
there is a symlink into `<sysfs>/devices/pciDDDD:BB/...`; the components of
the resolved path that look like a bus address are the bridges between the
device and its host bridge, root port first (NCCL builds its topology the
same way, src/os/linux.cc ncclOsGetPciPath).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import TypeVar

from nodecheck.checks.node.cpulist import cpu_id_bound, parse_cpulist
from nodecheck.checks.node.fs import (
    ImplausibleValueError,
    NodeFS,
    ReadError,
    list_dir,
    os_error_reason,
    parse_attr,
    read_link,
    read_optional_text,
    read_parsed,
    read_text,
)
from nodecheck.checks.record import record

T = TypeVar("T")

BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
HOST_BRIDGE_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")

VENDOR_NVIDIA = 0x10DE

# PCI base class << 8 | subclass, from the PCI Code and ID Assignment spec
# (pciutils lib/header.h PCI_CLASS_*).
CLASS_DISPLAY_VGA = 0x0300
CLASS_DISPLAY_3D = 0x0302
CLASS_NETWORK_ETHERNET = 0x0200
CLASS_NETWORK_INFINIBAND = 0x0207
CLASS_BRIDGE_PCI = 0x0604
CLASS_BRIDGE_OTHER = 0x0680  # NVSwitch enumerates as this, with NVIDIA's vendor id


# The transfer rates of PCI Express generations 1 to 7 (PCIe Base Specification;
# drivers/pci/probe.c pci_speed_string prints "2.5 GT/s PCIe" ... "64.0 GT/s PCIe").
PCIE_SPEEDS_GTS = (2.5, 5.0, 8.0, 16.0, 32.0, 64.0, 128.0)
# Link widths the PCIe Base Specification defines (Link Capabilities, Maximum Link Width).
PCIE_WIDTHS = (1, 2, 4, 8, 12, 16, 32)
# MAX_NUMNODES is 1 << CONFIG_NODES_SHIFT, and NODES_SHIFT is at most 10
# (arch/x86/Kconfig, mm/Kconfig); -1 is NUMA_NO_NODE (sysfs-bus-pci, numa_node).
MAX_NUMNODES = 1 << 10


def parse_link_speed(text: str) -> float | None:
    """GT/s from a `*_link_speed` attribute: "32.0 GT/s PCIe" -> 32.0.

    The kernel prints "Unknown" (drivers/pci/probe.c pci_speed_string) for a
    link it cannot decode, which usually means the link is down; that is None.
    Older kernels print "8 GT/s" without the "PCIe" suffix. A rate no PCIe
    generation has is ImplausibleValueError.
    """
    text = text.strip()
    if text.startswith("Unknown"):
        return None
    match = re.match(r"^(\d{1,3}(?:\.\d{1,2})?) GT/s", text)
    if not match:
        raise ValueError(f"not a link speed: {text!r}")
    speed = float(match.group(1))
    problem = link_speed_problem(speed)
    if problem:
        raise ImplausibleValueError(problem)
    return speed


def link_speed_problem(speed: float) -> str | None:
    """Why no PCIe link runs at `speed` GT/s, or None (one definition for sysfs and for a
    capture)."""
    if speed in PCIE_SPEEDS_GTS:
        return None
    shown = ", ".join(f"{known:g}" for known in PCIE_SPEEDS_GTS)
    return f"no PCIe generation runs at {speed:g} GT/s ({shown})"


def link_width_problem(width: int) -> str | None:
    """Why no PCIe link is `width` lanes wide, or None."""
    if width in PCIE_WIDTHS:
        return None
    shown = ", ".join(f"x{known}" for known in PCIE_WIDTHS)
    return f"PCIe links are {shown} wide, not x{width}"


def numa_node_problem(node: int) -> str | None:
    """Why a device's numa_node cannot be `node`, or None."""
    if -1 <= node < MAX_NUMNODES:
        return None
    return f"NUMA nodes are -1 to {MAX_NUMNODES - 1}, not {node}"


def parse_link_width(text: str) -> int | None:
    """Lanes from a `*_link_width` attribute; 0, what a link that is down reports, is None."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        raise ValueError(f"not a lane count: {text!r}")
    width = int(text)
    if width == 0:
        return None
    problem = link_width_problem(width)
    if problem:
        raise ImplausibleValueError(problem)
    return width


def parse_numa_node(text: str) -> int:
    """A device's `numa_node`: -1 (no locality known) or a node below MAX_NUMNODES."""
    text = text.strip()
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 12:
        raise ValueError(f"not a NUMA node: {text!r}")
    node = int(text)
    problem = numa_node_problem(node)
    if problem:
        raise ImplausibleValueError(problem)
    return node


def parse_pci_class(text: str) -> int:
    """Base class and subclass from a `class` attribute: "0x030200" -> 0x0302."""
    value = int(text, 16)
    if not 0 <= value <= 0xFFFFFF:
        raise ValueError(f"class out of range: {text!r}")
    return value >> 8


@record
class PcieLink:
    """Negotiated and maximum link of a PCI Express device (None: "Unknown")."""

    current_speed: float | None
    current_width: int | None
    max_speed: float | None
    max_width: int | None

    def implausible(self) -> tuple[str, str] | None:
        """A speed or width no PCIe link has: reading sysfs refuses them (a problem of the
        device), so only an edited capture holds one."""
        for name, speed in (("current_speed", self.current_speed), ("max_speed", self.max_speed)):
            problem = None if speed is None else link_speed_problem(speed)
            if problem:
                return name, problem
        for name, width in (("current_width", self.current_width), ("max_width", self.max_width)):
            problem = None if width is None else link_width_problem(width)
            if problem:
                return name, problem
        return None


@record(frozen=False)
class PciDevice:
    """One PCI function as sysfs shows it.

    `chain` is the bus addresses from the root port down to this device
    (inclusive); `host_bridge` is the `pciDDDD:BB` directory above the root
    port. `problems` maps an attribute name to the error that reading it gave,
    with the path, so checks can report exactly what was unreadable.
    """

    bdf: str
    sysfs_dir: Path
    chain: tuple[str, ...]
    host_bridge: str
    vendor: int | None = None
    device: int | None = None
    pci_class: int | None = None
    numa_node: int | None = None
    local_cpus: frozenset[int] | None = None
    link: PcieLink | None = None
    driver: str | None = None
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def parents(self) -> tuple[str, ...]:
        """Bridges above this device, root port first."""
        return self.chain[:-1]

    @property
    def is_gpu(self) -> bool:
        return self.vendor == VENDOR_NVIDIA and self.pci_class in (
            CLASS_DISPLAY_VGA,
            CLASS_DISPLAY_3D,
        )

    @property
    def is_nic(self) -> bool:
        return self.pci_class in (CLASS_NETWORK_ETHERNET, CLASS_NETWORK_INFINIBAND)

    @property
    def is_bridge(self) -> bool:
        return self.pci_class == CLASS_BRIDGE_PCI

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == VENDOR_NVIDIA and self.pci_class == CLASS_BRIDGE_OTHER

    def attr(self, name: str) -> str:
        """The path of one of its sysfs attributes (a string: a node has thousands)."""
        return f"{self.sysfs_dir}/{name}"

    def implausible(self) -> tuple[str, str] | None:
        """A numa_node no kernel gives (reading sysfs refuses it): an edited capture."""
        problem = None if self.numa_node is None else numa_node_problem(self.numa_node)
        return None if problem is None else ("numa_node", problem)


def split_device_path(real_path: str, devices_root: str) -> tuple[str, tuple[str, ...]]:
    """Host bridge and bus-address chain of a resolved sysfs device path.

    "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0" -> ("pci0000:15",
    ("0000:15:01.0", "0000:16:00.0")). Components that are not bus addresses
    (a virtio or infiniband child directory) end the chain.
    """
    inside = devices_root.rstrip(os.sep) + os.sep
    # Both resolved: a device under the root is a prefix away (relpath normalises again).
    if real_path.startswith(inside):
        relative = real_path[len(inside) :]
    else:
        relative = os.path.relpath(real_path, devices_root)
    parts = relative.split(os.sep)
    host_bridge = parts[0] if parts and HOST_BRIDGE_RE.match(parts[0]) else ""
    chain: list[str] = []
    for part in parts[1:] if host_bridge else parts:
        if not BDF_RE.match(part):
            break
        chain.append(part)
    return host_bridge, tuple(chain)


def _attr(
    device: PciDevice,
    name: str,
    parse: Callable[[str], T],
    expected: str,
    *,
    optional: bool = False,
) -> T | None:
    """Read and parse one attribute; a failure is recorded in device.problems."""
    path = device.attr(name)
    try:
        text = read_optional_text(path) if optional else read_text(path)
        return None if text is None else parse_attr(path, text, parse, expected)
    except ReadError as err:
        device.problems[name] = str(err)
        return None


def _read_link(device: PciDevice) -> None:
    """The PCIe link attributes exist for PCI Express devices only
    (drivers/pci/pci-sysfs.c pcie_dev_attrs_are_visible): all four absent
    means "not PCIe". An unreadable or partial set is recorded as a problem."""
    names = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
    paths = [device.attr(name) for name in names]
    if not any(os.path.lexists(path) for path in paths):
        return
    problems_before = len(device.problems)
    current_speed = _attr(device, names[0], parse_link_speed, "a link speed")
    current_width = _attr(device, names[1], parse_link_width, "a lane count")
    max_speed = _attr(device, names[2], parse_link_speed, "a link speed")
    max_width = _attr(device, names[3], parse_link_width, "a lane count")
    if len(device.problems) == problems_before:
        device.link = PcieLink(current_speed, current_width, max_speed, max_width)


def _parse_hex(text: str) -> int:
    return int(text, 16)


def _parse_id(text: str) -> int:
    """A 16-bit vendor or device id ("0x10de"); 0x0000 and 0xffff are no device's."""
    value = _parse_hex(text)
    if not 0 <= value <= 0xFFFF:
        raise ValueError(f"not a 16-bit id: {text!r}")
    if value in (0x0000, 0xFFFF):
        # All ones is what a read of a device that did not answer returns (PCIe Base
        # Specification, Unsupported Request completion); PCI-SIG assigns neither.
        raise ImplausibleValueError(f"{value:#06x} is no device's id (the device did not answer)")
    return value


def _resolved_device_link(entry: Path) -> str:
    """The device directory `bus/pci/devices/<bdf>` leads to: os.path.realpath(entry).

    realpath is pure Python and asks the kernel about each component of the path, a
    dozen here, for each of a node's dozens of devices. The kernel says it at once for an
    open file: the directory opened with O_PATH (which only names it, open(2)) and its
    /proc/self/fd link read (proc(5): "a symbolic link containing the actual path"), in
    three system calls. Where that cannot be done (a dangling or looping link, no
    /proc), realpath answers, with its own way of saying so."""
    if _O_PATH is None:
        return os.path.realpath(entry)
    try:
        fd = os.open(entry, _O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(entry)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(entry)
    finally:
        os.close(fd)


# Linux's (2.6.39). Never an ordinary open in its place: that would open what a tree
# holds there whatever it is, a FIFO (which blocks) or a device node.
_O_PATH: int | None = getattr(os, "O_PATH", None)


def read_pci_device(
    fs: NodeFS, bdf: str, cpu_bound: int | None = None, devices_root: str | None = None
) -> PciDevice:
    """Read one device's identity, locality and link; problems are recorded, not raised.
    `devices_root`: os.path.realpath of `<sysfs>/devices`, when the caller reading every
    device has it (resolved once, not once per device: realpath is pure Python)."""
    entry = fs.sys("bus", "pci", "devices", bdf)
    if devices_root is None:
        devices_root = os.path.realpath(fs.sys("devices"))
    real = _resolved_device_link(entry)
    host_bridge, chain = split_device_path(real, devices_root)
    if not chain or chain[-1] != bdf:
        chain = (bdf,)
    device = PciDevice(bdf=bdf, sysfs_dir=Path(real), chain=chain, host_bridge=host_bridge)
    if not os.path.isdir(real):
        # A dangling or looping `bus/pci/devices/<bdf>` link, or a file in its place.
        try:
            os.stat(entry)
            reason = "not a directory"
        except OSError as err:
            reason = os_error_reason(err)
        device.problems["device"] = str(ReadError(entry, reason))
        return device
    bound = cpu_id_bound(fs) if cpu_bound is None else cpu_bound
    device.vendor = _attr(device, "vendor", _parse_id, "a hex vendor id")
    device.device = _attr(device, "device", _parse_id, "a hex device id")
    device.pci_class = _attr(device, "class", parse_pci_class, "a class code")
    # numa_node and local_cpulist are absent on kernels built without NUMA.
    device.numa_node = _attr(device, "numa_node", parse_numa_node, "an integer", optional=True)
    device.local_cpus = _attr(
        device,
        "local_cpulist",
        lambda text: parse_cpulist(text, bound),
        "a CPU list",
        optional=True,
    )
    _read_link(device)
    driver_link = device.attr("driver")
    if os.path.lexists(driver_link):
        # The link's last component names the bound driver, whether or not the tree
        # holds the driver's directory (a captured tree may not); a `driver` that is
        # not a symlink at all is not the kernel's.
        try:
            device.driver = os.path.basename(read_link(driver_link))
        except ReadError as err:
            device.problems["driver"] = str(err)
    return device


def read_pci_devices(fs: NodeFS) -> dict[str, PciDevice]:
    """Every PCI function under `<sysfs>/bus/pci/devices`, by bus address.

    ReadError when the directory itself cannot be listed."""
    directory = fs.sys("bus", "pci", "devices")
    bound = cpu_id_bound(fs)
    root = os.path.realpath(fs.sys("devices"))
    return {
        bdf: read_pci_device(fs, bdf, bound, root)
        for bdf in list_dir(directory)
        if BDF_RE.match(bdf)
    }


def read_nvidia_gpus(fs: NodeFS) -> list[PciDevice]:
    """The NVIDIA GPUs on the PCI bus, without reading every other device in full.

    One `vendor` read per device, then the whole device for NVIDIA's: what the
    GPU checks need, at a fraction of read_pci_devices' cost on a node with
    dozens of bridges and NICs.
    """
    directory = fs.sys("bus", "pci", "devices")
    bound = cpu_id_bound(fs)
    root = os.path.realpath(fs.sys("devices"))
    gpus = []
    for bdf in list_dir(directory):
        if not BDF_RE.match(bdf):
            continue
        try:
            vendor = read_parsed(directory / bdf / "vendor", _parse_id, "a hex vendor id")
        except ReadError:
            vendor = None  # unreadable: read in full below, as the inventory would
        if vendor not in (VENDOR_NVIDIA, None):
            continue
        device = read_pci_device(fs, bdf, bound, root)
        if device.is_gpu:
            gpus.append(device)
    return gpus
