"""Privilege separation: what only root can read, handed to the unprivileged agent as a file.

`nodecheck snapshot` (root, from nodecheck-snapshot.timer, no network) runs the
checks that need root (ACS in PCIe config space past 64 bytes; other users'
process environments) and writes their results, metric samples included, to
/run/nodecheck/snapshot.json atomically. The agent, which serves the network as
a transient unprivileged user, serves those results from the file instead of
running the checks, and says so when the file is missing or stale.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.fs import write_atomically
from nodecheck.checks.registry import Check
from nodecheck.checks.result import NODE, MetricSpec, Result, Sample, Status
from nodecheck.checks.runner import CheckRun

SCHEMA = "nodecheck.snapshot/v1"
SNAPSHOT_CHECKS = ("pcie_acs", "nccl_env", "torch_alloc")
STALE_AFTER_S = 900.0  # three missed runs of the 5-minute timer


def _sample(sample: Sample) -> dict[str, Any]:
    spec = sample.metric
    return {
        "name": spec.name,
        "kind": spec.kind,
        "help": spec.help,
        "label_names": list(spec.labels),
        "labels": dict(sample.labels),
        "value": sample.value,
    }


def snapshot_document(hostname: str, runs: Sequence[CheckRun]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "hostname": hostname,
        "taken_at": time.time(),
        "runs": {
            run.check.name: [
                {
                    "status": result.status.value,
                    "subject": result.subject,
                    "summary": result.summary,
                    "remedy": result.remedy,
                    "details": result.details,
                    "samples": [_sample(sample) for sample in result.samples],
                }
                for result in run.results
            ]
            for run in runs
        },
    }


def write_snapshot(path: Path, hostname: str, runs: Sequence[CheckRun]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(snapshot_document(hostname, runs), indent=1, default=str)
    # World-readable: the agent reading it runs as another (transient) user.
    write_atomically(path, text + "\n", mode=0o644)


def _result(entry: dict[str, Any]) -> Result:
    samples = tuple(
        Sample(
            MetricSpec(s["name"], s["kind"], s["help"], tuple(s["label_names"])),
            float(s["value"]),
            dict(s["labels"]),
        )
        for s in entry["samples"]
    )
    return Result(
        Status(entry["status"]),
        entry["subject"],
        entry["summary"],
        entry["remedy"],
        entry["details"],
        samples,
    )


def results_from_snapshot(path: Path, name: str, now: float | None = None) -> list[Result]:
    """The snapshot's results for check `name`; an `error` result when it cannot serve them."""
    try:
        document = json.loads(path.read_text())
        if document.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document")
        entries = document["runs"].get(name)
        taken_at = float(document["taken_at"])
        results = [_result(entry) for entry in entries] if entries is not None else None
    except FileNotFoundError:
        return [
            Result(
                Status.ERROR,
                NODE,
                f"no snapshot at {path}: {name} needs root and comes from it",
                "systemctl enable --now nodecheck-snapshot.timer",
            )
        ]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [Result(Status.ERROR, NODE, f"cannot read the snapshot {path}: {err}")]
    if results is None:
        return [Result(Status.ERROR, NODE, f"the snapshot {path} has no {name} results")]
    age = (time.time() if now is None else now) - taken_at
    if age > STALE_AFTER_S:
        results.append(
            Result(
                Status.ERROR,
                NODE,
                f"the snapshot is {age / 60:.0f} min old: these results may no longer hold",
                "systemctl status nodecheck-snapshot.timer nodecheck-snapshot.service",
            )
        )
    return results


def from_snapshot(check: Check, path: Path) -> Check:
    """`check`, served from the snapshot file instead of run here."""

    def run(ctx: CheckContext) -> list[Result]:
        return results_from_snapshot(path, check.name)

    return Check(check.name, run, check.interval_s, check.timeout_s, check.description)
