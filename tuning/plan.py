"""The whole recommendation for a node: per-rank bindings, the environment every rank
shares, each rank's own variables, what to remove, what to leave alone, and notes.

    inventory + variables (checks/) -> bindings, NIC pairing -> NCCL, PyTorch advice
    -> Plan, marked keep/set/change/unset against the calling environment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.calling_environment import CallingEnvironment
from nodecheck.checks.node.cgroup import CpusetReading
from nodecheck.checks.node.coherent_gpus import CoherentGpus
from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.checks.node.facts import PartUnavailableError
from nodecheck.checks.node.gpu_assignment import GpuAssignment, assign_gpus
from nodecheck.checks.node.gpu_identities import GpuIdentities
from nodecheck.checks.node.gpu_presence import GpuPresences
from nodecheck.checks.node.inventory import Inventory
from nodecheck.checks.node.nccl_library import NcclLibraries
from nodecheck.checks.node.nccl_platform import NcclPlatform
from nodecheck.checks.node.net import AddressedInterfaces, GlooSocketIfname, MasterAddrRoute
from nodecheck.checks.node.nvidia_driver import NvidiaDriver
from nodecheck.checks.node.torch_package import TorchVersion
from nodecheck.checks.node.variables import CALLING_ENVIRONMENT
from nodecheck.checks.record import record
from nodecheck.checks.result import Status
from nodecheck.checks.rules.job_versions import VersionEvidence, job_nccl, job_torch
from nodecheck.tuning import interconnect, nccl, pytorch
from nodecheck.tuning.bindings import (
    NicPairing,
    RankBinding,
    bind_ranks,
    pair_nics,
    sharing_gpus,
    visible_devices,
)
from nodecheck.tuning.gpu_usability import usability_problem
from nodecheck.tuning.nccl import JobShape
from nodecheck.tuning.recommendation import DataLoaderHint, LeftUnset, Recommendation
from nodecheck.tuning.red_flags import removals
from nodecheck.tuning.visible_devices import names_gpus_by_id

if TYPE_CHECKING:
    from nodecheck.checks.node.job_versions import JobVersions


@record
class TuneOptions:
    shape: JobShape = field(default_factory=JobShape)
    # Each rank gets its cores' SMT siblings too unless told not to, as torchrun's
    # --numa-binding=exclusive does (torch/numa/binding.py).
    with_smt_siblings: bool = True
    # CPUs to stay inside when the cpuset (the `cpuset` part) sets no limit; None: no limit.
    allowed_cpus: frozenset[int] | None = None


# The parts of the facts make_plan reads: `tune --facts FILE` judges a capture holding them.
PLAN_NEEDS = (
    "inventory",
    "variables",
    "calling_environment",
    "nvidia_driver",
    "gpu_identities",
    "gpu_presence",
    "coherent_gpus",
    "addressed_interfaces",
    "master_addr_route",
    "gloo_socket_ifname",
    "nccl_library",
    "cpuset",
    "torch_version",
    "job_versions",
    "nccl_platform",
    "virtualization",
)
# Parts make_plan does without, with a note (a capture taken by an older nodecheck may
# lack them): the cpuset (a warning on every rank), the versions (unknown: both names of
# each renamed variable), MASTER_ADDR's interface, what GLOO_SOCKET_IFNAME names (as if
# unset), and what the interconnect advice rests on.
PLAN_OPTIONAL = (
    "cpuset",
    "torch_version",
    "job_versions",
    "master_addr_route",
    "gloo_socket_ifname",
    "nccl_platform",
    "virtualization",
)


@record
class RankPlan:
    binding: RankBinding
    nics: NicPairing
    env: list[Recommendation]  # this rank's own variables (on top of the shared ones)
    dataloader: DataLoaderHint
    budget: pytorch.CpuBudget
    # Why this rank must not run here: CUDA cannot drive its GPU, which is meant for this
    # host (fallen off the bus, no driver, nouveau). `nodecheck exec` refuses such a rank.
    refusal: str = ""
    # Why its binding may be wrong: a GPU before it that CUDA cannot drive (CUDA's
    # numbering skips it), its GPU's state could not be read, it shares CPUs with another
    # rank, or the cpuset could not be read. `exec` says so and runs.
    warning: str = ""

    @property
    def error(self) -> str:
        """Why the rank has no CPU to run on (`nodecheck exec` refuses it); "" when it has."""
        return self.binding.error

    @property
    def local_rank(self) -> int:
        return self.binding.local_rank

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.binding.cpus)


@record
class Plan:
    hostname: str
    env: list[Recommendation]  # shared by every rank
    removals: list[Recommendation]
    left_unset: list[LeftUnset]
    ranks: list[RankPlan]
    notes: list[str]
    # Why CUDA cannot drive a GPU meant for this host, one line per GPU: every rank's
    # concern (the node needs draining), also in `notes`. GPUs not meant for this host
    # (passed through to a VM, given to another container) are only in `notes`.
    unusable: list[str] = field(default_factory=list)
    # GPUs on the bus not meant for this host or container: bus id -> why.
    left_out: dict[str, str] = field(default_factory=dict)
    # Changes to the training script no variable can make (garbage collection, torchrun).
    code_hints: list[pytorch.CodeHint] = field(default_factory=list)
    # Why no GPU is seen (or placed) past `ranks`: CUDA_VISIBLE_DEVICES names more, and
    # CUDA stops at an entry that names no GPU here, or nodecheck cannot tell which GPU
    # an entry names. A rank past `ranks` then has none, even with one GPU visible.
    unseen: str = ""
    # The job's torch and NCCL, where each was read: the renamed variables' names and the
    # version-dependent defaults rest on them.
    torch: VersionEvidence = field(default_factory=lambda: VersionEvidence("torch"))
    nccl: VersionEvidence = field(default_factory=lambda: VersionEvidence("NCCL"))
    # Why the Python named with --python could not be read: `tune` and `exec` say it on
    # stderr, as the user asked for it by name.
    python_problem: str = ""

    def rank(self, local_rank: int) -> RankPlan | None:
        """The plan for a local rank. With one GPU visible (a node with one GPU, or
        `srun --gpus-per-task=1` giving each task its own), every rank drives that GPU,
        unless CUDA_VISIBLE_DEVICES meant more GPUs than CUDA sees (`unseen`)."""
        found = next((r for r in self.ranks if r.local_rank == local_rank), None)
        if found is None and len(self.ranks) == 1 and not self.unseen:
            only = self.ranks[0]
            return replace(only, binding=replace(only.binding, local_rank=local_rank))
        return found

    def environment(self, rank: RankPlan | None) -> dict[str, str]:
        """The variables to set: the shared ones, and the rank's own when given."""
        chosen = self.env + (rank.env if rank is not None else [])
        return {r.name: r.value for r in chosen if r.value is not None}


def _gpu_identities(ctx: CheckContext, environ: Mapping[str, str]) -> GpuIdentities | None:
    """The driver's GPU UUIDs and MIG instances, read only when CUDA_VISIBLE_DEVICES names
    a GPU by UUID or a MIG device (None otherwise); a part that could not be read (or a
    capture without it) is known as nothing, its reason kept, never as "no such GPU"."""
    if not names_gpus_by_id(environ):
        return None
    try:
        identities: GpuIdentities = ctx.part("gpu_identities")
    except PartUnavailableError as err:
        return GpuIdentities({}, problem=str(err))
    return identities


def _merge_flags(
    env: list[Recommendation], flagged: list[Recommendation]
) -> tuple[list[Recommendation], list[Recommendation]]:
    """A variable recommended here whose current value the checks flag is one piece of
    advice, not two ("change X" and "unset X"): the change says why the value is wrong.
    A value the checks only warn about stays the user's to decide (advisory)."""
    calling = CALLING_ENVIRONMENT.label
    ours = {r.name: r for r in flagged if r.current is not None}
    merged = []
    for recommendation in env:
        flag = ours.get(recommendation.name)
        if flag is None or recommendation.current is None:
            merged.append(recommendation)
            continue
        merged.append(
            replace(
                recommendation,
                reason=f"{recommendation.reason} (the value now: {flag.reason})",
                advisory=flag.severity != Status.FAIL.value,
            )
        )
    recommended = {r.name for r in merged if r.name in ours and r.current is not None}
    rest = []
    for removal in flagged:
        if removal.name not in recommended or removal.current is None:
            rest.append(removal)
            continue
        elsewhere = tuple(place for place in removal.found_in if place != calling)
        if elsewhere:
            rest.append(replace(removal, found_in=elsewhere, current=None))
    return merged, rest


def _with_current(
    left: LeftUnset,
    ctx: CheckContext,
    flagged: list[Recommendation],
    verdicts: Mapping[str, Callable[[str], str]],
) -> LeftUnset:
    """Say where a variable left to NCCL or torch is set now (flagged ones are removals),
    and what nodecheck makes of each value set, where it has a word for it."""
    flagged_names = {r.name for r in flagged}
    settings = [
        (s.name.strip(), s.value.strip(), s.where)
        for s in ctx.variables.settings
        if s.name.strip() in left.names and s.name.strip() not in flagged_names
    ]
    if not settings:
        return left
    judged = dict.fromkeys(
        f"{name}={value}: {verdicts[name](value)}"
        for name, value, _ in settings
        if name in verdicts
    )
    return replace(
        left,
        found=tuple(f"{name}={value} in {where}" for name, value, where in settings),
        verdict="; ".join(judged),
    )


def _verdicts(
    torch: VersionEvidence, job_nccl_version: VersionEvidence, environ: Mapping[str, str]
) -> dict[str, Callable[[str], str]]:
    """What nodecheck says of a value someone set for a variable it leaves unset, by the
    job's versions."""
    return {
        "NCCL_IB_QPS_PER_CONNECTION": partial(
            nccl.queue_pairs_verdict, nccl=job_nccl_version, environ=environ
        ),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": partial(
            pytorch.async_error_handling_verdict, torch=torch
        ),
        **interconnect.VERDICTS,
    }


def _assignment(ctx: CheckContext) -> tuple[GpuAssignment, list[str]]:
    """Which GPUs on the bus are meant for this host and container, and the notes that
    name those left out and why (or why it could not be told)."""
    driver: NvidiaDriver = ctx.part("nvidia_driver")
    exposed = None if driver.exposed_gpus is None else set(driver.exposed_gpus)
    unknown = ""
    if driver.gpus_error:
        unknown = (
            f"cannot list the nvidia driver's GPUs ({driver.gpus_error}): whether this is a "
            "container given "
            "only some GPUs is unknown, so every GPU bound to nvidia counts as this one's, "
            "and local ranks may not be driving the GPUs named here"
        )
    assignment = assign_gpus(ctx.inventory.gpus, exposed)
    by_reason: dict[str, list[str]] = {}
    for bdf, reason in assignment.left_out.items():
        by_reason.setdefault(reason, []).append(bdf)
    notes = [
        f"{'GPUs' if len(bdfs) > 1 else 'GPU'} {', '.join(bdfs)} "
        f"{'are' if len(bdfs) > 1 else 'is'} {reason}: left out of the bindings (no local "
        f"rank drives {'them' if len(bdfs) > 1 else 'it'}); local ranks count only the "
        f"{len(assignment.here)} GPU(s) meant for this host and container, as CUDA does"
        for reason, bdfs in by_reason.items()
    ]
    return assignment, notes + ([unknown] if unknown else [])


def _rank_verdicts(
    bindings: list[RankBinding], problems: dict[str, tuple[str, bool]]
) -> list[tuple[str, str]]:
    """(refusal, warning) for each rank, from its GPU's usability problem (and whether that
    is certain). A rank whose GPU CUDA cannot drive is refused; a rank after one in bus
    order is warned that CUDA's numbering skips it; a rank whose GPU's state is unknown is
    warned. (What is wrong with the node's GPUs is in Plan.unusable, for every rank.)"""
    verdicts = []
    passed = ""  # the first unusable GPU before this rank's, in bus order
    for binding in bindings:
        problem, certain = problems[binding.gpu]
        if problem and certain:
            verdicts.append((problem, ""))
            passed = passed or binding.gpu
            continue
        warnings = [problem] if problem else []
        if passed:
            warnings.append(
                f"GPU {passed}, before this rank's GPU in bus order, cannot be driven by CUDA, "
                f"which numbers the GPUs after it one lower: local rank {binding.local_rank} "
                f"may not be driving {binding.gpu}; see the note on GPU {passed}"
            )
        verdicts.append(("", "; ".join(warnings)))
    return verdicts


def _cpuset(ctx: CheckContext) -> CpusetReading:
    """The cpuset part; one a capture lacks (or could not read) is an error, never "no
    limit"."""
    try:
        reading: CpusetReading = ctx.part("cpuset")
    except PartUnavailableError as err:
        return CpusetReading(None, error=str(err))
    return reading


def _optional_part(ctx: CheckContext, name: str, what: str, instead: str) -> tuple[Any, list[str]]:
    """Part `name`, or None and a note saying `what` is unknown, why, and what the plan
    does `instead` (a part a capture may lack: one taken by an older nodecheck)."""
    try:
        return ctx.part(name), []
    except PartUnavailableError as err:
        return None, [f"{what} is unknown ({err}): {instead}"]


def _part_or_none(ctx: CheckContext, name: str) -> Any:
    """A part, or None where it could not be read (a capture without it): the versions
    are then unknown, which the plan says."""
    try:
        return ctx.part(name)
    except PartUnavailableError:
        return None


def job_versions_of(ctx: CheckContext) -> tuple[VersionEvidence, VersionEvidence]:
    """The job's torch and NCCL, where each was read (checks/rules/job_versions.py)."""
    versions: JobVersions | None = _part_or_none(ctx, "job_versions")
    own: TorchVersion | None = _part_or_none(ctx, "torch_version")
    installed: NcclLibraries | None = _part_or_none(ctx, "nccl_library")
    return job_torch(versions, own), job_nccl(versions, installed)


def _named_python_problem(ctx: CheckContext) -> str:
    versions: JobVersions | None = _part_or_none(ctx, "job_versions")
    python = None if versions is None else versions.python
    if python is None or not python.problem or not python.named.startswith("--python"):
        return ""
    return (
        f"{python.named} could not be read ({python.problem}): the job's versions are "
        "taken from a running job, else unknown"
    )


def _version_notes(ctx: CheckContext, torch: VersionEvidence, nccl: VersionEvidence) -> list[str]:
    """Where each version came from, and what could not be read on the way."""
    notes = [f"versions: {torch.account()}; {nccl.account()}"]
    if torch.known is None:
        notes.append(
            "the job's torch is not known: each renamed variable is set under both its names "
            "(PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF, TORCH_FR_BUFFER_SIZE and "
            "TORCH_NCCL_TRACE_BUFFER_SIZE), which every torch takes; --python PATH names the "
            "job's Python"
        )
    versions: JobVersions | None = _part_or_none(ctx, "job_versions")
    if versions is not None:
        notes += [f"job versions: {p.label}: {p.problem}" for p in versions.processes if p.problem]
        notes += [f"job versions: {note}" for note in versions.notes]
    return notes


def _cpuset_notes(cpuset: CpusetReading) -> tuple[list[str], str]:
    """The notes on how the cpuset was read, and the warning every rank carries when it
    could not be."""
    notes = [f"cpuset: {note}" for note in cpuset.notes]
    if not cpuset.error:
        return notes, ""
    warning = (
        f"the cpuset of this process could not be read ({cpuset.error}): the bindings assume "
        "every online CPU may be used, and the kernel narrows or refuses one outside it"
    )
    return [*notes, warning], warning


def _reading_notes(inventory: Inventory) -> list[str]:
    """What the reading of the CPUs and NUMA nodes inferred where sysfs was incomplete or
    contradicted itself (the online CPUs taken without `online`, topology guessed, CPUs
    placed by their links or in no node): the bindings stand on it, so `tune` says it as
    `inventory` does, each once."""
    per_node = [
        f"node {node.number}: {note}"
        for node in inventory.numa_nodes
        for note in node.notes
        if note not in inventory.numa_notes  # an offline node's note is the reading's too
    ]
    return list(dict.fromkeys([*inventory.cpu.notes, *inventory.numa_notes, *per_node]))


def make_plan(ctx: CheckContext, options: TuneOptions) -> Plan:
    """The plan for this node, from the parts in PLAN_NEEDS and the options alone."""
    inventory = ctx.inventory
    calling: CallingEnvironment = ctx.part("calling_environment")
    environ = calling.values
    assignment, assignment_notes = _assignment(ctx)
    cpuset = _cpuset(ctx)
    torch, job_nccl_version = job_versions_of(ctx)
    cpuset_notes, cpuset_warning = _cpuset_notes(cpuset)
    identities = _gpu_identities(ctx, environ)
    visible = visible_devices(assignment.here, environ, assignment.host, identities)
    # The job's GPUs on this node: the visible ones, or the whole step's where each task
    # sees only its own (srun --gpus-per-task): what NCCL's communicator counts here.
    job_gpus = sharing_gpus(assignment.here, environ, assignment.host, identities) or visible.gpus
    bindings = bind_ranks(
        inventory,
        environ,
        allowed=options.allowed_cpus if cpuset.cpus is None else cpuset.cpus,
        with_smt_siblings=options.with_smt_siblings,
        assignment=assignment,
        allowed_nodes=cpuset.mems,
        identities=identities,
    )
    # Every host GPU's NIC, not only the visible ones': NCCL_IB_HCA must be the same on
    # every rank of the node, and NICs are dealt out in bus order. A GPU passed through
    # to a VM uses none of this host's.
    coherent: CoherentGpus = ctx.part("coherent_gpus")
    c2c = frozenset(coherent.by_bus_id)
    pairings = {p.gpu: p for p in pair_nics(inventory, assignment.host, c2c)}
    notes: list[str] = [
        *assignment_notes,
        *cpuset_notes,
        *_reading_notes(inventory),
    ]
    if coherent.problem:
        notes.append(
            f"cannot list the GPUs the driver attaches coherently ({coherent.problem}): "
            "a GPU on NVLink-C2C, if any, is paired with its NICs as a PCIe GPU"
        )
    shape = options.shape
    if shape.nodes is None:
        nodes, variable = nccl.job_nodes(environ)
        if nodes is not None:
            shape = JobShape(nodes, shape.single_switch)
            notes.append(f"the job spans {nodes} node(s), from {variable}")
        unreadable = nccl.unreadable_job_sizes(environ)
        if nodes is None and unreadable:
            notes.append(
                f"{', '.join(unreadable)} set but not a count (the value is not shown): the "
                "job's size is unknown, pass --nodes N"
            )
    env: list[Recommendation] = []
    gloo: GlooSocketIfname | None = None
    left: list[LeftUnset] = []
    value_verdicts: dict[str, Callable[[str], str]] = {}
    ranks: list[RankPlan] = []
    unusable: list[str] = []
    if not bindings:
        if assignment.here:
            hidden = visible.stop or "no GPU visible (CUDA_VISIBLE_DEVICES hides them all)"
            why = f"{hidden}: no ranks to bind"
            notes = [*visible.notes, *notes]
        elif inventory.gpus:
            why = (
                "no GPU on this node is meant for this host and container (see the notes "
                "on each): no ranks to bind"
            )
        else:
            why = "no NVIDIA GPU on this node: no ranks to bind, and no GPU settings"
        notes.insert(0, why)  # the first note is what exec says when it finds no rank
    else:
        notes += visible.notes + visible.warnings
        env.append(pytorch.device_order())
        notes += _version_notes(ctx, torch, job_nccl_version)
        env += pytorch.allocator(environ, torch)
        addressed: AddressedInterfaces = ctx.part("addressed_interfaces")
        libraries: NcclLibraries = ctx.part("nccl_library")
        master: MasterAddrRoute | None
        master, master_notes = _optional_part(
            ctx,
            "master_addr_route",
            "which interface's subnet holds MASTER_ADDR",
            "NCCL_SOCKET_IFNAME is chosen without it",
        )
        notes += master_notes
        gloo, gloo_notes = _optional_part(
            ctx,
            "gloo_socket_ifname",
            "whether GLOO_SOCKET_IFNAME is set",
            "GLOO_SOCKET_IFNAME is advised as if unset",
        )
        notes += gloo_notes
        advice = nccl.nccl_advice(
            inventory,
            list(pairings.values()),
            addressed,
            environ,
            shape,
            len(job_gpus),
            libraries,
            job_nccl_version,
            master,
            gloo,
        )
        env += advice.env
        env += pytorch.post_mortem(environ, torch)
        platform: NcclPlatform | None
        vm: str | None
        platform, platform_notes = _optional_part(
            ctx,
            "nccl_platform",
            "what NCCL's interconnect features rest on (the nccl_platform part)",
            "the NVLink domain, SHARP, VM topology and peer-to-peer advice not judged",
        )
        vm, vm_notes = _optional_part(
            ctx, "virtualization", "whether this is a VM", "no VM topology advice"
        )
        extra = interconnect.interconnect_advice(
            inventory,
            job_gpus,
            list(pairings.values()),
            platform,
            vm,
            coherent,
            job_nccl_version,
            libraries,
            environ,
            shape,
        )
        left += advice.left_unset + extra.left_unset + pytorch.left_to_torch()
        notes += advice.notes + extra.notes + platform_notes + vm_notes
        if platform is not None and platform.problems:
            notes.append(
                "reading what NCCL's features need (nccl_platform) met: "
                + "; ".join(platform.problems)
            )
        value_verdicts = _verdicts(torch, job_nccl_version, environ)
        # A rank's error (no CPU to run on) is said once, on its own line, not as a note.
        notes += list(dict.fromkeys(b.note for b in bindings if b.note))
        shared = [b.local_rank for b in bindings if b.warning]
        if shared:
            notes.append(
                f"local rank(s) {format_cpulist(shared)} share CPUs or cores with other ranks: "
                "there are fewer CPUs in reach than ranks (each rank's warning names them); "
                "nodecheck binds them anyway rather than leave a rank without CPUs"
            )
        unread = frozenset(inventory.cpu.online) - frozenset(inventory.cpu.cpus)
        if unread:
            notes.append(
                f"the topology of CPU(s) {format_cpulist(unread)} could not be read "
                "(cpu*/topology): SMT siblings cannot be told apart, so each counts as a core "
                "and a rank may hold both threads of one core"
            )
        presences: GpuPresences = ctx.part("gpu_presence")
        problems = {
            gpu.bdf: usability_problem(gpu, presences.by_bus_id.get(gpu.bdf))
            for gpu in assignment.here
        }
        notes += [problem for problem, _ in problems.values() if problem]
        unusable = [problem for problem, certain in problems.values() if problem and certain]
        verdicts = _rank_verdicts(bindings, problems)
        for binding, (refusal, warning) in zip(bindings, verdicts, strict=True):
            # A rank always has a CPU here (a rank without one is an error, with no thread
            # count at all): OMP_NUM_THREADS=0 would be no setting OpenMP accepts.
            budget = pytorch.cpu_budget(
                pytorch.rank_cpus(binding), pytorch.rank_cores(inventory, binding)
            )
            # A degraded or down rail of this GPU is the rank's warning too: `eval "$(tune)"`
            # and `exec` show the rank's warnings, never the node's notes.
            rail_warning = pairings[binding.gpu].warning
            warnings = [
                w
                for w in (warning, *visible.warnings, binding.warning, cpuset_warning, rail_warning)
                if w
            ]
            ranks.append(
                RankPlan(
                    binding,
                    pairings[binding.gpu],
                    []
                    if binding.error
                    else [pytorch.omp_threads(budget, environ).against(environ)],
                    pytorch.dataloader(budget),
                    budget,
                    refusal,
                    "; ".join(warnings),
                )
            )
    # GLOO_SOCKET_IFNAME is not in the calling_environment part (its value is not kept):
    # its advice is marked against what the gloo_socket_ifname part tells of it.
    gloo_now = nccl.gloo_current(gloo)
    marking = environ if gloo_now is None else {**environ, "GLOO_SOCKET_IFNAME": gloo_now}
    marked, flagged = _merge_flags([r.against(marking) for r in env], removals(ctx))
    return Plan(
        hostname=inventory.hostname,
        env=marked,
        removals=flagged,
        left_unset=[_with_current(item, ctx, flagged, value_verdicts) for item in left],
        ranks=ranks,
        notes=notes,
        unusable=unusable,
        unseen=visible.stop if bindings else "",
        left_out=assignment.left_out,
        code_hints=pytorch.code_hints() if bindings else [],
        torch=torch,
        nccl=job_nccl_version,
        python_problem=_named_python_problem(ctx),
    )
