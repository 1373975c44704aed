"""The parts of NodeFacts and their readers: the one place that says what nodecheck reads.

Each reader takes the node's sources (and the facts, for a part that builds on another)
and returns a dataclass of plain values. It imports its module on first use, so a
command pays only for what its checks need (`tune` never loads NVML, `check --facts`
reads nothing at all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nodecheck.checks.node.facts import DERIVED, FactsSource, NodeSources, lazy_type, part

if TYPE_CHECKING:
    from nodecheck.checks.node.aer import AerReading
    from nodecheck.checks.node.gpu import GpuSnapshot
    from nodecheck.checks.node.inventory import Inventory
    from nodecheck.checks.node.pci import PciDevice
    from nodecheck.checks.node.variables import Variables


@part("hostname", lambda: str)
def read_hostname_part(sources: NodeSources, facts: FactsSource) -> str:
    """The node's name (<procfs>/sys/kernel/hostname); unread when it cannot be known."""
    from nodecheck.checks.node.inventory import read_known_hostname

    return read_known_hostname(sources.fs)


@part("inventory", lazy_type("inventory", "Inventory"))
def read_inventory_part(sources: NodeSources, facts: FactsSource) -> Inventory:
    """PCI devices and bridges with their links, NICs, RDMA devices, CPUs and NUMA nodes."""
    from nodecheck.checks.node.inventory import read_inventory

    return read_inventory(sources.fs)


def _type_pci_gpus() -> object:
    from nodecheck.checks.node.pci import PciDevice

    return list[PciDevice]


@part("pci_gpus", _type_pci_gpus, shared=True, captured=False)
def read_pci_gpus_part(sources: NodeSources, facts: FactsSource) -> list[PciDevice]:
    """The NVIDIA GPUs on the PCI bus: from the inventory when it is already read,
    otherwise by a lighter read (a GPU-only pass need not read every device)."""
    from nodecheck.checks.node.pci import read_nvidia_gpus

    if facts.has("inventory"):
        inventory: Inventory = facts.get("inventory")
        return inventory.gpus
    return read_nvidia_gpus(sources.fs)


def _gpus_of(inventory: Any) -> Any:
    return inventory.gpus


DERIVED["pci_gpus"] = ("inventory", _gpus_of)


@part("variables", lazy_type("variables", "Variables"), root=True)
def read_variables_part(sources: NodeSources, facts: FactsSource) -> Variables:
    """NCCL_/TORCH_/PYTORCH_/CUDA_ settings: the calling environment, NCCL config files and
    the environments of the processes holding GPUs (other users' only as root)."""
    from nodecheck.checks.node.variables import read_variables

    return read_variables(sources.fs, sources.environ, sources.uid)


@part("gpus", lazy_type("gpu", "GpuSnapshot"), nvml=True, shared=True)
def read_gpus_part(sources: NodeSources, facts: FactsSource) -> GpuSnapshot:
    """What NVML says of every GPU: identity, ECC, remapping, clocks, PCIe, NVLink, power."""
    from nodecheck.checks.node.gpu import read_gpus, resolve_lost_bus_ids

    session = sources.session()
    snapshot = read_gpus(session)
    if any(gpu.bus_id is None for gpu in snapshot.gpus):
        pci_gpus: list[PciDevice] = facts.get("pci_gpus")
        resolve_lost_bus_ids(session, snapshot, [gpu.bdf for gpu in pci_gpus])
    return snapshot


def _type_virtualization() -> object:
    return str | None


@part("virtualization", _type_virtualization)
def read_virtualization_part(sources: NodeSources, facts: FactsSource) -> str | None:
    """Why this node looks like a VM (DMI, the hypervisor flag), or None on bare metal."""
    from nodecheck.checks.node.virtualization import detect_virtualization

    return detect_virtualization(sources.fs)


def _kernel_log_version(sources: NodeSources) -> object:
    from nodecheck.checks.node.kernel_log_facts import kernel_log_version

    try:
        return kernel_log_version(sources.kernel_log_path)
    except Exception:
        return object()


@part(
    "kernel_log",
    lazy_type("kernel_log_facts", "KernelLogFacts"),
    root=True,
    shared=True,
    version=_kernel_log_version,
)
def read_kernel_log_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The kernel log's XID and SXid lines (never its whole text), or why it is unreadable."""
    from nodecheck.checks.node.kernel_log_facts import read_log_facts

    return read_log_facts(sources.kernel_log, sources.fs)


def _type_roce_gids() -> object:
    from nodecheck.checks.node.net import PortGidTypes

    return list[PortGidTypes]


@part("roce_gids", _type_roce_gids)
def read_roce_gids_part(sources: NodeSources, facts: FactsSource) -> list[Any]:
    """The type of each GID of every RoCE port (<sysfs>/class/infiniband/*/ports/*/gid_attrs)."""
    from nodecheck.checks.node.net import read_roce_gid_types

    inventory: Inventory = facts.get("inventory")
    return read_roce_gid_types(sources.fs, inventory.rdma)


@part("nvidia_driver", lazy_type("nvidia_driver", "NvidiaDriver"))
def read_nvidia_driver_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The loaded nvidia kernel module's version and the GPUs it exposes here
    (<procfs>/driver/nvidia/version and gpus/)."""
    from nodecheck.checks.node.nvidia_driver import read_nvidia_driver

    return read_nvidia_driver(sources.fs)


@part("gpu_identities", lazy_type("gpu_identities", "GpuIdentities"))
def read_gpu_identities_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The UUID and device minor the nvidia driver gives each GPU it exposes here, and the
    MIG compute instances it lists for each (<procfs>/driver/nvidia/gpus/*/information,
    capabilities/gpu*/mig); no NVML."""
    from nodecheck.checks.node.gpu_identities import read_gpu_identities

    return read_gpu_identities(sources.fs)


@part("gpu_process_names", lazy_type("processes", "GpuProcessNames"), nvml=True)
def read_gpu_process_names_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The command name (<procfs>/PID/comm) of each process NVML lists on a GPU, or why
    it could not be read (a pid outside this PID namespace)."""
    from nodecheck.checks.node.processes import read_process_names

    snapshot: GpuSnapshot = facts.get("gpus")
    pids = [p.pid for gpu in snapshot.gpus for p in gpu.processes or []]
    return read_process_names(sources.fs, pids)


@part("fabric_manager", lazy_type("processes", "DaemonProcesses"))
def read_fabric_manager_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The running NVIDIA Fabric Manager daemons (nv-fabricmanager, by <procfs>/PID/comm),
    or why the node's processes cannot all be seen from here."""
    from nodecheck.checks.node.processes import FABRIC_MANAGER_COMMAND, find_processes_named

    return find_processes_named(sources.fs, FABRIC_MANAGER_COMMAND)


@part("gpu_presence", lazy_type("gpu_presence", "GpuPresences"))
def read_gpu_presence_part(sources: NodeSources, facts: FactsSource) -> Any:
    """Whether each NVIDIA GPU on the PCI bus answers config reads (its config file's
    first dword), by bus id."""
    from nodecheck.checks.node.gpu_presence import read_gpu_presences

    pci_gpus: list[PciDevice] = facts.get("pci_gpus")
    return read_gpu_presences(pci_gpus)


@part("coherent_gpus", lazy_type("coherent_gpus", "CoherentGpus"))
def read_coherent_gpus_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The GPUs the nvidia driver attaches coherently (NVLink-C2C on Grace), from
    <procfs>/driver/nvidia/gpus/*/numa_status."""
    from nodecheck.checks.node.coherent_gpus import read_coherent_gpus

    return read_coherent_gpus(sources.fs)


@part("addressed_interfaces", lazy_type("net", "AddressedInterfaces"))
def read_addressed_interfaces_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The interfaces with an IPv4 route or a global IPv6 address, and those holding the
    IPv4 default route (<procfs>/net/route and net/if_inet6), or unknown when unreadable."""
    from nodecheck.checks.node.net import read_addressed_interfaces

    return read_addressed_interfaces(sources.fs)


@part("master_addr_route", lazy_type("net", "MasterAddrRoute"))
def read_master_addr_route_part(sources: NodeSources, facts: FactsSource) -> Any:
    """Which interface's subnet holds the calling environment's MASTER_ADDR (an IP
    literal; a host name is never resolved): the outcome and the interface, never the
    address (<procfs>/net/route, net/if_inet6)."""
    from nodecheck.checks.node.net import read_master_addr_route

    return read_master_addr_route(sources.fs, sources.environ)


@part("gloo_socket_ifname", lazy_type("net", "GlooSocketIfname"))
def read_gloo_socket_ifname_part(sources: NodeSources, facts: FactsSource) -> Any:
    """Whether the calling environment sets GLOO_SOCKET_IFNAME and, where it names only
    this node's interfaces (the inventory's), which: never any other value."""
    from nodecheck.checks.node.net import match_gloo_socket_ifname

    inventory: Inventory = facts.get("inventory")
    names = {interface.name for interface in inventory.interfaces}
    return match_gloo_socket_ifname(sources.environ.get("GLOO_SOCKET_IFNAME"), names)


@part("nccl_library", lazy_type("nccl_library", "NcclLibraries"))
def read_nccl_library_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The installed NCCL versions: libnccl's file names under the root filesystem, and
    torch's bundled NCCL from package metadata on the own root (NCCL is never loaded)."""
    from nodecheck.checks.node.nccl_library import read_nccl_libraries

    return read_nccl_libraries(sources.fs)


@part("nccl_platform", lazy_type("nccl_platform", "NcclPlatform"))
def read_nccl_platform_part(sources: NodeSources, facts: FactsSource) -> Any:
    """What NCCL decides by beyond the PCI tree: the CPU vendor, its default topology file,
    IMEX's node list and channels, and (with InfiniBand up) the SHARP plugin's files."""
    from nodecheck.checks.node.nccl_platform import read_nccl_platform

    inventory: Inventory = facts.get("inventory")
    return read_nccl_platform(sources.fs, inventory)


@part("calling_environment", lazy_type("calling_environment", "CallingEnvironment"))
def read_calling_environment_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The calling environment's variables that tune and exec read (job size, local rank,
    GPUs, OMP_NUM_THREADS, the audited prefixes), filtered as read: no other value."""
    from nodecheck.checks.node.calling_environment import read_calling_environment

    return read_calling_environment(sources.environ)


@part("cpuset", lazy_type("cgroup", "CpusetReading"))
def read_cpuset_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The CPUs and memory nodes this process may use (its cpuset cgroup), or why they
    could not be read."""
    from nodecheck.checks.node.cgroup import read_cpuset

    return read_cpuset(sources.fs)


@part("job_versions", lazy_type("job_versions", "JobVersions"), root=True)
def read_job_versions_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The job's torch and NCCL: the Python named (tune/exec --python), and the libraries
    the running GPU processes mapped (/proc/<pid>/maps)."""
    from nodecheck.checks.node.job_versions import read_job_versions

    variables: Variables = facts.get("variables")
    return read_job_versions(
        sources.fs, sources.job_python, dict(sources.environ), variables.gpu_processes
    )


@part("torch_version", lazy_type("torch_package", "TorchVersion"))
def read_torch_version_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The torch of nodecheck's own Python, from package metadata (never imported)."""
    from nodecheck.checks.node.torch_package import read_torch_version

    return read_torch_version()


if TYPE_CHECKING:
    from nodecheck.checks.node.aer import AerReading
    from nodecheck.checks.node.cpu import CpuGovernors
    from nodecheck.checks.node.net import RdmaPortCounterReading
    from nodecheck.checks.node.numa import NumaBalancing
    from nodecheck.checks.node.pci_config import SwitchPortAcs


@part("numa_balancing", lazy_type("numa", "NumaBalancing"))
def read_numa_balancing_part(sources: NodeSources, facts: FactsSource) -> NumaBalancing:
    """kernel.numa_balancing: its mode, its absence (a kernel without it), or why unreadable."""
    from nodecheck.checks.node.numa import read_numa_balancing

    return read_numa_balancing(sources.fs)


@part("pcie_acs", lazy_type("pci_config", "SwitchPortAcs"), root=True)
def read_pcie_acs_part(sources: NodeSources, facts: FactsSource) -> SwitchPortAcs:
    """ACS registers of every PCIe switch port (a bridge below a root port), from its config
    space: past its first 64 bytes only as root."""
    from nodecheck.checks.node.pci_config import read_switch_port_acs

    inventory: Inventory = facts.get("inventory")
    switch_ports = {bdf for device in inventory.pci.values() for bdf in device.parents[1:]}
    return read_switch_port_acs(sources.fs, switch_ports)


@part("pcie_aer", lazy_type("aer", "AerReading"))
def read_pcie_aer_part(sources: NodeSources, facts: FactsSource) -> AerReading:
    """The AER error counters of every device on the paths of the GPUs and RDMA NICs,
    root port to endpoint (an endpoint's errors often count at its link partner)."""
    from nodecheck.checks.node.aer import read_aer, watched_endpoints

    inventory: Inventory = facts.get("inventory")
    endpoints = watched_endpoints(inventory)
    paths = {
        bdf: str(inventory.pci[bdf].sysfs_dir)
        for endpoint in endpoints
        for bdf in endpoint.chain
        if bdf in inventory.pci
    }
    return read_aer(paths, frozenset(endpoint.chain[0] for endpoint in endpoints))


@part("rdma_port_counters", lazy_type("net", "RdmaPortCounterReading"))
def read_rdma_port_counters_part(
    sources: NodeSources, facts: FactsSource
) -> RdmaPortCounterReading:
    """The error counters of every RDMA port, and whether <sysfs>/class/infiniband exists."""
    from nodecheck.checks.node.net import read_rdma_port_counters

    inventory: Inventory = facts.get("inventory")
    return read_rdma_port_counters(sources.fs, inventory.rdma)


@part("cpu_governors", lazy_type("cpu", "CpuGovernors"))
def read_cpu_governors_part(sources: NodeSources, facts: FactsSource) -> CpuGovernors:
    """The cpufreq governor of every online CPU, and the CPUs whose governor is unreadable."""
    from nodecheck.checks.node.cpu import read_governors

    inventory: Inventory = facts.get("inventory")
    return read_governors(sources.fs, sorted(inventory.cpu.cpus))


@part("cpu_model", lambda: str)
def read_cpu_model_part(sources: NodeSources, facts: FactsSource) -> str:
    """The CPU model name (/proc/cpuinfo's "model name"; py-cpuinfo on a live Arm node)."""
    from nodecheck.checks.node.cpu import read_cpu_model

    return read_cpu_model(sources.fs)


@part("network_sweep", lazy_type("network_sweep", "NetworkSweepReading"))
def read_network_sweep_part(sources: NodeSources, facts: FactsSource) -> Any:
    """This node's record of the last cross-node sweep (<state dir>/network.json, written
    by `nodecheck bench network`), or why there is none."""
    from nodecheck.checks.node.network_sweep import RECORD_FILE, read_network_sweep

    return read_network_sweep(sources.state_directory / RECORD_FILE)


@part("network_sweep_previous", lazy_type("network_sweep", "NetworkSweepReading"))
def read_network_sweep_previous_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The record the last sweep replaced (<state dir>/network.previous.json): a node is
    failed only when two sweeps in a row named it."""
    from nodecheck.checks.node.network_sweep import PREVIOUS_RECORD_FILE, read_network_sweep

    return read_network_sweep(sources.state_directory / PREVIOUS_RECORD_FILE)
