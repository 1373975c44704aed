"""LiveFacts reads one part at a time, and a part that hangs holds the others up only
for LiveFacts.BATON_WAIT_S, never for good."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from nodecheck.checks.node import facts as facts_module
from nodecheck.checks.node.facts import FactsSource, LiveFacts, NodeSources, PartSpec
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Status
from nodecheck.checks.runner import run_checks
from tests.conftest import CLEAN_ENVIRON, Node


class ReaderWatch:
    """Wraps every part's reader: how many threads are inside a reader at once, at most
    (a reader that asks for another part, gpus for pci_gpus, stays one thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside: dict[int, int] = {}
        self.most = 0
        self.read: list[str] = []

    def wrap(self, spec: PartSpec) -> PartSpec:
        inner = spec.reader

        def reader(sources: NodeSources, facts: FactsSource) -> Any:
            me = threading.get_ident()
            with self.lock:
                self.inside[me] = self.inside.get(me, 0) + 1
                self.most = max(self.most, len(self.inside))
                self.read.append(spec.name)
            try:
                return inner(sources, facts)
            finally:
                with self.lock:
                    self.inside[me] -= 1
                    if not self.inside[me]:
                        del self.inside[me]

        return replace(spec, reader=reader)


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Iterator[ReaderWatch]:
    watching = ReaderWatch()
    wrapped = {name: watching.wrap(spec) for name, spec in facts_module.PARTS.items()}
    monkeypatch.setattr(facts_module, "PARTS", wrapped)
    yield watching


def test_the_checks_parts_are_read_one_at_a_time(dgx: Node, watch: ReaderWatch) -> None:
    """Fifteen checks on their own threads, and one thread at a time reads a part."""
    runs = run_checks(list(load_checks().values()), dgx.context())
    assert all(run.completed for run in runs)
    assert {"inventory", "gpus", "variables", "kernel_log"} <= set(watch.read)
    assert watch.most == 1, watch.read


def test_a_hung_part_delays_the_others_but_never_stops_them(
    dgx: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part whose read never returns (a hung NFS file): the checks that need it time
    out naming it, the others read their parts past the baton and pass."""
    released = threading.Event()
    hung = facts_module.PARTS["numa_balancing"]

    def never(sources: NodeSources, facts: FactsSource) -> Any:
        released.wait(30)
        raise RuntimeError("released")

    monkeypatch.setitem(facts_module.PARTS, "numa_balancing", replace(hung, reader=never))
    checks = load_checks()
    selected = [replace(checks["numa"], timeout_s=2.0), checks["pcie_link"], checks["cpu"]]
    context = dgx.context(dict(CLEAN_ENVIRON))
    assert isinstance(context.facts, LiveFacts)
    try:
        runs = {run.check.name: run for run in run_checks(selected, context)}
    finally:
        released.set()
    assert runs["numa"].status is Status.ERROR and not runs["numa"].completed
    assert "did not finish within 2 s" in runs["numa"].results[0].summary
    assert runs["pcie_link"].completed and runs["cpu"].completed
    assert runs["pcie_link"].status is not Status.ERROR
