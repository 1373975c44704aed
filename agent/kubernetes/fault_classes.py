"""The fault classes as Kubernetes hears of them: one node condition per class, and a
class's verdict from its findings.

A finding's class is its own (checks/result.py's FaultClass: the check declares it with
its registration, a result may carry another). Both ways a cluster hears of a fault use
this module: the agent's node conditions and taint (one condition per class, the taint's
value the failing class), and `nodecheck npd --class ...`, the node-problem-detector
plugin (one NPD rule per class, the same condition types).

Condition types follow Kubernetes' convention for node conditions, CamelCase
(k8s.io/api/core/v1 NodeCondition; node-problem-detector's config/kernel-monitor.json
"KernelDeadlock"), prefixed with the project so they never collide with the kubelet's
or another detector's.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from nodecheck.checks.result import FaultClass, Status

CONDITION_TYPES: dict[FaultClass, str] = {
    FaultClass.GPU_HARDWARE: "NodecheckGpuHardware",
    FaultClass.GPU_PERFORMANCE: "NodecheckGpuPerformance",
    FaultClass.NODE_CONFIG: "NodecheckNodeConfig",
}


def condition_type(fault_class: FaultClass) -> str:
    """The node condition's type for a class ("NodecheckGpuHardware")."""
    return CONDITION_TYPES[fault_class]


def checks_of(fault_class: FaultClass) -> tuple[str, ...]:
    """The checks and benchmarks that declare this class, sorted by name."""
    from nodecheck.checks.registry import load_benchmarks, load_checks

    declared = {**load_checks(), **load_benchmarks()}
    return tuple(sorted(name for name, c in declared.items() if c.fault_class is fault_class))


class ClassVerdict(str, enum.Enum):
    """A class's verdict from its checks' findings, the same for the agent's condition
    (True, Unknown, False) and `nodecheck npd`'s exit status (1, 2, 0)."""

    FAILING = "failing"
    UNDETERMINED = "undetermined"
    HEALTHY = "healthy"


def class_verdict(statuses: Iterable[Status]) -> ClassVerdict:
    """FAILING when a finding fails; else UNDETERMINED when one could not determine
    (`error`) or nothing was judged (no finding, or only `skip`: absence is never a
    pass); else HEALTHY (a warning is not a fault of the class)."""
    seen = set(statuses)
    if Status.FAIL in seen:
        return ClassVerdict.FAILING
    if Status.ERROR in seen or not seen - {Status.SKIP}:
        return ClassVerdict.UNDETERMINED
    return ClassVerdict.HEALTHY
