"""Entry point of the benchmark child.

    python -m nodecheck.checks.bench.child '{"benchmark": "matmul", ...}'   (from nodecheck)
    torchrun --nproc_per_node=8 -m nodecheck.checks.bench.child allreduce  (by hand, any scale)

A failure inside the benchmark (a CUDA error, an out-of-memory) is reported
as {"error": ..., "cause": ...} with exit status 1; the parent turns a crash
without that line (a signal, the OOM killer) into an error of its own.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

from nodecheck.checks.bench.child.protocol import die_with_parent, emit


def _cause(err: BaseException) -> str:
    if type(err).__name__ == "NetworkBenchmarkError":  # said in one line already
        return "refused"
    text = f"{type(err).__name__}: {err}".lower()
    if "out of memory" in text or isinstance(err, MemoryError):
        return "out of memory"
    if "cuda" in text or "nccl" in text:
        return "cuda error"
    return "exception"


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    name = spec["benchmark"]
    if name == "matmul":
        from nodecheck.checks.bench.child import matmul

        return matmul.run(spec)
    if name == "allreduce":
        from nodecheck.checks.bench.child import allreduce

        return allreduce.launch(spec)
    if name == "network":
        from nodecheck.checks.bench.child import network

        return network.run(spec)
    if name == "h2d":
        from nodecheck.checks.bench.child import h2d

        return h2d.run(spec)
    raise ValueError(f"unknown benchmark {name!r}")


def main(argv: list[str]) -> int:
    if argv[:1] != ["allreduce"]:  # started by nodecheck (not by torchrun by hand)
        die_with_parent()
    if argv[:1] == ["allreduce-rank"]:
        from nodecheck.checks.bench.child import allreduce

        allreduce.rank_main()
        return 0
    if argv[:1] == ["allreduce"]:
        from nodecheck.checks.bench.child import allreduce

        allreduce.torchrun_main(argv[1:])
        return 0
    try:
        spec = json.loads(argv[0])
        emit(result=_run(spec))
        return 0
    except BaseException as err:
        emit(error=f"{type(err).__name__}: {err}", cause=_cause(err))
        traceback.print_exc()  # to stderr, which the parent keeps for --log-level debug
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
