"""The shipped alert rules: valid, unit-tested alert by alert, and about metrics that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodecheck.agent.daemon.exporter import OWN_FAMILIES
from nodecheck.checks.registry import load_benchmarks, load_checks
from nodecheck.checks.result import MetricSpec

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "monitoring" / "alerts.yml"
RULE_TESTS = ROOT / "tests" / "monitoring" / "alerts_test.yml"
# The fleet view: recording rules, the alerts built on them, and their unit tests (the
# regression's 7 days of history in a file of its own, at 5-minute steps).
FLEET_RULES = ROOT / "monitoring" / "fleet_rules.yml"
FLEET_ALERTS = ROOT / "monitoring" / "fleet_alerts.yml"
FLEET_TESTS = (
    ROOT / "tests" / "monitoring" / "fleet_test.yml",
    ROOT / "tests" / "monitoring" / "fleet_regression_test.yml",
)
pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian's prometheus; make test installs it)"
)
# Families the exporter builds itself (agent/daemon/exporter.py), besides the checks' samples.
# The families the exporter writes itself, besides the checks' own.
EXPORTER_METRICS = OWN_FAMILIES
# The series the fleet rules (monitoring/fleet_rules.yml) join on: the operator's labels
# (the config's [labels]), each benchmark's last success, the number of checks failing and
# when the agent started. They are the agent's own families, named here until the exporter
# declares them; a name that differs from what it exports makes
# test_alerts_use_metrics_that_exist fail once it does.
FLEET_AGENT_METRICS = frozenset(
    {
        "nodecheck_node_info",
        "nodecheck_bench_last_success_timestamp_seconds",
        "nodecheck_checks_failing",
        "nodecheck_agent_start_time_seconds",
    }
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, check=False, cwd=RULE_TESTS.parent
    )


def test_rules_are_valid() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    alerts = len(re.findall(r"^\s*- alert: ", RULES.read_text(), re.MULTILINE))
    assert alerts >= 15 and f"SUCCESS: {alerts} rules found" in done.stdout


def test_fleet_rules_are_valid() -> None:
    done = promtool("check", "rules", str(FLEET_RULES), str(FLEET_ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    records = len(re.findall(r"^\s*- record: ", FLEET_RULES.read_text(), re.MULTILINE))
    alerts = len(re.findall(r"^\s*- alert: ", FLEET_ALERTS.read_text(), re.MULTILINE))
    assert records >= 15 and f"SUCCESS: {records} rules found" in done.stdout
    assert alerts == 4 and f"SUCCESS: {alerts} rules found" in done.stdout


def alerts_of(path: Path) -> set[str]:
    return set(re.findall(r"^\s*- alert: (\w+)", path.read_text(), re.MULTILINE))


def alerts_tested_in(path: Path) -> set[str]:
    """The alerts a promtool test file expects to fire at some evaluation time (an
    `exp_alerts: []` alone does not count as testing an alert)."""
    return set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n", path.read_text()))


def test_every_alert_is_unit_tested() -> None:
    alerts = alerts_of(RULES)
    tested = alerts_tested_in(RULE_TESTS)
    assert alerts and alerts == tested
    done = promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_fleet_alert_is_unit_tested() -> None:
    alerts = alerts_of(FLEET_ALERTS)
    tested = set().union(*(alerts_tested_in(path) for path in FLEET_TESTS))
    assert alerts == {
        "NodecheckFleetStraggler",
        "NodecheckFleetRegression",
        "NodecheckSharedFault",
        "NodecheckNodeStoppedReporting",
    }
    assert alerts == tested
    done = promtool("test", "rules", *(path.name for path in FLEET_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


# A recorded series' name, level:metric[:operations] (Prometheus' naming practice for
# recording rules, https://prometheus.io/docs/practices/rules/).
RECORDED_NAME = re.compile(r"\b[a-z_]+:[a-z0-9_]+(?::[a-z0-9_]+)?\b")


def recorded_names() -> set[str]:
    return set(re.findall(r"^\s*- record: (\S+)", FLEET_RULES.read_text(), re.MULTILINE))


def test_every_recording_rule_is_unit_tested() -> None:
    """Each recorded series is the subject of a promql_expr_test: its exact samples (labels
    and values) at one evaluation time, not merely used by an alert."""
    tested = set()
    for path in FLEET_TESTS:
        for expr in re.findall(r"^\s*- expr: (.+)$", path.read_text(), re.MULTILINE):
            tested |= set(RECORDED_NAME.findall(expr))
    assert recorded_names() and recorded_names() <= tested


def promtool_test_with(tmp_path: Path, rules: Path, replace: tuple[str, str]) -> str:
    """promtool's verdict on the fleet tests with one change made to one rule file (the
    regression's file only for a change to the regression alert, which alone reads 7 days:
    it is the slow one)."""
    text = rules.read_text()
    assert replace[0] in text, replace
    changed = tmp_path / rules.name
    changed.write_text(text.replace(*replace))
    other = FLEET_ALERTS if rules == FLEET_RULES else FLEET_RULES
    tests = []
    regression = "[7d]" in replace[0] or "quantile_over_time" in replace[0]
    for path in FLEET_TESTS[1:] if regression else FLEET_TESTS[:1]:
        test = tmp_path / path.name
        test.write_text(
            path.read_text()
            .replace(f"../../monitoring/{rules.name}", str(changed))
            .replace(f"../../monitoring/{other.name}", str(other))
        )
        tests.append(str(test))
    done = subprocess.run(
        ["promtool", "test", "rules", *tests], capture_output=True, text=True, check=False
    )
    assert done.returncode != 0, f"the fleet tests pass with {replace} in {rules.name}"
    return done.stdout + done.stderr


@pytest.mark.parametrize(
    ("rules", "replace", "noticed"),
    [
        # A class of 7 GPUs would get a median.
        (FLEET_RULES, ("fleet_gpus >= 8", "fleet_gpus >= 7"), "fleet_median"),
        # A class of 2 nodes would get a median (matmul and h2d).
        (FLEET_RULES, ("fleet_nodes >= 3)", "fleet_nodes >= 2)"), "fleet_median"),
        # Stale results would vote.
        (
            FLEET_RULES,
            ("< on(instance)\n            2 *", "< on(instance)\n            200 *"),
            "fresh",
        ),
        # The algorithm would split an all_reduce class: the node that fell back to ring
        # would have no median of its own to be compared with.
        (
            FLEET_RULES,
            (
                "by (model, ranks, payload_bytes) (0.5",
                "by (model, ranks, payload_bytes, algorithm) (0.5",
            ),
            "allreduce",
        ),
        # A node would be scored by its fastest GPU.
        (
            FLEET_RULES,
            (
                "min by (instance) (nodecheck:bench_matmul",
                "max by (instance) (nodecheck:bench_matmul",
            ),
            "node_fleet_ratio",
        ),
        # A node that is down would not count as failing.
        (
            FLEET_RULES,
            ('(up{job="nodecheck"} == bool 0)', '(up{job="nodecheck"} == bool 2)'),
            "node_failing",
        ),
        # A node with one failing check would not count as failing.
        (
            FLEET_RULES,
            ("(nodecheck_checks_failing > bool 0)", "(nodecheck_checks_failing > bool 1)"),
            "node_failing",
        ),
        # A node that went down would keep whichever of its racks sorts first, not its last.
        (
            FLEET_RULES,
            (
                "topk by (instance) (1,\n            timestamp(nodecheck_node_info)",
                "bottomk by (instance) (1,\n            timestamp(nodecheck_node_info)",
            ),
            "last_over_time_1d",
        ),
        (
            FLEET_ALERTS,
            ("nodecheck:node_fleet_ratio:min < 0.9", "nodecheck:node_fleet_ratio:min < 0.8"),
            "NodecheckFleetStraggler",
        ),
        (FLEET_ALERTS, ("for: 30m", "for: 20m"), "NodecheckFleetStraggler"),
        (
            FLEET_ALERTS,
            (
                "flops_per_second:fleet_median[7d]) < 0.95",
                "flops_per_second:fleet_median[7d]) < 0.97",
            ),
            "NodecheckFleetRegression",
        ),
        # A baseline over more than the past 7 days.
        (FLEET_ALERTS, ("fleet_median[7d])", "fleet_median[8d])"), "NodecheckFleetRegression"),
        # Without its guard on the class's members, the regression alert would fire when
        # the fast half of a class stops reporting.
        (
            FLEET_ALERTS,
            (
                ">= 0.9 * quantile_over_time(0.5, nodecheck:bench_matmul",
                ">= 0 * quantile_over_time(0.5, nodecheck:bench_matmul",
            ),
            "NodecheckFleetRegression",
        ),
        (
            FLEET_ALERTS,
            (
                "cluster_rack:nodecheck_node_failing:ratio > 0.25",
                "cluster_rack:nodecheck_node_failing:ratio >= 0.25",
            ),
            "NodecheckSharedFault",
        ),
        (
            FLEET_ALERTS,
            ('unless on(instance) up{job="nodecheck"}\n', "\n"),
            "NodecheckNodeStoppedReporting",
        ),
        # A node that never measured would not be reported, or one that measured would be.
        (
            FLEET_ALERTS,
            (
                "> on(instance) group_right\n              3 *",
                "> on(instance) group_right\n              30 *",
            ),
            "NodecheckNodeStoppedReporting",
        ),
        (
            FLEET_ALERTS,
            (
                "nodecheck_bench_last_success_timestamp_seconds == 0\n",
                "nodecheck_bench_last_success_timestamp_seconds >= 0\n",
            ),
            "NodecheckNodeStoppedReporting",
        ),
        # 0 is "never measured", not a measurement at the epoch: the stale branch skips it.
        (
            FLEET_ALERTS,
            (
                "time() - (nodecheck_bench_last_success_timestamp_seconds > 0)",
                "time() - (nodecheck_bench_last_success_timestamp_seconds >= 0)",
            ),
            "NodecheckNodeStoppedReporting",
        ),
    ],
)
def test_a_broken_fleet_rule_fails_its_test(
    tmp_path: Path, rules: Path, replace: tuple[str, str], noticed: str
) -> None:
    assert noticed in promtool_test_with(tmp_path, rules, replace)


def test_a_broken_alert_fails_its_test(tmp_path: Path) -> None:
    """The unit tests would notice: read the wrong action and the slow-GPU alert goes quiet."""
    broken = tmp_path / "alerts.yml"
    text = RULES.read_text()
    assert 'status="warn",action!="none"}' in text
    broken.write_text(text.replace('status="warn",action!="none"}', 'status="warn",action="none"}'))
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(RULE_TESTS.read_text().replace("../../monitoring/alerts.yml", str(broken)))
    done = subprocess.run(
        ["promtool", "test", "rules", str(tests)], capture_output=True, text=True, check=False
    )
    assert done.returncode != 0 and "NodecheckGpuSlow" in done.stdout + done.stderr


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
    """Every nodecheck_* series the rules read is one the agent exports, and every recorded
    series (level:metric:operations) the fleet alerts read is one fleet_rules.yml records."""
    for path in (RULES, FLEET_RULES, FLEET_ALERTS):
        text = path.read_text()
        records = set(re.findall(r"^\s*- record: (\S+)", text, re.MULTILINE))
        used = set(re.findall(r"\bnodecheck_[a-z0-9_]+", RECORDED_NAME.sub("", text)))
        missing = used - exported_metrics() - FLEET_AGENT_METRICS
        assert used and missing == set(), path.name
        assert set(RECORDED_NAME.findall(text)) - records <= recorded_names(), path.name


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


FLEET_DASHBOARD = ROOT / "monitoring" / "grafana" / "nodecheck-fleet.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# A query filters by the selected clusters and partitions through the operator labels of
# the node's info series (or the rules' copy of it that remembers the past day).
THROUGH_NODE_INFO = re.compile(
    r'(nodecheck_node_info|nodecheck:node_info:last_over_time_1d)\{cluster=~"\$cluster", '
    r'partition=~"\$partition"(, [a-z_]+!?=~?"[^"]*")*\}'
)


def test_fleet_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = json.loads(FLEET_DASHBOARD.read_text())
    assert dashboard["uid"] == "nodecheck-fleet" and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("cluster", "partition"):
        variable = variables[name]
        assert variable["type"] == "query" and variable["datasource"] == DATASOURCE
        assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".*"
        assert variable["definition"].startswith("label_values(nodecheck_node_info")
        assert variable["definition"].endswith(f", {name})")
    panels = dashboard["panels"]
    assert len(panels) >= 8 and len({p["id"] for p in panels}) == len(panels)
    titles = " ".join(p["title"] for p in panels)
    for about in ("Worst nodes", "TFLOPS per GPU model", "by rack", "XIDs by kind", "median"):
        assert about in titles, about
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert THROUGH_NODE_INFO.search(target["expr"]), panel["title"]


def test_fleet_dashboard_queries_parse_and_use_what_exists(tmp_path: Path) -> None:
    """Every query, with the variables as "All", is PromQL promtool accepts (each written
    as a recording rule and checked), reading only exported or recorded series."""
    from tests.fixtures.dashboards import fleet_dashboard_queries

    queries = fleet_dashboard_queries(FLEET_DASHBOARD)
    assert len(queries) >= 10
    lines = ["groups:", "  - name: fleet-dashboard", "    rules:"]
    for number, (title, expr) in enumerate(queries):
        assert "$" not in expr, title
        lines += [f"      - record: panel:query:{number}", f"        expr: {json.dumps(expr)}"]
        used = set(re.findall(r"\bnodecheck_[a-z0-9_]+", RECORDED_NAME.sub("", expr)))
        assert used - exported_metrics() - FLEET_AGENT_METRICS == set(), title
        assert set(RECORDED_NAME.findall(expr)) <= recorded_names(), title
    rules = tmp_path / "panels.yml"
    rules.write_text("\n".join(lines) + "\n")
    done = promtool("check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr


def fleet_panel_expr(title: str) -> str:
    """The one query of the fleet dashboard's panel `title`, with every cluster and
    partition selected."""
    from tests.fixtures.dashboards import fleet_dashboard_queries

    [expr] = [expr for panel, expr in fleet_dashboard_queries(FLEET_DASHBOARD) if panel == title]
    return expr


def test_failing_nodes_by_rack_leaves_out_nodes_without_a_rack(tmp_path: Path) -> None:
    """Two failing nodes, one in rack r1 and one without a rack label: the panel has one
    series, r1's, and no rackless line summing the nodes that are in no rack."""
    info = 'nodecheck:node_info:last_over_time_1d{job="nodecheck",cluster="c1",partition="gpu"'
    series = {
        f'{info},instance="g01:19410",rack="r1"}}': "1x2",
        f'{info},instance="g02:19410"}}': "1x2",
        'nodecheck:node_failing{instance="g01:19410"}': "1x2",
        'nodecheck:node_failing{instance="g02:19410"}': "1x2",
    }
    expr = fleet_panel_expr("Failing nodes by rack")
    done = eval_with_promtool(tmp_path, series, expr, {'{cluster="c1",rack="r1"}': 1})
    assert done.returncode == 0, done.stdout + done.stderr
