"""`tune` on real machines nobody here described: hwloc's 33 Linux captures, with GPUs
grafted on (tests/fixtures/graft.py: one on each NUMA node, memory-only ones included, one
on each offline node known only from its CPUs' links, and one whose firmware gives no node).

hwloc's own reading of each capture (its .console or .xml, parsed by tools/compare_hwloc.py)
is the oracle: it shows the CPUs a process there may use (online, inside the cpuset) and
the nodes whose memory it may use. Every local rank must be runnable: a non-empty binding
inside hwloc's CPUs, bound (--membind) only to a node hwloc shows, on CPUs hwloc puts in
that node or in none (those nodecheck places by their cpuN/nodeM links, with a note),
disjoint from the other ranks' while there are CPUs enough, OMP_NUM_THREADS >= 1. A capture
without a hwloc reading is skipped, saying so. The bulk runs in-process through the planning
API; a few `nodecheck` subprocesses check the commands (a rank without CPUs, from the
capture without hwloc's reading, is refused by `exec` with exit 2). Where the cgroup
captures restrict the CPUs, nodecheck's allowed CPUs must be hwloc's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.cgroup import read_cpuset
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.inventory import read_inventory
from nodecheck.tuning.plan import Plan, TuneOptions, make_plan
from tests.agent.test_cli import run
from tests.conftest import CLEAN_ENVIRON
from tests.fixtures.graft import Grafted, graft_gpus
from tests.fixtures.pinned_facts import JOB_TORCH_2_13, TORCH_2_13, with_parts
from tools.compare_hwloc import HwlocView, parse_expected
from tools.hwloc_captures import Capture, list_captures, real_data_dir

DATA = real_data_dir()
CAPTURES: dict[str, Capture] = (
    {capture.name: capture for capture in list_captures(DATA / "hwloc")} if DATA else {}
)
# The captures whose hwloc reading is restricted by a cpuset or cgroup.
CGROUP_CAPTURES = (
    "16amd64-4n4c-cgroup-distance-merge",
    "32amd64-4s2n4c-cgroup2",
    "16em64t-4s2ca2c-cpusetreorder",
)


def hwloc_reading(capture: Capture) -> HwlocView | str:
    """hwloc's own reading of the capture (its .console or .xml target, parsed as
    tools/compare_hwloc.py does), or why there is none. hwloc shows only the CPUs a process
    there may use (online, inside its cpuset) and only the nodes whose memory it may use."""
    target = capture.target if capture.description.is_file() else None
    if target is None or not target.is_file():
        return f"{capture.name}: hwloc gives no expected topology (no target in its .test)"
    return parse_expected(target)


@pytest.fixture(scope="module")
def grafted(
    hwloc_captures: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Grafted]:
    into = tmp_path_factory.mktemp("grafted")
    return {name: graft_gpus(root, into / name) for name, root in hwloc_captures.items()}


def node_fs(root: Path) -> NodeFS:
    return NodeFS(sysfs=root / "sys", procfs=root / "proc", rootfs=root)


def plan_for(root: Path) -> Plan:
    fs = node_fs(root)
    ctx = CheckContext(fs=fs, environ=dict(CLEAN_ENVIRON), uid=1000)
    return make_plan(
        with_parts(ctx, torch_version=TORCH_2_13, job_versions=JOB_TORCH_2_13), TuneOptions()
    )


@pytest.mark.parametrize("name", sorted(CAPTURES) or ["(no captures)"])
def test_every_rank_is_runnable_inside_what_hwloc_shows(
    grafted: dict[str, Grafted], name: str
) -> None:
    """Against hwloc's reading: each rank's CPUs are CPUs hwloc shows (online, inside the
    cpuset); a rank bound to a node is bound to one hwloc shows (its memory is there and
    allowed), on CPUs hwloc puts in that node or in no node (the kernel puts every CPU in
    one: nodecheck places those by their cpuN/nodeM links, with a note, where hwloc leaves
    them out); ranks share CPUs only when there are fewer than ranks, and say so."""
    capture, node = CAPTURES[name], grafted[name]
    hwloc = hwloc_reading(capture)
    if isinstance(hwloc, str):
        pytest.skip(hwloc)
    plan = plan_for(node.root)
    assert {rank.binding.gpu for rank in plan.ranks} >= {gpu.bdf for gpu in node.gpus}
    for rank in plan.ranks:
        binding = rank.binding
        # hwloc found CPUs this process may use: a rank without any is nodecheck's misreading.
        assert not rank.error, (name, rank)
        assert binding.cpus, rank
        assert set(binding.cpus) <= hwloc.pus, (name, binding, sorted(hwloc.pus))
        if binding.numa_node is not None:
            assert binding.numa_node in hwloc.numa, (name, binding, sorted(hwloc.numa))
            near = hwloc.numa[binding.numa_node] | hwloc.pus_outside_numa
            assert set(binding.cpus) <= near, (name, binding, sorted(near))
            if set(binding.cpus) & hwloc.pus_outside_numa:
                assert reading_notes(node.root), (name, binding)  # the placement is said
        threads = int(plan.environment(rank)["OMP_NUM_THREADS"])
        assert threads >= 1
        # The rank's budget adds up: its threads and the DataLoader's fit its CPUs.
        assert rank.budget.cpus == len(binding.cpus) and rank.budget.used <= rank.budget.cpus
        assert threads <= rank.budget.intra_op
        if "runs away from its GPU" in binding.note:
            # Off its GPU's node by the cpuset: it runs, and its warning says so.
            assert "ask the scheduler for CPUs of each GPU's node" in rank.warning, (name, rank)
    for rank in plan.ranks:
        others = [set(other.binding.cpus) for other in plan.ranks if other is not rank]
        if set(rank.binding.cpus) & set().union(*others):
            # Sharing only when no CPU is left that no other rank holds, and never silently.
            assert hwloc.pus <= set().union(*others), (name, rank)
            assert "shares CPU(s)" in rank.warning, (name, rank)


def test_a_gpu_without_a_node_never_shrinks_a_local_rank(grafted: dict[str, Grafted]) -> None:
    """16amd64-8n2c: eight nodes of two cores, a grafted GPU on each and one with numa_node
    -1. Every rank bound next to its GPU keeps both cores of its node; the -1 GPU's rank
    shares one rank's CPUs, and both say so (it used to take CPU 1 from rank 0)."""
    name = "16amd64-8n2c"
    if name not in grafted:
        pytest.skip(f"{name}: not among the captures here")
    plan = plan_for(grafted[name].root)
    local = [rank for rank in plan.ranks if rank.binding.numa_node is not None]
    assert len(local) == 8 and all(len(rank.binding.cpus) == 2 for rank in local)
    [nowhere] = [rank for rank in plan.ranks if rank.binding.numa_node is None]
    assert "no NUMA node (numa_node -1)" in nowhere.binding.note
    assert "shares CPU(s)" in nowhere.warning
    [partner] = [rank for rank in local if rank.binding.cpus == nowhere.binding.cpus]
    assert nowhere.binding.gpu in partner.warning


def test_ranks_the_cpuset_keeps_off_their_gpus_are_warned(grafted: dict[str, Grafted]) -> None:
    """16amd64-4n4c-cgroup-distance-merge: the cpuset allows CPUs 0-3 (node 0) only, and
    the grafted GPUs of nodes 1-3 drive ranks bound there: each is warned, naming why."""
    name = "16amd64-4n4c-cgroup-distance-merge"
    if name not in grafted:
        pytest.skip(f"{name}: not among the captures here")
    plan = plan_for(grafted[name].root)
    away = [rank for rank in plan.ranks if "runs away from its GPU" in rank.binding.note]
    assert len(away) >= 3
    for rank in away:
        assert set(rank.binding.cpus) <= {0, 1, 2, 3}
        assert "but this process's cpuset (0-3) holds none of them" in rank.warning


@pytest.mark.parametrize("name", CGROUP_CAPTURES)
def test_allowed_cpus_are_hwlocs_where_a_cpuset_restricts_them(
    grafted: dict[str, Grafted], name: str
) -> None:
    """The cpuset (cgroup v1 with noprefix at /dev/cpuset, cgroup2 at /cgroup/unified, the
    old cpuset form), read through /proc/mounts and /proc/self/cpuset, and the node's online
    CPUs: what nodecheck binds inside is exactly what hwloc shows. Through the command."""
    if name not in CAPTURES:
        pytest.skip(f"{name}: not among the captures here")
    hwloc = hwloc_reading(CAPTURES[name])
    assert not isinstance(hwloc, str), hwloc
    usable = hwloc.pus
    root = grafted[name].root
    cpuset = read_cpuset(node_fs(root))
    assert cpuset.error == "" and cpuset.cpus is not None
    online = read_inventory(node_fs(root)).cpu.online
    assert cpuset.cpus & online == usable
    done = run(
        *("--sysfs-root", str(root / "sys"), "--procfs-root", str(root / "proc")),
        *("--rootfs", str(root), "tune", "--format", "json"),
    )
    assert done.returncode == 0, done.stderr
    ranks = json.loads(done.stdout)["ranks"]
    bound = set().union(*(set(rank["cpus"]) for rank in ranks))
    assert bound and bound <= usable
    assert all(rank["cpus"] or rank["status"] == "error" for rank in ranks)


def reading_notes(root: Path) -> list[str]:
    """What nodecheck's reading of the node inferred (the notes `inventory` shows)."""
    inventory = read_inventory(node_fs(root))
    notes = [*inventory.cpu.notes, *inventory.numa_notes]
    return notes + [note for node in inventory.numa_nodes for note in node.notes]


def test_exec_refuses_the_error_ranks_and_runs_a_valid_one(
    grafted: dict[str, Grafted], tmp_path: Path
) -> None:
    """A few `nodecheck exec` runs: a rank without CPUs exits 2 with one line; a rank whose
    binding this machine can apply (its CPUs here, no memory node it lacks) runs `true`."""
    erroring = []
    applicable = []
    here = os.sched_getaffinity(0)
    for _, node in sorted(grafted.items()):
        plan = plan_for(node.root)
        for rank in plan.ranks:
            if rank.error:
                erroring.append((node, rank.local_rank))
            elif set(rank.binding.cpus) <= here and rank.binding.numa_node in (None,):
                applicable.append((node, rank.local_rank))
    for node, local_rank in erroring[:2] + applicable[:2]:
        root = node.root
        started = tmp_path / f"started-{root.name}-{local_rank}"
        done = run(
            *("--sysfs-root", str(root / "sys"), "--procfs-root", str(root / "proc")),
            *("--rootfs", str(root), "exec", "--local-rank", str(local_rank), "--"),
            *(sys.executable, "-c", f"open({str(started)!r}, 'w')"),
        )
        assert "Traceback" not in done.stderr
        if (node, local_rank) in erroring:
            assert done.returncode == 2, done.stderr
            [line] = done.stderr.splitlines()
            assert "no CPU to bind it to" in line and not started.exists()
        else:
            assert done.returncode == 0, done.stderr
            assert started.exists()
    if not erroring:
        pytest.skip(
            "no capture leaves a rank without CPUs (the CLI case is covered by "
            "tests/agent/test_tune.py)"
        )
