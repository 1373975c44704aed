"""The circuit breaker of `slurm health-check`'s drains (agent/breaker.py): before it
drains a node that is in service, health-check reads every node once (`scontrol show
node`, bounded) and counts those that carry nodecheck's reason set within `[remediation]
breaker_window`; at the cap the drain is withheld: the node stays in service, the finding
is reported (exit 1, the log line's `breaker=open`, the agent's
nodecheck_remediation_withheld). A cluster whose nodes cannot be read withholds the drain
too: the breaker cannot tell whether it is open.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from nodecheck.agent.breaker import BreakerReading, breaker_reading
from nodecheck.agent.config import RemediationSettings
from nodecheck.checks.node.slurm_state import SlurmNodeState

# How scontrol prints a reason's time (slurmctld's local time): 2026-12-01T15:00:00.
REASON_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"


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
    return breaker_reading(recent, len(nodes), policy)
