"""What nodecheck's Prolog or Epilog leaves for `slurm health-check` when it fails.

A Prolog or Epilog that exits non-zero makes Slurm drain the node with the reason
"Prolog error" or "Epilog error" (Slurm's prolog_epilog.shtml; SchedMD/slurm
src/slurmctld/node_mgr.c, validate_node_specs), which nobody undrains. health-check takes
such a drain over (its reason rewritten to nodecheck's, undrained after the healthy runs)
only when nodecheck's own hook caused it: the hook records its failure in the state
folder (which job, when, and the finding), and the drain must have been set at about
that time. A drain for another Prolog's failure (a site's mount check, a hook that timed
out before it could say anything) is left to whoever runs that one.
"""

from __future__ import annotations

import math
from pathlib import Path

from nodecheck.agent.state_files import forget_state, load_state, save_state
from nodecheck.checks.node.slurm_state import SlurmNodeState
from nodecheck.checks.record import record

HOOK_FAILURE_FILE = "slurm_hook_failure.json"
# The reason Slurm drains with when each hook fails.
SLURMS_REASON = {"prolog": "Prolog error", "epilog": "Epilog error"}
# How far apart the hook's failure and the drain's time may be. slurmd tells slurmctld at
# once; the margin is for slurmctld's clock (the reason's time is its) against the
# node's, which NTP keeps far closer than this.
MATCH_S = 600.0


@record
class HookFailure:
    """A failure of nodecheck's `hook` ("prolog" or "epilog"): when (the wall clock), the
    job it failed, and the node's reason for it (`nodecheck: <check> <subject>: ...`)."""

    hook: str
    at: float
    job: str
    reason: str


def behind(failure: HookFailure | None, state: SlurmNodeState, now: float) -> bool:
    """Whether `failure` is what the node's drain is Slurm's reason for: that hook's
    reason, set within MATCH_S of the failure (`now`: the wall clock; a reason's time
    that cannot be read matches nothing)."""
    from nodecheck.agent.slurm.breaker import reason_age_s

    if failure is None or state.reason != SLURMS_REASON.get(failure.hook):
        return False
    age = reason_age_s(state.reason_time, now)
    return age is not None and abs(failure.at - (now - age)) <= MATCH_S


def load_hook_failure(path: Path) -> HookFailure | None:
    """The recorded failure; None when there is none or the file is damaged (then no
    drain is taken over: the safe side, it stays for a person)."""
    document = load_state(path) or {}
    hook, at, job, reason = (document.get(k) for k in ("hook", "at", "job", "reason"))
    if (
        hook not in SLURMS_REASON
        or isinstance(at, bool)
        or not isinstance(at, (int, float))
        or not math.isfinite(at)
        or not isinstance(job, str)
        or not isinstance(reason, str)
    ):
        return None
    return HookFailure(str(hook), float(at), job, reason)


def save_hook_failure(path: Path, failure: HookFailure) -> None:
    """Replace the record (readable by root only); OSError when it cannot be."""
    document = {
        "hook": failure.hook,
        "at": failure.at,
        "job": failure.job,
        "reason": failure.reason,
    }
    save_state(path, document)


def forget_hook_failure(path: Path) -> None:
    """Drop the record; nothing to drop is no error. OSError when it cannot be removed."""
    forget_state(path)
