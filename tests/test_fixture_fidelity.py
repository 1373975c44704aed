"""The replica nodes are faithful: pciutils' lspci, reading them as it reads a live /sys,
decodes the same ACS bits, link states and bus hierarchy that nodecheck reads."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodecheck.checks.node.gpu_presence import answers_config_reads
from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.pci_config import acs_bit_names, parse_acs, read_config
from tests.conftest import Node
from tests.fixtures import nodes
from tests.fixtures.nodegen import build_node
from tools.hwloc_captures import DEFAULT_REAL_DATA, real_data_dir


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


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-h100-faulty", "workstation", "l40s-epyc"])
def test_lspci_agrees_with_nodecheck(build: object, name: str) -> None:
    node = build(name)  # type: ignore[operator]
    blocks = lspci_blocks(node)
    checked_acs = assert_lspci_agrees(node)
    assert checked_acs > 0 or name == "workstation"
    fallen_off = [bdf for bdf, block in blocks.items() if "Unknown header type 7f" in block]
    assert fallen_off == (["0000:bc:00.0"] if name == "dgx-h100-faulty" else [])
    if name == "dgx-h100-faulty":
        assert "Width x8 (downgraded)" in blocks["0000:9c:00.0"]


def assert_lspci_agrees(node: Node) -> int:
    """lspci and nodecheck read the node's tree, ACS bits and links alike; the number of
    functions whose ACS was compared."""
    blocks = lspci_blocks(node)
    inventory = read_inventory(node.fs)
    assert set(blocks) == set(inventory.pci)
    checked_acs = 0
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
    return checked_acs


# --- the XE9680 replica against the real node's lspci -vvv ----------------------------

XE9680_LSPCI = "lspci/xe9680-hgx-h100-lspci-vvv.txt"  # under tools.hwloc_captures' real data


@dataclass(frozen=True)
class LspciDevice:
    """What `lspci -vvv` says of one function that the replica must reproduce."""

    bdf: str  # bus:device.function, without the domain
    header: str  # "PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch", rev and prog-if cut
    bus_range: tuple[int, int] | None  # a bridge's secondary and subordinate bus
    link_cap: tuple[float, int] | None  # LnkCap speed (GT/s) and width
    link_status: tuple[float, int] | None  # LnkSta speed and width
    acs_control: tuple[str, ...] | None  # the ACSCtl bits that are on (None: no ACS)
    numa_node: int | None


def _speed_width(pattern: str, block: str) -> tuple[float, int] | None:
    match = re.search(pattern + r"(?:Port #\d+, )?Speed ([\d.]+)GT/s[^,]*, Width x(\d+)", block)
    return (float(match.group(1)), int(match.group(2))) if match else None


def parse_lspci_vvv(text: str) -> dict[str, LspciDevice]:
    """`lspci -vvv` output (with or without -D) by bus:device.function."""
    devices = {}
    for block in re.split(r"\n(?=[0-9a-f]{4}:[0-9a-f]{2}:|[0-9a-f]{2}:[0-9a-f]{2}\.)", text):
        first = block.split("\n", 1)[0].strip()
        if not first:
            continue
        address, _, rest = first.partition(" ")
        bdf = address[-7:]
        header = re.sub(r" \((rev \w+|prog-if [^)]*\)?)\)", "", rest).strip()
        bus = re.search(r"Bus: primary=\w+, secondary=(\w+), subordinate=(\w+)", block)
        acs = re.search(r"ACSCtl:\s+(.*)", block)
        numa = re.search(r"NUMA node: (\d+)", block)
        devices[bdf] = LspciDevice(
            bdf,
            header,
            (int(bus.group(1), 16), int(bus.group(2), 16)) if bus else None,
            _speed_width(r"LnkCap:\s+", block),
            _speed_width(r"LnkSta:\s+", block),
            tuple(t[:-1] for t in acs.group(1).split() if t.endswith("+")) if acs else None,
            int(numa.group(1)) if numa else None,
        )
    return devices


def in_pcie_tree(devices: dict[str, LspciDevice]) -> dict[str, LspciDevice]:
    """The PCI bridges and every function below one: what the replica holds. (The CPUs'
    root-complex integrated endpoints on the host bridges' own buses are left out.)"""
    ranges = [d.bus_range for d in devices.values() if d.bus_range is not None]
    return {
        bdf: device
        for bdf, device in devices.items()
        if device.bus_range is not None
        or any(low <= int(bdf[:2], 16) <= high for low, high in ranges)
    }


def parent_bridge(bdf: str, devices: dict[str, LspciDevice]) -> str | None:
    """The bridge whose secondary bus the function sits on (None: on a host bridge's bus)."""
    bus = int(bdf[:2], 16)
    parents = [d.bdf for d in devices.values() if d.bus_range and d.bus_range[0] == bus]
    assert len(parents) <= 1, (bdf, parents)
    return parents[0] if parents else None


def lspci_ids(node: Node) -> dict[str, tuple[str, str, str, str, str]]:
    """By bus:device.function: class name, vendor name and id, device name and id, as the
    machine-readable `lspci -mm -nn` gives them (names from this machine's pci.ids)."""
    lspci = shutil.which("lspci") or "/usr/bin/lspci"
    done = subprocess.run(
        [lspci, "-A", "linux-sysfs", "-O", f"sysfs.path={node.root}/sys/bus/pci", "-mm", "-nn"],
        capture_output=True,
        text=True,
        check=True,
    )
    found = {}
    for line in done.stdout.splitlines():
        bdf, pci_class, vendor, device, *_ = shlex.split(line)
        vendor_name, vendor_id = re.fullmatch(r"(.*) \[(\w{4})\]", vendor).groups()  # type: ignore[union-attr]
        device_name, device_id = re.fullmatch(r"(.*) \[(\w{4})\]", device).groups()  # type: ignore[union-attr]
        class_name = re.sub(r" \[\w{4}\]$", "", pci_class)
        found[bdf[-7:]] = (class_name, vendor_name, vendor_id, device_name, device_id)
    return found


@pytest.fixture(scope="module")
def xe9680_replica(tmp_path_factory: pytest.TempPathFactory) -> Node:
    return Node(build_node(nodes.xe9680(), tmp_path_factory.mktemp("xe9680") / "node"))


def test_xe9680_replica_agrees_with_nodecheck(xe9680_replica: Node) -> None:
    """lspci reads the XE9680 replica as nodecheck does (bus tree, ACS, links)."""
    checked_acs = assert_lspci_agrees(xe9680_replica)
    # Root and downstream ports, the Switchtec functions and the CX-6 Dx functions: 55.
    assert checked_acs == 55


def test_gb200_replica_agrees_with_nodecheck(tmp_path: Path) -> None:
    """lspci reads the GB200 tray replica (a PCI domain per root port) as nodecheck does."""
    node = Node(build_node(nodes.gb200_tray(), tmp_path / "node"))
    # ACS on the ten Grace root ports and the six downstream ports above the NICs.
    assert assert_lspci_agrees(node) == 10 + 6
    assert {bdf[:4] for bdf in lspci_blocks(node)} == {
        "0000",
        "0002",
        "0006",
        "0008",
        "0009",
        "0010",
        "0012",
        "0016",
        "0018",
        "0019",
    }


def missing_lspci_reason(environ: Mapping[str, str]) -> str:
    """Why the comparison with the real lspci skips: where it looked, as
    tools.hwloc_captures.real_data_dir does (NODECHECK_REAL_DATA, else the checkout's
    sibling shared/real), by absolute path."""
    configured = environ.get("NODECHECK_REAL_DATA")
    where = (
        f"under {configured} (NODECHECK_REAL_DATA)"
        if configured
        else f"under {DEFAULT_REAL_DATA} (the checkout's sibling shared/real; "
        "NODECHECK_REAL_DATA names another folder)"
    )
    return f"no real XE9680 lspci here ({XE9680_LSPCI} {where}): the replica's own tests still run"


def test_the_skip_names_the_folder_it_looked_in(tmp_path: Path) -> None:
    reason = missing_lspci_reason({"NODECHECK_REAL_DATA": str(tmp_path)})
    assert f"{XE9680_LSPCI} under {tmp_path} (NODECHECK_REAL_DATA)" in reason
    reason = missing_lspci_reason({})
    assert f"under {DEFAULT_REAL_DATA} (the checkout's sibling shared/real" in reason
    assert DEFAULT_REAL_DATA.is_absolute()
    assert "../" not in reason


def test_xe9680_replica_matches_the_real_lspci(xe9680_replica: Node) -> None:
    """The replica, decoded by lspci, against the real XE9680's `lspci -vvv`: the same
    functions in the PCIe tree, each below the same bridge, with the same vendor:device,
    LnkCap and LnkSta, ACS control bits and NUMA node."""
    folder = real_data_dir()
    if folder is None or not (folder / XE9680_LSPCI).is_file():
        pytest.skip(missing_lspci_reason(os.environ))
    real = in_pcie_tree(parse_lspci_vvv((folder / XE9680_LSPCI).read_text()))
    replica = parse_lspci_vvv("\n".join(lspci_blocks(xe9680_replica).values()))
    assert sorted(replica) == sorted(real)
    ids = lspci_ids(xe9680_replica)
    for bdf, ours in replica.items():
        theirs = real[bdf]
        assert parent_bridge(bdf, replica) == parent_bridge(bdf, real), bdf
        assert ours.bus_range == theirs.bus_range, bdf
        # The real capture's pci.ids was older: where it had no name for a device it
        # printed "Device 2330", the id itself.
        class_name, vendor, vendor_id, device, device_id = ids[bdf]
        assert theirs.header in (
            f"{class_name}: {vendor} {device}",
            f"{class_name}: {vendor} Device {device_id}",
        ), (bdf, vendor_id)
        assert (ours.link_cap, ours.link_status) == (theirs.link_cap, theirs.link_status), bdf
        assert ours.acs_control == theirs.acs_control, bdf
        assert ours.numa_node == theirs.numa_node, bdf


def test_l40s_replica_as_lspci_reads_it(build: object) -> None:
    """The L40S/EPYC replica decoded by lspci: eight L40S (10de:26b9) in pairs below four
    PEX890xx switches, each pair with its ConnectX-7, every switch on a Genoa root port
    (1022:14ab) of its own host bridge, the GPUs' downstream ports trained at Gen4 of
    their Gen5; NUMA 0 for host bridges 00-60, 1 for 80-e0 (NPS1)."""
    node = build("l40s-epyc")  # type: ignore[operator]
    ids = lspci_ids(node)
    by_id: dict[str, list[str]] = {}
    for bdf, (_, _, vendor_id, _, device_id) in ids.items():
        by_id.setdefault(f"{vendor_id}:{device_id}", []).append(bdf)
    assert by_id["10de:26b9"] == [
        "03:00.0", "04:00.0", "23:00.0", "24:00.0", "83:00.0", "84:00.0", "a3:00.0", "a4:00.0"
    ]  # fmt: skip
    assert by_id["15b3:1021"] == ["05:00.0", "25:00.0", "85:00.0", "a5:00.0"]
    assert by_id["15b3:101d"] == ["c1:00.0", "c1:00.1"]
    assert by_id["8086:15ff"] == ["41:00.0", "41:00.1"]
    assert by_id["1022:14ab"] == ["00:01.1", "20:01.1", "40:01.1", "80:01.1", "a0:01.1", "c0:01.1"]
    devices = parse_lspci_vvv("\n".join(lspci_blocks(node).values()))
    for gpu in by_id["10de:26b9"]:
        port = parent_bridge(gpu, devices)
        assert port is not None and (ids[port][2], ids[port][4]) == ("1000", "c030"), gpu
        assert devices[port].link_cap == (32.0, 16) and devices[port].link_status == (16.0, 16)
        assert devices[gpu].link_status == (16.0, 16)
        assert devices[gpu].numa_node == (0 if gpu < "80" else 1)
    assert assert_lspci_agrees(node) > 0
