"""`nodecheck npd`, the node-problem-detector plugin, and the fault classes it shares
with the agent's node conditions."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodecheck.agent.findings import (
    Finding,
    StoredRun,
    check_document,
    document_text,
    findings_of_named,
)
from nodecheck.agent.kubernetes.fault_classes import checks_of, condition_type
from nodecheck.agent.kubernetes.npd import EXIT_OK, EXIT_PROBLEM, EXIT_UNKNOWN, Verdict, judge
from nodecheck.checks.printable import one_line
from nodecheck.checks.registry import load_benchmarks, load_checks, register
from nodecheck.checks.result import FaultClass, Origin, Result, Status
from nodecheck.checks.runner import CheckRun
from tests.conftest import CLEAN_ENVIRON, Node
from tests.fixtures.nvml_scenarios import dgx_healthy, modified


def test_every_registered_check_and_benchmark_declares_a_class() -> None:
    # register() has no default class: a check cannot be registered without one.
    assert inspect.signature(register).parameters["fault_class"].default is inspect.Parameter.empty
    registered = {**load_checks(), **load_benchmarks()}
    assert registered
    undeclared = sorted(
        n for n, c in registered.items() if not isinstance(c.fault_class, FaultClass)
    )
    assert undeclared == [], "checks without a fault class"
    # Each is of exactly the class it declares, and checks_of lists every one.
    by_class = {cls: set(checks_of(cls)) for cls in FaultClass}
    assert sorted(n for names in by_class.values() for n in names) == sorted(registered)
    for name, check in registered.items():
        assert name in by_class[check.fault_class], name


def test_every_class_has_checks_and_its_own_condition_type() -> None:
    types = [condition_type(cls) for cls in FaultClass]
    assert types == ["NodecheckGpuHardware", "NodecheckGpuPerformance", "NodecheckNodeConfig"]
    for cls in FaultClass:
        assert checks_of(cls), cls


# -- the verdict, on literal findings ---------------------------------------------------


def finding(check: str, status: Status, summary: str = "x", subject: str = "node") -> Finding:
    """A registered check's finding, its meaning (class, action, origin) as it declares."""
    [found] = findings_of_named(check, [Result(status, subject, summary)])
    return found


def test_a_failure_of_the_class_is_a_problem_and_other_classes_are_ignored() -> None:
    findings = [
        finding("gpu_xid", Status.FAIL, "XID 79: fallen off the bus", "gpu 3"),
        finding("gpu_xid", Status.FAIL, "XID 48", "gpu 5"),
        finding("nccl_env", Status.ERROR),
        finding("gpu_count", Status.OK),
    ]
    verdict = judge(FaultClass.GPU_HARDWARE, findings, "agent results")
    assert verdict == Verdict(
        EXIT_PROBLEM,
        "gpu-hardware fail: gpu_xid gpu 3: XID 79: fallen off the bus (+1 more failing); "
        "agent results",
    )
    assert judge(FaultClass.GPU_PERFORMANCE, findings, "s").exit_status == EXIT_UNKNOWN
    assert judge(FaultClass.NODE_CONFIG, findings, "s").exit_status == EXIT_UNKNOWN


def test_could_not_determine_and_nothing_judged_are_unknown_never_ok() -> None:
    undetermined = [finding("gpu_count", Status.OK), finding("gpu_state", Status.ERROR, "hung")]
    verdict = judge(FaultClass.GPU_HARDWARE, undetermined, "own run")
    assert verdict == Verdict(EXIT_UNKNOWN, "gpu-hardware unknown: gpu_state node: hung; own run")
    skipped = [finding("nvswitch_sxid", Status.SKIP, "no NVSwitch")]
    assert judge(FaultClass.GPU_HARDWARE, skipped, "s") == Verdict(
        EXIT_UNKNOWN, "gpu-hardware unknown: only skipped: nvswitch_sxid; s"
    )
    assert judge(FaultClass.GPU_HARDWARE, [], "s") == Verdict(
        EXIT_UNKNOWN, "gpu-hardware unknown: no check of it ran; s"
    )


def test_a_warning_is_said_but_is_no_problem() -> None:
    findings = [finding("numa", Status.WARN, "NUMA balancing on"), finding("cpu", Status.OK)]
    assert judge(FaultClass.NODE_CONFIG, findings, "s") == Verdict(
        EXIT_OK, "node-config ok, warn: numa node: NUMA balancing on; s"
    )
    assert judge(FaultClass.NODE_CONFIG, findings[1:], "s") == Verdict(
        EXIT_OK, "node-config ok: 1 checks; s"
    )


def test_a_jobs_failure_is_a_warning_not_a_problem() -> None:
    """nccl_env judges the job's environment (origin job): its failure is said, exit 0;
    the same check's failure from the node's /etc/nccl.conf is a problem."""
    from_a_job = finding("nccl_env", Status.FAIL, "NCCL_P2P_DISABLE=1")
    assert from_a_job.origin is Origin.JOB
    assert judge(FaultClass.NODE_CONFIG, [from_a_job], "s") == Verdict(
        EXIT_OK, "node-config ok, warn: nccl_env node: NCCL_P2P_DISABLE=1; s"
    )
    [from_the_node] = findings_of_named(
        "nccl_env", [Result(Status.FAIL, "node", "in /etc/nccl.conf", origin=Origin.NODE)]
    )
    assert judge(FaultClass.NODE_CONFIG, [from_the_node], "s") == Verdict(
        EXIT_PROBLEM, "node-config fail: nccl_env node: in /etc/nccl.conf; s"
    )


def test_a_finding_counts_in_its_own_class_not_its_checks() -> None:
    # gpu_throttle declares gpu-performance; a result may say it is hardware.
    [lost] = findings_of_named(
        "gpu_throttle",
        [Result(Status.FAIL, "gpu 3", "GPU lost", fault_class=FaultClass.GPU_HARDWARE)],
    )
    assert judge(FaultClass.GPU_HARDWARE, [lost], "s").exit_status == EXIT_PROBLEM
    assert judge(FaultClass.GPU_PERFORMANCE, [lost], "s").exit_status == EXIT_UNKNOWN


def test_one_line_cuts_on_whole_characters() -> None:
    assert one_line("a\nb\tc  d", 80) == "a b c d"
    assert one_line("x" * 80, 80) == "x" * 80
    assert one_line("x" * 81, 80) == "x" * 77 + "..."
    # "é" is two bytes: a cut through it drops it whole.
    cut = one_line("é" * 50, 20)
    assert cut == "é" * 8 + "..." and len(cut.encode()) <= 20
    # An ESC is shown escaped (checks/printable.py), never raw, never silently a space.
    assert one_line("ab\x1b[31mcd\u202e", 80) == "ab\\x1b[31mcd\\u202e"


# -- the command, on the replicas ---------------------------------------------------------


def npd(
    node: Node, tmp_path: Path, fault_class: str, *extra: str, config: str = ""
) -> subprocess.CompletedProcess[str]:
    config_file = tmp_path / "config.toml"
    config_file.write_text(f'[agent]\nresults_file = "{tmp_path / "results.json"}"\n' + config)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "nodecheck",
            *node.cli_args,
            "npd",
            "--class",
            fault_class,
            "--config",
            str(config_file),
            *extra,
        ],
        env={**CLEAN_ENVIRON, **node.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def message_of(done: subprocess.CompletedProcess[str], max_bytes: int) -> str:
    assert done.stdout.endswith("\n") and done.stdout.count("\n") == 1, done.stdout
    message = done.stdout.strip()
    assert 0 < len(message.encode()) <= max_bytes, message
    assert "Traceback" not in done.stderr, done.stderr
    return message


@pytest.mark.parametrize("fault_class", [c.value for c in FaultClass])
def test_the_faulty_dgx_has_a_problem_of_each_class_and_the_healthy_one_none(
    dgx: Node, dgx_faulty: Node, tmp_path: Path, fault_class: str
) -> None:
    healthy = npd(dgx, tmp_path, fault_class)
    assert healthy.returncode == EXIT_OK, healthy.stdout + healthy.stderr
    assert message_of(healthy, 80).startswith(f"{fault_class} ok")
    faulty = npd(dgx_faulty, tmp_path, fault_class)
    assert faulty.returncode == EXIT_PROBLEM, faulty.stdout + faulty.stderr
    message = message_of(faulty, 80)  # NPD's default max_output_length
    assert message.startswith(f"{fault_class} fail: ")
    # The whole message, at NPD's longest: which check, and where the verdict came from.
    long = message_of(npd(dgx_faulty, tmp_path, fault_class, "--max-output", "4096"), 4096)
    assert long.startswith(message.removesuffix("..."))
    assert long.endswith("own run (no results file at " + str(tmp_path / "results.json") + ")")
    assert long.split()[2] in checks_of(FaultClass(fault_class))


def write_agent_results(path: Path, failing: str | None, status: Status, age_s: float) -> None:
    """The agent's results file: every quick check passing but `failing`, with `status`."""
    now = time.time() - age_s
    stored = []
    for name, check in load_checks().items():
        result = (
            Result(status, "gpu 2", "from the agent")
            if name == failing
            else Result(Status.OK, "node", "fine")
        )
        stored.append(StoredRun(CheckRun(check, [result], 0.01, True), now, 60.0))
    path.write_text(document_text(check_document("gpu01", stored, now)))


def test_the_agents_fresh_results_are_the_verdict_and_stale_ones_are_not(
    dgx: Node, tmp_path: Path
) -> None:
    results = tmp_path / "results.json"
    write_agent_results(results, "gpu_throttle", Status.FAIL, age_s=0)
    done = npd(dgx, tmp_path, "gpu-performance", "--max-output", "4096")
    assert done.returncode == EXIT_PROBLEM
    assert message_of(done, 4096) == (
        "gpu-performance fail: gpu_throttle gpu 2: from the agent; agent results"
    )
    # The other classes judge the same file: all fine there.
    done = npd(dgx, tmp_path, "gpu-hardware", "--max-output", "4096")
    assert done.returncode == EXIT_OK
    # gpu_count, gpu_fabric, gpu_memory_errors, gpu_nvlink, gpu_state, gpu_xid, nvswitch_sxid, ...
    hardware = [c for c in load_checks().values() if c.fault_class is FaultClass.GPU_HARDWARE]
    assert len(hardware) >= 7
    assert message_of(done, 4096) == f"gpu-hardware ok: {len(hardware)} checks; agent results"
    # Stale (older than --max-age): the replica, healthy, is judged itself.
    write_agent_results(results, "gpu_throttle", Status.FAIL, age_s=120)
    done = npd(dgx, tmp_path, "gpu-performance", "--max-age", "60", "--max-output", "4096")
    assert done.returncode == EXIT_OK, done.stdout
    assert "own run (" in done.stdout and "s old (at most 60 s)" in done.stdout


def test_undetermined_is_unknown(dgx: Node, tmp_path: Path) -> None:
    write_agent_results(tmp_path / "results.json", "gpu_memory_errors", Status.ERROR, age_s=0)
    done = npd(dgx, tmp_path, "gpu-hardware")
    assert done.returncode == EXIT_UNKNOWN
    assert message_of(done, 80).startswith("gpu-hardware unknown: gpu_memory_errors gpu 2")
    disabled = "".join(
        f"[checks.{name}]\nenabled = false\n" for name in checks_of(FaultClass.NODE_CONFIG)
    )
    done = npd(dgx, tmp_path, "node-config", config=disabled)
    assert done.returncode == EXIT_UNKNOWN
    assert message_of(done, 80) == "node-config unknown: every check of it is disabled"


def test_its_own_run_keeps_to_the_budget(dgx: Node, tmp_path: Path) -> None:
    """An NVML call that hangs past the budget: unknown at the budget, not at NVML's
    deadline, well within the NPD rule's timeout."""
    hung = dgx.with_scenario(
        modified(dgx_healthy(), gpu=5, hang={"nvmlDeviceGetTemperatureV": 0}),
        tmp_path / "hang.json",
    )
    started = time.monotonic()
    done = npd(
        hung,
        tmp_path,
        "gpu-hardware",
        "--nvml-timeout",
        "8",
        "--budget",
        "1",
        "--max-output",
        "400",
    )
    elapsed = time.monotonic() - started
    assert done.returncode == EXIT_UNKNOWN, done.stdout + done.stderr
    assert done.stdout.startswith("gpu-hardware unknown: ")
    assert "did not finish within 1 s" in done.stdout
    assert elapsed < 8, elapsed


def test_a_bad_configuration_is_unknown_not_ok(dgx: Node, tmp_path: Path) -> None:
    done = npd(dgx, tmp_path, "gpu-hardware", config="[checks.no_such_check]\nenabled = true\n")
    assert done.returncode == EXIT_UNKNOWN  # NPD: anything but 0 and 1 is unknown
    message = message_of(done, 80)
    assert message.startswith("gpu-hardware unknown: bad configuration: ")
    assert message.endswith("...")  # cut to NPD's default
    done = npd(dgx, tmp_path, "no-such-class")
    assert done.returncode == EXIT_UNKNOWN  # a usage error: click's exit status 2


# -- the NPD configuration ------------------------------------------------------------------

NPD_CONFIG = (
    Path(__file__).resolve().parent.parent.parent
    / "deploy"
    / "kubernetes"
    / "npd"
    / "nodecheck-plugin-monitor.json"
)


def go_duration_s(text: str) -> float:
    """A Go time.Duration string of the forms NPD's configs use ("30s", "1m", "500ms")."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert match, text
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def test_the_npd_config_has_one_permanent_rule_per_class() -> None:
    config = json.loads(NPD_CONFIG.read_text())
    assert config["plugin"] == "custom"
    defaults = {c["type"]: c for c in config["conditions"]}
    assert sorted(defaults) == sorted(condition_type(c) for c in FaultClass)
    rules = config["rules"]
    classes = []
    for rule in rules:
        assert rule["type"] == "permanent"
        args = rule["args"]
        assert args[args.index("npd") + 1] == "--class"
        fault_class = FaultClass(args[args.index("--class") + 1])
        classes.append(fault_class)
        assert rule["condition"] == condition_type(fault_class)
        assert rule["condition"] in defaults  # NPD refuses a permanent rule without one
        assert rule["reason"] != defaults[rule["condition"]]["reason"]
        assert re.fullmatch(r"[A-Z][A-Za-z]+", rule["reason"])  # CamelCase, as Kubernetes'
    assert sorted(classes) == sorted(FaultClass)


def test_the_plugin_cuts_to_the_npd_configs_length_within_its_timeouts() -> None:
    config = json.loads(NPD_CONFIG.read_text())
    plugin = config["pluginConfig"]
    global_timeout = go_duration_s(plugin["timeout"])
    for rule in config["rules"]:
        args = rule["args"]
        assert int(args[args.index("--max-output") + 1]) == plugin["max_output_length"]
        timeout = go_duration_s(rule["timeout"])
        assert timeout <= global_timeout  # NPD refuses a rule timeout above the global one
        # The budget bounds the checks; start-up and the verdict need a few seconds more.
        assert float(args[args.index("--budget") + 1]) + 5 <= timeout
    assert go_duration_s(plugin["invoke_interval"]) >= global_timeout


def test_the_npd_rules_run_as_they_are_written(dgx_faulty: Node, tmp_path: Path) -> None:
    """Each rule's own arguments through the real command, the host paths pointed at the
    replica: a verdict within the configured length."""
    config = json.loads(NPD_CONFIG.read_text())
    limit = config["pluginConfig"]["max_output_length"]
    host = {"/host/sys": str(dgx_faulty.root / "sys"), "/host/proc": str(dgx_faulty.root / "proc")}
    for rule in config["rules"]:
        args = [host.get(arg, arg) for arg in rule["args"]]
        done = subprocess.run(
            [sys.executable, "-m", "nodecheck", *dgx_faulty.cli_args[6:], *args],
            env={**CLEAN_ENVIRON, **dgx_faulty.env, "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == EXIT_PROBLEM, done.stdout + done.stderr
        message_of(done, limit)
