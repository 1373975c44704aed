"""This node's last cross-node sweep: `<state dir>/network.json`, as `nodecheck bench network`
writes it after a run that measured (the lowest rank on each node writes its node's record,
atomically; a run that could not measure writes nothing, so the previous record ages).

The record, version 1 (bytes per second everywhere):

    {"version": 1, "node": "node-3", "finished_at": 1765000000.0,
     "backend": "gloo", "payload_bytes": 67108864, "nodes": 8, "ranks": 8,
     "whole_job": {"busbw_median": ..., "busbw_min": ..., "busbw_p10": ...,
                   "busbw_p90": ..., "cv": 0.05},
     "expected_bytes_per_second": 1.25e9 or null, "expected_source": "..." or null,
     "pairs": [{"peer": "node-4", "round": 1, "busbw_bytes_per_second": ..., "slow": false}],
     "verdict": {"status": "ok|warn|fail", "culprit": "none|node|link",
                 "peer": null or "node-4", "confidence": "high|low", "message": "..."}}

Reading only: whether the record is this node's, how old it is and what it means for the
node are the network_sweep check's (checks/host/network_sweep.py). Each way there is no
record is its own outcome, never an empty one: missing (no sweep has measured here),
unreadable (permission, not a regular file, larger than a record can be), damaged (not
JSON, a field missing or of the wrong kind, a figure no sweep gives), or written by a
newer nodecheck (a `version` above the one this reader knows). Fields this reader does not
know are ignored: a writer of the same version may add some.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from nodecheck.checks.node.codec import (
    FactsFormatError,
    RepeatedKeyObject,
    decode,
    parse_json,
)
from nodecheck.checks.node.fs import MISSING, ReadError, decode_text, read_bytes
from nodecheck.checks.record import record

RECORD_FILE = "network.json"
# The record a sweep replaced, kept beside it (checks/bench/network_record.py).
PREVIOUS_RECORD_FILE = "network.previous.json"
RECORD_VERSION = 1
# A record holds one node's figures and its pairs (a few per round, a few rounds): some
# kilobytes at a thousand nodes. Anything past this is no record.
RECORD_LIMIT = 1 << 20

Outcome = Literal["read", "missing", "unreadable", "damaged", "newer"]


def _negative_or_infinite(values: dict[str, float | None]) -> tuple[str, str] | None:
    for name, value in values.items():
        if value is not None and (value < 0 or not math.isfinite(value)):
            return name, f"{value} is no bandwidth (a sweep measures 0 or more)"
    return None


@record
class BusbwProfile:
    """The whole job's all_reduce bus bandwidth over its iterations, and their spread."""

    busbw_median: float
    busbw_min: float
    busbw_p10: float
    busbw_p90: float
    cv: float  # coefficient of variation of the per-iteration busbw

    def implausible(self) -> tuple[str, str] | None:
        problem = _negative_or_infinite(
            {
                "busbw_median": self.busbw_median,
                "busbw_min": self.busbw_min,
                "busbw_p10": self.busbw_p10,
                "busbw_p90": self.busbw_p90,
            }
        )
        if problem is not None:
            return problem
        if self.cv < 0:
            return "cv", f"{self.cv} is no coefficient of variation (0 or more)"
        if not self.busbw_min <= self.busbw_p10 <= self.busbw_median <= self.busbw_p90:
            return "busbw_p10", "min <= p10 <= median <= p90 does not hold"
        return None


@record
class SweepPair:
    """One pair this node measured with: the far end, the round, its busbw, and whether
    the sweep judged that pair slow."""

    peer: str
    round: int
    busbw_bytes_per_second: float
    slow: bool

    def implausible(self) -> tuple[str, str] | None:
        if self.round < 0:
            return "round", f"{self.round} is no round"
        if not self.peer:
            return "peer", "empty"
        return _negative_or_infinite({"busbw_bytes_per_second": self.busbw_bytes_per_second})


@record
class SweepVerdict:
    """What the sweep says of this node: slow or not, whether it or one of its links is to
    blame (the far end then in `peer`), how sure, and one line naming the figures."""

    status: Literal["ok", "warn", "fail"]
    culprit: Literal["none", "node", "link"]
    peer: str | None
    confidence: Literal["high", "low"]
    message: str

    def implausible(self) -> tuple[str, str] | None:
        if self.culprit == "link" and not self.peer:
            return "peer", "a slow link names its far end"
        if self.culprit != "link" and self.peer is not None:
            return "peer", f"only a link has a far end (culprit {self.culprit!r})"
        return None


@record
class NetworkSweep:
    """One node's record of the last sweep that measured (the fields of version 1)."""

    version: int
    node: str
    finished_at: float  # seconds since the epoch, the writing node's clock
    backend: str  # "nccl" or "gloo"
    payload_bytes: int  # the payload judged: the largest
    nodes: int
    ranks: int
    whole_job: BusbwProfile
    expected_bytes_per_second: float | None
    expected_source: str | None
    pairs: tuple[SweepPair, ...]
    verdict: SweepVerdict

    def implausible(self) -> tuple[str, str] | None:
        if not self.node:
            return "node", "empty"
        if self.finished_at <= 0:
            return "finished_at", f"{self.finished_at} is no time"
        if self.payload_bytes <= 0:
            return "payload_bytes", f"{self.payload_bytes} is no payload"
        if self.nodes < 1 or self.ranks < self.nodes:
            return "ranks", f"{self.ranks} ranks on {self.nodes} nodes"
        return _negative_or_infinite({"expected_bytes_per_second": self.expected_bytes_per_second})


@record
class NetworkSweepReading:
    """The record at `path`, or why there is none (`outcome` and `problem`)."""

    path: str
    outcome: Outcome
    sweep: NetworkSweep | None = None
    problem: str = ""
    version: int | None = None  # a newer record's version


# The fields of each level a version-1 record has; others are a same-version writer's
# additions, ignored.
_LEVELS: dict[str, tuple[str, ...]] = {
    "": tuple(NetworkSweep.__dataclass_fields__),
    "whole_job": tuple(BusbwProfile.__dataclass_fields__),
    "verdict": tuple(SweepVerdict.__dataclass_fields__),
    "pairs": tuple(SweepPair.__dataclass_fields__),
}


def _known(value: object, fields: tuple[str, ...]) -> object:
    if not isinstance(value, dict) or isinstance(value, RepeatedKeyObject):
        return value  # the decoder refuses it, saying why
    return {name: item for name, item in value.items() if name in fields}


def _known_fields(document: dict[str, Any]) -> dict[str, Any]:
    if isinstance(document, RepeatedKeyObject):
        return document
    known: dict[str, Any] = {name: item for name, item in document.items() if name in _LEVELS[""]}
    for level in ("whole_job", "verdict"):
        if level in known:
            known[level] = _known(known[level], _LEVELS[level])
    if isinstance(known.get("pairs"), list):
        known["pairs"] = [_known(pair, _LEVELS["pairs"]) for pair in known["pairs"]]
    return known


def parse_network_sweep(text: str, path: str) -> NetworkSweepReading:
    """The reading of a record's text (the read itself succeeded)."""

    def damaged(why: str) -> NetworkSweepReading:
        return NetworkSweepReading(path, "damaged", problem=f"{path}: {why}")

    try:
        document = parse_json(text)
    except (ValueError, RecursionError) as err:
        return damaged(f"not JSON ({err})")
    if not isinstance(document, dict):
        return damaged("not a JSON object")
    version = document.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        return damaged("no integer 'version'")
    if version > RECORD_VERSION:
        return NetworkSweepReading(
            path,
            "newer",
            problem=f"{path} is version {version}, written by a newer nodecheck; this one "
            f"reads version {RECORD_VERSION}",
            version=version,
        )
    if version != RECORD_VERSION:
        return damaged(f"version {version} is no version of this record")
    try:
        sweep = decode(NetworkSweep, _known_fields(document), "network.json")
    except FactsFormatError as err:
        return damaged(str(err).removeprefix("network.json."))
    return NetworkSweepReading(path, "read", sweep)


def read_network_sweep(path: Path) -> NetworkSweepReading:
    """The record at `path`, read bounded: a regular file of at most RECORD_LIMIT bytes."""
    try:
        data = read_bytes(path, RECORD_LIMIT)
        text = decode_text(path, data)
    except ReadError as err:
        if err.reason == MISSING:
            return NetworkSweepReading(str(path), "missing", problem=f"{path}: missing")
        return NetworkSweepReading(str(path), "unreadable", problem=str(err))
    return parse_network_sweep(text, str(path))
