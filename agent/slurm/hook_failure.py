"""What nodecheck's Prolog or Epilog leaves for `slurm health-check` when it fails.

A Prolog or Epilog that exits non-zero makes Slurm drain the node with the reason
"Prolog error" or "Epilog error" (Slurm's prolog_epilog.shtml; SchedMD/slurm
src/slurmctld/node_mgr.c, validate_node_specs; job_mgr.c), or "Prolog/Epilog failure"
when the RPC that ran it failed (agent.c, DSH_FAILED), which nobody undrains.
health-check takes such a drain over (its reason rewritten to nodecheck's, undrained
after the healthy runs) only when nodecheck's own hook caused it: the hook records its
failure in the state folder (which job, when, and the finding), and the drain must have
been set just after it. A drain for another Prolog's failure (a site's mount check, a
hook that timed out before it could say anything) is left to whoever runs that one, and
a record no drain followed is dropped, so that a later drain of another hook's is never
matched by it.
"""

from __future__ import annotations

import math
from pathlib import Path

from nodecheck.agent.state_files import forget_state, load_state, save_state
from nodecheck.checks.node.slurm_state import SlurmNodeState
from nodecheck.checks.record import record

HOOK_FAILURE_FILE = "slurm_hook_failure.json"
# The reasons Slurm drains with when each hook fails (above).
SLURMS_REASONS = {
    "prolog": frozenset({"Prolog error", "Prolog/Epilog failure"}),
    "epilog": frozenset({"Epilog error", "Prolog/Epilog failure"}),
}
HOOK_FAILURE_REASONS: frozenset[str] = frozenset().union(*SLURMS_REASONS.values())
# When the drain may be set, from the hook's failure: slurmd tells slurmctld as the hook
# exits; the margins are for slurmctld's clock (the reason's time is its) against the
# node's, which NTP keeps far closer, and for a slurmctld slow to answer.
MATCH_BEFORE_S = 60.0
MATCH_AFTER_S = 120.0


@record
class HookFailure:
    """A failure of nodecheck's `hook` ("prolog" or "epilog"): when (the wall clock), the
    job it failed, and the finding it failed on (`<check> <subject>: <summary>`)."""

    hook: str
    at: float
    job: str
    reason: str


def behind(failure: HookFailure | None, state: SlurmNodeState, now: float) -> bool:
    """Whether `failure` is what the node's drain is Slurm's reason for: that hook's
    reason, set from MATCH_BEFORE_S before the failure to MATCH_AFTER_S after it (`now`:
    the wall clock; a reason's time that cannot be read matches nothing)."""
    from nodecheck.agent.slurm.breaker import reason_age_s

    if failure is None or state.reason not in SLURMS_REASONS.get(failure.hook, ()):
        return False
    age = reason_age_s(state.reason_time, now)
    if age is None:
        return False
    drained_at = now - age
    return failure.at - MATCH_BEFORE_S <= drained_at <= failure.at + MATCH_AFTER_S


def outlived(failure: HookFailure | None, state: SlurmNodeState, now: float) -> bool:
    """Whether `failure` is a record no drain followed: the node is not drained by Slurm
    for a hook now, and the drain would have shown by now (MATCH_AFTER_S on)."""
    return (
        failure is not None
        and now - failure.at > MATCH_AFTER_S
        and not (state.drained and state.reason in HOOK_FAILURE_REASONS)
    )


def load_hook_failure(path: Path) -> HookFailure | None:
    """The recorded failure; None when there is none or the file is damaged (then no
    drain is taken over: the safe side, it stays for a person)."""
    document = load_state(path) or {}
    hook, at, job, reason = (document.get(k) for k in ("hook", "at", "job", "reason"))
    if (
        not isinstance(hook, str)
        or hook not in SLURMS_REASONS
        or isinstance(at, bool)
        or not isinstance(at, (int, float))
        or not math.isfinite(at)
        or not isinstance(job, str)
        or not isinstance(reason, str)
    ):
        return None
    return HookFailure(hook, float(at), job, reason)


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
