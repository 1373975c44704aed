"""NVLink fabric: each GPU's registration with the fabric, and the Fabric Manager daemon.

On an NVSwitch system (HGX/DGX A100, H100, H200, B200: the NVSwitches on the node's PCI
bus) NVIDIA Fabric Manager configures the NVSwitches and registers every GPU with the
fabric; until it has, CUDA on those GPUs fails to initialise or NVLink peer-to-peer is
off and every collective falls back (Fabric Manager user guide,
docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/). Its daemon,
nv-fabricmanager, must run and match the driver's version. On a GB200 NVL compute tray
the NVSwitches are in the rack's switch trays and their Fabric Manager runs there; each
GPU's registration still shows in its fabric info.

Each GPU's state (nvml.h, nvmlDeviceGetGpuFabricInfoV) goes NOT_STARTED -> IN_PROGRESS ->
COMPLETED, and its status says whether registration succeeded. The judging follows
NVIDIA's NVSentinel (health-monitors/system-services-monitor, fabric_state_check.py):
not started is Fabric Manager not running (or not yet at this GPU); in progress and
staying there is registration stuck (github.com/NVIDIA/NVSentinel/issues/889: with Fabric
Manager dead the state stays "In Progress" for good); completed with an error status is a
failed registration. A GPU off the fabric at one reading warns (the service may not have
started yet); at two readings a while apart it fails. A GPU without fabric support (a
PCIe card, a pre-Hopper GPU: NVML answers NOT_SUPPORTED, or the state NOT_SUPPORTED) has
nothing to judge: `skip`.

A GPU stuck in progress, or whose registration failed, while this node's Fabric Manager
runs is the GPU's own fault (class gpu-hardware, a GPU reset: the node is taken out of
service). Fabric Manager not running, or running without having started a GPU, is a
service of the node's (class node-config, fix-node-config: start or restart it, no
reset), and on an NVLink domain (GB200) the registration is the rack's Fabric Manager's
on its switch trays (node-config, investigate): neither is this node's hardware, so
neither drains it.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import PartUnavailableError
from nodecheck.checks.node.gpu import (
    FABRIC_COMPLETED,
    FABRIC_IN_PROGRESS,
    FABRIC_NOT_STARTED,
    FABRIC_NOT_SUPPORTED,
    GpuFabric,
    GpuReading,
)
from nodecheck.checks.node.processes import DaemonProcesses
from nodecheck.checks.per_gpu import (
    GPU_LABELS,
    Verdict,
    nvml_unavailable_result,
    per_gpu_results,
)
from nodecheck.checks.registry import register
from nodecheck.checks.result import (
    Action,
    FaultClass,
    MetricSpec,
    Result,
    Sample,
    Status,
)

FABRIC_STATE = MetricSpec(
    "nodecheck_gpu_fabric_state",
    "gauge",
    "The GPU's NVLink fabric registration state (NVML_GPU_FABRIC_STATE_*: 0 not supported, "
    "1 not started, 2 in progress, 3 completed)",
    GPU_LABELS,
)
FABRIC_STATUS = MetricSpec(
    "nodecheck_gpu_fabric_status",
    "gauge",
    "The nvmlReturn_t of the GPU's NVLink fabric registration (0: success), once completed",
    GPU_LABELS,
)
MANAGER_PROCESSES = MetricSpec(
    "nodecheck_fabric_manager_processes",
    "gauge",
    "nv-fabricmanager processes running on a node with NVSwitches on its PCI bus",
)

STATE_NAMES = {
    FABRIC_NOT_SUPPORTED: "not supported",
    FABRIC_NOT_STARTED: "not started",
    FABRIC_IN_PROGRESS: "in progress",
    FABRIC_COMPLETED: "completed",
}
# nvmlReturn_t names of the statuses a failed registration may carry (nvml.h); others are
# shown by number.
STATUS_NAMES = {
    0: "NVML_SUCCESS",
    3: "NVML_ERROR_NOT_SUPPORTED",
    7: "NVML_ERROR_INSUFFICIENT_SIZE",
    10: "NVML_ERROR_TIMEOUT",
    23: "NVML_ERROR_INSUFFICIENT_RESOURCES",
    27: "NVML_ERROR_NOT_READY",
    999: "NVML_ERROR_UNKNOWN",
}
LOG = "/var/log/fabricmanager.log"
# The subject of the Fabric Manager result: its daemon, apart from the node's NVML result.
MANAGER_SUBJECT = "nv-fabricmanager"
START_MANAGER = (
    "start Fabric Manager (systemctl enable --now nvidia-fabricmanager) and check that its "
    f"version matches the driver's (nv-fabricmanager --version, nvidia-smi) and {LOG}; the "
    "GPUs register within a minute of its start"
)
RESTART_MANAGER = (
    f"Fabric Manager runs but has not registered this GPU: read {LOG}, check that its "
    "version matches the driver's, restart it (systemctl restart nvidia-fabricmanager); if "
    "the GPU stays unregistered, drain the node and reset the GPUs (nvidia-smi -r) or reboot"
)
RESET = (
    f"drain the node, read {LOG}, then reset the GPU (nvidia-smi -r -i {{bus_id}}) or reboot "
    "the node; Fabric Manager registers it again after the reset"
)
# On an NVLink domain (GB200 NVL) this node has no NVSwitch: the Fabric Manager that
# registers its GPUs runs on the rack's NVLink switch trays.
DOMAIN_REMEDY = (
    "this node's NVSwitches are in the rack's NVLink switch trays: check the NVLink "
    "domain's Fabric Manager there and this tray's NVLink cables, then reset the GPU "
    "(nvidia-smi -r -i {bus_id}) or reboot the node"
)


def status_name(code: int) -> str:
    return STATUS_NAMES.get(code, f"nvmlReturn_t {code}")


def manager_running(manager: DaemonProcesses | None) -> bool | None:
    """Whether Fabric Manager runs; None where it is not known (no NVSwitch on the bus, so
    not this node's to run, or the node's processes are not all visible)."""
    if manager is None or manager.pids is None:
        return None
    return bool(manager.pids)


def judge_fabric(
    gpu: GpuReading,
    previous: GpuReading | None,
    *,
    nvswitches: int,
    manager: DaemonProcesses | None,
) -> Verdict:
    """One GPU's fabric registration; `nvswitches` on the node's bus and the Fabric
    Manager daemons found (None where they were not looked for)."""
    fabric = gpu.fabric
    if fabric is None or fabric.state == FABRIC_NOT_SUPPORTED:
        return Verdict("no NVLink fabric on this GPU", not_applicable=True)
    labels = gpu.labels()
    verdict = Verdict(_registered(fabric))
    verdict.details.update(
        {
            "state": STATE_NAMES.get(fabric.state, str(fabric.state)),
            "status": status_name(fabric.status),
            "clique_id": fabric.clique_id,
            "cluster_uuid": fabric.cluster_uuid,
        }
    )
    if fabric.health_mask is not None:
        verdict.details["health_mask"] = fabric.health_mask
    verdict.samples.append(Sample(FABRIC_STATE, fabric.state, labels))
    if fabric.state == FABRIC_COMPLETED:
        verdict.samples.append(Sample(FABRIC_STATUS, fabric.status, labels))
    bus_id = gpu.bus_id or gpu.index
    if nvswitches == 0:
        # An NVLink domain's registration is the rack's Fabric Manager's, on its switch
        # trays: not this node's own evidence, so it takes nothing out of service here.
        verdict.fault_class = FaultClass.NODE_CONFIG
    if fabric.state == FABRIC_COMPLETED:
        if fabric.status != 0:
            summary = f"NVLink fabric registration failed: {status_name(fabric.status)}"
            if nvswitches == 0:
                verdict.add(
                    Status.FAIL, summary, DOMAIN_REMEDY.format(bus_id=bus_id), Action.INVESTIGATE
                )
            else:
                verdict.add(Status.FAIL, summary, RESET.format(bus_id=bus_id))
        return verdict
    state = STATE_NAMES.get(fabric.state, f"state {fabric.state}")
    summary = f"not registered with the NVLink fabric ({state})"
    # Registration takes seconds once Fabric Manager runs, but the agent or a boot-time
    # health check may read the GPUs before the service has started: one reading warns,
    # and two a while apart fail. NVSentinel (health-monitors/system-services-monitor,
    # fabric_state_check.py) likewise waits for three polls in progress before it flags.
    before = previous.fabric if previous is not None else None
    lasting = (
        previous is not None
        and before is not None
        and before.state in (FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS)
        and gpu.read_at - previous.read_at >= STUCK_AFTER_S
    )
    if lasting:
        assert previous is not None
        seconds = gpu.read_at - previous.read_at
        summary += f", and {seconds:.0f} s before: stuck"
        status = Status.FAIL
    else:
        summary += "; it fails if still so at the next reading"
        status = Status.WARN
    running = manager_running(manager)
    if running is False:
        summary += "; Fabric Manager (nv-fabricmanager) is not running"
        verdict.fault_class = FaultClass.NODE_CONFIG  # a service down, not the GPU
        verdict.add(status, summary, START_MANAGER, Action.FIX_NODE_CONFIG)
    elif nvswitches == 0:
        verdict.add(status, summary, DOMAIN_REMEDY.format(bus_id=bus_id), Action.INVESTIGATE)
    elif fabric.state == FABRIC_IN_PROGRESS:
        # With Fabric Manager running, a GPU stuck in progress is only started over by a
        # reset: the GPU's own state, the check's class and action.
        verdict.add(status, summary, RESET.format(bus_id=bus_id))
    else:
        # Not started while Fabric Manager runs (or cannot be seen): the service's to do.
        verdict.fault_class = FaultClass.NODE_CONFIG
        remedy = RESTART_MANAGER if running is True else START_MANAGER
        verdict.add(status, summary, remedy, Action.FIX_NODE_CONFIG)
    return verdict


def _registered(fabric: GpuFabric) -> str:
    if fabric.clique_id or fabric.cluster_uuid != "00000000-0000-0000-0000-000000000000":
        return (
            f"registered with the NVLink fabric (cluster {fabric.cluster_uuid}, "
            f"clique {fabric.clique_id})"
        )
    return "registered with the NVLink fabric"


def judge_manager(manager: DaemonProcesses, nvswitches: int, unregistered: int) -> Result:
    """Fabric Manager on a node with `nvswitches` NVSwitches on its bus, `unregistered` of
    whose GPUs are off the fabric."""
    details: dict[str, object] = {"nvswitches": nvswitches, "command": manager.command}
    if manager.pids is None:
        details["cause"] = "processes hidden"
        return Result(
            Status.SKIP,
            MANAGER_SUBJECT,
            f"cannot tell whether Fabric Manager runs: {manager.problem}",
            details=details,
        )
    details["pids"] = list(manager.pids)
    samples = (Sample(MANAGER_PROCESSES, len(manager.pids)),)
    if manager.pids:
        pids = ", ".join(str(pid) for pid in manager.pids)
        summary = f"Fabric Manager runs (pid {pids}) for {nvswitches} NVSwitches"
        return Result(Status.OK, MANAGER_SUBJECT, summary, details=details, samples=samples)
    summary = f"Fabric Manager (nv-fabricmanager) is not running; {nvswitches} NVSwitches"
    if unregistered:
        summary += f", {unregistered} GPU(s) off the NVLink fabric"
        status = Status.FAIL
    else:
        # The GPUs registered and keep working, but nothing monitors the fabric, and a GPU
        # reset or an NVLink error cannot be recovered until it runs again (user guide).
        summary += "; the GPUs' registration holds until a GPU reset or an NVLink error"
        status = Status.WARN
    return Result(
        status,
        MANAGER_SUBJECT,
        summary,
        START_MANAGER,
        details,
        samples,
        action=Action.FIX_NODE_CONFIG,
        fault_class=FaultClass.NODE_CONFIG,  # a service down: the node's configuration
    )


# The reads this check relies on; one that fails is reported, never passed over.
QUERIES = ("fabric",)
# How far apart two readings of a GPU off the fabric must be for it to fail (the agent
# reads the GPUs once a minute).
STUCK_AFTER_S = 45.0


def _nvswitch_count(ctx: CheckContext) -> tuple[int, str]:
    """The NVSwitches on the node's bus, or 0 and why the inventory could not say: the
    same words whether it failed now (live) or when a capture was taken."""
    try:
        return len(ctx.inventory.nvswitches), ""
    except PartUnavailableError as err:
        return 0, err.unread.reason
    except Exception as err:  # a live read that raised; a capture holds it as Unread
        return 0, f"reading inventory failed: {type(err).__name__}: {err}"


@register(
    "gpu_fabric",
    fault_class=FaultClass.GPU_HARDWARE,
    action=Action.RESET_GPU,
    interval_s=60,
    timeout_s=30,
    needs=("gpus", "inventory", "fabric_manager"),
)
def check_gpu_fabric(ctx: CheckContext) -> Iterator[Result]:
    """Each GPU's NVLink fabric registration, and Fabric Manager where NVSwitches are."""
    nvswitches, unknown = _nvswitch_count(ctx)
    if unknown:
        # The GPUs are still judged on NVML's word (gpu_count falls back likewise); only
        # whether Fabric Manager is this node's to run cannot be told.
        yield Result(
            Status.ERROR,
            "nv-fabricmanager",
            f"cannot tell whether NVSwitches are on the PCI bus ({unknown}): Fabric Manager "
            "not judged",
        )
    # Fabric Manager is this node's to run only where its NVSwitches are on its bus.
    manager: DaemonProcesses | None = ctx.part("fabric_manager") if nvswitches else None
    unregistered = 0

    def judge(gpu: GpuReading, previous: GpuReading | None) -> Verdict:
        nonlocal unregistered
        verdict = judge_fabric(gpu, previous, nvswitches=nvswitches, manager=manager)
        if gpu.fabric is not None and gpu.fabric.state in (FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS):
            unregistered += 1
        return verdict

    yield from per_gpu_results(ctx, judge, QUERIES)
    # Judged beside the GPUs' registration, so only where NVML answers: without it no GPU
    # can register at all, and gpu_count says why.
    if manager is not None and nvml_unavailable_result(ctx) is None:
        yield judge_manager(manager, nvswitches, unregistered)
