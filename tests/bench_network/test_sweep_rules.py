"""The sweep's schedule and localisation on literal figures (checks/rules/network_sweep.py)."""

from __future__ import annotations

import itertools

import pytest

from nodecheck.checks.rules.network_sweep import (
    Localisation,
    PairFigure,
    bus_factor,
    localise,
    pair_rounds,
    planned_rounds,
    should_sweep,
    stability,
    sweep_is_done,
)

GB = 1e9
NODES = [f"node-{i}" for i in range(8)]


def measured(
    nodes: list[str],
    rounds: int,
    slow_nodes: frozenset[str] = frozenset(),
    slow_links: frozenset[frozenset[str]] = frozenset(),
) -> list[PairFigure]:
    """What a sweep of `rounds` rounds measures: 10 GB/s healthy, 2 GB/s through a slow
    node, 3 GB/s over a slow link, the healthy figures a little apart as real ones are."""
    figures = []
    for number, pairs in enumerate(pair_rounds(len(nodes), rounds), start=1):
        for index, (a, b) in enumerate(pairs):
            first, second = nodes[a], nodes[b]
            busbw = (10.0 - 0.1 * index) * GB
            if {first, second} & slow_nodes:
                busbw = 2.0 * GB
            elif frozenset((first, second)) in slow_links:
                busbw = 3.0 * GB
            figures.append(PairFigure(number, first, second, busbw))
    return figures


def sweep(
    nodes: list[str],
    slow_nodes: frozenset[str] = frozenset(),
    slow_links: frozenset[frozenset[str]] = frozenset(),
) -> tuple[int, Localisation]:
    """Round by round as the child runs it: the rounds it took, and the localisation."""
    planned = planned_rounds(len(nodes))
    for rounds in range(1, planned + 1):
        figures = measured(nodes, rounds, slow_nodes, slow_links)
        found = localise(nodes, figures, warn=0.9, fail=0.8)
        if sweep_is_done(found, rounds, planned):
            return rounds, found
    raise AssertionError("the sweep ran past its plan")


@pytest.mark.parametrize("count", [2, 3, 4, 5, 7, 8, 9, 16])
def test_every_round_is_disjoint_pairs_and_no_pair_repeats(count: int) -> None:
    rounds = pair_rounds(count, count)  # asked for more than there are: all distinct ones
    seen: set[tuple[int, int]] = set()
    for pairs in rounds:
        ends = [end for pair in pairs for end in pair]
        assert len(ends) == len(set(ends))  # a node is in one pair of a round at most
        assert len(pairs) == count // 2  # an odd count gives exactly one node a bye
        assert not seen & set(pairs)
        seen |= set(pairs)
    # Every distinct pairing: the full round robin.
    assert seen == set(itertools.combinations(range(count), 2))
    assert len(rounds) == (count - 1 if count % 2 == 0 else count)


def test_planned_rounds() -> None:
    assert [planned_rounds(n) for n in (1, 2, 3, 4, 8, 64)] == [0, 1, 3, 3, 3, 3]


def test_a_healthy_set_names_nothing_after_one_round() -> None:
    rounds, found = sweep(NODES)
    assert rounds == 1
    assert found.slow_nodes == () and found.slow_links == () and found.confident
    assert {v.status for v in found.verdicts} == {"ok"}


def test_one_slow_node_among_8_is_named_in_two_rounds() -> None:
    rounds, found = sweep(NODES, slow_nodes=frozenset({"node-5"}))
    assert rounds == 2
    assert found.slow_nodes == ("node-5",) and found.slow_links == ()
    assert found.confident
    verdict = {v.node: v for v in found.verdicts}
    assert verdict["node-5"].culprit == "node" and verdict["node-5"].status == "fail"
    assert "node-5 is slow with every partner (2): 2.00 GB/s" in verdict["node-5"].message
    # Its partners were slow with it only: nothing is said against them.
    assert all(v.status == "ok" for node, v in verdict.items() if node != "node-5")


def test_after_one_round_a_slow_pair_is_not_yet_a_verdict() -> None:
    found = localise(
        NODES, measured(NODES, 1, slow_nodes=frozenset({"node-5"})), warn=0.9, fail=0.8
    )
    # Both ends are slow with their one partner: which one is not known yet.
    assert len(found.slow_nodes) == 2 and not found.confident


def test_two_slow_nodes_among_8_are_named_in_at_most_three_rounds() -> None:
    rounds, found = sweep(NODES, slow_nodes=frozenset({"node-2", "node-6"}))
    assert rounds <= 3
    assert found.slow_nodes == ("node-2", "node-6") and found.confident
    assert {v.node for v in found.verdicts if v.status != "ok"} == {"node-2", "node-6"}


def test_two_slow_nodes_with_a_common_partner_take_three_rounds() -> None:
    # node-0 meets node-7 in round 1 and node-6 in round 2 (the circle method): after two
    # rounds it too is slow with every partner; the third round clears it.
    schedule = pair_rounds(8, 2)
    assert (0, 7) in schedule[0] and (0, 6) in schedule[1]
    two = localise(NODES, measured(NODES, 2, slow_nodes=frozenset({"node-6", "node-7"})), 0.9, 0.8)
    assert "node-0" in two.slow_nodes and not two.confident
    rounds, found = sweep(NODES, slow_nodes=frozenset({"node-6", "node-7"}))
    assert rounds == 3 and found.slow_nodes == ("node-6", "node-7") and found.confident


def test_a_slow_link_is_told_apart_from_a_slow_node() -> None:
    link = frozenset(("node-1", "node-6"))  # paired in round 1
    assert (1, 6) in pair_rounds(8, 1)[0]
    rounds, found = sweep(NODES, slow_links=frozenset({link}))
    assert rounds == 2
    assert found.slow_nodes == () and found.slow_links == (("node-1", "node-6"),)
    verdict = {v.node: v for v in found.verdicts}
    assert (verdict["node-1"].culprit, verdict["node-1"].peer) == ("link", "node-6")
    assert (verdict["node-6"].culprit, verdict["node-6"].peer) == ("link", "node-1")
    assert verdict["node-1"].status == "fail"  # 3 of 10 GB/s
    assert "the link node-1 <-> node-6 is slow: 3.00 GB/s" in verdict["node-1"].message
    assert all(v.culprit == "none" for node, v in verdict.items() if node not in link)


@pytest.mark.parametrize("count", [3, 5, 7])
def test_odd_counts_name_the_slow_node(count: int) -> None:
    nodes = NODES[:count] if count <= 8 else NODES
    rounds, found = sweep(nodes, slow_nodes=frozenset({nodes[1]}))
    assert found.slow_nodes == (nodes[1],) and found.confident
    assert rounds <= 3


def test_two_nodes_cannot_tell_which_end_is_slow() -> None:
    found = localise(NODES[:2], [PairFigure(1, "node-0", "node-1", 1 * GB)], 0.9, 0.8)
    # One pair is its own reference: nothing below it. (A slow pair of two is the whole
    # job, judged against the NICs' rate, not by the sweep.)
    assert found.slow_nodes == () and found.confident


def test_a_verdict_is_low_when_named_nodes_had_too_few_partners() -> None:
    # Round 1 only, a slow node: two names with one partner each.
    found = localise(NODES, measured(NODES, 1, slow_nodes=frozenset({"node-3"})), 0.9, 0.8)
    assert {v.confidence for v in found.verdicts if v.culprit == "node"} == {"low"}


def test_the_stability_profile() -> None:
    profile = stability([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0])
    assert (profile.busbw_min, profile.busbw_median) == (1.0, 6.0)
    assert (profile.busbw_p10, profile.busbw_p90) == (2.0, 10.0)
    assert profile.cv == pytest.approx(3.1623 / 6.0, rel=1e-4)
    with pytest.raises(ValueError):
        stability([])


def test_bus_factor_is_nccl_tests() -> None:
    assert [bus_factor(n) for n in (2, 4, 8)] == [1.0, 1.5, 1.75]


def test_when_to_sweep() -> None:
    assert should_sweep("auto", 90 * GB, 100 * GB, 0.9)[0] is False
    assert should_sweep("auto", 80 * GB, 100 * GB, 0.9) == (
        True,
        "the whole job is 0.80x what its NICs should reach",
    )
    assert should_sweep("auto", 1 * GB, None, 0.9)[0] is True  # no NIC rate: the run judges
    assert should_sweep("never", 1 * GB, 100 * GB, 0.9)[0] is False
    assert should_sweep("always", 100 * GB, 100 * GB, 0.9)[0] is True
