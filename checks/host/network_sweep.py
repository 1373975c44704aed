"""This node's last cross-node sweep: whether `nodecheck bench network` named it, or one of
its links, slow.

A multi-node job runs at the pace of its slowest link, and nccl-tests gives one number for
the whole set. The sweep (run across idle nodes: deploy/slurm/nodecheck-network-sweep.sbatch)
measures the whole job's all_reduce bus bandwidth and, below expectation, pairs of nodes in
rounds, and leaves each node its own record (checks/node/network_sweep.py). This check
turns that record into the node's finding, so that the agent exports it
(`nodecheck_bench_network_*`), and Slurm's health check, the Kubernetes conditions and the
alert rules act on it as on every other finding: a slow node or link is a GPU performance
fault (a collective job spanning it runs at its pace), which takes the node out of service
unless `[remediation] performance = false`.

It fails the node only for what the record lays at this node with high confidence: its
verdict `fail`, the culprit this node, measured over NCCL (the GPUs' rails). Everything
else warns: a whole job that was slow with no node or link named, a verdict of low
confidence (a node slow with too few partners that were fast elsewhere; every slow link,
measured once: checks/rules/network_sweep.py), and a gloo sweep (the host's sockets, not
the GPUs' rails): draining on them would drain healthy nodes. A slow link asks for the
cable, transceivers and switch ports to be inspected.

A record is evidence of its time: older than `[benchmarks] network_max_age` (3 days), or
dated in the future, it judges nothing (`skip`, naming why: sweeps that stopped must not
flag or drain a fleet, and a drain set on a record lifts once the record is no longer
evidence), and its measured rates are exported with their timestamp so that a fleet sees
them age, but not its verdict (as the benchmarks' last measurements,
checks/bench/driver.py). A record that names another node (a state directory shared
between nodes, a file copied with a node's image) is refused, `skip`, never read as this
node's. A record an operator removes judges nothing either: after a repair that needs no
new sweep, or to return a node that a record keeps draining.
"""

from __future__ import annotations

from collections.abc import Iterator

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import PartUnavailableError
from nodecheck.checks.node.fs import ReadError
from nodecheck.checks.node.network_sweep import NetworkSweep, NetworkSweepReading
from nodecheck.checks.registry import register
from nodecheck.checks.result import (
    NODE,
    Action,
    FaultClass,
    MetricSpec,
    Result,
    Sample,
    Status,
)

LABELS = ("backend", "payload_bytes", "nodes", "ranks")
BUSBW = MetricSpec(
    "nodecheck_bench_network_bus_bandwidth_bytes_per_second",
    "gauge",
    "The last cross-node sweep's whole-job all_reduce bus bandwidth over its iterations "
    "(statistic: median, min, p10, p90)",
    (*LABELS, "statistic"),
)
VARIATION = MetricSpec(
    "nodecheck_bench_network_variation_ratio",
    "gauge",
    "Coefficient of variation of the last sweep's per-iteration whole-job bus bandwidth",
    LABELS,
)
EXPECTED = MetricSpec(
    "nodecheck_bench_network_expected_bus_bandwidth_bytes_per_second",
    "gauge",
    "The bus bandwidth the last sweep expected of the whole job (the nodes' compute NICs "
    "and the algorithm's factor, or the run's own median pair)",
    LABELS,
)
PAIR = MetricSpec(
    "nodecheck_bench_network_pair_bus_bandwidth_bytes_per_second",
    "gauge",
    "Bus bandwidth of this node's pair with `peer` in the last sweep's round",
    ("peer", "round", "backend", "payload_bytes"),
)
PAIR_SLOW = MetricSpec(
    "nodecheck_bench_network_pair_slow",
    "gauge",
    "1 when the last sweep judged this node's pair with `peer` slow in that round, else 0",
    ("peer", "round"),
)
VERDICT = MetricSpec(
    "nodecheck_bench_network_verdict",
    "gauge",
    "The last sweep's verdict on this node as the check judges it: 0 ok, 1 warn, 2 fail; "
    "culprit none, node or link (peer: the link's far end); only while the record is fresh",
    ("culprit", "peer", "confidence"),
)
LAST_SWEEP = MetricSpec(
    "nodecheck_bench_network_last_sweep_timestamp_seconds",
    "gauge",
    "When the last cross-node sweep that measured this node ended (its record's finished_at)",
)
VERDICT_VALUES = {Status.OK: 0.0, Status.WARN: 1.0, Status.FAIL: 2.0}

# A record's time is its writer's clock; a few minutes ahead of this node's is skew,
# beyond that its age cannot be told.
FUTURE_SLACK_S = 300.0
SWEEP = "rerun the sweep over this node and healthy peers (nodecheck-network-sweep.sbatch)"
NODE_REMEDY = (
    "look at this node's compute NICs and their links (nodecheck check --only rdma_ports "
    f"--only pcie_link), then {SWEEP}; a newer record that passes lifts the drain"
)
LINK_REMEDY = (
    "reseat or replace the cable and transceivers between this node and {peer}, and check "
    f"both switch ports; then {SWEEP}"
)


def _rate(value: float) -> str:
    return f"{value / 1e9:.3g} GB/s"


def _age(seconds: float) -> str:
    """ "12 min", "5.0 h", "3.5 days"."""
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    hours = seconds / 3600
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} days"


def _same_node(named: str, here: str) -> bool:
    """Whether the record's node is this one: the same name, or the same first label (the
    sweep names a node by its host name, or as --node-name says, perhaps fully qualified)."""
    named, here = named.casefold(), here.casefold()
    return named == here or named.split(".", 1)[0] == here.split(".", 1)[0]


def _rates(sweep: NetworkSweep) -> tuple[Sample, ...]:
    """What the sweep measured, and when: exported whatever the record's age."""
    labels = {
        "backend": sweep.backend,
        "payload_bytes": str(sweep.payload_bytes),
        "nodes": str(sweep.nodes),
        "ranks": str(sweep.ranks),
    }
    profile = sweep.whole_job
    samples = [
        Sample(BUSBW, value, {**labels, "statistic": statistic})
        for statistic, value in (
            ("median", profile.busbw_median),
            ("min", profile.busbw_min),
            ("p10", profile.busbw_p10),
            ("p90", profile.busbw_p90),
        )
    ]
    samples.append(Sample(VARIATION, profile.cv, labels))
    if sweep.expected_bytes_per_second is not None:
        samples.append(Sample(EXPECTED, sweep.expected_bytes_per_second, labels))
    samples += [
        Sample(
            PAIR,
            pair.busbw_bytes_per_second,
            {
                "peer": pair.peer,
                "round": str(pair.round),
                "backend": sweep.backend,
                "payload_bytes": str(sweep.payload_bytes),
            },
        )
        for pair in sweep.pairs
    ]
    samples.append(Sample(LAST_SWEEP, sweep.finished_at))
    return tuple(samples)


def _verdict_samples(sweep: NetworkSweep, status: Status) -> tuple[Sample, ...]:
    """The sweep's judgement: exported only while the record is fresh."""
    verdict = sweep.verdict
    labels = {
        "culprit": verdict.culprit,
        "peer": verdict.peer or "",
        "confidence": verdict.confidence,
    }
    slow = tuple(
        Sample(PAIR_SLOW, float(pair.slow), {"peer": pair.peer, "round": str(pair.round)})
        for pair in sweep.pairs
    )
    return (Sample(VERDICT, VERDICT_VALUES[status], labels), *slow)


def _judged(
    sweep: NetworkSweep, previous: NetworkSweep | None, max_age: float
) -> tuple[Status, str, str, Action | None]:
    """This node's status from the record's verdict, why it differs from the record's
    where it does, the remedy, and the action where the evidence sets it. `previous`:
    the record this one replaced, if it is this node's."""
    verdict = sweep.verdict
    if verdict.status == "ok":
        return Status.OK, "", "", None
    if verdict.culprit == "none":
        # The whole job was below expectation, and no node or link was named: this node
        # is as likely healthy as any other of the sweep.
        return Status.WARN, "no node or link named, so not this node's alone", SWEEP, None
    if verdict.culprit == "link":
        # One pair, measured once: the cable and ports are worth a look, never a drain.
        remedy = LINK_REMEDY.format(peer=verdict.peer)
        return Status.WARN, "a link, not the node: not failing it", remedy, Action.INSPECT_HARDWARE
    remedy = NODE_REMEDY
    if verdict.status == "warn":
        return Status.WARN, "", remedy, None
    if verdict.confidence == "low":
        return Status.WARN, "low confidence: not failing the node on it", remedy, None
    if sweep.backend != "nccl":
        # gloo over sockets measured the interface the host's sockets use and its CPUs,
        # not the GPUs' compute rails: worth a look, never a drain of a GPU node.
        note = f"measured over {sweep.backend}: not failing the node on it"
        return Status.WARN, note, remedy, None
    if not _named_before(sweep, previous, max_age):
        # One sweep's partners can all sit across a slower part of the fabric from it
        # (the job's order need not follow the switches); the next sweep starts its
        # schedule elsewhere (checks/rules/network_sweep.py), with other partners.
        note = "named by one sweep: the next that names it again fails the node"
        return Status.WARN, note, remedy, None
    return Status.FAIL, "", remedy, None


def _named_before(sweep: NetworkSweep, previous: NetworkSweep | None, max_age: float) -> bool:
    """Whether the sweep before this one, within network_max_age of it, named this node
    slow as surely, over NCCL."""
    if previous is None or previous.backend != "nccl":
        return False
    if not 0 < sweep.finished_at - previous.finished_at <= max_age:
        return False
    named = previous.verdict
    return (named.status, named.culprit, named.confidence) == ("fail", "node", "high")


def _summary(sweep: NetworkSweep, age: float, note: str) -> str:
    expected = (
        f" (expected {_rate(sweep.expected_bytes_per_second)})"
        if sweep.expected_bytes_per_second is not None
        else ""
    )
    text = (
        f"sweep {_age(max(age, 0.0))} ago over {sweep.nodes} nodes ({sweep.backend}, "
        f"{sweep.payload_bytes / 2**20:g} MiB): whole job {_rate(sweep.whole_job.busbw_median)}"
        f"{expected}; {sweep.verdict.message}"
    )
    return f"{text} ({note})" if note else text


def _unusable(reading: NetworkSweepReading) -> Result:
    """The result of a record that cannot be read as one."""
    if reading.outcome == "missing":
        return Result(
            Status.SKIP,
            NODE,
            f"no cross-node sweep has measured this node ({reading.path} missing)",
            details={"cause": "never_swept", "path": reading.path},
        )
    if reading.outcome == "newer":
        return Result(
            Status.ERROR,
            NODE,
            f"cannot judge the last sweep: {reading.problem}",
            "upgrade nodecheck on this node to the sweep's version",
            {"cause": "newer_version", "version": reading.version, "path": reading.path},
        )
    if reading.outcome == "damaged":
        return Result(
            Status.ERROR,
            NODE,
            f"the last sweep's record is damaged: {reading.problem}",
            f"{SWEEP}, which replaces it",
            {"cause": "damaged", "path": reading.path},
        )
    return Result(
        Status.ERROR,
        NODE,
        f"cannot read the last sweep's record: {reading.problem}",
        "the sweep must write it where this agent reads it (its state_dir: the sweep's "
        "--state-dir) and readable by it (0644)",
        {"cause": "unreadable", "path": reading.path},
    )


@register(
    "network_sweep",
    fault_class=FaultClass.GPU_PERFORMANCE,
    action=Action.INVESTIGATE,
    interval_s=300,
    timeout_s=10,
    needs=("network_sweep", "network_sweep_previous", "hostname"),
    options=("bench",),
)
def check_network_sweep(ctx: CheckContext) -> Iterator[Result]:
    """The last cross-node all_reduce sweep's verdict on this node and its links."""
    reading: NetworkSweepReading = ctx.part("network_sweep")
    sweep = reading.sweep
    if sweep is None:
        yield _unusable(reading)
        return
    details: dict[str, object] = {"path": reading.path, "node": sweep.node}
    try:
        here: str = ctx.part("hostname")
    except (PartUnavailableError, ReadError) as err:
        yield Result(
            Status.ERROR,
            NODE,
            f"cannot tell whether the last sweep's record (node {sweep.node}) is this "
            f"node's: its host name is unknown ({err})",
            details={**details, "cause": "hostname_unknown"},
        )
        return
    if not _same_node(sweep.node, here):
        # Skip, not error: a record copied with a node's image, or a state directory
        # shared between nodes, says nothing of this node, and is no fault of it.
        yield Result(
            Status.SKIP,
            NODE,
            f"{reading.path} is the record of node {sweep.node}, not of this node ({here}): "
            "refused",
            "give each node its own state directory (the sweep writes the record of the node "
            "it runs on into its --state-dir)",
            {**details, "cause": "another_node"},
        )
        return
    age = ctx.now - sweep.finished_at
    max_age = ctx.config.bench.network_max_age_s
    details.update(
        {
            "age_s": age,
            "max_age_s": max_age,
            "verdict": sweep.verdict.status,
            "culprit": sweep.verdict.culprit,
            "peer": sweep.verdict.peer,
            "confidence": sweep.verdict.confidence,
            "expected_source": sweep.expected_source,
        }
    )
    measured = _rates(sweep)
    if age < -FUTURE_SLACK_S:
        yield Result(
            Status.SKIP,
            NODE,
            f"the last sweep's record is dated {_age(-age)} in the future: its age, and so "
            "whether it still holds, cannot be told",
            f"check the clocks of the swept nodes (timedatectl), then {SWEEP}",
            {**details, "cause": "future"},
            measured,
        )
        return
    if age > max_age:
        # Skip, not error: sweeps that stopped (or a node drained, which the sweep's
        # batch job cannot be given) must not flag or drain the fleet, and a drain set on
        # the record lifts once it is no longer evidence.
        yield Result(
            Status.SKIP,
            NODE,
            f"the last sweep is {_age(age)} old, past network_max_age ({_age(max_age)}): "
            f"no longer judged (it said: {sweep.verdict.status}, {sweep.verdict.message})",
            SWEEP,
            {**details, "cause": "stale"},
            measured,
        )
        return
    before = ctx.part("network_sweep_previous").sweep
    previous = before if before is not None and _same_node(before.node, here) else None
    status, note, remedy, action = _judged(sweep, previous, max_age)
    yield Result(
        status,
        NODE,
        _summary(sweep, age, note),
        remedy,
        details,
        measured + _verdict_samples(sweep, status),
        action=action,
    )
