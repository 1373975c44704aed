"""Golden files, in node_exporter's style (its end-to-end test compares the metrics of a
fixture tree with a committed output file): for each replica node of tests/fixtures/nodes.py
and its NVML scenario (tests/fixtures/nvml_scenarios.py, played by tests/fake_nvml),

    tree -> facts:     the nodecheck.facts/v1 capture,   tests/golden/<node>.facts.json
    facts -> results:  the nodecheck.check/v2 document,  tests/golden/<node>.results.json

A difference fails with a diff. `pytest --update-golden` (or NODECHECK_UPDATE_GOLDEN=1)
rewrites the files instead; review their diff as you would code.

Only what must differ between two runs is normalised: the temporary root's path in every
string ("<root>"), the capture's taken_at and the nodecheck version, monotonic read_at
times, the replica's boot time (a replica boots two days before the test builds it, so
/proc/stat's btime is the build's time: "<boot time>", and each kernel-log time as an
offset from it), a part read from the Python running the tests, not from the replica
(the installed torch's version), and the results document's written_at and each check's
finished_at (the wall clock when the test judged). The fake's counters that grow with
time since its load (`{"base": B, "per_s": R}`: throttle time, replays, NVLink errors)
are read at their base, by giving the fake each scenario with its rates at zero: a golden
must not depend on how many milliseconds the reading took. tests/facts/test_round_trip.py
runs the scenarios as they are.
"""

from __future__ import annotations

import difflib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodecheck.agent.findings import StoredRun, check_document
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import LiveFacts, dumps, facts_document, loads
from nodecheck.checks.registry import load_checks
from nodecheck.checks.runner import run_checks
from tests.conftest import CLEAN_ENVIRON, UPDATE_GOLDEN_VARIABLE, Node
from tests.facts.conftest import own_scenario
from tests.fixtures import nodes
from tests.fixtures.nodegen import build_node
from tests.fixtures.nvml_scenarios import Scenario, write_scenario

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
DIFF_LINES = 120  # of a difference shown in the failure; the rest is counted


def at_base(scenario: Any) -> Any:
    """The scenario with every growing counter (`{"base": B, "per_s": R}`) read as B."""
    if isinstance(scenario, dict):
        if scenario and set(scenario) <= {"base", "per_s"}:
            return scenario.get("base", 0)
        return {key: at_base(value) for key, value in scenario.items()}
    if isinstance(scenario, list):
        return [at_base(item) for item in scenario]
    return scenario


def _strings(value: Any, root: str) -> Any:
    if isinstance(value, str):
        return value.replace(root, "<root>")
    if isinstance(value, dict):
        return {_strings(k, root): _strings(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_strings(item, root) for item in value]
    return value


def _times(value: Any, boot_time: float | None) -> Any:
    """read_at -> "<monotonic>"; boot_time -> "<boot time>"; a kernel-log time `at` ->
    "<boot time> + N s"."""
    if isinstance(value, list):
        return [_times(item, boot_time) for item in value]
    if not isinstance(value, dict):
        return value
    normalised = {}
    for key, item in value.items():
        number = isinstance(item, (int, float)) and not isinstance(item, bool)
        if key == "read_at" and number:
            normalised[key] = "<monotonic>"
        elif key == "boot_time" and number:
            normalised[key] = "<boot time>"
        elif key == "at" and number and boot_time is not None:
            normalised[key] = f"<boot time> + {item - boot_time:g} s"
        else:
            normalised[key] = _times(item, boot_time)
    return normalised


# Parts read from the Python that runs nodecheck rather than from the node's roots: the
# replica does not decide them, the machine running the tests does.
OF_THIS_PYTHON = {"torch_version": "<the torch installed beside the tests>"}


def normalised_facts(document: dict[str, Any], root: Path) -> dict[str, Any]:
    """A facts document with what varies between runs replaced by a placeholder."""
    kernel_log = document["parts"].get("kernel_log", {}).get("value") or {}
    boot_time = kernel_log.get("boot_time")
    result = _times(_strings(document, str(root)), boot_time)
    result["taken_at"] = "<taken_at>"
    result["nodecheck_version"] = "<version>"
    for name, placeholder in OF_THIS_PYTHON.items():
        if name in result["parts"]:
            result["parts"][name] = placeholder
    return result  # type: ignore[no-any-return]


def normalised_results(document: dict[str, Any], root: Path) -> dict[str, Any]:
    """A check document with the root's path and the wall-clock times replaced."""
    result: dict[str, Any] = _strings(document, str(root))
    result["written_at"] = "<written_at>"
    for entry in result["checks"]:
        entry["finished_at"] = "<finished_at>"
    return result


def golden_text(document: Any) -> str:
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False, default=str) + "\n"


def compare_with_golden(path: Path, text: str, update: bool) -> None:
    """Fail with a diff when `path` does not hold `text`; rewrite it when `update`."""
    if update:
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(
            f"no golden file {path.name}: write it with `pytest --update-golden` "
            f"(or {UPDATE_GOLDEN_VARIABLE}=1) and review it"
        )
    expected = path.read_text()
    if expected == text:
        return
    diff = list(
        difflib.unified_diff(
            expected.splitlines(),
            text.splitlines(),
            f"{path.name} (golden)",
            "this run",
            lineterm="",
        )
    )
    shown = "\n".join(diff[:DIFF_LINES])
    more = f"\n... and {len(diff) - DIFF_LINES} more diff lines" if len(diff) > DIFF_LINES else ""
    pytest.fail(
        f"{path.name} differs from this run:\n{shown}{more}\n"
        f"If the change is intended: `pytest --update-golden` (or {UPDATE_GOLDEN_VARIABLE}=1), "
        "then review the diff of tests/golden/",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def fresh_replica(scratch_dir: Path, fake_nvml_library: Path) -> Callable[[str, Scenario], Node]:
    """Replica `name` built now (its boot time two days before now, so that "N min ago" in
    a result is what the replica describes), with `scenario`."""
    directory = scratch_dir / "golden"

    def make(name: str, scenario: Scenario) -> Node:
        root = build_node(nodes.NODES[name](), directory / name)
        return Node(root, fake_nvml_library, write_scenario(scenario, root / "nvml-scenario.json"))

    return make


@pytest.mark.parametrize("name", sorted(nodes.NODES))
def test_replica_tree_to_facts_to_results_as_the_golden_files_say(
    name: str, fresh_replica: Callable[[str, Scenario], Node], update_golden: bool
) -> None:
    node = fresh_replica(name, at_base(own_scenario(name)))
    live = node.context(environ=CLEAN_ENVIRON).facts
    assert isinstance(live, LiveFacts)
    captured = live.capture()
    facts = normalised_facts(facts_document(captured), node.root)
    compare_with_golden(GOLDEN / f"{name}.facts.json", golden_text(facts), update_golden)

    loaded = loads(dumps(captured))
    # The replica's roots stay where they are: a check that still reads the node itself
    # reads the same tree (tests/test_reads_only_in_node.py says which, and fails for any
    # other); NVML is never asked, the facts hold its readings.
    judged = CheckContext(facts=loaded, fs=node.fs, environ=dict(CLEAN_ENVIRON), uid=1000)
    runs = run_checks(list(load_checks().values()), judged)
    now = time.time()  # as `nodecheck check --json` dates its document
    stored = [StoredRun(run, now, run.check.interval_s) for run in runs]
    results = normalised_results(check_document(loaded.get("hostname"), stored, now), node.root)
    compare_with_golden(GOLDEN / f"{name}.results.json", golden_text(results), update_golden)


def test_every_golden_file_belongs_to_a_replica() -> None:
    expected = {f"{name}.{kind}.json" for name in nodes.NODES for kind in ("facts", "results")}
    found = {path.name for path in GOLDEN.glob("*.json")}
    assert found - expected == set(), "golden files of no replica in tests/fixtures/nodes.py"


def test_the_golden_comparison_fails_with_a_diff_and_rewrites_when_told(tmp_path: Path) -> None:
    golden = tmp_path / "node.facts.json"
    golden.write_text(golden_text({"parts": {"hostname": {"value": "dgx-01"}}}))
    compare_with_golden(golden, golden_text({"parts": {"hostname": {"value": "dgx-01"}}}), False)
    changed = golden_text({"parts": {"hostname": {"value": "dgx-02"}}})
    with pytest.raises(pytest.fail.Exception) as failure:
        compare_with_golden(golden, changed, False)
    assert '-   "value": "dgx-01"' in str(failure.value)
    assert '+   "value": "dgx-02"' in str(failure.value)
    assert "--update-golden" in str(failure.value)
    compare_with_golden(golden, changed, True)
    assert golden.read_text() == changed
    with pytest.raises(pytest.fail.Exception, match="no golden file"):
        compare_with_golden(tmp_path / "absent.json", changed, False)


def test_normalising_replaces_only_what_varies_between_runs() -> None:
    root = Path("/dev/shm/nodecheck-tests-x/dgx")
    document = {
        "schema": "nodecheck.facts/v1",
        "taken_at": 1796134522.7,
        "nodecheck_version": "0.1.0",
        "roots": {"sysfs": f"{root}/sys"},
        "parts": {
            "kernel_log": {
                "value": {
                    "boot_time": 1795961722.0,
                    "source": f"{root}/dev/kmsg",
                    "xids": [{"at": 1796048122.0, "xid": 13}],
                }
            },
            "gpus": {"value": {"gpus": [{"read_at": 21321.35, "power_w": 71.0, "index": 0}]}},
            "torch_version": {"value": {"text": "2.13.0+cpu", "version": [2, 13]}},
        },
    }
    assert normalised_facts(document, root) == {
        "schema": "nodecheck.facts/v1",
        "taken_at": "<taken_at>",
        "nodecheck_version": "<version>",
        "roots": {"sysfs": "<root>/sys"},
        "parts": {
            "kernel_log": {
                "value": {
                    "boot_time": "<boot time>",
                    "source": "<root>/dev/kmsg",
                    "xids": [{"at": "<boot time> + 86400 s", "xid": 13}],
                }
            },
            "gpus": {"value": {"gpus": [{"read_at": "<monotonic>", "power_w": 71.0, "index": 0}]}},
            "torch_version": "<the torch installed beside the tests>",
        },
    }


def test_a_growing_counter_is_read_at_its_base() -> None:
    scenario = {
        "gpus": [
            {
                "bus_id": "0000:18:00.0",
                "throttle_ns": {"sw_power_cap": {"base": 9_000_000_000, "per_s": 200_000_000}},
                "pcie_replay": {"per_s": 30},
                "nvlink": {"links": 18, "down": [3, 7], "crc_flit": {"base": 12, "per_s": 1}},
                "ecc": {"volatile_uncorrected": 2},
            }
        ]
    }
    assert at_base(scenario) == {
        "gpus": [
            {
                "bus_id": "0000:18:00.0",
                "throttle_ns": {"sw_power_cap": 9_000_000_000},
                "pcie_replay": 0,
                "nvlink": {"links": 18, "down": [3, 7], "crc_flit": 12},
                "ecc": {"volatile_uncorrected": 2},
            }
        ]
    }


def test_normalising_results_replaces_the_root_and_the_wall_clock_only() -> None:
    root = Path("/dev/shm/nodecheck-tests-x/dgx")
    document = {
        "schema": "nodecheck.check/v2",
        "status": "fail",
        "written_at": 1796134522.7,
        "checks": [{"check": "pcie_link", "finished_at": 1796134522.6, "interval_s": 300.0}],
        "results": [{"check": "pcie_link", "summary": f"read {root}/sys", "origin": "node"}],
    }
    assert normalised_results(document, root) == {
        "schema": "nodecheck.check/v2",
        "status": "fail",
        "written_at": "<written_at>",
        "checks": [{"check": "pcie_link", "finished_at": "<finished_at>", "interval_s": 300.0}],
        "results": [{"check": "pcie_link", "summary": "read <root>/sys", "origin": "node"}],
    }
