"""Across nodes: the sweep's schedule, the stability profile, and who is slow (pure).

`nodecheck bench network` measures one all_reduce over every rank of a job, then (when
that figure is below what the nodes should reach) splits the nodes into pairs, a round
at a time: every pair of a round runs at once, each pair in its own process group, and
the next round pairs each node with someone new (`pair_rounds`, the circle method of a
round-robin tournament: node 0 stays, the others rotate one place).

How a culprit shows:
- a slow node (a NIC trained low, a bad PCIe link, a busy CPU) is slow with *every*
  partner;
- a slow link (a cable, a switch port between two particular nodes) is slow with *one*
  partner only: both ends are fast with everyone else.

A pair's figure is judged against the run's own reference: the median, over the nodes,
of each node's best pair. A node's best pair is as fast as that node goes with a healthy
partner, so while fewer than half the nodes are slow, the median of those is a healthy
figure, whatever the slow ones did to their partners. A pair below `warn` x that
reference is slow.

How many rounds: with k slow nodes among N, a healthy node is sure to have met a healthy
partner after k + 1 rounds (its k + 1 partners are all different and at most k of them
are slow), and every slow node is then slow with k + 1 partners. So one slow node needs
2 rounds (round 1 shows a slow pair, not which end; round 2 pairs each end with someone
new and only the slow one stays slow), two slow nodes need 3 (2 when no node happened to
meet both), at most N - 1 for an even N. An odd N gives one node a bye each round, so a
node may need one round more, and no verdict is sure before every node has had a
partner. A node slow with every partner is named; a slow pair neither of whose ends is
named is the link between them.

The confidence rule: a healthy node can be named only if every partner it had was a slow
node; those are named too (a slow node is slow with everyone), so such a false name
needs at least m + 1 named nodes for a node with m partners. The verdict is "high" when
every named node had at least as many partners as there are named nodes (no false name
is then possible), and the sweep stops as soon as that holds; otherwise it runs the
rounds it planned (`planned_rounds`: 3, enough for two slow nodes, fewer when N is
small) and says "low". Links are only seen among the pairs measured: N/2 of the
N(N-1)/2 links each round.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from nodecheck.checks.record import record

# Enough rounds for two slow nodes among an even number (see the docstring): every
# rank creates every pair group of every planned round up front, as torch requires.
MAX_ROUNDS = 3


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
    reference: float  # bytes/s: the median over the nodes of each node's best pair
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
    """`rounds` rounds of disjoint pairs of node indices, no pair repeated (circle
    method: index 0 fixed, the rest rotated one place per round; an odd count gets a
    bye, so one node sits each round out)."""
    if nodes < 2:
        return []
    seats = list(range(nodes)) + ([-1] if nodes % 2 else [])
    half = len(seats) // 2
    schedule = []
    for _ in range(min(rounds, len(seats) - 1)):
        pairs = []
        for i in range(half):
            first, second = seats[i], seats[len(seats) - 1 - i]
            if first >= 0 and second >= 0:
                pairs.append((min(first, second), max(first, second)))
        schedule.append(pairs)
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return schedule


def _gbps(value: float) -> str:
    return f"{value / 1e9:.2f} GB/s"


def localise(
    nodes: Sequence[str], pairs: Sequence[PairFigure], warn: float, fail: float
) -> Localisation:
    """Name the slow nodes and links from the pairs measured so far (see the docstring)."""
    best: dict[str, float] = {}
    partners: dict[str, list[PairFigure]] = {node: [] for node in nodes}
    for pair in pairs:
        for end in (pair.first, pair.second):
            partners[end].append(pair)
            best[end] = max(best.get(end, 0.0), pair.busbw)
    reference = statistics.median(best.values()) if best else 0.0
    slow = tuple(pair for pair in pairs if pair.busbw < warn * reference)
    slow_nodes = tuple(
        node
        for node in nodes
        if partners[node] and all(pair.busbw < warn * reference for pair in partners[node])
    )
    named = set(slow_nodes)
    links = tuple(
        (pair.first, pair.second)
        for pair in slow
        if pair.first not in named and pair.second not in named
    )
    # Sure only once every node has met someone (an odd count's bye leaves one out of a
    # round), and no name can be false (the docstring's rule).
    confident = all(partners[node] for node in nodes) and all(
        len(partners[node]) >= len(named) for node in named
    )
    confidence = "high" if confident else "low"

    def status(value: float) -> str:
        return "fail" if value < fail * reference else "warn"

    verdicts = []
    for node in nodes:
        own = partners[node]
        if node in named:
            top = best[node]
            verdicts.append(
                NodeVerdict(
                    node,
                    status(top),
                    "node",
                    None,
                    confidence,
                    f"{node} is slow with every partner ({len(own)}): {_gbps(top)} at best, "
                    f"{top / reference:.2f}x the run's {_gbps(reference)}",
                )
            )
            continue
        link = next((pair for pair in slow if node in (pair.first, pair.second)), None)
        if link is not None and (link.first, link.second) in links:
            peer = link.second if link.first == node else link.first
            verdicts.append(
                NodeVerdict(
                    node,
                    status(link.busbw),
                    "link",
                    peer,
                    "high",
                    f"the link {node} <-> {peer} is slow: {_gbps(link.busbw)}, "
                    f"{link.busbw / reference:.2f}x the run's {_gbps(reference)}; both ends "
                    "are fast with other partners",
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
                confidence,
                f"{node}: {_gbps(best[node])} at best with {len(own)} partner(s), "
                f"{best[node] / reference:.2f}x the run's {_gbps(reference)}",
            )
        )
    return Localisation(reference, slow, slow_nodes, links, confident, tuple(verdicts))


def sweep_is_done(localisation: Localisation, rounds_run: int, planned: int) -> bool:
    """Stop once the verdict is sure (the confidence rule), or the planned rounds are run."""
    return localisation.confident or rounds_run >= planned


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
    if whole_job_median < warn * expected:
        ratio = whole_job_median / expected
        return True, f"the whole job is {ratio:.2f}x what its NICs should reach"
    return False, "the whole job reaches what its NICs should"
