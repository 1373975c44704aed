"""The nccl_platform part: what NCCL decides by beyond the PCI tree (the CPU vendor, its
default topology file, IMEX's node list and channels, the SHARP plugin), read from replica
trees and parsed from literal strings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.nccl_platform import (
    CPU_ARM,
    IMEX_DEFAULT_NODE_LIST,
    ImexSetup,
    SharpClient,
    count_node_addresses,
    parse_cpu_vendor,
    parse_device_major,
    parse_node_list_path,
    read_nccl_platform,
)
from tests.conftest import Node

# The first block of /proc/cpuinfo on an Arm kernel (a Neoverse-V2, as on Grace): no
# vendor_id line, the implementer and part as numbers.
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 0

processor\t: 1
"""
X86_CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\nprocessor\t: 1\n"
# Zhaoxin's vendor string is padded ("  Shanghai  "), as NCCL's own table spells it.
ZHAOXIN_CPUINFO = "processor\t: 0\nvendor_id\t:   Shanghai  \n"
IMEX_CONFIG = """# IMEX configuration
DAEMONIZE=1
SERVER_PORT=50000
IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/rack7.cfg
"""


def test_parsers_on_literal_strings() -> None:
    assert parse_cpu_vendor(X86_CPUINFO) == "AuthenticAMD"
    assert parse_cpu_vendor(ARM_CPUINFO) == CPU_ARM
    assert parse_cpu_vendor(ZHAOXIN_CPUINFO) == "Shanghai"
    assert parse_cpu_vendor("processor\t: 0\n") is None
    assert parse_node_list_path(IMEX_CONFIG) == "/etc/nvidia-imex/rack7.cfg"
    assert parse_node_list_path("DAEMONIZE=1\nIMEX_NODE_CONFIG_FILE=\n") == IMEX_DEFAULT_NODE_LIST
    assert count_node_addresses("# rack 7\n10.0.0.1\n\n 10.0.0.2 \n#10.0.0.3\n") == 2
    devices = "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\n\nBlock devices:\n"
    assert parse_device_major(devices, "nvidia-caps-imex-channels") == 234
    assert parse_device_major(devices, "nvidia-uvm") is None


def test_the_gb200_tray_is_in_an_imex_domain(build: Callable[..., Node]) -> None:
    node = build("gb200-tray")
    platform = read_nccl_platform(node.fs, read_inventory(node.fs))
    assert platform.imex == ImexSetup(IMEX_DEFAULT_NODE_LIST, 18, ("channel0",), 234)
    assert "names 18 nodes" in platform.imex.domain_evidence
    assert "channel0" in platform.imex.domain_evidence
    # InfiniBand ports are up, so the SHARP plugin was looked for; there is none.
    assert platform.sharp == SharpClient((), ())
    assert platform.virtual_topology is False and platform.problems == ()


def test_nothing_of_it_on_the_workstation(workstation: Node) -> None:
    platform = read_nccl_platform(workstation.fs, read_inventory(workstation.fs))
    assert platform.cpu_vendor == "AuthenticAMD"
    assert platform.imex == ImexSetup(IMEX_DEFAULT_NODE_LIST, None, (), None)
    assert platform.imex.domain_evidence == ""
    assert platform.sharp is None  # no InfiniBand port: not looked for
    assert platform.virtual_topology is False and platform.problems == ()


def test_files_found_and_problems_named(
    dgx: Node, copy_node: Callable[[Node], Node], tmp_path: Path
) -> None:
    """The SHARP plugin and client in their install directories, the node list IMEX's
    config names, NCCL's topology file behind /var/run -> /run (resolved inside the root),
    and a channel "directory" that is a file: a problem naming the path, never "none"."""
    node = copy_node(dgx)
    root = node.root
    files = {
        "usr/lib/x86_64-linux-gnu/libnccl-net.so": "",
        "usr/lib/x86_64-linux-gnu/libnccl-net.so.0": "",
        "usr/lib/x86_64-linux-gnu/libnccl-neto.so": "",  # not a plugin's name
        "opt/mellanox/sharp/lib/libsharp_coll.so.5": "",
        "etc/nvidia-imex/config.cfg": IMEX_CONFIG,
        "etc/nvidia-imex/rack7.cfg": "10.0.0.1\n10.0.0.2\n",
        "run/nvidia-topologyd/virtualTopology.xml": "<system/>",
        "dev/nvidia-caps-imex-channels": "not a directory",
    }
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    (root / "var").mkdir(exist_ok=True)
    (root / "var" / "run").symlink_to("/run")
    platform = read_nccl_platform(node.fs, read_inventory(node.fs))
    assert platform.cpu_vendor == "GenuineIntel"
    assert platform.sharp == SharpClient(
        (
            "/usr/lib/x86_64-linux-gnu/libnccl-net.so",
            "/usr/lib/x86_64-linux-gnu/libnccl-net.so.0",
        ),
        ("/opt/mellanox/sharp/lib/libsharp_coll.so.5",),
    )
    assert platform.imex.node_list == "/etc/nvidia-imex/rack7.cfg" and platform.imex.nodes == 2
    assert platform.imex.channels is None
    [problem] = platform.problems
    assert "nvidia-caps-imex-channels" in problem and "not a directory" in problem
    assert platform.virtual_topology is True
