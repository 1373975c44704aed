"""The shipped alert rules: valid, unit-tested alert by alert, and about metrics that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodecheck.agent.exporter import OWN_FAMILIES
from nodecheck.checks.registry import load_benchmarks, load_checks
from nodecheck.checks.result import MetricSpec

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "monitoring" / "alerts.yml"
RULE_TESTS = ROOT / "tests" / "monitoring" / "alerts_test.yml"
pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian's prometheus; make test installs it)"
)
# Families the exporter builds itself (agent/exporter.py), besides the checks' samples.
# The families the exporter writes itself, besides the checks' own.
EXPORTER_METRICS = OWN_FAMILIES


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, check=False, cwd=RULE_TESTS.parent
    )


def test_rules_are_valid() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    alerts = len(re.findall(r"^\s*- alert: ", RULES.read_text(), re.MULTILINE))
    assert alerts >= 15 and f"SUCCESS: {alerts} rules found" in done.stdout


def test_every_alert_is_unit_tested() -> None:
    alerts = set(re.findall(r"^\s*- alert: (\w+)", RULES.read_text(), re.MULTILINE))
    tests = RULE_TESTS.read_text()
    tested = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n", tests))
    assert alerts and alerts == tested
    done = promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_broken_alert_fails_its_test(tmp_path: Path) -> None:
    """The unit tests would notice: raise a threshold and the straggler alert goes quiet."""
    broken = tmp_path / "alerts.yml"
    broken.write_text(RULES.read_text().replace("peer_ratio < 0.9", "peer_ratio < 0.5"))
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(RULE_TESTS.read_text().replace("../../monitoring/alerts.yml", str(broken)))
    done = subprocess.run(
        ["promtool", "test", "rules", str(tests)], capture_output=True, text=True, check=False
    )
    assert done.returncode != 0 and "NodecheckMatmulStraggler" in done.stdout + done.stderr


def metric_specs() -> list[MetricSpec]:
    """Every MetricSpec the checks and benchmarks declare (module globals, or in a dict)."""
    load_checks()
    load_benchmarks()
    specs = []
    for module in list(sys.modules.values()):
        if module is not None and getattr(module, "__name__", "").startswith("nodecheck.checks."):
            for value in vars(module).values():
                candidates = value.values() if isinstance(value, dict) else [value]
                specs += [c for c in candidates if isinstance(c, MetricSpec)]
    return specs


def exported_metrics() -> set[str]:
    return set(EXPORTER_METRICS) | {spec.name for spec in metric_specs()}


# promtool misses these (conventions.md): units must be base units, plural, lower case.
NOT_BASE_UNITS = (
    "_percent",
    "_pct",
    "_ms",
    "_milliseconds",
    "_mhz",
    "_kb",
    "_mb",
    "_gb",
    "_gbps",
    "_tflops",
    "_mw",
    "_kelvin",
    "_minutes",
    "_hours",
)


def test_metric_names_follow_the_conventions() -> None:
    specs = metric_specs()
    assert len(specs) > 40
    for spec in specs:
        assert re.fullmatch(r"nodecheck_[a-z0-9_]+", spec.name), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert not spec.name.endswith(NOT_BASE_UNITS), spec.name
        assert spec.help and spec.kind in ("gauge", "counter")
        assert "type" not in spec.labels and "hostname" not in spec.labels, spec.name


def test_alerts_use_metrics_that_exist() -> None:
    used = set(re.findall(r"\bnodecheck_[a-z_]+", RULES.read_text()))
    missing = used - exported_metrics()
    assert used and missing == set()


def alert_block(name: str) -> str:
    """The text of one alert rule of alerts.yml, up to the next rule."""
    text = RULES.read_text()
    start = text.index(f"- alert: {name}\n")
    end = text.find("- alert: ", start + 1)
    return text[start : end if end != -1 else len(text)]


def matched_actions(block: str) -> set[str]:
    """The action label values the block's `action=~"a|b"` matchers name."""
    return {a for group in re.findall(r'action=~"([^"]+)"', block) for a in group.split("|")}


def test_every_xid_action_that_needs_someone_alerts() -> None:
    """Every action of the XID catalog that gpu_xid judges as pending beyond an application
    restart is matched by an alert: a reset, a reboot or the driver's recovery action (XID
    154) pages; an XID the catalog does not settle pages with a recovery action pending and
    warns without one. The label value is the action's name, as gpu_xid exports it."""
    from nodecheck.checks.gpu.xid import NO_ACTION, UNSETTLED_ACTIONS, WINDOWED_ACTIONS
    from nodecheck.checks.node.xid_catalog import XID_CATALOG, XidAction

    drain = alert_block("NodecheckXidNeedsDrain")
    unexpected = alert_block("NodecheckXidUnexpected")
    assert "nodecheck_gpu_recovery_action > 0" in drain and "severity: critical" in drain
    paged, unsettled = (matched_actions(b) for b in (drain, unexpected))
    assert unsettled <= paged  # they page too while the driver asks for recovery
    names = {action.name.lower() for action in XidAction}
    assert paged | unsettled <= names
    quiet = {a.name.lower() for a in (*NO_ACTION, XidAction.RESTART_APP)}
    windowed = {a.name.lower() for a in WINDOWED_ACTIONS} - quiet
    assert unsettled == windowed == {a.name.lower() for a in UNSETTLED_ACTIONS}
    assert paged == names - quiet
    # The catalog's reset and restart XIDs are among them (NVIDIA's XID catalog).
    for xid in (46, 48, 79, 110, 119, 140, 151, 154):
        assert XID_CATALOG[xid].action.name.lower() in paged - unsettled, xid


DASHBOARD = ROOT / "monitoring" / "grafana" / "nodecheck.json"


def panel_exprs(title_start: str) -> list[str]:
    """The queries of the dashboard panel whose title starts so, for one instance."""
    import json

    [panel] = [
        p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"].startswith(title_start)
    ]
    return [str(t["expr"]).replace("$instance", "dgx01:19410") for t in panel["targets"]]


def eval_with_promtool(
    tmp_path: Path, series: dict[str, str], expr: str, expected: dict[str, float]
) -> subprocess.CompletedProcess[str]:
    """promtool's unit test of one query on `series` at 1m: passes when it gives `expected`."""
    lines = [
        "rule_files: []",
        "evaluation_interval: 1m",
        "tests:",
        "  - interval: 1m",
        "    input_series:",
    ]
    for name, values in series.items():
        lines += [f"      - series: '{name}'", f"        values: '{values}'"]
    lines += ["    promql_expr_test:", f"      - expr: '{expr}'", "        eval_time: 1m"]
    lines.append("        exp_samples:")
    for labels, value in expected.items():
        lines += [f"          - labels: '{labels}'", f"            value: {value}"]
    path = tmp_path / "panel_test.yml"
    path.write_text("\n".join(lines) + "\n")
    return subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, check=False
    )


def test_matmul_fallback_compares_with_the_median(tmp_path: Path) -> None:
    """Without the agent's peer ratio (an older agent), the panel divides by the node's
    median GPU, as the benchmark does, not by its fastest: 90 of a median 90 is 1."""
    labels = 'instance="dgx01:19410",job="nodecheck",model="H100",dtype="bf16"'
    series = {
        f'nodecheck_bench_matmul_flops_per_second{{{labels},gpu="{gpu}"}}': f"{rate}x2"
        for gpu, rate in ((0, 100), (1, 90), (2, 45))
    }
    [expr] = panel_exprs("Matmul vs the node's median")
    expected = {
        f'{{{labels},gpu="{gpu}"}}': ratio for gpu, ratio in ((0, 100 / 90), (1, 1.0), (2, 0.5))
    }
    done = eval_with_promtool(tmp_path, series, expr, expected)
    assert done.returncode == 0, done.stdout + done.stderr


def test_memory_errors_panel_keeps_the_count_and_the_flag_apart(tmp_path: Path) -> None:
    """2 uncorrectable errors and a pending remap are 2 and 1, never 3."""
    labels = 'instance="dgx01:19410",job="nodecheck",gpu="1",bus_id="0000:1a:00.0",model="H100"'
    series = {
        f"nodecheck_gpu_ecc_volatile_uncorrected_errors_total{{{labels}}}": "2x2",
        f"nodecheck_gpu_row_remap_pending{{{labels}}}": "1x2",
    }
    exprs = panel_exprs("GPU memory errors")
    assert len(exprs) == 2
    for expr, name, value in zip(
        exprs,
        ("nodecheck_gpu_ecc_volatile_uncorrected_errors_total", "nodecheck_gpu_row_remap_pending"),
        (2, 1),
        strict=True,
    ):
        done = eval_with_promtool(tmp_path, series, expr, {f"{name}{{{labels}}}": value})
        assert done.returncode == 0, done.stdout + done.stderr
