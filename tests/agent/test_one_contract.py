"""One contract per check: a check registered here, in a test module, reaches Slurm's
drain and prolog, the Kubernetes conditions and taint, NPD and the alert rules with no
edit anywhere else; a job's finding reaches none of what takes a node out of service."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodecheck.agent.config import SlurmSettings
from nodecheck.agent.daemon.exporter import ResultCollector, exposition, make_registry
from nodecheck.agent.daemon.scheduler import ResultStore
from nodecheck.agent.findings import (
    Finding,
    StoredRun,
    check_document,
    document_text,
    findings_of,
    parse_document,
)
from nodecheck.agent.kubernetes.npd import EXIT_OK, EXIT_PROBLEM, judge
from nodecheck.agent.kubernetes.reporter import fault_of, judge_classes
from nodecheck.agent.slurm.health import SlurmAction, decide
from nodecheck.agent.slurm.hysteresis import Hysteresis
from nodecheck.agent.slurm.prolog import EXIT_PASS, EXIT_UNUSABLE, gate_checks, judge_gate
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.slurm_state import SlurmNodeState
from nodecheck.checks.registry import load_checks, register, unregister
from nodecheck.checks.result import Action, FaultClass, Origin, Result, Status, gpu_subject
from nodecheck.checks.runner import CheckRun

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "monitoring" / "alerts.yml"
SUBJECT = gpu_subject("0000:1a:00.0")


def _widget(_: CheckContext) -> list[Result]:
    """A widget on the GPU board that fails (a test's own check)."""
    return [Result(Status.FAIL, SUBJECT, "widget broken", "replace the widget")]


@pytest.fixture
def widget_check(request: pytest.FixtureRequest) -> Iterator[str]:
    """A check registered here only: hardware, a reboot, a gate; or a job's."""
    origin: Origin = request.param
    name = f"test_widget_{origin.value}"
    register(
        name,
        fault_class=FaultClass.GPU_HARDWARE,
        action=Action.REBOOT,
        origin=origin,
        gate=True,
        interval_s=60,
        timeout_s=5,
        needs=(),
    )(_widget)
    try:
        yield name
    finally:
        unregister(name)


def _findings(name: str) -> list[Finding]:
    check = load_checks()[name]
    return findings_of(CheckRun(check, list(check.run(CheckContext())), 0.01, True))


def _idle_node() -> SlurmNodeState:
    return SlurmNodeState("gpu01", "IDLE", frozenset(), False, None, None, None)


def _slurm(findings: list[Finding]) -> SlurmAction:
    settings = SlurmSettings(reboot_on_xid=True)
    decision = decide(_idle_node(), "", findings, Hysteresis(), settings, None, 100.0)
    return decision.action


def _scrape(name: str) -> str:
    store = ResultStore()
    check = load_checks()[name]
    store.put(CheckRun(check, list(check.run(CheckContext())), 0.01, True), 60.0)
    return exposition(make_registry(ResultCollector(store, "test", lambda: True))).decode()


def _alerts_firing(tmp_path: Path, exposition_text: str) -> set[str]:
    """The alerts that fire for these series after 30 minutes (promtool test rules)."""
    series = []
    for line in exposition_text.splitlines():
        if line.startswith("nodecheck_check_verdict{"):
            labels, value = line.rsplit(" ", 1)
            labelled = labels.replace("{", '{instance="gpu01:19410",job="nodecheck",', 1)
            series.append(f"      - series: '{labelled}'\n        values: \"{float(value):g}x40\"")
    assert series, exposition_text
    names = re.findall(r"- alert: (\w+)", ALERTS.read_text())
    tests = "\n".join(
        f"      - eval_time: 30m\n        alertname: {alert}\n        exp_alerts: []"
        for alert in names
    )
    (tmp_path / "t.yml").write_text(
        f"rule_files: [{ALERTS}]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n"
        "    input_series:\n" + "\n".join(series) + "\n    alert_rule_test:\n" + tests + "\n"
    )
    done = subprocess.run(
        ["promtool", "test", "rules", str(tmp_path / "t.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    # Each alert that fires fails its "exp_alerts: []" and is named in the output.
    return {alert for alert in names if f"alertname: {alert}," in done.stdout + done.stderr}


needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool")


@needs_promtool
@pytest.mark.parametrize("widget_check", [Origin.NODE], indirect=True)
def test_a_new_checks_declaration_reaches_everything_that_acts(
    widget_check: str, tmp_path: Path
) -> None:
    findings = _findings(widget_check)
    [one] = findings
    assert (one.action, one.fault_class, one.origin) == (
        Action.REBOOT,
        FaultClass.GPU_HARDWARE,
        Origin.NODE,
    )
    assert _slurm(findings) is SlurmAction.REBOOT  # reboot_on_xid: its action says reboot
    assert widget_check in gate_checks()
    assert judge_gate("prolog", findings).code == EXIT_UNUSABLE
    states = {state.type: state for state in judge_classes([(widget_check, findings)])}
    assert states["NodecheckGpuHardware"].status == "True"
    fault = fault_of([(widget_check, findings)])
    assert fault is not None and fault.fault_class is FaultClass.GPU_HARDWARE
    assert judge(FaultClass.GPU_HARDWARE, findings, "test").exit_status == EXIT_PROBLEM
    # Its action, not its name, picks the alert: a reboot's, and no other.
    firing = _alerts_firing(tmp_path, _scrape(widget_check))
    assert firing == {"NodecheckRebootNeeded"}


@needs_promtool
@pytest.mark.parametrize("widget_check", [Origin.JOB], indirect=True)
def test_a_jobs_finding_takes_no_node_out_of_service(widget_check: str, tmp_path: Path) -> None:
    findings = _findings(widget_check)
    assert [f.origin for f in findings] == [Origin.JOB]
    assert _slurm(findings) is SlurmAction.NOTHING
    assert judge_gate("prolog", findings).code == EXIT_PASS
    states = {state.type: state for state in judge_classes([(widget_check, findings)])}
    assert states["NodecheckGpuHardware"].status == "False"
    assert fault_of([(widget_check, findings)]) is None
    assert judge(FaultClass.GPU_HARDWARE, findings, "test").exit_status == EXIT_OK
    firing = _alerts_firing(tmp_path, _scrape(widget_check))
    assert firing == {"NodecheckJobSettingFailing"}  # a reboot's action, yet no page


def _both(_: CheckContext) -> list[Result]:
    """A job's failure first, then the node's own, on one subject."""
    return [
        Result(
            Status.FAIL,
            SUBJECT,
            "a job's variable",
            action=Action.FIX_JOB_ENVIRONMENT,
            origin=Origin.JOB,
        ),
        Result(Status.FAIL, SUBJECT, "widget broken", "replace the widget"),
    ]


@needs_promtool
def test_a_jobs_failure_never_hides_the_nodes(tmp_path: Path) -> None:
    """One subject failing from a job's evidence and from the node's: both verdicts are
    exported, the node's pages for its reboot, and only the node's counts as failing."""
    name = "test_widget_both"
    register(
        name,
        fault_class=FaultClass.GPU_HARDWARE,
        action=Action.REBOOT,
        interval_s=60,
        timeout_s=5,
        needs=(),
    )(_both)
    try:
        metrics = _scrape(name)
        check = load_checks()[name]
        run = CheckRun(check, list(check.run(CheckContext())), 0.01, True)
    finally:
        unregister(name)
    # The results file Slurm and NPD read keeps the node's failure as the node's.
    text = document_text(check_document("gpu01", [StoredRun(run, 100.0, 60.0)], 100.0))
    _, [stored] = parse_document(text)
    assert sorted(f.origin.value for f in stored.findings) == ["job", "node"]
    assert _slurm(list(stored.findings)) is SlurmAction.REBOOT
    origins = re.findall(r'^nodecheck_check_verdict\{[^}]*origin="(\w+)"', metrics, re.M)
    assert sorted(origins) == ["job", "node"]
    assert "nodecheck_checks_failing 1.0" in metrics
    assert _alerts_firing(tmp_path, metrics) == {
        "NodecheckRebootNeeded",
        "NodecheckJobSettingFailing",
    }


def _string_literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_no_check_name_outside_its_module() -> None:
    """What a check means is said in its own module: nothing in agent/ or tuning/ names
    a check to decide what its findings mean."""
    # "cpu" is also a benchmark device and an inventory key: a word, not a reference.
    names = set(load_checks()) - {"cpu"}
    quoted = {
        str(path.relative_to(ROOT)): sorted(names & _string_literals(path))
        for folder in ("agent", "tuning")
        for path in (ROOT / folder).rglob("*.py")
    }
    assert {path: found for path, found in quoted.items() if found} == {}


def test_one_finding_class_and_one_stored_schema() -> None:
    classes = []
    schemas = []
    for folder in ("agent", "checks", "tuning"):
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            classes += [
                str(path.relative_to(ROOT))
                for node in ast.walk(tree)
                if isinstance(node, ast.ClassDef) and node.name == "Finding"
            ]
            schemas += [
                v
                for v in _string_literals(path)
                if re.fullmatch(r"nodecheck\.(check|results)/v\d+", v)
            ]
    assert classes == ["agent/findings.py"]
    # The check document is the stored results too: one schema of a run's results.
    assert sorted(set(schemas)) == ["nodecheck.check/v2"]
