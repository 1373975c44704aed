"""GPU state: temperature, power limit, persistence mode, recovery action, driver, processes.

- Temperature within 5 °C of the slowdown threshold warns; at it, the GPU is
  slowing itself down: fail.
- An enforced power limit below the default caps every kernel (someone ran
  `nvidia-smi -pl`): a quiet cause of a slow node.
- Persistence mode off makes every CUDA start re-initialise the GPU (seconds)
  and lets settings like the power limit reset when no process holds the GPU.
- The recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, Hopper and later)
  is the driver's own "what to do now"; DCGM's health watch missed it (#263).
- The NVML library and the loaded kernel module must be one driver version,
  and GPUs of one model should run one VBIOS.
- Processes using each GPU are listed (pid, name, memory): the benchmarks use
  this to stay away from running jobs.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.gpu import GpuReading
from nodecheck.checks.node.nvidia_driver import NvidiaDriver
from nodecheck.checks.node.processes import GpuProcessNames
from nodecheck.checks.per_gpu import GPU_LABELS, Verdict, nvml_unavailable_result, per_gpu_results
from nodecheck.checks.registry import register
from nodecheck.checks.result import NODE, Action, FaultClass, MetricSpec, Result, Sample, Status


def _gauge(name: str, help_text: str) -> MetricSpec:
    return MetricSpec(name, "gauge", help_text, GPU_LABELS)


TEMPERATURE = _gauge(
    "nodecheck_gpu_temperature_celsius", "GPU temperature (nvmlDeviceGetTemperatureV)"
)
SLOWDOWN = _gauge(
    "nodecheck_gpu_slowdown_temperature_celsius",
    "Temperature at which the GPU slows down (nvmlDeviceGetTemperatureThreshold)",
)
POWER = _gauge("nodecheck_gpu_power_usage_watts", "Power draw (nvmlDeviceGetPowerUsage)")
POWER_LIMIT = _gauge(
    "nodecheck_gpu_power_limit_watts", "Enforced power limit (nvmlDeviceGetEnforcedPowerLimit)"
)
DEFAULT_POWER_LIMIT = _gauge(
    "nodecheck_gpu_default_power_limit_watts",
    "Default power limit (nvmlDeviceGetPowerManagementDefaultLimit)",
)
SM_CLOCK = _gauge(
    "nodecheck_gpu_sm_clock_hertz", "Current SM clock (nvmlDeviceGetClockInfo, NVML_CLOCK_SM)"
)
MAX_SM_CLOCK = _gauge(
    "nodecheck_gpu_max_sm_clock_hertz",
    "Maximum SM clock (nvmlDeviceGetMaxClockInfo, NVML_CLOCK_SM)",
)
PERSISTENCE = _gauge(
    "nodecheck_gpu_persistence_mode_enabled",
    "1 when persistence mode is on (nvmlDeviceGetPersistenceMode)",
)
RECOVERY = _gauge(
    "nodecheck_gpu_recovery_action",
    "The driver's recovery action: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, "
    "4 drain and reset, 5 recover IMEX domain, 6 bus reset, 7 system reboot",
)
PROCESSES = _gauge(
    "nodecheck_gpu_compute_processes",
    "Compute processes on the GPU (nvmlDeviceGetComputeRunningProcesses)",
)
MEMORY_USED = _gauge("nodecheck_gpu_memory_used_bytes", "Memory in use (nvmlDeviceGetMemoryInfo)")
MEMORY_TOTAL = _gauge("nodecheck_gpu_memory_total_bytes", "Memory size (nvmlDeviceGetMemoryInfo)")
UTILIZATION = _gauge(
    "nodecheck_gpu_utilization_ratio",
    "Share of the last sample period a kernel ran (nvmlDeviceGetUtilizationRates)",
)

TEMPERATURE_MARGIN_C = 5
# nvmlDeviceGpuRecoveryAction_t (nvml.h) -> what the operator does, and its action.
RECOVERY_ACTIONS: dict[int, tuple[str, str, Action]] = {
    1: ("a GPU reset", "reset the GPU when idle (nvidia-smi -r -i {bus_id})", Action.RESET_GPU),
    2: ("a node reboot", "drain and reboot the node", Action.REBOOT),
    3: ("draining peer-to-peer traffic", "drain the node, then reset the GPU", Action.RESET_GPU),
    4: ("a drain and GPU reset", "drain the node and reset the GPU", Action.RESET_GPU),
    5: (
        "recovering the IMEX domain",
        "restart the IMEX domain (nvidia-imex) on its nodes",
        Action.FIX_NODE_CONFIG,
    ),
    6: (
        "a PCIe bus reset",
        "drain the node and reset the GPU's PCIe bus, or reboot",
        Action.RESET_GPU,
    ),
    7: ("a system reboot", "drain and reboot the node", Action.REBOOT),
}


def recovery_action(code: int | None) -> Action | None:
    """The action the driver's recovery-action field asks for; None for none (0) or an
    unread field; investigate for a code nvml.h does not name yet."""
    if code is None or code == 0:
        return None
    return RECOVERY_ACTIONS[code][2] if code in RECOVERY_ACTIONS else Action.INVESTIGATE


def judge_state(gpu: GpuReading, _previous: GpuReading | None, ctx: CheckContext) -> Verdict:
    labels = gpu.labels()
    verdict = Verdict("state normal")
    for spec, value in (
        (TEMPERATURE, gpu.temperature_c),
        (SLOWDOWN, gpu.slowdown_c),
        (POWER, gpu.power_w),
        (POWER_LIMIT, gpu.power_limit_w),
        (DEFAULT_POWER_LIMIT, gpu.default_power_limit_w),
        (SM_CLOCK, None if gpu.sm_clock_mhz is None else gpu.sm_clock_mhz * 1e6),
        (MAX_SM_CLOCK, None if gpu.max_sm_clock_mhz is None else gpu.max_sm_clock_mhz * 1e6),
        (PERSISTENCE, None if gpu.persistence_mode is None else int(gpu.persistence_mode)),
        (RECOVERY, gpu.recovery_action),
        (MEMORY_USED, gpu.memory_used),
        (MEMORY_TOTAL, gpu.memory_total),
        (UTILIZATION, None if gpu.utilization_pct is None else gpu.utilization_pct / 100),
        (PROCESSES, None if gpu.processes is None else len(gpu.processes)),
    ):
        if value is not None:
            verdict.samples.append(Sample(spec, value, labels))
    _judge_temperature(gpu, verdict)
    _judge_power(gpu, verdict)
    if gpu.persistence_mode is False:
        verdict.add(
            Status.WARN,
            "persistence mode is off",
            "run nvidia-persistenced (systemctl enable --now nvidia-persistenced)",
            Action.FIX_NODE_CONFIG,
        )
    if gpu.recovery_action in RECOVERY_ACTIONS:
        what, remedy, action = RECOVERY_ACTIONS[gpu.recovery_action]
        summary = f"the driver asks for {what}"
        verdict.add(Status.FAIL, summary, remedy.format(bus_id=gpu.bus_id), action)
    elif gpu.recovery_action not in (None, 0):
        verdict.add(
            Status.FAIL,
            f"the driver asks for recovery action {gpu.recovery_action}",
            "see NVIDIA's GPU error recovery documentation for this action",
            Action.INVESTIGATE,
        )
    # The names are read only for a GPU with processes: a node without any never needs them.
    names: GpuProcessNames | None = ctx.part("gpu_process_names") if gpu.processes else None
    processes = [
        {
            "pid": p.pid,
            "name": names.name_of(p.pid) if names is not None else "?",
            "used_memory_bytes": p.used_memory_bytes,
        }
        for p in gpu.processes or []
    ]
    verdict.details.update(
        {
            "uuid": gpu.uuid,
            "model": gpu.name,
            "temperature_c": gpu.temperature_c,
            "power_w": gpu.power_w,
            "power_limit_w": gpu.power_limit_w,
            "processes": processes,
        }
    )
    if processes:
        shown = ", ".join(f"{p['name']} ({p['pid']})" for p in processes)
        verdict.add(Status.OK, f"in use by {shown}")
    return verdict


def _judge_temperature(gpu: GpuReading, verdict: Verdict) -> None:
    temp, slowdown = gpu.temperature_c, gpu.slowdown_c
    if temp is None or slowdown is None:
        return
    cooling = "check the GPU's cooling: fans, airflow, inlet temperature, heatsink contact"
    inspect = Action.INSPECT_HARDWARE
    if temp >= slowdown:
        summary = f"{temp} °C, at the {slowdown} °C slowdown threshold"
        verdict.add(Status.FAIL, summary, cooling, inspect)
    elif temp >= slowdown - TEMPERATURE_MARGIN_C:
        verdict.add(
            Status.WARN,
            f"{temp} °C, within {TEMPERATURE_MARGIN_C} °C of slowdown ({slowdown} °C)",
            cooling,
            inspect,
        )


def _judge_power(gpu: GpuReading, verdict: Verdict) -> None:
    limit, default = gpu.power_limit_w, gpu.default_power_limit_w
    if limit is not None and default is not None and limit < default:
        verdict.add(
            Status.WARN,
            f"power limit lowered to {limit:.0f} W from the default {default:.0f} W",
            f"restore it: nvidia-smi -i {gpu.index} -pl {default:.0f}",
            Action.FIX_NODE_CONFIG,
        )


def _node_result(ctx: CheckContext) -> Result:
    snapshot = ctx.gpus.snapshot
    verdict = Verdict(f"driver {snapshot.driver_version or 'version unknown'}")
    verdict.details["driver_version"] = snapshot.driver_version
    if snapshot.driver_version is None:
        verdict.add(
            Status.ERROR,
            "NVML did not report its driver version (nvmlSystemGetDriverVersion): cannot "
            "compare it with the loaded kernel module",
        )
    driver: NvidiaDriver = ctx.part("nvidia_driver")
    module = driver.module_version
    if driver.module_error:
        verdict.add(Status.ERROR, f"cannot read the kernel module version: {driver.module_error}")
    verdict.details["kernel_module_version"] = module
    if module is not None and snapshot.driver_version and module != snapshot.driver_version:
        verdict.add(
            Status.FAIL,
            f"NVML library {snapshot.driver_version} but kernel module {module} loaded",
            "a driver upgrade is half done: reboot the node",
            Action.REBOOT,
        )
    by_model: dict[str, set[str]] = {}
    for gpu in snapshot.gpus:
        if gpu.vbios:
            by_model.setdefault(gpu.model, set()).add(gpu.vbios)
    for model, versions in sorted(by_model.items()):
        if len(versions) > 1:
            verdict.add(
                Status.WARN,
                f"{model} GPUs run different VBIOS versions: {', '.join(sorted(versions))}",
                "flash one VBIOS version on all GPUs (the vendor's firmware bundle)",
                Action.FIX_NODE_CONFIG,
            )
    return verdict.result(NODE)


# The reads this check relies on; one that fails is reported, never passed over.
QUERIES = (
    "name",
    "uuid",
    "vbios",
    "memory",
    "temperature",
    "temperature_threshold",
    "power",
    "power_limit",
    "power_limit_default",
    "persistence_mode",
    "utilization",
    "processes",
    "field_values",
    "recovery_action",
)


@register(
    "gpu_state",
    fault_class=FaultClass.GPU_HARDWARE,
    action=Action.INVESTIGATE,
    interval_s=60,
    timeout_s=30,
    needs=("gpus", "nvidia_driver", "gpu_process_names"),
)
def check_gpu_state(ctx: CheckContext) -> Iterator[Result]:
    """Temperature, power limit, persistence, recovery action, driver and processes per GPU."""
    if nvml_unavailable_result(ctx) is None:
        yield _node_result(ctx)
    yield from per_gpu_results(ctx, lambda gpu, previous: judge_state(gpu, previous, ctx), QUERIES)
