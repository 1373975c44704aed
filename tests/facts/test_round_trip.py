"""`capture` then `check --facts` gives the live results: on every replica of
tests/fixtures/nodes.py, through every fake NVML scenario of tests/fixtures/nvml_scenarios.py
(each replica with each scenario: a scenario whose GPUs are not the tree's is a node whose
NVML and sysfs disagree, which a capture must carry just as well).

For each pair, one live pass: every check runs over the live node (each part read on
first use, as `nodecheck check` does), then that pass's facts are captured, written as
nodecheck.facts/v1 and loaded back. The loaded facts must equal the captured ones part by
part, and every check run over them must give the live results exactly (status, subject,
summary, remedy, details, samples). One capture per pair keeps NVML's growing counters the
same in both runs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import LiveFacts, Unread, dumps, loads
from nodecheck.checks.node.gpu import GpuSnapshot
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Status
from nodecheck.checks.runner import run_checks
from tests.conftest import CLEAN_ENVIRON, Node
from tests.facts.compare import comparable, differences, results_by_check
from tests.fixtures import nodes
from tests.fixtures.nvml_scenarios import SCENARIOS


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("name", sorted(nodes.NODES))
def test_a_capture_judged_anywhere_gives_the_live_results(
    name: str, scenario: str, replica_with: Callable[[str, str], Node]
) -> None:
    node = replica_with(name, scenario)
    checks = list(load_checks().values())
    live = node.context(environ=CLEAN_ENVIRON)
    live_runs = run_checks(checks, live)
    assert isinstance(live.facts, LiveFacts)
    captured = live.facts.capture()

    unread = {part: value for part, value in captured.parts.items() if isinstance(value, Unread)}
    assert unread == {}, "a replica's part could not be read"
    # The fake played this pair's scenario (a process loads one library: a stale scenario
    # would make every pair the same).
    snapshot = captured.parts["gpus"]
    assert isinstance(snapshot, GpuSnapshot)
    played = SCENARIOS[scenario]()
    if "init_error" in played:
        assert snapshot.unavailable is not None and snapshot.gpus == []
    else:
        visible = [gpu["bus_id"] for gpu in played["gpus"] if gpu.get("visible", True)]
        assert sorted(gpu.bus_id or "" for gpu in snapshot.gpus) == sorted(visible)

    loaded = loads(dumps(captured))
    assert sorted(loaded.parts) == sorted(captured.parts)
    for part, value in captured.parts.items():
        assert loaded.parts[part] == value, f"part {part} changed in the round trip"
        assert comparable(loaded.parts[part]) == comparable(value), f"part {part}'s types"
    assert (loaded.taken_at, dict(loaded.roots), loaded.nodecheck_version) == (
        captured.taken_at,
        dict(captured.roots),
        captured.nodecheck_version,
    )

    # No NVML session: the checks get the GPUs from the facts. The replica's roots stay
    # where they are, so a check that still reads the node itself reads the same tree:
    # tests/test_reads_only_in_node.py says which, and fails for any other.
    judged = CheckContext(facts=loaded, fs=node.fs, environ=dict(CLEAN_ENVIRON), uid=1000)
    judged_runs = run_checks(checks, judged)
    live_results = results_by_check(live_runs)
    judged_results = results_by_check(judged_runs)
    assert list(judged_results) == list(live_results)
    for check, results in live_results.items():
        assert comparable(judged_results[check]) == comparable(results), (
            f"{check} judged the capture differently (left: judged, right: live):\n"
            + differences(judged_results[check], results)
        )


def test_a_node_whose_inventory_cannot_be_read_still_has_its_gpus_judged(
    dgx: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One hung NIC attribute can cost the whole inventory; live, the GPU checks fall back
    to the lighter read of the GPUs on the bus, so the capture carries that read too."""
    from dataclasses import replace

    from nodecheck.checks.node import facts as facts_module

    def broken(*_: object) -> object:
        raise OSError("EIO reading a NIC attribute")

    inventory = facts_module.PARTS["inventory"]
    monkeypatch.setitem(facts_module.PARTS, "inventory", replace(inventory, reader=broken))
    checks = [check for name, check in load_checks().items() if name.startswith("gpu_")]
    live = dgx.context(environ=CLEAN_ENVIRON)
    live_results = results_by_check(run_checks(checks, live))
    assert isinstance(live.facts, LiveFacts)
    captured = live.facts.capture()
    assert isinstance(captured.parts["inventory"], Unread)
    assert "pci_gpus" in captured.parts and not isinstance(captured.parts["pci_gpus"], Unread)
    judged = CheckContext(facts=loads(dumps(captured)), environ=dict(CLEAN_ENVIRON), uid=1000)
    judged_results = results_by_check(run_checks(checks, judged))
    assert any(r.status is Status.OK for r in live_results["gpu_count"][1])
    for check, results in live_results.items():
        assert comparable(judged_results[check]) == comparable(results), check


def test_a_capture_whose_cpu_lists_expand_to_gigabytes_is_refused(dgx: Node) -> None:
    """Forty ranges of four million CPUs in a few hundred bytes: refused at once, naming
    the field, instead of taking the machine's memory."""
    import json

    from nodecheck.checks.node.facts import FactsError

    live = dgx.context(environ=CLEAN_ENVIRON)
    assert isinstance(live.facts, LiveFacts)
    document = json.loads(dumps(live.facts.capture(["inventory"])))
    document["parts"]["inventory"]["value"]["cpu"]["online"] = ",".join(["0-4194303"] * 40)
    with pytest.raises(FactsError, match=r"parts\.inventory\.value\.cpu\.online: .*too long"):
        loads(json.dumps(document))
