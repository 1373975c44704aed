"""Which drain is nodecheck's: the record of the exact reason it set, not who set it.

On a cluster every admin is root, and so is nodecheck: a reason's setter says nothing
(an admin who appends "-- RMA 4711, keep drained" to nodecheck's reason, as root, must
keep the node). So `slurm health-check` keeps, in its state folder, the reason it set
and, from the first read after its drain, the time slurmctld stamped on it (scontrol
prints both: `Reason=<text> [<user>@<time>]`). A drained node is nodecheck's while its
reason is that text with that time; any change, an edit, the same text set again by
someone else, another drain, hands the node to whoever made it, for good: the record
is dropped and health-check never touches that drain again.

A drain nodecheck set before asking for a reboot (agent/slurm/actions.py) stays
nodecheck's through it: slurmctld stamps a new time on the reason when it takes the
request, and appends REBOOT_ISSUED_SUFFIX with another when it issues the reboot
(SchedMD/slurm src/slurmctld/node_mgr.c, set_node_reboot_reason; the reason is kept
when the node registers again). The record follows both, once each, and holds the new
text and time from then on: an edit after that is an admin's as before.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from nodecheck.agent.state_files import forget_state, load_state, save_state
from nodecheck.checks.node.slurm_state import SlurmNodeState
from nodecheck.checks.record import record

DRAIN_RECORD_FILE = "slurm_drain.json"
# What slurmctld appends to a node's reason when it issues a reboot (node_mgr.c:
# set_node_reboot_reason(node_ptr, "reboot issued") formats " : %s").
REBOOT_ISSUED_SUFFIX = " : reboot issued"


@record
class DrainRecord:
    """The drain nodecheck set: its exact reason, and slurmctld's time for it once read;
    `rebooting`: nodecheck requested a reboot with it, not yet issued by slurmctld."""

    reason: str
    reason_time: str | None = None
    rebooting: bool = False

    @property
    def reason_once_issued(self) -> str:
        return self.reason + REBOOT_ISSUED_SUFFIX


def owns(state: SlurmNodeState, drained: DrainRecord | None) -> bool:
    """Whether the node's drain is the one nodecheck recorded: the same reason text and,
    once learned, the same time; or, a reboot asked for, the reason as slurmctld issues
    it (its time is slurmctld's then)."""
    if drained is None:
        return False
    if drained.rebooting and state.reason == drained.reason_once_issued:
        return True
    if state.reason != drained.reason:
        return False
    return drained.reason_time is None or state.reason_time == drained.reason_time


def with_time_learned(state: SlurmNodeState, drained: DrainRecord | None) -> DrainRecord | None:
    """The record with slurmctld's time for its reason, the first time the node is read
    with that reason after the drain (a reboot asked for in the same run has stamped it
    already), and the issued reboot's reason and time the first time they show; None
    when there is nothing to learn."""
    if drained is None or state.reason_time is None:
        return None
    if drained.rebooting and state.reason == drained.reason_once_issued:
        return DrainRecord(state.reason, state.reason_time)
    if drained.reason_time is not None or state.reason != drained.reason:
        return None
    return replace(drained, reason_time=state.reason_time)


def load_drain_record(path: Path) -> DrainRecord | None:
    """The saved record; None when there is none or it is damaged (then no drain is
    nodecheck's: the safe side, it never undrains what it cannot prove it set)."""
    document = load_state(path) or {}
    reason, reason_time = document.get("reason"), document.get("reason_time")
    rebooting = document.get("rebooting", False)
    if (
        not isinstance(reason, str)
        or not (reason_time is None or isinstance(reason_time, str))
        or not isinstance(rebooting, bool)
    ):
        return None
    return DrainRecord(reason, reason_time, rebooting)


def save_drain_record(path: Path, drained: DrainRecord) -> None:
    """Replace the record; OSError when it cannot be."""
    document = {
        "reason": drained.reason,
        "reason_time": drained.reason_time,
        "rebooting": drained.rebooting,
    }
    save_state(path, document)


def forget_drain_record(path: Path) -> None:
    """Drop the record; nothing to drop is no error. OSError when it cannot be removed."""
    forget_state(path)
