"""Config-space parsing: capability walks, ACS bits, what a non-root reader gets."""

from __future__ import annotations

import struct

import pytest

from nodecheck.checks.node.pci_config import (
    ConfigSpaceError,
    TruncatedConfigSpaceError,
    acs_bit_names,
    find_extended_capability,
    parse_acs,
)
from tests.fixtures.nodegen import GEN5_X16, PORT_DOWNSTREAM, Device, config_space


def bridge_config(acs_control: int | None) -> bytes:
    device = Device(
        "0000:17:00.0", 0x1000, 0xC030, 0x060400, GEN5_X16, "pcieport", PORT_DOWNSTREAM, acs_control
    )
    return config_space(device, 0x16, 0x18, 0x18)


def test_acs_control_bits_are_read() -> None:
    acs = parse_acs(bridge_config(0x001D))
    assert acs is not None
    assert acs.offset == 0x148
    assert acs_bit_names(acs.control) == ["SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"]
    assert acs_bit_names(acs.redirecting) == ["ReqRedir", "CmpltRedir"]


def test_acs_off_and_source_validation_only_do_not_redirect() -> None:
    for control in (0x0000, 0x0001):
        acs = parse_acs(bridge_config(control))
        assert acs is not None and acs.redirecting == 0


def test_egress_control_counts_as_redirecting() -> None:
    acs = parse_acs(bridge_config(0x0020))
    assert acs is not None and acs_bit_names(acs.redirecting) == ["EgressCtrl"]


def test_no_acs_capability() -> None:
    assert parse_acs(bridge_config(None)) is None


def test_non_root_sees_64_bytes() -> None:
    with pytest.raises(TruncatedConfigSpaceError, match="needs root"):
        parse_acs(bridge_config(0x001D)[:64])


def test_device_gone_reads_all_ones() -> None:
    with pytest.raises(ConfigSpaceError, match="not responding"):
        parse_acs(b"\xff" * 4096)


def test_odd_size_is_an_error() -> None:
    with pytest.raises(ConfigSpaceError, match="1000 bytes"):
        parse_acs(bridge_config(0)[:1000])


def test_conventional_device_has_no_extended_capabilities() -> None:
    config = bytearray(256)
    struct.pack_into("<HH", config, 0, 0x1AF4, 0x1041)
    assert parse_acs(bytes(config)) is None


def test_capability_loop_is_an_error() -> None:
    config = bytearray(bridge_config(None))
    # AER's next pointer back at itself: a walk that does not guard loops spins, and one
    # that stops there would call the device "without ACS".
    struct.pack_into("<I", config, 0x100, 0x0001 | 2 << 16 | 0x100 << 20)
    with pytest.raises(ConfigSpaceError, match="loops back to 0x100"):
        find_extended_capability(bytes(config), 0x000D)
