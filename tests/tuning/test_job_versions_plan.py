"""What `tune` sets by the job's torch and NCCL: the renamed variables' names (torch 2.8,
2.9, unknown: both), NCCL_IB_TIMEOUT's default (2.13, 2.14, 2.23), max_split_size_mb:20
(refused before torch 2.10), each saying where its version came from; and a replica whose
running job maps its libraries, read end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from nodecheck.agent.launch.rank_exec import applied_environment
from nodecheck.agent.launch.tune_view import render_json
from nodecheck.checks.node.variables import CALLING_ENVIRONMENT, Setting
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Status
from nodecheck.checks.rules.allocator_settings import judge_alloc_setting
from nodecheck.checks.rules.job_versions import VersionEvidence
from nodecheck.checks.runner import run_checks
from nodecheck.tuning.nccl import JobShape
from nodecheck.tuning.plan import Plan, TuneOptions, make_plan
from nodecheck.tuning.pytorch import allocator
from tests.conftest import Node
from tests.fixtures import nodes
from tests.fixtures.nodegen import build_node
from tests.fixtures.pinned_facts import JOB_PYTHON, TORCH_2_13, job_with, with_parts

RENAMED = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
)


def plan_with(node: Node, torch: str | None = None, nccl: str | None = None, **env: str) -> Plan:
    job = job_with(torch, nccl)
    ctx = with_parts(node.context(env), torch_version=TORCH_2_13, job_versions=job)
    return make_plan(ctx, TuneOptions(shape=JobShape(2)))


def torch_at(text: str | None) -> VersionEvidence:
    if text is None:
        return VersionEvidence("torch")
    return VersionEvidence("torch", text, JOB_PYTHON, True)


@pytest.mark.parametrize(
    ("torch", "names"),
    [
        ("2.8.0", {"PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_TRACE_BUFFER_SIZE"}),
        ("2.9.0", {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "TORCH_FR_BUFFER_SIZE"}),
        (None, set(RENAMED)),
    ],
)
def test_renamed_variables_follow_the_jobs_torch(
    dgx: Node, torch: str | None, names: set[str]
) -> None:
    plan = plan_with(dgx, torch)
    env = plan.environment(None)
    assert {name for name in RENAMED if name in env} == names
    buffer = [r for r in plan.env if "BUFFER_SIZE" in r.name]
    assert {r.value for r in buffer} == {"20000"}
    dump = next(r for r in plan.env if r.name == "TORCH_NCCL_DUMP_ON_TIMEOUT")
    if torch is None:
        assert "both names, the old one for torch before 2.9" in buffer[0].reason
        assert (
            "TORCH_FR_DUMP_TEMP_FILE (TORCH_NCCL_DEBUG_INFO_TEMP_FILE before torch 2.9)"
            in dump.reason
        )
        assert any(
            n.startswith("the job's torch is not known: each renamed variable") for n in plan.notes
        )
    else:
        # The version and where it came from, on the recommendation itself.
        read = "its site-packages read without starting it (a venv)"
        origin = f"torch {torch} (from {JOB_PYTHON}, {read})"
        assert origin in buffer[0].reason
        expected = (
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" if torch == "2.8.0" else "TORCH_FR_DUMP_TEMP_FILE"
        )
        assert f"the file {expected} names" in dump.reason
        assert any(n.startswith(f"versions: {origin}") for n in plan.notes)
    document = json.loads(render_json(plan, None))
    assert document["versions"]["torch"]["known"] is (torch is not None)
    assert document["versions"]["torch"]["version"] == torch
    seen = " ".join(document["versions"]["torch"]["seen_elsewhere"])
    assert ("nodecheck's own Python" in seen) is (torch is None)


def test_a_users_buffer_size_stands_under_both_names(dgx: Node) -> None:
    plan = plan_with(dgx, None, TORCH_NCCL_TRACE_BUFFER_SIZE="4000")
    env = plan.environment(None)
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "4000"


@pytest.mark.parametrize(
    ("torch", "size", "expected_new"),
    [
        (None, "0", None),  # off on purpose, the torch unknown: the new name stays unset
        ("2.9.0", "0", None),  # torch 2.9 reads the old name after the new one: same
        ("2.9.0", "5000", "5000"),  # the user's size, under the name torch reads first
    ],
)
def test_exec_keeps_a_size_set_under_the_old_name(
    dgx: Node, torch: str | None, size: str, expected_new: str | None
) -> None:
    """The reviewer's case: TORCH_NCCL_TRACE_BUFFER_SIZE=0 (or 5000) set by the user must
    not be overridden by a TORCH_FR_BUFFER_SIZE=20000 that torch reads first."""
    calling = {"TORCH_NCCL_TRACE_BUFFER_SIZE": size}
    plan = plan_with(dgx, torch, **calling)
    rank = plan.rank(0)
    assert rank is not None
    env, _, _, _ = applied_environment(plan, rank, calling)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == size
    assert env.get("TORCH_FR_BUFFER_SIZE") == expected_new


def test_exec_replaces_a_size_that_is_no_count_with_the_users_other_one(dgx: Node) -> None:
    """A value that is no count is no size of the user's: replaced, by the count the user
    set under the other name (the reviewer's TORCH_FR_BUFFER_SIZE=abc beside 5000)."""
    calling = {"TORCH_FR_BUFFER_SIZE": "abc", "TORCH_NCCL_TRACE_BUFFER_SIZE": "5000"}
    plan = plan_with(dgx, "2.10.0", **calling)
    rank = plan.rank(0)
    assert rank is not None
    env, changed, _, _ = applied_environment(plan, rank, calling)
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "5000"
    assert "TORCH_FR_BUFFER_SIZE" in changed


@pytest.mark.parametrize(
    ("nccl", "text"),
    [
        ("2.13.4", "is 14 (0.067 s a try, about 0.47 s with 7 retries)"),
        ("2.14.3", "is 18 (1.1 s a try, about 7.5 s with 7 retries)"),
        ("2.22.3", "is 18 (1.1 s a try, about 7.5 s with 7 retries)"),
        ("2.23.4", "is 20 (4.3 s a try, about 30 s with 7 retries)"),
    ],
)
def test_ib_timeout_default_follows_the_jobs_nccl(dgx: Node, nccl: str, text: str) -> None:
    plan = plan_with(dgx, "2.9.0", nccl)
    [timeout] = [left for left in plan.left_unset if left.names == ("NCCL_IB_TIMEOUT",)]
    assert timeout.reason.startswith(
        f"the default of NCCL {nccl} (from nvidia-nccl-cu12 in {JOB_PYTHON}, its site-packages "
        f"read without starting it (a venv)) {text}"
    )


def test_ib_timeout_unknown_nccl_gives_every_default(dgx: Node) -> None:
    plan = plan_with(dgx, "2.9.0")
    [timeout] = [left for left in plan.left_unset if left.names == ("NCCL_IB_TIMEOUT",)]
    assert timeout.reason.startswith(
        "the job's NCCL is not known (no nvidia-nccl-cuXX in --python /opt/venv/bin/python, its "
        "site-packages read without starting it (a venv)): NCCL's default is 20 since 2.23 "
        "(4.3 s a try, about 30 s with 7 retries), 18 from 2.14 to 2.22"
    )


def _alloc(value: str) -> Setting:
    return Setting("PYTORCH_CUDA_ALLOC_CONF", value, CALLING_ENVIRONMENT)


def test_max_split_size_20_is_refused_before_torch_2_10() -> None:
    setting = _alloc("max_split_size_mb:20,expandable_segments:True")
    [old] = judge_alloc_setting(setting, torch_at("2.9.1"))
    assert old.status is Status.FAIL
    assert old.reason == (
        f"torch 2.9.1 (from {JOB_PYTHON}) will abort at the first CUDA allocation: "
        "max_split_size_mb:20 is too small for torch 2.9.1: before 2.10 it needs more than 20 "
        "(21 or more)"
    )
    assert judge_alloc_setting(setting, torch_at("2.10.0")) == []
    [unknown] = judge_alloc_setting(setting, torch_at(None))
    assert unknown.status is Status.WARN
    assert unknown.reason.startswith("max_split_size_mb:20: torch before 2.10 refuses it")
    assert judge_alloc_setting(_alloc("max_split_size_mb:21"), torch_at("2.8.0")) == []
    # Below the floor every torch refuses.
    [low] = judge_alloc_setting(_alloc("max_non_split_rounding_mb:19"), torch_at("2.12.0"))
    assert low.status is Status.FAIL and "at least 20" in low.reason


def test_tune_keeps_max_split_size_20_only_where_the_jobs_torch_takes_it() -> None:
    environ = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:20"}
    assert allocator(environ, torch_at("2.10.0"))[0].value == (
        "max_split_size_mb:20,expandable_segments:True"
    )
    [old] = allocator(environ, torch_at("2.9.0"))[:1]
    assert old.value == "expandable_segments:True" and not old.advisory
    assert (
        "torch 2.9.0 (from --python /opt/venv/bin/python) rejects the current value" in old.reason
    )
    # Unknown: raised to what every torch takes, and said.
    unknown = allocator(environ, torch_at(None))
    assert [r.value for r in unknown] == ["max_split_size_mb:21,expandable_segments:True"] * 2
    assert "21 works on every torch" in unknown[0].reason


def test_the_torch_alloc_check_judges_a_processs_setting_by_its_own_torch(tmp_path: Path) -> None:
    """A running job's PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:20 fails where its own
    mapped torch is 2.9, read from its maps on a replica built for it."""
    job = running_job(tmp_path, "2.9.1+cu128", {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:20"})
    check = load_checks()["torch_alloc"]
    [run] = run_checks([check], job.context({}))
    failing = [r for r in run.results if r.status is Status.FAIL]
    assert [r.summary for r in failing] == [
        "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:20: torch 2.9.1+cu128 (from pid 7001 "
        "(python3), torch's metadata beside its mapped /opt/venv/lib/python3.11/site-packages/"
        "torch/lib/libtorch_cuda.so) will abort at the first CUDA allocation: "
        "max_split_size_mb:20 is too small for torch 2.9.1: before 2.10 it needs more than 20 "
        "(21 or more) (found in pid 7001 (python3))"
    ]


def running_job(tmp_path: Path, torch: str, environ: dict[str, str]) -> Node:
    """The workstation replica with a training process on its GPU that maps pip's torch
    and NCCL from /opt/venv, and their metadata in the replica's root."""
    spec = nodes.workstation()
    site = "/opt/venv/lib/python3.11/site-packages"
    job = replace(
        nodes.training_process(7001, 0, environ),
        mapped=[
            "/usr/bin/python3.11",
            f"{site}/torch/lib/libtorch_cuda.so",
            f"{site}/nvidia/nccl/lib/libnccl.so.2",
        ],
    )
    files = {
        f"{site}/torch-{torch}.dist-info/METADATA": f"Name: torch\nVersion: {torch}\n",
        f"{site}/nvidia_nccl_cu12-2.21.5.dist-info/METADATA": (
            "Name: nvidia-nccl-cu12\nVersion: 2.21.5\n"
        ),
    }
    spec = replace(spec, processes=[*spec.processes, job], files={**spec.files, **files})
    return Node(build_node(spec, tmp_path / "node"))


def test_a_running_jobs_versions_reach_the_plan(tmp_path: Path) -> None:
    node = running_job(tmp_path, "2.8.0", {})
    plan = make_plan(node.context({}), TuneOptions())
    env = plan.environment(None)
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in env and "TORCH_FR_BUFFER_SIZE" not in env
    assert "PYTORCH_ALLOC_CONF" not in env
    assert plan.torch.describe().startswith("torch 2.8.0 (from pid 7001 (python3)")
    assert plan.nccl.describe() == (
        "NCCL 2.21.5 (from pid 7001 (python3), nvidia-nccl-cu12 beside its mapped "
        "/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2)"
    )
