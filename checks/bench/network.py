"""`nodecheck bench network` around its ranks: gate, read the node, run the child, record.

One `nodecheck` process per rank (srun's tasks, torchrun's workers). Each, without torch:
gates its node (checks/bench/gate.py, the node benchmarks' gate: a maintenance file, a
GPU in use or busy through the idle window), reads what its node should reach (its
compute NICs' live rate, checks/node/nic_roles.py: the rails NCCL uses) and how much
memory the payload may take (its GPU's free memory, or the node's MemAvailable), and
starts the torch child (`python -m nodecheck.checks.bench.child`, child/network.py)
under a deadline with all of that in its spec. The ranks share every node's verdict
before measuring, so a refused node stops them all.

The child's report comes back the same on every rank; the child's lowest rank on each
node has written that node's part of it (network_record.py) before the ranks' last
barrier. A run that could not measure writes nothing: the previous record ages.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping
from typing import Any

from nodecheck.checks.bench.child_runner import run_child
from nodecheck.checks.bench.gate import check_gate
from nodecheck.checks.config import BenchOptions, is_default_state_dir
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.gpu import read_gpu_activity
from nodecheck.checks.node.nic_roles import NicRole, nic_facts, nic_roles
from nodecheck.checks.node.numa import read_memory_available
from nodecheck.checks.node.nvml import NvmlHungError, NvmlUnavailableError
from nodecheck.checks.record import record
from nodecheck.checks.rules.network_sweep import MAX_ROUNDS

EXIT_OK, EXIT_SLOW, EXIT_UNMEASURED = 0, 1, 2
# torch's import, and the slack a loaded machine needs around the measured time.
STARTUP_S = 120.0
# The port under srun without MASTER_PORT: one per job step, the same on every task.
SRUN_PORT_BASE, SRUN_PORT_SPAN = 20000, 20000
SCONTROL_TIMEOUT_S = 10.0


@record
class NetworkRun:
    """What the command asked for beyond the gate's BenchOptions."""

    payloads: tuple[int, ...]  # bytes; the largest is judged and swept
    sweep: str  # "auto", "always", "never"
    rendezvous_timeout_s: float
    node: str


@record
class NetworkOutcome:
    """The child's report and this rank's place in it, or the one line why not."""

    report: dict[str, Any] | None
    rank: int | None = None
    record_error: str | None = None  # this node's record could not be written: why
    error: str | None = None


def node_name(given: str | None) -> str:
    """--node-name, else the kernel's host name: what the node's agent compares the record
    with (checks/host/network_sweep.py), which Slurm's NodeName need not be (NodeHostname
    in slurm.conf)."""
    return given or socket.gethostname()


def rendezvous(env: Mapping[str, str]) -> dict[str, str] | str:
    """MASTER_ADDR and MASTER_PORT for the ranks: torchrun's (or the user's), else under
    srun the step's first node (`scontrol show hostnames`, as Slurm's own examples do) and
    a port derived from the job and step ids, the same on every task. A string: why not."""
    found = {name: env[name] for name in ("MASTER_ADDR", "MASTER_PORT") if name in env}
    if len(found) == 2:
        return found
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if nodelist is None:
        return "set MASTER_ADDR and MASTER_PORT, or run under srun or torchrun"
    if "MASTER_ADDR" not in found:
        try:
            listed = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist],
                capture_output=True,
                text=True,
                timeout=SCONTROL_TIMEOUT_S,
                check=True,
            ).stdout.split()
        except subprocess.CalledProcessError as err:
            # Its text would hold the command, and so the node list's value.
            return f"scontrol show hostnames failed (exit status {err.returncode}): set MASTER_ADDR"
        except subprocess.TimeoutExpired:
            return (
                f"scontrol show hostnames gave no answer within {SCONTROL_TIMEOUT_S:g} s: "
                "set MASTER_ADDR"
            )
        except OSError as err:
            return f"cannot run scontrol ({err.strerror or type(err).__name__}): set MASTER_ADDR"
        if not listed:
            return "scontrol show hostnames named no node: set MASTER_ADDR"
        found["MASTER_ADDR"] = listed[0]
    if "MASTER_PORT" not in found:
        job, step = env.get("SLURM_JOB_ID", "0"), env.get("SLURM_STEP_ID", "0")
        if not (job.isascii() and job.isdigit() and step.isascii() and step.isdigit()):
            return "SLURM_JOB_ID or SLURM_STEP_ID is not a number: set MASTER_PORT"
        offset = (int(job) * 16 + int(step)) % SRUN_PORT_SPAN
        found["MASTER_PORT"] = str(SRUN_PORT_BASE + offset)
    return found


def compute_nic_rate(ctx: CheckContext) -> tuple[float | None, str]:
    """The node's compute NICs' summed live rate in bytes per second, and how it was
    read: the RDMA rails NCCL drives (or, on a node without RDMA, the interfaces its
    sockets use); None where no such NIC has a live rate."""
    inventory = ctx.inventory
    roles = nic_roles(inventory)
    carrying = [
        nic for nic in inventory.nics if roles.get(nic.name) in (NicRole.COMPUTE, NicRole.SOCKET)
    ]
    rates = [nic_facts(nic).rate_gbps for nic in carrying]
    live = [rate for rate in rates if rate]
    if not live:
        return None, "no compute NIC with a live rate"
    shown = (
        f"{len(live)} x {live[0]:g} Gb/s"
        if len(set(live)) == 1
        else " + ".join(f"{rate:g}" for rate in live) + " Gb/s"
    )
    return sum(live) * 1e9 / 8, f"compute NICs {shown}"


def memory_available(ctx: CheckContext, device: str, local_rank: int) -> int | None:
    """What this rank's payload may take: its GPU's free memory (NVML, local rank N on
    the Nth GPU in PCI bus order), or the node's MemAvailable on the CPU."""
    if device == "cpu":
        return read_memory_available(ctx.fs)
    try:
        activity = read_gpu_activity(ctx.nvml)
    except (NvmlUnavailableError, NvmlHungError):
        return None
    if local_rank >= len(activity):
        return None
    return activity[local_rank].memory_free


def child_spec(ctx: CheckContext, options: BenchOptions, run: NetworkRun) -> dict[str, Any]:
    """The gate's verdict and the node's readings, for the child to share."""
    refusal = None if options.force else check_gate(ctx, options)
    rate, text = compute_nic_rate(ctx) if options.device == "cuda" else (None, "")
    local = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
    return {
        "benchmark": "network",
        "device": options.device,
        "payloads": list(run.payloads),
        "duration_s": options.duration_s,
        "sweep": run.sweep,
        "rendezvous_timeout_s": run.rendezvous_timeout_s,
        "node": run.node,
        "refused": refusal.text if refusal is not None else None,
        "nic_bytes_per_second": rate,
        "nic_text": text,
        "memory_available_bytes": memory_available(
            ctx, options.device, int(local) if local.isascii() and local.isdigit() else 0
        ),
        "warn_below": options.thresholds.warn,
        "fail_below": options.thresholds.fail,
        # Where the node's lowest rank writes its record, inside the child, before the
        # ranks' last barrier: no rank exits (and no launcher kills the rest) before
        # every node's record is written.
        "state_dir": str(options.state_dir),
        "create_state_dir": is_default_state_dir(options.state_dir),
    }


def child_deadline(options: BenchOptions, run: NetworkRun) -> float:
    """The child's hard deadline: the rendezvous, torch's import, every measurement (the
    whole job at each payload, then the planned rounds) with room, and one collective's
    timeout (a rank lost mid-run)."""
    measurements = len(run.payloads) + MAX_ROUNDS
    return STARTUP_S + 2 * run.rendezvous_timeout_s + 4 * options.duration_s * measurements


def run_network(ctx: CheckContext, options: BenchOptions, run: NetworkRun) -> NetworkOutcome:
    """Gate, read, run the child under its deadline; the report or the one line why not."""
    place = rendezvous(os.environ)
    if isinstance(place, str):
        return NetworkOutcome(None, error=place)
    spec = child_spec(ctx, options, run)
    saved = {name: os.environ.get(name) for name in place}
    os.environ.update(place)  # the child inherits the environment (child_runner)
    try:
        outcome = run_child(spec, child_deadline(options, run))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if outcome.result is None:
        line = (outcome.error or "the benchmark failed").splitlines()[0]
        if outcome.cause == "refused":  # the child's own line, after its type's name
            line = line.split(": ", 1)[-1]
        if outcome.cause == "timeout":
            line = f"no result within {child_deadline(options, run):.0f} s: {line}"
        return NetworkOutcome(None, error=line)
    result = outcome.result
    return NetworkOutcome(result["report"], result["rank"], result.get("record_error"))


def whole_job_verdict(report: Mapping[str, Any]) -> str:
    """ok, warn or fail: the whole job's median busbw against the NICs' rate (only where
    the nodes' NICs gave one; the run's own pairs judge the nodes, not the whole)."""
    if not report["expected_from_nics"]:
        return "ok"
    ratio = report["whole_job"]["busbw_median"] / report["expected_bytes_per_second"]
    thresholds = report["thresholds"]
    return "fail" if ratio < thresholds["fail"] else "warn" if ratio < thresholds["warn"] else "ok"


def exit_status(report: Mapping[str, Any], rank: int | None) -> int:
    """Rank 0's: 0 measured and nothing slow, 1 a node, a link or the whole job slow.
    Every other rank that measured exits 0: torchrun, and srun --kill-on-bad-exit, stop
    the other ranks as soon as one exits otherwise, which would cut rank 0's report."""
    if rank != 0:
        return EXIT_OK
    slow = any(v["status"] != "ok" for v in report["verdicts"])
    return EXIT_SLOW if slow or whole_job_verdict(report) != "ok" else EXIT_OK
