"""Judging NCCL, CUDA and torch.distributed variables: pure functions of a Setting and facts.

Rules follow NCCL's environment documentation (2.30, env.rst) and source, collected in
docs/hardware.md §5: the "Debugging" variables "should not be used in production nor
retained in scripts"; level names are compared case-sensitively (src/graph/paths.cc
ncclGetLevel), so "phb" is silently ignored; an NCCL_IB_HCA entry without "=" is a
prefix ("mlx5_1" also selects mlx5_10..mlx5_19). The facts are the inventory's (GPUs,
NVSwitches, RDMA devices and ports, interfaces: NcclFacts), the RoCE ports' GID tables
and the NCCL libraries found; the nccl_env check and `tune` both judge with these.
"""

from __future__ import annotations

from collections.abc import Callable

from nodecheck.checks.node.facts import Unread
from nodecheck.checks.node.inventory import Inventory
from nodecheck.checks.node.nccl_library import NcclLibraries
from nodecheck.checks.node.net import PortGidTypes
from nodecheck.checks.node.variables import Setting, Variables, parse_count
from nodecheck.checks.record import record
from nodecheck.checks.result import NODE, Result, Status
from nodecheck.checks.settings_audit import SettingJudgement

GID_INDEX = "NCCL_IB_GID_INDEX"

LEVELS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")

# Variables NCCL removed; setting them does nothing (NCCL release notes).
REMOVED = {
    "NCCL_LL_THRESHOLD": "2.5",
    "NCCL_TREE_THRESHOLD": "2.5",
    "NCCL_SINGLE_RING_THRESHOLD": "2.5",
    "NCCL_IB_CUDA_SUPPORT": "2.4",
    "NCCL_CHECKS_DISABLE": "2.2.12",
    "NCCL_MIN_NRINGS": "2.5",
    "NCCL_MAX_NRINGS": "2.5",
}
# torch.distributed renamed these (pytorch PR #114077, torch 2.2; flight recorder in 2.9).
RENAMED = {
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
    "NCCL_IB_GDR_LEVEL": "NCCL_NET_GDR_LEVEL",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "TORCH_FR_DUMP_TEMP_FILE",
}
# "Debugging" variables that cap or force what NCCL tunes per platform.
FORCING = {
    "NCCL_ALGO": "forces the collective algorithm NCCL would choose per size and topology",
    "NCCL_MAX_CTAS": "caps the channels (and so the bandwidth) NCCL may use",
    "NCCL_MIN_CTAS": "forces a channel count NCCL would choose itself",
    "NCCL_MAX_NCHANNELS": "caps the channels (and so the bandwidth) NCCL may use",
    "NCCL_MIN_NCHANNELS": "forces a channel count NCCL would choose itself",
    "NCCL_NTHREADS": "forces the threads per block NCCL chooses per GPU",
    "NCCL_BUFFSIZE": "changes the buffer size NCCL tunes (and its memory use)",
    "NCCL_PXN_DISABLE": "turns off rail-local aggregation through NVLink (PXN)",
    "NCCL_NVB_DISABLE": "turns off NVLink paths through an intermediate GPU",
}


@record
class NcclFacts:
    """What the NCCL rules need to know about the node, from its inventory."""

    gpu_count: int
    nvswitch: bool
    rdma_active: tuple[str, ...]
    rdma_all: tuple[str, ...]
    rdma_ports: dict[str, dict[int, str | None]]
    interfaces: dict[str, str | None]  # name -> operstate
    # The RoCE ports (link layer Ethernet), as (device, port): where a GID index matters.
    roce_ports: tuple[tuple[str, int], ...] = ()


def nccl_facts(inventory: Inventory) -> NcclFacts:
    return NcclFacts(
        gpu_count=len(inventory.gpus),
        nvswitch=bool(inventory.nvswitches),
        rdma_active=tuple(r.name for r in inventory.rdma if r.active),
        rdma_all=tuple(r.name for r in inventory.rdma),
        rdma_ports={r.name: {p.number: p.state for p in r.ports} for r in inventory.rdma},
        interfaces={i.name: i.operstate for i in inventory.interfaces},
        roce_ports=tuple(
            (r.name, p.number)
            for r in inventory.rdma
            for p in r.ports
            if p.link_layer == "Ethernet"
        ),
    )


def _truthy(value: str) -> bool:
    """NCCL reads its integer parameters with strtoll: "1", "2"... are on."""
    try:
        return int(value.strip(), 0) != 0
    except ValueError:
        return False


def parse_selector(value: str) -> tuple[bool, bool, list[tuple[str, int | None]]]:
    """NCCL's interface/HCA list syntax: (exclude, exact, [(name, port)]).

    "^" excludes, "=" asks for exact names, entries are comma separated and an
    HCA entry may carry ":port" (src/misc/utils.cc parseStringList).
    """
    text = value.strip()
    exclude = text.startswith("^")
    text = text.removeprefix("^")
    exact = text.startswith("=")
    text = text.removeprefix("=")
    entries: list[tuple[str, int | None]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, port = item.partition(":")
        entries.append((name, parse_count(port) if port else None))
    return exclude, exact, entries


def _matches(name: str, pattern: str, exact: bool) -> bool:
    return name == pattern if exact else name.startswith(pattern)


def selected_names(value: str, names: list[str]) -> list[str]:
    """The names (interfaces, HCAs) an NCCL list such as "ibp", "=eth0" or "^docker" selects."""
    exclude, exact, entries = parse_selector(value)
    patterns = [pattern for pattern, _ in entries]
    return [name for name in names if any(_matches(name, p, exact) for p in patterns) != exclude]


def rule_level(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    text = value.strip()
    if text.upper() in LEVELS and text not in LEVELS:
        return SettingJudgement(
            Status.WARN,
            f"NCCL compares level names case-sensitively: {text!r} is ignored "
            f"(use {text.upper()!r}, or unset it)",
        )
    disabled = text in ("LOC", "0")
    if name == "NCCL_P2P_LEVEL":
        if disabled:
            return _p2p_disabled(facts)
        return SettingJudgement(
            Status.WARN, "debugging variable: overrides NCCL's topology-based P2P choice"
        )
    if disabled and facts.rdma_active:
        return SettingJudgement(
            Status.FAIL,
            "GPUDirect RDMA disabled on a node with active RDMA ports "
            f"({', '.join(facts.rdma_active)}): network transfers are staged through host memory",
        )
    return None


def _p2p_disabled(facts: NcclFacts) -> SettingJudgement:
    if facts.gpu_count >= 2:
        return SettingJudgement(
            Status.FAIL,
            "disables GPU peer-to-peer (NVLink and PCIe) between the "
            f"{facts.gpu_count} GPUs: intra-node collectives go through host memory",
        )
    return SettingJudgement(
        Status.WARN, "disables GPU peer-to-peer; no effect with one GPU, remove it"
    )


def rule_p2p_disable(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    return _p2p_disabled(facts) if _truthy(value) else None


def rule_ib_disable(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    if not _truthy(value):
        return None
    if facts.rdma_active:
        return SettingJudgement(
            Status.FAIL,
            f"turns off InfiniBand/RoCE although {', '.join(facts.rdma_active)} are active: "
            "inter-node traffic falls back to TCP sockets",
        )
    return None


def rule_shm_disable(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    if _truthy(value):
        return SettingJudgement(
            Status.WARN, "turns off the shared-memory transport between local GPUs"
        )
    return None


def rule_nvls(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    if value.strip() == "0" and facts.nvswitch:
        return SettingJudgement(
            Status.WARN,
            "turns off NVLink SHARP on an NVSwitch node: all_reduce loses about a quarter of "
            "its bandwidth (482 vs 368 GB/s on 8x H200)",
        )
    return None


def rule_proto(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    text = value.strip()
    if "LL128" in text.upper() and not text.startswith("^"):
        return SettingJudgement(
            Status.FAIL,
            "forces the LL128 protocol, which can corrupt data on platforms that do not "
            "support it (NCCL docs)",
        )
    return SettingJudgement(Status.WARN, "debugging variable: restricts NCCL's protocol choice")


def rule_debug(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    text = value.strip().upper()
    if name == "NCCL_DEBUG" and text in ("INFO", "TRACE"):
        # Not "unset": without NCCL_DEBUG, NCCL logs nothing at all (NVIDIA/nccl
        # src/debug.cc, ncclDebugInit: the level defaults to NONE), so the WARN lines that
        # name a failed IB or socket connection are lost. WARN is NCCL's own nccl.conf
        # example (NCCL docs, Environment Variables: NCCL_DEBUG).
        return SettingJudgement(
            Status.WARN,
            f"NCCL_DEBUG={text} logs every rank's setup and connections (a debugging level); "
            "set WARN in production, which still logs the errors that explain a failure "
            "(unset, NCCL logs nothing: NVIDIA/nccl src/debug.cc)",
            replacement="WARN",
        )
    if name == "NCCL_DEBUG_SUBSYS" and "ALL" in text.split(","):
        return SettingJudgement(
            Status.WARN, "logs every NCCL subsystem; leave it unset in production"
        )
    return None


def rule_ib_timeout(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    try:
        timeout = int(value.strip())
    except ValueError:
        return SettingJudgement(
            Status.WARN, f"not a number: {value!r} (NCCL falls back to its default)"
        )
    if timeout < 18:
        return SettingJudgement(
            Status.WARN,
            f"IB timeout {timeout} = {4.096e-6 * 2**timeout:.2g} s per retry; NCCL's default "
            "is 20 and large fabrics need 18 or more",
        )
    return None


def rule_ib_hca(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    try:
        exclude, exact, entries = parse_selector(value)
    except ValueError:
        return SettingJudgement(Status.FAIL, f"cannot parse {value!r}")
    if not entries:
        return None
    if exclude:
        remaining = [
            hca
            for hca in facts.rdma_all
            if not any(_matches(hca, pattern, exact) for pattern, _ in entries)
        ]
        if facts.rdma_all and not remaining:
            return SettingJudgement(Status.FAIL, "excludes every RDMA device on this node")
        return None
    problems = []
    ambiguous = []
    for pattern, port in entries:
        matched = [hca for hca in facts.rdma_all if _matches(hca, pattern, exact)]
        if not matched:
            problems.append(f"{pattern} does not exist")
            continue
        if len(matched) > 1:
            ambiguous.append(f"{pattern} selects {', '.join(matched)}")
        if port is not None:
            for hca in matched:
                state = facts.rdma_ports.get(hca, {}).get(port, "missing")
                if state != "ACTIVE":
                    problems.append(f"{hca} port {port} is {state}")
    if problems:
        known = ", ".join(facts.rdma_all) or "none"
        return SettingJudgement(
            Status.FAIL,
            f"names RDMA ports that cannot carry traffic: {'; '.join(problems)} "
            f"(RDMA devices here: {known})",
        )
    if ambiguous:
        return SettingJudgement(
            Status.WARN,
            f"prefix match: {'; '.join(ambiguous)}; add a leading '=' for exact names",
        )
    return None


def rule_socket_ifname(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    matched = selected_names(value, list(facts.interfaces))
    if not matched:
        return SettingJudgement(
            Status.FAIL,
            "matches no network interface, so NCCL cannot bootstrap "
            f"(interfaces here: {', '.join(facts.interfaces) or 'none'})",
        )
    if not any(facts.interfaces[i] in ("up", "unknown") for i in matched):
        return SettingJudgement(
            Status.FAIL, f"matches only interfaces that are down: {', '.join(matched)}"
        )
    return None


def rule_async_error_handling(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    if value.strip() == "0":
        return SettingJudgement(
            Status.WARN,
            "no NCCL error handling: a failed collective hangs the job until its timeout "
            "instead of ending it (default 3)",
        )
    return None


def rule_launch_blocking(name: str, value: str, facts: NcclFacts) -> SettingJudgement | None:
    if _truthy(value):
        return SettingJudgement(
            Status.WARN, "makes every CUDA launch synchronous (a debugging setting)"
        )
    return None


RULES: dict[str, Callable[[str, str, NcclFacts], SettingJudgement | None]] = {
    "NCCL_P2P_DISABLE": rule_p2p_disable,
    "NCCL_P2P_LEVEL": rule_level,
    "NCCL_NET_GDR_LEVEL": rule_level,
    "NCCL_IB_GDR_LEVEL": rule_level,
    "NCCL_IB_DISABLE": rule_ib_disable,
    "NCCL_SHM_DISABLE": rule_shm_disable,
    "NCCL_NVLS_ENABLE": rule_nvls,
    "NCCL_PROTO": rule_proto,
    "NCCL_DEBUG": rule_debug,
    "NCCL_DEBUG_SUBSYS": rule_debug,
    "NCCL_IB_TIMEOUT": rule_ib_timeout,
    "NCCL_IB_HCA": rule_ib_hca,
    "NCCL_SOCKET_IFNAME": rule_socket_ifname,
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": rule_async_error_handling,
    "NCCL_ASYNC_ERROR_HANDLING": rule_async_error_handling,
    "CUDA_LAUNCH_BLOCKING": rule_launch_blocking,
}


def judge_setting(setting: Setting, facts: NcclFacts) -> list[SettingJudgement]:
    """Every finding for one variable as one source sets it."""
    findings = []
    raw_name = setting.name
    name = raw_name.strip()
    if raw_name != name:
        findings.append(
            SettingJudgement(
                Status.WARN,
                f"NCCL reads this line as a variable named {raw_name!r}, which nothing uses: "
                "remove the spaces around '='",
            )
        )
        return findings
    if setting.value != setting.value.strip():
        findings.append(
            SettingJudgement(
                Status.WARN, f"value {setting.value!r} has surrounding whitespace NCCL keeps"
            )
        )
    if name in REMOVED:
        findings.append(
            SettingJudgement(Status.WARN, f"removed in NCCL {REMOVED[name]}: it does nothing")
        )
    if name in RENAMED:
        findings.append(SettingJudgement(Status.WARN, f"deprecated name: use {RENAMED[name]}"))
    if name in FORCING:
        findings.append(SettingJudgement(Status.WARN, f"debugging variable: {FORCING[name]}"))
    rule = RULES.get(name)
    if rule is not None:
        finding = rule(name, setting.value, facts)
        if finding is not None:
            findings.append(finding)
    return findings


def gid_index_findings(
    setting: Setting, facts: NcclFacts, tables: list[PortGidTypes] | Unread
) -> list[SettingJudgement]:
    """NCCL_IB_GID_INDEX must point at a RoCE v2 GID on every RoCE port: `tables` are the
    RoCE ports' GID tables (the roce_gids part), or why they could not be read."""
    try:
        index = int(setting.value.strip())
    except ValueError:
        return [SettingJudgement(Status.WARN, f"not a number: {setting.value!r}")]
    if index < 0 or not facts.roce_ports:
        return []
    if isinstance(tables, Unread):
        return [
            SettingJudgement(
                Status.ERROR,
                f"cannot tell whether GID index {index} is RoCE v2: the RoCE ports' GID "
                f"tables could not be read ({tables.reason})",
            )
        ]
    wrong = []
    unknown = []
    for table in tables:
        problem = table.problems.get(index, table.problem)
        if problem is not None:
            # Could not tell: not the same as "not RoCE v2".
            unknown.append(f"{table.device} port {table.port}: {problem}")
            continue
        gid_type = table.types.get(index)
        if gid_type != "RoCE v2":
            wrong.append(f"{table.device} port {table.port}: {gid_type or 'no such GID'}")
    findings = []
    if wrong:
        findings.append(
            SettingJudgement(
                Status.WARN,
                f"GID index {index} is not RoCE v2 on {'; '.join(wrong)}; NCCL 2.21+ picks "
                "the GID itself when this is unset",
            )
        )
    if unknown:
        findings.append(
            SettingJudgement(
                Status.ERROR,
                f"cannot tell whether GID index {index} is RoCE v2 on {'; '.join(unknown)}",
            )
        )
    return findings


def inventory_problems(inventory: Inventory) -> list[Result]:
    """The network facts the rules rest on that could not be read, naming the path."""
    results = [
        Result(Status.ERROR, NODE, f"cannot list the node's {area} devices: {problem}")
        for area, problem in sorted(inventory.problems.items())
        if area in ("net", "rdma")
    ]
    for rdma in inventory.rdma:
        for name, problem in sorted(rdma.problems.items()):
            results.append(
                Result(Status.ERROR, f"rdma {rdma.name}", f"cannot read {name}: {problem}")
            )
    for interface in inventory.interfaces:
        if "operstate" in interface.problems:
            results.append(
                Result(
                    Status.ERROR,
                    f"interface {interface.name}",
                    f"cannot read its state: {interface.problems['operstate']}",
                )
            )
    return results


def gid_discovery_results(
    libraries: NcclLibraries, facts: NcclFacts, variables: Variables
) -> list[Result]:
    """An NCCL older than 2.21 on a node with RoCE ports, with NCCL_IB_GID_INDEX set
    nowhere: it takes GID index 0, which on RoCE ports is a link-local GID (RoCE v1 on
    most), so connections between nodes fail or go lossy (NCCL docs, Environment
    Variables: NCCL_IB_GID_INDEX; NCCL 2.21 release notes: automatic RoCE GID detection).
    A library directory that could not be listed is an error naming it."""
    results = [
        Result(Status.ERROR, NODE, f"cannot look for the NCCL library: {problem}")
        for problem in libraries.problems
    ]
    old = libraries.without_gid_discovery
    roce = list(dict.fromkeys(device for device, _ in facts.roce_ports))
    told = any(s.name.strip() == "NCCL_IB_GID_INDEX" for s in variables.settings)
    if old and roce and not told:
        versions = ", ".join(library.text for library in old)
        results.append(
            Result(
                Status.WARN,
                NODE,
                f"{versions}: older than 2.21, it does not find the RoCE v2 GID itself and "
                f"uses GID index 0 on {', '.join(roce)} (NCCL_IB_GID_INDEX is set nowhere)",
                "set NCCL_IB_GID_INDEX to the index whose /sys/class/infiniband/<hca>/ports/"
                '<port>/gid_attrs/types/<index> reads "RoCE v2", or use NCCL 2.21 or later',
                {"nccl_libraries": [library.text for library in libraries.found]},
            )
        )
    return results
