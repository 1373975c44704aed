"""PCI configuration space (`<sysfs>/bus/pci/devices/<bdf>/config`), parsed in pure Python.

Layout: PCI Express Base Specification; constants as in pciutils lib/header.h
and Linux include/uapi/linux/pci_regs.h. The kernel hands an unprivileged
reader only the first 64 bytes of the file (drivers/pci/pci-sysfs.c
config_read: the full size needs CAP_SYS_ADMIN in the initial user namespace),
and a short read, not an error, is how that shows.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

from nodecheck.checks.node.fs import NodeFS, NodePath, ReadError, read_bytes
from nodecheck.checks.record import record

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


@record
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
    """Offset of a standard capability (list head at 0x34), or None.

    Walks like Linux (drivers/pci/pci.c __pci_find_next_cap_ttl): pointers
    have their low two bits masked. A pointer into the 64-byte header or past
    the 256-byte conventional space, an id of 0xff (a read that returned all
    ones) or a loop is ConfigSpaceError: the list is not a device's.
    """
    if len(config) < CONVENTIONAL_CONFIG_BYTES:
        return None
    status = _u16(config, 0x06)
    if not status & 0x0010:  # Capabilities List bit
        return None
    offset = config[0x34] & 0xFC
    seen: set[int] = set()
    while offset:
        if offset < UNPRIVILEGED_CONFIG_BYTES or offset + 2 > CONVENTIONAL_CONFIG_BYTES:
            raise ConfigSpaceError(
                f"capability pointer {offset:#x} lies outside the capability area (0x40-0xff)"
            )
        if offset in seen:
            raise ConfigSpaceError(f"capability list loops back to {offset:#x}")
        seen.add(offset)
        if config[offset] == 0xFF:
            raise ConfigSpaceError(f"capability at {offset:#x} reads as all ones")
        if config[offset] == cap_id:
            return offset
        offset = config[offset + 1] & 0xFC
    return None


def find_extended_capability(config: bytes, cap_id: int) -> int | None:
    """Offset of a PCIe extended capability (list head at 0x100), or None.

    Walks like pciutils lib/caps.c: a 0 or all-ones header at 0x100 means no
    extended capabilities; next pointer = header bits 31:20 with the low two
    bits masked. A pointer below 0x100 or past the end, an empty or all-ones
    header further down the list, or a loop is ConfigSpaceError.
    """
    if len(config) <= CONVENTIONAL_CONFIG_BYTES:
        return None  # no extended space: a conventional device, or no MMCONFIG access
    offset = EXTENDED_CAPABILITIES_START
    seen: set[int] = set()
    while offset:
        if offset < EXTENDED_CAPABILITIES_START or offset + 4 > len(config):
            raise ConfigSpaceError(
                f"extended capability pointer {offset:#x} lies outside the extended space "
                f"(0x100-{len(config) - 1:#x})"
            )
        if offset in seen:
            raise ConfigSpaceError(f"extended capability list loops back to {offset:#x}")
        seen.add(offset)
        header = _u32(config, offset)
        if header in (0, 0xFFFFFFFF):
            if offset == EXTENDED_CAPABILITIES_START:
                return None
            raise ConfigSpaceError(f"extended capability at {offset:#x} reads as {header:#x}")
        if header & 0xFFFF == cap_id:
            return offset
        offset = (header >> 20) & 0xFFC
    return None


def check_config_size(config: bytes) -> None:
    """Raise unless the config space is a device's and its extended space is all there.

    A vendor id of 0xffff is what a device that does not answer returns (a
    configuration read completed with Unsupported Request reads as all ones,
    PCIe Base Specification); 0x0000 is no vendor's (PCI-SIG never assigns it),
    so a config space of zeros is not a device's either.
    """
    if len(config) < 2:
        raise ConfigSpaceError(f"only {len(config)} bytes: not even a vendor id")
    vendor = _u16(config, 0)
    if vendor == 0xFFFF:
        raise ConfigSpaceError("reads as all ones: the device is not responding")
    size = len(config)
    if size > UNPRIVILEGED_CONFIG_BYTES and size not in (
        CONVENTIONAL_CONFIG_BYTES,
        EXTENDED_CONFIG_BYTES,
    ):
        raise ConfigSpaceError(f"{size} bytes, expected {EXTENDED_CONFIG_BYTES}")
    if vendor == 0x0000:
        raise ConfigSpaceError("vendor id 0x0000: the config space is not a device's (zeros)")
    if size <= UNPRIVILEGED_CONFIG_BYTES:
        raise TruncatedConfigSpaceError(
            f"only {size} bytes readable: the extended config space needs root (CAP_SYS_ADMIN)"
        )


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


def read_config(path: NodePath) -> bytes:
    """The config space file; more than 4096 bytes is no PCI function's (ReadError)."""
    return read_bytes(path, limit=EXTENDED_CONFIG_BYTES)


@record
class BridgeAcs:
    """The ACS registers of one PCIe switch port, as its `config` file gave them.

    `acs` is its ACS capability (None: it has none), unless the read failed: `truncated`
    when only the unprivileged 64 bytes came back (not root: drivers/pci/pci-sysfs.c
    config_read), otherwise `problem` says why, naming the file (it could not be read, or
    what it holds is no device's config space).
    """

    config: Path
    acs: AcsState | None = None
    truncated: bool = False
    problem: str | None = None


@record
class SwitchPortAcs:
    """ACS of PCIe switch ports, by bus address (the ports that were read)."""

    bridges: dict[str, BridgeAcs]


def read_bridge_acs(config: Path) -> BridgeAcs:
    """One bridge's ACS registers from its config file, or why they could not be read."""
    try:
        acs = parse_acs(read_config(config))
    except TruncatedConfigSpaceError as err:
        return BridgeAcs(config, truncated=True, problem=f"{config}: {err}")
    except ReadError as err:
        return BridgeAcs(config, problem=f"cannot read {err}")
    except ConfigSpaceError as err:
        return BridgeAcs(config, problem=f"{config}: {err}")
    return BridgeAcs(config, acs)


def read_switch_port_acs(fs: NodeFS, bridges: Iterable[str]) -> SwitchPortAcs:
    """The ACS registers of each of `bridges` (bus addresses), each read on its own: one
    port that cannot be read does not hide the others."""
    return SwitchPortAcs(
        {
            bdf: read_bridge_acs(fs.sys("bus", "pci", "devices", bdf, "config"))
            for bdf in sorted(set(bridges))
        }
    )
