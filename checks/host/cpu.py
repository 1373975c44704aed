"""CPU frequency governor and SMT, from `<sysfs>/devices/system/cpu`.

A governor other than `performance` lets cores clock down between the short
bursts of work a training step gives the host (data loading, kernel launch):
launch latency and input pipelines suffer. SMT state is reported for the
tuning of core sets; either setting can be right.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.cpu import CpuGovernors
from nodecheck.checks.node.cpulist import format_cpulist
from nodecheck.checks.registry import register
from nodecheck.checks.result import NODE, Action, FaultClass, MetricSpec, Result, Sample, Status

SMT_ACTIVE = MetricSpec(
    "nodecheck_cpu_smt_active",
    "gauge",
    "1 when simultaneous multithreading is active (<sysfs>/devices/system/cpu/smt/active)",
)
NON_PERFORMANCE = MetricSpec(
    "nodecheck_cpu_governor_not_performance",
    "gauge",
    "Online CPUs whose cpufreq governor is not performance (cpuN/cpufreq/scaling_governor)",
)


FIRST_SHOWN = 4
# The kinds of per-CPU problem by the suffix of their name, in the order they are told.
PROBLEM_KINDS = {
    "": "topology",
    " online": "online state (counted online)",
    " governor": "cpufreq governor",
}


def problem_results(problems: dict[str, str]) -> Iterator[Result]:
    """One error per kind of problem, not one per CPU: "cpu7" problems (a topology file)
    and "cpu7 governor" problems are each folded into one finding with their count, the
    first CPUs and the first message (which names the file). The order of the findings
    depends on the problems, not on the order of the dictionary (a capture's is sorted)."""
    per_cpu: dict[str, list[tuple[int, str]]] = {what: [] for what in PROBLEM_KINDS.values()}
    for name, problem in sorted(problems.items()):
        match = re.fullmatch(r"cpu(\d+)( governor| online)?", name)
        if match is None:
            yield Result(Status.ERROR, NODE, f"cannot read CPU topology ({name}): {problem}")
            continue
        what = PROBLEM_KINDS[match.group(2) or ""]
        per_cpu[what].append((int(match.group(1)), problem))
    for what, found in per_cpu.items():
        if not found:
            continue
        found.sort()
        cpus = [number for number, _ in found]
        shown = ", ".join(f"cpu{number}" for number in cpus[:FIRST_SHOWN])
        more = f" and {len(cpus) - FIRST_SHOWN} more" if len(cpus) > FIRST_SHOWN else ""
        yield Result(
            Status.ERROR,
            NODE,
            f"cannot read the {what} of {len(cpus)} CPU(s) ({shown}{more}): {found[0][1]}",
            details={"cpus": format_cpulist(cpus), "first_problem": found[0][1]},
        )


@register(
    "cpu",
    fault_class=FaultClass.NODE_CONFIG,
    action=Action.FIX_NODE_CONFIG,
    interval_s=3600,
    timeout_s=10,
    needs=("inventory", "cpu_governors"),
)
def check_cpu(ctx: CheckContext) -> Iterator[Result]:
    """CPU frequency governor and SMT state."""
    topology = ctx.inventory.cpu
    read: CpuGovernors = ctx.part("cpu_governors")
    yield from problem_results({**topology.problems, **read.problems})
    if not topology.cpus:
        if not topology.problems:
            yield Result(Status.ERROR, NODE, "no online CPU found in sysfs")
        return
    # Counted in CPU order: of governors on as many CPUs, most_common() names first the one
    # met first, whatever the order of the facts' dictionary.
    governors = Counter(read.governors[number] for number in sorted(read.governors))
    total = len(topology.cpus)
    if not governors:
        yield Result(
            Status.SKIP,
            NODE,
            "no cpufreq governor: CPU frequency is managed by the firmware or the hypervisor",
        )
    else:
        slow = sum(count for governor, count in governors.items() if governor != "performance")
        shown = ", ".join(f"{governor} on {count}" for governor, count in governors.most_common())
        sample = Sample(NON_PERFORMANCE, slow)
        if slow:
            yield Result(
                Status.WARN,
                NODE,
                f"{slow} of {total} CPUs do not use the performance governor ({shown})",
                "sudo cpupower frequency-set -g performance (persist it with your provisioning, "
                "or the tuned profile throughput-performance)",
                {"governors": dict(governors)},
                (sample,),
            )
        else:
            yield Result(
                Status.OK,
                NODE,
                f"all {total} CPUs use the performance governor",
                details={"governors": dict(governors)},
                samples=(sample,),
            )
    if topology.notes:
        yield Result(
            Status.OK,
            NODE,
            "CPU topology as read, with what was inferred: " + "; ".join(topology.notes),
            details={"notes": list(topology.notes)},
        )
    threads = topology.threads_per_core
    state = {True: "on", False: "off", None: "unknown"}[topology.smt_active]
    if topology.smt_active is None:
        state = "on" if threads > 1 else "off"
    yield Result(
        Status.OK,
        NODE,
        f"SMT {state}: {len(topology.packages)} socket(s), {len(topology.cores)} cores, "
        f"{topology.threads_per_core_range} thread(s) per core",
        details={
            "smt_control": topology.smt_control,
            "smt_active": topology.smt_active,
            "sockets": len(topology.packages),
            "cores": len(topology.cores),
            "threads_per_core": threads,
        },
        samples=(Sample(SMT_ACTIVE, 1 if state == "on" else 0),),
    )
