"""`nodecheck slurm prolog` and `epilog`: the gate's rule on literal results, and the
real command on the replica nodes with the fake NVML."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nodecheck.agent.findings import Finding, findings_of_named
from nodecheck.agent.slurm.hook_failure import HOOK_FAILURE_FILE, load_hook_failure
from nodecheck.agent.slurm.prolog import (
    EXIT_PASS,
    EXIT_UNUSABLE,
    NO_BENCHMARKS_HERE,
    gate_checks,
    judge_gate,
    noted_results,
    unusable_results,
)
from nodecheck.checks.result import Action, FaultClass, Origin, Result, Status
from tests.agent.test_cli import run
from tests.conftest import Node
from tests.fixtures.nvml_scenarios import dgx_healthy


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A configuration whose state folder is the test's: a gate that fails records the
    failure there (agent/slurm/hook_failure.py), never in root's /var/lib/nodecheck."""
    state = tmp_path / "state"
    state.mkdir()
    path = tmp_path / "config.toml"
    path.write_text(f'[agent]\nstate_dir = "{state}"\n')
    return path


def said(check: str, subject: str, status: Status, summary: str) -> Finding:
    """A registered check's finding, its meaning as the check declares it."""
    [finding] = findings_of_named(check, [Result(status, subject, summary)])
    return finding


LOST = said(
    "gpu_count",
    "gpu 0000:bc:00.0",
    Status.FAIL,
    "on the PCI bus but not enumerated by NVML (fallen off the bus?)",
)
FEWER = said("gpu_count", "node", Status.FAIL, "7 GPU(s) visible to NVML, 8 expected")
XID_79 = said("gpu_xid", "gpu 0000:bc:00.0", Status.FAIL, "XID 79 GPU_HAS_FALLEN_OFF_THE_BUS x1")
ECC = said(
    "gpu_memory_errors",
    "gpu 0000:1a:00.0",
    Status.FAIL,
    "2 uncorrectable ECC error(s) since the driver loaded; the driver asks for recovery action 1",
)
SLOW_LINK = said("pcie_link", "gpu 0000:9c:00.0", Status.FAIL, "PCIe link trained at x8 of x16")
ACS = said("pcie_acs", "bridge 0000:39:00.0", Status.FAIL, "ACS ReqRedir CmpltRedir")
PENDING_REMAP = said(
    "gpu_memory_errors", "gpu 0000:18:00.0", Status.WARN, "a row remapping is pending"
)
XID_HUNG = said("gpu_xid", "node", Status.ERROR, "check gpu_xid did not finish within 30 s")
COUNT_UNKNOWN = said("gpu_count", "node", Status.ERROR, "cannot list the driver's GPUs: ...")
HEALTHY = said("gpu_count", "node", Status.OK, "8 GPU(s)")
XID_OLD = said("gpu_xid", "gpu 0000:1a:00.0", Status.OK, "XID 48 ...: before the last boot")
JOB_ENV = said("nccl_env", "node", Status.FAIL, "NCCL_P2P_DISABLE=1 set in the job")


def test_the_prolog_runs_the_gate_checks() -> None:
    assert sorted(gate_checks()) == ["gpu_count", "gpu_memory_errors", "gpu_xid"]


def test_rule_stops_only_what_makes_the_node_unusable() -> None:
    results = [LOST, FEWER, XID_79, ECC, SLOW_LINK, ACS, PENDING_REMAP, XID_HUNG, JOB_ENV, HEALTHY]
    assert unusable_results(results) == [LOST, FEWER, XID_79, ECC]
    assert noted_results(results) == [SLOW_LINK, ACS, PENDING_REMAP, XID_HUNG, JOB_ENV]


def test_rule_passes_warnings_errors_and_slow_nodes() -> None:
    for results in (
        [SLOW_LINK, ACS],
        [PENDING_REMAP],
        [XID_HUNG, COUNT_UNKNOWN],
        [XID_OLD],
        [JOB_ENV],
    ):
        assert unusable_results(results) == []
        assert judge_gate("prolog", results).code == EXIT_PASS


def test_the_rule_reads_a_findings_meaning_not_its_checks_name() -> None:
    """What stops a job is a GPU hardware failure on the node's own evidence from a gate
    check; the same failure from a job's environment, of another class, or from a check
    that is no gate (NVLinks down: slower, the epilog runs it too) is said and passes."""
    lost = Finding("gpu_count", Status.FAIL, "gpu 0000:bc:00.0", "lost", Action.REBOOT)
    from_a_job = Finding(
        "gpu_count", Status.FAIL, "gpu 0000:bc:00.0", "lost", Action.REBOOT, origin=Origin.JOB
    )
    links = Finding("gpu_nvlink", Status.FAIL, "gpu 0000:9a:00.0", "16 of 18 NVLinks active")
    slow = Finding(
        "gpu_xid", Status.FAIL, "gpu 0000:bc:00.0", "slow", fault_class=FaultClass.GPU_PERFORMANCE
    )
    assert unusable_results([lost, from_a_job, slow, links]) == [lost]
    assert noted_results([lost, from_a_job, slow, links]) == [from_a_job, slow, links]
    assert judge_gate("epilog", [from_a_job, slow, links]).code == EXIT_PASS
    assert judge_gate("prolog", [lost]).code == EXIT_UNUSABLE
    # Which checks gate is their declaration: given another set, the rule follows it.
    assert unusable_results([links], gates={"gpu_nvlink"}) == [links]


def test_gate_fails_with_each_reason_and_notes_the_rest() -> None:
    outcome = judge_gate("prolog", [HEALTHY, ECC, SLOW_LINK, XID_HUNG])
    assert outcome.code == EXIT_UNUSABLE
    assert outcome.lines == (
        f"nodecheck prolog: node unusable: gpu_memory_errors gpu 0000:1a:00.0: {ECC.summary}",
        f"nodecheck prolog: passing despite fail: pcie_link gpu 0000:9c:00.0: {SLOW_LINK.summary}",
        f"nodecheck prolog: passing despite error: gpu_xid node: {XID_HUNG.summary}",
    )


def test_gate_of_healthy_results_is_silent_and_of_none_says_so() -> None:
    assert judge_gate("prolog", [HEALTHY, XID_OLD]) == judge_gate("prolog", [HEALTHY])
    assert judge_gate("prolog", [HEALTHY]).lines == ()
    nothing = judge_gate("prolog", [])
    assert nothing.code == EXIT_PASS and "no check gave a result" in nothing.lines[0]


def test_prolog_on_the_faulty_node_exits_1_with_the_reasons(dgx_faulty: Node, config: Path) -> None:
    started = time.monotonic()
    done = run(
        *dgx_faulty.cli_args,
        "slurm",
        "prolog",
        "--config",
        str(config),
        env={**dgx_faulty.env, "SLURM_JOB_ID": "4242"},
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    unusable = [
        line.removeprefix("nodecheck prolog: node unusable: ")
        for line in done.stderr.splitlines()
        if line.startswith("nodecheck prolog: node unusable: ")
    ]
    assert sorted(line.split(": ")[0] for line in unusable) == [
        "gpu_count gpu 0000:bc:00.0",
        "gpu_count node",
        "gpu_memory_errors gpu 0000:1a:00.0",
        "gpu_memory_errors gpu 0000:ba:00.0",
        "gpu_xid gpu 0000:1a:00.0",
        "gpu_xid gpu 0000:bc:00.0",
    ]
    assert any("XID 79" in line for line in unusable)
    assert any("uncorrectable ECC" in line for line in unusable)
    # The pending remap is a warning: it passes, said.
    assert "passing despite warn: gpu_memory_errors gpu 0000:18:00.0" in done.stderr
    # Only the GPU checks run: the slow link and ACS are not the prolog's to judge.
    assert "gpu_pcie" not in done.stderr and "pcie_acs" not in done.stderr
    assert elapsed < 30  # the budget (5 s) plus the interpreter, on a loaded machine
    # Recorded for health-check's takeover of Slurm's "Prolog error" drain.
    recorded = load_hook_failure(config.parent / "state" / HOOK_FAILURE_FILE)
    assert recorded is not None and (recorded.hook, recorded.job) == ("prolog", "4242")
    assert recorded.reason == next(line for line in unusable) and started - 60 < recorded.at


def test_a_gate_with_a_bad_configuration_still_judges_and_says_it_records_nothing(
    dgx_faulty: Node, dgx: Node, tmp_path: Path
) -> None:
    """The configuration is read only to record a failure, and never fails the gate: exit
    2 would have Slurm drain a healthy node, everywhere the file is bad."""
    bad = tmp_path / "config.toml"
    bad.write_text("[agent]\nstate_dir = 7\n")
    done = run(*dgx_faulty.cli_args, "slurm", "prolog", "--config", str(bad), env=dgx_faulty.env)
    assert done.returncode == 1, done.stderr
    assert "nodecheck prolog: bad configuration (" in done.stderr
    assert f"{bad}" in done.stderr and "will not take Slurm's drain over" in done.stderr
    healthy = run(*dgx.cli_args, "slurm", "prolog", "--config", str(bad), env=dgx.env)
    assert healthy.returncode == 0 and "bad configuration" not in healthy.stderr


def test_prolog_judges_only_the_job_s_gpus(dgx_faulty: Node, config: Path) -> None:
    """SLURM_JOB_GPUS=0,2 (indices in bus order: 0000:18:00.0 and 0000:3a:00.0): the
    faults of GPUs 1, 6 and 7 are not this job's, said and passed; the node-wide one (a GPU
    lost: fewer GPUs than on the bus) still stops it."""
    done = run(
        *dgx_faulty.cli_args,
        "slurm",
        "prolog",
        "--config",
        str(config),
        env={**dgx_faulty.env, "SLURM_JOB_GPUS": "0,2"},
    )
    assert done.returncode == 1, done.stderr
    unusable = [
        line.removeprefix("nodecheck prolog: node unusable: ").split(": ")[0]
        for line in done.stderr.splitlines()
        if line.startswith("nodecheck prolog: node unusable: ")
    ]
    assert unusable == ["gpu_count node"]
    assert (
        "passing despite fail (not one of the job's GPUs): gpu_xid gpu 0000:bc:00.0" in done.stderr
    )
    # Given only healthy GPUs on a node that has lost none but faults elsewhere: passes.
    xid_only = run(
        *dgx_faulty.cli_args,
        "slurm",
        "prolog",
        "--config",
        str(config),
        "--expected-gpus",
        "7",
        env={**dgx_faulty.env, "SLURM_JOB_GPUS": "0"},
    )
    assert "node unusable: gpu_xid" not in xid_only.stderr


def test_a_dry_run_passes_and_says_it_would_fail(dgx_faulty: Node) -> None:
    done = run(*dgx_faulty.cli_args, "slurm", "prolog", "--dry-run", env=dgx_faulty.env)
    assert done.returncode == 0, done.stderr
    assert "nodecheck prolog: node unusable: gpu_xid gpu 0000:bc:00.0" in done.stderr
    assert (
        "nodecheck prolog: dry run (--dry-run): would exit 1, and Slurm drain the node "
        "(Prolog error); passing" in done.stderr
    )


def test_prolog_on_the_healthy_node_exits_0(dgx: Node) -> None:
    done = run(*dgx.cli_args, "slurm", "prolog", env=dgx.env)
    assert done.returncode == 0, done.stderr
    assert "node unusable" not in done.stderr


def test_prolog_fails_on_fewer_gpus_than_expected(dgx: Node, config: Path) -> None:
    done = run(
        *dgx.cli_args,
        "slurm",
        "prolog",
        "--config",
        str(config),
        "--expected-gpus",
        "9",
        env=dgx.env,
    )
    assert done.returncode == 1, done.stderr
    assert "nodecheck prolog: node unusable: gpu_count node:" in done.stderr


def test_epilog_runs_the_quick_checks_and_no_benchmark(
    dgx_faulty: Node, dgx: Node, config: Path
) -> None:
    faulty = run(
        *dgx_faulty.cli_args, "slurm", "epilog", "--config", str(config), env=dgx_faulty.env
    )
    assert faulty.returncode == 1, faulty.stderr
    assert f"nodecheck epilog: {NO_BENCHMARKS_HERE}" in faulty.stderr
    assert "nodecheck epilog: node unusable: gpu_xid gpu 0000:bc:00.0: XID 79" in faulty.stderr
    # Every quick check ran: the host checks' failures are said, and do not drain.
    assert "passing despite fail: pcie_acs bridge 0000:39:00.0" in faulty.stderr
    assert "passing despite fail: nccl_env node" in faulty.stderr
    assert "bench" not in faulty.stderr.replace("benchmarks are not run", "")
    healthy = run(*dgx.cli_args, "slurm", "epilog", env=dgx.env)
    assert healthy.returncode == 0, healthy.stderr
    assert "node unusable" not in healthy.stderr


def test_budget_is_bounded() -> None:
    done = run("slurm", "prolog", "--budget", "0")
    assert done.returncode == 2 and "--budget" in done.stderr


def test_a_hung_gpu_passes_within_the_budget_and_says_so(dgx: Node, tmp_path: Path) -> None:
    # GPU 2's NVML call never returns: the gate cannot judge it, and does not stop jobs
    # for that (an `error`), nor wait past its budget.
    hanging = dgx_healthy()
    hanging["gpus"][2]["hang"] = {"nvmlDeviceGetFieldValues": 0}
    node = dgx.with_scenario(hanging, tmp_path / "hang.json")
    started = time.monotonic()
    done = run(*node.cli_args, "slurm", "prolog", "--budget", "3", env=node.env)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "node unusable" not in done.stderr
    assert "nodecheck prolog: passing despite error:" in done.stderr
    assert "0000:3a:00.0" in done.stderr
    assert elapsed < 3 + 25  # the budget, plus starting Python on a loaded machine


@pytest.mark.parametrize("command", ["prolog", "epilog", "task-prolog"])
def test_help(command: str) -> None:
    done = run("slurm", command, "--help")
    assert done.returncode == 0 and "--sysfs-root" in done.stdout


def test_a_fatal_result_is_kept_when_another_check_outruns_the_budget(
    dgx: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost GPU slows the other GPU checks: the gate must fail on the check that did
    finish, not pass because one did not (the slow one is an `error` line)."""
    import threading

    from nodecheck.agent.slurm import prolog as slurm_prolog
    from nodecheck.checks import registry
    from nodecheck.checks.context import CheckContext
    from nodecheck.checks.registry import Check
    from nodecheck.checks.result import NODE, Result

    released = threading.Event()

    def lost(ctx: CheckContext) -> list[Result]:
        return [Result(Status.FAIL, "gpu 0000:bc:00.0", "NVML: GPU fell off the bus")]

    def slow(ctx: CheckContext) -> list[Result]:
        released.wait(30)
        return [Result(Status.OK, NODE, "late")]

    checks = {
        "gpu_count": Check("gpu_count", lost, 60, 30, "count", ("gpus",), gate=True),
        "gpu_xid": Check("gpu_xid", slow, 60, 30, "xid", ("gpus",), gate=True),
    }
    monkeypatch.setattr(registry, "load_checks", lambda: checks)
    started = time.monotonic()
    try:
        outcome = slurm_prolog.run_gate("prolog", dgx.context(), ("gpu_count", "gpu_xid"), 1.0)
    finally:
        released.set()
    assert outcome.code == EXIT_UNUSABLE, outcome.lines
    assert any("GPU fell off the bus" in line for line in outcome.lines)
    assert any("gpu_xid" in line and "did not finish" in line for line in outcome.lines)
    assert time.monotonic() - started < 20  # the budget, not the checks' own 30 s
