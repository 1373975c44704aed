"""The parts of NodeFacts and their readers: the one place that says what nodecheck reads.

Each reader takes the node's sources (and the facts, for a part that builds on another)
and returns a dataclass of plain values. It imports its module on first use, so a
command pays only for what its checks need (`tune` never loads NVML, `check --facts`
reads nothing at all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nodecheck.checks.node.facts import DERIVED, FactsSource, NodeSources, part

if TYPE_CHECKING:
    from nodecheck.checks.node.gpu import GpuSnapshot
    from nodecheck.checks.node.inventory import Inventory
    from nodecheck.checks.node.pci import PciDevice
    from nodecheck.checks.node.variables import Variables


def _type_inventory() -> object:
    from nodecheck.checks.node.inventory import Inventory

    return Inventory


@part("hostname", lambda: str)
def read_hostname_part(sources: NodeSources, facts: FactsSource) -> str:
    """The node's name (<procfs>/sys/kernel/hostname)."""
    from nodecheck.checks.node.inventory import read_hostname

    return read_hostname(sources.fs)


@part("inventory", _type_inventory)
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


def _type_variables() -> object:
    from nodecheck.checks.node.variables import Variables

    return Variables


@part("variables", _type_variables, root=True)
def read_variables_part(sources: NodeSources, facts: FactsSource) -> Variables:
    """NCCL_/TORCH_/PYTORCH_/CUDA_ settings: the calling environment, NCCL config files and
    the environments of the processes holding GPUs (other users' only as root)."""
    from nodecheck.checks.node.variables import read_variables

    return read_variables(sources.fs, sources.environ, sources.uid)


def _type_gpus() -> object:
    from nodecheck.checks.node.gpu import GpuSnapshot

    return GpuSnapshot


@part("gpus", _type_gpus, nvml=True, shared=True)
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


def _type_kernel_log() -> object:
    from nodecheck.checks.node.kernel_log_facts import KernelLogFacts

    return KernelLogFacts


def _kernel_log_version(sources: NodeSources) -> object:
    from nodecheck.checks.node.kernel_log_facts import kernel_log_version

    try:
        return kernel_log_version(sources.kernel_log_path)
    except Exception:
        return object()


@part("kernel_log", _type_kernel_log, shared=True, version=_kernel_log_version)
def read_kernel_log_part(sources: NodeSources, facts: FactsSource) -> Any:
    """The kernel log's XID and SXid lines (never its whole text), or why it is unreadable."""
    from nodecheck.checks.node.kernel_log_facts import read_log_facts

    return read_log_facts(sources.kernel_log, sources.fs)


# --- fix-capture (issue 14, task 5: capture, --facts, the root snapshot as facts) ---------


@part("cpu_model", lambda: str)
def read_cpu_model_part(sources: NodeSources, facts: FactsSource) -> str:
    """The CPU model name (/proc/cpuinfo's "model name"; py-cpuinfo on a live Arm node)."""
    from nodecheck.checks.node.cpu import read_cpu_model

    return read_cpu_model(sources.fs)
