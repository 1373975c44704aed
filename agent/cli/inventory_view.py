"""How `nodecheck inventory` shows the node: tables, and a matrix like `nvidia-smi topo -m`.

It renders facts (the node's, or a capture's with `--facts`): the inventory, the CPU
model and NVML's snapshot, never a read of its own.
"""

from __future__ import annotations

import json

from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.checks.node.facts import FactsSource, PartUnavailableError
from nodecheck.checks.node.gpu import GpuReading, GpuSnapshot, NvmlFailure
from nodecheck.checks.node.inventory import Inventory, Nic
from nodecheck.checks.node.numa import NumaNode, memory_nodes_served, served_cpus
from nodecheck.checks.node.pci import PciDevice, PcieLink
from nodecheck.checks.printable import printable, text_table
from nodecheck.checks.record import record

INVENTORY_SCHEMA = "nodecheck.inventory/v1"

# The legend nvidia-smi topo -m prints, less NV# (sysfs cannot see NVLink).
LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge"""  # noqa: E501


@record
class InventoryFacts:
    """The parts the view shows."""

    inventory: Inventory
    cpu_model: str
    gpus: GpuSnapshot


def inventory_facts(facts: FactsSource) -> InventoryFacts:
    """The view's parts of `facts`. Without the inventory there is nothing to show
    (PartUnavailableError); a CPU model or NVML snapshot that could not be read (or a
    capture without one) is shown as such."""
    inventory: Inventory = facts.get("inventory")
    try:
        cpu_model: str = facts.get("cpu_model")
    except PartUnavailableError:
        cpu_model = "unknown"
    try:
        gpus: GpuSnapshot = facts.get("gpus")
    except PartUnavailableError as err:
        gpus = GpuSnapshot(unavailable=NvmlFailure("unread", f"not read: {err.unread.reason}"))
    return InventoryFacts(inventory, cpu_model, gpus)


def _link_text(link: PcieLink | None) -> str:
    if link is None:
        return "-"

    def one(width: int | None, speed: float | None) -> str:
        shown_width = f"x{width}" if width else "down"
        shown_speed = f"{speed:g} GT/s" if speed is not None else "?"
        return f"{shown_width} {shown_speed}"

    return (
        f"{one(link.current_width, link.current_speed)} (max {one(link.max_width, link.max_speed)})"
    )


def _numa_text(inventory: Inventory, device: PciDevice) -> str:
    node = inventory.numa_node_of(device)
    return "?" if node is None else str(node)


def _cpus_text(device: PciDevice) -> str:
    return format_cpulist(device.local_cpus) if device.local_cpus else "?"


def _nic_kind(nic: Nic) -> str:
    if nic.link_layer:
        return nic.link_layer if nic.link_layer != "Ethernet" else "RoCE"
    return "Ethernet"


def topology_matrix(inventory: Inventory) -> tuple[list[str], list[list[str]]]:
    """Names (GPU0.., NIC0..) and the relation of every pair, GPUs first as nvidia-smi does."""
    devices = [gpu for gpu in inventory.gpus] + [nic.pci for nic in inventory.nics]
    names = [f"GPU{i}" for i in range(len(inventory.gpus))]
    names += [f"NIC{i}" for i in range(len(inventory.nics))]
    matrix = [[inventory.relation(a, b).label for b in devices] for a in devices]
    return names, matrix


def _nvml_status(snapshot: GpuSnapshot) -> str:
    if snapshot.hung is not None:
        return str(snapshot.hung)
    if snapshot.unavailable is not None:
        return snapshot.unavailable.message
    cuda = snapshot.cuda_driver_version
    shown_cuda = f", CUDA {cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
    return f"driver {snapshot.driver_version}{shown_cuda}"


def _nvlink_text(reading: GpuReading) -> str:
    if reading.nvlink_active is None:
        return "none"
    return f"{sum(reading.nvlink_active)}/{len(reading.nvlink_active)} active"


def _nvml_cells(reading: GpuReading | None) -> list[str]:
    """index, model, UUID, memory and NVLink as NVML reports them."""
    if reading is None:
        return ["-", "not seen by NVML", "-", "-", "-"]
    if not reading.readable:
        return [str(reading.index), reading.lost or reading.hung or "?", "-", "-", "-"]
    memory = f"{reading.memory_total / 2**30:.0f} GiB" if reading.memory_total else "?"
    return [
        str(reading.index),
        reading.model,
        reading.uuid or "?",
        memory,
        _nvlink_text(reading),
    ]


def reading_notes(inventory: Inventory) -> list[str]:
    """What the reading inferred where sysfs was incomplete or contradicted itself: the
    CPUs', the NUMA reading's as a whole, then each node's ("node N: ..."), each once."""
    whole = [*inventory.cpu.notes, *inventory.numa_notes]
    per_node = [
        f"node {node.number}: {note}"
        for node in inventory.numa_nodes
        for note in node.notes
        if note not in inventory.numa_notes  # an offline node's note is the reading's too
    ]
    return list(dict.fromkeys(whole + per_node))


def memory_relation(nodes: list[NumaNode], node: NumaNode) -> str:
    """What a memory-only node serves (the CPUs of its initiators) or where a CPU-only
    node's memory is (the memory nodes naming it an initiator); "" for a node with both."""
    if node.memory_only:
        if node.initiators is None:
            return "CPUs it serves: could not determine (no accessN/initiators)"
        cpus = served_cpus(nodes, node) or frozenset()
        initiators = ",".join(str(n) for n in sorted(node.initiators)) or "none"
        return (
            f"serves CPUs {format_cpulist(cpus) or 'none'} "
            f"(initiators: node {initiators}, access{node.access_class})"
        )
    if node.cpu_only:
        memory = [n.number for n in memory_nodes_served(nodes, node.number)]
        if not memory:
            return "no memory; its memory nodes: could not determine"
        return f"no memory; its memory: node {','.join(str(n) for n in memory)}"
    return ""


def render_inventory(facts: InventoryFacts) -> str:
    inventory, cpu_model, gpus = facts.inventory, facts.cpu_model, facts.gpus
    cpu = inventory.cpu
    smt = "on" if cpu.threads_per_core > 1 else "off"
    lines = [
        f"Node {inventory.hostname}: {cpu_model}, {len(cpu.packages)} socket(s), "
        f"{len(cpu.cores)} cores, {len(cpu.cpus)} CPUs (SMT {smt})",
        *(f"  note: {note}" for note in reading_notes(inventory)),
        "",
        "NUMA nodes",
    ]
    nodes = inventory.numa_nodes
    # Memory-only and CPU-only nodes (HBM, CXL beside CPUs without memory) say what they
    # serve; a column only where the node has one.
    relations = [memory_relation(nodes, node) for node in nodes]
    rows = [
        [
            str(node.number),
            format_cpulist(node.cpus) or "-",
            _memory_text(node.memory_bytes),
        ]
        for node in nodes
    ] or [["-", "-", "-"]]
    if any(relations):
        lines += text_table(
            ["node", "CPUs", "memory", "locality"],
            [[*row, relation or "-"] for row, relation in zip(rows, relations, strict=True)],
        )
    else:
        lines += text_table(["node", "CPUs", "memory"], rows)
    lines += ["", f"GPUs (NVML: {_nvml_status(gpus)})"]
    readings = gpus.by_bus_id()
    if inventory.gpus:
        lines += text_table(
            [
                "index",
                "bus id",
                "NUMA",
                "CPUs",
                "PCIe link",
                "NVML",
                "model",
                "UUID",
                "memory",
                "NVLink",
            ],
            [
                [
                    str(i),
                    gpu.bdf,
                    _numa_text(inventory, gpu),
                    _cpus_text(gpu),
                    _link_text(gpu.link),
                    *(_nvml_cells(readings.get(gpu.bdf)) if gpus.usable else ["-"] * 5),
                ]
                for i, gpu in enumerate(inventory.gpus)
            ],
        )
    else:
        lines.append("  none on the PCI bus")
    lines += [
        f"  NVML also sees GPU {reading.index} at {reading.bus_id}, which is not on the PCI "
        "bus read from sysfs"
        for reading in _nvml_only(inventory, gpus)
    ]
    lines += ["", "NICs"]
    if inventory.nics:
        lines += text_table(
            ["name", "bus id", "kind", "rate", "state", "NUMA", "interfaces"],
            [
                [
                    nic.name,
                    nic.pci.bdf,
                    _nic_kind(nic),
                    f"{nic.rate_gbps:g} Gb/s" if nic.rate_gbps else "?",
                    nic.state,
                    _numa_text(inventory, nic.pci),
                    ",".join(i.name for i in nic.interfaces) or "-",
                ]
                for nic in inventory.nics
            ],
        )
    else:
        lines.append("  none on the PCI bus")
    names, matrix = topology_matrix(inventory)
    if names:
        lines += ["", "Topology (PCIe paths from sysfs; NVLink is not visible there)"]
        devices = [*inventory.gpus, *(nic.pci for nic in inventory.nics)]
        rows = [
            [name, *cells, _cpus_text(device), _numa_text(inventory, device)]
            for name, cells, device in zip(names, matrix, devices, strict=False)
        ]
        lines += text_table(["", *names, "CPU Affinity", "NUMA Affinity"], rows)
        if inventory.nics:
            lines += ["", "NIC Legend:", ""]
            lines += [f"  NIC{i}: {nic.name}" for i, nic in enumerate(inventory.nics)]
        lines += ["", *LEGEND.splitlines()]
    # Every line escaped where it is shown (checks/printable.py): a hostname, a CPU model,
    # a GPU's name, a NIC's or an interface's name, a note, from the node or a capture.
    return "\n".join(printable(line) for line in lines)


def _nvml_only(inventory: Inventory, gpus: GpuSnapshot) -> list[GpuReading]:
    """GPUs NVML answers for that sysfs does not show (a capture of another node)."""
    on_bus = {gpu.bdf for gpu in inventory.gpus}
    return [g for g in gpus.gpus if g.bus_id is not None and g.bus_id not in on_bus]


def _nvml_dict(reading: GpuReading | None) -> dict[str, object] | None:
    if reading is None:
        return None
    return {
        "index": reading.index,
        "name": reading.name,
        "uuid": reading.uuid,
        "vbios": reading.vbios,
        "memory_total_bytes": reading.memory_total,
        "nvlink": None
        if reading.nvlink_active is None
        else {"links": len(reading.nvlink_active), "active": sum(reading.nvlink_active)},
        "lost": reading.lost,
        "hung": reading.hung,
        # Queries this GPU or driver does not have (no ECC on a GeForce, an older driver).
        "unsupported": sorted(reading.unsupported),
    }


def inventory_document(facts: InventoryFacts) -> dict[str, object]:
    inventory, cpu_model, gpus = facts.inventory, facts.cpu_model, facts.gpus
    names, matrix = topology_matrix(inventory)
    cpu = inventory.cpu
    readings = gpus.by_bus_id()
    return {
        "schema": INVENTORY_SCHEMA,
        "hostname": inventory.hostname,
        "nvml": {
            "available": gpus.usable,
            "error": None if gpus.usable else _nvml_status(gpus),
            "driver_version": gpus.driver_version,
            "cuda_driver_version": gpus.cuda_driver_version,
        },
        "cpu": {
            "model": cpu_model,
            "sockets": len(cpu.packages),
            "cores": len(cpu.cores),
            "cpus": len(cpu.cpus),
            "threads_per_core": cpu.threads_per_core,
            "smt_control": cpu.smt_control,
            "notes": list(cpu.notes),
        },
        # What the NUMA reading inferred for the node as a whole (an offline node, no
        # devices/system/node); each node's own notes are under it.
        "numa_notes": list(inventory.numa_notes),
        "numa_nodes": [
            {
                "node": n.number,
                "cpus": format_cpulist(n.cpus),
                "memory_bytes": n.memory_bytes,
                # The initiators of its memory (None: not named by the kernel) and the
                # CPUs it serves: its own and theirs.
                "initiators": None if n.initiators is None else format_cpulist(n.initiators),
                "serves_cpus": format_cpulist(served_cpus(inventory.numa_nodes, n) or ()),
                "notes": list(n.notes),
            }
            for n in inventory.numa_nodes
        ],
        "gpus": [
            {
                "index": i,
                "bus_id": gpu.bdf,
                "numa_node": inventory.numa_node_of(gpu),
                "cpus": format_cpulist(gpu.local_cpus) if gpu.local_cpus else None,
                "link": _link_dict(gpu.link),
                "problems": list(gpu.problems.values()),
                "nvml": _nvml_dict(readings.get(gpu.bdf)),
            }
            for i, gpu in enumerate(inventory.gpus)
        ],
        "nics": [
            {
                "name": nic.name,
                "bus_id": nic.pci.bdf,
                "rdma": [r.name for r in nic.rdma],
                "interfaces": [i.name for i in nic.interfaces],
                "link_layer": nic.link_layer,
                "rate_gbps": nic.rate_gbps,
                "state": nic.state,
                "numa_node": inventory.numa_node_of(nic.pci),
                "link": _link_dict(nic.pci.link),
            }
            for nic in inventory.nics
        ],
        "gpus_only_in_nvml": [
            {"bus_id": g.bus_id, **(_nvml_dict(g) or {})} for g in _nvml_only(inventory, gpus)
        ],
        "topology": {"devices": names, "matrix": matrix},
    }


def _link_dict(link: PcieLink | None) -> dict[str, object] | None:
    if link is None:
        return None
    return {
        "current_speed_gts": link.current_speed,
        "current_width": link.current_width,
        "max_speed_gts": link.max_speed,
        "max_width": link.max_width,
    }


def render_inventory_json(facts: InventoryFacts) -> str:
    return json.dumps(inventory_document(facts), indent=2)


def _memory_text(memory_bytes: int | None) -> str:
    if memory_bytes is None:
        return "-"
    if memory_bytes == 0:
        return "none"
    gib = memory_bytes / 2**30
    return f"{gib:.0f} GiB" if gib >= 1 else f"{memory_bytes // 2**20} MiB"
