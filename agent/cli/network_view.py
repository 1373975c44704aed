"""`nodecheck bench network`'s report on rank 0: a table, or the JSON document.

The document is shaped like `check --json`'s (a schema, the host, an overall status, a
time, then one row per node: its status, what is to blame, the message), with the run's
figures beside it: bytes per second everywhere.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from nodecheck.checks.bench.network import whole_job_verdict

SCHEMA = "nodecheck.bench_network/v1"
SEVERITY = {"ok": 0, "warn": 1, "fail": 2}


def overall_status(report: Mapping[str, Any]) -> str:
    statuses: list[str] = [v["status"] for v in report["verdicts"]]
    return max([*statuses, whole_job_verdict(report)], key=SEVERITY.__getitem__)


def render_json(report: Mapping[str, Any]) -> str:
    document = {
        "schema": SCHEMA,
        "hostname": report["nodes"][0],
        "status": overall_status(report),
        "written_at": time.time(),
        "whole_job_status": whole_job_verdict(report),
        **{key: value for key, value in report.items() if key != "verdicts"},
        "results": report["verdicts"],
    }
    return json.dumps(document, indent=2) + "\n"


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.3f}"


def render_table(report: Mapping[str, Any]) -> str:
    whole = report["whole_job"]
    lines = [
        f"nodecheck bench network: {overall_status(report).upper()} "
        f"({len(report['nodes'])} nodes, {report['ranks']} ranks, {report['backend']})",
        "",
        "all_reduce over the whole job, busbw GB/s per iteration:",
        f"  {'payload':>12} {'iters':>6} {'min':>9} {'p10':>9} {'median':>9} {'p90':>9} {'cv':>6}",
    ]
    for row in report["payloads"]:
        lines.append(
            f"  {row['bytes'] / (1 << 20):>8.0f} MiB {row['iterations']:>6} "
            f"{_gbps(row['busbw_min']):>9} {_gbps(row['busbw_p10']):>9} "
            f"{_gbps(row['busbw_median']):>9} {_gbps(row['busbw_p90']):>9} {row['cv']:>6.1%}"
        )
    expected = report["expected_bytes_per_second"]
    if report["expected_from_nics"]:
        lines.append(
            f"expected: {_gbps(expected)} GB/s ({report['expected_source']}); the whole "
            f"job's median is {whole['busbw_median'] / expected:.2f}x that: "
            f"{whole_job_verdict(report)}"
        )
    else:
        lines.append(f"note: {report['expected_note']}")
        if expected is not None:
            lines.append(
                f"reference: {_gbps(expected)} GB/s ({report['expected_source']}: the "
                "median of every pair measured)"
            )
    sweep = report["sweep"]
    if not sweep["ran"]:
        lines.append(f"sweep: not run ({sweep['why']})")
    else:
        lines += [
            f"sweep: {sweep['rounds_run']} of {sweep['rounds_planned']} planned round(s) "
            f"({sweep['why']}); confidence "
            f"{'high' if sweep['confident'] else 'low'}",
            f"  {'round':>5}  {'pair':<40} {'busbw GB/s':>10}",
        ]
        for pair in report["pairs"]:
            shown = f"{pair['first']} <-> {pair['second']}"
            mark = "  slow" if pair["slow"] else ""
            lines.append(
                f"  {pair['round']:>5}  {shown:<40} "
                f"{_gbps(pair['busbw_bytes_per_second']):>10}{mark}"
            )
    lines += ["", f"  {'NODE':<20} {'STATUS':<6} {'CULPRIT':<7} MESSAGE"]
    for verdict in report["verdicts"]:
        lines.append(
            f"  {verdict['node']:<20} {verdict['status']:<6} {verdict['culprit']:<7} "
            f"{verdict['message']} ({verdict['confidence']} confidence)"
        )
    return "\n".join(lines) + "\n"
