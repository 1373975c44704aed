"""The fleet-wide circuit breaker of `slurm health-check`'s drains.

A fault in nodecheck, in a driver update, or in the data it reads can make every node
fail the same check at once; a wave of drains then takes the cluster down, which costs
far more than a missed faulty node. So before it drains a node that is in service,
health-check reads every node once (`scontrol show node`, bounded) and counts those that
carry nodecheck's reason set within `[remediation] breaker_window`; at the cap, the
smaller of `breaker_nodes` and `breaker_fraction` of the cluster's nodes (at least one),
the drain is withheld: the node stays in service, the finding is reported (exit 1 and
the log line, `breaker=open`), and a person decides. This is NVIDIA NVSentinel's fault
quarantine circuit breaker (a percentage of the nodes within a duration) in Slurm's
terms. A cluster whose nodes cannot be read withholds the drain too: the breaker cannot
tell whether it is open.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from nodecheck.agent.config import RemediationSettings
from nodecheck.checks.node.slurm_state import SlurmNodeState
from nodecheck.checks.record import record

# How scontrol prints a reason's time (slurmctld's local time): 2026-12-01T15:00:00.
REASON_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"


@record
class BreakerReading:
    """What the breaker saw: nodes drained by nodecheck within the window, of how many."""

    drained_recently: int
    nodes: int
    cap: int

    @property
    def open(self) -> bool:
        return self.drained_recently >= self.cap

    def says(self, window_s: float) -> str:
        return (
            f"{self.drained_recently} of {self.nodes} nodes drained by nodecheck in the last "
            f"{window_s:g} s, the cap {self.cap}"
        )


def reason_age_s(reason_time: str | None, now: float) -> float | None:
    """Seconds since a reason's time as scontrol prints it; None when it cannot be read."""
    if reason_time is None:
        return None
    try:
        return now - time.mktime(time.strptime(reason_time, REASON_TIME_FORMAT))
    except (ValueError, OverflowError):
        return None


def read_breaker(
    nodes: Sequence[SlurmNodeState], policy: RemediationSettings, prefix: str, now: float
) -> BreakerReading:
    """Count the nodes drained with a reason starting with `prefix` (nodecheck's) within
    the window; a reason whose time cannot be read counts (the safe side)."""
    recent = 0
    for node in nodes:
        if not (node.drained and node.reason and node.reason.startswith(prefix)):
            continue
        age = reason_age_s(node.reason_time, now)
        if age is None or age <= policy.breaker_window_s:
            recent += 1
    share = max(1, math.floor(policy.breaker_fraction * len(nodes)))
    return BreakerReading(recent, len(nodes), min(policy.breaker_nodes, share))
