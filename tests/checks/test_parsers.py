"""Parsers on literal strings, as the kernel and the tools print them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nodecheck.checks.node.cgroup import parse_proc_cgroup
from nodecheck.checks.node.cpu import is_amd_compute_unit_cpu, parse_cpuinfo
from nodecheck.checks.node.cpulist import format_cpulist, parse_cpulist, parse_cpumask
from nodecheck.checks.node.fs import ImplausibleValueError, NodeFS
from nodecheck.checks.node.net import (
    AddressedInterfaces,
    MasterAddrOutcome,
    MasterAddrRoute,
    default_route_interfaces,
    match_master_addr,
    parse_ipv4_route_table,
    parse_ipv4_routes,
    parse_ipv6_address_table,
    parse_ipv6_addresses,
    parse_net_speed,
    parse_port_rate,
    parse_port_state,
    read_addressed_interfaces,
    read_master_addr_route,
)
from nodecheck.checks.node.numa import parse_meminfo_total, parse_node_meminfo
from nodecheck.checks.node.pci import (
    parse_link_speed,
    parse_link_width,
    parse_numa_node,
    parse_pci_class,
)
from nodecheck.checks.node.variables import (
    parse_environ,
    parse_nccl_conf,
    parse_passwd_homes,
    parse_status_uid,
)
from nodecheck.checks.rules.allocator_settings import lex_alloc_conf, parse_alloc_conf
from nodecheck.checks.rules.nccl_settings import parse_selector


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-55,112-167", set(range(56)) | set(range(112, 168))),
        ("0", {0}),
        ("", set()),
        ("0-1\n", {0, 1}),
        ("0-10:4", {0, 4, 8}),
        ("0-7:2/4", {0, 1, 4, 5}),  # the first 2 of every 4 (bitmap_parselist)
    ],
)
def test_cpulist(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["3-1", "a", "0-"])
def test_cpulist_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("00000000,00000101", {0, 8}),  # a thread_siblings mask of a 64-CPU kernel
        ("03", {0, 1}),  # NR_CPUS=2: one short word
        ("0000,ffffffff", set(range(32))),  # NR_CPUS=48
        ("00000001,00000000,00000000", {64}),
        ("00000000", set()),
        ("", set()),
    ],
)
def test_cpumask(text: str, cpus: set[int]) -> None:
    assert parse_cpumask(text) == cpus


@pytest.mark.parametrize("text", ["0x3", "00000g00", "123456789", "0,,1"])
def test_cpumask_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpumask(text)


def test_cpumask_is_bounded_by_the_possible_cpus() -> None:
    assert parse_cpumask("00000000,000000ff", cpu_bound=8) == set(range(8))
    with pytest.raises(ImplausibleValueError, match="CPU 8 is beyond the 8"):
        parse_cpumask("00000000,000001ff", cpu_bound=8)
    with pytest.raises(ImplausibleValueError, match="mask words"):
        parse_cpumask(",".join(["ffffffff"] * 257))


def test_format_cpulist_round_trips() -> None:
    cpus = set(range(56)) | set(range(112, 168)) | {200}
    assert format_cpulist(cpus) == "0-55,112-167,200"
    assert parse_cpulist(format_cpulist(cpus)) == cpus


@pytest.mark.parametrize(
    ("text", "gts"),
    [
        ("32.0 GT/s PCIe", 32.0),
        ("2.5 GT/s PCIe", 2.5),
        ("8 GT/s", 8.0),  # kernels before 5.x
        ("Unknown", None),
        ("Unknown speed", None),
    ],
)
def test_link_speed(text: str, gts: float | None) -> None:
    assert parse_link_speed(text) == gts


def test_link_speed_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_link_speed("fast")


def test_pci_class() -> None:
    assert parse_pci_class("0x030200") == 0x0302
    assert parse_pci_class("0x020700\n") == 0x0207
    with pytest.raises(ValueError):
        parse_pci_class("display")


def test_rdma_port_attributes() -> None:
    assert parse_port_state("4: ACTIVE") == "ACTIVE"
    assert parse_port_state("1: DOWN") == "DOWN"
    assert parse_port_rate("400 Gb/sec (4X NDR)") == 400.0
    assert parse_port_rate("2.5 Gb/sec (1X SDR)") == 2.5
    with pytest.raises(ValueError):
        parse_port_state("ACTIVE")
    with pytest.raises(ValueError):
        parse_port_rate("fast")


def test_net_speed() -> None:
    assert parse_net_speed("200000") == 200000
    assert parse_net_speed("-1") is None


def test_node_meminfo() -> None:
    text = "Node 0 MemTotal:        3631308 kB\nNode 0 MemFree:         3535920 kB\n"
    assert parse_node_meminfo(text) == 3631308 * 1024
    with pytest.raises(ValueError):
        parse_node_meminfo("Node 0 MemFree: 1 kB\n")


def test_meminfo_total() -> None:
    assert parse_meminfo_total("MemTotal:       16315988 kB\nMemFree: 1 kB\n") == 16315988 * 1024
    with pytest.raises(ValueError):
        parse_meminfo_total("MemFree: 1 kB\n")


@pytest.mark.parametrize(
    ("vendor", "family", "compute_units"),
    [
        ("AuthenticAMD", "21", True),  # Bulldozer to Excavator (15h)
        ("AuthenticAMD", "16", False),  # K10 (10h)
        ("AuthenticAMD", "23", False),  # Zen (17h): SMT siblings share a core_id
        ("GenuineIntel", "21", False),
        ("AuthenticAMD", "0x15", False),  # the kernel prints the family in decimal
    ],
)
def test_compute_unit_cpus(vendor: str, family: str, compute_units: bool) -> None:
    text = f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 1\n"
    assert is_amd_compute_unit_cpu(parse_cpuinfo(text)) is compute_units
    assert not is_amd_compute_unit_cpu(parse_cpuinfo("processor\t: 0\nCPU part\t: 0xd0c\n"))


def test_cpuinfo_first_block() -> None:
    text = (
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu hypervisor\n\n"
        "processor\t: 1\nmodel name\t: other\n"
    )
    fields = parse_cpuinfo(text)
    assert fields["model name"] == "AMD EPYC"
    assert "hypervisor" in fields["flags"].split()


def test_nccl_conf_is_read_as_nccl_reads_it() -> None:
    text = (
        "NCCL_DEBUG=WARN\n# NCCL_P2P_DISABLE=1\nNCCL_IB_HCA = mlx5_0\nnot a setting\n"
        "NCCL_ALGO=Ring=x\n"
    )
    lines = parse_nccl_conf(text)
    assert [(line.line, line.name, line.value) for line in lines] == [
        (1, "NCCL_DEBUG", "WARN"),
        (3, "NCCL_IB_HCA ", " mlx5_0"),  # NCCL trims nothing
        (5, "NCCL_ALGO", "Ring=x"),
    ]


def test_environ_keeps_audited_names_only() -> None:
    data = (
        b"PATH=/usr/bin\0NCCL_DEBUG=INFO\0AWS_SECRET_ACCESS_KEY=hunter2\0CUDA_VISIBLE_DEVICES=0\0"
    )
    kept = parse_environ(data)
    assert kept == {"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0"}


def test_passwd_and_status() -> None:
    homes = parse_passwd_homes(
        "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n"
    )
    assert homes == {0: "/root", 1000: "/home/alice"}
    assert parse_status_uid("Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\n") == 1000
    assert parse_status_uid("Name:\tx\n") is None


def test_nccl_selector_syntax() -> None:
    assert parse_selector("=mlx5_0:1,mlx5_1") == (False, True, [("mlx5_0", 1), ("mlx5_1", None)])
    assert parse_selector("^docker,lo") == (True, False, [("docker", None), ("lo", None)])
    assert parse_selector("^=eth0") == (True, True, [("eth0", None)])
    # Not a port number: no port (str.isdigit accepts "²", which int() refuses).
    assert parse_selector("mlx5_0:²,mlx5_1:x") == (
        False,
        False,
        [("mlx5_0", None), ("mlx5_1", None)],
    )


def test_alloc_conf_lexer_matches_c10() -> None:
    # c10 AllocatorConfig::lexArgs: separators are tokens, spaces vanish.
    assert lex_alloc_conf("expandable_segments: True, max_split_size_mb:128") == [
        "expandable_segments",
        ":",
        "True",
        ",",
        "max_split_size_mb",
        ":",
        "128",
    ]


@pytest.mark.parametrize(
    "value",
    [
        "expandable_segments:True",
        "max_split_size_mb:512,garbage_collection_threshold:0.8",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "roundup_power2_divisions:4",
        "backend:cudaMallocAsync",
        "pinned_num_register_threads:8,pinned_use_cuda_host_register:True",
        "expandable_segments : False ,release_lock_on_cudamalloc:True",
    ],
)
def test_alloc_conf_accepts_what_torch_accepts(value: str) -> None:
    assert parse_alloc_conf(value)[1] == []


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("expandable_segment:True", "unknown option 'expandable_segment'"),
        ("expandable_segments:true", "True or False"),
        ("max_split_size_mb:16", "at least 20"),
        ("garbage_collection_threshold:1.5", "strictly between 0 and 1"),
        ("roundup_power2_divisions:3", "power of two"),
        ("roundup_power2_divisions:[256:3]", "power of two"),
        ("backend:magic", "native or cudaMallocAsync"),
        ("pinned_num_register_threads:256", "at most 128"),
        ("expandable_segments", "expected ':'"),
        ("max_split_size_mb:512;expandable_segments:True", "takes a number"),
    ],
)
def test_alloc_conf_rejects_what_torch_rejects(value: str, error: str) -> None:
    errors = parse_alloc_conf(value)[1]
    assert any(error in message for message in errors), errors


# /proc/net/route as Linux 6.1 prints it: a header, tab-separated rows padded to 127.
PROC_NET_ROUTE = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"
    "                                                       \n"
    "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0"
    "                                                                               \n"
    "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0"
    "                                                                               \n"
    "ibp25s0\t0000640A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
)
PROC_NET_IF_INET6 = (
    "fe8000000000000000fc00fffe000001 04 40 20 80     eth0\n"
    "fd000000000000000000000000000002 04 40 00 82     eth0\n"
    "00000000000000000000000000000001 01 80 10 80       lo\n"
    "fe800000000000000a0027fffe1e4a5b 05 40 20 80  ibp27s0\n"
)


def test_interfaces_with_routes_and_addresses() -> None:
    assert parse_ipv4_routes(PROC_NET_ROUTE) == {"eth0", "ibp25s0"}
    assert parse_ipv4_routes(PROC_NET_ROUTE.splitlines()[0]) == set()
    # Link-local (scope 20) and loopback (scope 10) addresses reach no other node.
    assert parse_ipv6_addresses(PROC_NET_IF_INET6) == {"eth0"}


# Two default routes (the kernel lists them in its own order, the metric decides), a
# route through a gateway, a wider subnet beside a narrower one, and an unreachable route
# (RTF_REJECT, no interface), as a little-endian machine prints them.
PROC_NET_ROUTE_MORE = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    "wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n"
    "eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
    "eth0\t000200C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
    "eth0\t006433C6\tFE0200C0\t0003\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
    "eth1\t0000640A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
    "ibp25s0\t0000640A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    "*\t0000000A\t00000000\t0201\t0\t0\t0\t000000FF\t0\t0\t0\n"
)
LITTLE_ENDIAN = pytest.mark.skipif(
    sys.byteorder != "little", reason="the literals are a little-endian machine's"
)


@LITTLE_ENDIAN
def test_route_table_and_default_route() -> None:
    routes = parse_ipv4_route_table(PROC_NET_ROUTE_MORE)
    assert [(r.interface, str(r.network), r.through_gateway, r.metric) for r in routes] == [
        ("wlan0", "0.0.0.0/0", True, 600),
        ("eth0", "0.0.0.0/0", True, 100),
        ("eth0", "192.0.2.0/24", False, 100),
        ("eth0", "198.51.100.0/24", True, 100),
        ("eth1", "10.100.0.0/16", False, 0),
        ("ibp25s0", "10.100.0.0/24", False, 0),
    ]  # the reject route leads nowhere: left out
    assert default_route_interfaces(routes) == ("eth0", "wlan0")  # lowest metric first
    assert default_route_interfaces(parse_ipv4_route_table(PROC_NET_ROUTE)) == ("eth0",)
    assert default_route_interfaces(parse_ipv4_route_table(PROC_NET_ROUTE.splitlines()[0])) == ()
    with pytest.raises(ValueError, match="a route row has 3 fields"):
        parse_ipv4_route_table("Iface\tDestination\neth0\t00000000\tzz\n")
    with pytest.raises(ValueError):
        parse_ipv4_route_table(PROC_NET_ROUTE.replace("010200C0", "0102zzC0"))


@LITTLE_ENDIAN
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, MasterAddrRoute(MasterAddrOutcome.UNSET)),
        ("192.0.2.77", MasterAddrRoute(MasterAddrOutcome.IN_SUBNET, "eth0")),
        (" 192.0.2.77 ", MasterAddrRoute(MasterAddrOutcome.IN_SUBNET, "eth0")),
        # The /24 of ibp25s0 inside eth1's /16: the longest prefix, as the kernel picks.
        ("10.100.0.5", MasterAddrRoute(MasterAddrOutcome.IN_SUBNET, "ibp25s0")),
        ("10.100.7.5", MasterAddrRoute(MasterAddrOutcome.IN_SUBNET, "eth1")),
        # Behind a gateway, or only through the default route: in no subnet of the node.
        ("198.51.100.9", MasterAddrRoute(MasterAddrOutcome.NO_SUBNET)),
        ("8.8.8.8", MasterAddrRoute(MasterAddrOutcome.NO_SUBNET)),
        ("127.0.0.1", MasterAddrRoute(MasterAddrOutcome.LOOPBACK)),
        ("::1", MasterAddrRoute(MasterAddrOutcome.LOOPBACK)),
        ("fd00::5", MasterAddrRoute(MasterAddrOutcome.IN_SUBNET, "eth0")),
        ("[fd00::5]", MasterAddrRoute(MasterAddrOutcome.IN_SUBNET, "eth0")),
        ("fe80::fc00:ff:fe00:1", MasterAddrRoute(MasterAddrOutcome.NO_SUBNET)),  # link-local
        # A host name is never resolved; neither is anything else that is no IP literal.
        ("node-017", MasterAddrRoute(MasterAddrOutcome.NOT_AN_ADDRESS)),
        ("localhost", MasterAddrRoute(MasterAddrOutcome.NOT_AN_ADDRESS)),
        ("10.0.0.1:29500", MasterAddrRoute(MasterAddrOutcome.NOT_AN_ADDRESS)),
        ("", MasterAddrRoute(MasterAddrOutcome.NOT_AN_ADDRESS)),
    ],
)
def test_master_addr_against_the_subnets(value: str | None, expected: MasterAddrRoute) -> None:
    routes = parse_ipv4_route_table(PROC_NET_ROUTE_MORE)
    addresses = parse_ipv6_address_table(PROC_NET_IF_INET6)
    assert match_master_addr(value, routes, addresses) == expected


def test_master_addr_without_readable_routes(tmp_path: Path) -> None:
    """Routes that cannot be read are said to be so; a host name needs no file at all."""
    fs = NodeFS(tmp_path / "sys", tmp_path / "proc", tmp_path)
    assert match_master_addr("192.0.2.7", None, None).outcome is MasterAddrOutcome.ROUTES_UNREAD
    assert read_master_addr_route(fs, {"MASTER_ADDR": "192.0.2.7"}) == MasterAddrRoute(
        MasterAddrOutcome.ROUTES_UNREAD
    )
    assert read_master_addr_route(fs, {"MASTER_ADDR": "fd00::7"}).outcome is (
        MasterAddrOutcome.ROUTES_UNREAD
    )
    assert read_master_addr_route(fs, {"MASTER_ADDR": "node-017"}) == MasterAddrRoute(
        MasterAddrOutcome.NOT_AN_ADDRESS
    )
    assert read_master_addr_route(fs, {}) == MasterAddrRoute(MasterAddrOutcome.UNSET)


@LITTLE_ENDIAN
def test_addressed_interfaces_from_what_could_be_read(tmp_path: Path) -> None:
    fs = NodeFS(tmp_path / "sys", tmp_path / "proc", tmp_path)
    assert read_addressed_interfaces(fs) == AddressedInterfaces(None)
    net = tmp_path / "proc" / "net"
    net.mkdir(parents=True)
    (net / "if_inet6").write_text(PROC_NET_IF_INET6)
    # Addresses but no route table: which interfaces have an IPv4 address is unknown, and
    # the IPv6 table alone would leave them out (the reviewer's "cannot bootstrap NCCL").
    assert read_addressed_interfaces(fs) == AddressedInterfaces(None)
    (net / "route").write_text(PROC_NET_ROUTE_MORE)
    assert read_addressed_interfaces(fs) == AddressedInterfaces(
        frozenset({"eth0", "eth1", "wlan0", "ibp25s0"}), ("eth0", "wlan0")
    )
    # A table that is not what the kernel prints is unreadable, never half-read.
    (net / "route").write_text("Iface\tDestination\neth9\t0\n")
    assert read_addressed_interfaces(fs) == AddressedInterfaces(None)


def test_proc_cgroup() -> None:
    v1 = "12:cpuset:/slurm/uid_1000/job_42/step_0\n4:cpu,cpuacct:/\n0::/user.slice\n"
    assert parse_proc_cgroup(v1) == {
        "cpuset": "/slurm/uid_1000/job_42/step_0",
        "cpu": "/",
        "cpuacct": "/",
        "": "/user.slice",
    }
    assert parse_proc_cgroup("0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0") == {
        "": "/system.slice/slurmstepd.scope/job_42/step_0/user/task_0"
    }


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (parse_numa_node, "-1", -1),
        (parse_numa_node, "7", 7),
        (parse_link_speed, "2.5 GT/s PCIe", 2.5),
        (parse_link_speed, "64.0 GT/s PCIe", 64.0),
        (parse_link_speed, "8 GT/s", 8.0),
        (parse_link_speed, "Unknown", None),
        (parse_link_width, "0", None),
        (parse_link_width, "12", 12),
    ],
)
def test_link_and_numa_values_the_kernel_prints_are_kept(
    parse: Callable[[str], object], text: str, value: object
) -> None:
    assert parse(text) == value
