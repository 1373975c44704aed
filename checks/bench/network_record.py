"""One node's record of a cross-node sweep: `<state dir>/network.json`, version 1.

Written by the node's lowest rank inside the benchmark's child (child/network.py), read
by the node's agent (checks/node/network_sweep.py, checks/host/network_sweep.py).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nodecheck.checks.node.fs import write_atomically

# The names and version its reader knows. The record a sweep replaces is kept beside it:
# the node's agent fails a node only when two sweeps in a row named it
# (checks/host/network_sweep.py).
from nodecheck.checks.node.network_sweep import PREVIOUS_RECORD_FILE, RECORD_FILE, RECORD_VERSION


def node_record(report: Mapping[str, Any], node: str, finished_at: float) -> dict[str, Any]:
    """One node's record (version 1): the run's figures, its pairs, its verdict."""
    verdict = next(v for v in report["verdicts"] if v["node"] == node)
    pairs = [
        {
            "peer": pair["second"] if pair["first"] == node else pair["first"],
            "round": pair["round"],
            "busbw_bytes_per_second": pair["busbw_bytes_per_second"],
            "slow": pair["slow"],
        }
        for pair in report["pairs"]
        if node in (pair["first"], pair["second"])
    ]
    return {
        "version": RECORD_VERSION,
        "node": node,
        "finished_at": finished_at,
        "backend": report["backend"],
        "payload_bytes": report["payload_bytes"],
        "nodes": len(report["nodes"]),
        "ranks": report["ranks"],
        "whole_job": report["whole_job"],
        "expected_bytes_per_second": report["expected_bytes_per_second"],
        "expected_source": report["expected_source"],
        "pairs": pairs,
        "verdict": {key: verdict[key] for key in ("status", "culprit", "peer", "confidence")}
        | {"message": verdict["message"]},
    }


def write_record(state_dir: Path, record_document: Mapping[str, Any]) -> Path:
    """`<state dir>/network.json`, replaced whole (checks/node/fs.write_atomically),
    readable by the agent, which runs as another user (systemd's DynamicUser)."""
    path = state_dir / RECORD_FILE
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, state_dir / PREVIOUS_RECORD_FILE)
    write_atomically(path, json.dumps(record_document, indent=1) + "\n", mode=0o644)
    return path
