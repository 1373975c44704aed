"""The shipped alert rules: valid, unit-tested alert by alert, and about metrics that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
    rules = len(re.findall(r"^\s*- (?:alert|record): ", RULES.read_text(), re.MULTILINE))
    assert rules >= 15 and f"SUCCESS: {rules} rules found" in done.stdout


def test_fleet_rules_are_valid() -> None:
    done = promtool("check", "rules", str(FLEET_RULES), str(FLEET_ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    records = len(re.findall(r"^\s*- record: ", FLEET_RULES.read_text(), re.MULTILINE))
    alerts = len(re.findall(r"^\s*- alert: ", FLEET_ALERTS.read_text(), re.MULTILINE))
    assert records >= 15 and f"SUCCESS: {records} rules found" in done.stdout
    assert alerts == 7 and f"SUCCESS: {alerts} rules found" in done.stdout


def alerts_of(path: Path) -> set[str]:
    return set(re.findall(r"^\s*- alert: (\w+)", path.read_text(), re.MULTILINE))


def alerts_tested_in(path: Path) -> set[str]:
    """The alerts a promtool test file expects to fire at some evaluation time (an
    `exp_alerts: []` alone does not count as testing an alert)."""
    return set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n", path.read_text()))


def alerts_tested_quiet_in(path: Path) -> set[str]:
    """The alerts a promtool test file expects not to fire at some evaluation time."""
    return set(re.findall(r"alertname: (\w+)\n\s+exp_alerts: \[\]", path.read_text()))


def test_every_alert_is_unit_tested() -> None:
    """Each alert is tested firing and, at another time or on other series, not firing."""
    alerts = alerts_of(RULES)
    assert alerts and alerts == alerts_tested_in(RULE_TESTS)
    assert alerts == alerts_tested_quiet_in(RULE_TESTS)
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
        "NodecheckRulesFailing",
        "NodecheckFleetAgentsDown",
        "NodecheckFleetClassTooSmall",
    }
    assert alerts == tested
    quiet = set().union(*(alerts_tested_quiet_in(path) for path in FLEET_TESTS))
    assert alerts == quiet
    done = promtool("test", "rules", *(path.name for path in FLEET_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_node_scraped_twice_changes_no_fleet_verdict(tmp_path: Path) -> None:
    """node_exporter scraping the agent's textfile (textfile_dir) under the same instance,
    as kube-prometheus relabels its targets: every nodecheck series twice, once under
    job="node". Joined on the instance alone, the fleet rules failed at every evaluation
    ("many-to-many matching not allowed"), leaving no median, no straggler and no
    stopped-reporting alert; selecting job="nodecheck", every recorded sample and alert of
    the fleet tests comes out as it does from one scrape. fleet_test.yml holds every join
    (the regression's file adds 7 days of the same series, and half a minute)."""
    for source in FLEET_TESTS[:1]:
        document = yaml.safe_load(source.read_text())
        document["rule_files"] = [str(FLEET_RULES), str(FLEET_ALERTS)]
        doubled = 0
        for test in document["tests"]:
            twins = []
            for entry in test.get("input_series", []):
                series = entry["series"]
                if series.startswith("nodecheck_") and 'job="nodecheck"' in series:
                    twins.append(
                        {**entry, "series": series.replace('job="nodecheck"', 'job="node"')}
                    )
                elif series.startswith("up{") and 'job="nodecheck"' in series:
                    up = series.replace('job="nodecheck"', 'job="node"')
                    twins.append({**entry, "series": up})
            test["input_series"] = test.get("input_series", []) + twins
            doubled += len(twins)
        assert doubled > 100, source  # the fleet tests' inputs, not a few of them
        path = tmp_path / source.name
        path.write_text(yaml.safe_dump(document, sort_keys=False, width=1000))
        done = promtool("test", "rules", str(path))
        assert done.returncode == 0, (source.name, done.stdout[-3000:] + done.stderr[-2000:])


# A recorded series' name, level:metric[:operations] (Prometheus' naming practice for
# recording rules, https://prometheus.io/docs/practices/rules/).
RECORDED_NAME = re.compile(r"\b[a-z_]+:[a-z0-9_]+(?::[a-z0-9_]+)?\b")


def recorded_names(*paths: Path) -> set[str]:
    """The series the rule files record (by default the fleet's)."""
    return {
        name
        for path in paths or (FLEET_RULES,)
        for name in re.findall(r"^\s*- record: (\S+)", path.read_text(), re.MULTILINE)
    }


def test_every_recording_rule_is_unit_tested() -> None:
    """Each recorded series is the subject of a promql_expr_test: its exact samples (labels
    and values) at one evaluation time, not merely used by an alert."""
    tested = set()
    for path in (*FLEET_TESTS, RULE_TESTS):
        for expr in re.findall(r"^\s*- expr: (.+)$", path.read_text(), re.MULTILINE):
            tested |= set(RECORDED_NAME.findall(expr))
    records = recorded_names(FLEET_RULES, RULES)
    assert recorded_names(RULES) and recorded_names() and records <= tested, records - tested


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
        (FLEET_RULES, (":count >= 8", ":count >= 7"), ":median"),
        # A class of 2 nodes would get a median (matmul and h2d).
        (FLEET_RULES, (":count_nodes >= 3)", ":count_nodes >= 2)"), ":median"),
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
                "min by (cluster, instance) (instance_gpu:nodecheck_bench_matmul",
                "max by (cluster, instance) (instance_gpu:nodecheck_bench_matmul",
            ),
            "ratio_to_fleet_median:min",
        ),
        # A node that is down would not count as failing.
        (
            FLEET_RULES,
            ('(up{job="nodecheck"} == bool 0)', '(up{job="nodecheck"} == bool 2)'),
            "checks_failing:bool",
        ),
        # A node with one failing check would not count as failing.
        (
            FLEET_RULES,
            (
                '(nodecheck_checks_failing{job="nodecheck"} > bool 0)',
                '(nodecheck_checks_failing{job="nodecheck"} > bool 1)',
            ),
            "checks_failing:bool",
        ),
        # A failing check whose action needs no drain would count as a hard fault.
        (
            FLEET_RULES,
            ('action=~"reset-gpu|reboot|inspect-hardware|contact-support"', 'action=~".+"'),
            "hard_fault:bool",
        ),
        # A node with no hard fault would have no 0, and racks no share.
        (
            FLEET_RULES,
            ('(nodecheck_checks_failing{job="nodecheck"} * 0)', "vector(0)"),
            "hard_fault",
        ),
        # A cluster whose every node left service discovery would have no share at all.
        (
            FLEET_RULES,
            ("or\n            0 * count by (cluster)", "or\n            1 * count by (cluster)"),
            "cluster:up:ratio",
        ),
        # A node that went down would keep whichever of its racks sorts first, not its last.
        (
            FLEET_RULES,
            (
                "topk by (instance) (1,\n            timestamp(nodecheck_node_info{job=",
                "bottomk by (instance) (1,\n            timestamp(nodecheck_node_info{job=",
            ),
            "last_over_time_1d",
        ),
        (
            FLEET_ALERTS,
            (":min[5m]) < 0.9", ":min[5m]) < 0.8"),
            "NodecheckFleetStraggler",
        ),
        (FLEET_ALERTS, ("for: 30m", "for: 20m"), "NodecheckFleetStraggler"),
        # A `for` on the score itself: a flaky target would never alert.
        (
            FLEET_ALERTS,
            (
                "max_over_time(instance:nodecheck_bench_ratio_to_fleet_median:min[5m])",
                "instance:nodecheck_bench_ratio_to_fleet_median:min",
            ),
            "NodecheckFleetStraggler",
        ),
        (
            FLEET_ALERTS,
            (
                "flops_per_second:median[7d]) < 0.95",
                "flops_per_second:median[7d]) < 0.97",
            ),
            "NodecheckFleetRegression",
        ),
        # A baseline over more than the past 7 days.
        (FLEET_ALERTS, (":median[7d])", ":median[8d])"), "NodecheckFleetRegression"),
        # Without its guard on the class's members, the regression alert would fire when
        # the fast half of a class stops reporting.
        (
            FLEET_ALERTS,
            (
                ">= 0.9 * quantile_over_time(0.5, model_dtype_shape:nodecheck_bench_matmul",
                ">= 0 * quantile_over_time(0.5, model_dtype_shape:nodecheck_bench_matmul",
            ),
            "NodecheckFleetRegression",
        ),
        (
            FLEET_ALERTS,
            (
                "cluster_rack:nodecheck_hard_fault:ratio > 0.25",
                "cluster_rack:nodecheck_hard_fault:ratio >= 0.25",
            ),
            "NodecheckSharedFault",
        ),
        # Any failing finding would be judged without the cluster's own rate.
        (
            FLEET_ALERTS,
            ("> on(cluster) group_left 3 *", "> on(cluster) group_left 0 *"),
            "NodecheckSharedFault",
        ),
        (
            FLEET_ALERTS,
            ("cluster:up:ratio < 0.9", "cluster:up:ratio < 0.6"),
            "NodecheckFleetAgentsDown",
        ),
        # One node rebooting in a small cluster would page the fleet.
        (FLEET_ALERTS, (") >= 3\n", ") >= 1\n"), "NodecheckFleetAgentsDown"),
        (
            FLEET_ALERTS,
            (":count < 8\n              or", ":count < 7\n              or"),
            "NodecheckFleetClassTooSmall",
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
                'nodecheck_bench_last_success_timestamp_seconds{job="nodecheck"} == 0\n',
                'nodecheck_bench_last_success_timestamp_seconds{job="nodecheck"} >= 0\n',
            ),
            "NodecheckNodeStoppedReporting",
        ),
        # 0 is "never measured", not a measurement at the epoch: the stale branch skips it.
        (
            FLEET_ALERTS,
            (
                'time() - (nodecheck_bench_last_success_timestamp_seconds{job="nodecheck"} > 0)',
                'time() - (nodecheck_bench_last_success_timestamp_seconds{job="nodecheck"} >= 0)',
            ),
            "NodecheckNodeStoppedReporting",
        ),
    ],
)
def test_a_broken_fleet_rule_fails_its_test(
    tmp_path: Path, rules: Path, replace: tuple[str, str], noticed: str
) -> None:
    assert noticed in promtool_test_with(tmp_path, rules, replace)


# The template every verdict alert takes its severity from; the first is NodecheckRebootNeeded's.
SEVERITY = '(ne $labels.class "node-config") }}critical'


@pytest.mark.parametrize(
    ("replace", "noticed"),
    [
        # A reboot's failure would go unalerted.
        (('action="reboot",status', 'action="rebooot",status'), "NodecheckRebootNeeded"),
        # A job's finding would page like the node's.
        (
            ('verdict{job="nodecheck",origin="node",action="reboot"', 'verdict{action="reboot"'),
            "NodecheckRebootNeeded",
        ),
        # A restarted pod (a new `pod` label, the same instance) would break the records.
        (
            ("max by (job, instance) (", "max by (job, instance, pod) ("),
            "instance_subject:nodecheck_check_verdict:outlived",
        ),
        # A critical page would resolve when its node goes down with the fault.
        (
            (">= on(job, instance) group_left", "> on(job, instance) group_left"),
            "NodecheckRebootNeeded",
        ),
        # A finding cleared while the node was up would come back when the node goes down.
        (
            (">= on(job, instance) group_left", "<= on(job, instance) group_left"),
            "NodecheckGpuResetNeeded",
        ),
        # A GPU silent for one minute would page, or a missed scrape would reset the wait.
        (
            (
                'max_over_time(nodecheck_gpu_nvml_answering{job="nodecheck"}[2m]) == 0\n'
                "              and\n",
                "",
            ),
            "NodecheckGpuNotAnswering",
        ),
        (
            ("or\n          instance_gpu:", "or\n          instance_gpu_:"),
            "NodecheckGpuNotAnswering",
        ),
        # Severity from the class the wrong way round: a GPU's failure a warning.
        ((SEVERITY, '(eq $labels.class "node-config") }}critical'), "NodecheckRebootNeeded"),
        (('action="reset-gpu"', 'action="reset_gpu"'), "NodecheckGpuResetNeeded"),
        # A link that retrained once would page at once.
        (
            (
                'up{job="nodecheck"} == 1\n        for: 5m',
                'up{job="nodecheck"} == 1\n        for: 2m',
            ),
            "NodecheckHardwareInspectionNeeded",
        ),
        # An XID NVIDIA says to report would be left out.
        (
            (
                'action="contact-support",status=~"fail|warn|error"',
                'action="contact-support",status=~"fail|error"',
            ),
            "NodecheckVendorSupportNeeded",
        ),
        (
            (
                'up{job="nodecheck"} == 1\n        for: 10m',
                'up{job="nodecheck"} == 1\n        for: 2m',
            ),
            "NodecheckNodeConfigWrong",
        ),
        # A check that cannot judge would say nothing.
        (
            (
                'action="investigate",status=~"fail|warn|error"',
                'action="investigate",status=~"fail|warn"',
            ),
            "NodecheckInvestigationNeeded",
        ),
        # A failure asking for an action no other alert takes would go unalerted.
        (('|investigate"} == 1', '|investigate|restart-app"} == 1'), "NodecheckCheckFailing"),
        (("severity: info", "severity: critical"), "NodecheckJobSettingFailing"),
        (
            ("> 3 * nodecheck_check_interval_seconds", "> 30 * nodecheck_check_interval_seconds"),
            "NodecheckResultsStale",
        ),
        (
            (
                'nodecheck_config_last_reload_successful{job="nodecheck"} == 0',
                'nodecheck_config_last_reload_successful{job="nodecheck"} < 0',
            ),
            "NodecheckConfigReloadFailed",
        ),
        (
            (
                'nodecheck_results_last_write_successful{job="nodecheck"} == 0',
                'nodecheck_results_last_write_successful{job="nodecheck"} < 0',
            ),
            "NodecheckResultsNotWritten",
        ),
        (
            (
                'nodecheck_exposition_dropped_samples{job="nodecheck"} > 0\n        for: 15m',
                'nodecheck_exposition_dropped_samples{job="nodecheck"} > 0\n        for: 5m',
            ),
            "NodecheckSamplesDropped",
        ),
        (('up{job="nodecheck"} == 0', 'up{job="nodecheck"} == 1'), "NodecheckAgentDown"),
        # An ordinary reboot would page.
        (
            (
                'up{job="nodecheck"} == 0\n        for: 15m',
                'up{job="nodecheck"} == 0\n        for: 5m',
            ),
            "NodecheckAgentDown",
        ),
        (
            (
                'link_downed_total{job="nodecheck"}[15m]) > 0',
                'link_downed_total{job="nodecheck"}[15m]) > 1',
            ),
            "NodecheckRdmaLinkFlapping",
        ),
        (
            (
                'nodecheck_rdma_port_link_downed_total{job="nodecheck"} >= 255',
                'nodecheck_rdma_port_link_downed_total{job="nodecheck"} > 255',
            ),
            "NodecheckRdmaCounterSaturated",
        ),
        (
            (
                'link_error_recovery_total{job="nodecheck"}[10m]) > 0\n        for: 20m',
                'link_error_recovery_total{job="nodecheck"}[10m]) > 0\n        for: 10m',
            ),
            "NodecheckRdmaLinkErrors",
        ),
        (
            (
                'kind="correctable"}[15m]) > 0\n        for: 1h',
                'kind="correctable"}[15m]) > 0\n        for: 30m',
            ),
            "NodecheckPcieCorrectedErrors",
        ),
        (
            ('{job="nodecheck",kind="correctable"}[15m])', '{job="nodecheck"}[15m])'),
            "NodecheckPcieCorrectedErrors",
        ),
    ],
)
def test_a_broken_alert_fails_its_test(
    tmp_path: Path, replace: tuple[str, str], noticed: str
) -> None:
    """The unit tests notice each alert broken: the wrong action, status, origin, severity,
    `for` or threshold, and the test of the alert broken is the one that fails."""
    text = RULES.read_text()
    assert replace[0] in text, replace
    broken = tmp_path / "alerts.yml"
    broken.write_text(text.replace(*replace, 1))
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(RULE_TESTS.read_text().replace("../../monitoring/alerts.yml", str(broken)))
    done = subprocess.run(
        ["promtool", "test", "rules", str(tests)], capture_output=True, text=True, check=False
    )
    # The alert whose test fails, or the record that no longer evaluates (promtool stops
    # at a rule that errs).
    out = done.stdout + done.stderr
    assert done.returncode != 0 and (f"alertname: {noticed}," in out or f"rule: {noticed}," in out)


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


# The alert each action a node's finding asks for reaches; the actions that ask nobody for
# anything about the node (a job to restart or reconfigure, nothing at all) reach none but
# NodecheckCheckFailing, when such a finding fails anyway. A new Action must be put in one.
ACTION_ALERTS = {
    "reboot": "NodecheckRebootNeeded",
    "reset-gpu": "NodecheckGpuResetNeeded",
    "inspect-hardware": "NodecheckHardwareInspectionNeeded",
    "contact-support": "NodecheckVendorSupportNeeded",
    "fix-node-config": "NodecheckNodeConfigWrong",
    "investigate": "NodecheckInvestigationNeeded",
}
NOBODY_ABOUT_THE_NODE = {"none", "restart-app", "fix-job-environment"}


def expected_alerts(
    status: str, fault_class: str, action: str, origin: str
) -> set[tuple[str, str]]:
    """(alert, severity) a verdict series with these labels fires, held for 30 minutes."""
    if origin == "job":
        return {("NodecheckJobSettingFailing", "info")} if status == "fail" else set()
    if action in ACTION_ALERTS and status in ("fail", "warn", "error"):
        critical = status == "fail" and fault_class != "node-config"
        return {(ACTION_ALERTS[action], "critical" if critical else "warning")}
    if status == "fail":
        return {("NodecheckCheckFailing", "warning")}
    return set()


def test_every_verdict_reaches_the_alert_its_action_names(tmp_path: Path) -> None:
    """Every combination of the verdict's labels (each Status, FaultClass, Action and Origin
    of checks/result.py), held for 30 minutes, fires exactly the alerts expected_alerts
    says, with that severity, and no other alert: an action's alert whatever the check, a
    failure of the GPUs critical, a job's finding never critical (ALERTS, as promtool's
    rule evaluation records it)."""
    from nodecheck.checks.result import Action, FaultClass, Origin, Status

    assert set(ACTION_ALERTS) | NOBODY_ABOUT_THE_NODE == {a.value for a in Action}
    assert not set(ACTION_ALERTS) & NOBODY_ABOUT_THE_NODE
    series = []
    firing = []
    for number, (status, fault_class, action, origin) in enumerate(
        (s.value, c.value, a.value, o.value)
        for s in Status
        for c in FaultClass
        for a in Action
        for o in Origin
    ):
        labels = (
            f'instance="n:19410",job="nodecheck",check="check{number}",subject="gpu {number}",'
            f'status="{status}",class="{fault_class}",action="{action}",origin="{origin}"'
        )
        series.append(
            f"      - series: 'nodecheck_check_verdict{{{labels}}}'\n        values: 1x40"
        )
        for alert, severity in expected_alerts(status, fault_class, action, origin):
            firing.append(
                "          - labels: 'ALERTS{"
                f'alertname="{alert}",alertstate="firing",severity="{severity}",{labels}'
                "}'\n            value: 1"
            )
    assert any("critical" in line for line in firing) and len(series) == 270
    test = tmp_path / "verdicts_test.yml"
    test.write_text(
        f"rule_files: [{RULES}]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n"
        "    input_series:\n" + "\n".join(series) + "\n    promql_expr_test:\n"
        "      - expr: 'ALERTS{alertstate=\"firing\"}'\n        eval_time: 30m\n"
        "        exp_samples:\n" + "\n".join(firing) + "\n"
    )
    done = promtool("test", "rules", str(test))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def alert_exprs(path: Path) -> dict[str, str]:
    """Each alert's expression in a rule file (YAML, as Prometheus reads it)."""
    import yaml

    groups = yaml.safe_load(path.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for g in groups for rule in g["rules"] if "alert" in rule}


# A matcher on the check label (check="gpu_xid", check=~"matmul|h2d", check!="..."): a list
# of check names in a rule. Grouping by it, or label_replace reading it, is no matcher.
CHECK_MATCHER = re.compile(r'\bcheck\s*(=~|!~|!=|=)\s*"')
# The check-specific series an alert may still read, each with why no verdict says it: what
# one check result cannot see (a rate over a window longer than the check's interval, an
# event a later reading has passed, a counter that stopped counting for good), or a fleet's
# judgement that no node can make.
NOT_JUDGED_BY_A_CHECK = {
    # rdma_ports warns on an increase between two of its readings (one interval): a flap
    # 15 minutes back, and errors that come back every few minutes for 20, it cannot see.
    "nodecheck_rdma_port_link_downed_total": "a flap within the past 15 minutes",
    "nodecheck_rdma_port_link_error_recovery_total": "errors recurring over 20 minutes",
    "nodecheck_rdma_port_symbol_errors_total": "errors recurring over 20 minutes",
    "nodecheck_rdma_port_receive_errors_total": "errors recurring over 20 minutes",
    # pcie_aer warns above 8 corrected errors a minute between two of its readings: errors
    # that keep coming below that rate for an hour it cannot see.
    "nodecheck_pcie_aer_errors_total": "corrected errors recurring over an hour",
    # gpu_count reads each GPU once a minute: 2 minutes of silence are across readings.
    "nodecheck_gpu_nvml_answering": "a GPU silent for 2 minutes, across readings",
    # The benchmarks' freshness: whether a node measured at all, across the fleet.
    "nodecheck_bench_last_success_timestamp_seconds": "a node's results gone stale",
}


def test_no_alert_re_judges_what_a_check_judged() -> None:
    """No alert expression (alerts.yml, fleet_alerts.yml) selects on a value of the `check`
    label, and none reads a series a check exports (a MetricSpec of a check or benchmark
    module) unless NOT_JUDGED_BY_A_CHECK names it with its reason: what a check judged,
    an alert reads from nodecheck_check_verdict. The agent's own families (OWN_FAMILIES)
    and the fleet's recorded series are no check's judgement."""
    specs = {spec.name for spec in metric_specs()}
    assert set(NOT_JUDGED_BY_A_CHECK) <= specs | FLEET_AGENT_METRICS
    used: set[str] = set()
    for path in (RULES, FLEET_ALERTS):
        for alert, expr in alert_exprs(path).items():
            assert not CHECK_MATCHER.search(expr), (path.name, alert)
            read = set(re.findall(r"\bnodecheck_[a-z0-9_]+", RECORDED_NAME.sub("", expr)))
            judged = (read & specs) - set(NOT_JUDGED_BY_A_CHECK)
            assert judged == set(), (path.name, alert, judged)
            used |= read
    assert set(NOT_JUDGED_BY_A_CHECK) <= used  # no stale exception
    assert CHECK_MATCHER.search('x{check=~"matmul|h2d"}') and CHECK_MATCHER.search('{check="a"}')
    assert not CHECK_MATCHER.search('label_replace(x, "benchmark", "$1", "check", "(.*)")')


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
    r'(nodecheck_node_info|instance:nodecheck_node_info:last_over_time_1d)\{cluster=~"\$cluster", '
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
    info = (
        'instance:nodecheck_node_info:last_over_time_1d{job="nodecheck",cluster="c1",'
        'partition="gpu"'
    )
    series = {
        f'{info},instance="g01:19410",rack="r1"}}': "1x2",
        f'{info},instance="g02:19410"}}': "1x2",
        'instance:nodecheck_checks_failing:bool{instance="g01:19410"}': "1x2",
        'instance:nodecheck_checks_failing:bool{instance="g02:19410"}': "1x2",
    }
    expr = fleet_panel_expr("Failing nodes by rack")
    done = eval_with_promtool(tmp_path, series, expr, {'{cluster="c1",rack="r1"}': 1})
    assert done.returncode == 0, done.stdout + done.stderr


RUNBOOKS = ROOT / "docs" / "runbooks"
RUNBOOK_SECTIONS = ["What it means", "Confirm it", "What to do", "When to escalate"]


def test_every_alert_has_a_runbook() -> None:
    """Each alert's runbook_url is its runbook's path in this repository, the runbook is
    there with the four sections an on-call engineer looks for, in order, and no runbook
    is left for an alert that no longer exists."""
    alerts = {}
    for path in (RULES, FLEET_ALERTS):
        for group in yaml.safe_load(path.read_text())["groups"]:
            alerts.update({r["alert"]: r for r in group["rules"] if "alert" in r})
    assert len(alerts) >= 24
    for name, rule in alerts.items():
        url = rule["annotations"].get("runbook_url")
        assert url == f"docs/runbooks/{name}.md", name
        runbook = ROOT / url
        assert runbook.is_file(), f"{name}: no runbook at {url}"
        headings = re.findall(r"^## (.+?)\s*$", runbook.read_text(), re.MULTILINE)
        assert headings == RUNBOOK_SECTIONS, f"{url}: {headings}"
    written = {path.stem for path in RUNBOOKS.glob("*.md") if path.name != "README.md"}
    assert written - set(alerts) == set(), "runbooks for alerts that do not exist"
