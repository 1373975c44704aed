"""The runner isolates checks: a crash, a hang or silence is an `error`, and the rest still run."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable

import pytest

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node import variables as variables_module
from nodecheck.checks.registry import Check
from nodecheck.checks.result import NODE, Result, Status
from nodecheck.checks.runner import one_cpu, run_checks
from tests.conftest import Node

RELEASE = threading.Event()


def healthy(ctx: CheckContext) -> Iterable[Result]:
    return [Result(Status.OK, NODE, f"{len(ctx.inventory.gpus)} GPUs")]


def crashes(ctx: CheckContext) -> Iterable[Result]:
    raise RuntimeError("sysfs went away")


def hangs(ctx: CheckContext) -> Iterable[Result]:
    RELEASE.wait(30)  # a read that never returns
    return [Result(Status.OK, NODE, "too late")]


def silent(ctx: CheckContext) -> Iterable[Result]:
    return []


def make(name: str, function: object, timeout_s: float = 5.0) -> Check:
    return Check(name, function, 60, timeout_s, name)  # type: ignore[arg-type]


def test_a_crash_a_hang_and_silence_do_not_stop_the_others(dgx: Node) -> None:
    checks = [
        make("crashes", crashes),
        make("hangs", hangs, timeout_s=0.3),
        make("silent", silent),
        make("healthy", healthy),
    ]
    started = time.monotonic()
    try:
        runs = {run.check.name: run for run in run_checks(checks, dgx.context())}
    finally:
        RELEASE.set()
    assert time.monotonic() - started < 5
    assert runs["healthy"].completed and runs["healthy"].results[0].summary == "8 GPUs"
    crashed = runs["crashes"]
    assert not crashed.completed and crashed.status is Status.ERROR
    assert "crashes" in crashed.results[0].summary
    assert "RuntimeError: sysfs went away" in crashed.results[0].summary
    hung = runs["hangs"]
    assert not hung.completed and hung.status is Status.ERROR
    assert "did not finish within 0.3 s" in hung.results[0].summary
    assert runs["silent"].status is Status.ERROR
    assert "returned no result" in runs["silent"].results[0].summary


def test_shared_reads_happen_once(dgx: Node) -> None:
    context = dgx.context()
    checks = [make(f"reader{i}", healthy) for i in range(6)]
    run_checks(checks, context)
    assert context.inventory is context.inventory


def test_a_hung_shared_read_holds_up_only_its_own_users(
    dgx: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check stuck in the variables read must not stop the inventory users."""
    released = threading.Event()

    def stuck_read(*args: object) -> object:
        released.wait(30)
        raise RuntimeError("released")

    monkeypatch.setattr(variables_module, "read_variables", stuck_read)

    def uses_variables(ctx: CheckContext) -> Iterable[Result]:
        return [Result(Status.OK, NODE, str(len(ctx.variables.settings)))]

    checks = [make("stuck", uses_variables, timeout_s=0.5), make("healthy", healthy)]
    try:
        runs = {run.check.name: run for run in run_checks(checks, dgx.context())}
    finally:
        released.set()
    assert runs["healthy"].completed and runs["healthy"].results[0].summary == "8 GPUs"
    assert runs["stuck"].status is Status.ERROR


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs to run on",
)
def test_one_cpu_holds_the_threads_started_in_it_and_restores_the_caller() -> None:
    before = os.sched_getaffinity(0)
    seen: list[set[int]] = []
    with one_cpu():
        inside = os.sched_getaffinity(0)
        thread = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        thread.start()
        thread.join()
    assert len(inside) == 1 and inside <= before
    assert seen == [inside]  # a thread started inside inherits the one CPU
    assert os.sched_getaffinity(0) == before
