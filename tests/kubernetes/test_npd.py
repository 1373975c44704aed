"""`nodecheck npd`, the node-problem-detector plugin, and the fault classes it shares
with the agent's node conditions."""

from __future__ import annotations

from nodecheck.agent.fault_classes import CLASS_OF_CHECK, FaultClass, checks_of
from nodecheck.checks.registry import load_benchmarks, load_checks


def test_every_registered_check_and_benchmark_has_a_class() -> None:
    registered = set(load_checks()) | set(load_benchmarks())
    assert sorted(registered - set(CLASS_OF_CHECK)) == [], "checks without a fault class"
    assert sorted(set(CLASS_OF_CHECK) - registered) == [], "classes of checks that do not exist"


def test_every_class_has_checks_and_its_own_condition_type() -> None:
    types = [cls.condition_type for cls in FaultClass]
    assert types == ["NodecheckGpuHardware", "NodecheckGpuPerformance", "NodecheckNodeConfig"]
    for cls in FaultClass:
        assert checks_of(cls), cls
