"""A check that judges one subject several ways (cpu: governors and SMT; torch_alloc: the
calling environment and a job's) must still give a report one row per check and subject:
`nodecheck check` (table and JSON) and the agent's /results, on the faulty replica."""

from __future__ import annotations

import json
import re
from collections import Counter

import click

from nodecheck.agent.daemon.results_file import served_document
from nodecheck.agent.daemon.scheduler import ResultStore
from nodecheck.agent.findings import fold
from nodecheck.checks.result import (
    NODE,
    Action,
    FaultClass,
    MetricSpec,
    Origin,
    Result,
    Sample,
    Status,
)
from tests.agent.test_cli import run
from tests.conftest import Node

HEADER = re.compile(r"^nodecheck \S+: (\w+) \((.*)\)$")
# "  torch_alloc  node  SUMMARY" or "  pcie_acs  bridge 0000:39:00.0  SUMMARY" (a remedy's
# line starts further right).
ROW = re.compile(r"^  (\S+) +(\S+(?: \S+)?)  ")
# The faulty replica's findings that share a subject with another of the same check.
TORCH_ALLOC_FAIL = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true,max_split_size_mb:16"
TORCH_ALLOC_OK = "no allocator configuration in the calling environment"


def duplicated(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [pair for pair, count in Counter(pairs).items() if count > 1]


def test_check_json_has_one_row_per_check_and_subject(dgx_faulty: Node) -> None:
    """One result per (check, subject), the worst status, the non-ok finding first with the
    others after it, the remedy of the failing one; exit status 1 (something failed)."""
    done = run(*dgx_faulty.cli_args, "check", "--json", env=dgx_faulty.env)
    assert done.returncode == 1, done.stderr
    results = json.loads(done.stdout)["results"]
    assert duplicated([(r["check"], r["subject"]) for r in results]) == []
    [torch_alloc] = [r for r in results if (r["check"], r["subject"]) == ("torch_alloc", "node")]
    assert torch_alloc["status"] == "fail"
    assert torch_alloc["summary"].startswith(TORCH_ALLOC_FAIL), torch_alloc["summary"]
    assert f"; {TORCH_ALLOC_OK}" in torch_alloc["summary"], torch_alloc["summary"]
    assert "pid 4242 (python3)" in torch_alloc["remedy"]
    assert torch_alloc["details"]["variable"] == "PYTORCH_CUDA_ALLOC_CONF"  # details kept
    # The row's meaning is the failing finding's: a job's setting, fixed in the job.
    assert (torch_alloc["action"], torch_alloc["class"], torch_alloc["origin"]) == (
        "fix-job-environment",
        "node-config",
        "job",
    )
    [cpu] = [r for r in results if (r["check"], r["subject"]) == ("cpu", "node")]
    assert "governor" in cpu["summary"] and "SMT" in cpu["summary"]


def test_check_table_has_one_row_per_check_and_subject(dgx_faulty: Node) -> None:
    """The table: every (check, subject) once, and the header's counts add up to its rows."""
    done = run(*dgx_faulty.cli_args, "check", env=dgx_faulty.env)
    assert done.returncode == 1, done.stderr
    lines = click.unstyle(done.stdout).splitlines()
    header = HEADER.match(lines[0])
    assert header is not None, lines[0]
    rows = [(match[1], match[2]) for line in lines[1:] if (match := ROW.match(line))]
    assert duplicated(rows) == []
    assert ("torch_alloc", "node") in rows and ("cpu", "node") in rows
    assert sum(int(part.split()[0]) for part in header.group(2).split(", ")) == len(rows)


def test_agent_results_have_one_row_per_check_and_subject(dgx_faulty: Node) -> None:
    """/results, from the agent's store of the checks' runs: one row per check and subject,
    each with its age."""
    store = ResultStore()
    for check_run in dgx_faulty.run("cpu", "numa", "torch_alloc", "nccl_env"):
        store.put(check_run, 300)
    document = served_document(store, "dgx-h100-07")
    results = document["results"]
    assert isinstance(results, list)
    assert duplicated([(r["check"], r["subject"]) for r in results]) == []
    assert {(r["check"], r["subject"]) for r in results} >= {
        ("cpu", "node"),
        ("numa", "node"),
        ("torch_alloc", "node"),
    }
    assert all(isinstance(r["age_seconds"], float) for r in results)


def test_a_folded_row_keeps_every_finding() -> None:
    """Four findings about one subject become one row: the worst status, summaries worst
    first, the remedies of what is not ok, every detail (a key given twice takes the worst
    finding's value; each finding's own are under "findings"), every metric sample and
    the worst finding's meaning (action, class); another subject stays its own row, and
    so does a job's finding about the same subject."""
    spec = MetricSpec("nodecheck_test_value", "gauge", "a test series", ("n",))
    meaning = (Action.REBOOT, FaultClass.GPU_PERFORMANCE, Origin.NODE)
    findings = [
        Result(
            Status.OK,
            NODE,
            "fine",
            "",
            {"shared": 1},
            (Sample(spec, 1, {"n": "1"}),),
            Action.NONE,
            FaultClass.NODE_CONFIG,
            Origin.NODE,
        ),  # listed first, not the worst: not the row's meaning
        Result(Status.FAIL, NODE, "broken", "fix it", {"shared": 2, "only": "here"}, (), *meaning),
        Result(
            Status.WARN,
            NODE,
            "odd",
            "look at it",
            {},
            (Sample(spec, 3, {"n": "3"}),),
            origin=Origin.NODE,
        ),
        Result(Status.SKIP, NODE, "not here", origin=Origin.NODE),
        Result(Status.OK, "gpu 0000:18:00.0", "fine too"),
        Result(
            Status.FAIL,
            NODE,
            "a job's variable",
            "unset it",
            action=Action.FIX_JOB_ENVIRONMENT,
            origin=Origin.JOB,
        ),
    ]
    node, gpu, job = fold(findings)
    assert (node.status, node.subject) == (Status.FAIL, NODE)
    assert node.summary == "broken; odd; fine; not here"
    assert node.remedy == "fix it; look at it"
    details = dict(node.details)
    assert details.pop("findings") == [
        {"status": "fail", "summary": "broken", "details": {"shared": 2, "only": "here"}},
        {"status": "warn", "summary": "odd", "details": {}},
        {"status": "ok", "summary": "fine", "details": {"shared": 1}},
        {"status": "skip", "summary": "not here", "details": {}},
    ]
    assert details == {"shared": 2, "only": "here"}  # the worst finding's value, one type
    assert [sample.value for sample in node.samples] == [1, 3]
    assert (node.action, node.fault_class, node.origin) == meaning
    assert gpu == findings[-2]
    assert job == findings[-1]  # a job's failure neither hides the node's nor joins it
