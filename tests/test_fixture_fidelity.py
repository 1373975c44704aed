"""The replica nodes are faithful: pciutils' lspci, reading them as it reads a live /sys,
decodes the same ACS bits, link states and bus hierarchy that nodecheck reads."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.pci_config import acs_bit_names, parse_acs, read_config
from nodecheck.tuning.gpu_usability import answers_config_reads
from tests.conftest import Node


def lspci_blocks(node: Node) -> dict[str, str]:
    lspci = shutil.which("lspci") or "/usr/bin/lspci"
    done = subprocess.run(
        [lspci, "-A", "linux-sysfs", "-O", f"sysfs.path={node.root}/sys/bus/pci", "-D", "-vvv"],
        capture_output=True,
        text=True,
        check=True,
    )
    blocks = {}
    for block in done.stdout.strip().split("\n\n"):
        blocks[block.split()[0]] = block
    return blocks


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-h100-faulty", "workstation"])
def test_lspci_agrees_with_nodecheck(build: object, name: str) -> None:
    node = build(name)  # type: ignore[operator]
    blocks = lspci_blocks(node)
    inventory = read_inventory(node.fs)
    assert set(blocks) == set(inventory.pci)
    checked_acs = 0
    fallen_off: list[str] = []
    for bdf, device in inventory.pci.items():
        # The symlink hierarchy and the bridges' bus numbers describe the same tree.
        if device.parents:
            parent = blocks[device.parents[-1]]
            bus = re.search(r"Bus: primary=\w+, secondary=(\w+), subordinate=(\w+)", parent)
            assert bus is not None, device.parents[-1]
            assert int(bus.group(1), 16) <= int(bdf[5:7], 16) <= int(bus.group(2), 16), bdf
        block = blocks[bdf]
        config = read_config(node.fs.sys("bus", "pci", "devices", bdf, "config"))
        if not answers_config_reads(config):
            # A device that fell off the bus: its config space reads all ones, so lspci
            # finds header type 0x7f (0xff without the multi-function bit) and decodes no
            # capability, while the names it prints come from sysfs's cached attributes.
            assert "Unknown header type 7f" in block, bdf
            assert "Capabilities:" not in block and "LnkSta:" not in block, bdf
            fallen_off.append(bdf)
            continue
        acs_line = re.search(r"ACSCtl:\s+(.*)", block)
        acs = parse_acs(config)
        if acs is None:
            assert acs_line is None, bdf
        else:
            assert acs_line is not None, bdf
            enabled = [token[:-1] for token in acs_line.group(1).split() if token.endswith("+")]
            assert enabled == acs_bit_names(acs.control), bdf
            checked_acs += 1
        link = re.search(r"LnkSta:\s+Speed ([\d.]+)GT/s(?: \(\w+\))?, Width x(\d+)", block)
        if device.link is not None:
            assert link is not None, bdf
            assert float(link.group(1)) == device.link.current_speed, bdf
            assert int(link.group(2)) == device.link.current_width, bdf
    assert checked_acs > 0 or name == "workstation"
    assert fallen_off == (["0000:bc:00.0"] if name == "dgx-h100-faulty" else [])
    if name == "dgx-h100-faulty":
        assert "Width x8 (downgraded)" in blocks["0000:9c:00.0"]
