"""Every replica node of tests/fixtures/nodes.py, with any NVML scenario of
tests/fixtures/nvml_scenarios.py, for the tests that capture and judge facts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Node
from tests.fixtures import nodes
from tests.fixtures.nodegen import build_node
from tests.fixtures.nvml_scenarios import SCENARIOS, Scenario, write_scenario

# A replica that nvml_scenarios.py gives no scenario is played by a fake NVML whose driver
# is not loaded, as cpu-only's is: never by this machine's NVML.
NO_DRIVER: Scenario = {
    "description": "no scenario for this replica in nvml_scenarios.py",
    "init_error": "DRIVER_NOT_LOADED",
}


def own_scenario(name: str) -> Scenario:
    """The NVML scenario that goes with replica `name`."""
    return SCENARIOS[name]() if name in SCENARIOS else NO_DRIVER


@pytest.fixture(scope="session")
def replica(
    build: Callable[..., Node], scratch_dir: Path, fake_nvml_library: Path
) -> Callable[[str], Node]:
    """The replica `name` of nodes.NODES with its own NVML scenario, built once per session
    (through conftest's `build` where nvml_scenarios.py has its scenario)."""
    cache: dict[str, Node] = {}

    def make(name: str) -> Node:
        if name not in cache:
            if name in SCENARIOS:
                cache[name] = build(name)
            else:
                root = build_node(nodes.NODES[name](), scratch_dir / name)
                scenario = write_scenario(own_scenario(name), root / "nvml-scenario.json")
                cache[name] = Node(root, fake_nvml_library, scenario)
        return cache[name]

    return make


@pytest.fixture(scope="session")
def replica_with(replica: Callable[[str], Node], scratch_dir: Path) -> Callable[[str, str], Node]:
    """Replica `name` played by NVML scenario `scenario` (a key of SCENARIOS)."""
    directory = scratch_dir / "facts-scenarios"
    directory.mkdir(exist_ok=True)

    def make(name: str, scenario: str) -> Node:
        path = directory / f"{name}+{scenario}.json"
        return replica(name).with_scenario(SCENARIOS[scenario](), path)

    return make
