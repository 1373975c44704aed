"""What a check returns: a status per subject, with a summary, a remedy and metric samples,
and what a finding means: its fault class, the action it asks for and where it came from.

A check declares the meaning of its findings once, with its registration
(checks/registry.py); a result may carry its own where the evidence decides (an XID's
action comes from its code). Everything that acts on a node (Slurm's drain, reboot and
prolog, the Kubernetes conditions and taint, NPD, the alert rules) reads these three and
nothing else: no list of check names outside a check's own module.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import field

from nodecheck.checks.record import record


class Status(str, enum.Enum):
    """The outcome of one judgement.

    `skip` means "not applicable on this node"; `error` means "could not
    determine". Neither is a pass.
    """

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    @property
    def severity(self) -> int:
        """Rank for "worst first" ordering: fail > error > warn > ok > skip."""
        return _SEVERITY[self]


_SEVERITY = {Status.SKIP: 0, Status.OK: 1, Status.WARN: 2, Status.ERROR: 3, Status.FAIL: 4}


def worst(statuses: Iterable[Status]) -> Status:
    """The most severe status, `skip` when there is none."""
    return max(statuses, key=lambda s: s.severity, default=Status.SKIP)


class FaultClass(str, enum.Enum):
    """What kind of fault a finding is, which says who fixes it.

    - gpu-hardware: a GPU, its memory, its links or the NVSwitches are broken or missing;
      the node needs a reset, a reboot or an RMA (NVIDIA's XID catalog's resolutions).
    - gpu-performance: the GPUs work but slower than they should (throttled clocks,
      links below their rate, benchmarks below the node's peers or baseline); jobs run,
      slowly, and a collective job runs at its slowest rank's pace.
    - node-config: the node's settings (NUMA, ACS, CPU governor, NCCL and torch
      variables) hurt or break jobs; fixed by configuration, not by hardware.
    """

    GPU_HARDWARE = "gpu-hardware"
    GPU_PERFORMANCE = "gpu-performance"
    NODE_CONFIG = "node-config"


class Action(str, enum.Enum):
    """What must be done about a finding, by the operator or the scheduler.

    The GPU buckets are NVIDIA's XID catalog resolutions as NVIDIA/NVSentinel's
    xiderrorsmapping.csv names them (RESTART_APP, RESET_GPU, RESTART_BM and RESTART_VM as
    one reboot, CONTACT_SUPPORT) and gpud's suggested actions (HARDWARE_INSPECTION,
    leptonai/gpud api/v1/types.go); the rest is what a node-level tool also needs.
    """

    NONE = "none"
    RESTART_APP = "restart-app"  # the job dies or must restart; the node is fine
    RESET_GPU = "reset-gpu"  # drain, reset the GPU (nvidia-smi -r), or reboot
    REBOOT = "reboot"  # drain and reboot the node
    INSPECT_HARDWARE = "inspect-hardware"  # drain; reseat, check cables and power
    CONTACT_SUPPORT = "contact-support"  # drain; report to the vendor (RMA)
    FIX_NODE_CONFIG = "fix-node-config"  # the node's settings (BIOS, kernel, /etc)
    FIX_JOB_ENVIRONMENT = "fix-job-environment"  # what a job set; the node is fine
    INVESTIGATE = "investigate"  # could not be told apart: a person looks

    @property
    def needs_the_node(self) -> bool:
        """Whether the node must be out of service to do it (drained first)."""
        return self in _NEEDS_THE_NODE


_NEEDS_THE_NODE = frozenset(
    {Action.RESET_GPU, Action.REBOOT, Action.INSPECT_HARDWARE, Action.CONTACT_SUPPORT}
)


class Origin(str, enum.Enum):
    """Where a finding's evidence came from: the node itself (its hardware, its kernel,
    its files under /etc), or a job's environment (a variable a user set). What a job's
    user can set never takes a node out of service."""

    NODE = "node"
    JOB = "job"


NODE = "node"
# A `skip`'s details["cause"] when what it needs is closed to this process (root's
# alone), where it runs so by design: the unprivileged DaemonSet, a user's shell.
UNPRIVILEGED = "unprivileged"


def gpu_subject(bdf: str) -> str:
    return f"gpu {bdf}"


def bridge_subject(bdf: str) -> str:
    return f"bridge {bdf}"


def nic_subject(name: str) -> str:
    return f"nic {name}"


@record
class MetricSpec:
    """A metric family a check exports: name, Prometheus type, help text, label names."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...] = ()


@record
class Sample:
    """One value of a metric family, with its label values."""

    metric: MetricSpec
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


@record
class Result:
    """One judgement about one subject (the node, a GPU, a bridge, a NIC).

    `action`, `fault_class` and `origin`: what this finding means, where the evidence
    decides it; None takes the check's declaration (Check.meant fills them in when the
    check has run, so every result a consumer sees carries all three)."""

    status: Status
    subject: str
    summary: str
    remedy: str = ""
    details: Mapping[str, object] = field(default_factory=dict)
    samples: tuple[Sample, ...] = ()
    action: Action | None = None
    fault_class: FaultClass | None = None
    origin: Origin | None = None
