"""The classes of fault nodecheck reports to Kubernetes, and which check belongs to which.

One table, used by both ways a cluster hears of a fault: the agent's node conditions
and taint (one condition per class, the taint's value the failing class), and
`nodecheck npd --class ...`, the node-problem-detector plugin (one NPD rule per class,
the same condition types). Keeping it here is what makes a check's class the same in
both; tests/kubernetes/test_npd.py fails when a registered check or benchmark has no
class.

The classes say what an operator does about the node:
- gpu-hardware: a GPU, its memory, its links or the NVSwitches are broken or missing;
  the node needs a reset, a reboot or an RMA (NVIDIA's XID catalog's actions).
- gpu-performance: the GPUs work but slower than they should (throttled clocks,
  links below their rate, benchmarks below the node's peers or baseline); jobs run,
  slowly, and a collective job runs at its slowest rank's pace.
- node-config: the node's settings (NUMA, ACS, CPU governor, NCCL and torch
  variables) hurt or break jobs; fixed by configuration, not by hardware.

Condition types follow Kubernetes' convention for node conditions, CamelCase
(k8s.io/api/core/v1 NodeCondition; node-problem-detector's config/kernel-monitor.json
"KernelDeadlock"), prefixed with the project so they never collide with the kubelet's
or another detector's.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from nodecheck.checks.result import Status


class FaultClass(str, enum.Enum):
    GPU_HARDWARE = "gpu-hardware"
    GPU_PERFORMANCE = "gpu-performance"
    NODE_CONFIG = "node-config"

    @property
    def condition_type(self) -> str:
        """The node condition's type for this class ("NodecheckGpuHardware")."""
        return CONDITION_TYPES[self]


CONDITION_TYPES: dict[FaultClass, str] = {
    FaultClass.GPU_HARDWARE: "NodecheckGpuHardware",
    FaultClass.GPU_PERFORMANCE: "NodecheckGpuPerformance",
    FaultClass.NODE_CONFIG: "NodecheckNodeConfig",
}

# Every registered check and benchmark (checks/registry.py) and its class.
CLASS_OF_CHECK: dict[str, FaultClass] = {
    # GPUs missing, fallen off the bus, XIDs, ECC/row remapping, a GPU in a bad state
    # (recovery action pending, too hot), PCIe replays, NVLinks down, NVSwitch SXids.
    "gpu_count": FaultClass.GPU_HARDWARE,
    "gpu_xid": FaultClass.GPU_HARDWARE,
    "gpu_memory_errors": FaultClass.GPU_HARDWARE,
    "gpu_state": FaultClass.GPU_HARDWARE,
    "gpu_pcie": FaultClass.GPU_HARDWARE,
    "gpu_nvlink": FaultClass.GPU_HARDWARE,
    "nvswitch_sxid": FaultClass.GPU_HARDWARE,
    # Slower than it should be: throttling, PCIe links trained below their width or
    # speed, RDMA ports down, below the rail rate or erroring (the GPUs' collectives
    # run over them), and the benchmarks.
    "gpu_throttle": FaultClass.GPU_PERFORMANCE,
    "pcie_link": FaultClass.GPU_PERFORMANCE,
    "rdma_ports": FaultClass.GPU_PERFORMANCE,
    "matmul": FaultClass.GPU_PERFORMANCE,
    "allreduce": FaultClass.GPU_PERFORMANCE,
    "h2d": FaultClass.GPU_PERFORMANCE,
    # Settings.
    "cpu": FaultClass.NODE_CONFIG,
    "numa": FaultClass.NODE_CONFIG,
    "pcie_acs": FaultClass.NODE_CONFIG,
    "nccl_env": FaultClass.NODE_CONFIG,
    "torch_alloc": FaultClass.NODE_CONFIG,
}


class UnclassifiedCheckError(KeyError):
    """A check the table does not name (a new check without a class)."""


def class_of(check: str) -> FaultClass:
    """The class of a check by its registered name; UnclassifiedCheckError if it has none."""
    try:
        return CLASS_OF_CHECK[check]
    except KeyError:
        raise UnclassifiedCheckError(check) from None


def checks_of(fault_class: FaultClass) -> tuple[str, ...]:
    """The checks and benchmarks of a class, sorted by name."""
    return tuple(sorted(name for name, cls in CLASS_OF_CHECK.items() if cls is fault_class))


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
