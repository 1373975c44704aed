"""NUMA topology: where the GPUs sit, nodes without CPUs or memory, automatic NUMA balancing.

A GPU whose `numa_node` reads -1 on a machine with several NUMA nodes with CPUs
has no firmware locality (ACPI _PXM missing): nothing can bind its process to the
right socket, and NCCL cannot tell which NIC is near it (sysfs-bus-pci, numa_node).
Nodes with neither CPU nor memory are normal where firmware declares memory that is
not onlined (Grace's GPU memory partitions): one OK line names them.
Automatic NUMA balancing unmaps pages to sample accesses and migrates them;
a training process that is already bound to its node pays the page faults for
nothing (Documentation/admin-guide/sysctl/kernel.rst, numa_balancing).
"""

from __future__ import annotations

from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.checks.node.numa import NumaBalancing, NumaNode
from nodecheck.checks.registry import register
from nodecheck.checks.result import (
    NODE,
    Action,
    FaultClass,
    MetricSpec,
    Result,
    Sample,
    Status,
    gpu_subject,
)

GPU_NUMA_NODE = MetricSpec(
    "nodecheck_gpu_numa_node",
    "gauge",
    "NUMA node of each GPU, -1 when unknown (<sysfs>/bus/pci/devices/<bdf>/numa_node)",
    ("bus_id",),
)
NUMA_BALANCING = MetricSpec(
    "nodecheck_numa_balancing_enabled",
    "gauge",
    "1 when automatic NUMA balancing is on (<procfs>/sys/kernel/numa_balancing)",
)


@register(
    "numa",
    fault_class=FaultClass.NODE_CONFIG,
    action=Action.FIX_NODE_CONFIG,
    interval_s=3600,
    timeout_s=10,
    needs=("inventory", "numa_balancing"),
)
def check_numa(ctx: CheckContext) -> Iterator[Result]:
    """NUMA locality of the GPUs, empty NUMA nodes and automatic NUMA balancing."""
    inventory = ctx.inventory
    nodes = inventory.numa_nodes
    if "numa" in inventory.problems:
        yield Result(
            Status.ERROR, NODE, f"cannot list the NUMA nodes: {inventory.problems['numa']}"
        )
    elif not nodes:
        yield Result(Status.SKIP, NODE, "the kernel reports no NUMA nodes (built without NUMA)")
    empty: list[int] = []
    for node in nodes:
        subject = f"numa {node.number}"
        if not node.listed:
            yield _linked_without_directory(node)
        elif node.problem:
            yield Result(
                Status.ERROR, subject, f"cannot read NUMA node {node.number}: {node.problem}"
            )
        elif node.cpus and not node.memory_bytes:
            yield Result(
                Status.WARN,
                subject,
                f"NUMA node {node.number} has CPUs {format_cpulist(node.cpus)} but no memory: "
                "every allocation of a process there is remote",
                "check the DIMM population of that socket",
            )
        elif not node.cpus and not node.memory_bytes:
            empty.append(node.number)
        elif not node.cpus:
            yield Result(
                Status.OK,
                subject,
                f"NUMA node {node.number} is memory only ({(node.memory_bytes or 0) / 2**30:.0f} "
                "GiB: CXL, HBM or coherent GPU memory)",
            )

    if empty:
        # Nodes the firmware declares for memory that is not onlined (yet): Grace (GH200,
        # GB200) declares one per GPU memory partition (MIG slot), CXL hosts one per
        # window; hwloc hides them too (open-mpi/hwloc#431).
        yield Result(
            Status.OK,
            NODE,
            f"{len(empty)} empty NUMA node(s) ({format_cpulist(empty)}): no CPU and no memory, "
            "as for memory not onlined yet (Grace GPU memory partitions, CXL windows)",
            details={"empty_nodes": empty},
        )
    if inventory.cpus_without_node:
        cpus = format_cpulist(inventory.cpus_without_node)
        yield Result(
            Status.WARN,
            NODE,
            f"online CPUs {cpus} are in no NUMA node: no node's cpulist names them and they "
            "have no cpuN/nodeM link, so no memory binding fits them",
            "check the firmware's ACPI SRAT (BIOS update) and the kernel log for NUMA "
            "errors; bind processes there by CPU list only",
            {"cpus": cpus},
        )
    notes = list(inventory.numa_notes) + [
        f"node {node.number}: {note}" for node in nodes if node.listed for note in node.notes
    ]
    if notes:
        yield Result(
            Status.OK,
            NODE,
            "NUMA topology as read, with what was inferred: " + "; ".join(notes),
            details={"notes": notes},
        )
    with_cpus = {node.number for node in nodes if node.cpus}
    # Several nodes with CPUs: a process's socket matters. A machine without node
    # directories has one node (and a VM with one core per socket may have one too).
    multi_node = len(with_cpus) > 1
    spread: dict[str, list[str]] = {}
    for gpu in inventory.gpus:
        subject = gpu_subject(gpu.bdf)
        if "numa_node" in gpu.problems:
            yield Result(
                Status.ERROR, subject, f"cannot read NUMA node: {gpu.problems['numa_node']}"
            )
            continue
        if "local_cpulist" in gpu.problems:
            yield Result(
                Status.ERROR,
                subject,
                f"cannot read its local CPUs: {gpu.problems['local_cpulist']}",
            )
        gpu_node = inventory.numa_node_of(gpu)
        sample = Sample(GPU_NUMA_NODE, -1 if gpu_node is None else gpu_node, {"bus_id": gpu.bdf})
        spread.setdefault("unknown" if gpu_node is None else str(gpu_node), []).append(gpu.bdf)
        if gpu_node is None and multi_node:
            neighbours = inventory.host_bridge_numa_nodes(gpu)
            attr = f"/sys/bus/pci/devices/{gpu.bdf}/numa_node"
            if len(neighbours) == 1:
                guess = neighbours.pop()
                remedy = (
                    f"fix the firmware's ACPI _PXM (BIOS update); meanwhile devices on the same "
                    f"host bridge report node {guess}: echo {guess} | sudo tee {attr} "
                    "(taints the kernel)"
                )
            else:
                remedy = f"fix the firmware's ACPI _PXM (BIOS update), or write the node to {attr}"
            yield Result(
                Status.WARN,
                subject,
                "NUMA node unknown (-1) on a machine with several NUMA nodes: processes for "
                "this GPU cannot be bound to its node",
                remedy,
                {"numa_node": gpu.numa_node},
                (sample,),
            )
        elif gpu_node is not None and nodes and gpu_node not in with_cpus:
            listed = {node.number for node in nodes if node.listed}
            where = "has no online CPU" if gpu_node in listed else "is not online"
            yield Result(
                Status.WARN,
                subject,
                f"on NUMA node {gpu_node}, which {where}: processes for this GPU run on "
                "another node's CPUs, every transfer crosses the socket link",
                "check that the socket's CPUs are online (/sys/devices/system/cpu/online) "
                "and the BIOS NUMA settings; meanwhile bind to the nearest node with CPUs",
                {"numa_node": gpu_node, "nodes_with_cpus": sorted(with_cpus)},
                (sample,),
            )
        else:
            yield Result(
                Status.OK,
                subject,
                f"on NUMA node {gpu_node}"
                + (f", CPUs {format_cpulist(gpu.local_cpus)}" if gpu.local_cpus else ""),
                details={"numa_node": gpu_node},
                samples=(sample,),
            )
    balancing: NumaBalancing = ctx.part("numa_balancing")
    # A kernel built without CONFIG_NUMA_BALANCING has no such sysctl (kernel/sched/
    # fair.c registers it with the feature): nothing to turn off, said with the verdict.
    not_built = (
        "; no <procfs>/sys/kernel/numa_balancing: the kernel has no automatic NUMA "
        "balancing (CONFIG_NUMA_BALANCING)"
        if balancing.absent
        else ""
    )
    if spread:
        shown = ", ".join(f"node {key}: {len(value)}" for key, value in sorted(spread.items()))
        yield Result(
            Status.OK,
            NODE,
            f"{len(inventory.gpus)} GPUs by NUMA node: {shown}{not_built}",
            details={"gpus": spread},
        )
    elif nodes:
        # A healthy node without GPUs still gets its verdict: nothing said is no pass.
        yield Result(
            Status.OK, NODE, f"{len(nodes)} NUMA node(s); no GPU on the PCI bus{not_built}"
        )
    elif not_built:
        yield Result(Status.SKIP, NODE, not_built.removeprefix("; "))
    if balancing.problem is not None:
        yield Result(Status.ERROR, NODE, balancing.problem)
        return
    mode = balancing.mode
    if mode is None:
        return
    sample = Sample(NUMA_BALANCING, 1 if mode else 0)
    if mode and multi_node:
        yield Result(
            Status.WARN,
            NODE,
            f"automatic NUMA balancing is on (kernel.numa_balancing={mode}): it unmaps and "
            "migrates pages of processes that are already bound to their node",
            "sudo sysctl -w kernel.numa_balancing=0, and persist it in /etc/sysctl.d/",
            {"numa_balancing": mode},
            (sample,),
        )
    else:
        state = "on" if mode else "off"
        yield Result(
            Status.OK,
            NODE,
            f"automatic NUMA balancing is {state}",
            details={"numa_balancing": mode},
            samples=(sample,),
        )


def _linked_without_directory(node: NumaNode) -> Result:
    """CPUs whose cpuN/nodeM link names a node without a directory: the kernel links CPUs
    only under registered nodes (drivers/base/node.c, register_cpu_under_node), so sysfs
    contradicts itself; has_memory and has_cpu say what the kernel still knows of it."""
    states = []
    if node.has_memory is not None:
        states.append(f"has_memory {'names' if node.has_memory else 'does not name'} it")
    if node.has_cpu is not None:
        states.append(f"has_cpu {'names' if node.has_cpu else 'does not name'} it")
    known = "; ".join(states) or "no has_memory/has_cpu file says more"
    return Result(
        Status.WARN,
        f"numa {node.number}",
        f"CPUs {format_cpulist(node.cpus)} link to NUMA node {node.number}, which has no "
        f"devices/system/node/node{node.number} directory: sysfs contradicts itself "
        f"({known}); a memory binding to node {node.number} may be refused",
        "bind processes on those CPUs by CPU list only; check the kernel log for NUMA "
        "errors at boot and update the firmware (ACPI SRAT)",
        {
            "notes": list(node.notes),
            "has_memory": node.has_memory,
            "has_cpu": node.has_cpu,
        },
    )
