"""The fleet-wide circuit breaker's arithmetic, the same for every way nodecheck takes a
node out of service (Slurm's drain: agent/slurm/breaker.py; the Kubernetes taint:
agent/kubernetes/reporter.py).

A fault in nodecheck, in a driver update, or in the data it reads can make every node
fail the same check at once; a wave of drains or taints then takes the cluster down,
which costs far more than a missed faulty node. So before a node leaves service the
nodes nodecheck took out within `[remediation] breaker_window` are counted; at the cap,
the smaller of `breaker_nodes` and `breaker_fraction` of the cluster's nodes (at least
one), the node stays in service and the finding is reported (the log line, a metric),
for a person to decide. This is NVIDIA NVSentinel's fault-quarantine circuit breaker (a
percentage of the nodes within a duration).
"""

from __future__ import annotations

import math
from pathlib import Path

from nodecheck.agent.config import RemediationSettings
from nodecheck.agent.state_files import load_state, save_state
from nodecheck.checks.record import record

# In the state folder: whether the last `slurm health-check` run's drain was withheld by
# the breaker, for the agent's nodecheck_remediation_withheld{integration="slurm"}
# (health-check is a process of its own; the agent serves the metrics).
SLURM_WITHHELD_FILE = "slurm_withheld.json"


@record
class BreakerReading:
    """What the breaker saw: nodes taken out by nodecheck within the window, of how many."""

    out_recently: int
    nodes: int
    cap: int

    @property
    def open(self) -> bool:
        return self.out_recently >= self.cap

    def says(self, window_s: float, what: str = "drained") -> str:
        return (
            f"{self.out_recently} of {self.nodes} nodes {what} by nodecheck in the last "
            f"{window_s:g} s, the cap {self.cap}"
        )


def breaker_reading(out_recently: int, nodes: int, policy: RemediationSettings) -> BreakerReading:
    share = max(1, math.floor(policy.breaker_fraction * nodes))
    return BreakerReading(out_recently, nodes, min(policy.breaker_nodes, share))


def note_withheld(path: Path, withheld: bool, why: str, now: float) -> None:
    """Say whether this node's removal from service is withheld now, and why (replaced
    atomically); OSError when it cannot be. Readable by all (0644): slurm health-check
    writes it as root, the agent that exports it runs as its own user (systemd's
    DynamicUser), and it holds nothing but the verdict and its reason."""
    document = {"withheld": withheld, "at": now, "why": why if withheld else ""}
    save_state(path, document, mode=0o644)


def read_withheld(path: Path) -> bool | None:
    """What the note says; None when there is none (the integration never ran here) or
    it cannot be read."""
    withheld = (load_state(path) or {}).get("withheld")
    return withheld if isinstance(withheld, bool) else None
