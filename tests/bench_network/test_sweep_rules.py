"""The sweep's schedule and localisation on literal figures (checks/rules/network_sweep.py)."""

from __future__ import annotations

import itertools

import pytest

from nodecheck.checks.rules.network_sweep import (
    CONFIRMING_PARTNERS,
    MAX_ROUNDS,
    MIN_ROUNDS,
    Localisation,
    PairFigure,
    bus_factor,
    localise,
    pair_rounds,
    planned_rounds,
    should_sweep,
    stability,
    sweep_is_done,
    whole_job_shortfall,
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
    assert [planned_rounds(n) for n in (1, 2, 3, 4, 8, 64)] == [0, 1, 3, 3, 4, 4]


def verdicts(found: Localisation) -> dict[str, tuple[str, str, str | None, str]]:
    """Each node's (status, culprit, peer, confidence)."""
    return {v.node: (v.status, v.culprit, v.peer, v.confidence) for v in found.verdicts}


def high(found: Localisation) -> set[str]:
    """The nodes a verdict names with high confidence: what the agent may fail on."""
    return {v.node for v in found.verdicts if v.culprit != "none" and v.confidence == "high"}


def test_a_healthy_set_names_nothing_after_two_rounds() -> None:
    rounds, found = sweep(NODES)
    assert rounds == MIN_ROUNDS == 2
    assert found.slow_nodes == () and found.slow_links == () and found.confident
    assert {v.status for v in found.verdicts} == {"ok"}


def test_one_slow_node_among_8_is_named_for_sure_in_three_rounds() -> None:
    rounds, found = sweep(NODES, slow_nodes=frozenset({"node-5"}))
    assert rounds == CONFIRMING_PARTNERS == 3
    assert found.slow_nodes == ("node-5",) and found.slow_links == ()
    assert found.confident and high(found) == {"node-5"}
    verdict = {v.node: v for v in found.verdicts}
    assert verdict["node-5"].culprit == "node" and verdict["node-5"].status == "fail"
    assert (
        "node-5 is slow with every partner (3, 3 of them fast with others): 2.00 GB/s"
        in verdict["node-5"].message
    )
    # Its partners were slow with it only: nothing is said against them.
    assert all(v.status == "ok" for node, v in verdict.items() if node != "node-5")


def test_two_rounds_name_a_slow_node_but_not_for_sure() -> None:
    found = localise(NODES, measured(NODES, 2, slow_nodes=frozenset({"node-5"})), 0.9, 0.8)
    assert found.slow_nodes == ("node-5",) and not found.confident
    assert verdicts(found)["node-5"] == ("fail", "node", None, "low")


def test_after_one_round_a_slow_pair_is_not_yet_a_verdict() -> None:
    found = localise(
        NODES, measured(NODES, 1, slow_nodes=frozenset({"node-5"})), warn=0.9, fail=0.8
    )
    # Both ends are slow with their one partner: which one is not known yet.
    assert len(found.slow_nodes) == 2 and not found.confident and high(found) == set()


def test_two_slow_nodes_among_8_are_named_for_sure_in_at_most_four_rounds() -> None:
    rounds, found = sweep(NODES, slow_nodes=frozenset({"node-2", "node-6"}))
    assert rounds <= MAX_ROUNDS == 4
    assert found.slow_nodes == ("node-2", "node-6") and found.confident
    assert high(found) == {"node-2", "node-6"}
    assert {v.node for v in found.verdicts if v.status != "ok"} == {"node-2", "node-6"}


def test_two_slow_nodes_with_a_common_partner_clear_it() -> None:
    # node-0 meets node-1 in round 1 and node-3 in round 2: after two rounds it too is
    # slow with every partner, never for sure; the third round clears it.
    schedule = pair_rounds(8, 2)
    assert (0, 1) in schedule[0] and (0, 3) in schedule[1]
    slow = frozenset({"node-1", "node-3"})
    two = localise(NODES, measured(NODES, 2, slow_nodes=slow), 0.9, 0.8)
    assert "node-0" in two.slow_nodes and high(two) == set()
    rounds, found = sweep(NODES, slow_nodes=slow)
    assert found.slow_nodes == ("node-1", "node-3") and found.confident and rounds <= 4
    assert high(found) == {"node-1", "node-3"}


def test_a_slow_link_is_told_apart_from_a_slow_node_and_never_sure() -> None:
    link = frozenset(("node-2", "node-3"))  # paired in round 1
    assert (2, 3) in pair_rounds(8, 1)[0]
    rounds, found = sweep(NODES, slow_links=frozenset({link}))
    assert rounds == MAX_ROUNDS  # a link is never sure: every planned round is run
    assert found.slow_nodes == () and found.slow_links == (("node-2", "node-3"),)
    verdict = {v.node: v for v in found.verdicts}
    assert verdicts(found)["node-2"] == ("fail", "link", "node-3", "low")
    assert verdicts(found)["node-3"] == ("fail", "link", "node-2", "low")
    assert "the link node-2 <-> node-3 is slow: 3.00 GB/s" in verdict["node-2"].message
    assert "in one measurement" in verdict["node-2"].message
    assert all(v.culprit == "none" for node, v in verdict.items() if node not in link)
    assert high(found) == set() and not found.confident


def test_one_noisy_pair_names_nobody_for_sure() -> None:
    # A healthy set, one pair of round 1 at 0.75x (noise, a busy switch port).
    figures = measured(NODES, 4)
    figures[0] = PairFigure(1, figures[0].first, figures[0].second, 7.5 * GB)
    found = localise(NODES, figures, 0.9, 0.8)
    assert found.slow_nodes == () and len(found.slow_links) == 1
    assert high(found) == set()


def test_a_fabric_of_two_leaves_names_nobody_for_sure() -> None:
    # Nodes 0-3 under one leaf switch, 4-7 under another: pairs across leaves 0.75x, no
    # fault at all. A node may meet only far partners in some rounds, never for sure.
    leaf = {node: int(node.split("-")[1]) // 4 for node in NODES}
    for rounds in range(1, 5):
        figures = [
            PairFigure(f.round, f.first, f.second, f.busbw * (0.75 if far else 1.0))
            for f in measured(NODES, rounds)
            for far in [leaf[f.first] != leaf[f.second]]
        ]
        assert high(localise(NODES, figures, 0.9, 0.8)) == set(), rounds


@pytest.mark.parametrize("count", [3, 5, 7])
def test_odd_counts_name_the_slow_node(count: int) -> None:
    nodes = NODES[:count]
    for slow in nodes:
        rounds, found = sweep(nodes, slow_nodes=frozenset({slow}))
        assert rounds <= planned_rounds(count)
        if count == 3:  # two of the three pairs hold it: the reference itself is slow
            assert high(found) == set()
            continue
        assert found.slow_nodes == (slow,), (slow, found.verdicts)
        assert high(found) <= {slow}


@pytest.mark.parametrize("count", [3, 5, 7, 8])
def test_a_slow_link_never_makes_a_node_named_for_sure(count: int) -> None:
    nodes = NODES[:count]
    for a, b in itertools.combinations(nodes, 2):
        _, found = sweep(nodes, slow_links=frozenset({frozenset((a, b))}))
        assert high(found) == set(), (a, b, found.verdicts)


def test_a_slow_node_beside_a_slow_link_names_only_the_node_for_sure() -> None:
    # node-0 meets node-7 (slow) in round 4 and node-5 over a slow link in round 3.
    link = frozenset(("node-0", "node-5"))
    _, found = sweep(NODES, slow_nodes=frozenset({"node-7"}), slow_links=frozenset({link}))
    assert high(found) == {"node-7"}
    assert verdicts(found)["node-0"] == ("fail", "link", "node-5", "low")


def test_a_slow_whole_job_with_nobody_named_warns_every_node() -> None:
    shortfall = "the whole job is 0.60x what its NICs should reach"
    found = localise(NODES, measured(NODES, 2), 0.9, 0.8, shortfall)
    assert set(verdicts(found).values()) == {("warn", "none", None, "low")}
    assert all(shortfall in v.message for v in found.verdicts)
    # A name explains the shortfall: the others are ok.
    named = localise(NODES, measured(NODES, 3, frozenset({"node-5"})), 0.9, 0.8, shortfall)
    assert {v.status for v in named.verdicts if v.node != "node-5"} == {"ok"}


def test_two_nodes_cannot_tell_which_end_is_slow() -> None:
    found = localise(NODES[:2], [PairFigure(1, "node-0", "node-1", 1 * GB)], 0.9, 0.8)
    # One pair is its own reference: nothing below it. (A slow pair of two is the whole
    # job, judged against the NICs' rate, not by the sweep.)
    assert found.slow_nodes == () and high(found) == set()


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


def test_the_whole_jobs_shortfall_is_the_auto_sweeps_reason() -> None:
    """The sweep's verdicts say the same shortfall that made `auto` sweep; none where the
    job reached its NICs' rate or had none to judge by (gloo), whatever --sweep said."""
    assert (
        whole_job_shortfall(80 * GB, 100 * GB, 0.9)
        == should_sweep("auto", 80 * GB, 100 * GB, 0.9)[1]
    )
    assert whole_job_shortfall(90 * GB, 100 * GB, 0.9) is None
    assert whole_job_shortfall(1 * GB, None, 0.9) is None
