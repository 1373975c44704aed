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
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.fs import NotRegularFileError, read_regular_file, write_atomically
from nodecheck.checks.registry import Check
from nodecheck.checks.result import NODE, MetricSpec, Result, Sample, Status
from nodecheck.checks.runner import CheckRun

SCHEMA = "nodecheck.snapshot/v1"
# nvswitch_sxid: the agent may not read the kernel log (ProtectKernelLogs=), and unlike
# XIDs, SXids have no NVML event to fall back on.
SNAPSHOT_CHECKS = ("pcie_acs", "nccl_env", "torch_alloc", "nvswitch_sxid")
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


SNAPSHOT_LIMIT = 16 << 20  # bytes; a real snapshot is tens of kB
FUTURE_SLACK_S = 300.0  # one clock, but NTP may step it back after the snapshot
DETAILS_DEPTH = 16  # /results renders details with json's recursive encoder


class SnapshotError(ValueError):
    """The snapshot cannot be used; the message says where in it and why."""


def _read_snapshot(path: Path) -> str:
    """The file's text: a regular file, at most SNAPSHOT_LIMIT bytes, UTF-8. Opened only
    once stat says it is a regular file (never a device or a FIFO: opening one has side
    effects), non-blocking."""
    try:
        data = read_regular_file(path, SNAPSHOT_LIMIT)
    except NotRegularFileError as err:
        raise SnapshotError(f"it is {err.kind}") from None
    if len(data) > SNAPSHOT_LIMIT:
        raise SnapshotError(f"over {SNAPSHOT_LIMIT} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SnapshotError(f"not UTF-8 (byte {err.start})") from None


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise SnapshotError(f"{where}: expected a string, found {_kind(value)}")
    try:
        value.encode("utf-8")  # JSON's \ud800 escapes make strings no UTF-8 can carry
    except UnicodeEncodeError:
        raise SnapshotError(f"{where}: not valid Unicode (a lone surrogate)") from None
    return value


def _field(entry: dict[str, Any], key: str, where: str) -> Any:
    if key not in entry:
        raise SnapshotError(f"{where}: no {key!r}")
    return entry[key]


def _mapping(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SnapshotError(f"{where}: expected an object, found {_kind(value)}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise SnapshotError(f"{where}: expected a list, found {_kind(value)}")
    return value


def _check_details(value: object, where: str, depth: int = 0) -> None:
    if depth > DETAILS_DEPTH:
        raise SnapshotError(f"{where}: nested deeper than {DETAILS_DEPTH}")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_details(item, f"{where}.{_text(key, where)}", depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_details(item, f"{where}[{index}]", depth + 1)
    elif isinstance(value, str):
        _text(value, where)


def _sample_from(raw: object, where: str) -> Sample:
    """The sample as the snapshot has it. Its shape is checked here; whether Prometheus
    can take it (a number, the naming rules, a family name nobody else uses) is the
    exporter's to judge, which leaves out and counts that one sample."""
    entry = _mapping(raw, where)
    name = _text(_field(entry, "name", where), f"{where}.name")
    kind = _text(_field(entry, "kind", where), f"{where}.kind")
    help_text = _text(_field(entry, "help", where), f"{where}.help")
    label_names = _list(_field(entry, "label_names", where), f"{where}.label_names")
    labels = _mapping(_field(entry, "labels", where), f"{where}.labels")
    spec = MetricSpec(
        name, kind, help_text, tuple(_text(label, f"{where}.label_names") for label in label_names)
    )
    for label, value in labels.items():
        _text(value, f"{where}.labels.{_text(label, f'{where}.labels')}")
    return Sample(spec, _field(entry, "value", where), labels)


def _result(raw: object, where: str) -> Result:
    entry = _mapping(raw, where)
    status = _text(_field(entry, "status", where), f"{where}.status")
    if status not in {s.value for s in Status}:
        raise SnapshotError(f"{where}.status: {status!r} is not a status")
    details = _mapping(_field(entry, "details", where), f"{where}.details")
    _check_details(details, f"{where}.details")
    samples = _list(_field(entry, "samples", where), f"{where}.samples")
    return Result(
        Status(status),
        _text(_field(entry, "subject", where), f"{where}.subject"),
        _text(_field(entry, "summary", where), f"{where}.summary"),
        _text(_field(entry, "remedy", where), f"{where}.remedy"),
        details,
        tuple(_sample_from(s, f"{where}.samples[{i}]") for i, s in enumerate(samples)),
    )


def parse_snapshot(text: str, name: str) -> tuple[float, list[Result] | None]:
    """(taken_at, the results of check `name` or None); SnapshotError saying where."""
    try:
        document = _mapping(json.loads(text), "the document")
    except json.JSONDecodeError as err:
        raise SnapshotError(f"not JSON: {err}") from None
    except RecursionError:
        raise SnapshotError("not JSON this agent reads: nested too deeply") from None
    if document.get("schema") != SCHEMA:
        raise SnapshotError(f"not a {SCHEMA} document")
    taken_at = _field(document, "taken_at", "the document")
    # bool is an int to Python; NaN and the infinities are floats but no time
    if isinstance(taken_at, bool) or not isinstance(taken_at, (int, float)):
        raise SnapshotError(f"taken_at: expected a time in seconds, found {_kind(taken_at)}")
    if not math.isfinite(taken_at) or taken_at < 0:
        raise SnapshotError(f"taken_at: {taken_at!r} is no time")
    runs = _mapping(_field(document, "runs", "the document"), "runs")
    entries = runs.get(name)
    if entries is None:
        return float(taken_at), None
    where = f"runs.{name}"
    listed = _list(entries, where)
    return float(taken_at), [_result(entry, f"{where}[{i}]") for i, entry in enumerate(listed)]


def results_from_snapshot(path: Path, name: str, now: float | None = None) -> list[Result]:
    """The snapshot's results for check `name`; an `error` result when it cannot serve them
    (missing, unreadable, not a file, too big, not UTF-8 or JSON, not the schema), and
    one more when it is stale or dated in the future (its age cannot be told)."""
    try:
        taken_at, results = parse_snapshot(_read_snapshot(path), name)
    except FileNotFoundError:
        return [
            Result(
                Status.ERROR,
                NODE,
                f"no snapshot at {path}: {name} needs root and comes from it",
                "systemctl enable --now nodecheck-snapshot.timer",
            )
        ]
    except OSError as err:
        return [Result(Status.ERROR, NODE, f"cannot read the snapshot {path}: {err.strerror}")]
    except SnapshotError as err:
        return [Result(Status.ERROR, NODE, f"cannot read the snapshot {path}: {err}")]
    if results is None:
        return [Result(Status.ERROR, NODE, f"the snapshot {path} has no {name} results")]
    age = (time.time() if now is None else now) - taken_at
    remedy = "systemctl status nodecheck-snapshot.timer nodecheck-snapshot.service"
    if age > STALE_AFTER_S:
        summary = f"the snapshot is {age / 60:.0f} min old: these results may no longer hold"
        results.append(Result(Status.ERROR, NODE, summary, remedy))
    elif age < -FUTURE_SLACK_S:
        summary = (
            f"the snapshot {path} is dated {-age / 60:.0f} min in the future: its age, "
            "and so whether these results still hold, cannot be told"
        )
        results.append(Result(Status.ERROR, NODE, summary, f"{remedy}; timedatectl"))
    return results


def from_snapshot(check: Check, path: Path) -> Check:
    """`check`, served from the snapshot file instead of run here."""

    def run(ctx: CheckContext) -> list[Result]:
        return results_from_snapshot(path, check.name)

    return Check(check.name, run, check.interval_s, check.timeout_s, check.description)
