"""What an expert adds about NCCL's interconnect features, each only where the node shows
the need, with its reason and source:

- NVLink SHARP (NVLS) and the GPU memory it costs: NVSwitches on the PCI bus, or an
  NVLink domain;
- multi-node NVLink (NCCL_MNNVL_ENABLE) and the IMEX channel it needs: an IMEX domain
  (checks/node/nccl_platform.py: a node list of several nodes, or a channel);
- NCCL_TOPO_FILE: a VM whose GPUs sit with no PCIe switch above them (the hypervisor's
  tree, not the host's);
- CollNet (NCCL_COLLNET_ENABLE): InfiniBand rails and the SHARP plugin installed;
- peer-to-peer off between GPUs farther apart than NCCL's default level, on a node with
  no NVSwitch and no NVLink domain.

Sources: NVIDIA/nccl (paths named with each), NCCL's environment documentation, NVIDIA's
IMEX guide (docs.nvidia.com/multi-node-nvlink-systems/imex-guide/), NVIDIA HPC-X's
NCCL-RDMA-SHARP plugins page, and Stas Bekman's "Machine Learning Engineering" open book
(github.com/stas00/ml-engineering), network/README.md, "SHARP", for NVLS's figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import combinations

from nodecheck.checks.node.coherent_gpus import CoherentGpus
from nodecheck.checks.node.inventory import Inventory
from nodecheck.checks.node.nccl_library import NcclLibraries
from nodecheck.checks.node.nccl_platform import (
    CPU_ARM,
    IMEX_CHANNELS,
    IMEX_DEVICE,
    VIRTUAL_TOPOLOGY,
    ImexSetup,
    NcclPlatform,
    SharpClient,
)
from nodecheck.checks.node.pci import PciDevice
from nodecheck.checks.node.topology import Relation
from nodecheck.checks.record import record
from nodecheck.checks.rules.job_versions import VersionEvidence
from nodecheck.tuning.bindings import NicPairing
from nodecheck.tuning.nccl import NCCL_DOCS, JobShape, nccl_versions
from nodecheck.tuning.recommendation import LeftUnset

ML_ENGINEERING_SHARP = (
    'Stas Bekman, "Machine Learning Engineering" open book (github.com/stas00/ml-engineering), '
    'network/README.md, "SHARP"'
)

# --- NVLS --------------------------------------------------------------------------------
# NVIDIA/nccl src/transport/nvls.cc, ncclNvlsBufferSetup: each GPU allocates
# NCCL_NVLS_CHUNKSIZE (128 KiB) x NCCL_STEPS (8, src/include/device.h) x 2 (reduce and
# broadcast) per NVLS channel and per head, the heads being one per GPU of the
# communicator on the node (src/graph/search.cc: at most NCCL_MAX_NVLS_ARITY, 32; with
# multi-node NVLink the clique's GPUs, src/graph/topo.cc fusing their topologies). The
# channels: 16 on Hopper (NVLS_NCHANNELS_SM90); on Blackwell 24 within one NVLink domain
# and 32 across (NVLS_NCHANNELS_SM100_NVL, _SM100, from 2.27). Before 2.22 a channel
# took NCCL_BUFFSIZE (4 MiB, 2.17-2.20) or 8 x 128 KiB (2.21), plus 2 MiB, a direction.
NVLS_MIB_PER_CHANNEL_AND_HEAD = 2  # 128 KiB x 8 steps x 2 directions
NVLS_MAX_HEADS = 32
NVLS_HOPPER_CHANNELS = 16
NVLS_BLACKWELL_CHANNELS = 24
NVLS_SOURCE = (
    f"{ML_ENGINEERING_SHARP}; NVIDIA/nccl src/transport/nvls.cc (ncclNvlsBufferSetup, "
    f"NVLS_NCHANNELS_SM90/SM100), src/graph/search.cc (NVLS heads); {NCCL_DOCS}: "
    "NCCL_NVLS_ENABLE"
)


def nvls_memory_mib(heads: int, channels: int) -> int:
    """The GPU memory NVLS takes on each GPU of one communicator, NCCL 2.22 and later."""
    return NVLS_MIB_PER_CHANNEL_AND_HEAD * channels * min(heads, NVLS_MAX_HEADS)


def _mib(mib: int) -> str:
    return f"{mib / 1024:g} GiB" if mib >= 1024 and mib % 256 == 0 else f"{mib} MiB"


def nvls_left(gpus: int, domain: str) -> LeftUnset:
    """NVLS left to NCCL, with what it is worth and what it costs in GPU memory."""
    heads = NVLS_MAX_HEADS if domain else gpus
    whose = (
        f"each GPU of the communicator in the NVLink domain, at most {NVLS_MAX_HEADS}"
        if domain
        else f"each GPU of the communicator on the node ({gpus} here)"
    )
    hopper = nvls_memory_mib(heads, NVLS_HOPPER_CHANNELS)
    blackwell = nvls_memory_mib(heads, NVLS_BLACKWELL_CHANNELS)
    return LeftUnset(
        ("NCCL_NVLS_ENABLE",),
        "NVLink SHARP (NVLS) reduces in the NVSwitches, and NCCL uses it by default "
        "(2: where the GPUs can) for all_reduce only, once a collective spans enough GPUs "
        "(more than 4 on 8x H200, more than 5 on 8x B200 in the book's sweeps): 482 vs 368 "
        "GB/s busbw on 8x H200 at 16 GiB with NCCL 2.27.7; its cost is GPU memory, for every "
        "communicator that uses it: from NCCL 2.22, 2 MiB (NCCL_NVLS_CHUNKSIZE 128 KiB x 8 "
        f"steps x 2) per NVLS channel (16 on Hopper, 24 on Blackwell in one NVLink domain) "
        f"and per head, one for {whose}: {_mib(hopper)} per GPU on Hopper, {_mib(blackwell)} "
        "on Blackwell (on Hopper 3x that with NCCL 2.21, 6x with 2.17-2.20); a job short of memory "
        "with many communicators can lower NCCL_NVLS_NCHANNELS, or set NCCL_NVLS_ENABLE=0 "
        "and give up the bandwidth",
        NVLS_SOURCE,
    )


# --- multi-node NVLink -------------------------------------------------------------------
# NCCL_MNNVL_ENABLE: from 2.21 (NVIDIA/nccl src/init.cc, NCCL_PARAM(MNNVLEnable,
# "MNNVL_ENABLE", 2)); NCCL joins the ranks whose GPUs completed their fabric registration
# and share a cluster UUID and clique ID (src/mnnvl.cc, ncclMnnvlCheck). From 2.25 it
# first checks that a fabric memory handle can be exported and imported: an export
# failure fails the init ("Check the IMEX configuration"); from 2.27 an allocation failure
# (no IMEX channel) does too, naming /dev/nvidia-caps-imex-channels, where 2.25-2.26
# ignore it and run without multi-node NVLink; 2.21-2.24 enable it without that check.
MNNVL_SINCE = (2, 21)
MNNVL_SOURCE = (
    f"NVIDIA/nccl src/init.cc (MNNVL_ENABLE), src/mnnvl.cc (ncclMnnvlCheck); {NCCL_DOCS}: "
    "NCCL_MNNVL_ENABLE; NVIDIA IMEX guide, IMEX Channels"
)


def mnnvl_left(evidence: str) -> LeftUnset:
    return LeftUnset(
        ("NCCL_MNNVL_ENABLE",),
        f"this node is in a multi-node NVLink domain ({evidence}): NCCL 2.21 and later "
        "join the GPUs of the domain's nodes over NVLink by themselves (the default, 2, "
        "where every rank's GPU has completed its fabric registration and they share a "
        "cluster UUID and clique, as NVML's fabric info and the gpu_fabric check show them); "
        "0 sends the traffic between the nodes over the network instead; "
        "`nvidia-imex-ctl -N` shows whether the domain's IMEX daemons are connected",
        MNNVL_SOURCE,
    )


def imex_channel_warning(imex: ImexSetup) -> str | None:
    """A node of an IMEX domain where this process sees no channel."""
    if imex.channels is None or imex.channels:
        return None
    device = (
        f"the driver registers the device (major {imex.device_major} in /proc/devices)"
        if imex.device_major is not None
        else f"the loaded driver registers no {IMEX_DEVICE} device in /proc/devices"
    )
    return (
        f"warning: no IMEX channel in {IMEX_CHANNELS} ({device}): without one CUDA cannot "
        "export the fabric memory handles multi-node NVLink rests on (the calls fail with "
        'insufficient permission); NCCL 2.27 and later then fail at init ("MNNVL ... is '
        'available but not working on this system. Check the IMEX channel configuration"), '
        "2.25-2.26 run without multi-node NVLink, over the network, and 2.21-2.24 enable it "
        "without checking; create channel0 (the nvidia module parameter "
        f"NVreg_CreateImexChannel0=1, or mknod {IMEX_CHANNELS}/channel0 c <major> 0, again "
        "after every reboot), or have the job's launcher give the job its channel (a "
        f"container needs the device passed in) ({MNNVL_SOURCE})"
    )


def old_nccl_warning(nccl: VersionEvidence, libraries: NcclLibraries | None) -> str | None:
    """The job's NCCL older than 2.21; where the job's is not known, an older one installed
    on the node (which the job may link)."""
    if nccl.known is not None:
        old = "" if nccl.known[:2] >= MNNVL_SINCE else nccl.describe()
    else:
        old = ", ".join(
            library.text
            for library in (libraries.found if libraries else ())
            if library.version[:2] < MNNVL_SINCE
        )
    if not old:
        return None
    return (
        f"warning: {old} is older than 2.21 and knows "
        "no multi-node NVLink: a job using it sends its traffic between this domain's nodes "
        f"over the network ({MNNVL_SOURCE})"
    )


# --- the topology file a VM needs ---------------------------------------------------------
TOPOLOGY_SOURCE = (
    f"NVIDIA/nccl src/graph/topo.cc (ncclTopoGetSystem), src/graph/paths.cc; {NCCL_DOCS}: "
    "NCCL_TOPO_FILE, NCCL_TOPO_DUMP_FILE"
)


def flat_gpus(gpus: Sequence[PciDevice]) -> bool:
    """Whether no GPU has a PCIe switch above it: each on its root bus or under one
    (root) port, as a hypervisor lays out the devices it passes through."""
    return bool(gpus) and all(len(gpu.parents) <= 1 for gpu in gpus)


def topology_file_left(vm: str, gpus: Sequence[PciDevice], default_file: bool | None) -> LeftUnset:
    shown = ", ".join(gpu.bdf for gpu in gpus[:4]) + (", ..." if len(gpus) > 4 else "")
    why = (
        f"a VM ({vm}) whose PCI tree is the hypervisor's, not the host's: GPUs {shown} sit "
        "with no PCIe switch above them, so NCCL's own reading would put every GPU pair and "
        "every NIC at PHB or SYS, peer-to-peer and GPUDirect RDMA off, whatever the host "
        "has; NCCL takes the real topology from an XML file: NCCL_TOPO_FILE, or, when that "
        f"is unset, {VIRTUAL_TOPOLOGY}"
    )
    if default_file:
        why += ", which is here: NCCL reads it by itself"
    elif default_file is None:
        why += ", which could not be looked for (see the problems of the nccl_platform part)"
    else:
        why += (
            ", which is not here: point NCCL_TOPO_FILE at the topology file the provider "
            "publishes for this VM size (on some images /etc/nccl.conf already does); "
            "NCCL_TOPO_DUMP_FILE=<file> writes what NCCL detected, to compare; nodecheck "
            "cannot write one"
        )
    return LeftUnset(("NCCL_TOPO_FILE",), why, TOPOLOGY_SOURCE)


def topology_file_verdict(value: str) -> str:
    return (
        "kept: nodecheck does not read the file; it must describe this VM size "
        "(NCCL_TOPO_DUMP_FILE=<file> shows what NCCL made of it)"
    )


# --- CollNet over SHARP -------------------------------------------------------------------
COLLNET_SOURCE = (
    "NVIDIA/nccl src/init.cc (NCCL_COLLNET_ENABLE, NCCL_COLLNET_NODE_THRESHOLD), "
    "src/plugin/net.cc (libnccl-net.so); NVIDIA HPC-X docs, NCCL-RDMA-SHARP Plugins; "
    "github.com/Mellanox/nccl-rdma-sharp-plugins"
)


def collnet_left(sharp: SharpClient) -> LeftUnset:
    return LeftUnset(
        ("NCCL_COLLNET_ENABLE",),
        "the node has SHARP's client side (NCCL network plugin "
        f"{', '.join(sharp.net_plugins)}; SHARP library {', '.join(sharp.sharp_libraries)}) "
        "and InfiniBand rails: with NCCL_COLLNET_ENABLE=1 the plugin's CollNet lets the "
        "switches reduce all_reduce in the network (from 2 nodes, "
        "NCCL_COLLNET_NODE_THRESHOLD); NCCL leaves it off by default, and whether the fabric "
        "runs SHARP (switches that have it, an Aggregation Manager) no node can see: ask the "
        "fabric's owner, then set 1 and look for CollNet in NCCL_DEBUG=INFO's algorithm "
        "lines; NVIDIA's switches take at most 2 aggregation flows, and each leaf switch must "
        "connect the same HCA rail of every server",
        COLLNET_SOURCE,
    )


COLLNET_VERDICTS = {
    "1": "kept: NCCL tries CollNet, which works only where the fabric runs SHARP",
    "0": "NCCL's default: CollNet off",
}


def collnet_verdict(value: str) -> str:
    return COLLNET_VERDICTS.get(
        value.strip(), "NCCL takes 0 or 1 here, and reads anything else as 0"
    )


MNNVL_VERDICTS = {
    "2": "NCCL's default",
    "1": "kept: with NCCL 2.21-2.24 the init fails where multi-node NVLink cannot be used; "
    "from 2.25, 1 has NCCL look for it even in a communicator within one node",
    "0": "warning: 0 sends the traffic between this NVLink domain's nodes over the network "
    "instead of NVLink",
}


def mnnvl_verdict(value: str) -> str:
    return MNNVL_VERDICTS.get(value.strip(), "none of NCCL's values (0, 1, 2)")


# --- peer-to-peer between far GPUs ---------------------------------------------------------
# NVIDIA/nccl src/graph/paths.cc, ncclTopoCheckP2p: from 2.23 NCCL uses peer-to-peer up to
# PATH_PXB (PCIe switches, no host bridge), or PATH_SYS on AMD x86 CPUs with 2 GPUs or
# fewer; before 2.23 up to PATH_SYS except on Arm, Intel and Zhaoxin CPUs (PATH_PXB).
# nvidia-smi's PHB and NODE are both NCCL's PATH_PHB (through a CPU's host bridge), SYS its
# PATH_SYS. A pair it keeps off peer-to-peer goes through NCCL's SHM transport, a buffer in
# host memory (src/transport/shm.cc).
P2P_LEVEL_CHANGED = (2, 23)
INTEL, AMD = "GenuineIntel", "AuthenticAMD"
ZHAOXIN = ("CentaurHauls", "Shanghai")
P2P_SOURCE = (
    "NVIDIA/nccl src/graph/paths.cc (ncclTopoCheckP2p), src/transport/shm.cc; "
    f"{NCCL_DOCS}: NCCL_P2P_LEVEL"
)


def default_p2p_level(version: tuple[int, int] | None, vendor: str | None, gpus: int) -> Relation:
    """The farthest relation NCCL uses peer-to-peer over, by default. `version` None: from
    2.23; `vendor` None: not read (taken as neither Intel nor AMD)."""
    if version is None or version >= P2P_LEVEL_CHANGED:
        return Relation.SYS if vendor == AMD and gpus <= 2 else Relation.PXB
    if vendor in (INTEL, CPU_ARM, *ZHAOXIN):
        return Relation.PXB
    return Relation.SYS


def _this_cpu(vendor: str | None) -> str:
    """ "this Intel CPU", "this CPU (vendor HygonGenuine)", "this CPU (vendor not read)"."""
    names = {INTEL: "Intel", AMD: "AMD", CPU_ARM: "Arm", **dict.fromkeys(ZHAOXIN, "Zhaoxin")}
    if vendor in names:
        return f"this {names[vendor]} CPU"
    return f"this CPU (vendor {vendor or 'not read'})"


def far_pairs(
    inventory: Inventory, gpus: Sequence[PciDevice], level: Relation
) -> list[tuple[str, str, Relation]]:
    return [
        (a.bdf, b.bdf, relation)
        for a, b in combinations(gpus, 2)
        if (relation := inventory.relation(a, b)) > level
    ]


P2P_RULE = (
    "NCCL 2.23 and later use CUDA peer-to-peer between two GPUs up to PXB (through PCIe "
    "switches, never a CPU's host bridge), up to SYS on AMD CPUs with 2 GPUs or fewer; "
    "before 2.23 up to SYS, but PXB on Intel, Zhaoxin and Arm CPUs"
)


def peer_to_peer_note(
    inventory: Inventory,
    gpus: Sequence[PciDevice],
    vendor: str | None,
    nccl: VersionEvidence,
) -> str | None:
    """Where NCCL keeps GPU pairs off peer-to-peer by default, on a node whose GPUs no
    NVSwitch joins: which pairs, why, and what it costs. The rule is the job's NCCL's
    (either where none was found)."""
    versions = nccl_versions(nccl)
    newer = {version >= P2P_LEVEL_CHANGED for version in versions} or {True, False}
    levels = {new: default_p2p_level(None if new else (2, 22), vendor, len(gpus)) for new in newer}
    pairs = far_pairs(inventory, gpus, min(levels.values()))
    if not pairs:
        return None
    listed = [f"{a} and {b} ({relation.name})" for a, b, relation in pairs[:4]]
    if len(pairs) > 4:
        listed.append(f"{len(pairs) - 4} more pair(s)")
    if len(set(levels.values())) == 1:
        level = next(iter(levels.values())).name
    else:
        level = f"{levels[True].name} from NCCL 2.23, {levels[False].name} before"
    installed = nccl.account()
    return (
        f"peer-to-peer: GPUs {'; '.join(listed)} are farther apart than NCCL's default "
        f"reach, and no NVSwitch or NVLink domain joins them here: {P2P_RULE}; on "
        f"{_this_cpu(vendor)} with {len(gpus)} GPUs that is {level} ({installed}), so "
        "NCCL copies between them through a buffer in host memory (its SHM transport), at "
        "host-memory and CPU-link speed, unless an NVLink bridge joins them (`nvidia-smi "
        "topo -m` shows NV#, which sysfs cannot); keep a job's GPUs under one PCIe switch "
        "where it can, and raise NCCL_P2P_LEVEL (PHB, SYS) only where peer-to-peer through "
        f"the CPU is known to work on this platform, measured ({P2P_SOURCE})"
    )


# --- all of it ----------------------------------------------------------------------------


@record
class InterconnectAdvice:
    left_unset: list[LeftUnset]
    notes: list[str]


def interconnect_advice(
    inventory: Inventory,
    gpus: Sequence[PciDevice],
    pairings: Sequence[NicPairing],
    platform: NcclPlatform | None,
    vm: str | None,
    coherent: CoherentGpus,
    nccl: VersionEvidence,
    libraries: NcclLibraries | None,
    environ: Mapping[str, str],
    shape: JobShape,
) -> InterconnectAdvice:
    """`gpus`: the GPUs meant for this host; `platform` None: the part could not be read
    (the advice resting on it is left out, and make_plan says so); `vm`: why the node
    looks like a VM, None on bare metal or when unknown; `nccl`: the job's NCCL, whose
    release decides the defaults; `libraries`: those installed on the node, warned of only
    where the job's is not known."""
    left: list[LeftUnset] = []
    notes: list[str] = []
    domain = platform.imex.domain_evidence if platform is not None else ""
    if inventory.nvswitches or domain:
        left.append(nvls_left(len(gpus), domain))
    if platform is not None and domain:
        left.append(mnnvl_left(domain))
        notes += [
            w for w in (imex_channel_warning(platform.imex), old_nccl_warning(nccl, libraries)) if w
        ]
    rdma_active = any(r.active for r in inventory.rdma)
    flat_vm = vm is not None and flat_gpus(gpus) and (len(gpus) >= 2 or rdma_active)
    if vm is not None and flat_vm:
        left.append(
            topology_file_left(vm, gpus, None if platform is None else platform.virtual_topology)
        )
    rails = {name for pairing in pairings for name in pairing.nics}
    infiniband_rails = any(
        rdma.name in rails
        and any(p.link_layer == "InfiniBand" and p.state == "ACTIVE" for p in rdma.ports)
        for rdma in inventory.rdma
    )
    sharp = platform.sharp if platform is not None else None
    if (
        sharp is not None
        and sharp.net_plugins
        and sharp.sharp_libraries
        and infiniband_rails
        and shape.nodes != 1
    ):
        left.append(collnet_left(sharp))
    pcie_gpus = [gpu for gpu in gpus if gpu.bdf not in coherent.by_bus_id]
    if (
        len(pcie_gpus) >= 2
        and not inventory.nvswitches
        and not domain
        and not flat_vm
        and not {"NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE"} & set(environ)
    ):
        vendor = platform.cpu_vendor if platform is not None else None
        note = peer_to_peer_note(inventory, pcie_gpus, vendor, nccl)
        if note:
            notes.append(note)
    return InterconnectAdvice(left, notes)


# What nodecheck says of a value set now for a variable this module leaves unset.
VERDICTS: Mapping[str, Callable[[str], str]] = {
    "NCCL_TOPO_FILE": topology_file_verdict,
    "NCCL_COLLNET_ENABLE": collnet_verdict,
    "NCCL_MNNVL_ENABLE": mnnvl_verdict,
}
