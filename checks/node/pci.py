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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from nodecheck.checks.node.cpulist import parse_cpulist
from nodecheck.checks.node.fs import (
    NodeFS,
    ReadError,
    list_dir,
    parse_attr,
    read_optional_text,
    read_parsed,
    read_text,
)

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


def parse_link_speed(text: str) -> float | None:
    """GT/s from a `*_link_speed` attribute: "32.0 GT/s PCIe" -> 32.0.

    The kernel prints "Unknown" (drivers/pci/probe.c pci_speed_string) for a
    link it cannot decode, which usually means the link is down; that is None.
    Older kernels print "8 GT/s" without the "PCIe" suffix.
    """
    text = text.strip()
    if text.startswith("Unknown"):
        return None
    match = re.match(r"^(\d+(?:\.\d+)?) GT/s", text)
    if not match:
        raise ValueError(f"not a link speed: {text!r}")
    return float(match.group(1))


def parse_pci_class(text: str) -> int:
    """Base class and subclass from a `class` attribute: "0x030200" -> 0x0302."""
    value = int(text, 16)
    if not 0 <= value <= 0xFFFFFF:
        raise ValueError(f"class out of range: {text!r}")
    return value >> 8


@dataclass(frozen=True)
class PcieLink:
    """Negotiated and maximum link of a PCI Express device (None: "Unknown")."""

    current_speed: float | None
    current_width: int | None
    max_speed: float | None
    max_width: int | None


@dataclass
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

    def attr(self, name: str) -> Path:
        return self.sysfs_dir / name


def split_device_path(real_path: str, devices_root: str) -> tuple[str, tuple[str, ...]]:
    """Host bridge and bus-address chain of a resolved sysfs device path.

    "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0" -> ("pci0000:15",
    ("0000:15:01.0", "0000:16:00.0")). Components that are not bus addresses
    (a virtio or infiniband child directory) end the chain.
    """
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


def _parse_width(text: str) -> int | None:
    # A width of 0 is what a link that is down reports.
    width = int(text)
    if width < 0:
        raise ValueError(text)
    return width or None


def _read_link(device: PciDevice) -> None:
    """The PCIe link attributes exist for PCI Express devices only
    (drivers/pci/pci-sysfs.c pcie_dev_attrs_are_visible): all four absent
    means "not PCIe". An unreadable or partial set is recorded as a problem."""
    names = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
    paths = [device.attr(name) for name in names]
    if not any(path.exists() for path in paths):
        return
    problems_before = len(device.problems)
    current_speed = _attr(device, names[0], parse_link_speed, "a link speed")
    current_width = _attr(device, names[1], _parse_width, "a lane count")
    max_speed = _attr(device, names[2], parse_link_speed, "a link speed")
    max_width = _attr(device, names[3], _parse_width, "a lane count")
    if len(device.problems) == problems_before:
        device.link = PcieLink(current_speed, current_width, max_speed, max_width)


def _parse_hex(text: str) -> int:
    return int(text, 16)


def read_pci_device(fs: NodeFS, bdf: str) -> PciDevice:
    """Read one device's identity, locality and link; problems are recorded, not raised."""
    real = os.path.realpath(fs.sys("bus", "pci", "devices", bdf))
    host_bridge, chain = split_device_path(real, os.path.realpath(fs.sys("devices")))
    if not chain or chain[-1] != bdf:
        chain = (bdf,)
    device = PciDevice(bdf=bdf, sysfs_dir=Path(real), chain=chain, host_bridge=host_bridge)
    device.vendor = _attr(device, "vendor", _parse_hex, "a hex vendor id")
    device.device = _attr(device, "device", _parse_hex, "a hex device id")
    device.pci_class = _attr(device, "class", parse_pci_class, "a class code")
    # numa_node and local_cpulist are absent on kernels built without NUMA.
    device.numa_node = _attr(device, "numa_node", int, "an integer", optional=True)
    device.local_cpus = _attr(device, "local_cpulist", parse_cpulist, "a CPU list", optional=True)
    _read_link(device)
    driver_link = device.attr("driver")
    if os.path.islink(driver_link):
        device.driver = os.path.basename(os.readlink(driver_link))
    return device


def read_pci_devices(fs: NodeFS) -> dict[str, PciDevice]:
    """Every PCI function under `<sysfs>/bus/pci/devices`, by bus address."""
    directory = fs.sys("bus", "pci", "devices")
    return {bdf: read_pci_device(fs, bdf) for bdf in list_dir(directory) if BDF_RE.match(bdf)}


def read_nvidia_gpus(fs: NodeFS) -> list[PciDevice]:
    """The NVIDIA GPUs on the PCI bus, without reading every other device in full.

    One `vendor` read per device, then the whole device for NVIDIA's: what the
    GPU checks need, at a fraction of read_pci_devices' cost on a node with
    dozens of bridges and NICs.
    """
    directory = fs.sys("bus", "pci", "devices")
    gpus = []
    for bdf in list_dir(directory):
        if not BDF_RE.match(bdf):
            continue
        try:
            vendor = read_parsed(directory / bdf / "vendor", _parse_hex, "a hex vendor id")
        except ReadError:
            vendor = None  # unreadable: read in full below, as the inventory would
        if vendor not in (VENDOR_NVIDIA, None):
            continue
        device = read_pci_device(fs, bdf)
        if device.is_gpu:
            gpus.append(device)
    return gpus
