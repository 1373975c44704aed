"""`nodecheck slurm health-check` as slurmd runs it: real nodecheck subprocesses on the
replicas and their fake NVML, with a stand-in scontrol on PATH that answers `show node`
from a state file, as Slurm 22.05 prints it, and applies and records `update` and
`reboot`. (The real one-node Slurm cluster's tests come with its fixture.)"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodecheck.agent.findings import (
    CHECK_SCHEMA,
    StoredRun,
    check_document,
    document_text,
    fresh_results,
)
from nodecheck.agent.slurm.ownership import DRAIN_RECORD_FILE, DrainRecord, save_drain_record
from nodecheck.checks.result import Result, Status
from nodecheck.checks.runner import CheckRun
from tests.conftest import CLEAN_ENVIRON, Node
from tests.fixtures.nvml_scenarios import dgx_healthy, modified

STAND_IN = r"""
import json, os, pwd, sys, time
here = os.path.dirname(os.path.abspath(__file__))
state_path = os.path.join(here, "state.json")
with open(os.path.join(here, "calls.log"), "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
if os.path.exists(os.path.join(here, "hang")):
    time.sleep(3600)
if os.path.exists(os.path.join(here, "fail")):
    sys.stderr.write("slurm_load_node error: Unable to contact slurm controller\n")
    sys.exit(1)
state = json.load(open(state_path))
args = sys.argv[1:]
me = pwd.getpwuid(os.geteuid()).pw_name
if args[:2] == ["show", "node"]:
    flags = "".join("+" + f for f in state["flags"])
    if len(args) == 2 and os.path.exists(os.path.join(here, "others")):
        # Every node: the cluster's other nodes first, as the test wrote them.
        print(open(os.path.join(here, "others")).read())
    print(f"NodeName={args[2] if len(args) > 2 else 'gpu01'} Arch=x86_64 CoresPerSocket=56")
    print("   CPUAlloc=0 CPUEfctv=224 CPUTot=224 CPULoad=0.10")
    print(f"   State={state['base']}{flags} ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A")
    print("   Partitions=debug")
    if state.get("reason"):
        print(f"   Reason={state['reason']} [{state['user']}@2026-12-01T15:00:00]")
elif args[:1] == ["update"]:
    fields = dict(a.split("=", 1) for a in args[1:])
    if fields["State"] == "DRAIN":
        state["flags"] = sorted(set(state["flags"]) | {"DRAIN"})
        state["reason"], state["user"] = fields["Reason"], me
    elif fields["State"] == "UNDRAIN":
        state["flags"] = [f for f in state["flags"] if f != "DRAIN"]
        state["reason"] = state["user"] = None
    json.dump(state, open(state_path, "w"))
elif args[:1] == ["reboot"]:
    state["flags"] = sorted(set(state["flags"]) | {"DRAIN", "REBOOT_REQUESTED"})
    state["reason"], state["user"] = args[3].split("=", 1)[1], me
    json.dump(state, open(state_path, "w"))
else:
    sys.exit(2)
"""


class Slurm:
    """The stand-in scontrol's folder: its state and the calls it got."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / "scontrol"
        script.write_text(f"#!{sys.executable}\n{STAND_IN}")
        script.chmod(0o755)
        self.set_state("IDLE")

    def set_state(self, base: str, *flags: str, reason: str | None = None, user: str = "") -> None:
        state = {"base": base, "flags": list(flags), "reason": reason, "user": user}
        (self.folder / "state.json").write_text(json.dumps(state))

    def state(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.folder / "state.json").read_text())
        return loaded

    def updates(self) -> list[list[str]]:
        path = self.folder / "calls.log"
        calls = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )
        return [call for call in calls if call[:1] != ["show"]]


def health_check_command(
    node: Node, slurm: Slurm, tmp_path: Path, *extra: str, config: str = ""
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of `nodecheck slurm health-check` as slurmd runs it on
    `node`, with its state in tmp_path/state and the agent's results in tmp_path."""
    config_file = tmp_path / "config.toml"
    (tmp_path / "state").mkdir(exist_ok=True)  # a state directory it is given must exist
    config_file.write_text(
        "[agent]\n"
        f'state_dir = "{tmp_path / "state"}"\n'
        f'results_file = "{tmp_path / "results.json"}"\n' + config
    )
    env = {
        **CLEAN_ENVIRON,
        **node.env,
        "PATH": f"{slurm.folder}:{CLEAN_ENVIRON['PATH']}",
        "SLURMD_NODENAME": "gpu01",
    }
    argv = [
        sys.executable,
        "-m",
        "nodecheck",
        *node.cli_args,
        *extra,
        "slurm",
        "health-check",
        "--config",
        str(config_file),
    ]
    return argv, env


def health_check(
    node: Node, slurm: Slurm, tmp_path: Path, *extra: str, config: str = ""
) -> subprocess.CompletedProcess[str]:
    argv, env = health_check_command(node, slurm, tmp_path, *extra, config=config)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def line_of(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if "event=slurm_health" in line]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_fault_drains_and_the_node_returns_after_three_healthy_runs(
    dgx: Node, dgx_faulty: Node, tmp_path: Path
) -> None:
    slurm = Slurm(tmp_path / "slurm")
    done = health_check(dgx_faulty, slurm, tmp_path)
    assert done.returncode == 1, done.stderr
    assert "action=drain done=true" in line_of(done)
    assert "source='own run (no results file at" in line_of(done)
    [update] = slurm.updates()
    assert update[:3] == ["update", "NodeName=gpu01", "State=DRAIN"]
    assert update[3].startswith("Reason=nodecheck: ")
    assert slurm.state()["flags"] == ["DRAIN"]
    # Still failing: it stays drained, the reason untouched.
    done = health_check(dgx_faulty, slurm, tmp_path)
    assert done.returncode == 1 and "action=nothing" in line_of(done)
    assert len(slurm.updates()) == 1
    # The fault cleared: two healthy runs keep it drained, the third undrains it.
    for run in (1, 2):
        done = health_check(dgx, slurm, tmp_path)
        assert done.returncode == 0, done.stderr
        assert f"healthy {run} of 3 runs in a row" in line_of(done)
        assert slurm.state()["flags"] == ["DRAIN"]
    done = health_check(dgx, slurm, tmp_path)
    assert done.returncode == 0 and "action=undrain done=true" in line_of(done)
    assert slurm.updates()[-1] == ["update", "NodeName=gpu01", "State=UNDRAIN"]
    assert slurm.state() == {"base": "IDLE", "flags": [], "reason": None, "user": None}


def test_a_drain_past_the_fleet_cap_is_withheld_and_reported(
    dgx_faulty: Node, tmp_path: Path
) -> None:
    """Ten other nodes, three drained by nodecheck a minute ago: the cap (10 % of 11, at
    least one) is reached, so the faulty node stays in service, reported (exit 1,
    breaker=open), and scontrol is asked for nothing but the nodes' state."""
    slurm = Slurm(tmp_path / "slurm")
    minute_ago = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 60))
    others = [
        f"NodeName=gpu{index:02d} Arch=x86_64\n   State=IDLE+DRAIN ThreadsPerCore=2\n"
        f"   Reason=nodecheck: gpu_xid gpu 0000:3a:00.0: XID 79 [root@{minute_ago}]\n"
        if index < 3
        else f"NodeName=gpu{index:02d} Arch=x86_64\n   State=IDLE ThreadsPerCore=2\n"
        for index in range(10)
    ]
    (slurm.folder / "others").write_text("".join(others))
    done = health_check(dgx_faulty, slurm, tmp_path)
    assert done.returncode == 1, done.stderr
    line = line_of(done)
    assert "action=nothing" in line and "breaker=open" in line
    assert "3 of 11 nodes drained by nodecheck in the last 3600 s, the cap 1" in line
    assert slurm.updates() == [] and slurm.state()["flags"] == []


def test_an_admin_drain_stays_through_healthy_and_unhealthy_runs(
    dgx: Node, dgx_faulty: Node, tmp_path: Path
) -> None:
    slurm = Slurm(tmp_path / "slurm")
    slurm.set_state("IDLE", "DRAIN", reason="ADMIN SHUTDOWN for cabling", user="alice")
    for node in (dgx, dgx_faulty, dgx, dgx, dgx, dgx):
        done = health_check(node, slurm, tmp_path)
        assert "drained for another reason ('ADMIN SHUTDOWN for cabling' by alice)" in line_of(done)
    assert slurm.updates() == []
    assert slurm.state()["reason"] == "ADMIN SHUTDOWN for cabling"


def test_a_down_node_is_not_touched(dgx_faulty: Node, tmp_path: Path) -> None:
    slurm = Slurm(tmp_path / "slurm")
    slurm.set_state("DOWN", reason="PSU swap", user="alice")
    done = health_check(dgx_faulty, slurm, tmp_path)
    assert done.returncode == 1 and "the node is DOWN: not touching it" in line_of(done)
    assert slurm.updates() == []


def test_a_failing_node_slurm_marked_down_is_drained_to_stay_out(
    dgx_faulty: Node, tmp_path: Path
) -> None:
    """slurmd restarting on a node with a lost GPU: HealthCheckProgram runs before it
    registers, the node DOWN and not responding: drained, so it is not returned."""
    slurm = Slurm(tmp_path / "slurm")
    slurm.set_state("DOWN", "NOT_RESPONDING", reason="Not responding", user="slurm")
    done = health_check(dgx_faulty, slurm, tmp_path)
    assert done.returncode == 1 and "action=drain done=true" in line_of(done)
    assert "draining so that it stays out once slurmd registers" in line_of(done)
    assert slurm.state()["flags"] == ["DRAIN", "NOT_RESPONDING"]


def test_a_failing_or_hanging_scontrol_changes_nothing(dgx_faulty: Node, tmp_path: Path) -> None:
    slurm = Slurm(tmp_path / "slurm")
    (slurm.folder / "fail").touch()
    done = health_check(dgx_faulty, slurm, tmp_path)
    assert done.returncode == 3
    assert (
        "the Slurm state is unknown, changing nothing: scontrol show node gpu01 exited 1: "
        "slurm_load_node error" in line_of(done)
    )
    (slurm.folder / "fail").unlink()
    (slurm.folder / "hang").touch()
    done = health_check(dgx_faulty, slurm, tmp_path, config="[slurm]\nscontrol_timeout = 0.5\n")
    assert done.returncode == 3
    assert "changing nothing: scontrol did not finish within 0.5 s" in line_of(done)
    assert slurm.updates() == []


def write_agent_results(path: Path, *results: Result, age_s: float = 0.0) -> None:
    """The agent's file: gpu_count with `results`, every other quick check passing (an
    agent past its first pass has them all)."""
    from nodecheck.checks.registry import load_checks

    now = time.time() - age_s
    passing = [Result(Status.OK, "node", "fine")]
    stored = [
        StoredRun(
            CheckRun(check, list(results) if name == "gpu_count" else passing, 0.0, True),
            now,
            60.0,
        )
        for name, check in load_checks().items()
    ]
    path.write_text(document_text(check_document("gpu01", stored, now)))


def test_fresh_agent_results_are_judged_without_running_the_checks(
    dgx: Node, tmp_path: Path
) -> None:
    """The agent said gpu_count fails; the replica itself is healthy: the verdict is the
    agent's. Once its results are stale, health-check judges the node itself."""
    slurm = Slurm(tmp_path / "slurm")
    write_agent_results(tmp_path / "results.json", Result(Status.FAIL, "node", "7 of 8 GPUs"))
    done = health_check(dgx, slurm, tmp_path)
    assert done.returncode == 1 and "source='agent results'" in line_of(done)
    assert slurm.updates()[-1][-1] == "Reason=nodecheck: gpu_count node: 7 of 8 GPUs"
    slurm.set_state("IDLE")
    write_agent_results(
        tmp_path / "results.json", Result(Status.FAIL, "node", "7 of 8 GPUs"), age_s=301
    )
    done = health_check(dgx, slurm, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "source='own run (" in line_of(done) and "s old (at most 300 s)" in line_of(done)
    (tmp_path / "results.json").write_text('{"schema": "' + CHECK_SCHEMA + '", "trunc')
    done = health_check(dgx, slurm, tmp_path)
    assert done.returncode == 0 and "source='own run (not JSON" in line_of(done)


def test_the_checks_it_runs_itself_keep_to_the_budget(dgx: Node, tmp_path: Path) -> None:
    """An NVML call that hangs for longer than the budget: the checks waiting on it are
    undetermined at the budget, not at the NVML deadline, and nothing is drained."""
    slurm = Slurm(tmp_path / "slurm")
    hung = dgx.with_scenario(
        modified(dgx_healthy(), gpu=5, hang={"nvmlDeviceGetTemperatureV": 0}),
        tmp_path / "hang.json",
    )
    started = time.monotonic()
    done = health_check(
        hung, slurm, tmp_path, "--nvml-timeout", "8", config="[slurm]\nbudget = 1\n"
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    assert "did not finish within 1 s" in line_of(done)
    assert elapsed < 8, elapsed  # the NVML deadline was not waited for
    assert slurm.updates() == []


def test_the_agent_writes_its_results_where_health_check_reads_them(
    dgx: Node, tmp_path: Path
) -> None:
    config = tmp_path / "agent.toml"
    results = tmp_path / "results.json"
    config.write_text(
        f'[agent]\nlisten = ""\nstate_dir = "{tmp_path}"\nresults_file = "{results}"\n'
    )
    env = {**CLEAN_ENVIRON, **dgx.env}
    agent = subprocess.Popen(
        [sys.executable, "-m", "nodecheck", *dgx.cli_args, "agent", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stderr is not None
        for line in agent.stderr:  # waits on the agent's own word, not on a guessed time
            if "event=ready" in line:
                break
        findings = fresh_results(results, time.time(), 300).findings
    finally:
        agent.terminate()
        agent.wait(30)
    assert {f.check for f in findings} >= {"gpu_count", "cpu", "gpu_xid"}
    assert all(f.status is not Status.FAIL for f in findings)
    assert os.stat(results).st_mode & 0o777 == 0o600


def test_an_agent_without_the_results_folder_says_so_once_and_runs_on(
    dgx: Node, tmp_path: Path
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nlisten = ""\nstate_dir = "{tmp_path}"\n'
        f'results_file = "{tmp_path / "absent" / "results.json"}"\n'
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "nodecheck", *dgx.cli_args, "agent", "--config", str(config)],
        env={**CLEAN_ENVIRON, **dgx.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    try:
        assert agent.stderr is not None
        for line in agent.stderr:
            seen.append(line)
            if "event=ready" in line:
                break
    finally:
        agent.terminate()
        agent.wait(30)
    # A folder the configuration names is missing: an error (only the embedded default's
    # absent folder is an agent run by hand, said at info: agent/daemon/results_file.py).
    failures = [line for line in seen if "event=results_write_failed" in line]
    assert len(failures) == 1 and failures[0].startswith("level=error"), seen
    assert any("event=ready" in line for line in seen)


# -- runs at once, and a state that cannot be saved -----------------------------------------


# The reason health-check sets on the faulty replica (its first failing finding), so a
# run on it finds the fault its reason names and keeps the reason.
FAULTY_REASON = (
    "nodecheck: gpu_count node: 1 GPU(s) on the bus are not usable: 7 GPU(s) answering "
    "NVML, 8 on the PCI bus for this host"
)


def drained_by_nodecheck(slurm: Slurm, tmp_path: Path) -> None:
    """The node drained by nodecheck: the reason in Slurm, and nodecheck's record of it in
    the state folder (agent/slurm/ownership.py)."""
    slurm.set_state("IDLE", "DRAIN", reason=FAULTY_REASON, user=pwd.getpwuid(os.geteuid()).pw_name)
    (tmp_path / "state").mkdir(exist_ok=True)
    save_drain_record(tmp_path / "state" / DRAIN_RECORD_FILE, DrainRecord(FAULTY_REASON))


def saved_runs(tmp_path: Path) -> int:
    """The healthy runs in a row health-check saved."""
    saved: dict[str, Any] = json.loads((tmp_path / "state" / "slurm_health.json").read_text())
    runs: int = saved["healthy_runs"]
    return runs


def undrains(slurm: Slurm) -> list[list[str]]:
    return [update for update in slurm.updates() if update[-1] == "State=UNDRAIN"]


def at_once(
    count: int, node: Node, slurm: Slurm, tmp_path: Path, config: str
) -> list[subprocess.CompletedProcess[str]]:
    """`count` health-checks started together, as slurmd's and operators' runs may be."""
    argv, env = health_check_command(node, slurm, tmp_path, config=config)
    started = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(count)
    ]
    finished = []
    for process in started:
        out, err = process.communicate(timeout=300)
        finished.append(subprocess.CompletedProcess(argv, process.returncode, out, err))
    return finished


def test_runs_at_once_on_the_same_agent_results_are_one_healthy_run(
    dgx: Node, tmp_path: Path
) -> None:
    """Ten runs judging one version of the agent's results are one observation: the
    first counts it, the others say they do not, and none undrains at 2 runs in a row.
    The agent's next results are the second."""
    slurm = Slurm(tmp_path / "slurm")
    drained_by_nodecheck(slurm, tmp_path)
    fine = Result(Status.OK, "node", "8 of 8 GPUs")
    write_agent_results(tmp_path / "results.json", fine)
    config = "[slurm]\nundrain_after_runs = 2\n"
    runs = at_once(10, dgx, slurm, tmp_path, config)
    assert [done.returncode for done in runs] == [0] * 10, [d.stderr for d in runs]
    assert all("source='agent results'" in line_of(done) for done in runs)
    repeated = [done for done in runs if "not counted again" in line_of(done)]
    assert len(repeated) == 9
    assert undrains(slurm) == [] and saved_runs(tmp_path) == 1
    write_agent_results(tmp_path / "results.json", fine)  # a new written_at
    done = health_check(dgx, slurm, tmp_path, config=config)
    assert done.returncode == 0 and "action=undrain done=true" in line_of(done)


def test_runs_at_once_take_turns_and_lose_no_count(dgx: Node, tmp_path: Path) -> None:
    """Ten runs of the quick checks at once: each holds the lock for its whole run, so
    every run judged is counted (none lost) and exactly one undrains, at the fifth. A
    run that waited past the budget changed nothing and said so."""
    slurm = Slurm(tmp_path / "slurm")
    drained_by_nodecheck(slurm, tmp_path)
    runs = at_once(10, dgx, slurm, tmp_path, "[slurm]\nundrain_after_runs = 5\nbudget = 55\n")
    judged = [done for done in runs if done.returncode == 0]
    waited = [done for done in runs if done.returncode != 0]
    assert all(
        done.returncode == 3 and "another slurm health-check has held" in line_of(done)
        for done in waited
    ), [done.stderr for done in waited]
    assert judged and saved_runs(tmp_path) == len(judged)
    assert len(undrains(slurm)) == (1 if len(judged) >= 5 else 0)


def test_a_run_waits_on_the_lock_within_its_budget_then_changes_nothing(
    dgx_faulty: Node, tmp_path: Path
) -> None:
    slurm = Slurm(tmp_path / "slurm")
    (tmp_path / "state").mkdir()
    with open(tmp_path / "state" / "slurm_health.json.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another run, in the middle of its own
        done = health_check(dgx_faulty, slurm, tmp_path, config="[slurm]\nbudget = 1\n")
    assert done.returncode == 3
    assert "another slurm health-check has held" in line_of(done)
    assert "for over 1 s: changing nothing" in line_of(done)
    assert not (slurm.folder / "calls.log").exists()  # not even scontrol show node
    done = health_check(dgx_faulty, slurm, tmp_path)  # the other run is over
    assert done.returncode == 1 and "action=drain done=true" in line_of(done)


@contextlib.contextmanager
def small_filesystem(path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted at `path` for the test (root only), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "nodecheck-test", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", str(path)], check=True)


def fill(folder: Path) -> Path:
    """Fill `folder`'s filesystem to the last block; the filler file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as file, pytest.raises(OSError) as full:
        while True:
            file.write(b"\0" * 65536)
    assert full.value.errno == errno.ENOSPC
    return filler


def four_healthy_runs(dgx: Node, slurm: Slurm, tmp_path: Path, config: str) -> None:
    drained_by_nodecheck(slurm, tmp_path)
    for run in range(1, 5):
        done = health_check(dgx, slurm, tmp_path, config=config)
        assert f"healthy {run} of 5 runs in a row" in line_of(done), done.stderr


def test_a_full_state_folder_cannot_lose_a_failure(
    dgx: Node, dgx_faulty: Node, tmp_path: Path
) -> None:
    """Four healthy runs of five; the state's filesystem fills up; a failure whose reset
    cannot be saved removes the count instead (unlink needs no space); room again, the
    next healthy run is the first in a row, not the fifth."""
    slurm = Slurm(tmp_path / "slurm")
    config = "[slurm]\nundrain_after_runs = 5\n"
    with small_filesystem(tmp_path / "state") as state:
        four_healthy_runs(dgx, slurm, tmp_path, config)
        filler = fill(state)
        failing = health_check(dgx_faulty, slurm, tmp_path, config=config)
        assert failing.returncode == 1, failing.stderr
        assert "No space left on device; removed slurm_health.json instead" in line_of(failing)
        filler.unlink()
        healthy = health_check(dgx, slurm, tmp_path, config=config)
        assert healthy.returncode == 0, healthy.stderr
        assert "healthy 1 of 5 runs in a row" in line_of(healthy)
    assert undrains(slurm) == [] and slurm.state()["flags"] == ["DRAIN"]


def test_a_read_only_state_folder_never_undrains(
    dgx: Node, dgx_faulty: Node, tmp_path: Path
) -> None:
    """Four healthy runs of five; the state's filesystem goes read-only: the failure's
    reset can be neither saved nor removed (said, with what to do), and no healthy run
    undrains while it cannot save its count."""
    slurm = Slurm(tmp_path / "slurm")
    config = "[slurm]\nundrain_after_runs = 5\n"
    with small_filesystem(tmp_path / "state") as state:
        four_healthy_runs(dgx, slurm, tmp_path, config)
        subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        try:
            failing = health_check(dgx_faulty, slurm, tmp_path, config=config)
            assert failing.returncode == 1, failing.stderr
            assert "Read-only file system; cannot remove slurm_health.json either" in line_of(
                failing
            )
            assert f"remove {state / 'slurm_health.json'} once it can be" in line_of(failing)
            for _ in range(2):
                healthy = health_check(dgx, slurm, tmp_path, config=config)
                assert healthy.returncode == 3, healthy.stderr
                assert "this healthy run could not be saved" in line_of(healthy)
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
    assert undrains(slurm) == [] and slurm.state()["flags"] == ["DRAIN"]
