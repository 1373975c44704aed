"""Network interfaces (`<sysfs>/class/net`) and RDMA devices (`<sysfs>/class/infiniband`).

Attributes: Documentation/ABI/testing/sysfs-class-net and
sysfs-class-infiniband. A virtual interface (lo, docker0, bridges) resolves
under `devices/virtual`; a physical one under its PCI function, sometimes
through a bus of its own (virtio-net: `0000:00:03.0/virtio2/net/eth0`).
"""

from __future__ import annotations

import enum
import errno
import ipaddress
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import field
from pathlib import Path
from typing import TypeVar

from nodecheck.checks.node.fs import (
    NodeFS,
    ReadError,
    list_dir,
    read_optional_parsed,
    read_optional_text,
    read_parsed,
)
from nodecheck.checks.node.pci import split_device_path
from nodecheck.checks.record import record

T = TypeVar("T")

# include/uapi/linux/if_arp.h
ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
ARPHRD_LOOPBACK = 772


def parse_port_state(text: str) -> str:
    """ "4: ACTIVE" -> "ACTIVE" (drivers/infiniband/core/sysfs.c state_show)."""
    match = re.match(r"^\d+:\s*(\S+)$", text.strip())
    if not match:
        raise ValueError(f"not a port state: {text!r}")
    return match.group(1)


def parse_phys_state(text: str) -> str:
    """ "5: LinkUp" -> "LinkUp", "7: Phy Test" -> "Phy Test" (drivers/infiniband/core/
    sysfs.c phys_state_show: the physical link, apart from the logical `state`)."""
    match = re.match(r"^\d+:\s*(\S.*)$", text.strip())
    if not match:
        raise ValueError(f"not a physical port state: {text!r}")
    return match.group(1).strip()


def parse_port_rate(text: str) -> float:
    """Gb/s from a port `rate`: "400 Gb/sec (4X NDR)" -> 400.0, "2.5 Gb/sec (1X SDR)" -> 2.5."""
    match = re.match(r"^(\d+(?:\.\d+)?) Gb/sec", text.strip())
    if not match:
        raise ValueError(f"not a port rate: {text!r}")
    return float(match.group(1))


def parse_port_width(text: str) -> int | None:
    """Lanes from a port `rate`: "200 Gb/sec (2X NDR)" -> 2; None without "(NX ...)"
    (rate_show prints the width and speed as the port's PortInfo says them)."""
    match = re.search(r"\((\d+)X\b", text)
    return int(match.group(1)) if match else None


def parse_net_speed(text: str) -> int | None:
    """Mb/s from a netdev `speed`; -1 (and larger "unknown" values) mean unknown."""
    value = int(text)
    return value if value > 0 else None


@record(frozen=False)
class NetInterface:
    """One network interface. `pci_bdf` is None for virtual interfaces."""

    name: str
    pci_bdf: str | None
    virtual: bool
    operstate: str | None = None
    speed_mbps: int | None = None
    arp_type: int | None = None
    # For a virtual interface: "bond" (bonding master), "bridge", "tun" (tun/tap), "stacked"
    # (a VLAN, macvlan or ipvlan on another interface: it has a lower_* link), or None.
    kind: str | None = None
    problems: dict[str, str] = field(default_factory=dict)


@record(frozen=False)
class RdmaPort:
    number: int
    state: str | None
    rate_gbps: float | None
    link_layer: str | None
    # The physical link (LinkUp; Polling: no signal from the other end; Disabled: turned
    # off): why a port that is not ACTIVE is not. None where sysfs has no phys_state.
    phys_state: str | None = None
    # Lanes of the live link, from `rate` ("400 Gb/sec (4X NDR)" -> 4); None where the
    # rate names no width (some RoCE drivers print only Gb/s).
    width: int | None = None


@record(frozen=False)
class RdmaDevice:
    """One RDMA device (an HCA such as mlx5_0) and its ports."""

    name: str
    pci_bdf: str | None
    ports: list[RdmaPort] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return any(port.state == "ACTIVE" for port in self.ports)


def _pci_of(devices_root: str, real_path: str) -> str | None:
    """The PCI function a resolved sysfs path is under; `devices_root`: os.path.realpath
    of `<sysfs>/devices`."""
    _, chain = split_device_path(real_path, devices_root)
    return chain[-1] if chain else None


def virtual_kind(directory: Path) -> str | None:
    """What a virtual interface is, from its sysfs directory (drivers/net/bonding,
    net/bridge/br_sysfs_br.c, drivers/net/tun.c, and net/core/dev.c's lower_* links)."""
    if (directory / "bonding").is_dir():
        return "bond"
    if (directory / "bridge").is_dir():
        return "bridge"
    if (directory / "tun_flags").exists():
        return "tun"
    try:
        entries = list_dir(directory)
    except ReadError:
        return None  # the interface's own reads name what is wrong with it
    if any(name.startswith("lower_") for name in entries):
        return "stacked"
    return None


def read_net_interfaces(fs: NodeFS) -> list[NetInterface]:
    """Every interface of `<sysfs>/class/net`; ReadError when that cannot be listed."""
    interfaces = []
    root = os.path.realpath(fs.sys("devices"))
    for name in list_dir(fs.sys("class", "net")):
        real = os.path.realpath(fs.sys("class", "net", name))
        virtual = os.sep + "virtual" + os.sep in real
        interface = NetInterface(
            name=name, pci_bdf=None if virtual else _pci_of(root, real), virtual=virtual
        )
        directory = fs.sys("class", "net", name)
        if virtual:
            interface.kind = virtual_kind(directory)
        try:
            interface.operstate = read_optional_text(directory / "operstate")
        except ReadError as err:
            interface.problems["operstate"] = str(err)
        try:
            speed = read_optional_text(directory / "speed")
            interface.speed_mbps = parse_net_speed(speed) if speed else None
        except ReadError as err:
            # The kernel answers EINVAL for the speed of a link that is down
            # or has no notion of speed (ethtool_ops without get_link_ksettings).
            if "Invalid argument" not in err.reason:
                interface.problems["speed"] = str(err)
        except ValueError:
            interface.problems["speed"] = f"{directory / 'speed'}: expected Mb/s"
        try:
            arp_type = read_optional_text(directory / "type")
            interface.arp_type = int(arp_type) if arp_type else None
        except (ReadError, ValueError) as err:
            interface.problems["type"] = f"{directory / 'type'}: {err}"
        interfaces.append(interface)
    return interfaces


# include/net/ipv6.h: IPV6_ADDR_LOOPBACK 0x10, IPV6_ADDR_LINKLOCAL 0x20 (the scope
# column of /proc/net/if_inet6). Such addresses cannot reach another node.
IPV6_LOCAL_SCOPES = {0x10, 0x20}

# The route flags /proc/net/route prints (include/uapi/linux/route.h): fib_flag_trans in
# net/ipv4/fib_trie.c sets RTF_UP on every route, RTF_GATEWAY on one through a gateway
# and RTF_REJECT on an unreachable or prohibit route (which has no interface: "*").
RTF_GATEWAY = 0x0002
RTF_REJECT = 0x0200


@record
class Ipv4Route:
    """One route of the main table as /proc/net/route shows it."""

    interface: str
    network: ipaddress.IPv4Network
    through_gateway: bool
    metric: int


def _host_order_ipv4(text: str) -> ipaddress.IPv4Address:
    """An address as fib_route_seq_show prints it: the network-order word printed as a
    host integer (%08X), so "0100000A" is 10.0.0.1 on a little-endian machine. Parsed
    where it was read, in this machine's byte order."""
    return ipaddress.IPv4Address(int(text, 16).to_bytes(4, sys.byteorder))


def parse_ipv4_route_table(text: str) -> list[Ipv4Route]:
    """The routes of /proc/net/route (net/ipv4/fib_trie.c fib_route_seq_show: a header
    line, then "Iface Destination Gateway Flags RefCnt Use Metric Mask ..." rows),
    without reject routes, which lead nowhere. ValueError on a row that is not one."""
    routes = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 8:
            raise ValueError(f"a route row has {len(fields)} fields, not 11: {line.strip()!r}")
        interface, destination, gateway, flags, _, _, metric, mask = fields[:8]
        flag_bits, through = int(flags, 16), _host_order_ipv4(gateway)
        network = ipaddress.IPv4Network(
            (_host_order_ipv4(destination), str(_host_order_ipv4(mask))), strict=False
        )
        if flag_bits & RTF_REJECT or interface == "*":
            continue
        via_gateway = bool(flag_bits & RTF_GATEWAY) or int(through) != 0
        routes.append(Ipv4Route(interface, network, via_gateway, int(metric)))
    return routes


def parse_ipv4_routes(text: str) -> set[str]:
    """Interfaces with an IPv4 route, from /proc/net/route. An interface with an
    address has at least its subnet's route."""
    return {route.interface for route in parse_ipv4_route_table(text)}


def default_route_interfaces(routes: list[Ipv4Route]) -> tuple[str, ...]:
    """The interfaces of the IPv4 default routes (0.0.0.0/0), lowest metric first: the
    one the kernel sends to any address outside the node's subnets."""
    defaults = sorted(
        (route.metric, route.interface) for route in routes if route.network.prefixlen == 0
    )
    return tuple(dict.fromkeys(interface for _, interface in defaults))


@record
class Ipv6Address:
    """One address of /proc/net/if_inet6 another node can reach (global scope)."""

    interface: str
    network: ipaddress.IPv6Network


def parse_ipv6_address_table(text: str) -> list[Ipv6Address]:
    """The addresses of /proc/net/if_inet6 another node can reach, with their prefix
    (net/ipv6/addrconf.c if6_seq_show: address, ifindex, prefix length, scope, flags,
    name; all hex but the name). ValueError on a line that is not one."""
    addresses = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 6:
            raise ValueError(f"an address line has {len(fields)} fields, not 6: {line!r}")
        address, _, prefix, scope, _, interface = fields
        if int(scope, 16) in IPV6_LOCAL_SCOPES:
            continue
        network = ipaddress.IPv6Network(
            (ipaddress.IPv6Address(bytes.fromhex(address)), int(prefix, 16)), strict=False
        )
        addresses.append(Ipv6Address(interface, network))
    return addresses


def parse_ipv6_addresses(text: str) -> set[str]:
    """Interfaces with an IPv6 address another node can reach, from /proc/net/if_inet6."""
    return {address.interface for address in parse_ipv6_address_table(text)}


@record
class AddressedInterfaces:
    """The addressed_interfaces part: the interfaces with an IPv4 route or a global IPv6
    address (`names`, None when neither file could be read), and those holding the IPv4
    default route, lowest metric first (`default_route`: None when /proc/net/route
    could not be read; empty when it holds none)."""

    names: frozenset[str] | None
    default_route: tuple[str, ...] | None = None


def _read_table(fs: NodeFS, name: str, parse: Callable[[str], T], what: str) -> T | None:
    """A /proc/net table, parsed; None when it is missing, unreadable or not what the
    kernel prints (then what it would have told is unknown)."""
    try:
        return read_optional_parsed(fs.proc("net", name), parse, what)
    except ReadError:
        return None


def read_addressed_interfaces(fs: NodeFS) -> AddressedInterfaces:
    """Interfaces with an IPv4 route or a global IPv6 address and the default route's;
    unknown (None) where the files could not be read, never guessed."""
    routes = _read_table(fs, "route", parse_ipv4_route_table, "the IPv4 route table")
    addresses = _read_table(fs, "if_inet6", parse_ipv6_address_table, "IPv6 addresses")
    if routes is None:
        # Every interface with an IPv4 address has its subnet's route in this table (an
        # IPv4 kernel always has it): unread, or one row not as the kernel prints it, the
        # IPv6 table alone would leave each IPv4-only interface out, as if unaddressed.
        return AddressedInterfaces(None)
    names = {route.interface for route in routes or []}
    names |= {address.interface for address in addresses or []}
    return AddressedInterfaces(
        frozenset(names), None if routes is None else default_route_interfaces(routes)
    )


class MasterAddrOutcome(str, enum.Enum):
    """What MASTER_ADDR told of the interface that leads to rank 0's node."""

    UNSET = "unset"
    NOT_AN_ADDRESS = "not an IP address"  # a host name: never resolved (DNS has no bound)
    LOOPBACK = "loopback"
    IN_SUBNET = "in a subnet of an interface"
    NO_SUBNET = "in no subnet of this node"  # reached through a gateway, if at all
    ROUTES_UNREAD = "routes unreadable"


@record
class MasterAddrRoute:
    """The master_addr_route part: which interface's subnet holds MASTER_ADDR, the
    address torchrun's and torch.distributed's rank 0 listens on. Only the outcome and
    the interface are kept, never the address: MASTER_ADDR is not a variable nodecheck
    audits, so its value never enters the facts, a capture or the output."""

    outcome: MasterAddrOutcome
    interface: str | None = None


def master_address(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """MASTER_ADDR as an IP literal ("10.10.0.7", "fd00::7", "[fd00::7]"); None for
    anything else, a host name among them."""
    text = value.strip().removeprefix("[").removesuffix("]")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def match_master_addr(
    value: str | None,
    routes: list[Ipv4Route] | None,
    addresses: list[Ipv6Address] | None,
) -> MasterAddrRoute:
    """MASTER_ADDR against the node's subnets: an IP literal only (a host name would
    need a DNS lookup, which has no time bound: not made). The longest prefix among the
    routes that reach a subnet directly (no gateway, not the default route) wins, as the
    kernel's own lookup would; an IPv6 address against the global addresses' prefixes."""
    if value is None:
        return MasterAddrRoute(MasterAddrOutcome.UNSET)
    address = master_address(value)
    if address is None:
        return MasterAddrRoute(MasterAddrOutcome.NOT_AN_ADDRESS)
    if address.is_loopback:
        return MasterAddrRoute(MasterAddrOutcome.LOOPBACK)
    subnets: list[tuple[int, int, str]]
    if isinstance(address, ipaddress.IPv4Address):
        if routes is None:
            return MasterAddrRoute(MasterAddrOutcome.ROUTES_UNREAD)
        subnets = [
            (route.network.prefixlen, -route.metric, route.interface)
            for route in routes
            if not route.through_gateway
            and route.network.prefixlen > 0
            and address in route.network
        ]
    else:
        if addresses is None:
            return MasterAddrRoute(MasterAddrOutcome.ROUTES_UNREAD)
        subnets = [
            (entry.network.prefixlen, 0, entry.interface)
            for entry in addresses
            if address in entry.network
        ]
    if not subnets:
        return MasterAddrRoute(MasterAddrOutcome.NO_SUBNET)
    return MasterAddrRoute(MasterAddrOutcome.IN_SUBNET, max(subnets)[2])


def read_master_addr_route(fs: NodeFS, environ: Mapping[str, str]) -> MasterAddrRoute:
    """Which interface's subnet holds the MASTER_ADDR of `environ`: /proc/net/route for
    an IPv4 address, /proc/net/if_inet6 for an IPv6 one, each read only when needed."""
    value = environ.get("MASTER_ADDR")
    address = None if value is None else master_address(value)
    routes = addresses = None
    if isinstance(address, ipaddress.IPv4Address) and not address.is_loopback:
        routes = _read_table(fs, "route", parse_ipv4_route_table, "the IPv4 route table")
    elif isinstance(address, ipaddress.IPv6Address) and not address.is_loopback:
        addresses = _read_table(fs, "if_inet6", parse_ipv6_address_table, "IPv6 addresses")
    return match_master_addr(value, routes, addresses)


class GlooIfnameOutcome(str, enum.Enum):
    """What GLOO_SOCKET_IFNAME, as the calling environment sets it, names."""

    UNSET = "unset"
    INTERFACES = "interfaces of this node"
    # Anything else (a name not here, an empty entry, a prefix, one character, which torch
    # ignores): its value is not kept.
    OTHER = "something other than interfaces of this node"


@record
class GlooSocketIfname:
    """The gloo_socket_ifname part: whether GLOO_SOCKET_IFNAME is set and, where every
    entry of it is the name of an interface of this node, those interfaces. Its value is
    kept only then, as the interfaces, which the inventory names anyway: the variable is
    not one nodecheck audits, so any other value never enters the facts, a capture or
    the output (as master_addr_route keeps only MASTER_ADDR's interface)."""

    outcome: GlooIfnameOutcome
    interfaces: tuple[str, ...] = ()


def match_gloo_socket_ifname(value: str | None, interfaces: Collection[str]) -> GlooSocketIfname:
    """GLOO_SOCKET_IFNAME against the node's interface names. torch splits the value at
    commas and gloo opens each entry as an exact interface name; a value of one character
    or none torch ignores (torch/csrc/distributed/c10d/init.cpp, ProcessGroupGloo)."""
    if value is None:
        return GlooSocketIfname(GlooIfnameOutcome.UNSET)
    entries = tuple(value.split(","))
    if len(value) > 1 and all(entry in interfaces for entry in entries):
        return GlooSocketIfname(GlooIfnameOutcome.INTERFACES, entries)
    return GlooSocketIfname(GlooIfnameOutcome.OTHER)


def read_rdma_devices(fs: NodeFS) -> list[RdmaDevice]:
    """Every RDMA device of `<sysfs>/class/infiniband`; ReadError when that cannot be listed."""
    devices = []
    root = os.path.realpath(fs.sys("devices"))
    for name in list_dir(fs.sys("class", "infiniband")):
        directory = fs.sys("class", "infiniband", name)
        device = RdmaDevice(name=name, pci_bdf=_pci_of(root, os.path.realpath(directory)))
        try:
            port_names = list_dir(directory / "ports")
        except ReadError as err:
            device.problems["ports"] = str(err)
            port_names = []
        for port_name in port_names:
            if not port_name.isdigit():
                continue
            port_dir = directory / "ports" / port_name
            state = rate = link_layer = width = None
            try:
                state = read_parsed(port_dir / "state", parse_port_state, "a port state")
                rate, width = read_parsed(
                    port_dir / "rate",
                    lambda text: (parse_port_rate(text), parse_port_width(text)),
                    "a port rate",
                )
                link_layer = read_optional_text(port_dir / "link_layer")
            except ReadError as err:
                device.problems[f"port {port_name}"] = str(err)
            phys_state = None
            try:
                phys_state = read_optional_parsed(
                    port_dir / "phys_state", parse_phys_state, "a physical port state"
                )
            except ReadError as err:
                device.problems[f"port {port_name} phys_state"] = str(err)
            device.ports.append(
                RdmaPort(int(port_name), state, rate, link_layer, phys_state, width)
            )
        devices.append(device)
    return devices


@record(frozen=False)
class PortGidTypes:
    """The GID table of one RoCE port (`<sysfs>/class/infiniband/<hca>/ports/<n>/gid_attrs/
    types/<index>`, Documentation/ABI/stable/sysfs-class-infiniband): the type of each
    entry in use ("RoCE v2", "IB/RoCE v1"). An index in neither `types` nor `problems`
    holds no GID. `problems` says, per index, why its type could not be read; `problem`
    why the table could not be listed (then no index can be told)."""

    device: str
    port: int
    types: dict[int, str] = field(default_factory=dict)
    problems: dict[int, str] = field(default_factory=dict)
    problem: str | None = None


def read_port_gid_types(fs: NodeFS, device: str, port: int) -> PortGidTypes:
    """The type of every entry of one port's GID table. The kernel answers EINVAL for an
    entry that holds no GID (drivers/infiniband/core/sysfs.c _show_port_gid_attr: "-EINVAL
    is returned for user space compatibility reasons"), so that is an empty entry, not a
    failed read; a kernel without gid_attrs (before 4.5) has no table to list: no GIDs."""
    directory = fs.sys("class", "infiniband", device, "ports", str(port), "gid_attrs", "types")
    table = PortGidTypes(device, port)
    try:
        names = list_dir(directory)
    except ReadError as err:
        table.problem = str(err)
        return table
    for index in sorted(int(name) for name in names if name.isdigit()):
        try:
            gid_type = read_optional_text(directory / str(index))
        except ReadError as err:
            if err.reason != os.strerror(errno.EINVAL):
                table.problems[index] = str(err)
            continue
        if gid_type:
            table.types[index] = gid_type
    return table


def read_roce_gid_types(fs: NodeFS, devices: list[RdmaDevice]) -> list[PortGidTypes]:
    """The GID tables of the RoCE ports (link layer Ethernet) of `devices`, in their order:
    NCCL_IB_GID_INDEX names an entry of them (InfiniBand ports need no GID index)."""
    return [
        read_port_gid_types(fs, device.name, port.number)
        for device in devices
        for port in device.ports
        if port.link_layer == "Ethernet"
    ]


# The error counters of a port (Documentation/ABI/stable/sysfs-class-infiniband,
# <device>/ports/<n>/counters/), each at its all-ones maximum: the kernel reads them
# from the PortCounters MAD at 8 or 16 bits (drivers/infiniband/core/sysfs.c,
# PORT_PMA_ATTR), and a PortCounters counter stops there ("saturates") instead of
# wrapping (InfiniBand Architecture Specification vol. 1, Performance Management),
# so from then on it shows no rate.
PORT_ERROR_COUNTERS: dict[str, int] = {
    "link_downed": 0xFF,  # LinkDownedCounter: the link went down and came back (a flap)
    "link_error_recovery": 0xFF,  # LinkErrorRecoveryCounter: retrained after errors
    "symbol_error": 0xFFFF,  # SymbolErrorCounter: minor errors on a lane
    "port_rcv_errors": 0xFFFF,  # PortRcvErrors: packets received with errors
}


def port_key(device: str, port: int) -> str:
    """How a port is named among the readings: "mlx5_0/1"."""
    return f"{device}/{port}"


@record
class PortCounters:
    """One reading of a port's error counters. `values` has the counters that could be
    read; `problems` says, per counter, why one could not; `missing` is True when the
    port has no counters folder at all (a driver that exposes only hw_counters).

    `read_at` is the wall-clock time of the reading (seconds since the epoch), so a
    reading in a capture can be set against one taken by another process or on another
    day; a rate over an interval that is not positive (the clock was set back) is none."""

    device: str
    port: int
    read_at: float
    values: dict[str, int] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    missing: bool = False

    @property
    def key(self) -> str:
        return port_key(self.device, self.port)

    def saturated(self, name: str) -> bool:
        value = self.values.get(name)
        return value is not None and value >= PORT_ERROR_COUNTERS[name]


def parse_counter(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError(f"negative counter: {text!r}")
    return value


def read_port_counters(fs: NodeFS, device: str, port: int) -> PortCounters:
    """The error counters of one port. A counter read through a MAD that the device did
    not answer fails with an error (drivers/infiniband/core/sysfs.c show_pma_counter):
    that counter lands in `problems`, the others are still read."""
    directory = fs.sys("class", "infiniband", device, "ports", str(port), "counters")
    read_at = time.time()
    if not directory.is_dir():
        return PortCounters(device, port, read_at, missing=True)
    values: dict[str, int] = {}
    problems: dict[str, str] = {}
    for name in PORT_ERROR_COUNTERS:
        try:
            value = read_optional_parsed(directory / name, parse_counter, "a counter")
        except ReadError as err:
            problems[name] = str(err)
            continue
        if value is None:
            problems[name] = f"{directory / name}: missing"
        else:
            values[name] = value
    return PortCounters(device, port, read_at, values, problems)


@record
class RdmaPortCounterReading:
    """The error counters of every port of the RDMA devices read (`ports`), and whether
    <sysfs>/class/infiniband is there at all (`class_present`: an empty class folder is
    an RDMA stack with no device; no folder, no RDMA core loaded)."""

    class_present: bool
    ports: list[PortCounters] = field(default_factory=list)


def read_rdma_port_counters(fs: NodeFS, devices: list[RdmaDevice]) -> RdmaPortCounterReading:
    """The counters of every port of `devices` (the inventory's RDMA devices)."""
    return RdmaPortCounterReading(
        fs.sys("class", "infiniband").is_dir(),
        [
            read_port_counters(fs, device.name, port.number)
            for device in devices
            for port in device.ports
        ],
    )


class PortCounterHistory:
    """The previous counter reading of each RDMA port, so the agent judges the counters
    by their rate, as GpuHistory does for the GPUs' counters. A one-shot run starts with
    an empty one. Keyed by "<device>/<port>"."""

    def __init__(self) -> None:
        self._previous: dict[str, PortCounters] = {}
        self._lock = threading.Lock()

    def exchange(self, readings: list[PortCounters]) -> dict[str, PortCounters]:
        """The readings before these, by key; these become the previous ones."""
        with self._lock:
            previous = dict(self._previous)
            for reading in readings:
                if not reading.missing:
                    self._previous[reading.key] = reading
            return previous
