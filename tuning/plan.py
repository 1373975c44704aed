"""The whole recommendation for a node: per-rank bindings, the environment every rank
shares, each rank's own variables, what to remove, what to leave alone, and notes.

    inventory + variables (checks/) -> bindings, NIC pairing -> NCCL, PyTorch advice
    -> Plan, marked keep/set/change/unset against the calling environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.cpulist import format_cpulist, parse_cpulist
from nodecheck.checks.node.net import read_addressed_interfaces
from nodecheck.checks.node.pci import PciDevice
from nodecheck.tuning import nccl, pytorch
from nodecheck.tuning.bindings import (
    NicPairing,
    RankBinding,
    bind_ranks,
    pair_nics,
    sharing_gpus,
    visible_gpus,
)
from nodecheck.tuning.nccl import JobShape
from nodecheck.tuning.recommendation import DataLoaderHint, LeftUnset, Recommendation
from nodecheck.tuning.red_flags import removals


@dataclass(frozen=True)
class TuneOptions:
    shape: JobShape = field(default_factory=JobShape)
    with_smt_siblings: bool = False
    allowed_cpus: frozenset[int] | None = None  # this process's cpuset; None: no limit
    torch_version: tuple[int, int] | None = None


@dataclass(frozen=True)
class RankPlan:
    binding: RankBinding
    nics: NicPairing
    env: list[Recommendation]  # this rank's own variables (on top of the shared ones)
    dataloader: DataLoaderHint

    @property
    def local_rank(self) -> int:
        return self.binding.local_rank

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.binding.cpus)


@dataclass(frozen=True)
class Plan:
    hostname: str
    env: list[Recommendation]  # shared by every rank
    removals: list[Recommendation]
    left_unset: list[LeftUnset]
    ranks: list[RankPlan]
    notes: list[str]

    def rank(self, local_rank: int) -> RankPlan | None:
        """The plan for a local rank. With one GPU visible (a node with one GPU, or
        `srun --gpus-per-task=1` giving each task its own), every rank drives that GPU."""
        found = next((r for r in self.ranks if r.local_rank == local_rank), None)
        if found is None and len(self.ranks) == 1:
            only = self.ranks[0]
            return replace(only, binding=replace(only.binding, local_rank=local_rank))
        return found

    def environment(self, rank: RankPlan | None) -> dict[str, str]:
        """The variables to set: the shared ones, and the rank's own when given."""
        chosen = self.env + (rank.env if rank is not None else [])
        return {r.name: r.value for r in chosen if r.value is not None}


def _visibility_notes(gpus: list[PciDevice], environ: Mapping[str, str]) -> list[str]:
    visible = environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [item.strip() for item in visible.split(",")]
    if any(item.startswith(("GPU-", "MIG-")) for item in entries):
        return [
            "CUDA_VISIBLE_DEVICES names GPUs by UUID or MIG instance, which sysfs cannot "
            "match: ranks are counted over every GPU"
        ]
    step = environ.get("SLURM_STEP_GPUS", environ.get("SLURM_JOB_GPUS"))
    if visible and step is not None and sharing_gpus(gpus, environ) is None:
        shown = visible_gpus(gpus, environ)
        try:
            indices = parse_cpulist(step)
        except ValueError:
            return []
        if any(gpus.index(gpu) not in indices for gpu in shown):
            return [
                f"CUDA_VISIBLE_DEVICES={visible} names GPUs outside this step's "
                f"(SLURM_STEP_GPUS={step}): Slurm's ConstrainDevices numbers them from 0 "
                "inside the job, so the GPU bound here may not be the one CUDA uses"
            ]
    return []


def _with_current(left: LeftUnset, ctx: CheckContext, flagged: list[Recommendation]) -> LeftUnset:
    """Say where a variable left to NCCL or torch is set now (flagged ones are removals)."""
    flagged_names = {r.name for r in flagged}
    found = tuple(
        f"{s.name.strip()}={s.value.strip()} in {s.where}"
        for s in ctx.variables.settings
        if s.name.strip() in left.names and s.name.strip() not in flagged_names
    )
    return replace(left, found=found) if found else left


def make_plan(ctx: CheckContext, options: TuneOptions) -> Plan:
    inventory = ctx.inventory
    environ = ctx.environ
    bindings = bind_ranks(
        inventory,
        environ,
        allowed=options.allowed_cpus,
        with_smt_siblings=options.with_smt_siblings,
    )
    # Every GPU's NIC, not only the visible ones': NCCL_IB_HCA must be the same on every
    # rank of the node, and NICs are dealt out in bus order.
    pairings = {p.gpu: p for p in pair_nics(inventory, inventory.gpus)}
    notes: list[str] = []
    shape = options.shape
    if shape.nodes is None:
        nodes, variable = nccl.job_nodes(environ)
        if nodes is not None:
            shape = JobShape(nodes, shape.single_switch)
            notes.append(f"the job spans {nodes} node(s), from {variable}")
    env: list[Recommendation] = []
    left: list[LeftUnset] = []
    ranks: list[RankPlan] = []
    if not bindings:
        notes.append(
            "no GPU visible (CUDA_VISIBLE_DEVICES hides them all): no ranks to bind"
            if inventory.gpus
            else "no NVIDIA GPU on this node: no ranks to bind, and no GPU settings"
        )
    else:
        notes += _visibility_notes(inventory.gpus, environ)
        env.append(pytorch.device_order())
        env += pytorch.allocator(environ, options.torch_version)
        advice = nccl.nccl_advice(
            inventory,
            list(pairings.values()),
            read_addressed_interfaces(ctx.fs),
            environ,
            shape,
            len(bindings),
        )
        env += advice.env
        left += advice.left_unset + pytorch.left_to_torch()
        notes += advice.notes
        notes += list(dict.fromkeys(b.note for b in bindings if b.note))
        for binding in bindings:
            cores = pytorch.physical_cores(inventory, binding)
            ranks.append(
                RankPlan(
                    binding,
                    pairings[binding.gpu],
                    [pytorch.omp_threads(cores, environ).against(environ)],
                    pytorch.dataloader(cores),
                )
            )
    flagged = removals(ctx)
    return Plan(
        hostname=inventory.hostname,
        env=[r.against(environ) for r in env],
        removals=flagged,
        left_unset=[_with_current(item, ctx, flagged) for item in left],
        ranks=ranks,
        notes=notes,
    )
