"""The benchmark double (tests/fixtures/fake_bench_child.py) against the real child: the
same result documents, key for key, so the double cannot drift from what the judges
read. The real child runs on the CPU with real torch (matmul, all_reduce over two gloo
ranks, the host copy loop)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from nodecheck.checks.bench.child_runner import (
    CHILD_MODULE,
    CHILD_MODULE_VARIABLE,
    child_module,
    run_child,
)
from tests.fixtures.fake_bench_child import RATES_VARIABLE

DOUBLE = "tests.fixtures.fake_bench_child"
ROOT = Path(__file__).resolve().parent.parent.parent
SPECS = {
    "matmul": {"benchmark": "matmul", "device": "cpu", "dtype": "fp32", "duration_s": 0.4},
    "allreduce": {"benchmark": "allreduce", "device": "cpu", "processes": 2, "duration_s": 0.6},
    "h2d": {"benchmark": "h2d", "device": "cpu", "gpus": [], "duration_s": 0.3},
}
RATES = {
    "matmul_tflops": {"cpu": 1.5},
    "allreduce_busbw_gbps": 3.0,
    "h2d_gbps": 8.0,
    "jitter": 0.02,
}


def key_tree(value: Any) -> Any:
    """The structure of a document: a dict's keys with their subtrees, a list's elements'
    merged structure, and the kind of a leaf (a number is a number, int or float)."""
    if isinstance(value, dict):
        return {key: key_tree(item) for key, item in value.items()}
    if isinstance(value, list):
        merged: dict[str, Any] = {}
        leaves = set()
        for item in value:
            tree = key_tree(item)
            if isinstance(tree, dict):
                merged.update(tree)
            else:
                leaves.add(tree)
        return [merged] if merged else sorted(leaves)
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


@pytest.fixture
def rates_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(RATES))
    monkeypatch.setenv(RATES_VARIABLE, str(path))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return path


@pytest.mark.parametrize("benchmark", sorted(SPECS))
def test_the_double_returns_the_real_childs_keys(
    benchmark: str, rates_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = SPECS[benchmark]
    monkeypatch.delenv(CHILD_MODULE_VARIABLE, raising=False)
    real = run_child(spec, 120)
    assert real.result is not None, real.error
    monkeypatch.setenv(CHILD_MODULE_VARIABLE, DOUBLE)
    fake = run_child(spec, 60)
    assert fake.result is not None, f"{fake.error}: {fake.stderr_tail}"
    assert key_tree(fake.result) == key_tree(real.result)
    assert abs(CONFIGURED[benchmark](fake.result) / EXPECTED[benchmark] - 1) <= 0.02  # the double's


CONFIGURED = {
    "matmul": lambda result: result["devices"]["cpu"]["tflops"],
    "allreduce": lambda result: result["payloads"][0]["busbw_gbps"],
    "h2d": lambda result: result["devices"]["cpu"]["h2d_bytes_per_second"],
}
EXPECTED = {"matmul": 1.5, "allreduce": 3.0, "h2d": 8e9}


def test_the_double_gives_the_configured_rates_with_a_small_steady_jitter(
    rates_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHILD_MODULE_VARIABLE, DOUBLE)
    spec = {**SPECS["matmul"], "device": "cuda", "gpus": [0, 1, 2]}
    rates_file.write_text(json.dumps({"matmul_tflops": {"0": 700, "1": 595}, "jitter": 0.01}))
    first = run_child(spec, 60)
    assert first.result is not None, first.error
    devices = first.result["devices"]
    assert 693 <= devices["0"]["tflops"] <= 707 and 589 <= devices["1"]["tflops"] <= 601
    assert devices["0"]["tflops"] != 700  # jittered, so medians are medians of distinct values
    assert devices["2"] == {"error": "RuntimeError: no matmul rate configured for 2"}
    again = run_child(spec, 60)
    assert again.result == first.result  # deterministic: a rerun gives the same figures


def test_without_rates_the_double_fails_as_the_child_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHILD_MODULE_VARIABLE, DOUBLE)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv(RATES_VARIABLE, raising=False)
    outcome = run_child(SPECS["h2d"], 60)
    assert outcome.result is None
    assert outcome.cause == "exception"
    assert outcome.error == f"RuntimeError: {RATES_VARIABLE} names no rates file"


@pytest.mark.parametrize(
    "named",
    [
        "",
        "../x",
        "tests.fixtures.fake_bench_child; rm",
        "1abc",
        # Dotted module names, but not a test double's: a double never runs in production.
        "os",
        "http.server",
        "nodecheck.checks.bench.child",
        "testsuite.fake",
        "tests",
        "tests..x",
        # Under tests., but no double of this checkout's.
        "tests.fixtures.no_such_double",
    ],
)
def test_a_bad_module_name_is_ignored_with_a_warning(
    named: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(CHILD_MODULE_VARIABLE, named)
    with caplog.at_level(logging.WARNING):
        assert child_module() == CHILD_MODULE
    [record] = caplog.records
    assert "event=bad_child_module" in record.getMessage()
    assert named not in record.getMessage() or not named  # the value is never logged


def test_the_variable_names_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHILD_MODULE_VARIABLE, raising=False)
    assert child_module() == CHILD_MODULE
    monkeypatch.setenv(CHILD_MODULE_VARIABLE, DOUBLE)
    assert child_module() == DOUBLE


def test_every_run_with_the_double_says_so(
    rates_file: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two runs of the double, two warning lines naming it; the real child, none."""
    monkeypatch.setenv(CHILD_MODULE_VARIABLE, DOUBLE)
    with caplog.at_level(logging.WARNING, logger="nodecheck.checks.bench.child_runner"):
        for _ in range(2):
            outcome = run_child(SPECS["h2d"], 60)
            assert outcome.result is not None, outcome.error
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [f"event=bench_child_double module={DOUBLE} reason={DOUBLE_REASON!r}"] * 2
    caplog.clear()
    monkeypatch.delenv(CHILD_MODULE_VARIABLE)
    with caplog.at_level(logging.WARNING, logger="nodecheck.checks.bench.child_runner"):
        assert run_child(SPECS["h2d"], 120).result is not None
    assert caplog.records == []


DOUBLE_REASON = "a test double runs in place of the benchmark: its figures are not measurements"


def test_a_tests_folder_in_the_working_directory_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`python -m` would import tests.evil from the working directory: the double must be
    a file of nodecheck's own checkout, and the child runs from there."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "evil.py").write_text("raise SystemExit('foreign code ran')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CHILD_MODULE_VARIABLE, "tests.evil")
    with caplog.at_level(logging.WARNING):
        assert child_module() == CHILD_MODULE
    assert "event=bad_child_module" in caplog.text
