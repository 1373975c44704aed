"""Across nodes: the sweep's schedule, the stability profile, and who is slow (pure).

`nodecheck bench network` measures one all_reduce over every rank of a job, then (when
that figure is below what the nodes should reach) splits the nodes into pairs, a round
at a time: every pair of a round runs at once, each pair in its own process group, and
the next round pairs each node with someone new (`pair_rounds`, the circle method of a
round-robin tournament, round 1 pairing neighbours in the job's order).

How a culprit shows:
- a slow node (a NIC trained low, a bad PCIe link, a busy CPU) is slow with *every*
  partner;
- a slow link (a cable, a switch port between two particular nodes) is slow with *one*
  partner only: both ends are fast with everyone else.

A pair's figure is judged against the run's own reference: the median of every pair
measured so far, a healthy figure while fewer than half the pairs are slow (one slow node
is in one pair of a round). A pair below `warn` x that reference is slow; a link is named
only below `fail` x it (one measurement must be clear of noise). The sweep never stops
before MIN_ROUNDS, runs every planned round for a handful of nodes (SMALL_SET) or while
a whole job below its NICs' rate is unexplained, and the schedule's start turns with each
run (the child rotates the nodes' order), so that over runs other pairs are measured.

What a verdict rests on, and so how sure it is: a node is named slow when every pair it
was in is slow; its verdict is "high" only when CONFIRMING_PARTNERS of those partners were
*known good*, fast with some other partner. One pair's figure is one measurement, and a
healthy node can be unlucky once (a noisy pair, a busy switch port, a partner across a
slower part of the fabric); three partners that are each fast elsewhere can hardly all
be. A slow link is one pair, measured once (the schedule never repeats a pair), so a link
is never "high": it is worth a look, never a drain. Neither is a whole job below what its
NICs should reach with nobody named: every node's verdict is then a low-confidence warn.
The node's agent fails a node only on a "high" verdict (checks/host/network_sweep.py).

How many rounds: a slow node needs CONFIRMING_PARTNERS (3) known-good partners, so one
slow node among N needs 3 rounds (all its partners are healthy, and each of them is fast
with its other partners). With k slow nodes, up to k - 1 of a slow node's partners may
be slow ones, so it needs up to k + 2 rounds: 4 for two slow nodes (3 when they never
met). MAX_ROUNDS is 4: enough for two. A node with fewer partners than that (N of 3, an
odd N's byes) is named with low confidence. A healthy set of more than SMALL_SET nodes
stops after MIN_ROUNDS (2) when no pair is slow. Links are only seen among the pairs
measured: N/2 of the N(N-1)/2 links each round. Three nodes cannot name one: two of their
three pairs hold a slow node, so the reference itself is slow.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from nodecheck.checks.record import record

# Enough rounds to name two slow nodes with high confidence (see the docstring): every
# rank creates every pair group of every planned round up front, as torch requires.
MAX_ROUNDS = 4
# Round 1 alone can take a slow node's partner for the reference (see the docstring).
MIN_ROUNDS = 2
# Known-good partners a node must be slow with for a "high" verdict.
CONFIRMING_PARTNERS = 3
# Up to this many nodes every planned round is run (a reference of two or three pairs).
SMALL_SET = 5


@record
class Profile:
    """The spread of per-iteration bus bandwidths (all_reduce_bench.py's
    --profile_stability): bytes per second."""

    busbw_min: float
    busbw_median: float
    busbw_p10: float
    busbw_p90: float
    cv: float  # population standard deviation / mean


@record
class PairFigure:
    """One pair's measurement: the round, the two nodes, its median busbw (bytes/s)."""

    round: int
    first: str
    second: str
    busbw: float


@record
class NodeVerdict:
    """What the sweep says of one node (the per-node record's `verdict`)."""

    node: str
    status: str  # "ok", "warn", "fail"
    culprit: str  # "none", "node", "link"
    peer: str | None
    confidence: str  # "high", "low"
    message: str


@record
class Localisation:
    reference: float  # bytes/s: the median of every pair measured
    slow_pairs: tuple[PairFigure, ...]
    slow_nodes: tuple[str, ...]
    slow_links: tuple[tuple[str, str], ...]
    confident: bool
    verdicts: tuple[NodeVerdict, ...]


def bus_factor(ranks: int) -> float:
    """nccl-tests' all_reduce bus factor (src/all_reduce.cu AllReduceGetBw):
    busbw = algbw x 2(n-1)/n."""
    return 2 * (ranks - 1) / ranks


def quantile(values: Sequence[float], fraction: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def stability(busbw: Sequence[float]) -> Profile:
    """min, median, p10, p90 and coefficient of variation of per-iteration busbw."""
    if not busbw:
        raise ValueError("no iteration to profile")
    mean = statistics.fmean(busbw)
    return Profile(
        busbw_min=min(busbw),
        busbw_median=statistics.median(busbw),
        busbw_p10=quantile(busbw, 0.1),
        busbw_p90=quantile(busbw, 0.9),
        cv=statistics.pstdev(busbw) / mean if mean else 0.0,
    )


def planned_rounds(nodes: int) -> int:
    """The rounds planned (and their groups created) for `nodes` nodes: MAX_ROUNDS, or
    every distinct pairing there is when fewer (N - 1 for an even N, N for an odd one)."""
    if nodes < 2:
        return 0
    distinct = nodes - 1 if nodes % 2 == 0 else nodes
    return min(MAX_ROUNDS, distinct)


def pair_rounds(nodes: int, rounds: int) -> list[list[tuple[int, int]]]:
    """`rounds` rounds of disjoint pairs of node indices, no pair repeated: the circle
    method (one seat fixed, the rest rotated one place per round; an odd count gets a
    bye, so one node sits each round out), its seats filled so that round 1 pairs
    neighbours, (0, 1), (2, 3), ...

    Neighbours first: a job's nodes come in the order of their names, which usually
    follows racks and leaf switches, and a partner across a slower part of the fabric is
    no fault of the node. A node slow with its neighbour as well as with far partners is
    slow wherever it is; one that is slow only with far partners never is with all."""
    if nodes < 2:
        return []
    count = nodes + nodes % 2  # an odd count's bye is one more seat, -1
    # Seat i faces seat count-1-i in round 1: seats 0, count-1 hold nodes 0 and 1, seats
    # 1, count-2 nodes 2 and 3, and so on.
    seats = [0] * count
    for i in range(count // 2):
        seats[i], seats[count - 1 - i] = 2 * i, 2 * i + 1
    seats = [seat if seat < nodes else -1 for seat in seats]
    half = count // 2
    schedule = []
    for _ in range(min(rounds, count - 1)):
        pairs = []
        for i in range(half):
            first, second = seats[i], seats[count - 1 - i]
            if first >= 0 and second >= 0:
                pairs.append((min(first, second), max(first, second)))
        schedule.append(sorted(pairs))
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return schedule


def _gbps(value: float) -> str:
    return f"{value / 1e9:.2f} GB/s"


def localise(
    nodes: Sequence[str],
    pairs: Sequence[PairFigure],
    warn: float,
    fail: float,
    whole_job_shortfall: str | None = None,
) -> Localisation:
    """Name the slow nodes and links from the pairs measured so far (see the docstring).
    `whole_job_shortfall`: why the whole job was below expectation, if it was (the sweep
    then says so of every node when it names nobody)."""
    best: dict[str, float] = {}
    partners: dict[str, list[PairFigure]] = {node: [] for node in nodes}
    for pair in pairs:
        for end in (pair.first, pair.second):
            partners[end].append(pair)
            best[end] = max(best.get(end, 0.0), pair.busbw)
    # The median of every pair measured: a node's best pair would be the best of several
    # noisy figures, above what a healthy pair gives, and put the bar inside the noise.
    reference = statistics.median(pair.busbw for pair in pairs) if pairs else 0.0
    slow = tuple(pair for pair in pairs if pair.busbw < warn * reference)
    known_good = {node for node in nodes if best.get(node, 0.0) >= warn * reference > 0}
    slow_nodes = tuple(
        node
        for node in nodes
        if partners[node] and all(pair.busbw < warn * reference for pair in partners[node])
    )
    named = set(slow_nodes)
    # A link is one measurement: named only below `fail` x the reference, clear of noise.
    links = tuple(
        (pair.first, pair.second)
        for pair in slow
        if pair.first not in named and pair.second not in named and pair.busbw < fail * reference
    )

    def confirmed_by(node: str) -> int:
        """The known-good partners `node` was slow with."""
        return len({_other(pair, node) for pair in partners[node]} & known_good)

    sure = {node: confirmed_by(node) >= CONFIRMING_PARTNERS for node in slow_nodes}
    # Sure only once every node has met MIN_ROUNDS partners (an odd count's bye leaves one
    # out of a round), every name is confirmed, and no link is left to explain.
    # A whole job below its NICs' rate that nothing explains yet, or a handful of nodes
    # (N <= 5, where a reference is two or three pairs), runs every planned round.
    confident = (
        all(len(partners[node]) >= MIN_ROUNDS for node in nodes)
        and all(sure.values())
        and not links
        and not (whole_job_shortfall is not None and not named)
        and len(nodes) > SMALL_SET
    )

    def status(value: float) -> str:
        return "fail" if value < fail * reference else "warn"

    unexplained = whole_job_shortfall is not None and not named and not links
    verdicts = []
    for node in nodes:
        own = partners[node]
        if node in named:
            top = best[node]
            confirmed = confirmed_by(node)
            verdicts.append(
                NodeVerdict(
                    node,
                    status(top),
                    "node",
                    None,
                    "high" if sure[node] else "low",
                    f"{node} is slow with every partner ({len(own)}, {confirmed} of them fast "
                    f"with others): {_gbps(top)} at best, {top / reference:.2f}x the run's "
                    f"{_gbps(reference)}",
                )
            )
            continue
        link = next(
            (
                pair
                for pair in slow
                if node in (pair.first, pair.second) and (pair.first, pair.second) in links
            ),
            None,
        )
        if link is not None:
            peer = _other(link, node)
            verdicts.append(
                NodeVerdict(
                    node,
                    status(link.busbw),
                    "link",
                    peer,
                    "low",  # one measurement: the schedule never repeats a pair
                    f"the link {node} <-> {peer} is slow: {_gbps(link.busbw)}, "
                    f"{link.busbw / reference:.2f}x the run's {_gbps(reference)}, in one "
                    "measurement; both ends are fast with other partners",
                )
            )
            continue
        if unexplained:
            verdicts.append(
                NodeVerdict(
                    node,
                    "warn",
                    "none",
                    None,
                    "low",
                    f"{whole_job_shortfall}, and the pairs name no node or link",
                )
            )
            continue
        if not own:
            verdicts.append(NodeVerdict(node, "ok", "none", None, "low", f"{node} had no partner"))
            continue
        verdicts.append(
            NodeVerdict(
                node,
                "ok",
                "none",
                None,
                "high" if len(own) >= MIN_ROUNDS else "low",
                f"{node}: {_gbps(best[node])} at best with {len(own)} partner(s), "
                f"{best[node] / reference:.2f}x the run's {_gbps(reference)}",
            )
        )
    return Localisation(reference, slow, slow_nodes, links, confident, tuple(verdicts))


def _other(pair: PairFigure, node: str) -> str:
    return pair.second if pair.first == node else pair.first


def sweep_is_done(localisation: Localisation, rounds_run: int, planned: int) -> bool:
    """Stop once the verdict is sure (the confidence rule) and MIN_ROUNDS are run, or the
    planned rounds are run."""
    if rounds_run >= planned:
        return True
    return rounds_run >= MIN_ROUNDS and localisation.confident


def should_sweep(
    mode: str, whole_job_median: float, expected: float | None, warn: float
) -> tuple[bool, str]:
    """Whether to sweep, and why. `auto` sweeps when the whole job is below `warn` x what
    the nodes' NICs should reach, and when there is no NIC rate to judge by (then the
    run is judged by its own pairs)."""
    if mode == "always":
        return True, "--sweep always"
    if mode == "never":
        return False, "--sweep never"
    if expected is None:
        return True, "no NIC rate to judge the whole job by: judged by its pairs"
    shortfall = whole_job_shortfall(whole_job_median, expected, warn)
    if shortfall is not None:
        return True, shortfall
    return False, "the whole job reaches what its NICs should"


def whole_job_shortfall(whole_job_median: float, expected: float | None, warn: float) -> str | None:
    """Why the whole job is below `warn` x what its NICs should reach; None when it is
    not, or when there is no NIC rate to judge it by."""
    if expected is None or whole_job_median >= warn * expected:
        return None
    return f"the whole job is {whole_job_median / expected:.2f}x what its NICs should reach"
