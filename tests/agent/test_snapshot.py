"""Privilege separation: the root snapshot (a facts capture), and the agent judging the
root checks over it with its own configuration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nodecheck.agent.daemon.agent import Agent
from nodecheck.agent.daemon.snapshot import (
    from_snapshot,
    read_snapshot,
    results_from_snapshot,
    root_checks,
    snapshot_parts,
)
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import SCHEMA, load
from nodecheck.checks.node.fs import ABANDONED_TEMPORARY_S, write_atomically
from nodecheck.checks.registry import Check, load_checks
from nodecheck.checks.result import NODE, Result, Status
from nodecheck.checks.runner import run_checks
from tests.agent.test_cli import run
from tests.conftest import CLEAN_ENVIRON, Node


def as_if_taken_at(document: dict[str, Any], taken_at: float) -> dict[str, Any]:
    """The capture as if taken at `taken_at`: its kernel log's boot and events moved with it,
    so that no event falls after the capture (which the reader refuses as impossible)."""
    shift = taken_at - document["taken_at"]
    moved = json.loads(json.dumps(document))
    log = moved["parts"]["kernel_log"]["value"]
    if isinstance(log.get("boot_time"), float):
        log["boot_time"] += shift
    for event in (*log["xids"], *log["sxids"], *log.get("aer", [])):
        if isinstance(event.get("at"), float):
            event["at"] += shift
    return {**moved, "taken_at": taken_at}


@pytest.fixture(scope="module")
def snapshot_file(dgx_faulty: Node, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`nodecheck snapshot` of the faulty DGX, as root sees it."""
    output = tmp_path_factory.mktemp("snapshot") / "run" / "snapshot.json"
    output.parent.mkdir()  # its folder must exist: only the default's is created
    done = run(*dgx_faulty.cli_args, "snapshot", "--output", str(output), env=dgx_faulty.env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith(f"{output}: ")
    return output


def served(check: Check, path: Path, ctx: CheckContext) -> list[Result]:
    [run_] = run_checks([from_snapshot(check, path)], ctx)
    return run_.results


def test_the_snapshot_is_a_capture_of_what_the_root_checks_need(snapshot_file: Path) -> None:
    """No judged results: a nodecheck.facts/v1 document of the parts the checks registered
    with root=True need, world-readable (the agent reads it as another user)."""
    assert snapshot_file.stat().st_mode & 0o777 == 0o644
    document = json.loads(snapshot_file.read_text())
    assert document["schema"] == SCHEMA and "runs" not in document
    checks = root_checks(load_checks())
    assert {"pcie_acs", "nccl_env", "torch_alloc", "nvswitch_sxid"} <= {c.name for c in checks}
    facts = load(snapshot_file)
    assert set(facts.parts) == set(snapshot_parts(checks))
    assert {"inventory", "variables"} <= set(facts.parts)
    assert "gpus" not in facts.parts  # no root check judges NVML


def test_the_agent_judges_root_checks_over_the_snapshot(
    dgx: Node, dgx_faulty: Node, snapshot_file: Path
) -> None:
    """What root saw reaches the agent whole, whatever the agent itself reads: served to
    an agent on the healthy twin, the faulty node's NCCL_P2P_DISABLE=1 (a job's
    environment) and ACS on two switch ports come back with the statuses, remedies,
    details and metric samples root's own run gives them."""
    checks = load_checks()
    assert not any("NCCL_P2P_DISABLE=1" in r.summary for r in dgx.results("nccl_env"))
    nccl = served(checks["nccl_env"], snapshot_file, dgx.context())
    assert any("NCCL_P2P_DISABLE=1" in r.summary and r.status is Status.FAIL for r in nccl)
    for name in ("pcie_acs", "nccl_env", "torch_alloc", "nvswitch_sxid"):
        mine = served(checks[name], snapshot_file, dgx.context())
        direct = dgx_faulty.results(name)
        assert [(r.status, r.subject, r.summary, r.remedy, r.details) for r in mine] == [
            (r.status, r.subject, r.summary, r.remedy, r.details) for r in direct
        ], name
        assert [(s.metric, s.value, dict(s.labels)) for r in mine for s in r.samples] == [
            (s.metric, s.value, dict(s.labels)) for r in direct for s in r.samples
        ], name
    acs = served(checks["pcie_acs"], snapshot_file, dgx.context())
    assert sum(r.status is Status.FAIL for r in acs) == 2


def test_the_agent_applies_its_own_configuration(
    dgx_faulty: Node, snapshot_file: Path, tmp_path: Path
) -> None:
    """The agent wraps exactly the checks declared root=True, and judges them with its own
    CheckConfig (expected_gpus here) and the snapshot's time as the rules' "now"."""
    config = tmp_path / "config.toml"
    config.write_text(f'[agent]\nlisten = ""\nexpected_gpus = 5\nsnapshot = "{snapshot_file}"\n')
    agent = Agent(dgx_faulty.fs, config, str(dgx_faulty.nvml_library))
    chosen = {check.name: check for check, _ in agent._checks(agent.config)}
    registered = agent.available
    wrapped = {name for name, check in chosen.items() if check.run is not registered[name].run}
    assert wrapped == {check.name for check in root_checks(registered)}
    assert all(chosen[name].needs == registered[name].needs for name in wrapped)
    seen: list[tuple[int | None, float]] = []

    def probe(ctx: CheckContext) -> list[Result]:
        seen.append((ctx.config.expected_gpus, ctx.now))
        return [Result(Status.OK, NODE, f"{len(ctx.variables.settings)} settings")]

    check = Check("probe", probe, 60.0, 10.0, "a probe", needs=("variables",), root=True)
    [result] = served(check, snapshot_file, agent._context())
    assert result.status is Status.OK
    assert seen == [(5, read_snapshot(snapshot_file).taken_at)]


def test_missing_stale_or_incomplete_snapshot_is_undetermined(
    dgx_faulty: Node, snapshot_file: Path, tmp_path: Path
) -> None:
    checks = load_checks()
    pcie_acs = checks["pcie_acs"]
    [missing] = results_from_snapshot(pcie_acs, tmp_path / "none.json", dgx_faulty.context())
    assert missing.status is Status.ERROR
    assert missing.remedy == "systemctl enable --now nodecheck-snapshot.timer"
    assert "pcie_acs needs root" in missing.summary
    document = json.loads(snapshot_file.read_text())
    old = tmp_path / "old.json"
    old.write_text(json.dumps(as_if_taken_at(document, 1764583200.0)))
    [stale] = results_from_snapshot(pcie_acs, old, dgx_faulty.context(), now=1764586800.0)
    assert stale.status is Status.ERROR
    assert stale.summary == (
        f"the snapshot {old} was taken 60 min ago (2025-12-01 10:00:00 UTC): pcie_acs is not "
        "judged from facts that may no longer hold"
    )
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{")
    [bad] = results_from_snapshot(pcie_acs, garbage, dgx_faulty.context())
    assert bad.status is Status.ERROR
    assert bad.summary.startswith(f"cannot read the snapshot {garbage}: the document is not JSON")
    lacking = tmp_path / "lacking.json"
    parts = {k: v for k, v in document["parts"].items() if k != "variables"}
    lacking.write_text(json.dumps({**document, "parts": parts}))
    [without] = results_from_snapshot(checks["nccl_env"], lacking, dgx_faulty.context())
    assert without.status is Status.ERROR
    assert without.summary.startswith(f"the snapshot {lacking} has no variables, which nccl_env")


# `nodecheck snapshot` on a disk whose fsync(2) never returns: the writer stops after its
# temporary is written and before the rename, where a kill -9 leaves that temporary.
SLOW_DISK_SNAPSHOT = (
    "import os, sys, threading\n"
    "os.fsync = lambda descriptor: threading.Event().wait()\n"
    "from nodecheck.agent.cli import main\n"
    "sys.argv[0] = 'nodecheck'\n"
    "main()\n"
)


def leftovers(folder: Path) -> list[str]:
    """What a writer left in `folder` besides the snapshot itself."""
    return sorted(p.name for p in folder.iterdir() if p.name != "snapshot.json")


def test_a_writer_killed_mid_write_leaves_a_temporary_the_next_write_removes(
    dgx_faulty: Node, tmp_path: Path
) -> None:
    """kill -9 of a snapshot writer leaves its temporary (no cleanup runs); the next write
    to the folder removes it, but never the temporary of a writer still alive."""
    output = tmp_path / "snapshot.json"
    environ = dict(CLEAN_ENVIRON, PATH=os.environ["PATH"], **dgx_faulty.env)
    if "PYTHONPATH" in os.environ:
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    argv = [*dgx_faulty.cli_args, "snapshot", "--output", str(output)]
    stuck = subprocess.Popen(
        [sys.executable, "-c", SLOW_DISK_SNAPSHOT, *argv],
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not leftovers(tmp_path) and stuck.poll() is None:
            assert time.monotonic() < deadline, "no temporary within 120 s"
            time.sleep(0.05)
        [temporary] = leftovers(tmp_path)
        assert stuck.poll() is None, "the writer should be waiting on its fsync"
        # A live writer's temporary is not touched by another write.
        done = run(*argv, env=dgx_faulty.env)
        assert done.returncode == 0, done.stderr
        assert leftovers(tmp_path) == [temporary]
    finally:
        stuck.kill()  # SIGKILL: no exception handler, no cleanup
        stuck.wait(30)
    assert leftovers(tmp_path) == [temporary]
    done = run(*argv, env=dgx_faulty.env)
    assert done.returncode == 0, done.stderr
    assert leftovers(tmp_path) == []
    assert read_snapshot(output).parts


def test_temporaries_of_other_writers_are_removed_only_once_old(tmp_path: Path) -> None:
    """A temporary named for another host or PID namespace (a state directory on NFS), or
    by an earlier version (mkstemp's ".<name>.<8 random characters>", no pid): nothing
    here says whether its writer lives, so it is left until older than
    ABANDONED_TEMPORARY_S. Files that are not write_atomically's temporaries of this file
    are never removed, however old."""
    target = tmp_path / "benchmarks.json"
    elsewhere = [f".benchmarks.json.0123456789ab.{pid}.k2j4h5g6.tmp" for pid in (4242, 4243)]
    unnamed = [".benchmarks.json.k2j4h5g6", ".benchmarks.json.a_9zq0xw"]
    others = [
        ".benchmarks.json.lock",
        ".benchmarks.json.k2j4h5g6x",  # nine characters: no mkstemp name
        ".other.json.0123456789ab.4244.k2j4h5g6.tmp",
    ]
    for name in [*elsewhere, *unnamed, *others]:
        (tmp_path / name).write_text("partial")
    old = time.time() - ABANDONED_TEMPORARY_S - 60
    for name in [elsewhere[0], unnamed[0], *others]:
        os.utime(tmp_path / name, (old, old))
    write_atomically(target, "{}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [elsewhere[1], unnamed[1], *others, "benchmarks.json"]
    )


def nccl_env_exposition(results: list[Result]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The agent's /metrics families with `results` as nccl_env's latest run."""
    from prometheus_client.parser import text_string_to_metric_families

    from nodecheck.agent.daemon.exporter import ResultCollector, exposition, make_registry
    from nodecheck.agent.daemon.scheduler import ResultStore
    from nodecheck.checks.runner import CheckRun

    store = ResultStore()
    store.put(CheckRun(load_checks()["nccl_env"], results, 0.01, True), 60.0)
    text = exposition(make_registry(ResultCollector(store, "test", lambda: True))).decode()
    assert "NCCL_P2P_DISABLE" not in text  # findings are series' statuses, never names
    return {
        family.name: [(sample.labels, sample.value) for sample in family.samples]
        for family in text_string_to_metric_families(text)
    }


def lit(families: dict[str, list[tuple[dict[str, str], float]]], status: str) -> list[str]:
    """The subjects whose nccl_env status series for `status` is 1."""
    return [
        labels["subject"]
        for labels, value in families["nodecheck_check_status"]
        if labels["status"] == status and value == 1
    ]


@pytest.mark.parametrize(
    ("offset_s", "says"),
    [
        (-7200.0, "was taken 2 h ago ("),
        (10 * 365.25 * 86400, "is dated 3652 days in the future ("),
    ],
    ids=["two_hours_old", "ten_years_ahead"],
)
def test_a_stale_or_future_snapshot_serves_none_of_its_findings(
    dgx: Node, snapshot_file: Path, tmp_path: Path, offset_s: float, says: str
) -> None:
    """The faulty node's snapshot (a job's NCCL_P2P_DISABLE=1), dated two hours back or
    ten years ahead, served to the agent on the healthy twin: nccl_env is one `error`
    on the node saying how old (or how far ahead) the snapshot is and when it was taken,
    no finding of its facts; the exporter's series say error, none fail. Fresh, the
    same facts fail."""
    checks = load_checks()
    document = json.loads(snapshot_file.read_text())
    now = time.time()
    fresh = tmp_path / "fresh.json"
    fresh.write_text(json.dumps(as_if_taken_at(document, now)))
    judged = results_from_snapshot(checks["nccl_env"], fresh, dgx.context(), now=now)
    assert any("NCCL_P2P_DISABLE=1" in r.summary and r.status is Status.FAIL for r in judged)
    assert lit(nccl_env_exposition(judged), "fail") == ["node"]

    dated = tmp_path / "dated.json"
    dated.write_text(json.dumps(as_if_taken_at(document, now + offset_s)))
    [result] = results_from_snapshot(checks["nccl_env"], dated, dgx.context(), now=now)
    assert (result.status, result.subject) == (Status.ERROR, NODE)
    assert result.summary.startswith(f"the snapshot {dated} {says}"), result.summary
    assert "nccl_env is not judged" in result.summary and " UTC)" in result.summary
    assert "NCCL_P2P_DISABLE" not in result.summary + result.remedy + str(result.details)
    families = nccl_env_exposition([result])
    assert lit(families, "fail") == [] and lit(families, "error") == ["node"]
    assert families["nodecheck_checks_failing"] == [({}, 0.0)]
