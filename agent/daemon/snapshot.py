"""Privilege separation: what only root can read, handed to the unprivileged agent as facts.

`nodecheck snapshot` (root, from nodecheck-snapshot.timer, no network) captures the parts
of the node's facts that the checks registered with `root=True` need (their `needs`: ACS
in PCIe config space past 64 bytes, other users' process environments, the kernel log's
SXids) and writes them as a nodecheck.facts/v1 document (docs/facts.md) to
/run/nodecheck/snapshot.json, atomically. It judges nothing.

The agent, which serves the network as a transient unprivileged user, runs each root
check itself over the snapshot's facts (laid over its own), with its own configuration,
so its expected_gpus, thresholds and options apply as they do to every other check. A
snapshot that is missing, unreadable, no regular file, damaged, stale or dated in the
future is an `error` result saying so, never a pass; a stale or future one's facts are
not judged at all (what they show may be long gone, or cannot be dated).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import (
    PARTS,
    FactsError,
    FactsSource,
    LiveFacts,
    NodeFacts,
    NodeSources,
    PartUnavailableError,
    dumps,
    loads,
)
from nodecheck.checks.node.fs import NotRegularFileError, read_regular_file
from nodecheck.checks.node.output import Written, write_output
from nodecheck.checks.registry import Check
from nodecheck.checks.result import NODE, Result, Status
from nodecheck.checks.runner import unjudged

DEFAULT_SNAPSHOT_PATH = Path("/run/nodecheck/snapshot.json")
STALE_AFTER_S = 900.0  # three missed runs of the 5-minute timer
SNAPSHOT_LIMIT = 16 << 20  # bytes; a real snapshot is a few hundred kB
FUTURE_SLACK_S = 300.0  # one clock, but NTP may step it back after the snapshot
TIMER_REMEDY = "systemctl enable --now nodecheck-snapshot.timer"
STATUS_REMEDY = "systemctl status nodecheck-snapshot.timer nodecheck-snapshot.service"


def root_checks(checks: Mapping[str, Check]) -> list[Check]:
    """The checks whose facts are complete only as root (declared beside each check)."""
    return [check for check in checks.values() if check.root]


def snapshot_parts(checks: Iterable[Check]) -> list[str]:
    """The parts those checks need, in the facts' own order."""
    needed = {name for check in checks for name in check.needs}
    return [name for name in PARTS if name in needed]


def take_snapshot(sources: NodeSources, checks: Iterable[Check]) -> NodeFacts:
    """The root checks' parts of this node, each read under capture's deadline: a part
    that cannot be read is recorded as Unread, and the agent's check says why."""
    return LiveFacts(sources).capture(snapshot_parts(checks))


def write_snapshot(path: Path, facts: NodeFacts) -> Written:
    """The snapshot at `path`, by the rule of every output path (checks/node/output.py);
    where it went. Only the default's folder, /run/nodecheck, is created when missing
    (nodecheck-snapshot.service's RuntimeDirectory= makes it under the timer)."""
    if path == DEFAULT_SNAPSHOT_PATH:
        path.parent.mkdir(mode=0o755, exist_ok=True)
    # World-readable: the agent reading it runs as another (transient) user. It holds no
    # secret: variables are filtered to the audited names as they are read.
    return write_output(path, dumps(facts), mode=0o644)


class SnapshotError(ValueError):
    """The snapshot cannot be used; the message says where in it and why."""


def _read_text(path: Path) -> str:
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


def read_snapshot(path: Path) -> NodeFacts:
    """The snapshot's facts; SnapshotError saying what is wrong and where, OSError
    (FileNotFoundError, PermissionError, ...) from reading it."""
    text = _read_text(path)
    try:
        # taken_at is a finite time past the epoch, or the document is refused.
        return loads(text, "the document")
    except FactsError as err:
        raise SnapshotError(str(err)) from None


class SnapshotOverAgentFacts(FactsSource):
    """The snapshot's parts first, then the agent's own (read as the agent reads them).
    The rules' "now" is the snapshot's: its facts are as old as it is."""

    def __init__(self, snapshot: NodeFacts, agent: FactsSource) -> None:
        self.snapshot = snapshot
        self.agent = agent
        self.taken_at = snapshot.taken_at

    def in_snapshot(self, name: str) -> bool:
        """Whether the snapshot holds `name` (read, or recorded as Unread)."""
        try:
            self.snapshot.get(name)
        except PartUnavailableError as err:
            return err.unread.cause != "not captured"
        return True

    def has(self, name: str) -> bool:
        return self.in_snapshot(name) or self.agent.has(name)

    def get(self, name: str) -> Any:
        return (self.snapshot if self.in_snapshot(name) else self.agent).get(name)


def _error(summary: str, remedy: str = "") -> list[Result]:
    return [Result(Status.ERROR, NODE, summary, remedy)]


def results_from_snapshot(
    check: Check, path: Path, ctx: CheckContext, now: float | None = None
) -> list[Result]:
    """`check` judged over the snapshot's facts with the agent's configuration (ctx.config)
    and histories; one `error` result instead when the snapshot cannot serve it (missing,
    unreadable, not a file, too big, not UTF-8, not a nodecheck.facts/v1 capture, damaged,
    without a part the check needs), or when it is stale or dated in the future: its
    facts are then not judged at all, so no finding of another time (a job's
    NCCL_P2P_DISABLE=1 long gone) is served, or exported, as the node's now."""
    try:
        snapshot = read_snapshot(path)
    except FileNotFoundError:
        return _error(
            f"no snapshot at {path}: {check.name} needs root and comes from it", TIMER_REMEDY
        )
    except OSError as err:
        return _error(f"cannot read the snapshot {path}: {err.strerror or err}")
    except SnapshotError as err:
        return _error(f"cannot read the snapshot {path}: {err}")
    dated = _dating_problem(check, path, snapshot.taken_at, time.time() if now is None else now)
    if dated:
        return dated
    facts = SnapshotOverAgentFacts(snapshot, ctx.facts)
    missing = [name for name in check.needs if not facts.in_snapshot(name)]
    if missing:
        return _error(
            f"the snapshot {path} has no {', '.join(missing)}, which {check.name} needs "
            "(written by another nodecheck version?)",
            STATUS_REMEDY,
        )
    # The agent's context (its configuration, histories, XID log) over these facts.
    try:
        return list(check.run(replace(ctx, facts=facts)))
    except PartUnavailableError as err:
        return [unjudged(check, err)]


def _dating_problem(check: Check, path: Path, taken_at: float, now: float) -> list[Result]:
    """The `error` standing for `check` when the snapshot taken at `taken_at` is stale or
    dated in the future (its age cannot be told); [] when it is fresh."""
    age = now - taken_at
    taken = _when(taken_at)
    if age > STALE_AFTER_S:
        return _error(
            f"the snapshot {path} was taken {_duration(age)} ago ({taken}): {check.name} is "
            "not judged from facts that may no longer hold",
            STATUS_REMEDY,
        )
    if age < -FUTURE_SLACK_S:
        return _error(
            f"the snapshot {path} is dated {_duration(-age)} in the future ({taken}): its "
            f"age, and so whether its facts still hold, cannot be told; {check.name} is not "
            "judged from it",
            f"{STATUS_REMEDY}; timedatectl",
        )
    return []


def _when(taken_at: float) -> str:
    """The snapshot's time as people read it, "2025-12-01 10:00:00 UTC"; its number where
    no calendar date is that far (year 10000 and beyond)."""
    try:
        return datetime.fromtimestamp(taken_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):
        return f"taken_at {taken_at:g}"


def _duration(seconds: float) -> str:
    """ "20 min", "2 h", "3652 days": how far a snapshot's time is from now."""
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def from_snapshot(check: Check, path: Path) -> Check:
    """`check`, judged over the snapshot file's facts instead of what the agent reads."""

    def run(ctx: CheckContext) -> list[Result]:
        return results_from_snapshot(check, path, ctx)

    return replace(check, run=run)
