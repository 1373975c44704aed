"""What NCCL decides by on this node beyond its PCI tree, read without loading NCCL: the
CPU vendor its peer-to-peer default depends on, the topology file it loads by itself, the
IMEX setup multi-node NVLink needs, and the SHARP plugin CollNet needs.

- CPU: NCCL takes the vendor from CPUID (NVIDIA/nccl src/graph/topo.cc, kvDictCpuVendor:
  GenuineIntel, AuthenticAMD, CentaurHauls and "  Shanghai  " for Zhaoxin); x86 kernels
  print the same string as `vendor_id` in /proc/cpuinfo, Arm kernels print "CPU
  implementer" lines and no vendor_id.
- Topology file: with NCCL_TOPO_FILE unset, NCCL reads
  /var/run/nvidia-topologyd/virtualTopology.xml when it exists (src/graph/topo.cc,
  ncclTopoGetSystem), the file a VM's topology daemon leaves for it.
- IMEX (NVIDIA IMEX guide, docs.nvidia.com/multi-node-nvlink-systems/imex-guide/): the
  nvidia-imex service reads /etc/nvidia-imex/config.cfg, whose IMEX_NODE_CONFIG_FILE
  (default /etc/nvidia-imex/nodes_config.cfg) lists the IP addresses of the nodes of the
  IMEX domain, one a line ("IMEX Service Config Options"; "Deployment Models": on an
  NVLink domain-wide deployment every compute node of the domain). The driver registers
  the character device nvidia-caps-imex-channels (its major in /proc/devices), but the
  channels, /dev/nvidia-caps-imex-channels/channelN, exist only once an administrator
  (mknod), the module parameter NVreg_CreateImexChannel0=1 or a job launcher creates
  them, and not across a reboot ("IMEX Channels"). Without one, CUDA cannot export the
  fabric memory handles multi-node NVLink rests on.
- SHARP: the NCCL-RDMA-SHARP plugin (github.com/Mellanox/nccl-rdma-sharp-plugins,
  src/Makefile.am) is `libnccl-net.so`, the name NCCL loads a network plugin by when
  NCCL_NET_PLUGIN is unset (NVIDIA/nccl src/plugin/net.cc), and links SHARP's client
  library `libsharp_coll` (installed under /opt/mellanox/sharp by the OFED/DOCA sharp
  package: the plugin's m4/sharp.m4 looks there). Both are looked for only on a node with
  an active InfiniBand port: SHARP is an InfiniBand switch feature.

Only names are listed (never a library is opened, never a device node), and only the
count of the IMEX node list's addresses is kept, not the addresses.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from nodecheck.checks.node.cpu import parse_cpuinfo
from nodecheck.checks.node.fs import NodeFS, ReadError, list_dir, read_optional_text, read_prefix
from nodecheck.checks.node.inventory import Inventory
from nodecheck.checks.node.nccl_library import LIBRARY_DIRS
from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.record import record

CPU_ARM = "arm"
IMEX_CONFIG = "/etc/nvidia-imex/config.cfg"
IMEX_DEFAULT_NODE_LIST = "/etc/nvidia-imex/nodes_config.cfg"
IMEX_CHANNELS = "/dev/nvidia-caps-imex-channels"
IMEX_DEVICE = "nvidia-caps-imex-channels"
VIRTUAL_TOPOLOGY = "/var/run/nvidia-topologyd/virtualTopology.xml"
# Where the SHARP client and the plugin are installed besides the system library
# directories: the OFED/DOCA sharp package's prefix, and HPC-X's plugin and SHARP
# folders as its documentation installs it under /opt/hpcx.
SHARP_DIRS = (
    *LIBRARY_DIRS,
    "/opt/mellanox/sharp/lib",
    "/opt/hpcx/nccl_rdma_sharp_plugin/lib",
    "/opt/hpcx/sharp/lib",
)
# A network plugin (libnccl-net.so, or libnccl-net-<name>.so as NCCL_NET_PLUGIN names
# one) or SHARP's client library, with or without its version suffix.
SHARP_CLIENT_FILE = LazyPattern(
    r"^(?:(?P<plugin>libnccl-net(?:-[\w.-]+)?)|(?P<sharp>libsharp_coll))\.so(?:\.\d+)*$"
)
CHANNEL_NAME = LazyPattern(r"^channel\d+$")


@record
class ImexSetup:
    """IMEX as the node shows it. `nodes`: the addresses in the node list (None: no node
    list); `channels`: the channel devices (None: their directory could not be listed);
    `device_major`:
    the driver's nvidia-caps-imex-channels major in /proc/devices (None: not registered,
    an older driver or none)."""

    node_list: str
    nodes: int | None
    channels: tuple[str, ...] | None
    device_major: int | None

    @property
    def domain_evidence(self) -> str:
        """Why this node is in a multi-node NVLink (IMEX) domain; "" when nothing says so.
        IMEX exists for multi-node NVLink only (GB200 NVL72, GH200 NVL32: the IMEX guide's
        supported platforms and deployment models): a node list of two or more nodes, or a
        channel (a per-job deployment creates one for the job), is that evidence."""
        found = []
        if self.nodes is not None and self.nodes >= 2:
            found.append(f"IMEX's node list {self.node_list} names {self.nodes} nodes")
        if self.channels:
            found.append(f"IMEX channel(s) {', '.join(self.channels)} in {IMEX_CHANNELS}")
        return "; ".join(found)


@record
class SharpClient:
    """The NCCL network plugins (libnccl-net*.so) and SHARP client libraries
    (libsharp_coll.so*) found, by path."""

    net_plugins: tuple[str, ...]
    sharp_libraries: tuple[str, ...]


@record
class NcclPlatform:
    """The nccl_platform part. `cpu_vendor`: /proc/cpuinfo's vendor_id, CPU_ARM for an
    Arm kernel's, None when neither could be read; `virtual_topology`: whether NCCL's
    default topology file exists (None: unknown); `sharp`: None where it was not looked
    for (no active InfiniBand port); `problems`: each read that failed, naming the path."""

    cpu_vendor: str | None
    virtual_topology: bool | None
    imex: ImexSetup
    sharp: SharpClient | None
    problems: tuple[str, ...] = ()


def parse_cpu_vendor(cpuinfo: str) -> str | None:
    """The vendor NCCL would see: "GenuineIntel" from an x86 block, CPU_ARM from an Arm
    one ("CPU implementer"), None from neither."""
    fields = parse_cpuinfo(cpuinfo)
    # parse_cpuinfo strips values: Zhaoxin's "  Shanghai  " reads "Shanghai".
    if fields.get("vendor_id"):
        return fields["vendor_id"]
    return CPU_ARM if "CPU implementer" in fields else None


def parse_node_list_path(config: str) -> str:
    """IMEX_NODE_CONFIG_FILE from nvidia-imex's config.cfg (NAME=value lines, # comments);
    the default where it is not set."""
    for line in config.splitlines():
        name, _, value = line.strip().partition("=")
        if name.strip() == "IMEX_NODE_CONFIG_FILE" and value.strip():
            return value.strip()
    return IMEX_DEFAULT_NODE_LIST


def count_node_addresses(node_list: str) -> int:
    """The addresses of an IMEX node list: its lines that are neither blank nor comments."""
    lines = (line.strip() for line in node_list.splitlines())
    return sum(1 for line in lines if line and not line.startswith("#"))


def parse_device_major(devices: str, name: str) -> int | None:
    """The major number of character device `name` in /proc/devices ("234 name")."""
    for line in devices.splitlines():
        number, _, device = line.strip().partition(" ")
        if device.strip() == name and number.isdigit():
            return int(number)
    return None


def _listed(fs: NodeFS, directory: str, problems: list[str]) -> list[str] | None:
    """The entries of a host directory ([] when it does not exist); None, with the
    problem recorded, when it cannot be listed."""
    try:
        return list_dir(fs.host(directory))
    except ReadError as err:
        problems.append(str(err))
        return None


def _optional(fs: NodeFS, absolute: str, problems: list[str]) -> str | None:
    try:
        return read_optional_text(fs.host(absolute))
    except ReadError as err:
        problems.append(str(err))
        return None


def read_cpu_vendor(fs: NodeFS, problems: list[str]) -> str | None:
    try:
        # The first processor block is enough: the vendor is the same for every CPU.
        data = read_prefix(fs.proc("cpuinfo"), limit=1 << 16).data
    except ReadError as err:
        problems.append(str(err))
        return None
    return parse_cpu_vendor(data.decode(errors="replace"))


def read_imex(fs: NodeFS, problems: list[str]) -> ImexSetup:
    config = _optional(fs, IMEX_CONFIG, problems)
    node_list = IMEX_DEFAULT_NODE_LIST if config is None else parse_node_list_path(config)
    addresses = _optional(fs, node_list, problems)
    channels = _listed(fs, IMEX_CHANNELS, problems)
    try:
        devices = read_optional_text(fs.proc("devices"))
    except ReadError as err:
        problems.append(str(err))
        devices = None
    return ImexSetup(
        node_list,
        None if addresses is None else count_node_addresses(addresses),
        None if channels is None else tuple(name for name in channels if CHANNEL_NAME.match(name)),
        None if devices is None else parse_device_major(devices, IMEX_DEVICE),
    )


def read_sharp_client(fs: NodeFS, problems: list[str]) -> SharpClient:
    plugins: list[str] = []
    sharp: list[str] = []
    for directory in dict.fromkeys(SHARP_DIRS):
        for name in _listed(fs, directory, problems) or []:
            match = SHARP_CLIENT_FILE.match(name)
            if match:
                (plugins if match.group("plugin") else sharp).append(f"{directory}/{name}")
    return SharpClient(tuple(plugins), tuple(sharp))


def has_active_infiniband(inventory: Inventory) -> bool:
    return any(
        port.state == "ACTIVE" and port.link_layer == "InfiniBand"
        for rdma in inventory.rdma
        for port in rdma.ports
    )


def read_nccl_platform(fs: NodeFS, inventory: Inventory) -> NcclPlatform:
    problems: list[str] = []
    vendor = read_cpu_vendor(fs, problems)
    topology = PurePosixPath(VIRTUAL_TOPOLOGY)
    listed = _listed(fs, str(topology.parent), problems)
    virtual_topology = None if listed is None else topology.name in listed
    imex = read_imex(fs, problems)
    sharp = read_sharp_client(fs, problems) if has_active_infiniband(inventory) else None
    return NcclPlatform(vendor, virtual_topology, imex, sharp, tuple(problems))
