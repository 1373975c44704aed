"""Every metric family a check declares passes the exporter's own rules.

The exporter drops (and counts in nodecheck_exposition_dropped_samples) a sample whose
family breaks Prometheus' naming rules or the project's, so a bad name never fails a
scrape; but then the series never exists and an alert on it can never fire. This test
finds such a family before an agent does.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from nodecheck.agent.daemon.exporter import spec_problem
from nodecheck.checks.registry import load_benchmarks, load_checks
from nodecheck.checks.result import MetricSpec


def _specs(value: object, depth: int = 0) -> Iterator[MetricSpec]:
    if isinstance(value, MetricSpec):
        yield value
    elif depth < 2 and isinstance(value, dict):
        for item in value.values():
            yield from _specs(item, depth + 1)
    elif depth < 2 and isinstance(value, (tuple, list)):
        for item in value:
            yield from _specs(item, depth + 1)


def declared_specs() -> dict[str, MetricSpec]:
    load_checks()
    load_benchmarks()
    found: dict[str, MetricSpec] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("nodecheck.checks") or module is None:
            continue
        for value in vars(module).values():
            for spec in _specs(value):
                found[f"{name}:{spec.name}"] = spec
    return found


def test_the_declared_families_are_found() -> None:
    names = {spec.name for spec in declared_specs().values()}
    # One of each kind of declaration: a module constant, a dict of them, a built one.
    assert "nodecheck_rdma_port_active" in names
    assert "nodecheck_rdma_port_link_downed_total" in names
    assert "nodecheck_bench_matmul_flops_per_second" in names
    assert len(names) > 40


def test_every_declared_family_is_exportable() -> None:
    problems = {
        where: problem
        for where, spec in declared_specs().items()
        if (problem := spec_problem(spec)) is not None
    }
    assert problems == {}
