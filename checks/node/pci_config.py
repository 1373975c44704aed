"""PCI configuration space (`<sysfs>/bus/pci/devices/<bdf>/config`), parsed in pure Python.

Layout: PCI Express Base Specification; constants as in pciutils lib/header.h
and Linux include/uapi/linux/pci_regs.h. The kernel hands an unprivileged
reader only the first 64 bytes of the file (drivers/pci/pci-sysfs.c
config_read: the full size needs CAP_SYS_ADMIN in the initial user namespace),
and a short read, not an error, is how that shows.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from nodecheck.checks.node.fs import read_bytes

UNPRIVILEGED_CONFIG_BYTES = 64
CONVENTIONAL_CONFIG_BYTES = 256
EXTENDED_CONFIG_BYTES = 4096
EXTENDED_CAPABILITIES_START = 0x100

CAP_ID_PCI_EXPRESS = 0x10
EXT_CAP_ID_ACS = 0x000D

# ACS Capability and Control bits (the same positions in both registers), with
# the names lspci prints (pciutils ls-ecaps.c cap_acs).
ACS_BITS = (
    (0x0001, "SrcValid"),
    (0x0002, "TransBlk"),
    (0x0004, "ReqRedir"),
    (0x0008, "CmpltRedir"),
    (0x0010, "UpstreamFwd"),
    (0x0020, "EgressCtrl"),
    (0x0040, "DirectTrans"),
)
ACS_REQUEST_REDIRECT = 0x0004
ACS_COMPLETION_REDIRECT = 0x0008
ACS_EGRESS_CONTROL = 0x0020
# The bits that send peer-to-peer traffic up to the root complex (or block it):
# what the kernel's pci=disable_acs_redir clears.
ACS_P2P_REDIRECTING = ACS_REQUEST_REDIRECT | ACS_COMPLETION_REDIRECT | ACS_EGRESS_CONTROL


class ConfigSpaceError(ValueError):
    """The config space could not be interpreted; the message says why."""


class TruncatedConfigSpaceError(ConfigSpaceError):
    """Only the unprivileged 64 bytes were readable."""


def acs_bit_names(value: int) -> list[str]:
    return [name for bit, name in ACS_BITS if value & bit]


@dataclass(frozen=True)
class AcsState:
    offset: int
    capability: int
    control: int

    @property
    def redirecting(self) -> int:
        """The enabled P2P redirect/egress bits (0 when P2P flows directly)."""
        return self.control & ACS_P2P_REDIRECTING


def _u16(config: bytes, offset: int) -> int:
    return int(struct.unpack_from("<H", config, offset)[0])


def _u32(config: bytes, offset: int) -> int:
    return int(struct.unpack_from("<I", config, offset)[0])


def find_capability(config: bytes, cap_id: int) -> int | None:
    """Offset of a standard capability (list head at 0x34), or None."""
    if len(config) < CONVENTIONAL_CONFIG_BYTES:
        return None
    status = _u16(config, 0x06)
    if not status & 0x0010:  # Capabilities List bit
        return None
    offset = config[0x34] & 0xFC
    seen: set[int] = set()
    while offset and offset not in seen and offset + 2 <= len(config):
        seen.add(offset)
        if config[offset] == cap_id:
            return offset
        offset = config[offset + 1] & 0xFC
    return None


def find_extended_capability(config: bytes, cap_id: int) -> int | None:
    """Offset of a PCIe extended capability (list head at 0x100), or None.

    Walks like pciutils lib/caps.c: stop on a 0 or all-ones header, guard
    against loops, next pointer = header bits 31:20 with the low two bits
    masked.
    """
    offset = EXTENDED_CAPABILITIES_START
    seen: set[int] = set()
    while offset and offset not in seen and offset + 4 <= len(config):
        seen.add(offset)
        header = _u32(config, offset)
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == cap_id:
            return offset
        offset = (header >> 20) & 0xFFC
    return None


def check_config_size(config: bytes) -> None:
    """Raise unless the extended configuration space is all there."""
    if len(config) >= 2 and _u16(config, 0) == 0xFFFF:
        raise ConfigSpaceError("reads as all ones: the device is not responding")
    if len(config) <= UNPRIVILEGED_CONFIG_BYTES:
        raise TruncatedConfigSpaceError(
            f"only {len(config)} bytes readable: the extended config space needs root "
            "(CAP_SYS_ADMIN)"
        )
    if len(config) < EXTENDED_CONFIG_BYTES and len(config) != CONVENTIONAL_CONFIG_BYTES:
        raise ConfigSpaceError(f"{len(config)} bytes, expected {EXTENDED_CONFIG_BYTES}")


def parse_acs(config: bytes) -> AcsState | None:
    """The ACS capability of a device, or None when it has none.

    Raises ConfigSpaceError when the config space is short or not a device's.
    """
    check_config_size(config)
    if find_capability(config, CAP_ID_PCI_EXPRESS) is None:
        return None  # pciutils scans extended capabilities of PCIe devices only
    offset = find_extended_capability(config, EXT_CAP_ID_ACS)
    if offset is None:
        return None
    if offset + 8 > len(config):
        raise ConfigSpaceError(f"ACS capability at {offset:#x} runs past the end")
    return AcsState(offset, _u16(config, offset + 4), _u16(config, offset + 6))


def read_config(path: Path) -> bytes:
    return read_bytes(path, limit=EXTENDED_CONFIG_BYTES)
